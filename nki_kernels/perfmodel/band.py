"""Uncertainty bands: the range of a modeled figure over the parameter sets the anchors allow.

The sets of a target (`parameter_sets`) are

1. its leave-one-out fits (fit_v2.json: the v2 fit redone without each anchor in turn),
2. the shipped parameters with every parameter no anchor constrains (`fit.UNANCHORED`)
   at the slow end of its range, and the same at the fast end.

A band is the minimum and maximum of the figure over those sets and the shipped set; it
is not a confidence interval (no posterior is sampled). trn3 has no anchors: it uses
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
from .timeline import schedule

# trn3 takes these fitted values from trn2 (targets.py) and hence their band sets
_TRN3_SHARED = ("dma_descriptor_min_ns", "dma_fixed_ns", "dma_transpose_hbm_efficiency")


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
            loo = list(rec[tgt.name]["loo_sets"].values())
            unanchored = rec[tgt.name]["unanchored"]
        elif tgt.name == "trn3" and "trn2" in rec:
            loo = [
                {k: v for k, v in s.items() if k in _TRN3_SHARED}
                for s in rec["trn2"]["loo_sets"].values()
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


def _applies(tgt: Target, name: str) -> bool:
    # trn1 has no DMA transpose hardware: its efficiency stays 0 (element descriptors).
    return not (name.startswith("dma_transpose") and getattr(tgt, name) == 0.0)


def band(trace: Trace, target: str | Target | None = None) -> tuple[float, float]:
    """(lowest, highest) modeled latency in ns of `trace` over `parameter_sets(target)`."""
    lat = [schedule(trace, t).latency_ns for t in parameter_sets(target or trace.target)]
    return min(lat), max(lat)


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
