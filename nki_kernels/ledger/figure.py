"""A ledger figure: a latency with its label, its source and, if modeled, its band.

Modeled figures carry the per-parameter-set latencies (`samples`) their rows carry
(`bench.bands`): a sum adds them set by set, so the band of a total is the range of the
total over the cost model's parameter sets, not the (wider) sum of the parts' ranges.
Where a part has no samples, the sum falls back to adding lows and highs, and says so.

`band` is that parameter-set range; `full_band` is what is printed, charted and priced:
the range widened by the cost model's structural error (v3: the cross-validated error of
its anchors, `perfmodel.band.widen`), the same term the op-level benchmark rows carry. A
sum keeps its parts' structural term as a relative error: the rules a model lacks are
missing from every op it prices, so the parts' errors are taken as fully correlated (an
upper bound: independent errors would partly cancel, which the band does not claim).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Figure:
    """`us` microseconds, labelled ("modeled (cost model v2, trn2)" / "measured (...)")."""

    us: float
    label: str
    source: str = ""
    band: tuple[float, float] | None = None
    samples: tuple[float, ...] | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    structural_pct: float = 0.0  # the cost model's structural error (0: none, or measured)

    def scaled(self, k: float, why: str = "") -> Figure:
        """This figure times `k` (identical repeats or a linear extrapolation, named)."""
        band = None if self.band is None else (self.band[0] * k, self.band[1] * k)
        samples = None if self.samples is None else tuple(s * k for s in self.samples)
        src = self.source if not why else f"{self.source}; {why}"
        return Figure(self.us * k, self.label, src, band, samples, self.notes, self.structural_pct)

    @property
    def full_band(self) -> tuple[float, float] | None:
        """The band as printed: the parameter-set range widened by the structural error."""
        if self.band is None:
            return None
        f = 1.0 + self.structural_pct / 100.0
        return self.band[0] / f, self.band[1] * f

    @property
    def kind(self) -> str:
        """'modeled' or 'measured' or 'derived' (the label's first word)."""
        return self.label.split(" ", 1)[0]


def total(figs: Iterable[Figure], label: str | None = None) -> Figure:
    """The sum, with its band carried through (per parameter set where every part has
    the same number of samples) and the set of labels it mixes named."""
    parts = [f for f in figs]
    if not parts:
        raise ValueError("total: no figures to add")
    us = sum(f.us for f in parts)
    labels = sorted({lab for f in parts for lab in f.label.removeprefix("mixed: ").split(" + ")})
    notes: list[str] = []
    lab = label or (labels[0] if len(labels) == 1 else "mixed: " + " + ".join(labels))
    banded = [f for f in parts if f.band is not None]
    if not banded:
        return Figure(us, lab, "sum", None, None, tuple(notes))
    terms = {f.structural_pct for f in banded}
    structural = max(terms)
    if len(terms) > 1:
        each = ", ".join(f"{t:g} %" for t in sorted(terms))
        notes.append(
            f"band: the parts' structural errors differ ({each}); the largest, "
            f"{structural:g} %, is applied to the whole sum"
        )
    per_set = [f.samples for f in parts if f.samples is not None]
    if len(per_set) == len(parts) and len({len(s) for s in per_set}) == 1:
        sums = [sum(s[i] for s in per_set) for i in range(len(per_set[0]))]
        band = (min(sums), max(sums))
        return Figure(us, lab, "sum", band, tuple(sums), tuple(notes), structural)
    lo = sum(f.band[0] if f.band else f.us for f in parts)
    hi = sum(f.band[1] if f.band else f.us for f in parts)
    notes.append("band: parts' lows and highs added (not every part has per-set samples)")
    return Figure(us, lab, "sum", (lo, hi), None, tuple(notes), structural)


def fmt_us(us: float) -> str:
    """A latency in the unit that reads best."""
    if us != us:  # NaN
        return "n/a"
    if us >= 1e6:
        return f"{us / 1e6:,.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:,.2f} ms"
    return f"{us:,.1f} us"


def fmt_band(f: Figure) -> str:
    """'12.3 ms (11.9-13.0)' (the full band) or the bare value without a band."""
    band = f.full_band
    if band is None:
        return fmt_us(f.us)
    return f"{fmt_us(f.us)} ({fmt_us(band[0])}-{fmt_us(band[1])})"
