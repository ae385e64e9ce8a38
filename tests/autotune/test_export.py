"""Export to the config store: JSON round trip with provenance; stale kernel hash refused."""

from __future__ import annotations

import json
import math
import warnings

import pytest

from nki_kernels.autotune.export import ExportRefused, export_best
from nki_kernels.autotune.gate import CorrectnessGate
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import TuneOptions, Tuner
from nki_kernels.runtime.config_store import (
    ConfigFallbackWarning,
    ConfigStore,
    StaleConfigWarning,
    problem_key,
)
from nki_kernels.targets import TRN2

from .toy import ToyConfig, ToyMeasurer, ToyProblem, make_toy

PROBLEM = ToyProblem(rows=256, cols=8200)


def tuned(gate: str = "always", **kw) -> Tuner:
    tuner = Tuner(
        make_toy(),
        PROBLEM,
        TRN2,
        storage=open_storage("memory"),
        measurer=ToyMeasurer(),
        options=TuneOptions(strategy="grid", gate=gate, **kw),
    )
    tuner.run()
    return tuner


@pytest.fixture(scope="module")
def tuner():
    return tuned()


def test_exported_json_round_trips_with_provenance(tuner, tmp_path):
    store = ConfigStore([tmp_path], tmp_path)
    out = export_best(tuner, store)
    report = tuner.report()
    assert out.path == tmp_path / "trn2" / "toy_scale.json"
    data = json.loads(out.path.read_text())
    entry = data["entries"][problem_key(PROBLEM)]
    assert entry["config"] == report.best.config
    prov = entry["provenance"]
    assert prov["kernel_hash"] == tuner.key.kernel_hash == make_toy().source_hash()
    assert prov["measurer"] == "modeled (toy-price v1, trn2)"
    assert prov["latency_ns"] == report.best.latency_ns
    assert prov["default_latency_ns"] == report.heuristic.latency_ns
    assert prov["trials"] == report.distinct_done == 56
    assert prov["date"][:4].isdigit()
    assert out.speedup == pytest.approx(prov["default_latency_ns"] / prov["latency_ns"])
    assert out.speedup >= 1.0

    fresh = ConfigStore([tmp_path], None)  # a new reader of the same files
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg, got = fresh.lookup(
            "toy_scale", "trn2", PROBLEM, config_cls=ToyConfig, kernel_hash=tuner.key.kernel_hash
        )
    assert cfg == out.config and got == out.provenance


def test_stale_kernel_hash_is_refused_with_a_warning(tuner, tmp_path):
    store = ConfigStore([tmp_path], tmp_path)
    out = export_best(tuner, store)
    with pytest.warns(StaleConfigWarning, match="tuned for kernel source"):
        with pytest.warns(ConfigFallbackWarning):
            cfg, prov = store.lookup(
                "toy_scale", "trn2", PROBLEM, config_cls=ToyConfig, kernel_hash="0" * 16
            )
    assert prov is None
    assert cfg == ToyConfig.heuristic(PROBLEM, TRN2) != out.config


def test_export_merges_buckets_into_one_file(tuner, tmp_path):
    store = ConfigStore([tmp_path], tmp_path)
    export_best(tuner, store)
    small = Tuner(
        make_toy(),
        ToyProblem(rows=128, cols=1000),
        TRN2,
        storage=open_storage("memory"),
        measurer=ToyMeasurer(),
        options=TuneOptions(strategy="grid"),
    )
    small.run()
    export_best(small, store)
    data = json.loads((tmp_path / "trn2" / "toy_scale.json").read_text())
    assert sorted(data["entries"]) == sorted(
        [problem_key(PROBLEM), problem_key(ToyProblem(rows=128, cols=1000))]
    )


def test_ungated_best_is_gated_before_export(tmp_path, monkeypatch):
    # gate off: the fast, wrong skip_tail config wins the study ...
    t = tuned(gate="off")
    assert t.report().best.config["skip_tail"] is True
    # ... export gates it, records the failure and exports the fastest correct config
    out = export_best(t, ConfigStore([tmp_path], tmp_path))
    assert out.config.skip_tail is False
    assert any(not v["ok"] for v in t.verdicts().values())
    # when no config passes, nothing is written
    from nki_kernels.autotune.gate import GateResult

    t2 = tuned(gate="off")
    monkeypatch.setattr(
        CorrectnessGate, "check", lambda *a, **k: GateResult(False, "wrong (test)", 1.0, "p")
    )
    with pytest.raises(ExportRefused, match="no valid, correct config"):
        export_best(t2, ConfigStore([tmp_path / "b"], tmp_path / "b"))
    assert not (tmp_path / "b" / "trn2" / "toy_scale.json").exists()


def test_heuristic_only_study_exports_the_default(tmp_path):
    # a budget of 1 with the heuristic enqueued first measures only the heuristic
    t = Tuner(
        make_toy(),
        PROBLEM,
        TRN2,
        storage=open_storage("memory"),
        measurer=ToyMeasurer(),
        options=TuneOptions(strategy="grid"),
    )
    t.run(n_trials=1)
    out = export_best(t, ConfigStore([tmp_path], tmp_path))
    assert out.config == ToyConfig.heuristic(PROBLEM, TRN2)
    assert out.speedup == pytest.approx(1.0)
    assert not math.isnan(out.provenance.default_latency_ns)


def test_hardware_measured_configs_are_keyed_at_the_runtime_lnc(tuner, tmp_path):
    """A config the hardware measurer timed at LNC 2 is stored under an lnc=2 key; the
    cost model's (one logical core) under the plain LNC-1 key."""
    from nki_kernels.autotune import export
    from nki_kernels.autotune.measure import HardwareMeasurer
    from nki_kernels.runtime import lnc as runtime_lnc

    assert export._measured_lnc(tuner) == 1
    hw = Tuner(make_toy(), PROBLEM, TRN2, storage=open_storage("memory"),
               measurer=HardwareMeasurer(), options=TuneOptions(strategy="grid"))  # fmt: skip
    runtime_lnc.set_runtime_lnc(2)
    try:
        assert export._measured_lnc(hw) == 2
    finally:
        runtime_lnc.set_runtime_lnc(None)
    out = export_best(tuner, ConfigStore([tmp_path], tmp_path))
    assert list(json.loads(out.path.read_text())["entries"]) == [problem_key(PROBLEM)]


def test_hardware_studies_name_the_lnc_and_model_studies_keep_their_names():
    from nki_kernels.autotune.measure import HardwareMeasurer
    from nki_kernels.runtime import lnc as runtime_lnc

    def key(measurer):
        return Tuner(make_toy(), PROBLEM, TRN2, storage=open_storage("memory"),
                     measurer=measurer).key  # fmt: skip

    runtime_lnc.set_runtime_lnc(2)
    try:
        assert key(HardwareMeasurer()).measurer == "hardware-lnc2"
        assert key(ToyMeasurer()).measurer == ToyMeasurer().name
    finally:
        runtime_lnc.set_runtime_lnc(None)
    assert key(HardwareMeasurer()).measurer == "hardware-lnc1"
