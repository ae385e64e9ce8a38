"""Refit a target's parameters to a user's own measured rows and save a target override.

`calibrate(rows, target)` re-traces every measured launch whose `estimable` names a
registered kernel (`perfmodel.registry`, with the row's shape, dtype, `config` as the
kernel's keyword arguments, and LNC), fits `fit.FIT_PARAMETERS[target]` to the measured
medians (the same bounded least squares in log ratio as the v2 fit to the anchors),
refits without each row in turn for the band, and returns an `Override`.
`Override.save(path)` writes it as JSON; `targets.use_override(path)` (or `estimate
--target-override`, or the directory in NKI_KERNELS_TARGETS_DIR) makes the cost model use
it, and every modeled label then names the measurement file it came from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..interp.trace import Trace
from ..targets import OVERRIDE_KIND, SHIPPED_TARGETS, Target
from . import registry
from .api import trace_kernel
from .estimate import COST_MODEL_VERSION
from .fit import FIT_PARAMETERS, UNANCHORED, FitResult, fit, leave_one_out, pct
from .measurements import MeasuredRow
from .timeline import schedule


class CalibrationError(ValueError):
    """Measured rows that cannot calibrate the requested target."""


@dataclass(frozen=True)
class RowFit:
    """One measured row: measured median, modeled before and after the fit (ns)."""

    id: str
    measured_ns: float
    before_ns: float
    after_ns: float
    loo_error_pct: float | None


@dataclass(frozen=True)
class Override:
    """A fitted parameter set for one target with its provenance and band sets."""

    target: str
    parameters: dict[str, float]
    provenance: str
    loo_sets: list[dict[str, float]]
    unanchored: dict[str, list[Any]]
    rows: list[RowFit]
    skipped: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object `targets.use_override` reads."""
        return {
            "kind": OVERRIDE_KIND,
            "target": self.target,
            "cost_model_version": COST_MODEL_VERSION,
            "provenance": self.provenance,
            "parameters": self.parameters,
            "loo_sets": self.loo_sets,
            "unanchored": self.unanchored,
            "rows": [r.__dict__ for r in self.rows],
            "skipped": self.skipped,
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the override as JSON (directories created); returns the path."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return p


def _row_id(i: int, row: MeasuredRow) -> str:
    dims = ",".join(f"{k}={v}" for k, v in row.shape.items())
    return f"{i}:{row.estimable}[{dims}]"


def trace_row(row: MeasuredRow, target: Target) -> Trace:
    """The trace of the launch a measured row describes (registered kernel, shape, config)."""
    if row.estimable is None:
        raise CalibrationError("estimable: the row names no registered kernel")
    entry = registry.get(row.estimable)
    pos, kw = entry.args(row.shape, row.dtype)
    kw = {**kw, **dict(row.config)}
    return trace_kernel(entry.kernel, *pos, target=target, lnc=row.lnc, **kw)


def calibrate(
    rows: Sequence[MeasuredRow],
    target: str,
    source: str = "measurements",
    base: Target | None = None,
    with_loo: bool = True,
) -> Override:
    """Fit `target`'s parameters to the rows measured on it (see the module docstring)."""
    if target not in FIT_PARAMETERS:
        raise CalibrationError(f"target: expected one of {sorted(FIT_PARAMETERS)}; got {target!r}")
    tgt = base or SHIPPED_TARGETS[target]
    traces: dict[str, Trace] = {}
    measured: dict[str, float] = {}
    skipped: dict[str, str] = {}
    for i, row in enumerate(rows, start=1):
        rid = _row_id(i, row)
        if row.target != target:
            continue
        try:
            traces[rid] = trace_row(row, tgt)
            measured[rid] = row.median_ns
        except Exception as exc:  # reported per row; the other rows still calibrate
            skipped[rid] = f"{type(exc).__name__}: {exc}"
    if not traces:
        raise CalibrationError(
            f"measurements: no usable row measured on {target} ({len(skipped)} skipped)"
        )

    def residuals(t: Target) -> dict[str, float]:
        return {k: math.log(schedule(tr, t).latency_ns / measured[k]) for k, tr in traces.items()}

    ranges = FIT_PARAMETERS[target]
    before = residuals(tgt)
    result: FitResult = fit(residuals, tgt, ranges)
    loo = (
        leave_one_out(residuals, list(traces), tgt, ranges, start=result.params)
        if with_loo and len(traces) > 1
        else {}
    )
    fits = [
        RowFit(
            rid,
            measured[rid],
            measured[rid] * math.exp(before[rid]),
            measured[rid] * math.exp(result.residuals[rid]),
            pct(loo[rid].residuals[rid]) if rid in loo else None,
        )
        for rid in traces
    ]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    provenance = f"calibrated to {source} ({len(traces)} measured rows, {stamp})"
    unanchored = {r[0]: [*r[1:], sign] for r, sign in UNANCHORED.get(target, ())}
    for name in result.params:
        unanchored.pop(name, None)
    return Override(
        target,
        result.params,
        provenance,
        [v.params for v in loo.values()],
        unanchored,
        fits,
        skipped,
    )
