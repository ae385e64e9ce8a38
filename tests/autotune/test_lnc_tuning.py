"""LNC-2 cost-model tuning: studies priced as launched (`kernel[2]`), keyed and labelled
with the LNC, and found by the op at runtime LNC 2."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import nki_kernels
from nki_kernels.autotune.export import export_best
from nki_kernels.autotune.families import get
from nki_kernels.autotune.measure import CostModelMeasurer
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import TuneOptions, Tuner
from nki_kernels.norm.config import NormProblem
from nki_kernels.runtime import config_store as cs
from nki_kernels.runtime.config_store import DEFAULT, TUNED, ConfigStore
from nki_kernels.runtime.lnc import set_runtime_lnc
from nki_kernels.targets import get_target

TRN2 = get_target("trn2")
PROBLEM = NormProblem(rows=256, hidden=512, dtype="float32", affine="w")


def _tune(lnc: int, store: ConfigStore, storage: Any) -> Any:
    tuner = Tuner(get("rms_norm").tunable(lnc), PROBLEM, TRN2, storage=storage,
                  measurer=CostModelMeasurer(), options=TuneOptions(seed=0))  # fmt: skip
    tuner.run(n_trials=6)
    return tuner, export_best(tuner, store)


def test_lnc2_study_is_priced_at_lnc2_and_exports_lnc2_keys(tmp_path) -> None:
    storage = open_storage("memory")
    store = ConfigStore([tmp_path], tmp_path)
    t2, out2 = _tune(2, store, storage)
    t1, out1 = _tune(1, store, storage)
    # LNC-1 and LNC-2 studies never mix: their names differ, LNC-1 keeps its old name
    assert t2.key.name != t1.key.name and t2.key.measurer.endswith("-lnc2")
    assert "lnc" not in t1.key.measurer
    assert out2.key == "affine=w,dtype=float32,hidden=512,lnc=2,rows=256"
    assert out1.key == "affine=w,dtype=float32,hidden=512,rows=256"
    assert out2.provenance.lnc == 2 and out2.provenance.measurer.endswith(", LNC 2)")
    assert out1.provenance.lnc == 1 and out1.provenance.measurer.endswith(", LNC 1)")
    # the LNC-2 price is the trace of kernel[2]: the rows split over two programs
    cfg = out2.config
    at1 = CostModelMeasurer().measure(get("rms_norm").tunable(1), PROBLEM, cfg, TRN2)
    at2 = CostModelMeasurer().measure(get("rms_norm").tunable(2), PROBLEM, cfg, TRN2)
    assert at2.latency_ns == pytest.approx(out2.provenance.latency_ns)
    assert at2.latency_ns < at1.latency_ns
    trace = get("rms_norm").tunable(2).trace(PROBLEM, cfg, TRN2)
    assert trace.lnc == 2 and {i.program for i in trace.instrs} == {0, 1}


@pytest.mark.parametrize("lnc", [1, 2])
def test_the_op_finds_the_config_tuned_at_its_runtime_lnc(lnc, tmp_path, monkeypatch) -> None:
    """The op at runtime LNC n takes the entry of the LNC-n study, with no fallback
    warning; explain() names the LNC it looked up."""
    monkeypatch.setattr(cs, "_default", None)
    store = cs.set_config_dir(tmp_path)
    _, out = _tune(lnc, store, open_storage("memory"))
    x, w = torch.randn(200, 512), torch.ones(512)
    set_runtime_lnc(lnc)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback, no stale entry
            e = nki_kernels.explain("rms_norm", x, w, 1e-6)
        (d,) = e.decisions
        assert d.source == TUNED and d.lnc == lnc and d.config == out.config
        assert f"at LNC {lnc}," in str(e)
        # the other LNC has no entry of its own: it never takes this one
        set_runtime_lnc(3 - lnc)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (other,) = nki_kernels.explain("rms_norm", x, w, 1e-6).decisions
        assert other.source == DEFAULT and other.lnc == 3 - lnc
    finally:
        set_runtime_lnc(None)


def test_a_family_without_lnc_support_is_refused_at_lnc2() -> None:
    from dataclasses import replace

    spec = replace(get("rms_norm"), make_tunable=lambda: get("rms_norm").make_tunable())
    assert spec.tunable(1).lnc == 1
    with pytest.raises(ValueError, match="LNC 1 only"):
        spec.tunable(2)


def test_tune_defaults_to_the_lnc_the_calls_launch_at(monkeypatch) -> None:
    # one default for every entry point: tune / configs which use the LNC a call of this
    # process launches at (runtime_lnc), so `configs which` names the config a call uses
    import argparse

    from nki_kernels.autotune.cli import tune_lnc
    from nki_kernels.runtime import lnc as rlnc
    from nki_kernels.runtime import neuron_device

    monkeypatch.delenv(rlnc.LNC_ENV_VAR, raising=False)
    set_runtime_lnc(None)
    try:
        for target in ("trn1", "trn2", "trn3"):  # no Neuron device here: LNC 1, as a call
            got = tune_lnc(argparse.Namespace(lnc=None, target=target))
            assert got == rlnc.runtime_lnc(target) == 1
        assert tune_lnc(argparse.Namespace(lnc=2, target="trn2")) == 2
        monkeypatch.setattr(neuron_device, "is_real_neuron", lambda: True)
        assert tune_lnc(argparse.Namespace(lnc=None, target="trn2")) == 2  # trn2's default
        assert tune_lnc(argparse.Namespace(lnc=None, target="trn1")) == 1
        monkeypatch.setenv(rlnc.LNC_ENV_VAR, "1")
        set_runtime_lnc(None)
        assert tune_lnc(argparse.Namespace(lnc=None, target="trn2")) == 1
    finally:
        set_runtime_lnc(None)


def test_tune_summary_says_which_latency_is_the_proxys() -> None:
    # flash_attention's trials price a cheaper proxy problem; the summary says so, so the
    # two latencies printed for one config (proxy, then full problem) are not a puzzle
    from types import SimpleNamespace

    from nki_kernels.autotune.cli import _summary

    best = SimpleNamespace(latency_ns=2000.0, latency_hi_ns=None, label="modeled", config="c")
    heur = SimpleNamespace(latency_ns=3000.0, outcome="ok")
    report = SimpleNamespace(
        name="flash_attention/x", distinct_done=2, space_size=9, duplicates=0, best=best,
        heuristic=heur, count=lambda status: 0,
    )  # fmt: skip
    tunable = SimpleNamespace(describe=lambda p: f"problem {p}")
    tuner = SimpleNamespace(search_problem="S=512", problem="S=8192", tunable=tunable)
    text = _summary(tuner, report)
    assert "trials priced problem S=512: a cheaper proxy" in text
    assert "re-prices both configs on the full problem (problem S=8192)" in text
    assert "tuned x1.500" in text
