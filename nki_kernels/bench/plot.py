"""Charts drawn from benchmark rows (matplotlib, imported only when a chart is asked for)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .rows import BenchRow


def speedup_chart(rows: Sequence[BenchRow], path: str | Path) -> None:
    """Horizontal bars: native latency / NKI latency per (op, case, target)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs: dict[tuple[str, str, str], dict[str, BenchRow]] = {}
    for r in rows:
        pairs.setdefault((r.op, r.case, r.target), {})[r.impl] = r
    labels, values, provenance = [], [], set()
    for (op, case, target), impls in pairs.items():
        if "nki" in impls and "native" in impls:
            labels.append(f"{op} | {case} | {target}")
            values.append(impls["native"].latency_us / impls["nki"].latency_us)
            provenance.add(impls["nki"].provenance)
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(labels) + 1.5))
    ax.barh(range(len(labels)), values, color="#3a7ca5")
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speedup over native lowering (x)")
    ax.set_title("nki-kernels vs native lowering -- " + ", ".join(sorted(provenance)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
