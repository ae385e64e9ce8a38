"""Scales refused by name before anything is written: an fp8 cache's k_scale / v_scale
(0, negative, NaN, Inf, below fp32's smallest normal) would store NaN / Inf in the
persistent cache, and a softmax_scale (alone or times k_scale) under the masking limit
would give masked keys weight."""

from __future__ import annotations

import re

import pytest
import torch
from _steps import make_step, same_bits

from nki_kernels.ops.serving import kv_cache_write, serving_attention
from nki_kernels.serving import functional

FP8 = torch.float8_e4m3fn
BAD = [0.0, -0.5, float("nan"), float("inf"), 1e-39]
BAD_IDS = ["zero", "negative", "nan", "inf", "subnormal"]


def _scale(bad: float, per_head: bool) -> torch.Tensor:
    return torch.tensor([0.02, bad]) if per_head else torch.tensor(bad)  # hkv = 2


@pytest.mark.parametrize("per_head", [False, True], ids=["tensor", "head"])
@pytest.mark.parametrize("bad", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("arg", ["k_scale", "v_scale"])
def test_bad_kv_scale_refused_cache_untouched(arg: str, bad: float, per_head: bool) -> None:
    step = make_step([(5, 3), (0, 2)], cache_dtype=FP8)
    k0, v0 = step.k_cache.clone(), step.v_cache.clone()
    scales = {"k_scale": torch.tensor(0.02), "v_scale": torch.tensor(0.03)}
    scales[arg] = _scale(bad, per_head)
    match = rf"{arg}: expected finite values >= 1\.17549e-38 .* got {re.escape(f'{bad:g}')} at"
    with pytest.raises(ValueError, match=match):
        kv_cache_write(step.k, step.v, step.k_cache, step.v_cache, step.slot_mapping, **scales)
    with pytest.raises(ValueError, match=match):
        serving_attention(
            step.q, step.k_cache, step.v_cache, step.block_table, step.cached_seq_len,
            step.query_start_loc, k=step.k, v=step.v, slot_mapping=step.slot_mapping, **scales,
        )  # fmt: skip
    assert same_bits(step.k_cache, k0) and same_bits(step.v_cache, v0)


def test_functional_api_refuses_bad_scales() -> None:
    step = make_step([(5, 3)], cache_dtype=FP8, layout="hnd", pad_tokens=0)
    k0 = step.k_cache.clone()
    with pytest.raises(ValueError, match="k_scale: expected finite values"):
        functional.write_kv_cache(
            step.k.transpose(0, 1), step.v.transpose(0, 1), step.k_cache, step.v_cache,
            step.slot_mapping, 16, k_scale=torch.tensor(0.0), v_scale=torch.tensor(0.1),
        )  # fmt: skip
    assert same_bits(step.k_cache, k0)
    with pytest.raises(ValueError, match="v_scale: expected finite values"):
        functional.segmented_attention(
            step.q.transpose(0, 1), step.k_cache, step.v_cache, step.block_table,
            step.cached_seq_len, 16, k_scale=torch.tensor(0.1),
            v_scale=torch.tensor(float("nan")),
        )  # fmt: skip


@pytest.mark.parametrize("scale", [1e-39, 1e-31], ids=["1e-39", "1e-31"])
def test_softmax_scale_below_masking_limit_refused(scale: float) -> None:
    step = make_step([(5, 3), (0, 2)])
    match = r"softmax_scale: expected a number >= 1e-30 \(masking limit\); got "
    with pytest.raises(ValueError, match=match):
        serving_attention(
            step.q, step.k_cache, step.v_cache, step.block_table, step.cached_seq_len,
            step.query_start_loc, k=step.k, v=step.v, slot_mapping=step.slot_mapping,
            softmax_scale=scale,
        )  # fmt: skip


def test_effective_scale_below_masking_limit_refused() -> None:
    """softmax_scale and k_scale each fine, their product (the kernel's score scale) not."""
    step = make_step([(5, 3), (0, 2)], cache_dtype=FP8)
    match = r"softmax_scale: expected softmax_scale \* min\(k_scale\) >= 1e-30 .* = 1e-32"
    with pytest.raises(ValueError, match=match):
        serving_attention(
            step.q, step.k_cache, step.v_cache, step.block_table, step.cached_seq_len,
            step.query_start_loc, k_scale=torch.tensor([1.0, 1e-12]),
            v_scale=torch.tensor(1.0), softmax_scale=1e-20,
        )  # fmt: skip


def test_bad_scale_refused_under_compile_fullgraph() -> None:
    """The value check runs in the op's body, not its fake: fullgraph tracing succeeds
    and the compiled call refuses the scale by name when it runs."""
    step = make_step([(5, 3), (0, 2)], cache_dtype=FP8)

    def fn(q, kc, vc, table, ctx, qsl, ks, vs):  # type: ignore[no-untyped-def]
        return serving_attention(q, kc, vc, table, ctx, qsl, k_scale=ks, v_scale=vs) * 2.0

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    args = (step.q, step.k_cache, step.v_cache, step.block_table, step.cached_seq_len,
            step.query_start_loc)  # fmt: skip
    out = compiled(*args, torch.tensor(0.02), torch.tensor(0.03))
    assert out.shape == step.q.shape
    with pytest.raises(ValueError, match="v_scale: expected finite values"):
        compiled(*args, torch.tensor(0.02), torch.tensor(-1.0))
