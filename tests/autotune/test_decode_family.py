"""The decode-attention tuner family: problems, tuning, export and the op's lookup."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from nki_kernels.attention.decode_host import DecodeConfig, DecodeProblem, StreamConfig
from nki_kernels.autotune.export import export_best
from nki_kernels.autotune.families import get
from nki_kernels.autotune.measure import CostModelMeasurer
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import OK, TuneOptions, Tuner
from nki_kernels.ops.decode import decode_attention
from nki_kernels.runtime import config_store as cs
from nki_kernels.targets import TRN2


def test_model_shape_problem_is_the_ops_lookup_key() -> None:
    spec = get("decode_attention")
    p = spec.make_problem("llama3-8b", 30000, "bfloat16")
    assert p == DecodeProblem(1, 32, 8, 1, 30720, 128, "bfloat16", "contiguous")
    assert spec.make_tunable().proxy(p) == p  # trials price the whole launch
    with pytest.raises(ValueError, match="layout: expected one of"):
        DecodeProblem(1, 8, 2, 1, 64, 64, "bfloat16", "ring")


def test_tuned_decode_config_is_what_the_op_uses(tmp_path: Any, monkeypatch: Any) -> None:
    spec = get("decode_attention")
    tunable = spec.make_tunable()
    problem = DecodeProblem(1, 4, 2, 1, 1024, 64, "float32", "contiguous")
    opts = TuneOptions(seed=0, gate="improving")
    tuner = Tuner(tunable, problem, TRN2, storage=open_storage("memory"),
                  measurer=CostModelMeasurer(), options=opts)  # fmt: skip
    report = tuner.run(n_trials=6)
    assert report.best.outcome == OK
    monkeypatch.setattr(cs, "_default", None)
    store = cs.set_config_dir(tmp_path)
    out = export_best(tuner, store)
    # the export prices the whole launch (every KV head, the bucket's keys)
    assert out.provenance.measurer == "modeled (cost model v3, trn2, LNC 1)"
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 64, generator=g)
    kc, vc = torch.randn(3, 2, 1000, 64, generator=g), torch.randn(3, 2, 1000, 64, generator=g)
    lens = torch.tensor([1000, 700, 5])  # the longest is 1000 keys: the 1024 bucket
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a tuned entry: no fallback, not stale
        with cs.recording_decisions() as seen:
            got = decode_attention(q, kc, vc, lens)
    (d,) = [d for d in seen if d.op == "decode_attention"]
    assert d.source == cs.TUNED and d.config == out.config and isinstance(d.config, StreamConfig)
    ref = decode_attention(q, kc, vc, lens)  # the same call: deterministic
    torch.testing.assert_close(got, ref)
    monkeypatch.setattr(cs, "_default", None)


def test_decode_config_validity_at_the_largest_shapes() -> None:
    from nki_kernels.kernel_config import InvalidConfig

    wide = DecodeProblem(1, 64, 1, 4, 4096, 256, "float32", "paged")
    with pytest.raises(InvalidConfig, match="256 packed rows exceed 128"):
        DecodeConfig().validate(wide, TRN2)
    # 128 packed rows, head_dim 256, fp32: every config of the space fits (dry run)
    ok = DecodeProblem(1, 16, 1, 8, 4096, 256, "float32", "paged")
    space = list(DecodeConfig.space(ok, TRN2))
    assert space and all(c.is_valid(ok, TRN2) for c in space)


def test_stream_config_space_and_validity() -> None:
    from nki_kernels.kernel_config import InvalidConfig

    p = DecodeProblem(1, 32, 8, 1, 32768, 128, "bfloat16", "paged")
    space = list(StreamConfig.space(p, TRN2))
    assert len(space) == 3 * 2 and all(c.is_valid(p, TRN2) for c in space)
    with pytest.raises(InvalidConfig, match="piece: expected one of"):
        StreamConfig(piece=32).validate(p, TRN2)
    with pytest.raises(InvalidConfig, match=r"ring: expected one of \(2, 3\)"):
        StreamConfig(ring=4).validate(p, TRN2)
    wide = DecodeProblem(1, 64, 1, 4, 4096, 256, "float32", "paged")
    with pytest.raises(InvalidConfig, match="256 packed rows exceed 128"):
        StreamConfig().validate(wide, TRN2)


def test_paged_and_lnc2_problems_are_tuned_and_looked_up(tmp_path: Any, monkeypatch: Any) -> None:
    """A shape may name its layout (`llama3-8b,layout=paged`); the LNC-2 tunable prices
    and checks `kernel[2]`; the op looks a paged call up under the paged key at the
    runtime LNC (both paged block layouts share it)."""
    spec = get("decode_attention")
    p = spec.make_problem("llama3-8b,layout=paged", 2048, "bfloat16")
    assert p == DecodeProblem(1, 32, 8, 1, 2048, 128, "bfloat16", "paged")
    with pytest.raises(ValueError, match="layout=L"):
        spec.make_problem("llama3-8b,layout=ring", 2048, "bfloat16")
    tunable = spec.tunable(2)
    assert tunable.lnc == 2
    problem = DecodeProblem(1, 4, 2, 1, 512, 64, "float32", "paged")
    opts = TuneOptions(seed=0, gate="improving")
    tuner = Tuner(tunable, problem, TRN2, storage=open_storage("memory"),
                  measurer=CostModelMeasurer(), options=opts)  # fmt: skip
    report = tuner.run(n_trials=2)
    assert report.best.outcome == OK
    monkeypatch.setattr(cs, "_default", None)
    out = export_best(tuner, cs.set_config_dir(tmp_path))
    assert out.provenance.measurer == "modeled (cost model v3, trn2, LNC 2)"
    from nki_kernels.runtime.lnc import set_runtime_lnc

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 1, 64, generator=g)
    pool = torch.randn(40, 16, 2, 64, generator=g)
    table = torch.randperm(40, generator=g)[:32].view(1, 32).to(torch.int32)
    set_runtime_lnc(2)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the tuned LNC-2 paged entry: no fallback
            with cs.recording_decisions() as seen:
                decode_attention(q, pool, pool, torch.tensor([500]), block_table=table)
    finally:
        set_runtime_lnc(None)
    (d,) = [d for d in seen if d.op == "decode_attention"]
    assert d.source == cs.TUNED and d.config == out.config
    assert d.entry_key is not None and "lnc=2" in d.entry_key and "layout=paged" in d.entry_key
    monkeypatch.setattr(cs, "_default", None)
