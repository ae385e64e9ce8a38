"""Comparison tables: ours vs AWS's nki-library kernel vs TorchNeuron's native path."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .bands import ceiling_label, ratio_band
from .rows import BenchRow

COLUMNS = (
    "op",
    "case",
    "target",
    "LNC",
    "ours (us)",
    "AWS kernel (us)",
    "native (us)",
    "native path",
    "vs AWS",
    "vs native",
    "ours MFU / HBM",
    "ours bound by",
    "figures",
)

Key = tuple[str, str, str, str, int]


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _us(r: BenchRow | None) -> str:
    if r is None:
        return ""
    if math.isnan(r.latency_us):
        return "fails (notes)"
    text = f"{r.latency_us:,.1f}"
    if r.band_us is not None:
        text += f" ({r.band_us[0]:,.0f}–{r.band_us[1]:,.0f})"
    return text


def speedup(ours: BenchRow | None, other: BenchRow | None) -> str:
    """other / ours, with a band when both rows carry per-parameter-set samples. Rows
    priced by different cost-model versions are not compared ("mixed")."""
    if ours is None or other is None or math.isnan(other.latency_us):
        return ""
    if ours.provenance != other.provenance:
        return "mixed"
    text = f"{other.latency_us / ours.latency_us:.2f}x"
    a, b = ours.extra.get("samples_us"), other.extra.get("samples_us")
    if a and b and len(a) == len(b):
        lo, hi = ratio_band(a, b, ours.target, ours.provenance)
        text += f" ({lo:.2f}–{hi:.2f})"
    return text


def group(rows: Sequence[BenchRow]) -> dict[Key, dict[str, BenchRow]]:
    """Rows keyed by (family, op, case, target, lnc) -> {impl: row}. Of several native
    rows the one marked `baseline` (else the fastest) is kept as 'native'."""
    keyed: dict[Key, dict[str, BenchRow]] = {}
    for r in rows:
        impls = keyed.setdefault((r.family, r.op, r.case, r.target, r.lnc), {})
        old = impls.get(r.impl)
        if r.impl == "native" and old is not None:
            if old.extra.get("baseline") or (
                not r.extra.get("baseline") and old.latency_us <= r.latency_us
            ):
                continue
        impls[r.impl] = r
    return keyed


def comparison_table(rows: Sequence[BenchRow], measured: Mapping[Any, Any] | None = None) -> str:
    """A Markdown table with one line per (op, case, target, LNC).

    "vs AWS" = AWS kernel latency / ours, "vs native" = native latency / ours (> 1: ours
    is faster). MFU counts useful FLOPs only (masked attention pairs and padding
    excluded); "HBM" is the minimum HBM traffic time over the latency. A missing AWS cell
    means nki-library has no kernel for the op at that shape, or the peer run failed
    (`peer_notes`). `measured` (`bench.measured.figures`, by (op, case, target, LNC)):
    adds a "measured (hardware)" column beside ours, stale figures marked stale.
    """
    cols = list(COLUMNS)
    if measured:
        cols.insert(cols.index("ours (us)") + 1, "ours measured (hardware, us)")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for (_family, op, case, target, lnc), impls in group(rows).items():
        ours, aws, nat = impls.get("nki"), impls.get("aws"), impls.get("native")
        ref = ours or aws or nat
        assert ref is not None
        eff = ""
        if ours is not None:
            eff = _pct(ours.mfu) if ours.mfu is not None else _pct(ours.hbm_fraction)
            if ours.mfu is None and eff:
                eff += " HBM"
            eff = ceiling_label(eff, op, ours.mfu, ours.hbm_fraction)
        cells: tuple[str, ...] = (
            op,
            case,
            target,
            str(lnc),
            _us(ours),
            _us(aws),
            _us(nat),
            str(nat.extra.get("path", "")) if nat else "",
            speedup(ours, aws),
            speedup(ours, nat),
            eff,
            ours.bound_by if ours else "",
            ref.provenance,
        )
        if measured:
            fig = measured.get((op, case, target, lnc))
            cells = (*cells[:5], fig.cell() if fig else "", *cells[5:])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dropping_table(rows: Sequence[BenchRow]) -> str:
    """The capacity-factor MoE composition (may drop tokens), apart from the baselines."""
    cf = [r for r in rows if r.impl == "native_cf"]
    if not cf:
        return ""
    ours = {(r.op, r.case, r.target, r.lnc): r for r in rows if r.impl == "nki"}
    lines = [
        "| op | case | target | LNC | capacity-factor composition (us) | what it does "
        "| ours (us) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in cf:
        o = ours.get((r.op, r.case, r.target, r.lnc))
        lines.append(
            f"| {r.op} | {r.case} | {r.target} | {r.lnc} | {_us(r)} | "
            f"{r.extra.get('path', '')} | {_us(o)} |"
        )
    return "\n".join(lines)
