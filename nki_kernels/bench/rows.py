"""Benchmark rows: one modeled or measured figure with its provenance.

Every row says what produced it -- "modeled (cost model vN, target)" or "measured
(hardware, tool)" -- together with the library version and a timestamp, so rows from
different runs can be appended to one file and plotted side by side.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from ..runtime.atomic_files import dir_lock, write_text_atomic


@dataclass(frozen=True)
class BenchRow:
    """One implementation of one op case on one target."""

    family: str  # "norm" | "attention" | "moe" | ...
    op: str  # e.g. "rms_norm fwd"
    case: str  # e.g. "[16384, 4096] bf16"
    target: str  # trn1 | trn2 | trn3
    # "nki" (this library), "aws" (AWS's nki-library kernel), "native" (TorchNeuron's path
    # for the plain PyTorch code), "native_cf" / "native_decomposition" (informational)
    impl: str
    latency_us: float
    provenance: str  # "modeled (cost model v1, trn2)" or "measured (hardware, ...)"
    mfu: float | None = None  # fraction of TensorE peak on useful FLOPs
    hbm_fraction: float | None = None  # minimum HBM traffic time / latency
    bound_by: str = ""
    lnc: int = 1  # 1: one physical core; 2: one logical core of two physical cores
    band_us: tuple[float, float] | None = None  # the cost model's latency band, if it has one
    extra: dict[str, Any] = field(default_factory=dict)
    version: str = __version__
    timestamp: float = field(default_factory=time.time)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def append_rows(path: str | Path, rows: Iterable[BenchRow]) -> None:
    """Append rows to a JSON-lines file (rewritten atomically so a crash loses nothing,
    under a lock on its directory so concurrent appenders keep each other's rows)."""
    path = Path(path)
    new = "".join(r.to_json() + "\n" for r in rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    with dir_lock(path.parent):
        old = path.read_text() if path.exists() else ""
        write_text_atomic(path, old + new)


def write_rows(path: str | Path, rows: Iterable[BenchRow]) -> None:
    """Replace `path` with exactly these rows (atomically)."""
    write_text_atomic(path, "".join(r.to_json() + "\n" for r in rows))


def read_rows(path: str | Path) -> list[BenchRow]:
    """Rows of a JSON-lines file (rows written before a field existed get its default)."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        d = json.loads(line)
        if d.get("band_us") is not None:
            d["band_us"] = tuple(d["band_us"])
        try:
            rows.append(BenchRow(**d))
        except TypeError as e:
            raise ValueError(f"{path}:{n}: not a benchmark row ({e})") from None
    return rows
