"""Host side of decode attention (torch + NumPy): config, bounds, paged slots, launch.

The op's config comes from the config store (`runtime.config_store.lookup_config`:
tuned entry, nearest cache-length bucket, else `DecodeConfig.heuristic`), keyed by the
per-program problem (batch 1, the cache length bucketed); the tuner family is
`autotune/decode_family.py`.

`torch.ops.nki.decode_attention` (registered in `nki_kernels.ops.attention`) calls
`decode` here. The kernel is `decode.decode_attention_fwd`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from ..kernel_config import InvalidConfig, KernelConfig
from ..runtime.buckets import bucket
from ..runtime.config_store import lookup_config
from ..runtime.host_array import host_numpy
from ..runtime.launch import launch
from ..targets import Target, get_target
from .decode import decode_attention_fwd

P = 128
KV_TILES = (128, 256, 512)  # keys per step: one fp32 PSUM bank holds 512 scores
MAX_SPLITS = 8


LAYOUTS = ("contiguous", "paged")
DRY_RUN_STEPS = 8  # key steps of the fit check's trace (SBUF / PSUM use is per step)


@dataclass(frozen=True)
class DecodeProblem:
    """A decode call's static shape: batch, heads, new queries, keys of the longest
    sequence (`seq_k`, bucketed when the op looks a config up), head_dim, dtype, cache
    layout ("contiguous" or "paged").

    The op looks configs up with batch = 1: every (sequence, KV head) program runs the
    same step schedule one after another, so the batch does not change the choice.
    """

    batch: int
    q_heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    head_dim: int
    dtype: str
    layout: str = "contiguous"

    def __post_init__(self) -> None:
        for name in ("batch", "q_heads", "kv_heads", "seq_q", "seq_k", "head_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int; got {v!r}")
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"q_heads: expected a multiple of kv_heads ({self.kv_heads}); got {self.q_heads}"
            )
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}; got {self.layout!r}")

    @property
    def paged(self) -> bool:
        return self.layout == "paged"

    @property
    def group(self) -> int:
        return self.q_heads // self.kv_heads


@dataclass(frozen=True)
class DecodeConfig(KernelConfig):
    """Decode kernel tunables.

    kv_tile: keys per step (128, 256, 512): longer steps amortize the per-step
      statistics; 512 fp32 scores fill one PSUM bank.
    splits: independent online-softmax accumulators (split-K), merged on chip at the
      end: consecutive steps of different splits carry no dependency through the
      running max; each costs [rows, D] fp32 of SBUF and a merge.
    """

    op_name: ClassVar[str] = "decode_attention"

    kv_tile: int = 512
    splits: int = 2

    @classmethod
    def heuristic(cls, problem: DecodeProblem, target: Target) -> DecodeConfig:
        kv = 512 if problem.seq_k >= 512 else max(128, 1 << (problem.seq_k - 1).bit_length())
        # one accumulator: the kernel's three-stage software pipeline already overlaps
        # consecutive steps; more splits model no faster at Sq = 1 (trn2, cost model v1:
        # 32 K keys, 4 packed rows, 1 vs 4 splits: 209 vs 213 us per program)
        return cls(kv_tile=kv, splits=1)

    @classmethod
    def search_space(cls, problem: DecodeProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        return {"kv_tile": KV_TILES, "splits": (1, 2, 4, 8)}

    def validate(self, problem: DecodeProblem, target: Target) -> None:
        if self.kv_tile not in KV_TILES:
            raise InvalidConfig(f"kv_tile: expected one of {KV_TILES}; got {self.kv_tile}")
        if not 1 <= self.splits <= MAX_SPLITS:
            raise InvalidConfig(f"splits: expected 1..{MAX_SPLITS}; got {self.splits}")
        rows = problem.group * problem.seq_q
        if rows > P:
            raise InvalidConfig(f"(Hq / Hkv) * Sq = {rows} packed rows exceed {P} partitions")
        err = _dry_run(self, problem, target)
        if err is not None:
            raise InvalidConfig(f"does not fit on {target.name}: {err}")


def kernel_args(
    problem: DecodeProblem, config: DecodeConfig, block_size: int = 16
) -> tuple[Any, ...]:
    """TensorSpec arguments of one launch of `decode_attention_fwd` for `problem` (a
    paged pool of `block_size`-key blocks holding every sequence's keys)."""
    from ..interp import TensorSpec

    p, dt = problem, problem.dtype
    steps = -(-p.seq_k // config.kv_tile)
    q = TensorSpec((p.batch, p.q_heads, p.seq_q, p.head_dim), dt)
    bounds = TensorSpec((p.batch, P, 2), "float32")
    slots = None
    if p.paged:
        blocks = p.batch * -(-steps * config.kv_tile // block_size)
        kv = TensorSpec((blocks, block_size, p.kv_heads, p.head_dim), dt)
        slots = TensorSpec((p.batch, steps * config.kv_tile, 1), "int32")
    else:
        kv = TensorSpec((p.batch, p.kv_heads, p.seq_k, p.head_dim), dt)
    scale = 1.0 / math.sqrt(p.head_dim)
    return (q, kv, kv, slots, bounds, scale, steps, config.kv_tile, config.splits)


@functools.lru_cache(maxsize=512)
def _dry_run(config: DecodeConfig, problem: DecodeProblem, target: Target) -> str | None:
    """The interpreter's complaint about a trace-only run of one program of `problem`
    (at most DRY_RUN_STEPS key steps), or None."""
    from ..interp import run
    from ..interp.errors import NkiValidationError

    keys = min(problem.seq_k, DRY_RUN_STEPS * config.kv_tile)
    unit = replace(problem, batch=1, q_heads=problem.group, kv_heads=1, seq_k=keys)
    try:
        res = run(decode_attention_fwd, *kernel_args(unit, config), target=target, trace_only=True)
    except NkiValidationError as err:
        return str(err)
    if res.peak_sbuf_bytes > target.sbuf_usable_bytes:
        return f"SBUF overflow: peak {res.peak_sbuf_bytes} B > {target.sbuf_usable_bytes} B"
    return None


def decode_bounds(cache_lens: np.ndarray, group: int, sq: int) -> np.ndarray:
    """fp32 [B, 128, 2]: key interval [0, hi) of packed row r = head * Sq + i, with
    hi = cache_len - Sq + i + 1 (the new tokens are the cache's last Sq positions)."""
    b = cache_lens.shape[0]
    out = np.zeros((b, P, 2), dtype=np.float32)
    i = np.tile(np.arange(sq), group)
    hi = np.maximum(cache_lens.reshape(b, 1) - sq + i[None, :] + 1, 0)
    out[:, : group * sq, 1] = hi
    return out


def paged_slots(
    block_table: np.ndarray, cache_lens: np.ndarray, block_size: int, n_keys: int
) -> np.ndarray:
    """int32 [B, n_keys, 1]: cache row (block * block_size + offset) of each key position;
    positions at or past the sequence's length read row 0 (masked by the bounds)."""
    b = block_table.shape[0]
    j = np.arange(n_keys)
    live = j[None, :] < cache_lens.reshape(b, 1)
    blk_idx = np.minimum(j // block_size, block_table.shape[1] - 1)
    rows = block_table[:, blk_idx] * block_size + (j % block_size)[None, :]
    return np.where(live, rows, 0).astype(np.int32)[:, :, None]


def check_block_table(
    block_table: np.ndarray, cache_lens: np.ndarray, block_size: int, num_blocks: int
) -> None:
    """ValueError naming `block_table` when an entry a sequence uses (the first
    ceil(cache_len / block_size) of its row) is outside [0, num_blocks); entries past a
    sequence's blocks are never read and may hold anything (-1 padding, say)."""
    used = np.arange(block_table.shape[1])[None, :] < -(-cache_lens.reshape(-1, 1) // block_size)
    bad = used & ((block_table < 0) | (block_table >= num_blocks))
    if bad.any():
        b, j = (int(x) for x in np.argwhere(bad)[0])
        raise ValueError(
            f"block_table: expected entries in [0, {num_blocks}) (num_blocks) for the "
            f"{-(-int(cache_lens[b]) // block_size)} blocks sequence {b} uses; got "
            f"block_table[{b}, {j}] = {int(block_table[b, j])}"
        )


def decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_lens: Tensor,
    block_table: Tensor | None,
    softmax_scale: float | None,
    config: DecodeConfig | None = None,
) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, Sq, D], lse [B, Hq, Sq] fp32) of Sq new queries over the cache."""
    b, hq, sq, d = q.shape
    paged = block_table is not None
    hkv = k_cache.shape[2] if paged else k_cache.shape[1]
    lens = host_numpy(cache_lens).astype(np.int64)
    limit = k_cache.shape[1] * block_table.shape[1] if block_table is not None else k_cache.shape[2]
    if lens.size and (lens.min() < 0 or lens.max() > limit):
        what = "max_blocks * block_size" if paged else "S_max"
        raise ValueError(
            f"cache_lens: expected values in [0, {limit}] ({what}); got min {lens.min()}, "
            f"max {lens.max()}"
        )
    longest = max(1, int(lens.max(initial=1)))
    target = get_target(None)
    dtype = str(q.dtype).removeprefix("torch.")
    layout = "paged" if paged else "contiguous"
    problem = DecodeProblem(1, hq, hkv, sq, bucket(longest), d, dtype, layout)
    if config is None:
        # The config describes one (sequence, KV head) program, which does the same work at
        # any LNC (kernel[2] only shares the items out), so its entries are keyed at LNC 1.
        cfg = lookup_config("decode_attention", problem, decode_attention_fwd, target=target, lnc=1)
        assert isinstance(cfg, DecodeConfig)
    else:
        cfg = config
        cfg.validate(problem, target)
    n_steps = -(-longest // cfg.kv_tile)  # one specialization per kv_tile-bucket of length
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    bounds = torch.from_numpy(decode_bounds(lens, hq // hkv, sq)).to(q.device)
    slots = None
    if paged:
        assert block_table is not None
        bt = host_numpy(block_table).astype(np.int64)
        check_block_table(bt, lens, k_cache.shape[1], k_cache.shape[0])
        slots_np = paged_slots(bt, lens, k_cache.shape[1], n_steps * cfg.kv_tile)
        slots = torch.from_numpy(slots_np).to(q.device)
    out, lse = launch(
        decode_attention_fwd,
        q.contiguous(),
        k_cache.contiguous(),
        v_cache.contiguous(),
        slots,
        bounds,
        scale,
        n_steps,
        cfg.kv_tile,
        cfg.splits,
        target=target,
    )
    i = torch.arange(sq, device=q.device)
    empty = (cache_lens.to(q.device).view(b, 1) - sq + i.view(1, sq) + 1) <= 0  # [B, Sq]
    if bool(empty.any()):
        out = out.masked_fill(empty[:, None, :, None], 0.0)
        lse = lse.masked_fill(empty[:, None, :], float("-inf"))
    return out, lse


__all__ = [
    "DecodeConfig",
    "DecodeProblem",
    "decode",
    "decode_bounds",
    "kernel_args",
    "paged_slots",
]
