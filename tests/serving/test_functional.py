"""nki_kernels.serving.functional in vLLM-Neuron's conventions (q [Nh, T, Dh], caches
[num_blocks, Hkv, block_size, Dh], prior_tokens [[cached]], sink [Nh, 1], out
[Nh, Dh, T]) against the float64 reference."""

from __future__ import annotations

import pytest
import torch
from _steps import TOLERANCES, assert_rel_close, make_step

import nki_kernels.serving.functional as NF
from nki_kernels.serving.reference import reference_serving_attention


@pytest.mark.parametrize("tp_out", [True, False])
def test_segmented_prefill_chunk(tp_out: bool) -> None:
    """One sequence: a 24-token chunk after 40 cached tokens, written by the model through
    write_kv_cache, then attended (GPT-OSS style: sinks + sliding window)."""
    step = make_step([(40, 24)], layout="hnd", pad_tokens=0, seed=13)
    nh, bs = 4, 16
    sinks = torch.randn(nh, generator=torch.Generator().manual_seed(0))
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    NF.write_kv_cache(step.k.transpose(0, 1), step.v.transpose(0, 1), kc, vc,
                      step.slot_mapping, bs)  # fmt: skip
    out = NF.segmented_attention(
        step.q.transpose(0, 1), k_cache=kc, v_cache=vc, block_tables=step.block_table,
        prior_tokens=step.cached_seq_len.reshape(1, 1).int(), block_size=bs,
        kv_segment_size=512, scale=0.15, sliding_window=17, sink=sinks.unsqueeze(1),
        tp_q=True, tp_out=tp_out,
    )  # fmt: skip
    ref, rk, _ = reference_serving_attention(
        *step.args(), softmax_scale=0.15, sliding_window=17, sinks=sinks, layout="hnd"
    )
    expect = ref.transpose(0, 1)  # [Nh, T, Dh]
    if tp_out:
        expect = expect.transpose(1, 2)
    assert tuple(out.shape) == tuple(expect.shape)
    assert_rel_close(out, expect, TOLERANCES[torch.float32])
    assert torch.equal(kc.isnan(), rk.isnan()) and torch.equal(kc.nan_to_num(), rk.nan_to_num())


def test_functional_errors() -> None:
    step = make_step([(3, 4)], layout="hnd", pad_tokens=0)
    q = step.q.transpose(0, 1)
    with pytest.raises(ValueError, match="block_size: expected 16"):
        NF.segmented_attention(q, step.k_cache, step.v_cache, step.block_table,
                               step.cached_seq_len.reshape(1, 1), 32)  # fmt: skip
    with pytest.raises(ValueError, match="fp8_packed: expected False"):
        NF.segmented_attention(q, step.k_cache, step.v_cache, step.block_table,
                               step.cached_seq_len.reshape(1, 1), 16, fp8_packed=True)  # fmt: skip
