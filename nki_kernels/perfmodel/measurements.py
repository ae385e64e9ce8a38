"""Measured kernel launches as data: the JSONL format `hwcheck` writes and `calibrate` reads.

One line of the file is one JSON object, one measured launch of one kernel on hardware:

```
{"kind": "measured", "device": "trn2.48xlarge", "sdk_version": "2.33.0",
 "torch_neuronx_version": "2.14.0", "lnc": 1, "target": "trn2",
 "estimable": "matmul_fully_blocked", "kernel": "matmul_fully_blocked",
 "kernel_hash": "3f2a...", "shape": {"M": 2048, "K": 2048, "N": 2048},
 "dtype": "bfloat16", "config": {},
 "latency_ns": {"median": 251000.0, "min": 249800.0, "max": 260100.0, "repeats": 20},
 "modeled_ns": 243512.0, "timestamp": "2026-12-01T20:15:00+00:00"}
```

Fields (all required; `null` only where said):

- `kind`: always "measured" (a modeled figure is never written to this file).
- `device`: instance type or device name as the runtime reports it (free text).
- `sdk_version`, `torch_neuronx_version`: versions of the Neuron SDK / torch-neuronx that
  compiled and ran the kernel (strings; `torch_neuronx_version` may be null when the
  kernel ran through `nki.jit` alone).
- `lnc`: logical core size the kernel ran with, 1 or 2.
- `target`: "trn1", "trn2" or "trn3" (the parameter set the row calibrates).
- `estimable`: name in `nki_kernels.perfmodel.registry` that builds the same launch from
  `shape` and `dtype` (what `calibrate` re-prices), or null when the kernel is not
  registered there; then the row is kept but cannot be used for fitting.
- `kernel`: the kernel's own name; `kernel_hash`: hash of its source (same scheme as the
  config store's provenance); both strings.
- `shape`: {dimension name: int}, the registry entry's `dims` when `estimable` is set.
- `dtype`: input dtype string, e.g. "bfloat16".
- `config`: the tunable config the launch used, as a JSON object ({} for none).
  `calibrate` passes it as keyword arguments to the registered kernel (e.g. the tutorial
  matmuls' {"tiles_m": 16, "tiles_n": 2, "tiles_k": 8}), so write the kernel's own
  keyword names here.
- `latency_ns`: {"median", "min", "max"} floats in ns with min <= median <= max and
  min > 0, and "repeats" (int >= 1): device time of one launch over that many repeats.
- `modeled_ns`: what the cost model said for the same launch when it was measured
  (float, or null); kept to show the model's error at measurement time.
- `timestamp`: ISO 8601 time of the measurement, with a UTC offset.

Optional fields (absent in older files; written only when set):

- `op`, `case`: the benchmark row this launch belongs to (`BenchRow.op` / `.case`, e.g.
  "rms_norm fwd", "[16384, 4096] bf16"), so `nki-kernels bench` can show the op's measured
  figure beside its modeled one (`bench.measured`); both strings or both absent.
- `launches`: how many times the op launched this specialization (int >= 1, default 1):
  the op's measured latency is the sum of median x launches over its rows.

Use from the hardware check:

```python
from nki_kernels.perfmodel.measurements import MeasuredRow, append_row, latency_stats
row = MeasuredRow(device=..., sdk_version=..., torch_neuronx_version=..., lnc=1,
                  target="trn2", estimable="matmul_fully_blocked", kernel=...,
                  kernel_hash=..., shape={"M": 2048, "K": 2048, "N": 2048},
                  dtype="bfloat16", config={}, latency_ns=latency_stats(samples_ns),
                  modeled_ns=est.latency_ns, timestamp=now_utc_iso())
append_row("measurements.jsonl", row)   # validates, then appends atomically
rows = load_rows("measurements.jsonl")  # MeasurementFileError names file, line, field
```

`MeasuredRow.__post_init__` validates every field, so a row that exists is well formed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

KIND = "measured"
TARGET_NAMES = ("trn1", "trn2", "trn3")
LATENCY_KEYS = ("median", "min", "max", "repeats")
FIELDS = (
    "kind",
    "device",
    "sdk_version",
    "torch_neuronx_version",
    "lnc",
    "target",
    "estimable",
    "kernel",
    "kernel_hash",
    "shape",
    "dtype",
    "config",
    "latency_ns",
    "modeled_ns",
    "timestamp",
)
OPTIONAL_FIELDS = ("op", "case", "launches")


class MeasurementError(ValueError):
    """A measured row with a missing or ill-typed field (names the field)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class MeasurementFileError(ValueError):
    """A measurement file that cannot be read: names the file, the line and the field."""

    def __init__(self, path: str | os.PathLike[str], line: int, field_name: str, message: str):
        super().__init__(f"{os.fspath(path)}:{line}: field {field_name!r}: {message}")
        self.path = os.fspath(path)
        self.line = line
        self.field = field_name


def _expect(cond: bool, name: str, expected: str, got: object) -> None:
    if not cond:
        raise MeasurementError(name, f"expected {expected}; got {got!r}")


def _is_num(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class MeasuredRow:
    """One measured kernel launch (see the module docstring for every field)."""

    device: str
    sdk_version: str
    torch_neuronx_version: str | None
    lnc: int
    target: str
    estimable: str | None
    kernel: str
    kernel_hash: str
    shape: Mapping[str, int]
    dtype: str
    config: Mapping[str, Any]
    latency_ns: Mapping[str, float]
    modeled_ns: float | None
    timestamp: str
    kind: str = field(default=KIND)
    op: str | None = None
    case: str | None = None
    launches: int = 1

    def __post_init__(self) -> None:
        _expect(self.kind == KIND, "kind", repr(KIND), self.kind)
        for name in ("device", "sdk_version", "kernel", "kernel_hash", "dtype"):
            value = getattr(self, name)
            _expect(isinstance(value, str) and value != "", name, "a non-empty string", value)
        tnv = self.torch_neuronx_version
        _expect(
            tnv is None or isinstance(tnv, str), "torch_neuronx_version", "a string or null", tnv
        )
        _expect(self.lnc in (1, 2) and isinstance(self.lnc, int), "lnc", "1 or 2", self.lnc)
        _expect(self.target in TARGET_NAMES, "target", f"one of {TARGET_NAMES}", self.target)
        est = self.estimable
        _expect(
            est is None or (isinstance(est, str) and est != ""), "estimable", "a name or null", est
        )
        _expect(isinstance(self.shape, Mapping), "shape", "an object {dim: int}", self.shape)
        for dim, size in self.shape.items():
            ok = isinstance(dim, str) and isinstance(size, int) and not isinstance(size, bool)
            _expect(ok and size > 0, f"shape.{dim}", "a positive integer", size)
        _expect(isinstance(self.config, Mapping), "config", "an object", self.config)
        lat = self.latency_ns
        _expect(isinstance(lat, Mapping), "latency_ns", f"an object with {LATENCY_KEYS}", lat)
        for key in LATENCY_KEYS:
            _expect(key in lat, f"latency_ns.{key}", "a number", "missing")
        for key in ("median", "min", "max"):
            _expect(
                _is_num(lat[key]) and lat[key] > 0, f"latency_ns.{key}", "a number > 0", lat[key]
            )
        reps = lat["repeats"]
        _expect(
            isinstance(reps, int) and not isinstance(reps, bool) and reps >= 1,
            "latency_ns.repeats",
            "an integer >= 1",
            reps,
        )
        _expect(
            lat["min"] <= lat["median"] <= lat["max"],
            "latency_ns",
            "min <= median <= max",
            dict(lat),
        )
        mod = self.modeled_ns
        _expect(
            mod is None or (_is_num(mod) and mod > 0), "modeled_ns", "a number > 0 or null", mod
        )
        _expect(isinstance(self.timestamp, str), "timestamp", "an ISO 8601 string", self.timestamp)
        try:
            stamp = datetime.fromisoformat(self.timestamp)
        except ValueError:
            raise MeasurementError(
                "timestamp", f"expected ISO 8601 with a UTC offset; got {self.timestamp!r}"
            ) from None
        _expect(stamp.tzinfo is not None, "timestamp", "a UTC offset", self.timestamp)
        for name in ("op", "case"):
            value = getattr(self, name)
            _expect(value is None or (isinstance(value, str) and value != ""), name,
                    "a non-empty string or absent", value)  # fmt: skip
        _expect((self.op is None) == (self.case is None), "case", "set together with op",
                self.case)  # fmt: skip
        n = self.launches
        _expect(isinstance(n, int) and not isinstance(n, bool) and n >= 1, "launches",
                "an integer >= 1", n)  # fmt: skip

    @property
    def median_ns(self) -> float:
        """The measured median latency of one launch, ns."""
        return float(self.latency_ns["median"])

    def to_dict(self) -> dict[str, Any]:
        """The row as the JSON object written to the file (keys in `FIELDS` order, then
        the optional fields that are set)."""
        out = {
            name: (dict(v) if isinstance(v := getattr(self, name), Mapping) else v)
            for name in FIELDS
        }
        if self.op is not None:
            out.update(op=self.op, case=self.case)
        if self.launches != 1:
            out["launches"] = self.launches
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MeasuredRow:
        """Build and validate a row; `MeasurementError` names the first bad field."""
        if not isinstance(data, Mapping):
            raise MeasurementError("(row)", f"expected a JSON object; got {type(data).__name__}")
        missing = [f for f in FIELDS if f not in data]
        if missing:
            raise MeasurementError(missing[0], "missing")
        unknown = sorted(set(data) - set(FIELDS) - set(OPTIONAL_FIELDS))
        if unknown:
            raise MeasurementError(
                unknown[0], f"unknown field; expected only {FIELDS + OPTIONAL_FIELDS}"
            )
        return cls(**{name: data[name] for name in (*FIELDS, *OPTIONAL_FIELDS) if name in data})


def latency_stats(samples_ns: Sequence[float]) -> dict[str, float]:
    """{"median", "min", "max", "repeats"} of per-launch device times in ns."""
    if not samples_ns:
        raise MeasurementError("latency_ns", "expected at least one sample; got none")
    return {
        "median": float(statistics.median(samples_ns)),
        "min": float(min(samples_ns)),
        "max": float(max(samples_ns)),
        "repeats": len(samples_ns),
    }


def now_utc_iso() -> str:
    """The current time as the `timestamp` field wants it."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def load_rows(path: str | os.PathLike[str]) -> list[MeasuredRow]:
    """Every row of a JSONL measurement file; blank lines are skipped.

    Raises `MeasurementFileError` ("file:line: field 'x': expected ...; got ...") on the
    first line that is not JSON or not a valid row, and on a file with no rows.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise MeasurementFileError(p, 0, "(file)", f"cannot read: {exc.strerror}") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MeasurementFileError(p, lineno, "(json)", f"not JSON: {exc.msg}") from None
        try:
            rows.append(MeasuredRow.from_dict(data))
        except MeasurementError as exc:
            raise MeasurementFileError(p, lineno, exc.field, str(exc).split(": ", 1)[1]) from None
        except TypeError as exc:
            raise MeasurementFileError(p, lineno, "(row)", str(exc)) from None
    if not rows:
        raise MeasurementFileError(p, 0, "(file)", "expected at least one measured row; got none")
    return rows


def append_row(path: str | os.PathLike[str], row: MeasuredRow) -> None:
    """Append `row` to the JSONL file at `path` atomically (the file is created if absent).

    The new content is written to a temporary file beside `path` and renamed over it, so
    a reader never sees a half-written line. Concurrent writers to one file are not
    serialized (the last rename wins): use one file per measuring process.
    """
    if not isinstance(row, MeasuredRow):
        raise TypeError(f"row: expected a MeasuredRow; got {type(row).__name__}")
    p = Path(path)
    old = p.read_bytes() if p.exists() else b""
    if old and not old.endswith(b"\n"):
        old += b"\n"
    line = json.dumps(row.to_dict(), sort_keys=False).encode() + b"\n"
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(old + line)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
