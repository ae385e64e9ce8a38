"""Comparison tables: this library's kernels against the compiler's native lowering."""

from __future__ import annotations

from collections.abc import Sequence

from .rows import BenchRow

COLUMNS = (
    "op",
    "case",
    "target",
    "NKI (us)",
    "native (us)",
    "speedup",
    "NKI MFU",
    "NKI HBM",
    "NKI bound by",
    "figures",
)


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def _us(r: BenchRow | None) -> str:
    return "" if r is None else f"{r.latency_us:,.1f}"


def comparison_table(rows: Sequence[BenchRow]) -> str:
    """A Markdown table with one line per (op, case, target): NKI vs native latency.

    Speedup = native latency / NKI latency. MFU counts useful FLOPs only (masked
    attention tiles and padding excluded); "HBM" is the minimum HBM traffic time over
    the latency (how close a memory-bound kernel gets to the bandwidth bound).
    """
    keyed: dict[tuple[str, str, str, str], dict[str, BenchRow]] = {}
    for r in rows:
        keyed.setdefault((r.family, r.op, r.case, r.target), {})[r.impl] = r
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for (_family, op, case, target), impls in keyed.items():
        nki, nat = impls.get("nki"), impls.get("native")
        ref = nki if nki is not None else nat
        assert ref is not None
        speedup = f"{nat.latency_us / nki.latency_us:.2f}x" if nki and nat else ""
        cells = (
            op,
            case,
            target,
            _us(nki),
            _us(nat),
            speedup,
            _pct(nki.mfu if nki else None),
            _pct(nki.hbm_fraction if nki else None),
            nki.bound_by if nki else "",
            ref.provenance,
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
