"""Host side of decode attention (torch + NumPy): configs, bounds, launch plans.

`torch.ops.nki.decode_attention` (registered in `nki_kernels.ops.decode`) calls `decode`
here. The streamed kernel (`decode_stream.decode_stream_fwd`, the whole batch in one
launch, its index tensors planned by `decode_plan.plan_decode`) serves every call, with a
`StreamConfig` from the config store (`runtime.config_store.lookup_config`: tuned entry,
nearest cache-length bucket, else `StreamConfig.heuristic`), keyed as a batch-1 problem
with the cache length bucketed, the cache's layout ("contiguous" or "paged", both paged
block layouts) and the runtime LNC; the tuner family is `autotune/decode_family.py`.
A `DecodeConfig` passed explicitly selects the per-(sequence, KV head) kernel
(`decode.decode_attention_fwd`), kept for comparison.
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
from ..runtime.lnc import runtime_lnc
from ..targets import Target, get_target
from .decode import decode_attention_fwd
from .decode_plan import plan_decode
from .decode_stream import decode_stream_fwd

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

    op_name: ClassVar[str] = "decode_attention_per_program"  # not looked up by the op

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


PIECES = (4, 8, 16)  # keys per gathered piece (C); 16 keeps V descriptors >= 4 KiB (bf16 D 128)
RINGS = (2, 3)  # K^T / V slabs in flight


@dataclass(frozen=True)
class StreamConfig(KernelConfig):
    """Tunables of the streamed kernel (`decode_stream.decode_stream_fwd`).

    piece: keys per gathered piece C (at most; `decode_plan.tile_shape` lowers it to fit
      one PSUM bank of scores and the SBUF ring): bigger pieces, bigger V descriptors
      (C x D x 2 B per head) and more keys per softmax pass.
    ring: K^T / V slabs in flight (deeper hides more of each slab's softmax chain, at
      smaller pieces within the same SBUF).
    """

    op_name: ClassVar[str] = "decode_attention"

    piece: int = 16
    ring: int = 2

    @classmethod
    def heuristic(cls, problem: DecodeProblem, target: Target) -> StreamConfig:
        return cls()

    @classmethod
    def search_space(cls, problem: DecodeProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        return {"piece": PIECES, "ring": RINGS}

    def validate(self, problem: DecodeProblem, target: Target) -> None:
        if self.piece not in PIECES:
            raise InvalidConfig(f"piece: expected one of {PIECES}; got {self.piece}")
        if self.ring not in RINGS:
            raise InvalidConfig(f"ring: expected one of {RINGS}; got {self.ring}")
        if problem.group * problem.seq_q > P:
            raise InvalidConfig(
                f"(Hq / Hkv) * Sq = {problem.group * problem.seq_q} packed rows exceed {P}"
            )
        err = _stream_dry_run(self, problem, target)
        if err is not None:
            raise InvalidConfig(f"does not fit on {target.name}: {err}")


def stream_plan(
    problem: DecodeProblem, config: StreamConfig, block_size: int = 16, ksplit: int = 1
) -> Any:
    """(plan, cache shape) of `problem` with every sequence `seq_k` keys long (a paged
    pool of `block_size`-key blocks, sequence b's blocks consecutive)."""
    p = problem
    lens = np.full(p.batch, p.seq_k, dtype=np.int64)
    isz = 4 if p.dtype == "float32" else 2
    table = None
    layout = "paged" if p.paged else "contiguous"
    shape: tuple[int, ...] = (p.batch, p.kv_heads, p.seq_k, p.head_dim)
    if p.paged:
        per = -(-p.seq_k // block_size)
        shape = (p.batch * per, block_size, p.kv_heads, p.head_dim)
        table = np.arange(p.batch * per).reshape(p.batch, per)
    plan = plan_decode(lens, p.q_heads, p.kv_heads, p.seq_q, layout, shape, table, p.head_dim,
                       isz, config.piece, config.ring, ksplit)  # fmt: skip
    return plan, shape


def stream_kernel_args(
    problem: DecodeProblem, config: StreamConfig, block_size: int = 16, lnc: int = 1
) -> tuple[Any, ...]:
    """TensorSpec arguments of one `decode_stream_fwd` launch for `problem` (uniform
    lengths; at LNC 2 a single sequence splits its keys in two, as the op does)."""
    from ..interp import TensorSpec

    p = problem
    plan, shape = stream_plan(p, config, block_size, 2 if lnc == 2 and p.batch == 1 else 1)
    q = TensorSpec((p.batch, p.q_heads, p.seq_q, p.head_dim), p.dtype)
    kv = TensorSpec(shape, p.dtype)
    arrays = (plan.idx, plan.kpos, plan.tail_idx, plan.tail_kpos, plan.hi, plan.full)
    specs = [TensorSpec(a.shape, str(a.dtype)) for a in arrays]
    return (q, kv, kv, *specs, 1.0 / math.sqrt(p.head_dim), *plan.static_args())


@functools.lru_cache(maxsize=512)
def _stream_dry_run(config: StreamConfig, problem: DecodeProblem, target: Target) -> str | None:
    """The interpreter's complaint about a trace-only launch of `problem` cut to one
    tile and at most two slabs (SBUF / PSUM use is per slab), or None."""
    from ..interp import run, settings
    from ..interp.errors import NkiValidationError

    keys = min(problem.seq_k, 2 * P * config.piece)
    unit = replace(problem, batch=1, seq_k=keys)
    try:
        with settings(free_unused_tiles=False):  # strict: the full launch uses every buffer
            res = run(decode_stream_fwd, *stream_kernel_args(unit, config), target=target,
                      trace_only=True)  # fmt: skip
    except NkiValidationError as err:
        return str(err)
    if res.peak_sbuf_bytes > target.sbuf_usable_bytes:
        return f"SBUF overflow: peak {res.peak_sbuf_bytes} B > {target.sbuf_usable_bytes} B"
    return None


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
    from ..interp import run, settings
    from ..interp.errors import NkiValidationError

    keys = min(problem.seq_k, DRY_RUN_STEPS * config.kv_tile)
    unit = replace(problem, batch=1, q_heads=problem.group, kv_heads=1, seq_k=keys)
    try:
        with settings(free_unused_tiles=False):  # strict: the full launch uses every buffer
            res = run(decode_attention_fwd, *kernel_args(unit, config), target=target,
                      trace_only=True)  # fmt: skip
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
    """uint32 [B, n_keys, 1]: cache row (block * block_size + offset) of each key position;
    positions at or past the sequence's length read row 0 (masked by the bounds)."""
    b = block_table.shape[0]
    j = np.arange(n_keys)
    live = j[None, :] < cache_lens.reshape(b, 1)
    blk_idx = np.minimum(j // block_size, block_table.shape[1] - 1)
    rows = block_table[:, blk_idx] * block_size + (j % block_size)[None, :]
    return np.where(live, rows, 0).astype(np.uint32)[:, :, None]


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
    config: DecodeConfig | StreamConfig | None = None,
    kv_layout: str = "vllm",
) -> tuple[Tensor, Tensor]:
    """(out [B, Hq, Sq, D], lse [B, Hq, Sq] fp32) of Sq new queries over the cache.

    The streamed kernel (`decode_stream.decode_stream_fwd`, the whole batch per launch)
    serves every call; a `DecodeConfig` selects the per-(sequence, KV head) kernel
    (`decode.decode_attention_fwd`) instead, kept for comparison.
    """
    b, hq, sq, d = q.shape
    paged = block_table is not None
    head_major = paged and kv_layout == "head_major"
    hkv = (k_cache.shape[1] if head_major else k_cache.shape[2]) if paged else k_cache.shape[1]
    bs = (k_cache.shape[2] if head_major else k_cache.shape[1]) if paged else 0
    lens = host_numpy(cache_lens).astype(np.int64)
    limit = bs * block_table.shape[1] if block_table is not None else k_cache.shape[2]
    if lens.size and (lens.min() < 0 or lens.max() > limit):
        what = "max_blocks * block_size" if paged else "S_max"
        raise ValueError(
            f"cache_lens: expected values in [0, {limit}] ({what}); got min {lens.min()}, "
            f"max {lens.max()}"
        )
    bt = None
    if paged:
        assert block_table is not None
        bt = host_numpy(block_table).astype(np.int64)
        check_block_table(bt, lens, bs, k_cache.shape[0])
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale)
    target = get_target(None)
    if isinstance(config, DecodeConfig):
        if head_major:
            raise ValueError(
                "config: a DecodeConfig selects the per-program kernel, which reads "
                f"kv_layout 'vllm' only; got kv_layout {kv_layout!r} with config {config.key()}"
            )
        out, lse = _decode_per_program(q, k_cache, v_cache, lens, bt, scale, config, target)
    else:
        layout = ("paged_hm" if head_major else "paged") if paged else "contiguous"
        longest = max(1, int(lens.max(initial=1)))
        dtype = str(q.dtype).removeprefix("torch.")
        # keyed by the cache's layout (both paged layouts: "paged") and the runtime LNC
        lnc = runtime_lnc(target)
        problem = DecodeProblem(1, hq, hkv, sq, bucket(longest), d, dtype,
                                "paged" if paged else "contiguous")  # fmt: skip
        cfg = config or lookup_config("decode_attention", problem, decode_stream_fwd,
                                      target=target, config_cls=StreamConfig, lnc=lnc)  # fmt: skip
        assert isinstance(cfg, StreamConfig)
        ksplit = 2 if b == 1 and lnc == 2 else 1
        plan = plan_decode(lens, hq, hkv, sq, layout, tuple(k_cache.shape), bt, d,
                           q.element_size(), cfg.piece, cfg.ring, ksplit)  # fmt: skip
        dev = q.device
        arrays = (plan.idx, plan.kpos, plan.tail_idx, plan.tail_kpos, plan.hi, plan.full)
        tens = [torch.from_numpy(a).to(dev) for a in arrays]
        outs, lses = launch(
            decode_stream_fwd, q.contiguous(), k_cache.contiguous(), v_cache.contiguous(),
            *tens, scale, *plan.static_args(), target=target,
        )  # fmt: skip
        out, lse = _merge(outs, lses)
    i = torch.arange(sq, device=q.device)
    empty = (cache_lens.to(q.device).view(b, 1) - sq + i.view(1, sq) + 1) <= 0  # [B, Sq]
    if bool(empty.any()):
        out = out.masked_fill(empty[:, None, :, None], 0.0)
        lse = lse.masked_fill(empty[:, None, :], float("-inf"))
    return out, lse


def _merge(outs: Tensor, lses: Tensor) -> tuple[Tensor, Tensor]:
    """Exact log-sum-exp merge of the key splits' (out, lse) (split-K at LNC 2, B = 1)."""
    if outs.shape[0] == 1:
        return outs[0], lses[0]
    top = lses.max(dim=0).values
    w = torch.exp(lses - top)
    tot = w.sum(dim=0)
    merged = (w[..., None] * outs.float()).sum(dim=0) / tot[..., None]
    return merged.to(outs.dtype), top + torch.log(tot)


def _decode_per_program(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    lens: np.ndarray,
    bt: np.ndarray | None,
    scale: float,
    cfg: DecodeConfig,
    target: Target,
) -> tuple[Tensor, Tensor]:
    """The per-(sequence, KV head) kernel with an explicit config."""
    _b, hq, sq, d = q.shape
    paged = bt is not None
    hkv = k_cache.shape[2] if paged else k_cache.shape[1]
    longest = max(1, int(lens.max(initial=1)))
    dtype = str(q.dtype).removeprefix("torch.")
    layout = "paged" if paged else "contiguous"
    cfg.validate(DecodeProblem(1, hq, hkv, sq, bucket(longest), d, dtype, layout), target)
    n_steps = -(-longest // cfg.kv_tile)
    bounds = torch.from_numpy(decode_bounds(lens, hq // hkv, sq)).to(q.device)
    slots = None
    if bt is not None:
        slots_np = paged_slots(bt, lens, k_cache.shape[1], n_steps * cfg.kv_tile)
        slots = torch.from_numpy(slots_np).to(q.device)
    return launch(
        decode_attention_fwd, q.contiguous(), k_cache.contiguous(), v_cache.contiguous(),
        slots, bounds, scale, n_steps, cfg.kv_tile, cfg.splits, target=target,
    )  # type: ignore[no-any-return]  # fmt: skip


__all__ = [
    "DecodeConfig",
    "DecodeProblem",
    "StreamConfig",
    "decode",
    "decode_bounds",
    "kernel_args",
    "paged_slots",
    "stream_kernel_args",
    "stream_plan",
]
