"""The one-screen summary of the benchmark rows: per family, phase and target, ours vs
AWS's kernel and vs TorchNeuron's native path as geometric means with their bands, and
every case where ours is slower with the engines each side is bound by.

The same summary is printed first by `nki-kernels bench` and drawn into the README by
`scripts/build_readme.py`, so the two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .bands import ceiling_label, widen_ratio
from .readme import FAMILIES, _geo, _pairs, geo_band
from .rows import BenchRow

OTHERS = (("aws", "AWS's kernel"), ("native", "native path"))


@dataclass(frozen=True)
class Stat:
    """Speedups of ours over one other implementation (other latency / ours)."""

    geo: float
    lo: float
    hi: float
    cases: int
    band: tuple[float, float] | None
    structural_only: bool = False

    def text(self) -> str:
        band = ""
        if self.band:
            only = ", structural error only" if self.structural_only else ""
            band = f" (band {self.band[0]:.2f}–{self.band[1]:.2f}{only})"
        return f"{self.geo:.2f}x{band}, {self.cases} cases"


def _stat(
    ratios: list[float], band: tuple[float, float] | None, target: str, cost_model: str
) -> Stat:
    """A line's statistics. Rows priced without their parameter sets (no samples) still
    carry the model's structural error around the geometric mean, labelled as such."""
    geo = _geo(ratios)
    if band is None and cost_model:
        widened = widen_ratio(geo, geo, target, f"cost model {cost_model}")
        if widened != (geo, geo):
            return Stat(geo, min(ratios), max(ratios), len(ratios), widened, True)
    return Stat(geo, min(ratios), max(ratios), len(ratios), band)


@dataclass(frozen=True)
class Loss:
    """One case where ours is slower, and what bounds each side."""

    op: str
    case: str
    target: str
    other: str
    speedup: float
    why: str


@dataclass
class Line:
    """One (family, phase, target) line of the summary."""

    family: str
    title: str
    phase: str
    target: str
    stats: dict[str, Stat | None] = field(default_factory=dict)
    losses: list[Loss] = field(default_factory=list)


def phase_of(op: str) -> str:
    """The phase word of a row's op ("rms_norm fwd" -> "fwd")."""
    words = op.split()
    return words[1] if len(words) > 1 else ""


SHORT = {
    "norm": "norms",
    "attention": "flash attention (Llama-3 8B heads)",
    "moe": "MoE layer (router + experts)",
}


def _bound(row: BenchRow) -> str:
    """What the row ran and what bounds it: its path or block count, engine, efficiency."""
    how = str(row.extra.get("path", ""))
    cfg = row.extra.get("config")
    if row.extra.get("blocks") and isinstance(cfg, dict) and cfg.get("block_size"):
        how = f"{row.extra['blocks']} blocks of {cfg['block_size']} rows"
    return (f"{how}, " if how else "") + _engine(row)


def _engine(row: BenchRow) -> str:
    eff = ""
    if row.mfu is not None:
        eff = f", MFU {ceiling_label(f'{100 * row.mfu:.0f} %', row.op, row.mfu)}"
    elif row.hbm_fraction is not None:
        frac = ceiling_label(f"{100 * row.hbm_fraction:.0f} %", row.op, None, row.hbm_fraction)
        eff = f", {frac} of HBM bandwidth"
    if row.bound_by.startswith("step:"):  # a native composition: its slowest step
        return f"slowest step{row.bound_by[len('step:') :]}{eff}"
    return f"{row.bound_by or 'unknown'}-bound{eff}"


def summarize(rows: Sequence[BenchRow], lnc: int, cost_model: str) -> list[Line]:
    """The summary lines of the rows at `lnc` priced by `cost_model` (rows of another
    cost model are left out: figures of two models are never compared)."""
    out: list[Line] = []
    targets = sorted({r.target for r in rows})
    known = dict(FAMILIES)
    present = {r.family for r in rows}
    families = [f for f in known if f in present] + sorted(present - set(known))
    for family in families:
        title = known.get(family, family)
        phases = sorted({phase_of(r.op) for r in rows if r.family == family}, reverse=True)
        for phase in phases:
            sub = [r for r in rows if r.family == family and phase_of(r.op) == phase]
            for target in targets:
                line = Line(family, SHORT.get(family, title), phase, target)
                for other, name in OTHERS:
                    pairs = _pairs(sub, family, target, lnc, other, cost_model)
                    if not pairs:
                        line.stats[other] = None
                        continue
                    ratios = [o.latency_us / ours.latency_us for _, _, ours, o in pairs]
                    band = geo_band(sub, family, target, lnc, other, cost_model)
                    line.stats[other] = _stat(ratios, band, target, cost_model)
                    for (op, case, ours, o), s in zip(pairs, ratios, strict=True):
                        if s < 1.0:
                            why = f"ours {_bound(ours)}; {name} {_bound(o)}"
                            line.losses.append(Loss(op, case, target, name, s, why))
                if any(line.stats.values()):
                    out.append(line)
    return out


def _cell(stat: Stat | None) -> str:
    return "no figure" if stat is None else stat.text()


NONE = (
    "No committed row is priced by the current cost model yet: re-price them "
    "(`nki-kernels bench --reprice --full --bands`, `--peer PATH --full`)."
)


def markdown(lines: Sequence[Line], lnc: int) -> str:
    """The summary as a Markdown table and the losing cases with their bounds."""
    if not lines:
        return NONE
    out = [
        f"| family | phase | target | vs AWS's kernel, LNC {lnc} | vs native path, LNC {lnc} "
        "| ours slower in |",
        "|---|---|---|---|---|---|",
    ]
    for x in lines:
        slower = str(len(x.losses)) if x.losses else "none"
        out.append(
            f"| {x.title} | {x.phase} | {x.target} | {_cell(x.stats.get('aws'))} "
            f"| {_cell(x.stats.get('native'))} | {slower} |"
        )
    out += ["", *(f"- {n}" for n in _band_notes(lines))]
    losses = [loss for x in lines for loss in x.losses]
    if losses:
        out += [
            "",
            "Where ours is slower (what each side runs and what bounds it, modeled):",
            "",
        ]
        out += [
            f"- {x.op}, {x.case}, {x.target}: {x.speedup:.2f}x vs {x.other} ({x.why})"
            for x in losses
        ]
    return "\n".join(out)


def _band_notes(lines: Sequence[Line]) -> list[str]:
    """What each target's bands span: its parameter sets by name and the structural term."""
    try:
        from ..perfmodel.band import describe_sets
    except ImportError:
        return []
    targets = sorted({x.target for x in lines})
    notes = [f"Band, {t}: {describe_sets(t)}." for t in targets]
    if any(s is not None and s.structural_only for x in lines for s in x.stats.values()):
        notes.append(
            '"structural error only": the rows were priced with the shipped parameters alone '
            "(their parameter sets were not run), so the band is the cross-validated error "
            "around the geometric mean, without the parameter-set spread."
        )
    return notes


def text(lines: Sequence[Line], lnc: int) -> str:
    """The summary for a terminal: one line per (family, phase, target), then the losses."""
    if not lines:
        return NONE
    head = ("family / phase / target", f"vs AWS's kernel (LNC {lnc})", "vs native path")
    rows = [
        (
            f"{x.family} {x.phase} {x.target}",
            _cell(x.stats.get("aws")),
            _cell(x.stats.get("native")),
        )
        for x in lines
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(3)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))]
    out += [fmt.format(*r) for r in rows]
    if any(None in x.stats.values() for x in lines):
        out.append(
            "no figure: nki-library has no kernel for the op, or it fails in the interpreter "
            "(the tables list why)"
        )
    out += _band_notes(lines)
    losses = [loss for x in lines for loss in x.losses]
    if losses:
        out.append("where ours is slower:")
        out += [
            f"  {x.op} {x.case} {x.target}: {x.speedup:.2f}x vs {x.other} ({x.why})" for x in losses
        ]
    else:
        out.append("ours is faster in every case with a figure")
    return "\n".join(out)
