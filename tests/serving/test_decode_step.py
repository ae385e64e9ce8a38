"""serving_attention's decode-step path (write + the streamed decode body, one launch) for
steps of decode rows and speculative drafts, against the float64 reference; the caches
after the op against the reference's bit for bit; which path a step takes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _steps import MIXED, TOLERANCES, assert_rel_close, make_step, record_launches, same_bits

import nki_kernels.ops.serving as serving_ops
from nki_kernels.attention.decode_host import StreamConfig
from nki_kernels.attention.decode_plan import BIG
from nki_kernels.ops.serving import serving_attention
from nki_kernels.serving.decode_step_host import decode_sequences, decode_step_eligible, plan
from nki_kernels.serving.host import CacheGeometry
from nki_kernels.serving.reference import reference_serving_attention

# decode rows, 2- and 5-token drafts, an idle sequence, a first token (no prefix)
DECODE = [(40, 1), (25, 5), (10, 0), (3, 2), (0, 1)]


@pytest.fixture
def decode_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the op's calls of the decode-step path."""
    calls: list[int] = []
    real = serving_ops.serving_decode

    def spy(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(serving_ops, "serving_decode", spy)
    return calls


def _run(step, **kw):  # type: ignore[no-untyped-def]
    ref, rk, rv = reference_serving_attention(*step.args(), **kw)
    kc, vc = step.k_cache.clone(), step.v_cache.clone()
    out = serving_attention(
        step.q, kc, vc, step.block_table, step.cached_seq_len, step.query_start_loc,
        k=step.k, v=step.v, slot_mapping=step.slot_mapping, **kw,
    )  # fmt: skip
    return out, ref, same_bits(kc, rk) and same_bits(vc, rv)


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_decode_and_draft_step(block_size: int, layout: str, decode_calls: list[int]) -> None:
    """Decode rows and drafts in one launch, unused blocks and slots NaN, pad tokens 0."""
    step = make_step(DECODE, block_size=block_size, layout=layout, seed=block_size + 1)
    out, ref, caches_equal = _run(step, layout=layout)
    assert decode_calls == [1]
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    assert torch.isfinite(out).all() and torch.equal(out[-2:], torch.zeros_like(out[-2:]))
    assert caches_equal


@pytest.mark.parametrize("window", [1, 6, 40])
def test_decode_rows_with_sinks_and_window(window: int, decode_calls: list[int]) -> None:
    """GPT-OSS decode: the window's blocks before its start are cut from the plan, its
    first block's earlier keys masked; the sink folded in through the kernel's lse."""
    step = make_step([(40, 1), (25, 1), (3, 1), (70, 1)], seed=window)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(1)) * 2
    out, ref, caches_equal = _run(step, sinks=sinks, sliding_window=window)
    assert decode_calls == [1]
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    assert caches_equal


def test_drafts_under_a_binding_window_take_the_segmented_body(
    decode_calls: list[int],
) -> None:
    """Drafts whose window starts differ per query (the streamed body bounds keys from
    above only) go to the segmented body, in the same launch as the decode body's
    sequences; a window that does not bind keeps them on the decode body."""
    step = make_step([(40, 4), (2, 3)], seed=5)
    qlen, ctx = np.array([4, 3]), np.array([40, 2])
    assert decode_sequences(qlen, ctx, 2, 6).tolist() == [False, True]
    assert decode_sequences(qlen, ctx, 2, 44).tolist() == [True, True]
    for window in (6, 44):
        out, ref, caches_equal = _run(step, sliding_window=window)
        assert_rel_close(out, ref, TOLERANCES[torch.float32])
        assert caches_equal
    assert decode_calls == [1, 1]


def test_mixed_step_runs_both_bodies_in_one_launch(
    decode_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill chunks next to decode rows and drafts: one launch of the mixed kernel
    (decode body + segmented body), sinks on both parts, NaN in unused blocks."""
    launched = record_launches(monkeypatch)
    step = make_step(MIXED, layout="hnd", block_size=32, seed=6)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(2))
    out, ref, caches_equal = _run(step, sinks=sinks, layout="hnd")
    assert decode_calls == [1] and launched == ["serving_mixed_fwd"]
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    assert caches_equal


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_and_gqa(dtype: torch.dtype, decode_calls: list[int]) -> None:
    """8 query heads per KV head, 4 drafts (32 packed rows, the most), head_dim 80."""
    step = make_step([(30, 4), (5, 1), (130, 3)], hq=8, hkv=1, d=80, dtype=dtype, seed=8)
    out, ref, caches_equal = _run(step, sinks=torch.linspace(-2, 2, 8), softmax_scale=0.2)
    assert decode_calls == [1] and out.dtype == dtype
    assert_rel_close(out, ref, TOLERANCES[dtype])
    assert caches_equal


def test_which_steps_take_the_decode_path() -> None:
    qlen, ctx = np.array([1, 16, 0]), np.array([9, 9, 9])
    assert decode_step_eligible(qlen, ctx, 2, None)  # 32 rows
    assert not decode_step_eligible(np.array([17, 1]), ctx[:2], 1, None)
    assert not decode_step_eligible(qlen, ctx, 3, None)  # 48 rows
    assert decode_step_eligible(qlen[:1], ctx[:1], 4, None)  # 4 rows (any cache dtype)
    assert not decode_step_eligible(np.array([0, 0]), ctx[:2], 4, None)
    assert decode_step_eligible(np.array([1, 1]), ctx[:2], 4, 3)


def test_plan_right_aligns_queries_and_cuts_the_window() -> None:
    """Queries right-aligned (hi = position + 1 per row), idle sequences dropped; with a
    window of 20 at 70 keys (lo = 50), blocks 0-2 of 16 keys are cut and the first kept
    block's keys before 50 carry position BIG."""
    geo = CacheGeometry("nhd", 12, 16, 1, 32)
    table = np.arange(12).reshape(2, 6)
    qsl, ctx = np.array([0, 1, 1]), np.array([69, 5])
    p = plan(qsl, ctx, table, geo, 2, 4, 20, StreamConfig(piece=16, ring=2), 1)
    assert p.seqs.tolist() == [0] and p.tokens.tolist() == [[0]]
    s = p.stream
    assert s.hi[0, :2].tolist() == [70 - 48] * 2  # 22 keys from block 3 on
    live = s.kpos[0, 0, :, 0, :][s.kpos[0, 0, :, 0, :] < BIG]
    tail = s.tail_kpos[0, :, 0][s.tail_kpos[0, :, 0] < BIG]
    assert sorted(np.concatenate([live, tail]).tolist()) == list(range(2, 22))
    q2 = plan(np.array([0, 3, 4]), np.array([4, 9]), table, geo, 2, 4, None,
              StreamConfig(piece=16, ring=2), 1)  # fmt: skip
    assert q2.tokens.tolist() == [[0, 1, 2], [-1, -1, 3]]
    assert q2.stream.hi[0, :6].tolist() == [5, 6, 7, 5, 6, 7]  # 2 heads x 3 rows, seq 0


@pytest.mark.parametrize("seqs", [[(300, 3)], MIXED], ids=["one-sequence", "mixed"])
def test_lnc2_single_sequence_splits_and_merges(seqs: list[tuple[int, int]]) -> None:
    """At LNC 2 one sequence's keys split between the programs, merged by log-sum-exp on
    the host, then the sink folded in; a mixed step shares its decode tiles and
    segmented work units between the programs."""
    from nki_kernels.runtime.lnc import set_runtime_lnc

    step = make_step(seqs, seed=12)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    set_runtime_lnc(2)
    try:
        out, ref, caches_equal = _run(step, sinks=sinks)
    finally:
        set_runtime_lnc(None)
    assert_rel_close(out, ref, TOLERANCES[torch.float32])
    assert caches_equal


def test_contiguous_cache_attend_only(decode_calls: list[int]) -> None:
    """A Hugging Face cache [B, Hkv, S_max, D] ("hnd", one 50-key block per sequence),
    no write, NaN past every length."""
    g = torch.Generator().manual_seed(5)
    b, hkv, s_max, d = 3, 2, 50, 32
    kc, vc = torch.randn(b, hkv, s_max, d, generator=g), torch.randn(b, hkv, s_max, d, generator=g)
    lens = [50, 7, 23]
    for i, n in enumerate(lens):
        kc[i, :, n:], vc[i, :, n:] = float("nan"), float("nan")
    qlen = torch.tensor([1, 3, 2])
    ctx = torch.tensor(lens) - qlen
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), qlen.cumsum(0)])
    q = torch.randn(6, 4, d, generator=g)
    table = torch.arange(b, dtype=torch.int32).reshape(b, 1)
    out = serving_attention(q, kc, vc, table, ctx, qsl, layout="hnd")
    ref, _, _ = reference_serving_attention(q, None, None, kc, vc, None, table, ctx, qsl,
                                            layout="hnd")  # fmt: skip
    assert decode_calls == [1]
    assert_rel_close(out, ref, TOLERANCES[torch.float32])


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_decode_steps_compiled_without_recompiles(
    device: str, request: pytest.FixtureRequest, decode_calls: list[int]
) -> None:
    """Eager, then torch.compile(fullgraph=True), then under fail_on_recompile a step of
    other lengths, drafts and block tables in the same frozen shapes."""
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(3))

    def fn(q, k, v, kc, vc, slots, table, ctx, qsl, snk):  # type: ignore[no-untyped-def]
        out = serving_attention(q, kc, vc, table, ctx, qsl, k=k, v=v, slot_mapping=slots,
                                sinks=snk, max_query_len=5)  # fmt: skip
        return out + 1.0

    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)
    other = [(41, 2), (20, 4), (11, 0), (4, 1), (1, 2)]  # DECODE's frozen shapes
    calls = [(fn, make_step(DECODE, seed=9)), (compiled, make_step(DECODE, seed=9)),
             (compiled, make_step(other, seed=10))]  # fmt: skip
    try:
        for n, (f, step) in enumerate(calls):
            ref, rk, rv = reference_serving_attention(*step.args(), sinks=sinks)
            args = [t.to(device) for t in step.args()]
            if n == 2:
                torch.compiler.set_stance("fail_on_recompile")
            out = f(*args, sinks.to(device))
            assert out.device.type == torch.device(device).type
            assert_rel_close(out.cpu() - 1.0, ref, TOLERANCES[torch.float32])
            assert same_bits(args[3].cpu(), rk) and same_bits(args[4].cpu(), rv)
    finally:
        torch.compiler.set_stance("default")
    assert len(decode_calls) == 3


def test_threads_give_the_serial_result() -> None:
    """Decode-step, mixed and mixed-with-an-fp8-cache launches from 3 threads at once:
    each output and written cache equals the serial call's bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    steps = [make_step(DECODE, seed=21), make_step(MIXED, layout="hnd", seed=22),
             make_step(MIXED, cache_dtype=torch.float8_e4m3fn, seed=23)]  # fmt: skip
    kw = [{}, {"layout": "hnd"}, {"k_scale": torch.tensor(0.05), "v_scale": torch.tensor(0.05)}]

    def call(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        st = steps[n]
        kc, vc = st.k_cache.clone(), st.v_cache.clone()
        out = serving_attention(st.q, kc, vc, st.block_table, st.cached_seq_len,
                                st.query_start_loc, k=st.k, v=st.v,
                                slot_mapping=st.slot_mapping, **kw[n])  # fmt: skip
        return out, kc, vc

    serial = [call(n) for n in range(3)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        threaded = list(pool.map(call, [2, 1, 0]))
    for n, got in zip([2, 1, 0], threaded, strict=True):
        assert all(same_bits(a, b) for a, b in zip(got, serial[n], strict=True))
