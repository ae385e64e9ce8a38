"""Records of stored configs: where an entry came from (`Provenance`) and which config a
call uses and why (`ConfigDecision`), with the lines `describe` shows people."""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..kernel_config import KernelConfig


def _json_number(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, list):
        return [_json_number(x) for x in v]
    return v


def stored_number(v: Any) -> float:
    """A stored latency as a float: null (never measured) is nan."""
    return math.nan if v is None else float(v)


@dataclass(frozen=True)
class Provenance:
    """Where a stored config came from."""

    kernel_hash: str
    measurer: str  # "modeled (cost model vN, <target>, LNC n)" or "measured (hardware)"
    latency_ns: float
    default_latency_ns: float
    trials: int
    date: str  # ISO 8601
    # optional (entries written before they existed lack them): the LNC the config was
    # tuned at, the ranking that chose it ('nominal' | 'pessimistic'), and the modeled
    # bands [fast end, slow end] over the cost model's parameter sets (perfmodel.band) of
    # the tuned latency, the default's latency and the speedup (default / tuned per set)
    lnc: int = 1
    rank: str = "nominal"
    latency_band_ns: list[float] | None = None
    default_latency_band_ns: list[float] | None = None
    speedup_band: list[float] | None = None

    @staticmethod
    def now() -> str:
        """The current time as an ISO 8601 UTC string (for `date`)."""
        return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields: a latency that is not a finite number (the default was never
        measured, e.g. tuning stopped during trial 0) becomes null -- JSON has no NaN."""
        return {k: _json_number(v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """Parse a stored provenance record (ValueError naming missing fields)."""
        names = [f.name for f in dataclasses.fields(cls)]
        optional = {f.name for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
        missing = [n for n in names if n not in data and n not in optional]
        if missing:
            raise ValueError(f"provenance: missing field(s) {missing}")
        return cls(**{n: data[n] for n in names if n in data})


@dataclass(frozen=True)
class ConfigDecision:
    """Which config a call of `op` uses for `problem` on `target`, and from where.

    `source` is TUNED (the exact key), NEAREST (a stored entry of another bucket of the
    same shape) or DEFAULT (the heuristic); `entry_key`, `file` and `provenance` name the
    stored entry (None for the default); `skipped` says why stored entries were not used.
    """

    op: str
    target: str
    problem: str
    config: KernelConfig
    source: str
    entry_key: str | None = None
    file: str | None = None
    provenance: Provenance | None = None
    skipped: tuple[str, ...] = ()
    lnc: int = 1  # the LNC the lookup was made for (the key carries lnc=2)

    def describe(self) -> str:
        """A few lines for people: op, LNC, problem, source, config, provenance (with the
        modeled bands when the entry has them)."""
        cfg = ", ".join(f"{k}={v}" for k, v in self.config.to_dict().items())
        lines = [
            f"{self.op} on {self.target} at LNC {self.lnc}, {self.problem}",
            f"  uses   {self.source}",
        ]
        if self.entry_key is not None:
            lines[-1] += f" [{self.entry_key}] from {self.file}"
        lines.append(f"  config {cfg}")
        if self.provenance is not None:
            p = self.provenance
            lines.append(
                f"  tuned  {banded_us(p.latency_ns, p.latency_band_ns)} vs default "
                f"{banded_us(p.default_latency_ns, p.default_latency_band_ns)}, speedup "
                f"{banded_x(p.default_latency_ns / p.latency_ns, p.speedup_band)} at the "
                f"entry's problem; {p.measurer}; tuned at LNC {p.lnc}, {p.rank} ranking; "
                f"{p.trials} trials; kernel hash {p.kernel_hash}; {p.date}"
            )
            if p.latency_band_ns is not None:
                lines.append(f"  band   {BAND_MEANING}")
        lines += [f"  skipped {s}" for s in self.skipped]
        return "\n".join(lines)


BAND_MEANING = (
    "(low–high) = the range of the modeled figure over the cost model's parameter sets "
    "(leave-one-out fits to the anchors and the unanchored parameters' range ends); not "
    "a confidence interval"
)


def banded_us(ns: float, band: Sequence[float] | None) -> str:
    """'12.34 us' or '12.34 us (12.00–13.10 us)'."""
    if not band:
        return f"{ns / 1e3:.2f} us"
    return f"{ns / 1e3:.2f} us ({band[0] / 1e3:.2f}–{band[1] / 1e3:.2f} us)"


def banded_x(x: float, band: Sequence[float] | None) -> str:
    """'x1.23' or 'x1.23 (1.20–1.26)'."""
    return f"x{x:.2f}" if not band else f"x{x:.2f} ({band[0]:.2f}–{band[1]:.2f})"
