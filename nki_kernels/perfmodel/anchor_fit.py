"""The cost model fit: the published anchors -> one parameter set per target (+ LOO sets).

`refit()` traces every available anchor (`anchors.AnchorSet`), fits each target's
`fit.FIT_PARAMETERS` and the leave-one-out sets, and returns the record stored in
`fit_v3.json` (written by `python benchmarks/bench_calibration.py --refit`; minutes of
CPU; `--targets trn2` refits one target and keeps the others' records). The shipped
`targets.py` values are that file's fitted parameters (a test checks they agree), and
`perfmodel.band` prices its leave-one-out sets (those within `fit.LOO_DROP_PCT` of their
own anchor) and widens by the record's `cv_error_pct`. trn3 has no anchors: it keeps
trn2's fitted DMA values and its band is built from trn2's sets plus the ranges of the
parameters nothing measures (`fit.UNANCHORED`). The trn1 record is cost model v2's fit,
kept: no v3 rule changes a trn1 anchor (checked by re-pricing them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..targets import Target, get_target
from .anchors import AnchorSet, load_anchors
from .estimate import COST_MODEL_VERSION
from .fit import (
    FIT_PARAMETERS,
    LOO_DROP_PCT,
    SCHEDULING_WINDOWS,
    UNANCHORED,
    fit,
    leave_one_out,
    pct,
)

FIT_FILE = Path(__file__).with_name("fit_v3.json")


def choose_window(
    aset: AnchorSet, base: Target, windows: tuple[int, ...]
) -> tuple[int, dict[int, float]]:
    """The scheduling window of `windows` with the least squared log error over the
    fitted anchors at `base`'s other parameters, and every window's cost."""
    ids = aset.fitted_ids
    costs = {}
    for w in windows:
        r = aset.log_errors(base.replace(scheduling_window=w), ids)
        costs[w] = sum(x * x for x in r.values())
    return min(costs, key=costs.__getitem__), costs


def refit(
    targets: tuple[str, ...] = ("trn2", "trn1"), log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Fit every target of `targets` to its anchors; see the module docstring."""
    anchors = load_anchors()
    out: dict[str, Any] = {
        "cost_model_version": COST_MODEL_VERSION,
        "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
        "method": "bounded compass search in log(modeled / measured); band = "
        "leave-one-out refits plus both ends of every unanchored parameter's range",
        "targets": {},
    }
    for name in targets:
        base = get_target(name)
        ranges = FIT_PARAMETERS[name]
        aset = AnchorSet.build(name, anchors)
        # Schedules of the trn1 tutorial matmuls take seconds each: start from the shipped
        # (previously fitted) values with a small compass step there instead of a grid.
        cheap = sum(len(t.instrs) for t in aset.traces.values()) < 50_000
        windows = SCHEDULING_WINDOWS.get(name, ())
        window_record: dict[str, Any] = {}
        # the integer window by a grid, the continuous parameters by the compass search
        # at it; once more if the fitted parameters prefer another window
        for _round in range(2 if windows else 1):
            if windows:
                w, costs = choose_window(aset, base, windows)
                window_record = {"chosen": w, "grid_cost": {str(k): v for k, v in costs.items()}}
                log(f"{name}: scheduling window {w} ({window_record['grid_cost']})")
                if _round and w == base.scheduling_window:
                    break
                base = base.replace(scheduling_window=w)
            full = fit(aset.log_errors, base, ranges, grid=cheap, step=0.25 if cheap else 0.0625)
            base = base.replace(**full.params)
        log(f"{name}: fit {full.params} in {full.evaluations} evaluations")
        ids = aset.fitted_ids
        loo = leave_one_out(
            aset.log_errors,
            ids,
            base,
            ranges,
            start=full.params,
            max_iterations=4 if cheap else 2,
            step=0.125 if cheap else 0.0625,
        )
        every = aset.log_errors(base.replace(**full.params), [a.id for a in aset.anchors])
        rows = {}
        for a in aset.anchors:
            rows[a.id] = {
                "fitted": a.fit,
                "measured_ns": a.measured_ns,
                "modeled_ns": a.measured_ns * (1 + pct(every[a.id]) / 100),
                "error_pct": pct(every[a.id]),
                "loo_error_pct": pct(loo[a.id].residuals[a.id]) if a.id in loo else None,
            }
        loo_pct = {k: pct(v.residuals[k]) for k, v in loo.items()}
        held = {a.id: pct(every[a.id]) for a in aset.anchors if a.held_out}
        out["targets"][name] = {
            "params": full.params,
            # the cross-validated error: root mean square of the leave-one-out log errors
            # of the fitted anchors and the errors of the held-out ones, as a percentage
            # (perfmodel.band widens bands by it)
            "cv_error_pct": cv_error_pct({**loo_pct, **held}),
            "loo_dropped": sorted(k for k, v in loo_pct.items() if abs(v) > LOO_DROP_PCT),
            "ranges": {r[0]: list(r[1:]) for r in ranges},
            "anchors": rows,
            "unavailable": aset.unavailable,
            "loo_sets": {k: v.params for k, v in loo.items()},
            "unanchored": {r[0]: [*r[1:], sign] for r, sign in UNANCHORED.get(name, ())},
        }
        if window_record:
            out["targets"][name]["scheduling_window"] = window_record
    return out


def cv_error_pct(loo_pct: dict[str, float]) -> float:
    """Root mean square of leave-one-out errors (percent), taken in log ratio."""
    if not loo_pct:
        return 0.0
    logs = [math.log1p(v / 100.0) for v in loo_pct.values()]
    return pct(math.sqrt(sum(x * x for x in logs) / len(logs)))


def load_fit(path: str | Path = FIT_FILE) -> dict[str, Any]:
    """The stored fit record (see `refit`)."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def write_fit(record: dict[str, Any], path: str | Path = FIT_FILE) -> Path:
    """Write a fit record as JSON; returns the path."""
    p = Path(path)
    p.write_text(json.dumps(record, indent=1) + "\n")
    return p
