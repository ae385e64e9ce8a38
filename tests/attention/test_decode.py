"""Decode attention (torch.ops.nki.decode_attention) against float64 references in the
two callers' conventions: Hugging Face's decode step (contiguous per-layer cache
[B, Hkv, S, D], new tokens last, SDPA) and vLLM's paged cache ([num_blocks, block_size,
Hkv, D] + block table + seq_lens)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _helpers import LSE_ATOL, TOLERANCES, assert_rel_close

from nki_kernels.attention.decode import decode_attention_fwd
from nki_kernels.attention.decode_host import DecodeConfig, decode, decode_bounds, paged_slots
from nki_kernels.interp import TensorSpec, run
from nki_kernels.ops.decode import decode_attention

B, HQ, HKV, D = 3, 8, 2, 64


def _rand(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _reference(q, k, v, lens):  # type: ignore[no-untyped-def]
    """float64 out, lse per sequence: keys [0, len), query i sees keys <= len - Sq + i."""
    b, hq, sq, d = q.shape
    outs, lses = [], []
    for i in range(b):
        n = int(lens[i])
        kk = k[i, :, :n].double().repeat_interleave(hq // k.shape[1], 0)
        vv = v[i, :, :n].double().repeat_interleave(hq // k.shape[1], 0)
        s = q[i].double() @ kk.transpose(-1, -2) / math.sqrt(d)
        allowed = torch.arange(n)[None, :] <= n - sq + torch.arange(sq)[:, None]
        s = s.masked_fill(~allowed, -math.inf)
        lse = torch.logsumexp(s, -1)
        p = torch.exp(s - lse[..., None]).nan_to_num(0.0)
        outs.append(p @ vv)
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sq", [1, 4])
def test_hf_decode_step_matches_sdpa(sq: int, dtype: torch.dtype) -> None:
    """HF's sdpa decode step: the layer's cache holds every key (the new ones last)."""
    s = 300
    q = _rand(2, HQ, sq, D, seed=0, dtype=dtype)
    k, v = _rand(2, HKV, s, D, seed=1, dtype=dtype), _rand(2, HKV, s, D, seed=2, dtype=dtype)
    out = decode_attention(q, k, v, torch.tensor([s, s]))
    mask = None
    if sq > 1:  # HF's causal mask for the new tokens (bottom-right)
        mask = torch.arange(s)[None, :] <= s - sq + torch.arange(sq)[:, None]
    ref = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=mask, enable_gqa=True
    )
    assert_rel_close(out, ref, TOLERANCES[dtype][0], "out")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sq", [1, 4])
def test_contiguous_cache_ragged_lengths(sq: int, dtype: torch.dtype) -> None:
    s_max = 700  # not a multiple of the key step: a ragged last step
    q = _rand(B, HQ, sq, D, seed=3, dtype=dtype)
    k, v = (
        _rand(B, HKV, s_max, D, seed=4, dtype=dtype),
        _rand(B, HKV, s_max, D, seed=5, dtype=dtype),
    )
    lens = torch.tensor([700, 2, 333])  # 2 < Sq = 4: the first queries see nothing
    out, lse = decode_attention(q, k, v, lens, return_lse=True)
    ref, ref_lse = _reference(q, k, v, lens)
    assert_rel_close(out, ref, TOLERANCES[dtype][0], "out")
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], atol=LSE_ATOL, rtol=1e-5)
    if sq == 4:
        assert (out[1, :, :2] == 0).all() and torch.isneginf(lse[1, :, :2]).all()


def _paged(dtype: torch.dtype, lens: list[int], block_size: int = 16, seed: int = 0):  # type: ignore[no-untyped-def]
    """A vLLM-style pool, block table (random, disjoint blocks) and the same keys laid
    out contiguously for the reference."""
    max_blocks = -(-max(lens) // block_size) + 1
    n_blocks = len(lens) * max_blocks + 3
    pool_k = _rand(n_blocks, block_size, HKV, D, seed=seed, dtype=dtype)
    pool_v = _rand(n_blocks, block_size, HKV, D, seed=seed + 1, dtype=dtype)
    perm = torch.randperm(n_blocks, generator=torch.Generator().manual_seed(seed))
    table = perm[: len(lens) * max_blocks].view(len(lens), max_blocks).to(torch.int32)
    k = pool_k[table.long()].reshape(len(lens), -1, HKV, D).permute(0, 2, 1, 3)
    v = pool_v[table.long()].reshape(len(lens), -1, HKV, D).permute(0, 2, 1, 3)
    return pool_k, pool_v, table, k, v


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("sq", [1, 4])
def test_vllm_paged_cache(sq: int, dtype: torch.dtype) -> None:
    lens = [600, 1, 129] if sq == 1 else [600, 4, 129]
    pool_k, pool_v, table, k, v = _paged(dtype, lens)
    q = _rand(len(lens), HQ, sq, D, seed=7, dtype=dtype)
    out = decode_attention(q, pool_k, pool_v, torch.tensor(lens), block_table=table)
    ref, _ = _reference(q, k, v, torch.tensor(lens))
    assert_rel_close(out, ref, TOLERANCES[dtype][0], "out")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_per_program_kernel_gathers_a_two_byte_paged_cache(dtype: torch.dtype) -> None:
    """The per-program kernel (an explicit DecodeConfig) transposes 2-byte paged rows by
    indirect DMA: its row indices are uint32, as NKI's indirect transpose requires."""
    lens = [600, 1, 129]
    pool_k, pool_v, table, k, v = _paged(dtype, lens)
    q = _rand(len(lens), HQ, 1, D, seed=7, dtype=dtype)
    out, _ = decode(q, pool_k, pool_v, torch.tensor(lens), table, None, DecodeConfig(128, 1))
    ref, _ = _reference(q, k, v, torch.tensor(lens))
    assert_rel_close(out, ref, TOLERANCES[dtype][0], "out")


@pytest.mark.parametrize("kv_tile,splits", [(128, 1), (128, 3), (256, 4), (512, 2)])
def test_split_k_configs_agree(kv_tile: int, splits: int) -> None:
    q = _rand(2, HQ, 2, D, seed=8, dtype=torch.float32)
    k, v = (
        _rand(2, HKV, 900, D, seed=9, dtype=torch.float32),
        _rand(2, HKV, 900, D, seed=10, dtype=torch.float32),
    )
    lens = torch.tensor([900, 517])
    out, _ = decode(q, k, v, lens, None, None, DecodeConfig(kv_tile, splits))
    ref, _ = _reference(q, k, v, lens)
    assert_rel_close(out, ref, TOLERANCES[torch.float32][0], "out")


def test_gqa_packing_loads_each_kv_head_once_per_step() -> None:
    """One K and one V load per (batch, kv head, step): the group's 4 query heads x 2
    new queries share them as one 8-row tile."""
    b, hkv, sq, steps, kv_tile = 2, 2, 2, 3, 512
    q = TensorSpec((b, 4 * hkv, sq, D), "bfloat16")
    kv = TensorSpec((b, hkv, steps * kv_tile, D), "bfloat16")
    bnd = TensorSpec((b, 128, 2), "float32")
    args = (q, kv, kv, None, bnd, 0.125, steps, kv_tile, 2)
    trace = run(decode_attention_fwd, *args, trace_only=True).trace
    step_loads = [i for i in trace if i.hbm_read == kv_tile * D * 2]  # bf16 K or V rows
    assert len(step_loads) == 2 * b * hkv * steps
    scores = [i for i in trace if i.opcode == "nc_matmul" and i.n == kv_tile]
    assert len(scores) == b * hkv * steps and all(i.attrs["M"] == 4 * sq for i in scores)


def test_bounds_are_causal_among_new_tokens() -> None:
    bnd = decode_bounds(np.array([10, 2]), group=2, sq=3)
    np.testing.assert_array_equal(bnd[0, :6, 1], [8, 9, 10, 8, 9, 10])
    np.testing.assert_array_equal(bnd[1, :6, 1], [0, 1, 2, 0, 1, 2])


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_head_major_paged_cache_on_devices_and_under_compile(
    device: str, request: pytest.FixtureRequest
) -> None:
    """The head-major block layout through the op's kv_layout argument, eager and under
    torch.compile(fullgraph=True), on CPU and the emulated neuron device."""
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    lens = torch.tensor([200, 21])
    q = _rand(2, HQ, 2, D, seed=61, dtype=torch.bfloat16)
    k, v = (
        _rand(2, HKV, 200, D, seed=62, dtype=torch.bfloat16),
        _rand(2, HKV, 200, D, seed=63, dtype=torch.bfloat16),
    )
    pk, pv, table = _pool_from(k, v, 32, True, seed=64)
    ref, _ = _reference(q, k, v, lens)

    def step(q, pk, pv, lens, table):  # type: ignore[no-untyped-def]
        return decode_attention(q, pk, pv, lens, block_table=table, kv_layout="head_major")

    args = [t.to(device) for t in (q, pk, pv, lens, table)]
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
        out = fn(*args)
        assert out.device.type == args[0].device.type
        assert_rel_close(out.cpu(), ref, TOLERANCES[torch.bfloat16][0], "head_major")


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_decode_on_devices_and_under_compile(device: str, request: pytest.FixtureRequest) -> None:
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    lens = [300, 17]
    pool_k, pool_v, table, k, v = _paged(torch.bfloat16, lens, seed=4)
    q = _rand(2, HQ, 1, D, seed=11, dtype=torch.bfloat16)

    def step(q, pk, pv, lens, table):  # type: ignore[no-untyped-def]
        return decode_attention(q, pk, pv, lens, block_table=table)

    args = [t.to(device) for t in (q, pool_k, pool_v, torch.tensor(lens), table)]
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
        out = fn(*args)
        assert out.device.type == args[0].device.type
        ref, _ = _reference(q, k, v, torch.tensor(lens))
        assert_rel_close(out, ref, TOLERANCES[torch.bfloat16][0], "out")


def test_bad_input_names_the_argument_and_no_backward() -> None:
    q = torch.randn(1, 4, 1, 64)
    kc = torch.randn(1, 2, 50, 64)
    with pytest.raises(ValueError, match=r"cache_lens: expected values in \[0, 50\]"):
        decode_attention(q, kc, kc, torch.tensor([51]))
    with pytest.raises(ValueError, match="k_cache: expected a number of KV heads"):
        decode_attention(q, torch.randn(1, 3, 50, 64), torch.randn(1, 3, 50, 64), torch.tensor([5]))
    with pytest.raises(ValueError, match=r"q: expected \(Hq / Hkv\) \* Sq <= 128"):
        decode_attention(torch.randn(1, 128, 4, 64), kc, kc, torch.tensor([5]))
    with pytest.raises(ValueError, match="block_table: expected shape"):
        decode_attention(
            q,
            torch.randn(4, 16, 2, 64),
            torch.randn(4, 16, 2, 64),
            torch.tensor([5]),
            block_table=torch.zeros(2, 3, dtype=torch.int32),
        )
    with pytest.raises(TypeError, match="return_lse: expected a bool; got int"):
        decode_attention(q, kc, kc, torch.tensor([5]), return_lse=1)
    qg = q.clone().requires_grad_()
    out = decode_attention(qg, kc, kc, torch.tensor([50]))
    with pytest.raises(RuntimeError):
        out.sum().backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("d", [192, 256])
def test_large_head_dim_contiguous_and_paged(d: int, dtype: torch.dtype) -> None:
    lens = [600, 5]
    g = torch.Generator().manual_seed(d)
    q = torch.randn(2, HQ, 2, d, generator=g).to(dtype)
    k, v = (torch.randn(2, HKV, 640, d, generator=g).to(dtype) for _ in range(2))
    out = decode_attention(q, k, v, torch.tensor(lens))
    ref, _ = _reference(q, k, v, torch.tensor(lens))
    assert_rel_close(out, ref, TOLERANCES[dtype][0], "contiguous")
    bs = 16  # sequence b's keys are blocks 40 b .. 40 b + 39 of the pool
    pool_k = k.permute(0, 2, 1, 3).reshape(2 * 640 // bs, bs, HKV, d)
    pool_v = v.permute(0, 2, 1, 3).reshape(2 * 640 // bs, bs, HKV, d)
    table = torch.arange(2 * 640 // bs, dtype=torch.int32).view(2, -1)
    out = decode_attention(q, pool_k, pool_v, torch.tensor(lens), block_table=table)
    assert_rel_close(out, ref, TOLERANCES[dtype][0], "paged")


def test_decode_config_heuristic_space_and_validity() -> None:
    from nki_kernels.attention.decode_host import DecodeProblem
    from nki_kernels.kernel_config import InvalidConfig
    from nki_kernels.targets import get_target

    tgt = get_target("trn2")
    for keys, kv_tile in ((1, 128), (100, 128), (200, 256), (512, 512), (40000, 512)):
        prob = DecodeProblem(2, 32, 8, 1, keys, 128, "bfloat16")
        cfg = DecodeConfig.heuristic(prob, tgt)
        cfg.validate(prob, tgt)
        assert cfg.kv_tile == kv_tile  # the smallest step holding the keys, at most 512
    prob = DecodeProblem(1, 8, 2, 4, 2048, 64, "float32", layout="paged")
    space = list(DecodeConfig.space(prob, tgt))
    assert len(space) == 3 * 4 and all(c.is_valid(prob, tgt) for c in space)
    with pytest.raises(InvalidConfig, match="kv_tile: expected one of"):
        DecodeConfig(kv_tile=1024).validate(prob, tgt)
    with pytest.raises(InvalidConfig, match=r"splits: expected 1\.\.8"):
        DecodeConfig(splits=9).validate(prob, tgt)
    wide = DecodeProblem(1, 64, 1, 4, 2048, 64, "float32")
    with pytest.raises(InvalidConfig, match="256 packed rows exceed 128"):
        DecodeConfig().validate(wide, tgt)
    with pytest.raises(dataclasses.FrozenInstanceError):
        DecodeConfig().splits = 3  # type: ignore[misc]


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_lnc2_programs_split_the_sequences_and_match_lnc1(paged: bool) -> None:
    """kernel[2]: the (sequence, KV head) items are shared by the two programs (an odd
    count here, so one program takes more), and the outputs equal the LNC 1 launch's."""
    hkv, sq, kv_tile, steps = 1, 2, 128, 3
    lens = np.array([300, 5, 384])
    q = _rand(3, 4 * hkv, sq, D, seed=11, dtype=torch.float32).numpy()
    bounds = decode_bounds(lens, 4, sq)
    if paged:
        block, slots_per_seq = 16, steps * kv_tile
        n_blocks = 3 * slots_per_seq // block
        k = _rand(n_blocks, block, hkv, D, seed=12, dtype=torch.float32).numpy()
        v = _rand(n_blocks, block, hkv, D, seed=13, dtype=torch.float32).numpy()
        perm = np.random.default_rng(0).permutation(n_blocks).reshape(3, -1)
        slots = paged_slots(perm, lens, block, slots_per_seq)
    else:
        k = _rand(3, hkv, steps * kv_tile, D, seed=12, dtype=torch.float32).numpy()
        v = _rand(3, hkv, steps * kv_tile, D, seed=13, dtype=torch.float32).numpy()
        slots = None
    args = (q, k, v, slots, bounds, 0.125, steps, kv_tile, 1)
    one = run(decode_attention_fwd, *args, lnc=1)
    two = run(decode_attention_fwd, *args, lnc=2)
    for a, b in zip(one.outputs, two.outputs, strict=True):
        np.testing.assert_array_equal(a, b)
    per_program = [
        sum(1 for i in two.trace if i.program == p and i.opcode == "nc_matmul") for p in (0, 1)
    ]
    assert per_program[0] > 0 and per_program[1] > 0, per_program


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_contiguous_decode_sq4_on_devices_and_under_compile(
    device: str, request: pytest.FixtureRequest
) -> None:
    """The other half of the decode matrix under compile: contiguous cache, Sq = 4,
    ragged lengths (one below Sq), GQA 8 : 2."""
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    lens = torch.tensor([260, 3])
    q = _rand(2, HQ, 4, D, seed=12, dtype=torch.bfloat16)
    k = _rand(2, HKV, 260, D, seed=13, dtype=torch.bfloat16)
    v = _rand(2, HKV, 260, D, seed=14, dtype=torch.bfloat16)
    ref, _ = _reference(q, k, v, lens)

    def step(q, k, v, lens):  # type: ignore[no-untyped-def]
        return decode_attention(q, k, v, lens)

    args = [t.to(device) for t in (q, k, v, lens)]
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
        out = fn(*args)
        assert out.device.type == args[0].device.type
        assert_rel_close(out, ref, TOLERANCES[torch.bfloat16][0], "out")
        assert (out[1, :, :1].cpu() == 0).all()  # query 0 of the 3-key sequence sees none


def test_split_k_combines_on_chip() -> None:
    """The split accumulators are merged in SBUF: a launch with 4 splits writes exactly
    what a 1-split launch writes to HBM (out and lse), no per-split partial results."""
    b, hkv, sq, steps, kv_tile = 2, 2, 1, 8, 128
    q = TensorSpec((b, 4 * hkv, sq, D), "bfloat16")
    kv = TensorSpec((b, hkv, steps * kv_tile, D), "bfloat16")
    bnd = TensorSpec((b, 128, 2), "float32")
    written = []
    for splits in (1, 4):
        args = (q, kv, kv, None, bnd, 0.125, steps, kv_tile, splits)
        trace = run(decode_attention_fwd, *args, trace_only=True).trace
        written.append(sum(i.hbm_write for i in trace))
    assert written[0] == written[1] > 0, written


def test_non_finite_cache_rows_past_the_lengths() -> None:
    """Masked positions never contribute, whatever they hold: NaN / Inf in K and V rows
    past a sequence's length (contiguous; a ragged batch and a single sequence), in a
    paged cache's blocks past a length, in the unreferenced pool block 0 and in the rows
    of a partially filled last block. Selected away, never multiplied by 0."""
    q = _rand(2, 4, 1, 32, seed=1, dtype=torch.float32)
    kc, vc = (_rand(2, 2, 300, 32, seed=s, dtype=torch.float32) for s in (2, 3))
    lens = torch.tensor([37, 300])
    want = decode_attention(q, kc, vc, lens)
    for val in (math.nan, math.inf):
        bad_k, bad_v = kc.clone(), vc.clone()
        bad_k[0, :, 37:], bad_v[0, :, 37:] = val, val
        assert torch.equal(decode_attention(q, bad_k, bad_v, lens), want)
    one = torch.tensor([37])
    want1 = decode_attention(q[:1], kc[:1], vc[:1], one)
    bad_v = vc[:1].clone()
    bad_v[:, :, 37:] = math.nan
    assert torch.equal(decode_attention(q[:1], kc[:1], bad_v, one), want1)
    pool = _rand(40, 16, 2, 32, seed=4, dtype=torch.float32)
    table = torch.arange(1, 41, dtype=torch.int32).remainder(40).reshape(2, 20)  # 0 unused
    table[1, -1] = 39
    want = decode_attention(q, pool, pool, lens, block_table=table)
    bad = pool.clone()
    bad[0] = math.nan  # the pool's block 0: no sequence references it
    bad[4:21] = math.nan  # sequence 0's blocks past its 37 keys (it uses blocks 1..3)
    bad[3, 5:] = math.inf  # rows 37.. of its partially filled last block
    assert torch.equal(decode_attention(q, bad, bad, lens, block_table=table), want)


def test_cache_allocated_with_torch_empty_is_safe() -> None:
    """A cache from torch.empty filled only up to each sequence's length (the rest NaN
    here, as uninitialized memory may be) gives the reference, contiguous and paged,
    also for a sequence shorter than one 16-key piece and an empty one."""
    lens = [300, 9, 0, 130]
    q = _rand(4, HQ, 1, D, seed=21, dtype=torch.bfloat16)
    k = torch.full((4, HKV, 320, D), math.nan, dtype=torch.bfloat16)
    v = torch.full((4, HKV, 320, D), math.nan, dtype=torch.bfloat16)
    src_k, src_v = (_rand(4, HKV, 320, D, seed=s, dtype=torch.bfloat16) for s in (22, 23))
    for b, n in enumerate(lens):
        k[b, :, :n], v[b, :, :n] = src_k[b, :, :n], src_v[b, :, :n]
    out = decode_attention(q, k, v, torch.tensor(lens))
    ref, _ = _reference(q, src_k, src_v, torch.tensor(lens))
    assert torch.isfinite(out).all()
    assert_rel_close(out, ref, TOLERANCES[torch.bfloat16][0], "contiguous")
    assert (out[2] == 0).all()
    pool_k, pool_v, table, kk, vv = _paged(torch.bfloat16, lens, seed=24)
    ek, ev = torch.full_like(pool_k, math.nan), torch.full_like(pool_v, math.nan)
    for b, n in enumerate(lens):
        for j in range(-(-n // 16)):
            blk, m = int(table[b, j]), min(16, n - 16 * j)
            ek[blk, :m], ev[blk, :m] = pool_k[blk, :m], pool_v[blk, :m]
    out = decode_attention(q, ek, ev, torch.tensor(lens), block_table=table)
    ref, _ = _reference(q, kk, vv, torch.tensor(lens))
    assert torch.isfinite(out).all()
    assert_rel_close(out, ref, TOLERANCES[torch.bfloat16][0], "paged")


def _pool_from(k: torch.Tensor, v: torch.Tensor, bs: int, head_major: bool, seed: int):  # type: ignore[no-untyped-def]
    """A paged pool holding contiguous caches k, v [B, Hkv, S, D] in shuffled blocks of
    `bs` keys (vLLM's [blocks, bs, Hkv, D] or head-major [blocks, Hkv, bs, D]), the
    pool's unused blocks NaN, and the block table."""
    b, hkv, s, d = k.shape
    per = -(-s // bs)
    n = b * per + 2
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: b * per]
    table = perm.view(b, per).to(torch.int32)
    pools = []
    for src in (k, v):
        pad = torch.zeros(b, hkv, per * bs, d, dtype=src.dtype)
        pad[:, :, :s] = src
        blocks = pad.view(b, hkv, per, bs, d).permute(0, 2, 1, 3, 4)  # [B, per, Hkv, bs, D]
        if not head_major:
            blocks = blocks.transpose(2, 3)  # [B, per, bs, Hkv, D]
        pool = torch.full((n, *blocks.shape[2:]), math.nan, dtype=src.dtype)
        pool[table.long().view(-1)] = blocks.reshape(b * per, *blocks.shape[2:])
        pools.append(pool)
    return pools[0], pools[1], table


@pytest.mark.parametrize("bs", [16, 32, 64, 128])
@pytest.mark.parametrize("head_major", [False, True], ids=["vllm", "head_major"])
def test_paged_block_sizes_and_layouts(bs: int, head_major: bool) -> None:
    """Block sizes 16 / 32 / 64 / 128 in both block layouts, ragged lengths (a partial
    last block, a sequence shorter than one piece, an empty one), fp16."""
    lens = [300, 7, 0, 129]
    dt = torch.float16
    q = _rand(4, HQ, 1, D, seed=bs, dtype=dt)
    k, v = (
        _rand(4, HKV, 300, D, seed=bs + 1, dtype=dt),
        _rand(4, HKV, 300, D, seed=bs + 2, dtype=dt),
    )
    pk, pv, table = _pool_from(k, v, bs, head_major, seed=bs)
    layout = "head_major" if head_major else "vllm"
    out = decode_attention(q, pk, pv, torch.tensor(lens), block_table=table, kv_layout=layout)
    ref, _ = _reference(q, k, v, torch.tensor(lens))
    assert_rel_close(out, ref, TOLERANCES[dt][0], f"bs={bs} {layout}")
    assert (out[2] == 0).all()


@pytest.mark.parametrize("sq", [1, 16])
def test_gqa_8_to_1_and_sixteen_new_queries(sq: int) -> None:
    """GQA 8 : 1 (16 query heads over 2 KV heads) and Sq = 16 new queries (causal among
    them; the first ones of the short sequence see no key)."""
    lens = torch.tensor([400, 10])
    q = _rand(2, 16, sq, D, seed=31, dtype=torch.bfloat16)
    k, v = (
        _rand(2, 2, 400, D, seed=32, dtype=torch.bfloat16),
        _rand(2, 2, 400, D, seed=33, dtype=torch.bfloat16),
    )
    out, lse = decode_attention(q, k, v, lens, return_lse=True)
    ref, ref_lse = _reference(q, k, v, lens)
    assert_rel_close(out, ref, TOLERANCES[torch.bfloat16][0], "out")
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], atol=LSE_ATOL, rtol=1e-5)


def test_lnc2_splits_a_single_sequence_and_merges_exactly() -> None:
    """At LNC 2 a batch of one sequence splits its keys between the two programs (two
    (out, lse) partials merged by log-sum-exp on the host): the reference, and the LNC 1
    result to fp32 rounding; a batch of several sequences shares its tiles out."""
    from nki_kernels.runtime.lnc import set_runtime_lnc

    q = _rand(1, HQ, 2, D, seed=41, dtype=torch.float32)
    k, v = (
        _rand(1, HKV, 5000, D, seed=42, dtype=torch.float32),
        _rand(1, HKV, 5000, D, seed=43, dtype=torch.float32),
    )
    lens = torch.tensor([4999])
    one, lse1 = decode_attention(q, k, v, lens, return_lse=True)
    set_runtime_lnc(2)
    try:
        two, lse2 = decode_attention(q, k, v, lens, return_lse=True)
        qb = _rand(3, HQ, 1, D, seed=44, dtype=torch.float32)
        kb = _rand(3, HKV, 300, D, seed=45, dtype=torch.float32)
        lb = torch.tensor([300, 17, 0])
        many = decode_attention(qb, kb, kb, lb)
    finally:
        set_runtime_lnc(None)
    ref, _ = _reference(q, k, v, lens)
    assert_rel_close(two, ref, TOLERANCES[torch.float32][0], "lnc2")
    torch.testing.assert_close(two, one, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(lse2, lse1, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(many, decode_attention(qb, kb, kb, lb), atol=0, rtol=0)


@pytest.mark.parametrize("piece,ring", [(4, 2), (8, 3), (16, 3)])
def test_stream_configs_agree(piece: int, ring: int) -> None:
    """Every StreamConfig gives the reference: many one-slab items (deeper rings hold
    more items' Q^T / bounds in flight), a multi-slab one and a partial piece."""
    from nki_kernels.attention.decode_host import StreamConfig

    lens = torch.tensor([1100, 3, 40, 77, 600, 1])
    q = _rand(6, 32, 1, 32, seed=51, dtype=torch.bfloat16)  # 32 columns a sequence: one per tile
    k, v = (
        _rand(6, 8, 1100, 32, seed=52, dtype=torch.bfloat16),
        _rand(6, 8, 1100, 32, seed=53, dtype=torch.bfloat16),
    )
    out, _ = decode(q, k, v, lens, None, None, StreamConfig(piece, ring))
    ref, _ = _reference(q, k, v, lens)
    assert_rel_close(out, ref, TOLERANCES[torch.bfloat16][0], f"piece={piece} ring={ring}")


def test_kv_layout_is_checked() -> None:
    q, pool = torch.randn(1, 4, 1, 32), torch.randn(4, 16, 2, 32)
    table = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv_layout: expected one of \('vllm', 'head_major'\)"):
        decode_attention(q, pool, pool, torch.tensor([5]), block_table=table, kv_layout="nhd")
    with pytest.raises(ValueError, match=r"KV heads dividing q's 4 \(k_cache \[num_blocks, Hkv, b"):
        decode_attention(
            q, pool, pool, torch.tensor([5]), block_table=table, kv_layout="head_major"
        )


def test_stream_plan_indices_fit_the_indirect_transpose_limits():
    # nki.isa.dma_transpose, "DMA Indirect Transpose Constraints": "indices.dtype is
    # np.uint32"; "src.shape[0] must be divisible by 16" (the tail of 4-key pieces too)
    from nki_kernels.attention.decode_plan import NO_ROW, plan_decode

    lens = np.array([3, 70])  # 3 < C: one key per tail row
    plan = plan_decode(lens, 8, 2, 1, "contiguous", (2, 2, 80, 64), d=64, piece=4)
    assert plan.piece == 4 and plan.tail
    assert plan.idx.dtype == np.uint32 and plan.tail_idx.dtype == np.uint32
    assert plan.tail_idx.shape[1] == 16 and plan.tail_kpos.shape[1] == 16
    assert (plan.tail_idx[:, plan.piece :] == NO_ROW).all()


def test_default_decode_call_uses_the_shipped_configs_without_warnings() -> None:
    """The shipped configs match the current kernel source: every entry is used as
    tuned, and a default call of a shipped shape looks up a tuned / nearest entry, with no
    StaleConfigWarning or ConfigFallbackWarning (a fresh store, so no earlier warn-once
    hides one)."""
    import warnings

    from nki_kernels.attention.decode_host import DecodeProblem, StreamConfig
    from nki_kernels.attention.decode_stream import decode_stream_fwd
    from nki_kernels.runtime import config_store as cs
    from nki_kernels.runtime.config_keys import parse_key
    from nki_kernels.runtime.config_records import ConfigDecision
    from nki_kernels.runtime.kernel_cache import kernel_source_hash

    store = cs.ConfigStore([cs.SHIPPED_DIR], None)
    h = kernel_source_hash(decode_stream_fwd)
    seen: list[ConfigDecision] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for target in ("trn2", "trn3"):
            for key, _entry, _file in store.entries("decode_attention", target):
                fields = parse_key(key)
                lnc = int(fields.pop("lnc", 1))
                problem = DecodeProblem(**fields)  # type: ignore[arg-type]
                d = store.decide("decode_attention", target, problem, config_cls=StreamConfig,
                                 kernel_hash=h, lnc=lnc)  # fmt: skip
                seen.append(d)
        with cs.recording_decisions() as calls:
            # a shipped shape (Llama-3 8B heads, bf16), a short cache: the nearest bucket
            q = _rand(1, 32, 1, 128, seed=61, dtype=torch.bfloat16)
            k = _rand(1, 8, 200, 128, seed=62, dtype=torch.bfloat16)
            decode_attention(q, k, k, torch.tensor([200]))
    bad = [w for w in caught if issubclass(w.category, (cs.StaleConfigWarning,
                                                         cs.ConfigFallbackWarning))]  # fmt: skip
    assert not bad, [str(w.message) for w in bad]
    # trn2 and trn3 x LNC 1 and 2 x contiguous and paged x 2 shapes x 3 buckets
    assert len(seen) >= 48 and all(d.source == cs.TUNED for d in seen)
    assert {(d.lnc, "layout=paged" in (d.entry_key or "")) for d in seen} == {
        (1, False),
        (1, True),
        (2, False),
        (2, True),
    }
    assert calls and all(d.source in (cs.TUNED, cs.NEAREST) for d in calls)


def test_per_program_config_on_a_head_major_cache_names_the_layout() -> None:
    from nki_kernels.attention.decode_host import DecodeConfig

    q, pool = torch.randn(1, 4, 1, 32), torch.randn(4, 2, 16, 32)
    table = torch.zeros(1, 2, dtype=torch.int32)
    cfg = DecodeConfig(kv_tile=512, splits=1)
    with pytest.raises(ValueError, match=r"kv_layout 'vllm' only; got kv_layout 'head_major'"):
        decode(q, pool, pool, torch.tensor([5]), table, None, cfg, "head_major")
