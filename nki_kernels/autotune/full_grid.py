"""Full-grid mode: price every config of a small space, then gate only the fastest.

For a small space, sampling is dearer than pricing: each sampled trial pays the sampler,
several storage round trips and (with `gate='always'`) a numeric run in the interpreter,
while the cost model prices a config from a trace-only run. `run_full_grid` therefore
measures every config of the space not yet in the study, gates the fastest ones in
order until one passes (or none is left below an already gated best), and writes all
results as finished trials in one pass. The results are the same records `Tuner.run`
writes (outcome, latency, rule, reason, gate), so reports, export and resuming work
unchanged. It is single-process: it takes no claims, so do not run workers beside it.
"""

from __future__ import annotations

import time
from typing import Any

import optuna
from optuna.trial import TrialState

from ..interp.errors import NkiValidationError
from ..kernel_config import InvalidConfig, KernelConfig
from .study import ERROR, INVALID, OK, REJECTED, RESULT, StudyReport, Tuner, _worker_id


def _price(tuner: Tuner, config: KernelConfig) -> dict[str, Any]:
    try:
        config.validate(tuner.problem, tuner.target)
        m = tuner.measurer.measure(tuner.tunable, tuner.search_problem, config, tuner.target)
    except InvalidConfig as e:
        return {"outcome": INVALID, "rule": "validate", "reason": e.reason}
    except NkiValidationError as e:
        return {"outcome": INVALID, "rule": e.rule, "reason": str(e)}
    except Exception as e:
        return {"outcome": ERROR, "reason": f"measure: {type(e).__name__}: {e}"}
    out = {"outcome": OK, "latency_ns": m.latency_ns, "label": m.label}
    if m.set_ns:
        out["set_ns"] = list(m.set_ns)
    return out


def _rank(tuner: Tuner, result: dict[str, Any]) -> float:
    """The figure `tuner` ranks by (`TuneOptions.rank`): latency or the band's slow end."""
    if tuner.options.rank == "pessimistic" and result.get("set_ns"):
        return float(max(result["set_ns"]))
    return float(result["latency_ns"])


def _gate(tuner: Tuner, config: KernelConfig, result: dict[str, Any]) -> None:
    assert tuner.gate is not None
    try:
        res = tuner.gate.check(tuner.tunable, tuner.problem, config, tuner.target)
    except (InvalidConfig, NkiValidationError) as e:
        result.update(outcome=INVALID, rule="gate:validate", reason=str(e))
        return
    if res.ok:
        result["gate"] = "passed"
    else:
        result.update(
            outcome=REJECTED, rule="gate", reason=f"wrong output on {res.problem}: {res.reason}"
        )


def run_full_grid(tuner: Tuner) -> StudyReport:
    """Price the whole space, gate the fastest first, record everything (module doc)."""
    study = tuner.study()
    tuner.reap_stale()
    # the enqueued heuristic default (and any other queued trial) runs the normal way
    while study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        tuner.evaluate(study.ask())
    seen = {r.key for r in tuner.records() if r.evaluated}
    priced: list[tuple[KernelConfig, dict[str, Any]]] = []
    for config in tuner.space.configs():
        if config.key() not in seen:
            priced.append((config, _price(tuner, config)))
    gated_best = tuner.report().best
    passed = gated_best is not None and gated_best.gate == "passed"
    bar = gated_best.rank_ns(tuner.options.rank) if gated_best is not None and passed else None
    ok = sorted((_rank(tuner, r), i) for i, (_, r) in enumerate(priced) if r["outcome"] == OK)
    for latency, i in ok:
        config, result = priced[i]
        if tuner.gate is None or tuner.options.gate == "off":
            result["gate"] = "off"
            continue
        if bar is not None and latency > bar:
            break
        _gate(tuner, config, result)
        if result.get("gate") == "passed":
            break
    worker = {"id": _worker_id(), "started": time.time()}
    dists = tuner.space.distributions()
    for config, result in priced:
        if result["outcome"] == OK:
            result.setdefault("gate", "skipped")
        state = {OK: TrialState.COMPLETE, INVALID: TrialState.PRUNED, REJECTED: TrialState.PRUNED}
        study.add_trial(
            optuna.trial.create_trial(
                state=state.get(result["outcome"], TrialState.FAIL),
                value=_rank(tuner, result) if result["outcome"] == OK else None,
                params=tuner.space.encode(config),
                distributions=dists,
                user_attrs={"worker": worker, "config": config.key(), RESULT: result},
            )
        )
    return tuner.report()


__all__ = ["run_full_grid"]
