"""Benchmark rows: one modeled or measured figure with its provenance.

Every row says what produced it -- "modeled (cost model vN, target)" or "measured
(hardware, tool)" -- together with the library version and a timestamp, so rows from
different runs can be appended to one file and plotted side by side.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__


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
    """Append rows to a JSON-lines file (rewritten atomically so a crash loses nothing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else ""
    new = "".join(r.to_json() + "\n" for r in rows)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(old + new)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; rows are data for everyone
    os.replace(tmp, path)


def write_rows(path: str | Path, rows: Iterable[BenchRow]) -> None:
    """Replace `path` with exactly these rows (atomically)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write("".join(r.to_json() + "\n" for r in rows))
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


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
