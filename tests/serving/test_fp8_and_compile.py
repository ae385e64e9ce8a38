"""FP8 KV caches (e4m3 / e5m2, per-tensor and per-head scales, saturation), the ops on
the emulated neuron device and under torch.compile, and the named errors."""

from __future__ import annotations

import pytest
import torch
from _steps import MIXED, TOLERANCES, assert_rel_close, make_step, record_launches, same_bits

from nki_kernels.ops.serving import kv_cache_write, serving_attention
from nki_kernels.serving.host import FP8_MAX
from nki_kernels.serving.reference import reference_cache_write, reference_serving_attention

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def _scales(per_head: bool, hkv: int) -> tuple[torch.Tensor, torch.Tensor]:
    if per_head:
        return torch.linspace(0.01, 0.03, hkv), torch.linspace(0.02, 0.005, hkv)
    return torch.tensor(0.02), torch.tensor([0.015])


@pytest.mark.parametrize("qdtype", [torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp32", "bf16", "fp16"])  # fmt: skip
@pytest.mark.parametrize("per_head", [False, True], ids=["tensor", "head"])
@pytest.mark.parametrize("cdt", FP8, ids=["e4m3", "e5m2"])
def test_fp8_cache(
    cdt: torch.dtype, per_head: bool, qdtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written quantized (x / scale, saturated), read back dequantized in the kernel with the
    scales folded into the softmax and the output; the reference attends over the same
    fp8 values times their scales in float64. The step's decode rows and drafts take the
    decode body, its prefill chunks the segmented body: one mixed launch."""
    launched = record_launches(monkeypatch)
    step = make_step(MIXED, dtype=qdtype, cache_dtype=cdt, layout="hnd" if per_head else "nhd",
                     seed=21)  # fmt: skip
    ks, vs = _scales(per_head, 2)
    layout = "hnd" if per_head else "nhd"
    kw = {"k_scale": ks, "v_scale": vs, "layout": layout}
    ref, rk, rv = reference_serving_attention(*step.args(), **kw)
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    out = serving_attention(step.q, kc, vc, step.block_table, step.cached_seq_len,
                            step.query_start_loc, k=step.k, v=step.v,
                            slot_mapping=step.slot_mapping, **kw)  # fmt: skip
    assert launched == ["serving_mixed_fwd"]
    assert same_bits(kc, rk) and same_bits(vc, rv)
    assert_rel_close(out, ref, TOLERANCES[qdtype])


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_fp8_long_prefix_grouped_gathers(layout: str) -> None:
    """fp8 through the grouped (4 keys per partition) gathers of 512-key steps; both
    sequences end inside a group (533 and 11 keys) over NaN slots, which the AND with the
    key mask clears."""
    step = make_step([(530, 3), (9, 2)], cache_dtype=torch.float8_e4m3fn, layout=layout,
                     dtype=torch.bfloat16, seed=5)  # fmt: skip
    ks, vs = _scales(True, 2)
    kw = {"k_scale": ks, "v_scale": vs, "layout": layout}
    ref, rk, rv = reference_serving_attention(*step.args(), **kw)
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    out = serving_attention(step.q, kc, vc, step.block_table, step.cached_seq_len,
                            step.query_start_loc, k=step.k, v=step.v,
                            slot_mapping=step.slot_mapping, **kw)  # fmt: skip
    assert same_bits(kc, rk) and same_bits(vc, rv)
    assert_rel_close(out, ref, TOLERANCES[torch.bfloat16])


@pytest.mark.parametrize("cdt", FP8, ids=["e4m3", "e5m2"])
def test_fp8_saturation_and_nan(cdt: torch.dtype) -> None:
    """Values beyond the format's range saturate to +-max (not inf / NaN); a NaN stays a
    NaN in its own slot only."""
    fmax = FP8_MAX[cdt]
    k = torch.tensor([[[1e9, -1e9, 3.0, float("nan")]], [[fmax * 0.5, -fmax * 4, 0.0, 1.0]]])
    v = -k
    kc = torch.zeros(2, 4, 1, 4, dtype=cdt)
    vc = torch.zeros(2, 4, 1, 4, dtype=cdt)
    slots = torch.tensor([5, 2])
    scale = torch.tensor(0.5)
    kv_cache_write(k, v, kc, vc, slots, k_scale=scale, v_scale=scale)
    rk, rv = reference_cache_write(k, v, torch.zeros_like(kc), torch.zeros_like(vc), slots,
                                   scale, scale)  # fmt: skip
    assert same_bits(kc, rk) and same_bits(vc, rv)
    got = kc.float().reshape(8, 4)
    assert got[5, 0] == fmax and got[5, 1] == -fmax and got[5, 2] == 6.0
    assert torch.isnan(got[5, 3]) and got[2, 1] == -fmax and got[2, 0] == fmax
    assert torch.isfinite(got[[0, 1, 3, 4, 6, 7]]).all()


def test_scale_of_wrong_shape_or_cache_is_named() -> None:
    plain = make_step([(3, 2)])
    with pytest.raises(ValueError, match=r"k_scale: expected None for a torch\.float32 cache"):
        kv_cache_write(plain.k, plain.v, plain.k_cache, plain.v_cache, plain.slot_mapping,
                       k_scale=torch.tensor(1.0))  # fmt: skip
    step = make_step([(3, 2)], cache_dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"k_scale: expected shape \[\] or \[1\]"):
        serving_attention(
            step.q, step.k_cache, step.v_cache, step.block_table, step.cached_seq_len,
            step.query_start_loc, k_scale=torch.ones(3),
        )  # fmt: skip


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_eager_and_compiled_on_devices(device: str, request: pytest.FixtureRequest) -> None:
    """The same step eagerly and under torch.compile(fullgraph=True): the cache writes
    reach the caller's tensors (mutated args), outputs match the float64 reference; then,
    under fail_on_recompile, a step of other lengths and block tables in the same frozen
    shapes runs without a recompile."""
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2))

    def fn(q, k, v, kc, vc, slots, table, ctx, qsl, snk):  # type: ignore[no-untyped-def]
        out = serving_attention(q, kc, vc, table, ctx, qsl, k=k, v=v, slot_mapping=slots,
                                sinks=snk, sliding_window=9)  # fmt: skip
        return out * 2.0

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    other = [(41, 1), (31, 20), (0, 9), (24, 5), (10, 0), (4, 2)]  # MIXED's frozen shapes
    calls = [(fn, make_step(MIXED, seed=9)), (compiled, make_step(MIXED, seed=9)),
             (compiled, make_step(other, seed=10))]  # fmt: skip
    try:
        for n, (f, step) in enumerate(calls):
            ref, rk, _ = reference_serving_attention(*step.args(), sinks=sinks, sliding_window=9)
            args = [t.to(device) for t in step.args()]
            if n == 2:
                torch.compiler.set_stance("fail_on_recompile")
            out = f(*args, sinks.to(device))
            assert out.device.type == torch.device(device).type
            assert_rel_close(out.cpu() / 2.0, ref, TOLERANCES[torch.float32])
            assert same_bits(args[3].cpu(), rk)
    finally:
        torch.compiler.set_stance("default")


def test_named_errors() -> None:
    step = make_step([(20, 3), (4, 1)], pad_tokens=0)
    base = dict(k=step.k, v=step.v, slot_mapping=step.slot_mapping)

    def call(**kw):  # type: ignore[no-untyped-def]
        a = {**base, **kw}
        table = a.pop("block_table", step.block_table)
        return serving_attention(step.q, step.k_cache.clone(), step.v_cache.clone(), table,
                                 step.cached_seq_len, step.query_start_loc, **a)  # fmt: skip

    capacity = step.k_cache.shape[0] * step.k_cache.shape[1]
    bad_slots = step.slot_mapping.clone()
    bad_slots[1] = capacity
    with pytest.raises(ValueError, match=rf"slot_mapping: expected slots in \[0, {capacity}\)"):
        call(slot_mapping=bad_slots)
    table = step.block_table.clone()
    table[0, 1] = step.k_cache.shape[0] + 4
    with pytest.raises(ValueError, match="block_table: expected block ids in"):
        call(block_table=table)
    with pytest.raises(ValueError, match="max_query_len: sequence 0 has 3 query tokens"):
        call(max_query_len=2)
    with pytest.raises(ValueError, match="k: expected"):
        call(k=step.k.to(torch.bfloat16))
    with pytest.raises(ValueError, match="k_cache: expected dtype"):
        serving_attention(step.q, step.k_cache.half(), step.v_cache.half(), step.block_table,
                          step.cached_seq_len, step.query_start_loc)  # fmt: skip
    with pytest.raises(ValueError, match="sinks: expected shape"):
        call(sinks=torch.zeros(3))
    with pytest.raises(
        ValueError, match=r"k, v, slot_mapping: expected all three .*; got only k, v$"
    ):
        call(slot_mapping=None)
    short = step.block_table[:, :1].contiguous()
    with pytest.raises(ValueError, match="cached_seq_len: sequence 0 needs 23 keys"):
        call(block_table=short)


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_fp8_cache_eager_and_compiled_on_devices(
    device: str, request: pytest.FixtureRequest
) -> None:
    """An fp8 e4m3 cache with per-head scales on each device: eager, then compiled
    (fullgraph), then a step of other lengths under fail_on_recompile; the written cache
    bit for bit and the outputs against the float64 reference."""
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    ks, vs = _scales(True, 2)

    def fn(q, k, v, kc, vc, slots, table, ctx, qsl, k_scale, v_scale):  # type: ignore[no-untyped-def]
        return serving_attention(q, kc, vc, table, ctx, qsl, k=k, v=v, slot_mapping=slots,
                                 k_scale=k_scale, v_scale=v_scale, layout="hnd")  # fmt: skip

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    seqs, other = [(30, 1), (9, 6), (0, 3)], [(31, 1), (9, 6), (2, 3)]
    steps = [make_step(s, cache_dtype=torch.float8_e4m3fn, layout="hnd", dtype=torch.bfloat16,
                       seed=n) for n, s in enumerate([seqs, seqs, other])]  # fmt: skip
    try:
        for n, (f, step) in enumerate(zip([fn, compiled, compiled], steps, strict=True)):
            ref, rk, rv = reference_serving_attention(*step.args(), k_scale=ks, v_scale=vs,
                                                      layout="hnd")  # fmt: skip
            args = [t.to(device) for t in step.args()]
            if n == 2:
                torch.compiler.set_stance("fail_on_recompile")
            out = f(*args, ks.to(device), vs.to(device))
            assert out.device.type == torch.device(device).type
            assert same_bits(args[3].cpu(), rk) and same_bits(args[4].cpu(), rv)
            assert_rel_close(out.cpu(), ref, TOLERANCES[torch.bfloat16])
    finally:
        torch.compiler.set_stance("default")
