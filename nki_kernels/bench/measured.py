"""Measured rows beside the modeled benchmark figures: what `nki-kernels bench` reads.

`nki-kernels hwcheck` writes one measured row per kernel specialization it timed on a
Neuron device (`perfmodel.measurements`, JSONL). Rows of the cases `make bench` also has
are labelled with the benchmark row's `op` and `case` texts; this module turns them into
one figure per (op, case, target, LNC):

    measured latency = sum over the op's rows of median x launches   (the op's kernels)
    min / max        = the same sums over the rows' min / max

and says whether the kernels measured are still the kernels of this checkout: a row whose
`kernel_hash` differs from the current source hash of its kernel is *stale* (the
kernel changed since it was measured) and its figure is shown as such, never as a
current measurement.

Where rows come from: `bench --measured FILE`, else `DEFAULT_MEASURED` when it exists.
No measured rows are committed: nothing in this repository has run on hardware yet.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MEASURED = Path("benchmarks/data/measured_rows.jsonl")
# packages whose modules define the library's `nki.jit` kernels (and the calibration ones)
KERNEL_PACKAGES = ("norm", "attention", "moe", "examples", "perfmodel")
NONE_COMMITTED = (
    "measured (hardware): none -- no measured rows are committed (nothing here has run on "
    "a Neuron device); `nki-kernels hwcheck --out {path}` on a trn2 writes them"
)

Key = tuple[str, str, str, int]  # (op, case, target, lnc)


@dataclass(frozen=True)
class MeasuredFigure:
    """One benchmark row's measured latency, summed over its kernels' measured rows."""

    op: str
    case: str
    target: str
    lnc: int
    latency_us: float
    min_us: float
    max_us: float
    device: str
    kernels: tuple[str, ...]
    stale: tuple[str, ...]  # kernels whose source changed since they were measured

    @property
    def label(self) -> str:
        """'measured (hardware, <device>)' -- the provenance of the figure."""
        return f"measured (hardware, {self.device})"

    def cell(self) -> str:
        """The table cell: the figure with its min-max range, or why it is stale."""
        text = f"{self.latency_us:,.1f} ({self.min_us:,.0f}–{self.max_us:,.0f})"
        if self.stale:
            return f"stale: {text}, {', '.join(self.stale)} changed since measured"
        return text


def current_kernel_hashes(packages: Iterable[str] = KERNEL_PACKAGES) -> dict[str, set[str]]:
    """Kernel name -> the source hashes of the `nki.jit` kernels of that name in this
    checkout (the scheme `hwcheck` stamps rows with: `kernel_cache.kernel_source_hash`)."""
    from ..interp.launch import Kernel
    from ..runtime.kernel_cache import kernel_source_hash

    found: dict[str, set[str]] = {}
    for pkg in packages:
        root = importlib.import_module(f"nki_kernels.{pkg}")
        names = [root.__name__] + [
            m.name for m in pkgutil.walk_packages(root.__path__, root.__name__ + ".")
        ]
        for name in names:
            mod = importlib.import_module(name)
            for value in vars(mod).values():
                if isinstance(value, Kernel) and value.fn.__module__ == mod.__name__:
                    found.setdefault(value.fn.__name__, set()).add(kernel_source_hash(value))
    return found


def load(path: str | Path) -> list[Any]:
    """The measured rows of `path` that carry a benchmark label (`op` / `case`)."""
    from ..perfmodel.measurements import load_rows

    return [r for r in load_rows(path) if r.op is not None]


def figures(
    rows: Sequence[Any], hashes: Mapping[str, set[str]] | None = None
) -> dict[Key, MeasuredFigure]:
    """One figure per (op, case, target, LNC) of the labelled `rows` (see module doc).
    `hashes`: current kernel hashes (default: `current_kernel_hashes()`)."""
    current = current_kernel_hashes() if hashes is None else hashes
    grouped: dict[Key, list[Any]] = {}
    for r in rows:
        if r.op is not None:
            grouped.setdefault((r.op, r.case, r.target, r.lnc), []).append(r)
    out = {}
    for key, group in grouped.items():
        stale = sorted({r.kernel for r in group if r.kernel_hash not in current.get(r.kernel, ())})
        out[key] = MeasuredFigure(
            *key,
            latency_us=sum(r.latency_ns["median"] * r.launches for r in group) / 1e3,
            min_us=sum(r.latency_ns["min"] * r.launches for r in group) / 1e3,
            max_us=sum(r.latency_ns["max"] * r.launches for r in group) / 1e3,
            device=", ".join(sorted({r.device for r in group})),
            kernels=tuple(sorted({r.kernel for r in group})),
            stale=tuple(stale),
        )
    return out


def for_bench(path: str | Path | None) -> tuple[dict[Key, MeasuredFigure], list[str]]:
    """(figures, notes) for the bench tables: from `path`, else `DEFAULT_MEASURED` if it
    exists. The notes say where the figures come from, or that there are none."""
    source = Path(path) if path is not None else DEFAULT_MEASURED
    if path is None and not source.exists():
        return {}, [NONE_COMMITTED.format(path=DEFAULT_MEASURED)]
    rows = load(source)
    figs = figures(rows)
    notes = [
        f"measured (hardware): {len(figs)} op figures from {len(rows)} labelled rows of "
        f"{source} (devices: {', '.join(sorted({f.device for f in figs.values()})) or 'none'})"
    ]
    stale = [f for f in figs.values() if f.stale]
    if stale:
        notes.append(
            f"{len(stale)} measured figures are stale: their kernels changed since they were "
            "measured (shown as 'stale: ...'; re-run `nki-kernels hwcheck`)"
        )
    return figs, notes


def unmatched(figs: Mapping[Key, MeasuredFigure], bench_keys: Iterable[Key]) -> list[str]:
    """Measured figures with no benchmark row of the same (op, case, target, LNC)."""
    known = set(bench_keys)
    return [
        f"{f.op} {f.case} {f.target} LNC {f.lnc}: {f.cell()} us, {f.label} (no modeled row)"
        for k, f in sorted(figs.items())
        if k not in known
    ]


__all__ = [
    "DEFAULT_MEASURED",
    "MeasuredFigure",
    "current_kernel_hashes",
    "figures",
    "for_bench",
    "load",
    "unmatched",
]
