"""The study driver: one Optuna study per (op, target, bucket, dtype).

Each trial asks the sampler for a config, then:

1. **dedupes**: if a finished trial of the study already holds this config (matched by
   `KernelConfig.key()`), its result is copied and nothing is evaluated; concurrent workers
   that draw the same config race for an atomic *claim* (see below) and only the winner
   evaluates it;
2. **validates** (`KernelConfig.validate`) and **measures** (the measurer's launch may hit
   an interpreter rule, e.g. `SBUF_OVERFLOW`): a failure is recorded as `outcome=invalid`
   with the rule and reason as trial user attributes and the trial is PRUNED -- it never
   counts as best, and samplers learn to avoid it;
3. **gates** the result (`gate.CorrectnessGate`): a wrong output is `outcome=rejected`
   (PRUNED) with the error in the reason, together with the latency it would have had;
4. otherwise the trial COMPLETEs with the latency in ns (`outcome=ok`).

Anything unexpected is `outcome=error` (FAIL) and the study carries on. The kernel's
heuristic default is enqueued as the first trial, so every study measures it.

Strategies: `tpe` (multivariate TPE, seeded: one worker with one seed is reproducible),
`grid` (exhaustive; trial *n* takes grid point *n*, so workers split the grid), `random`
(the baseline), `auto` = grid when the space has at most `grid_threshold` configs, else
TPE. The budget `n_trials` counts distinct configs finished in the study (all workers),
so a resumed run continues to the same total.

**Interruption.** A trial interrupted by Ctrl-C, SIGTERM (a worker whose parent died gets
it, see `lifecycle`) or the `timeout` (enforced inside a trial with SIGALRM when `run` is on
the main thread) is marked FAIL with `outcome=abandoned` before the exception propagates:
it is not final, so a resumed run measures that config again, and it never stays RUNNING.

**Regating.** A verdict of the correctness gate given after a trial finished (at export or
by `regate`) is stored as the study user attribute `gate:<trial number>`; `report` counts a
failed verdict as rejected, so the next best config takes its place.

**Claims.** Trials carry no uniqueness constraint, but study names do: creating the study
`<study>#claim#<config hash>.<attempt>` is an atomic test-and-set in every Optuna storage
(SQL unique constraint; the journal's log order). The claim study records the owner trial.
A claim whose owner died (its process is gone, or it ran longer than `stale_after_s`) is
released by marking the owner FAIL (`outcome=abandoned`) and taking the next attempt.
Claim studies whose owner trial has finished are deleted by `drop_claims` (the CLI does it
when a study's run ends), so a dashboard shows one study per (op, target, bucket).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import random
import socket
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import optuna
from optuna.exceptions import DuplicatedStudyError, UpdateFinishedTrialError
from optuna.samplers import BaseSampler, GridSampler, RandomSampler, TPESampler
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from ..interp.errors import NkiValidationError
from ..kernel_config import InvalidConfig, KernelConfig
from ..targets import Target
from .gate import CorrectnessGate
from .measure import HardwareMeasurer, Measurer
from .space import CandidateSampler, SearchSpace
from .study_records import (
    ABANDONED,
    BUSY,
    CLAIM_SEP,
    ENCODING_ATTR,
    ERROR,
    FINAL_OUTCOMES,
    GATE_MODES,
    GATE_VERDICT,
    INVALID,
    OK,
    ORPHAN_AFTER_S,
    RANKS,
    REJECTED,
    RESULT,
    STRATEGIES,
    StudyKey,
    StudyReport,
    TrialRecord,
    TuneOptions,
    record_of,
    result_of,
)
from .trial_signals import TrialTimeout, alarm, signals_deferred
from .tunable import Tunable


def _measurer_tag(measurer: Any, target: Target, lnc: int = 1, rank: str = "nominal") -> str:
    """The measurer part of a study key, so studies at LNC 1 and 2 (and ranked by the
    nominal or the pessimistic figure) never mix: hardware timings name the LNC they ran
    at (the runtime's, `runtime.lnc`); the cost model names the LNC it priced the launch
    at (`Tunable.lnc`) when it is not 1, so LNC-1 studies keep their names, and a
    pessimistic ranking."""
    from ..runtime.lnc import runtime_lnc

    if isinstance(measurer, HardwareMeasurer):
        return f"{measurer.name}-lnc{runtime_lnc(target)}"
    tag = str(measurer.name) + (f"-lnc{lnc}" if lnc != 1 else "")
    return tag + ("-pessimistic" if rank == "pessimistic" else "")


def _worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _quiet_optuna() -> Iterator[None]:
    """Silence Optuna's INFO log for claim studies (one per config would flood the log)."""
    logger = logging.getLogger("optuna")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


class _Grid(GridSampler):
    """GridSampler without its `study.stop()` (the driver decides when to stop)."""

    def after_trial(self, study: Any, trial: Any, state: Any, values: Any) -> None:
        return None


class Tuner:
    """Tunes one op on one problem (a bucket's shapes and dtype) for one target."""

    def __init__(
        self,
        tunable: Tunable,
        problem: Any,
        target: Target,
        storage: BaseStorage,
        measurer: Measurer,
        gate: CorrectnessGate | None = None,
        options: TuneOptions | None = None,
        worker: int = 0,
    ) -> None:
        self.tunable = tunable
        self.problem = problem
        self.search_problem = tunable.proxy(problem)
        self.target = target
        self.storage = storage
        self.measurer = measurer
        self.options = options or TuneOptions()
        self.gate = gate if gate is not None or self.options.gate == "off" else CorrectnessGate()
        self.worker = worker
        self.space = SearchSpace(
            tunable.config_cls, problem, target, encoding=self.options.encoding
        )
        if self.options.rank == "pessimistic" and not getattr(measurer, "bands", False):
            raise ValueError(
                f"rank: 'pessimistic' needs a measurer that prices the cost model's band "
                f"(CostModelMeasurer(bands=True)); got {getattr(measurer, 'name', measurer)!r}"
            )
        self.key = StudyKey(
            tunable.op,
            target.name,
            tunable.bucket_key(problem),
            tunable.dtype(problem),
            _measurer_tag(measurer, target, tunable.lnc, self.options.rank),
            tunable.source_hash(),
        )
        self._study: optuna.Study | None = None
        self._done: dict[int, TrialRecord] = {}
        self._rng = random.Random(self.options.seed * 1000 + worker)

    # ----------------------------------------------------------------- study setup
    @property
    def strategy(self) -> str:
        s = self.options.strategy
        if s == "auto":
            return "grid" if self.space.is_small(self.options.grid_threshold) else "tpe"
        return s

    def _sampler(self) -> BaseSampler:
        seed = self.options.seed + self.worker
        if self.strategy == "grid":
            # one shared seed: every worker must see the same grid order
            return _Grid(self.space.grid(), seed=self.options.seed)
        if self.strategy == "random":
            return CandidateSampler(RandomSampler(seed=seed), self.space, seed)
        startup = self.options.n_startup_trials
        if startup is None:
            # Optuna's 10 random trials before TPE models the space (fewer only for tiny
            # spaces); in the search-efficiency benchmark fewer start-up trials did worse
            startup = min(10, max(1, self.space.size // 4))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            tpe = TPESampler(
                seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup
            )
        return CandidateSampler(tpe, self.space, seed)

    def study(self) -> optuna.Study:
        """Create or load the study; enqueue the heuristic default into a new one."""
        if self._study is not None:
            return self._study
        study = optuna.create_study(
            storage=self.storage,
            study_name=self.key.name,
            direction="minimize",
            sampler=self._sampler(),
            load_if_exists=True,
        )
        # a study keeps the parameter encoding it was created with (older ones: indices)
        enc = study.user_attrs.get(ENCODING_ATTR) or self.space.encoding_of(
            study.get_trials(deepcopy=False)
        )
        if enc is not None and enc != self.space.encoding:
            self.space = self.space.with_encoding(enc)
            study.sampler = self._sampler()
        if ENCODING_ATTR not in study.user_attrs:
            study.set_user_attr(ENCODING_ATTR, self.space.encoding)
        heuristic = self.tunable.heuristic(self.problem, self.target)
        if "op" not in study.user_attrs:
            attrs = {
                "op": self.key.op,
                "target": self.key.target,
                "bucket": self.key.bucket,
                "dtype": self.key.dtype,
                "measurer": self.key.measurer,
                "kernel_hash": self.key.kernel_hash,
                "lnc": self.tunable.lnc,
                "rank": self.options.rank,
                "problem": self.tunable.describe(self.problem),
                "search_problem": self.tunable.describe(self.search_problem),
                "space": self.space.describe(),
                "space_size": self.space.size,
                "heuristic": heuristic.key(),
            }
            for k, v in attrs.items():
                study.set_user_attr(k, v)
        if self.options.enqueue_default and not study.get_trials(deepcopy=False):
            study.enqueue_trial(self.space.encode(heuristic), skip_if_exists=True)
        self._study = study
        return study

    # ----------------------------------------------------------------- bookkeeping
    def records(self) -> list[TrialRecord]:
        """Every trial of the study (finished ones are parsed once and cached)."""
        out = []
        for t in self.study().get_trials(deepcopy=False):
            rec = self._done.get(t.number)
            if rec is None:
                rec = record_of(t)
                if t.state.is_finished():
                    self._done[t.number] = rec
            out.append(rec)
        return out

    def report(self) -> StudyReport:
        """Counts, the best trial (outcome ok, lowest latency -- or slow end of the band
        under the pessimistic ranking) and the heuristic's trial."""
        study = self.study()
        verdicts = self.verdicts()
        recs = tuple(self._with_verdict(r, verdicts.get(r.number)) for r in self.records())
        rank = self.options.rank
        ok = [r for r in recs if r.outcome == OK and r.evaluated and r.rank_ns(rank) is not None]
        best = min(ok, key=lambda r: (r.rank_ns(rank), r.number), default=None)
        hkey = study.user_attrs.get("heuristic")
        heur = next((r for r in recs if r.evaluated and r.key == hkey), None)
        return StudyReport(self.key.name, self.space.size, recs, best, heur)

    def verdicts(self) -> dict[int, dict[str, Any]]:
        """Gate verdicts given after trials finished: trial number -> {"ok", "reason"}."""
        out = {}
        for k, v in self.study().user_attrs.items():
            if k.startswith(GATE_VERDICT) and isinstance(v, dict):
                out[int(k[len(GATE_VERDICT) :])] = v
        return out

    @staticmethod
    def _with_verdict(r: TrialRecord, verdict: dict[str, Any] | None) -> TrialRecord:
        if verdict is None or r.outcome != OK:
            return r
        if verdict.get("ok"):
            return dataclasses.replace(r, gate="passed")
        return dataclasses.replace(
            r, outcome=REJECTED, rule="gate", reason=str(verdict.get("reason", ""))
        )

    def record_verdict(self, number: int, ok: bool, reason: str = "") -> None:
        """Store a gate verdict for finished trial `number` (see the module docstring)."""
        self.study().set_user_attr(f"{GATE_VERDICT}{number}", {"ok": ok, "reason": reason})

    def regate(self, limit: int | None = None) -> list[tuple[TrialRecord, bool, str]]:
        """Gate the study's unchecked ok configs, fastest first, until one passes (or
        `limit` checks); store each verdict. Returns (record, ok, reason) per check."""
        gate = self.gate or CorrectnessGate()
        out: list[tuple[TrialRecord, bool, str]] = []
        while limit is None or len(out) < limit:
            best = self.report().best
            if best is None or best.gate == "passed" or best.config is None:
                break
            trial = self.study().get_trials(deepcopy=False)[best.number]
            config = self.space.decode(trial.params)
            try:
                res = gate.check(self.tunable, self.problem, config, self.target)
                ok, reason = (
                    res.ok,
                    ("" if res.ok else f"wrong output on {res.problem}: {res.reason}"),
                )
            except (InvalidConfig, NkiValidationError) as e:
                ok, reason = False, f"gate: {e}"
            self.record_verdict(best.number, ok, reason)
            out.append((best, ok, reason))
        return out

    def drop_claims(self) -> int:
        """Delete this study's claim studies whose owner trial has finished; return how many."""
        study = self.study()
        prefix = study.study_name + CLAIM_SEP
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        n = 0
        for summary in self.storage.get_all_studies():
            if not summary.study_name.startswith(prefix):
                continue
            owner = trials.get(summary.user_attrs.get("trial", -1))
            if owner is None or not owner.state.is_finished():
                continue
            with contextlib.suppress(KeyError):
                self.storage.delete_study(summary._study_id)
                n += 1
        return n

    def _final_trial_with(self, key: str) -> FrozenTrial | None:
        for t in self.study().get_trials(deepcopy=False):
            if (
                t.state.is_finished()
                and t.user_attrs.get("config") == key
                and result_of(t).get("outcome") in FINAL_OUTCOMES
            ):
                return t
        return None

    def _stale(self, t: FrozenTrial) -> bool:
        worker = t.user_attrs.get("worker")
        if not isinstance(worker, dict):
            # attributes follow a trial's creation within milliseconds: none after
            # ORPHAN_AFTER_S (or the user's shorter stale_after_s) means its worker died
            # between creating it and starting work
            start = t.datetime_start.timestamp() if t.datetime_start else time.time()
            return time.time() - start > min(ORPHAN_AFTER_S, self.options.stale_after_s)
        host, _, pid = str(worker.get("id", "")).rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid)):
            return True
        return time.time() - float(worker.get("started", 0.0)) > self.options.stale_after_s

    def _abandon(self, t: FrozenTrial) -> None:
        try:
            self.storage.set_trial_user_attr(t._trial_id, RESULT, {"outcome": ABANDONED})
            self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except (UpdateFinishedTrialError, RuntimeError):
            pass

    def _abandon_running(self, trial: optuna.Trial) -> None:
        with contextlib.suppress(Exception):
            t = self.storage.get_trial(trial._trial_id)
            if t.state == TrialState.RUNNING:
                self._abandon(t)

    def reap_stale(self) -> int:
        """Mark RUNNING trials whose worker died as FAIL (abandoned); return how many."""
        n = 0
        for t in self.study().get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if self._stale(t):
                self._abandon(t)
                n += 1
        return n

    def _claim(self, key: str, number: int) -> FrozenTrial | None:
        """Claim `key` for trial `number`; None if claimed, else the owner (or a running one)."""
        study = self.study()
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        for attempt in range(1000):
            name = f"{study.study_name}{CLAIM_SEP}{digest}.{attempt}"
            # an interrupt between creating the claim and naming its owner would leave a
            # claim nobody can drop: hold Ctrl-C / SIGTERM across both writes
            with signals_deferred():
                try:
                    with _quiet_optuna():
                        sid = self.storage.create_new_study([StudyDirection.MINIMIZE], name)
                except DuplicatedStudyError:
                    sid = -1
                else:
                    self.storage.set_study_user_attr(sid, "trial", number)
            if sid != -1:
                return None
            sid = self.storage.get_study_id_from_name(name)
            owner_number = self.storage.get_study_user_attrs(sid).get("trial")
            if owner_number is None:  # the winner has not written its trial number yet
                return _RUNNING_STANDIN
            tid = self.storage.get_trial_id_from_study_id_trial_number(
                study._study_id, owner_number
            )
            owner = self.storage.get_trial(tid)
            if owner.state == TrialState.RUNNING and self._stale(owner):
                self._abandon(owner)
                owner = self.storage.get_trial(tid)
            if owner.state == TrialState.FAIL and result_of(owner).get("outcome") != ERROR:
                continue  # the owner died or deferred: the next attempt is free to take
            return owner
        raise RuntimeError(f"could not claim config {key} after 1000 attempts")

    # ----------------------------------------------------------------- one trial
    def _finish(
        self, trial: optuna.Trial, outcome: str, latency: float | None = None, **attrs: Any
    ) -> TrialRecord:
        study = self.study()
        result = {"outcome": outcome, "latency_ns": latency, **attrs}
        trial.set_user_attr(RESULT, {k: v for k, v in result.items() if v is not None})
        if outcome == OK:
            sets = attrs.get("set_ns")
            pessimistic = self.options.rank == "pessimistic" and sets
            study.tell(trial, max(sets) if sets and pessimistic else latency)
        elif outcome in (INVALID, REJECTED):
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, state=TrialState.FAIL)
        return record_of(study._storage.get_trial(trial._trial_id))

    def _copy(self, trial: optuna.Trial, src: FrozenTrial) -> TrialRecord:
        r = result_of(src)
        copied = {k: v for k, v in r.items() if k not in ("outcome", "latency_ns")}
        copied["duplicate_of"] = r.get("duplicate_of", src.number)
        return self._finish(trial, r["outcome"], r.get("latency_ns"), **copied)

    def _best_latency(self) -> float | None:
        """The best trial's ranking figure (`TrialRecord.rank_ns`)."""
        best = self.report().best
        return best.rank_ns(self.options.rank) if best else None

    def evaluate(self, trial: optuna.Trial) -> TrialRecord:
        """Run one asked trial to completion (see the module docstring)."""
        config = self.space.suggest(trial)
        key = config.key()
        trial.set_user_attr("worker", {"id": _worker_id(), "started": time.time()})
        trial.set_user_attr("config", key)
        prior = self._final_trial_with(key)
        if prior is not None:
            return self._copy(trial, prior)
        owner = self._claim(key, trial.number)
        if owner is not None:
            if owner.state.is_finished() and result_of(owner).get("outcome") in FINAL_OUTCOMES:
                return self._copy(trial, owner)
            dup = owner.number if owner.number >= 0 else None
            return self._finish(trial, BUSY, duplicate_of=dup)
        return self._measure(trial, config)

    def _measure(self, trial: optuna.Trial, config: KernelConfig) -> TrialRecord:
        try:
            config.validate(self.problem, self.target)
        except InvalidConfig as e:
            return self._finish(trial, INVALID, rule="validate", reason=e.reason)
        try:
            m = self.measurer.measure(self.tunable, self.search_problem, config, self.target)
        except InvalidConfig as e:
            return self._finish(trial, INVALID, rule="validate", reason=e.reason)
        except NkiValidationError as e:
            return self._finish(trial, INVALID, rule=e.rule, reason=str(e))
        except Exception as e:
            return self._finish(trial, ERROR, reason=f"measure: {type(e).__name__}: {e}")
        gate_state = "off"
        band = {"set_ns": list(m.set_ns)} if m.set_ns else {}
        if self.gate is not None and self.options.gate != "off":
            best = self._best_latency() if self.options.gate == "improving" else None
            mine = max(m.set_ns) if m.set_ns and self.options.rank == "pessimistic" else None
            if best is not None and (m.latency_ns if mine is None else mine) > best:
                gate_state = "skipped"
            else:
                try:
                    res = self.gate.check(self.tunable, self.problem, config, self.target)
                except InvalidConfig as e:
                    return self._finish(trial, INVALID, rule="gate:validate", reason=e.reason)
                except NkiValidationError as e:
                    return self._finish(trial, INVALID, rule=f"gate:{e.rule}", reason=str(e))
                except Exception as e:
                    return self._finish(trial, ERROR, reason=f"gate: {type(e).__name__}: {e}")
                if not res.ok:
                    return self._finish(
                        trial, REJECTED, m.latency_ns, rule="gate", label=m.label,
                        reason=f"wrong output on {res.problem}: {res.reason}", **band,
                    )  # fmt: skip
                gate_state = "passed"
        return self._finish(trial, OK, m.latency_ns, gate=gate_state, label=m.label, **band)

    # ----------------------------------------------------------------- the loop
    def run(
        self,
        n_trials: int | None = None,
        timeout: float | None = None,
        on_trial: Callable[[TrialRecord, Tuner], None] | None = None,
    ) -> StudyReport:
        """Evaluate configs until the study holds `n_trials` distinct finished configs
        (default: the whole space), the space is exhausted, or `timeout` seconds pass."""
        study = self.study()
        self.reap_stale()
        budget = self.space.size if n_trials is None else min(n_trials, self.space.size)
        deadline = None if timeout is None else time.monotonic() + timeout
        dups = 0
        while self.report().distinct_done < budget:
            if deadline is not None and time.monotonic() >= deadline:
                break
            if dups >= self.options.dup_patience:
                self._enqueue_unseen()
                dups = 0
            trial = None
            try:
                with signals_deferred():
                    trial = study.ask()
                with alarm(deadline):
                    rec = self.evaluate(trial)
            except TrialTimeout:
                if trial is not None:
                    self._abandon_running(trial)
                break
            except UpdateFinishedTrialError:
                # a storage without atomic row locks handed this trial to another worker
                # too, and that worker finished it first: it is theirs, take the next one
                dups += 1
                continue
            except BaseException:
                # Ctrl-C, SIGTERM (lifecycle.Terminated), a storage failure: the trial
                # must not stay RUNNING
                if trial is not None:
                    self._abandon_running(trial)
                raise
            dups = dups + 1 if not rec.evaluated else 0
            if on_trial is not None:
                on_trial(rec, self)
        return self.report()

    def _enqueue_unseen(self) -> None:
        """Queue a random config no trial has finished, so a converged sampler still
        makes progress towards the budget."""
        seen = {r.key for r in self.records() if r.evaluated}
        unseen = [c for c in self.space.configs() if c.key() not in seen]
        if unseen:
            self.study().enqueue_trial(self.space.encode(self._rng.choice(unseen)))


# A stand-in owner for a claim whose winner has not recorded its trial number yet.
_RUNNING_STANDIN = FrozenTrial(
    number=-1,
    state=TrialState.RUNNING,
    value=None,
    datetime_start=None,
    datetime_complete=None,
    params={},
    distributions={},
    user_attrs={},
    system_attrs={},
    intermediate_values={},
    trial_id=-1,
)


__all__ = [
    "ABANDONED", "BUSY", "CLAIM_SEP", "ENCODING_ATTR", "ERROR", "FINAL_OUTCOMES",
    "GATE_MODES", "GATE_VERDICT", "INVALID", "OK", "ORPHAN_AFTER_S", "RANKS", "REJECTED",
    "RESULT", "STRATEGIES", "StudyKey", "StudyReport", "TrialRecord", "TrialTimeout",
    "TuneOptions", "Tuner", "record_of", "result_of",
]  # fmt: skip
