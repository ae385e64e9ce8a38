"""Random scheduler steps for the serving tests: sequences (cached prefix, new tokens)
laid out in a paged pool with a shuffled block table, unused blocks filled with NaN."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

# dtype: output tolerance relative to max |reference| (4 roundings to the unit roundoff u
# of the dtype the kernel rounds P, the operands and the output to; fp32 floor for the
# engines' fp32 exp / reciprocal and sums over a few hundred keys)
TOLERANCES = {torch.float32: 2e-5, torch.bfloat16: 4 * 2.0**-8, torch.float16: 4 * 2.0**-11}


@dataclass
class Step:
    q: Tensor
    k: Tensor
    v: Tensor
    k_cache: Tensor
    v_cache: Tensor
    slot_mapping: Tensor
    block_table: Tensor
    cached_seq_len: Tensor
    query_start_loc: Tensor

    def args(self) -> tuple[Tensor, ...]:
        return (self.q, self.k, self.v, self.k_cache, self.v_cache, self.slot_mapping,
                self.block_table, self.cached_seq_len, self.query_start_loc)  # fmt: skip


def make_step(
    seqs: list[tuple[int, int]],
    *,
    hq: int = 4,
    hkv: int = 2,
    d: int = 32,
    block_size: int = 16,
    layout: str = "nhd",
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    pad_tokens: int = 2,
    spare_blocks: int = 3,
    seed: int = 0,
) -> Step:
    """seqs: (cached_seq_len, query_len) per sequence. The cached prefix holds random
    values; every other slot of the pool is NaN (fp8: the format's NaN)."""
    g = torch.Generator().manual_seed(seed)
    cdt = cache_dtype or dtype
    need = [-(-(c + n) // block_size) for c, n in seqs]
    max_blocks = max(need) + 1
    nb = sum(need) + spare_blocks
    perm = torch.randperm(nb, generator=g)
    table = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    used = 0
    for s, n in enumerate(need):
        table[s, :n] = perm[used : used + n]
        table[s, n:] = perm[-1] if n < max_blocks else 0  # unused entries: a NaN block
        used += n
    shape = (nb, block_size, hkv, d) if layout == "nhd" else (nb, hkv, block_size, d)
    k_cache = torch.full(shape, float("nan")).to(cdt)
    v_cache = torch.full(shape, float("nan")).to(cdt)
    slots: list[int] = []
    for s, (c, n) in enumerate(seqs):
        for j in range(c + n):
            blk, off = int(table[s, j // block_size]), j % block_size
            if j >= c:
                slots.append(blk * block_size + off)
                continue
            kv = (torch.randn(2, hkv, d, generator=g)).to(cdt)
            if layout == "nhd":
                k_cache[blk, off], v_cache[blk, off] = kv[0], kv[1]
            else:
                k_cache[blk, :, off], v_cache[blk, :, off] = kv[0], kv[1]
    t_tok = sum(n for _, n in seqs) + pad_tokens
    slots += [-1] * pad_tokens
    qlen = torch.tensor([n for _, n in seqs])
    qsl = torch.cat([torch.zeros(1, dtype=torch.long), qlen.cumsum(0)])
    return Step(
        q=torch.randn(t_tok, hq, d, generator=g).to(dtype),
        k=torch.randn(t_tok, hkv, d, generator=g).to(dtype),
        v=torch.randn(t_tok, hkv, d, generator=g).to(dtype),
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=torch.tensor(slots),
        block_table=table,
        cached_seq_len=torch.tensor([c for c, _ in seqs]),
        query_start_loc=qsl,
    )


def same_bits(a: Tensor, b: Tensor) -> bool:
    """Bit-for-bit equality, except that any NaN equals any NaN (the interpreter's fp8
    e5m2 NaN is 0x7E, torch's 0x7F: the payload of a NaN written from a NaN input)."""
    a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    both_nan = torch.isnan(a.float()) & torch.isnan(b.float())
    ab = a.reshape(-1).view(torch.uint8).reshape(a.numel(), -1)
    bb = b.reshape(-1).view(torch.uint8).reshape(b.numel(), -1)
    return bool(((ab == bb).all(1) | both_nan.reshape(-1)).all())


def assert_rel_close(actual: Tensor, expected: Tensor, tol: float, what: str = "out") -> None:
    """|actual - expected| <= tol * max|expected| elementwise, NaN where expected NaN."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    fin = e[torch.isfinite(e)]
    scale = max(float(fin.abs().max()), 0.05) if fin.numel() else 1.0
    torch.testing.assert_close(a, e, atol=tol * scale, rtol=0.0, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")  # fmt: skip


# A mixed step as vLLM's scheduler builds it: a decode row, a prefix-cache hit
# continuing with a prefill chunk, a fresh prefill, a speculative draft of 5 tokens,
# an idle sequence (no tokens this step) and a 2-token draft.
MIXED = [(40, 1), (32, 20), (0, 9), (25, 5), (10, 0), (3, 2)]


def nan_before_windows(step: Step, window: int, layout: str) -> None:
    """NaN K and V at every cached key before the first query's window."""
    bs = step.k_cache.shape[1 if layout == "nhd" else 2]
    for s, ctx in enumerate(step.cached_seq_len.tolist()):
        for p in range(min(max(0, ctx - window + 1), ctx)):
            blk, off = int(step.block_table[s, p // bs]), p % bs
            for c in (step.k_cache, step.v_cache):
                if layout == "hnd":
                    c[blk, :, off] = float("nan")
                else:
                    c[blk, off] = float("nan")


def record_launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the kernels the serving host launches from now on (in order)."""
    import nki_kernels.serving.decode_step_host as dsh

    launched: list[str] = []
    real = dsh.launch

    def spy(kernel, *a, **kw):  # type: ignore[no-untyped-def]
        launched.append(kernel.__name__)
        return real(kernel, *a, **kw)

    monkeypatch.setattr(dsh, "launch", spy)
    return launched
