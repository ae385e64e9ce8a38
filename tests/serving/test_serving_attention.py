"""torch.ops.nki.serving_attention: write the new K / V, then attend (one launch), against
the float64 reference; the caches after the op against the reference's bit for bit."""

from __future__ import annotations

import pytest
import torch
from _steps import MIXED, TOLERANCES, assert_rel_close, make_step, same_bits

from nki_kernels.ops.serving import kv_cache_write, serving_attention
from nki_kernels.serving.reference import reference_cache_write, reference_serving_attention


def _run(step, **kw):  # type: ignore[no-untyped-def]
    ref, rk, rv = reference_serving_attention(*step.args(), **kw)
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    out = serving_attention(
        step.q, kc, vc, step.block_table, step.cached_seq_len, step.query_start_loc,
        k=step.k, v=step.v, slot_mapping=step.slot_mapping, **kw,
    )  # fmt: skip
    return out, ref, (kc, vc), (rk, rv)


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_mixed_step_paged(block_size: int, layout: str) -> None:
    """Decode rows, prefix hits + chunked prefill, fresh prefill, speculative drafts and an
    idle sequence in one launch; unused blocks (and slots) hold NaN."""
    step = make_step(MIXED, block_size=block_size, layout=layout, seed=block_size)
    out, ref, (kc, vc), (rk, rv) = _run(step, layout=layout)
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    assert torch.isfinite(out).all()
    assert same_bits(kc, rk) and same_bits(vc, rv)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_mixed_step_half_precision(dtype: torch.dtype) -> None:
    step = make_step(MIXED, dtype=dtype, hq=8, hkv=2, d=64, seed=3)
    out, ref, (kc, vc), (rk, rv) = _run(step)
    assert out.dtype == dtype
    assert_rel_close(out, ref, TOLERANCES[dtype])
    assert same_bits(kc, rk) and same_bits(vc, rv)


@pytest.mark.parametrize("window", [1, 6, 40])
def test_sinks_and_sliding_window(window: int) -> None:
    """GPT-OSS attention: one learnable logit per head joins the denominator; the W most
    recent keys (the query's own included)."""
    step = make_step(MIXED, seed=7)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1)) * 2
    out, ref, (kc, _), (rk, _) = _run(step, sinks=sinks, sliding_window=window)
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    assert same_bits(kc, rk)


def test_sinks_only_rows_and_gqa_heads() -> None:
    """Sinks alone (no window), 8 query heads per KV head, head_dim 80 (not a power of 2)."""
    step = make_step([(5, 3), (0, 1), (130, 4)], hq=8, hkv=1, d=80, block_size=32, seed=11)
    sinks = torch.linspace(-3, 3, 8)
    out, ref, _, _ = _run(step, sinks=sinks, softmax_scale=0.2)
    assert_rel_close(out, ref, TOLERANCES[torch.float32])


def test_attend_only_and_contiguous_cache() -> None:
    """No new rows (the cache already written); a Hugging Face contiguous cache
    [B, Hkv, S_max, D] is the "hnd" layout with one block per sequence."""
    g = torch.Generator().manual_seed(5)
    b, hkv, s_max, d = 3, 2, 50, 32
    kc, vc = torch.randn(b, hkv, s_max, d, generator=g), torch.randn(b, hkv, s_max, d, generator=g)
    lens = [50, 7, 23]
    for i, n in enumerate(lens):
        kc[i, :, n:] = float("nan")
        vc[i, :, n:] = float("nan")
    qlen = torch.tensor([1, 3, 2])
    ctx = torch.tensor(lens) - qlen
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), qlen.cumsum(0)])
    q = torch.randn(6, 4, d, generator=g)
    table = torch.arange(b, dtype=torch.int32).reshape(b, 1)
    before = kc.clone()
    out = serving_attention(q, kc, vc, table, ctx, qsl, layout="hnd")
    ref, _, _ = reference_serving_attention(
        q, None, None, kc, vc, None, table, ctx, qsl, layout="hnd"
    )
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    assert same_bits(kc, before)


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_cache_write_op_bit_exact(layout: str) -> None:
    step = make_step(MIXED, layout=layout, dtype=torch.bfloat16, seed=2)
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    kv_cache_write(step.k, step.v, kc, vc, step.slot_mapping, layout=layout)
    rk, rv = reference_cache_write(step.k, step.v, step.k_cache, step.v_cache,
                                   step.slot_mapping, layout=layout)  # fmt: skip
    assert same_bits(kc, rk) and same_bits(vc, rv)
    assert not same_bits(kc, step.k_cache)  # something was written


def test_padding_tokens_and_empty_rows_are_zero() -> None:
    """Tokens past query_start_loc[-1] return 0; so does a row whose window holds no key
    (impossible causally, so checked through a sequence with no new tokens)."""
    step = make_step([(4, 2), (9, 0)], pad_tokens=3, seed=4)
    out, ref, _, _ = _run(step)
    assert torch.equal(out[2:], torch.zeros_like(out[2:]))
    assert_rel_close(out, ref, TOLERANCES[torch.float32])


@pytest.mark.parametrize(
    ("dtype", "layout", "block_size"),
    [(torch.float32, "nhd", 128), (torch.bfloat16, "hnd", 16), (torch.float32, "hnd", 50)],
    ids=["fp32-nhd-128", "bf16-hnd-16", "fp32-hnd-50"],
)
def test_long_prefix_512_key_steps(dtype: torch.dtype, layout: str, block_size: int) -> None:
    """A 600-key prefix: 512-key steps, the second one ragged, next to short sequences
    whose whole second step is masked (NaN past their lengths). Blocks of a multiple of 4
    keys take the grouped gathers (4 keys per partition; a group straddling a sequence's
    end holds NaN past it); 50-key blocks the per-row gathers."""
    step = make_step([(600, 3), (37, 1), (0, 5)], block_size=block_size, layout=layout,
                     dtype=dtype, seed=17)  # fmt: skip
    out, ref, (kc, vc), (rk, rv) = _run(step, sinks=torch.ones(4), sliding_window=300,
                                        layout=layout)  # fmt: skip
    assert_rel_close(out, ref, TOLERANCES[dtype])
    assert same_bits(kc, rk) and same_bits(vc, rv)
