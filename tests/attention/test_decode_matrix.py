"""Decode attention's numeric matrix against float64: head_dim 64 / 128 / 256 x fp32 /
bf16 / fp16 x contiguous / paged caches, with ragged lengths (an empty sequence, one
shorter than a piece, a partial last block) and NaN / Inf in every cache row and block no
query may attend; and every Sq from 1 to 16 (causal among the new queries).

Shapes are small (one KV head, a few dozen keys) so the interpreter runs each case in
well under a second; the streamed kernel's tiles, pieces and tail slab are all exercised
at these lengths (a piece is at most 16 keys)."""

from __future__ import annotations

import math

import pytest
import torch
from _helpers import LSE_ATOL, TOLERANCES, assert_rel_close

from nki_kernels.ops.decode import decode_attention

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BLOCK = 16


def _rand(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _reference(q, k, v, lens):  # type: ignore[no-untyped-def]
    """float64 (out, lse): query i of sequence b sees keys j <= len - Sq + i; a query
    that sees none gives out 0, lse -inf."""
    b, hq, sq, d = q.shape
    grp = hq // k.shape[1]
    out = torch.zeros(b, hq, sq, d, dtype=torch.float64)
    lse = torch.full((b, hq, sq), -math.inf, dtype=torch.float64)
    for i in range(b):
        n = int(lens[i])
        if n == 0:
            continue
        kk = k[i, :, :n].double().repeat_interleave(grp, 0)
        vv = v[i, :, :n].double().repeat_interleave(grp, 0)
        s = q[i].double() @ kk.transpose(-1, -2) / math.sqrt(d)
        allowed = torch.arange(n)[None, :] <= n - sq + torch.arange(sq)[:, None]
        s = s.masked_fill(~allowed, -math.inf)
        lse[i] = torch.logsumexp(s, -1)
        out[i] = torch.exp(s - lse[i][..., None]).nan_to_num(0.0) @ vv
    return out, lse


def _poison(x: torch.Tensor, lens: list[int]) -> torch.Tensor:
    """x [B, Hkv, S, D] with every row past each length NaN (even rows) or +-Inf (odd)."""
    y = x.clone()
    for b, n in enumerate(lens):
        for j in range(n, x.shape[2]):
            y[b, :, j] = math.nan if j % 2 == 0 else (math.inf if j % 4 == 1 else -math.inf)
    return y


def _pool(k: torch.Tensor, v: torch.Tensor, lens: list[int], seed: int):  # type: ignore[no-untyped-def]
    """vLLM's pool [blocks, 16, Hkv, D] holding k, v in shuffled blocks, the pool's
    unreferenced blocks and the rows past each length NaN / Inf, and the block table."""
    b, hkv, s, d = k.shape
    per = -(-s // BLOCK)
    n = b * per + 2
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: b * per]
    table = perm.view(b, per).to(torch.int32)
    pools = []
    for src in (_poison(k, lens), _poison(v, lens)):
        pad = torch.full((b, hkv, per * BLOCK, d), math.inf, dtype=src.dtype)
        pad[:, :, :s] = src
        blocks = pad.view(b, hkv, per, BLOCK, d).permute(0, 2, 3, 1, 4)  # [B, per, 16, Hkv, D]
        pool = torch.full((n, BLOCK, hkv, d), math.nan, dtype=src.dtype)
        pool[table.long().view(-1)] = blocks.reshape(b * per, BLOCK, hkv, d)
        pools.append(pool)
    return pools[0], pools[1], table


def _check(out, lse, ref, ref_lse, dtype, what):  # type: ignore[no-untyped-def]
    assert torch.isfinite(out).all(), what
    assert_rel_close(out, ref, TOLERANCES[dtype][0], what)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(fin, torch.isfinite(lse)), what
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], atol=LSE_ATOL, rtol=1e-5)


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("d", [64, 128, 256])
def test_head_dim_dtype_layout_with_poisoned_unused_rows(d: int, dt: str, layout: str) -> None:
    """Lengths 45 (a partial last block and piece), 0 (empty: out 0, lse -inf) and 9
    (shorter than a piece); every unused K / V row and pool block NaN or Inf."""
    dtype = DTYPES[dt]
    lens = [45, 0, 9]
    seed = d + len(dt)
    q = _rand(3, 4, 1, d, seed=seed, dtype=dtype)
    k, v = (_rand(3, 1, 48, d, seed=seed + i, dtype=dtype) for i in (1, 2))
    ref, ref_lse = _reference(q, k, v, lens)
    if layout == "contiguous":
        out, lse = decode_attention(
            q, _poison(k, lens), _poison(v, lens), torch.tensor(lens), return_lse=True
        )
    else:
        pk, pv, table = _pool(k, v, lens, seed)
        out, lse = decode_attention(
            q, pk, pv, torch.tensor(lens), block_table=table, return_lse=True
        )
    _check(out, lse, ref, ref_lse, dtype, f"D={d} {dt} {layout}")
    assert (out[1] == 0).all() and torch.isneginf(lse[1]).all()


@pytest.mark.parametrize("sq", list(range(1, 17)))
def test_every_sq_up_to_16_is_causal_among_the_new_queries(sq: int) -> None:
    """Sq = 1..16 new queries per sequence (GQA 4 : 1, so up to 64 packed rows per KV
    head), query i seeing keys <= len - Sq + i; a sequence shorter than Sq leaves its
    first queries with no key. Odd Sq on a paged cache, even on a contiguous one; the
    unused rows are NaN / Inf."""
    lens = [37, max(0, sq - 3), 20]
    q = _rand(3, 4, sq, 64, seed=100 + sq, dtype=torch.bfloat16)
    k, v = (_rand(3, 1, 40, 64, seed=200 + sq + i, dtype=torch.bfloat16) for i in (0, 1))
    ref, ref_lse = _reference(q, k, v, lens)
    if sq % 2:
        pk, pv, table = _pool(k, v, lens, sq)
        out, lse = decode_attention(
            q, pk, pv, torch.tensor(lens), block_table=table, return_lse=True
        )
    else:
        out, lse = decode_attention(
            q, _poison(k, lens), _poison(v, lens), torch.tensor(lens), return_lse=True
        )
    _check(out, lse, ref, ref_lse, torch.bfloat16, f"Sq={sq}")
    if sq > 3:  # sequence 1 has Sq - 3 keys: its first 3 queries see none
        assert (out[1, :, :3] == 0).all() and torch.isneginf(lse[1, :, :3]).all()


@pytest.mark.parametrize("layout", ["contiguous", "paged"])
@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_poisoned_ragged_batch_on_devices_and_under_compile(
    device: str, layout: str, request: pytest.FixtureRequest
) -> None:
    """The poisoned ragged batch (an empty sequence included, fp16, D = 128, Sq = 2)
    eagerly and under torch.compile(fullgraph=True), on CPU and the emulated neuron
    device."""
    if device == "neuron":
        device = request.getfixturevalue("neuron")
    torch._dynamo.reset()
    lens = [45, 0, 9]
    q = _rand(3, 4, 2, 128, seed=7, dtype=torch.float16)
    k, v = (_rand(3, 1, 48, 128, seed=8 + i, dtype=torch.float16) for i in (0, 1))
    ref, ref_lse = _reference(q, k, v, lens)
    if layout == "contiguous":
        kc, vc, table = _poison(k, lens), _poison(v, lens), None
    else:
        kc, vc, table = _pool(k, v, lens, 9)

    def step(q, kc, vc, lens, table):  # type: ignore[no-untyped-def]
        return decode_attention(q, kc, vc, lens, block_table=table, return_lse=True)

    args = [None if t is None else t.to(device) for t in (q, kc, vc, torch.tensor(lens), table)]
    for fn in (step, torch.compile(step, backend="aot_eager", fullgraph=True)):
        out, lse = fn(*args)
        assert out.device.type == args[0].device.type
        _check(out.cpu(), lse.cpu(), ref, ref_lse, torch.float16, f"{device} {layout}")
