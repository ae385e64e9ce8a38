"""Charts drawn from benchmark rows (matplotlib, imported only when a chart is asked for)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from .bands import ceiling_label
from .rows import BenchRow
from .table import group


def speedup_chart(rows: Sequence[BenchRow], path: str | Path, lnc: int = 2) -> None:
    """Horizontal bars per (op, case, target) at `lnc`: AWS kernel / ours and native / ours."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels: list[str] = []
    vs_aws: list[float] = []
    vs_native: list[float] = []
    provenance: set[str] = set()
    for (_f, op, case, target, n), impls in group(rows).items():
        ours = impls.get("nki")
        if n != lnc or ours is None:
            continue
        aws, nat = impls.get("aws"), impls.get("native")
        # a speedup over a figure above the best published measurement of its kind is
        # a ceiling of the model, and says so on the chart (bench.bands.ceiling_label)
        labels.append(ceiling_label(f"{op} | {case} | {target}", op, ours.mfu, ours.hbm_fraction))
        ok = aws is not None and not math.isnan(aws.latency_us)
        vs_aws.append(aws.latency_us / ours.latency_us if ok and aws else 0.0)
        vs_native.append(nat.latency_us / ours.latency_us if nat else 0.0)
        provenance.add(ours.provenance)
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(labels) + 1.5))
    y = list(range(len(labels)))
    ax.barh([v - 0.2 for v in y], vs_aws, height=0.4, color="#c0392b", label="vs AWS kernel")
    ax.barh([v + 0.2 for v in y], vs_native, height=0.4, color="#3a7ca5", label="vs native")
    ax.set_yticks(y, labels, fontsize=6)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"speedup of ours (x), LNC {lnc}; 0 = no figure")
    ax.legend(fontsize=7)
    ax.set_title("nki-kernels -- " + ", ".join(sorted(provenance)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
