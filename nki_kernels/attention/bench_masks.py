"""Modeled benchmarks of masked attention and decode (benchmarks/bench_attention_masks.py).

Every figure is "modeled (cost model vN, target)": trace-only interpretation + timeline,
never a measurement.

Masks (forward, Llama-3 8B attention: one (batch, kv-head) program of 4 query heads,
D = 128, bf16, priced once and multiplied by the 8 kv heads, an upper bound as in
`bench.py`), each mask three ways:

- `ours`: the op's plan -- tiles classified from the mask, SKIP tiles not computed;
  interval masks (document + causal, window) through bounds and `range_select`,
  others through loaded uint8 tiles and `select_reduce`;
- `ours, no skipping`: the same kernel with every tile PARTIAL and its mask loaded (a
  dense mask without its block map);
- `S x S decomposition`: what TorchNeuron runs for SDPA with a mask tensor (its flash
  kernel takes no mask): per head S = Q K^T, S + mask, softmax, P V as separate steps
  with HBM round trips (`baselines.native`, generous to the compiler: every step a
  well-tiled kernel).

Decode (Llama-3 8B: 32 query / 8 KV heads, D = 128, bf16, Sq = 1): our kernel at batch
1 / 8 / 64, cache 2 K / 32 K / 128 K, contiguous or paged (16-key blocks), priced on one
(batch, kv-head) program and multiplied by B * 8 programs; MBU counts the K / V bytes
the lengths need. The peer row is the S x S decomposition with Sq = 1 per query head.
nki-library's TKG kernel is not priced (no runnable case of it in the conformance
loader yet).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..baselines import native
from ..baselines import steps as native_steps
from ..baselines.native import Step
from ..interp import TensorSpec
from ..targets import get_target
from . import masks
from .decode import decode_attention_fwd
from .decode_host import DecodeConfig, DecodeProblem
from .flash_fwd import flash_attention_fwd

GROUP, KV_HEADS, D = 4, 8, 128
MASK_SEQS = (2048, 8192)
DECODE_BATCHES = (1, 8, 64)
DECODE_CACHES = (2048, 32768, 131072)


@dataclass(frozen=True)
class MaskRow:
    target: str
    mask: str
    seq: int
    method: str
    latency_us: float
    tiles_computed: float  # fraction of (query tile, key tile) pairs computed
    label: str


@dataclass(frozen=True)
class DecodeRow:
    target: str
    method: str
    batch: int
    cache: int
    paged: bool
    latency_us: float
    mbu: float  # K / V bytes of the lengths / (HBM bandwidth x latency)
    config: str
    label: str


def _mask(kind: str, s: int, seed: int = 0) -> np.ndarray:
    """bool [1, 1, S, S] allowed map of a benchmark mask."""
    i, j = np.arange(s)[:, None], np.arange(s)[None, :]
    if kind == "document+causal":  # 4 equal documents
        doc = np.arange(s) * 4 // s
        allowed = (doc[:, None] == doc[None, :]) & (j <= i)
    elif kind == "window 1024":
        allowed = (j <= i) & (i - j < 1024)
    elif kind == "block-sparse 50%":  # random 128 x 128 tiles kept, the diagonal always
        rng = np.random.default_rng(seed)
        n = s // 128
        keep = rng.random((n, n)) < 0.5
        keep |= np.eye(n, dtype=bool)
        allowed = np.kron(keep, np.ones((128, 128), dtype=bool)) & (rng.random((s, s)) < 0.9)
    else:
        raise ValueError(f"mask: unknown benchmark mask {kind!r}")
    return allowed[None, None]


def _fwd_args(s: int, plan: Any, dense: bool, bounds: bool, cfg: dict) -> tuple[Any, ...]:
    q = TensorSpec((1, GROUP, s, D), "bfloat16")
    kv = TensorSpec((1, 1, s, D), "bfloat16")
    bnd = TensorSpec((1, 128, 2, s // 128), "float32") if bounds else None
    mk = TensorSpec((1, 1, s, s), "uint8") if dense else None
    fields = ("kv_tile", "q_tiles", "dma_quarters", "scalar_evac", "kv_buffers")
    return (q, kv, kv, bnd, D**-0.5, plan, *(cfg[f] for f in fields), mk, None)


def mask_rows(seqs: tuple[int, ...] = MASK_SEQS, target: str = "trn2") -> list[MaskRow]:
    """Every (mask, seq) case three ways (see the module docstring)."""
    from ..perfmodel import estimate, modeled_label
    from .config import AttentionProblem, FlashFwdConfig

    tgt = get_target(target)
    rows = []
    for s in seqs:
        prob = AttentionProblem(s, s, D, GROUP * KV_HEADS, KV_HEADS, 1, "bfloat16", "data")
        cfg = FlashFwdConfig.heuristic(prob, tgt).to_dict()
        for kind in ("document+causal", "window 1024", "block-sparse 50%"):
            allowed = _mask(kind, s)
            classes = masks.classify_dense(allowed)
            iv = masks.row_intervals(allowed[:, 0])
            if iv is not None:
                classes = masks.classify_tiles(iv[0], iv[1], s)
            plan = masks.tile_plan(classes)
            ours = _fwd_args(s, plan, dense=iv is None, bounds=iv is not None, cfg=cfg)
            every = np.full_like(classes, masks.PARTIAL)
            dense = _fwd_args(s, masks.tile_plan(every), dense=True, bounds=False, cfg=cfg)
            frac = masks.allowed_fraction(classes)
            for method, args, computed in (("ours", ours, frac), ("ours, no skipping", dense, 1.0)):
                est = estimate(flash_attention_fwd, *args, target=tgt)
                rows.append(
                    MaskRow(
                        tgt.name,
                        kind,
                        s,
                        method,
                        est.latency_ns * KV_HEADS / 1e3,
                        computed,
                        est.label,
                    )
                )
            base = native.price(_sxs_with_mask(GROUP * KV_HEADS, s), tgt.name)
            rows.append(
                MaskRow(
                    tgt.name, kind, s, "S x S decomposition", base.latency_ns / 1e3, 1.0, base.label
                )
            )
    _ = modeled_label
    return rows


def _sxs_with_mask(heads: int, s: int) -> list[Step]:
    """native.attention_fwd with the mask added to S as one more streaming step."""
    parts = native.attention_fwd(1, heads, s, s, D, "bfloat16")
    sxs = TensorSpec((s, s), "bfloat16")
    add = Step(
        "S + mask", native_steps.stream_rows, (sxs, sxs, None, None, 0, 1, "bfloat16"), heads
    )
    return [parts[0], add, *parts[1:]]


def decode_rows(
    batches: tuple[int, ...] = DECODE_BATCHES,
    caches: tuple[int, ...] = DECODE_CACHES,
    target: str = "trn2",
    paged: tuple[bool, ...] = (False, True),
    peers: bool = True,
) -> list[DecodeRow]:
    """Decode cases (see the module docstring)."""
    from ..perfmodel import estimate

    tgt = get_target(target)
    rows = []
    for cache in caches:
        for pg in paged:
            layout = "paged" if pg else "contiguous"
            prob = DecodeProblem(1, GROUP * KV_HEADS, KV_HEADS, 1, cache, D, "bfloat16", layout)
            cfg = DecodeConfig.heuristic(prob, tgt)
            steps = -(-cache // cfg.kv_tile)
            q = TensorSpec((1, GROUP, 1, D), "bfloat16")
            bnd = TensorSpec((1, 128, 2), "float32")
            if pg:
                blocks = steps * cfg.kv_tile // 16
                kv = TensorSpec((blocks, 16, 1, D), "bfloat16")
                slots = TensorSpec((1, steps * cfg.kv_tile, 1), "int32")
            else:
                kv = TensorSpec((1, 1, cache, D), "bfloat16")
                slots = None
            args = (q, kv, kv, slots, bnd, D**-0.5, steps, cfg.kv_tile, cfg.splits)
            one = estimate(decode_attention_fwd, *args, target=tgt)
            for b in batches:
                programs = b * KV_HEADS
                lat = one.latency_ns * programs
                nbytes = 2 * b * KV_HEADS * cache * D * 2
                rows.append(
                    DecodeRow(
                        tgt.name,
                        "ours",
                        b,
                        cache,
                        pg,
                        lat / 1e3,
                        nbytes / (lat * tgt.hbm_bytes_per_ns),
                        cfg.key(),
                        one.label,
                    )
                )
    if peers:
        for cache in caches:
            base = native.price(
                native.attention_fwd(1, GROUP * KV_HEADS, 1, cache, D, "bfloat16"), tgt.name
            )
            for b in batches:
                lat = base.latency_ns * b
                nbytes = 2 * b * KV_HEADS * cache * D * 2
                rows.append(
                    DecodeRow(
                        tgt.name,
                        "S x S decomposition (Sq = 1)",
                        b,
                        cache,
                        False,
                        lat / 1e3,
                        nbytes / (lat * tgt.hbm_bytes_per_ns),
                        "-",
                        base.label,
                    )
                )
    return rows


def rows_as_dicts(rows: list[Any]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


__all__ = ["DecodeRow", "MaskRow", "decode_rows", "mask_rows", "rows_as_dicts"]
