"""The harness's outputs: a per-step table, the JSON report and a plot of both loss
curves with their delta against the tolerance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..runtime.atomic_files import write_text_atomic
from .harness import Report


def table(r: Report) -> str:
    """The per-step comparison as a Markdown table, then the verdict lines."""
    rows = [
        "| step | reference loss | NKI loss | abs delta | 2nd torch impl. delta | within tol |",
        "|---:|---:|---:|---:|---:|:---:|",
    ]
    for i, (a, b, c) in enumerate(
        zip(r.reference.losses, r.candidate.losses, r.alternative.losses, strict=True)
    ):
        d = abs(b - a)
        rows.append(
            f"| {i} | {a:.6f} | {b:.6f} | {d:.2e} | {abs(c - a):.2e} | "
            f"{'yes' if d <= r.tolerance else '**no**'} |"
        )
    return "\n".join([*rows, "", *summary(r)])


def summary(r: Report) -> list[str]:
    """The verdict, one fact a line."""
    first = r.first_divergent_step
    nonfinite = sum(r.candidate.nonfinite)
    return [
        f"tolerance |Δloss| <= {r.tolerance:.3g} ({r.tolerance_rule}), fixed before the run",
        f"max |Δloss| {max(r.deltas):.3g}; noise floor (two torch implementations) {r.floor:.3g}",
        f"first divergent step: {'none' if first is None else first}",
        f"non-finite gradient elements: {nonfinite} (reference: {sum(r.reference.nonfinite)})",
        f"save at step {r.resume_from} / reload / continue: max |Δloss| {r.resume_max_delta:.3g}",
        f"step time: reference {r.reference.seconds / r.steps:.3f} s, NKI "
        f"{r.candidate.seconds / r.steps:.3f} s (measured, this CPU; NKI = interpreter)",
        f"verdict: {'PASS' if r.passed else 'FAIL'}",
    ]


def write_json(r: Report, path: Path) -> Path:
    """The report as JSON at `path`."""
    return write_text_atomic(path, json.dumps(r.to_json(), indent=1) + "\n")


def plot(reports: list[Report], path: Path) -> Path | None:
    """Loss curves (reference, NKI) and |Δloss| with the tolerance and the noise floor, one
    column per report; None when matplotlib is not installed."""
    figure = loss_figure(len(reports))
    if figure is None:
        return None
    plt, fig, axes = figure
    for col, r in enumerate(reports):
        top, bottom = axes[0][col], axes[1][col]
        steps = range(r.steps)
        top.plot(steps, r.reference.losses, label="reference (torch)", lw=2)
        top.plot(steps, r.candidate.losses, "--", label="NKI ops", lw=2)
        top.set_title(f"{r.model} ({r.dtype})")
        top.set_ylabel("training loss")
        top.legend()
        bottom.semilogy(
            steps, [max(d, 1e-12) for d in r.deltas], "o-", label="|Δloss| NKI (0 drawn at 1e-12)"
        )
        floor = [max(abs(a - b), 1e-12) for a, b in zip(r.alternative.losses, r.reference.losses)]
        bottom.semilogy(steps, floor, "x:", label="|Δloss| 2nd torch impl.")
        bottom.axhline(r.tolerance, color="red", lw=1, label=f"tolerance {r.tolerance:.2g}")
        bottom.set_xlabel("step")
        bottom.legend(fontsize=8)
    return save_figure(plt, fig, path)


def loss_figure(columns: int) -> tuple[Any, Any, Any] | None:
    """(pyplot, figure, axes [2][columns]): loss curves above |Δloss| per column; None
    when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(2, columns, figsize=(5 * columns, 6), squeeze=False)
    return plt, fig, axes


def save_figure(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write `fig` to `path` (creating its folder) and close it."""
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


__all__ = ["loss_figure", "plot", "save_figure", "summary", "table", "write_json"]
