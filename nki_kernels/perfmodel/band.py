"""Uncertainty bands: the range of a modeled figure over the parameter sets the anchors allow.

The sets of a target (`parameter_sets`) are

1. its leave-one-out fits (fit_v3.json: the fit redone without each anchor in turn),
   except those that misprice their own left-out anchor by more than
   `fit.LOO_DROP_PCT` (listed in the record's `loo_dropped`),
2. the shipped parameters with every parameter no anchor constrains (`fit.UNANCHORED`:
   dependent-instruction cycles, scan cost, semaphore latency, VectorE's 2x mode) at the
   slow end of its range, and the same at the fast end.

A band is the minimum and maximum of the figure over those sets and the shipped set,
widened on both sides by the model's cross-validated error (`structural_pct`: the
root-mean-square leave-one-out error of the fitted anchors, v3), which covers what no
parameter varies (rules the model lacks). It is not a confidence interval (no posterior
is sampled). trn3 has no anchors: it uses
trn2's leave-one-out sets for the parameters it takes from trn2's fit (DMA floor, start
latency, transpose efficiency; trn3 keeps its own documented DMA rate). A `calibrate`
override (targets.use_override) carries the sets of its own fit.

Public API (used by `estimate`, the bench table and the autotuner):

    band(trace, target=None) -> (lo_ns, hi_ns)            # latency of one launch
    band_estimate(trace, target=None) -> Banded          # latency and MFU, each with a band
    format_band(63.1, 51.0, 70.2, unit="%") -> "63 % (51–70 %)"
    format_latency(2.1e6, 1.9e6, 2.6e6) -> "2.10 ms (1.90–2.60 ms)"

Pricing a band schedules the trace once per set (about eight times); cache a band with
the figure it belongs to rather than recomputing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..interp.trace import Trace
from ..targets import Target, get_target
from .anchor_fit import load_fit
from .compiled import reuse_compiled, schedule_sets
from .timeline import schedule

# trn3 takes these fitted values from trn2 (targets.py) and hence their band sets
_TRN3_SHARED = (
    "dma_descriptor_min_ns",
    "dma_fixed_ns",
    "dma_transpose_hbm_efficiency",
    "dma_transpose_sbuf_efficiency",
    "matmul_extra_cycles",
)


@lru_cache(maxsize=1)
def _record() -> dict:
    return load_fit()


def parameter_sets(target: str | Target | None = None) -> list[Target]:
    """The shipped (or overridden) target followed by every set its band spans."""
    tgt = get_target(target)
    sets = [tgt]
    override = getattr(tgt, "band_sets", None)
    if override:
        loo: list[dict] = list(override["loo_sets"])
        unanchored: dict = dict(override.get("unanchored", {}))
    else:
        rec = _record()["targets"]
        if tgt.name in rec:
            loo = _kept_loo_sets(rec[tgt.name])
            unanchored = rec[tgt.name]["unanchored"]
        elif tgt.name == "trn3" and "trn2" in rec:
            loo = [
                {k: v for k, v in s.items() if k in _TRN3_SHARED}
                for s in _kept_loo_sets(rec["trn2"])
            ]
            from .fit import UNANCHORED

            unanchored = {r[0]: [*r[1:], sign] for r, sign in UNANCHORED["trn3"]}
        else:
            loo, unanchored = [], {}
    sets += [tgt.replace(**params) for params in loo if params]
    if unanchored:
        slow = {k: (v[1] if v[-1] > 0 else v[0]) for k, v in unanchored.items()}
        fast = {k: (v[0] if v[-1] > 0 else v[1]) for k, v in unanchored.items()}
        for corner in (slow, fast):
            ok = {k: v for k, v in corner.items() if _applies(tgt, k)}
            sets.append(tgt.replace(**ok))
    return sets


def cost_parameters() -> frozenset[str]:
    """Names of every `Target` field a band varies (fitted, unanchored, the scheduling
    window): costs only, never read by the interpreter, so a trace or a dry run does not
    depend on them."""
    from .fit import FIT_PARAMETERS, UNANCHORED

    names = {r[0] for ranges in FIT_PARAMETERS.values() for r in ranges}
    names |= {r[0] for ranges in UNANCHORED.values() for r, _ in ranges}
    return frozenset(names | {"scheduling_window"})


def interpreter_target(target: Target) -> Target:
    """`target` with its cost parameters (`cost_parameters`) set to those of the target
    registered under its name: what the interpreter sees is the same for every parameter
    set of a band, so a dry run cached for one serves them all."""
    from ..targets import TARGETS

    base = TARGETS.get(target.name)
    if base is None or base is target:
        return target
    same = {f: getattr(base, f) for f in cost_parameters() if hasattr(base, f)}
    return target.replace(**same)


def describe_sets(target: str | Target | None = None) -> str:
    """What a band of `target` spans, in words: its parameter sets by name and the
    structural term (printed under every table of bands)."""
    tgt = get_target(target)
    rec = _record()["targets"]
    name = tgt.name if tgt.name in rec else ("trn2" if tgt.name == "trn3" else "")
    loo = list(rec.get(name, {}).get("loo_sets", {}))
    dropped = set(rec.get(name, {}).get("loo_dropped", ()))
    kept = [aid for aid in loo if aid not in dropped]
    words = [f"the shipped {tgt.name} parameters"]
    if kept:
        whose = "" if name == tgt.name else f" (trn2's, for the parameters {tgt.name} shares)"
        words.append(f"{len(kept)} leave-one-out fits{whose} (without {', '.join(kept)})")
    if dropped:
        words.append(f"not the fits without {', '.join(sorted(dropped))} (> 25 % off it)")
    if len(parameter_sets(tgt)) > 1 + len(kept):
        from .fit import UNANCHORED

        params = ", ".join(r[0] for r, _ in UNANCHORED.get(tgt.name, UNANCHORED.get("trn2", [])))
        words.append(f"the slow and fast corners of the unanchored parameters ({params})")
    pct = structural_pct(tgt)
    return (
        f"{'; '.join(words)}; widened by the cross-validated error {pct:.1f} % "
        f"({pct * 2**0.5:.1f} % for a ratio of two modeled figures)"
    )


def _kept_loo_sets(rec: dict) -> list[dict]:
    dropped = set(rec.get("loo_dropped", ()))
    return [params for aid, params in rec["loo_sets"].items() if aid not in dropped]


def structural_pct(target: str | Target | None = None) -> float:
    """The model's cross-validated error in percent (fit record `cv_error_pct`; trn3
    takes trn2's, a calibration override none of its own yet: 0)."""
    tgt = get_target(target)
    if getattr(tgt, "band_sets", None):
        return float(tgt.band_sets.get("cv_error_pct", 0.0))  # type: ignore[union-attr]
    rec = _record()["targets"]
    name = tgt.name if tgt.name in rec else ("trn2" if tgt.name == "trn3" else "")
    return float(rec.get(name, {}).get("cv_error_pct", 0.0))


def widen(
    lo: float, hi: float, target: str | Target | None = None, terms: int = 1
) -> tuple[float, float]:
    """(lo, hi) widened by the structural error: lo / f, hi * f with f = 1 + e, where e
    is `structural_pct` (for a ratio of two modeled figures, `terms` = 2: e x sqrt(2),
    the two figures' errors taken as independent)."""
    f = 1.0 + structural_pct(target) / 100.0 * terms**0.5
    return lo / f, hi * f


def _applies(tgt: Target, name: str) -> bool:
    # trn1 has no DMA transpose hardware: its efficiency stays 0 (element descriptors).
    return not (name.startswith("dma_transpose") and getattr(tgt, name) == 0.0)


def band(trace: Trace, target: str | Target | None = None) -> tuple[float, float]:
    """(lowest, highest) modeled latency in ns of `trace` over `parameter_sets(target)`,
    widened by the structural error (`widen`). The low end is never below the trace's
    roofline (TensorE at its peak, HBM at its bandwidth): the widening must not claim a
    latency no parameter set can reach, so an MFU or bandwidth band ends at 100 %."""
    from .estimate import roofline_ns

    tgt = get_target(target or trace.target)
    lat = schedule_sets(trace, parameter_sets(tgt))
    lo, hi = widen(min(lat), max(lat), tgt)
    return max(lo, roofline_ns(trace, tgt)), hi


@dataclass(frozen=True)
class Banded:
    """A modeled latency and MFU with their bands (ns; fractions)."""

    latency_ns: float
    latency_lo_ns: float
    latency_hi_ns: float
    mfu: float
    mfu_lo: float
    mfu_hi: float

    def mfu_text(self) -> str:
        """'63 % (51–70 %)'."""
        return format_band(100 * self.mfu, 100 * self.mfu_lo, 100 * self.mfu_hi, "%")

    def latency_text(self) -> str:
        """'2.10 ms (1.90–2.60 ms)'."""
        return format_latency(self.latency_ns, self.latency_lo_ns, self.latency_hi_ns)


def band_estimate(trace: Trace, target: str | Target | None = None) -> Banded:
    """Latency and MFU of `trace` on `target` with their bands (MFU falls as latency grows)."""
    tgt = get_target(target or trace.target)
    with reuse_compiled():  # one compiled trace for the central figure and the band
        central = schedule(trace, tgt).latency_ns
        lo, hi = band(trace, tgt)
    flops = sum(i.flops for i in trace.instrs if i.engine == "tensor")
    cores = max(1, trace.lnc)
    peak = tgt.tensor_peak_flops_per_ns * cores

    def mfu(ns: float) -> float:
        return flops / (peak * ns) if ns else 0.0

    return Banded(central, lo, hi, mfu(central), mfu(hi), mfu(lo))


def _fmt(x: float, digits: int) -> str:
    return f"{x:.{digits}f}"


def format_band(value: float, lo: float, hi: float, unit: str = "", digits: int = 0) -> str:
    """'63 % (51–70 %)': the figure, then its band in parentheses, one unit each."""
    u = f" {unit}" if unit else ""
    return f"{_fmt(value, digits)}{u} ({_fmt(lo, digits)}–{_fmt(hi, digits)}{u})"


def format_latency(ns: float, lo_ns: float, hi_ns: float) -> str:
    """A latency band in the unit that suits its size: '2.10 ms (1.90–2.60 ms)'."""
    for unit, scale in (("ms", 1e6), ("us", 1e3)):
        if hi_ns >= scale:
            return format_band(ns / scale, lo_ns / scale, hi_ns / scale, unit, 2)
    return format_band(ns, lo_ns, hi_ns, "ns", 0)
