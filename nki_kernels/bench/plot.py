"""Charts drawn from benchmark rows (matplotlib, imported only when a chart is drawn).

A chart is drawn from its data (`chart_data`), and the data is written beside it
(`<chart>.json`, with the PNG's SHA-256), so a test can check that a committed chart is
the one its committed rows give without drawing it again.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..runtime.atomic_files import write_text_atomic
from .bands import ceiling_label
from .rows import BenchRow
from .table import group


def chart_data(rows: Sequence[BenchRow], lnc: int = 2, cost_model: str | None = None) -> dict:
    """The speedup chart's data: per (op, case, target) at `lnc`, AWS kernel / ours and
    native / ours (None: no figure). Only rows priced by `cost_model` (default: the
    current one) are drawn: figures of two cost models are never compared."""
    if cost_model is None:
        from ..perfmodel import COST_MODEL_VERSION

        cost_model = COST_MODEL_VERSION
    bars: list[dict[str, Any]] = []
    for (_f, op, case, target, n), impls in group(rows).items():
        ours = impls.get("nki")
        if n != lnc or ours is None or f"cost model {cost_model}," not in ours.provenance:
            continue
        ratio = {}
        for other in ("aws", "native"):
            o = impls.get(other)
            ok = o is not None and not math.isnan(o.latency_us)
            same = ok and o is not None and o.provenance == ours.provenance
            ratio[other] = round(o.latency_us / ours.latency_us, 4) if same and o else None
        bars.append(
            {
                # a speedup over a figure above the best published measurement of its
                # kind is a ceiling of the model, and the chart says so
                "label": ceiling_label(
                    f"{op} | {case} | {target}", op, ours.mfu, ours.hbm_fraction
                ),
                "vs_aws": ratio["aws"],
                "vs_native": ratio["native"],
            }
        )
    return {"lnc": lnc, "cost_model": cost_model, "bars": bars}


def data_path(png: str | Path) -> Path:
    """Where the data of the chart `png` is kept."""
    return Path(png).with_suffix(".json")


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def draw(data: dict, path: str | Path) -> None:
    """Draw `chart_data`'s bars into the PNG `path` (no timestamp or version in the file)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = data["bars"]
    labels = [b["label"] for b in bars]
    vs_aws = [b["vs_aws"] or 0.0 for b in bars]
    vs_native = [b["vs_native"] or 0.0 for b in bars]
    fig, ax = plt.subplots(figsize=(10, 0.42 * len(labels) + 1.5))
    y = list(range(len(labels)))
    ax.barh([v - 0.2 for v in y], vs_aws, height=0.4, color="#c0392b", label="vs AWS kernel")
    ax.barh([v + 0.2 for v in y], vs_native, height=0.4, color="#3a7ca5", label="vs native")
    ax.set_yticks(y, labels, fontsize=6)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel(f"speedup of ours (x; > 1: ours faster), LNC {data['lnc']}; 0 = no figure")
    ax.legend(fontsize=7)
    ax.set_title(
        f"nki-kernels -- modeled (cost model {data['cost_model']}), not measured", fontsize=9
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


def speedup_chart(rows: Sequence[BenchRow], path: str | Path, lnc: int = 2) -> None:
    """Draw the speedup chart of `rows` into `path` and its data beside it."""
    data = chart_data(rows, lnc)
    draw(data, path)
    data["png_sha256"] = sha256(path)
    write_text_atomic(data_path(path), json.dumps(data, indent=1, sort_keys=True) + "\n")


def refresh_chart(rows: Sequence[BenchRow], path: str | Path, lnc: int = 2) -> bool:
    """Redraw the chart at `path` only when its rows' data differs from the data kept
    beside it (or the PNG is not the one drawn from it); True when it was redrawn."""
    kept = data_path(path)
    if kept.exists() and Path(path).exists():
        old = json.loads(kept.read_text())
        digest = old.pop("png_sha256", None)
        if old == chart_data(rows, lnc) and digest == sha256(path):
            return False
    speedup_chart(rows, path, lnc)
    return True
