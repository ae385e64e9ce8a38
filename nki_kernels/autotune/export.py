"""Export a study's best config into the config store (JSON per target and op).

The entry is keyed by the bucketed problem (`runtime.config_store.problem_key`) and
carries its provenance: the kernel source hash the study measured (lookup refuses the
entry, with a `StaleConfigWarning`, once the kernel changes), the measurer's label
("modeled (cost model v2, trn2, LNC 2)" or "measured (hardware)"), the best latency, the
heuristic default's latency in the same study, the number of distinct configs tried, and
the date; the LNC the study launched at (the key carries it: `lnc=2`) and its ranking;
and, from the cost model, the band [fast, slow] of both latencies and of the speedup over
the model's parameter sets (`perfmodel.band`; the speedup's band is the range of
default / tuned taken set by set). When the study measured a cheaper proxy problem
(`Tunable.search_problem`), both latencies are measured again on the real problem before
they are recorded. The store
writes atomically (temporary file + rename, under a file lock).

A config is exported only if it passed the correctness gate. A best config that the study
recorded without gating (`gate='off'`, or `'improving'` when it was not faster than the
best at the time) is gated here first; if it fails, the verdict is stored in the study
(`Tuner.record_verdict`, so a resumed or re-gated study does not offer it again) and the
next best config is tried, until one passes or none is left (`ExportRefused`).

Into a store of your own (not the shipped `nki_kernels/configs/`) a config is exported
only when it beats what a call would use without it -- the shipped config for the problem
(exact or nearest bucket) -- priced the same way on the full problem (by the band's slow
end under `--rank pessimistic`); else `ShippedIsFaster`, and the shipped config stays in
use (a user entry takes precedence over a shipped one, so a slower one would slow calls).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kernel_config import KernelConfig
from ..runtime.config_records import stored_number
from ..runtime.config_store import (
    DEFAULT,
    SHIPPED_DIR,
    ConfigStore,
    Provenance,
    default_store,
    lnc_items,
    problem_key,
)
from .gate import CorrectnessGate
from .measure import Measurer
from .study import OK, Tuner


class ExportRefused(RuntimeError):
    """The study has no exportable result (nothing valid, or the best config is wrong)."""


class ShippedIsFaster(ExportRefused):
    """The shipped config is at least as fast as the study's best: nothing to export."""


@dataclass(frozen=True)
class Exported:
    """What `export_best` wrote."""

    op: str
    target: str
    key: str
    config: KernelConfig
    provenance: Provenance
    path: Path

    @property
    def speedup(self) -> float:
        """Heuristic default latency / tuned latency (nan when the default has none)."""
        d = self.provenance.default_latency_ns
        return d / self.provenance.latency_ns if d and not math.isnan(d) else math.nan


def export_best(
    tuner: Tuner,
    store: ConfigStore | None = None,
    directory: str | Path | None = None,
    gate: CorrectnessGate | None = None,
) -> Exported:
    """Write `tuner`'s best config for its problem into `store` (default: the user store)."""
    checker = gate or tuner.gate or CorrectnessGate()
    failures: list[str] = []
    while True:
        report = tuner.report()
        best = report.best
        if best is None or best.config is None:
            why = f" ({len(failures)} fastest failed the gate: {failures[0]})" if failures else ""
            raise ExportRefused(f"{report.name}: no valid, correct config to export{why}")
        trial = tuner.study().get_trials(deepcopy=False)[best.number]
        config = tuner.space.decode(trial.params)
        if best.gate == "passed":
            break
        res = checker.check(tuner.tunable, tuner.problem, config, tuner.target)
        if res.ok:
            tuner.record_verdict(best.number, True)
            break
        reason = f"wrong output on {res.problem}: {res.reason}"
        tuner.record_verdict(best.number, False, reason)
        failures.append(f"{config.key()} {reason}")
    heur = report.heuristic
    if heur is None or heur.outcome != OK or heur.latency_ns is None:
        outcome = "not measured" if heur is None else heur.outcome
        warnings.warn(
            f"{report.name}: the heuristic default has no latency ({outcome}); "
            "default_latency_ns is recorded as null",
            stacklevel=2,
        )
        default_latency = math.nan
    else:
        default_latency = float(heur.latency_ns)
    latency, label = float(best.latency_ns), best.label or tuner.measurer.name  # type: ignore[arg-type]
    bands = _band_measurer(tuner)
    heur_cfg = tuner.tunable.heuristic(tuner.problem, tuner.target)
    tuned_sets = default_sets = None
    if tuner.search_problem != tuner.problem or bands is not None:
        # trials measured a cheaper proxy problem (or priced no band): price both
        # configs on the real one
        m = _full_price(tuner, config, bands)
        latency, label, tuned_sets = m.latency_ns, m.label, m.set_ns
        if not math.isnan(default_latency):
            d = _full_price(tuner, heur_cfg, bands)
            default_latency, default_sets = d.latency_ns, d.set_ns
    prov = Provenance(
        kernel_hash=tuner.key.kernel_hash,
        measurer=label,
        latency_ns=latency,
        default_latency_ns=default_latency,
        trials=report.distinct_done,
        date=Provenance.now(),
        lnc=_measured_lnc(tuner),
        rank=tuner.options.rank,
        latency_band_ns=_span(tuned_sets),
        default_latency_band_ns=_span(default_sets),
        speedup_band=_span(
            None
            if tuned_sets is None or default_sets is None
            else [d / t for d, t in zip(default_sets, tuned_sets)]
        ),
    )
    target = store if store is not None else default_store()
    dest = Path(directory) if directory is not None else target.write_dir
    if dest is not None and Path(dest).resolve() != SHIPPED_DIR.resolve():
        _check_beats_shipped(tuner, config, bands, report.name)
    path = target.put(
        tuner.tunable.op,
        tuner.target,
        tuner.problem,
        config,
        prov,
        directory=directory,
        lnc=_measured_lnc(tuner),
    )
    key = problem_key(lnc_items(tuner.problem, prov.lnc))
    return Exported(tuner.tunable.op, tuner.target.name, key, config, prov, path)


def _check_beats_shipped(
    tuner: Tuner, config: KernelConfig, bands: Measurer | None, name: str
) -> None:
    """Raise `ShippedIsFaster` unless `config` beats the shipped config a call would use."""
    shipped = ConfigStore([SHIPPED_DIR], None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no shipped entry: the heuristic, compared already
        decision = shipped.decide(
            tuner.tunable.op,
            tuner.target,
            tuner.problem,
            config_cls=type(config),
            kernel_hash=tuner.key.kernel_hash,
            lnc=_measured_lnc(tuner),
        )
    if decision.source == DEFAULT:
        return
    where = f"shipped {decision.source} [{decision.entry_key}]"
    if decision.config == config:
        raise ShippedIsFaster(f"{name}: the best config is the {where}; nothing to export")

    def cost(cfg: KernelConfig) -> tuple[float, str]:
        m = _full_price(tuner, cfg, bands)
        slow = tuner.options.rank == "pessimistic" and m.set_ns
        return (float(max(m.set_ns)) if slow else float(m.latency_ns)), m.label

    (mine, label), (theirs, _) = cost(config), cost(decision.config)
    if mine >= theirs:
        raise ShippedIsFaster(
            f"{name}: the {where} is as fast or faster ({theirs / 1e3:.2f} us vs "
            f"{mine / 1e3:.2f} us tuned, {label}); not exported, so calls keep using it"
        )


def _measured_lnc(tuner: Tuner) -> int:
    """The LNC the measured launches ran at (the key the config is stored under): the
    hardware measurer launches at the runtime's (`runtime.lnc`), the cost model prices
    the launch at the tunable's (`Tunable.lnc`)."""
    from ..runtime.lnc import runtime_lnc
    from .measure import HardwareMeasurer

    if isinstance(tuner.measurer, HardwareMeasurer):
        return runtime_lnc(tuner.target)
    return tuner.tunable.lnc


def _band_measurer(tuner: Tuner) -> Measurer | None:
    """A measurer that prices the band: the tuner's cost model with bands on (None for
    other measurers, which have no band)."""
    from .measure import CostModelMeasurer

    m = tuner.measurer
    if not isinstance(m, CostModelMeasurer):
        return None
    return m if m.bands else CostModelMeasurer(bands=True)


def _span(values: Any) -> list[float] | None:
    return None if not values else [float(min(values)), float(max(values))]


def _full_price(tuner: Tuner, config: KernelConfig, measurer: Measurer | None = None) -> Any:
    """`Measurement` of `config` on the tuner's full problem (label says how it was priced)."""
    unit, n = tuner.problem, 1
    if tuner.tunable.repricing is not None:
        unit, n = tuner.tunable.repricing(tuner.problem)
    m = (measurer or tuner.measurer).measure(tuner.tunable, unit, config, tuner.target)
    if n == 1:
        return m
    return m.scaled(n, f"{m.label.rstrip(')')}; one of {n} identical units, x{n})")


def describe_entry(entry: dict[str, Any]) -> str:
    """One line for a stored entry: config, tuned and default latency, speedup, measurer."""
    prov = entry.get("provenance", {})
    lat = stored_number(prov.get("latency_ns"))
    dflt = stored_number(prov.get("default_latency_ns"))
    speed = dflt / lat if lat and not math.isnan(dflt) else math.nan
    cfg = ", ".join(f"{k}={v}" for k, v in entry.get("config", {}).items())
    return (
        f"{lat / 1e3:10.2f} us  (default {dflt / 1e3:10.2f} us, x{speed:5.2f})  "
        f"[{prov.get('measurer', '?')}; {prov.get('trials', '?')} trials; "
        f"hash {prov.get('kernel_hash', '?')}; {prov.get('date', '?')}]  {cfg}"
    )
