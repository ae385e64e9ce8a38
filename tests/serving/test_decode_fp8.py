"""FP8 KV caches on the decode body (`attention/decode_stream_fp8.py`, through
`serving_attention`): decode rows and drafts against the float64 reference and against
the segmented kernel on the same step (e4m3 / e5m2, per-tensor / per-head scales, both
layouts, unused slots NaN), sinks with a sliding window over NaN keys before it, LNC 2,
and which kernel each step launches."""

from __future__ import annotations

import pytest
import torch
from _steps import MIXED, TOLERANCES, assert_rel_close, make_step, nan_before_windows, same_bits

import nki_kernels.ops.serving as serving_ops
import nki_kernels.serving.decode_step_host as dsh
from nki_kernels.ops.serving import serving_attention
from nki_kernels.serving.reference import reference_serving_attention

# decode rows, 2- and 5-token drafts, an idle sequence, a first token (no prefix)
DECODE = [(40, 1), (25, 5), (10, 0), (3, 2), (0, 1)]
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the kernels the decode-step host launches."""
    names: list[str] = []
    real = dsh.launch

    def spy(kernel, *a, **kw):  # type: ignore[no-untyped-def]
        names.append(kernel.__name__)
        return real(kernel, *a, **kw)

    monkeypatch.setattr(dsh, "launch", spy)
    return names


def _scales(per_head: bool) -> dict[str, torch.Tensor]:
    if per_head:  # 2 KV heads
        return {"k_scale": torch.tensor([0.01, 0.03]), "v_scale": torch.tensor([0.02, 0.005])}
    return {"k_scale": torch.tensor(0.02), "v_scale": torch.tensor([0.015])}


def _op(step, segmented: bool = False, **kw):  # type: ignore[no-untyped-def]
    """(out, k_cache, v_cache) of the op on copies of the step's caches; `segmented`
    runs the segmented kernel (the op's path for steps the decode body does not take)."""
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    args = (step.q, step.k, step.v, kc, vc, step.slot_mapping, step.block_table,
            step.cached_seq_len, step.query_start_loc)  # fmt: skip
    if segmented:
        out = serving_ops._serving_attention(
            *args, kw.get("sinks"), kw.get("k_scale"), kw.get("v_scale"),
            kw.get("softmax_scale"), kw.get("sliding_window"), kw.get("layout", "nhd"),
        )  # fmt: skip
    else:
        out = serving_attention(step.q, kc, vc, step.block_table, step.cached_seq_len,
                                step.query_start_loc, k=step.k, v=step.v,
                                slot_mapping=step.slot_mapping, **kw)  # fmt: skip
    return out, kc, vc


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("per_head", [False, True], ids=["tensor", "head"])
@pytest.mark.parametrize("cdt", FP8, ids=["e4m3", "e5m2"])
def test_fp8_decode_body_against_reference_and_segmented(
    cdt: torch.dtype, per_head: bool, qdtype: torch.dtype, layout: str, launched: list[str]
) -> None:
    """Decode rows and drafts over an fp8 cache take the decode body (one launch of
    serving_decode_fwd): within the dtype's tolerance of the float64 reference (which
    attends over the same fp8 values times their scales) and of the segmented kernel on
    the same step; caches written bit for bit as the reference's; NaN in every unused
    slot never reaches the output; pad tokens 0."""
    step = make_step(DECODE, dtype=qdtype, cache_dtype=cdt, layout=layout, seed=31)
    kw = {**_scales(per_head), "layout": layout, "softmax_scale": 0.3}
    ref, rk, rv = reference_serving_attention(*step.args(), **kw)
    out, kc, vc = _op(step, **kw)
    assert launched == ["serving_decode_fwd"]
    assert same_bits(kc, rk) and same_bits(vc, rv)
    assert torch.isfinite(out).all() and torch.equal(out[-2:], torch.zeros_like(out[-2:]))
    assert_rel_close(out, ref, TOLERANCES[qdtype])
    seg, skc, svc = _op(step, segmented=True, **kw)
    assert launched == ["serving_decode_fwd"]  # the segmented run is no decode-step launch
    assert same_bits(skc, kc) and same_bits(svc, vc)
    assert_rel_close(out, seg, TOLERANCES[qdtype])


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("window", [3, 6, 40])
def test_fp8_decode_rows_sinks_window_over_nan(window: int, layout: str) -> None:
    """GPT-OSS decode over an e4m3 cache with per-head scales: sinks and a window, the
    keys before each window NaN (K and V) give the output bit for bit as a finite cache
    does, within tolerance of the reference."""
    kw = {**_scales(True), "layout": layout, "sliding_window": window,
          "sinks": torch.randn(4, generator=torch.Generator().manual_seed(3))}  # fmt: skip
    outs = []
    for nan in (False, True):
        step = make_step([(40, 1), (25, 1), (3, 1), (70, 1)], cache_dtype=torch.float8_e4m3fn,
                         layout=layout, pad_tokens=1, seed=window)  # fmt: skip
        if nan:
            nan_before_windows(step, window, layout)
        else:
            ref, _, _ = reference_serving_attention(*step.args(), **kw)
        outs.append(_op(step, **kw)[0])
    assert bool(torch.isfinite(outs[1]).all()) and same_bits(outs[1], outs[0])
    assert_rel_close(outs[0], ref, TOLERANCES[torch.float32])


def test_fp8_mixed_step_and_lnc2(launched: list[str]) -> None:
    """An fp8 mixed step (decode rows and drafts next to prefill chunks) runs the mixed
    kernel, the segmented body with the step's scales; a single fp8 sequence at LNC 2
    splits its keys between the programs (merged on the host)."""
    from nki_kernels.runtime.lnc import set_runtime_lnc

    kw = {**_scales(True), "layout": "hnd"}
    step = make_step(MIXED, cache_dtype=torch.float8_e5m2, layout="hnd", seed=7)
    ref, rk, rv = reference_serving_attention(*step.args(), **kw)
    out, kc, vc = _op(step, **kw)
    assert launched == ["serving_mixed_fwd"]
    assert same_bits(kc, rk) and same_bits(vc, rv)
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    one = make_step([(300, 3)], cache_dtype=torch.float8_e4m3fn, layout="hnd", seed=8)
    ref, _, _ = reference_serving_attention(*one.args(), **kw, sinks=torch.ones(4))
    set_runtime_lnc(2)
    try:
        out = _op(one, **kw, sinks=torch.ones(4))[0]
    finally:
        set_runtime_lnc(None)
    assert launched[-1] == "serving_decode_fwd"
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
