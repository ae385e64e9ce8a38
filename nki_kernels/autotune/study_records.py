"""What a tuning study stores and reports (see study.py for the driver).

Trial outcomes and the names of the study's and trials' user attributes, the study's
key (`StudyKey`), the search settings (`TuneOptions`), and a stored trial read back as a
`TrialRecord` (`record_of`) and summed up in a `StudyReport`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from .space import ENCODINGS, GRID_THRESHOLD

OK, INVALID, REJECTED, ERROR = "ok", "invalid", "rejected", "error"
BUSY, ABANDONED = "duplicate-running", "abandoned"
FINAL_OUTCOMES = (OK, INVALID, REJECTED, ERROR)
CLAIM_SEP = "#claim#"
ORPHAN_AFTER_S = 10.0
RESULT = "result"
GATE_VERDICT = "gate:"
ENCODING_ATTR = "param_encoding"
STRATEGIES = ("auto", "tpe", "grid", "random")
GATE_MODES = ("always", "improving", "off")
RANKS = ("nominal", "pessimistic")


@dataclass(frozen=True)
class StudyKey:
    """What one study tunes; `name` also carries the measurer and kernel hash so results
    of different kernels or measurers never mix in one study."""

    op: str
    target: str
    bucket: str
    dtype: str
    measurer: str
    kernel_hash: str

    @property
    def name(self) -> str:
        m = self.measurer.replace(" ", "")
        return f"{self.op}/{self.target}/{self.bucket}/{self.dtype}@{m}:{self.kernel_hash[:8]}"


@dataclass(frozen=True)
class TuneOptions:
    """Search settings.

    `gate='improving'` (the default) checks only configs that beat the current best; a
    slower config is recorded unchecked (`gate=skipped`). No wrong config is exported
    even so: export gates a best that was not checked and moves on to the next best when
    it fails (`export.export_best`), so the exported config has always passed the gate.
    `stale_after_s`: a RUNNING trial older than this is taken as abandoned (its worker
    died on another host; on this host a dead process is noticed at once).
    `rank`: 'nominal' ranks trials by the modeled latency with the shipped parameters;
    'pessimistic' by the slow end of its band (the highest latency over the cost model's
    parameter sets, `perfmodel.band.parameter_sets`; needs a measurer with `bands`), so a
    config that wins only under optimistic parameters is not the best."""

    strategy: str = "auto"
    seed: int = 0
    grid_threshold: int = GRID_THRESHOLD
    gate: str = "improving"
    n_startup_trials: int | None = None
    stale_after_s: float = 3600.0
    dup_patience: int = 5
    enqueue_default: bool = True  # False only for measuring search efficiency from scratch
    rank: str = "nominal"
    encoding: str = "values"  # parameters of a new study (`space.ENCODINGS`)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}; got {self.strategy!r}")
        if self.gate not in GATE_MODES:
            raise ValueError(f"gate: expected one of {GATE_MODES}; got {self.gate!r}")
        if self.rank not in RANKS:
            raise ValueError(f"rank: expected one of {RANKS}; got {self.rank!r}")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding: expected one of {ENCODINGS}; got {self.encoding!r}")
        if not self.stale_after_s > 0:
            raise ValueError(f"stale_after_s: expected a number > 0; got {self.stale_after_s}")


@dataclass(frozen=True)
class TrialRecord:
    """One trial as the tuner sees it."""

    number: int
    config: dict[str, Any] | None
    outcome: str
    latency_ns: float | None
    rule: str | None = None
    reason: str | None = None
    duplicate_of: int | None = None
    worker: str | None = None
    gate: str | None = None  # "passed" | "skipped" | "off" for outcome ok
    label: str | None = None  # the measurer's label ("modeled (cost model v2, trn2)")
    key: str | None = None  # the config key (`KernelConfig.key()`)
    set_ns: tuple[float, ...] | None = None  # latency per band parameter set (bands on)

    @property
    def latency_hi_ns(self) -> float | None:
        """The slow end of the band (None when the trial priced no band)."""
        return max(self.set_ns) if self.set_ns else None

    def rank_ns(self, rank: str) -> float | None:
        """The figure trials are ranked by: the latency, or the band's slow end."""
        return self.latency_hi_ns if rank == "pessimistic" else self.latency_ns

    @property
    def evaluated(self) -> bool:
        """True when this trial did the work itself (not a copy of another trial's result)."""
        return self.outcome in FINAL_OUTCOMES and self.duplicate_of is None


@dataclass(frozen=True)
class StudyReport:
    """Summary of a study: counts, the best trial and the heuristic default's trial."""

    name: str
    space_size: int
    records: tuple[TrialRecord, ...]
    best: TrialRecord | None
    heuristic: TrialRecord | None

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.records if r.evaluated and r.outcome == outcome)

    @property
    def distinct_done(self) -> int:
        return len({r.key for r in self.records if r.evaluated})

    @property
    def duplicates(self) -> int:
        return sum(1 for r in self.records if r.duplicate_of is not None or r.outcome == BUSY)


def result_of(t: FrozenTrial) -> dict[str, Any]:
    """The trial's `result` attribute: outcome, latency_ns, rule, reason, ... ({} if none)."""
    r = t.user_attrs.get(RESULT, {})
    return r if isinstance(r, dict) else {}


def record_of(t: FrozenTrial) -> TrialRecord:
    """The `TrialRecord` of a stored trial.

    Trial user attributes: `worker` = {"id": "host:pid", "started": unix time} (written
    first), `config` = the config key (JSON), `result` = {"outcome", "latency_ns", "rule",
    "reason", "duplicate_of", "gate", "label", "set_ns"} (written once, when the trial
    ends; `set_ns` only when the measurer priced the band).
    """
    a = t.user_attrs
    r = result_of(t)
    outcome = r.get("outcome") or ("running" if t.state == TrialState.RUNNING else "unknown")
    config = json.loads(a["config"]) if "config" in a else None
    worker = a.get("worker", {})
    return TrialRecord(
        number=t.number,
        config=config,
        outcome=outcome,
        latency_ns=r.get("latency_ns"),
        rule=r.get("rule"),
        reason=r.get("reason"),
        duplicate_of=r.get("duplicate_of"),
        worker=worker.get("id") if isinstance(worker, dict) else None,
        gate=r.get("gate"),
        label=r.get("label"),
        key=a.get("config"),
        set_ns=tuple(r["set_ns"]) if r.get("set_ns") else None,
    )
