"""torch.ops.nki.flash_attention against the fp32 reference: forward, lse and backward.

Odd lengths (1, 77, 1000, 2049), Sq != Sk both ways, GQA 4:1 and 8:1, MQA, causal,
sliding window, kv_lens, packed segments, D = 64 / 80 / 96 / 128, three dtypes; eager on
CPU here (devices and torch.compile in test_flash_devices.py).
"""

from __future__ import annotations

import pytest
import torch
from _helpers import (
    TOLERANCES,
    assert_lse_close,
    assert_rel_close,
    make_inputs,
    reference_grads,
)

from nki_kernels.ops.attention import flash_attention

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)


def _run(b, hq, hkv, sq, sk, d, dtype, seed=0, **kw):  # type: ignore[no-untyped-def]
    q, k, v = make_inputs(b, hq, hkv, sq, sk, d, dtype, seed)
    out, lse = flash_attention(q, k, v, return_lse=True, **kw)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    out.backward(g)
    ref_out, ref_lse, ref_grads = reference_grads(q, k, v, g, **kw)
    tol_out, tol_grad = TOLERANCES[dtype]
    assert out.shape == (b, hq, sq, d) and out.dtype == dtype and lse.dtype == torch.float32
    assert_rel_close(out, ref_out, tol_out, "out")
    assert_lse_close(lse, ref_lse)
    for name, got, ref in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref_grads):
        assert got is not None and got.dtype == dtype
        assert_rel_close(got, ref, tol_grad, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
def test_dtypes_causal_and_not(dtype: torch.dtype, causal: bool) -> None:
    _run(1, 2, 1, 77, 77, 64, dtype, causal=causal)


@pytest.mark.parametrize(
    "sq,sk",
    [(1, 1), (1, 77), (77, 1000), (1000, 77), (1000, 1000)],
    ids=lambda x: str(x),
)
def test_odd_lengths_and_sq_ne_sk(sq: int, sk: int) -> None:
    _run(1, 1, 1, sq, sk, 64, torch.bfloat16, causal=True)


def test_long_odd_length_2049() -> None:
    _run(1, 1, 1, 2049, 2049, 64, torch.bfloat16, causal=True)


@pytest.mark.parametrize("hq,hkv", [(4, 1), (8, 1), (8, 2)], ids=["mqa-4", "mqa-8", "gqa-4:1"])
def test_gqa_and_mqa(hq: int, hkv: int) -> None:
    _run(1, hq, hkv, 130, 200, 64, torch.bfloat16, causal=True)


def test_gqa_8to1_non_causal() -> None:
    _run(2, 8, 1, 64, 300, 64, torch.bfloat16)


@pytest.mark.parametrize("d", [64, 80, 96, 128])
def test_head_dims(d: int) -> None:
    _run(1, 2, 2, 150, 150, d, torch.bfloat16, causal=d % 64 == 0)


@pytest.mark.parametrize("window", [1, 33, 200])
def test_sliding_window(window: int) -> None:
    _run(1, 2, 1, 300, 300, 64, torch.bfloat16, sliding_window=window)


def test_kv_lens_including_an_empty_sequence() -> None:
    _run(3, 2, 1, 200, 200, 64, torch.bfloat16, kv_lens=torch.tensor([200, 57, 0]))


def test_packed_segments_with_causal() -> None:
    seg = torch.tensor([[0] * 40 + [1] * 100 + [2] * 60, [9] * 130 + [4] * 70])
    _run(2, 2, 1, 200, 200, 64, torch.bfloat16, causal=True, segment_ids=seg)


def test_packed_segments_without_causal_and_with_kv_lens() -> None:
    seg = torch.tensor([[0] * 128 + [1] * 72, [2] * 10 + [3] * 190])
    _run(2, 1, 1, 200, 200, 64, torch.float32, segment_ids=seg, kv_lens=torch.tensor([150, 200]))


def test_rows_without_keys_give_zero_and_minus_inf() -> None:
    # bottom-right causal with Sq > Sk: the first Sq - Sk rows have no allowed key
    q, k, v = make_inputs(1, 1, 1, 300, 100, 64, torch.float32)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    assert torch.equal(out[0, 0, :200], torch.zeros(200, 64))
    assert torch.isneginf(lse[0, 0, :200]).all() and torch.isfinite(lse[0, 0, 200:]).all()


def test_lse_gradient_is_exact() -> None:
    q, k, v = make_inputs(1, 2, 1, 90, 140, 64, torch.float32)
    out, lse = flash_attention(q, k, v, causal=True, return_lse=True)
    (out.sum() + 0.5 * lse.sum()).backward()
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    from nki_kernels.attention.reference import attention_reference

    ro, rl = attention_reference(qf, kf, vf, causal=True)
    (ro.sum() + 0.5 * rl.sum()).backward()
    for got, ref, name in (
        (q.grad, qf.grad, "dq"),
        (k.grad, kf.grad, "dk"),
        (v.grad, vf.grad, "dv"),
    ):
        assert_rel_close(got, ref, TOLERANCES[torch.float32][1], name)  # type: ignore[arg-type]


def test_softmax_scale_above_one() -> None:
    _run(1, 1, 1, 100, 100, 64, torch.float32, causal=True, softmax_scale=1.5)


def test_return_lse_false_returns_the_output_only() -> None:
    q, k, v = make_inputs(1, 1, 1, 16, 16, 64, torch.float32)
    out = flash_attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape


def test_key_chunks_merge_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys beyond what one kernel call keeps resident are split and merged by lse; the
    split is forced small here (the real limit is ~46 K bf16 keys on trn2)."""
    import nki_kernels.attention.host as host

    monkeypatch.setattr(host, "max_resident_keys", lambda cfg, p, t: 1024)
    _run(1, 2, 1, 200, 2500, 64, torch.bfloat16, causal=True)
    _run(2, 1, 1, 150, 1500, 64, torch.float32, kv_lens=torch.tensor([1100, 700]))


def test_decode_like_shapes() -> None:
    _run(2, 4, 1, 1, 2049, 64, torch.bfloat16, causal=True)
    _run(1, 2, 2, 3, 700, 64, torch.float16, sliding_window=100)


def test_fp16_packed_segments_and_window() -> None:
    seg = torch.tensor([[0] * 60 + [1] * 140])
    _run(1, 2, 1, 200, 200, 64, torch.float16, segment_ids=seg, sliding_window=50)
