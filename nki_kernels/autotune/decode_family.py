"""The decode-attention tuner family: `torch.ops.nki.decode_attention`'s streamed kernel
(`attention.decode_stream.decode_stream_fwd`) as a `Tunable` (registered in
`families.OPS` as "decode_attention"), config `attention.decode_host.StreamConfig`.

A problem is `attention.decode_host.DecodeProblem` as the op looks it up: batch 1 (a
launch's tiles of sequences run the same slab schedule one after another), the model's
query / KV heads, Sq = 1 new token, the cache length bucket and the layout. Trials price
the whole launch of that problem (every KV head, the bucket's keys). The correctness gate
runs a reduced problem (two sequences of ragged lengths, one of them with a partial
piece, one GQA group) against a float64 reference, with a shuffled block table for the
paged layout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..kernel_config import KernelConfig
from ..targets import Target
from .tunable import Tunable

OP = "decode_attention"
BLOCK_SIZE = 16  # keys per block of the paged pools the family prices (vLLM's default)
LAYOUTS = ("contiguous", "paged")


def _kernel() -> Any:
    from ..attention.decode_stream import decode_stream_fwd

    return decode_stream_fwd


def _trace(p: Any, config: KernelConfig, target: Target, lnc: int = 1) -> Any:
    from ..attention.decode_host import stream_kernel_args
    from ..interp import run

    args = stream_kernel_args(p, config, BLOCK_SIZE, lnc=lnc)  # type: ignore[arg-type]
    return run(_kernel(), *args, target=target, trace_only=True, lnc=lnc).trace


def _lengths(p: Any) -> np.ndarray:
    """Ragged cache lengths: the first sequence the full bucket, the others shorter."""
    return np.array([max(1, p.seq_k - 37 * i) for i in range(p.batch)], dtype=np.int64)


def _numeric(
    p: Any, config: KernelConfig, target: Target, seed: int, lnc: int = 1
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    from ..attention.decode_plan import merge_splits, plan_decode
    from ..interp import dtypes, run

    rng = np.random.default_rng(seed)
    dt = dtypes.as_dtype(p.dtype)
    d, hq, hkv, sq = p.head_dim, p.q_heads, p.kv_heads, p.seq_q
    lens = _lengths(p)
    q = rng.standard_normal((p.batch, hq, sq, d)).astype(dt)
    k = rng.standard_normal((p.batch, hkv, p.seq_k, d)).astype(dt)
    v = rng.standard_normal((p.batch, hkv, p.seq_k, d)).astype(dt)
    kc, vc, table, layout = k, v, None, "contiguous"
    if p.layout == "paged":
        layout = "paged"
        per = -(-p.seq_k // BLOCK_SIZE)
        table = rng.permutation(p.batch * per).reshape(p.batch, per)
        kc = np.zeros((p.batch * per, BLOCK_SIZE, hkv, d), dtype=dt)
        vc = np.zeros_like(kc)
        for b in range(p.batch):
            for j in range(p.seq_k):
                blk, off = table[b, j // BLOCK_SIZE], j % BLOCK_SIZE
                kc[blk, off], vc[blk, off] = k[b, :, j], v[b, :, j]
    isz = 4 if p.dtype == "float32" else 2
    ksplit = 2 if lnc == 2 and p.batch == 1 else 1
    plan = plan_decode(lens, hq, hkv, sq, layout, kc.shape, table, d, isz,
                       int(config.piece), int(config.ring), ksplit)  # type: ignore[attr-defined]  # fmt: skip
    scale = 1.0 / float(np.sqrt(d))
    arrays = (plan.idx, plan.kpos, plan.tail_idx, plan.tail_kpos, plan.hi, plan.full)
    out, lse = run(_kernel(), q, kc, vc, *arrays, scale, *plan.static_args(),
                   target=target, lnc=lnc).outputs  # fmt: skip
    out, lse = merge_splits(np.asarray(out, np.float32), np.asarray(lse, np.float32))
    ref_out, ref_lse = _reference(q, k, v, lens, scale)
    got = [np.asarray(out, np.float64), np.asarray(lse, np.float64)]
    return got, [ref_out, ref_lse]


def _reference(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, lens: np.ndarray, scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """float64 (out, natural-log lse): query i of sequence b sees keys j <= len - Sq + i."""
    hq, sq = q.shape[1], q.shape[2]
    group = hq // k.shape[1]
    qf, kf, vf = (np.asarray(t, np.float64) for t in (q, k, v))
    kf, vf = np.repeat(kf, group, axis=1), np.repeat(vf, group, axis=1)
    s = scale * np.einsum("bhqd,bhkd->bhqk", qf, kf)
    hi = lens[:, None] - sq + np.arange(sq)[None, :] + 1  # [B, Sq]
    allowed = np.arange(k.shape[2])[None, None, :] < hi[:, :, None]  # [B, Sq, Sk]
    s = np.where(allowed[:, None], s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    w = np.exp(s - m)
    lse = (m + np.log(w.sum(axis=-1, keepdims=True)))[..., 0]
    return np.einsum("bhqk,bhkd->bhqd", w / w.sum(axis=-1, keepdims=True), vf), lse


def _reduced(p: Any, config: KernelConfig, target: Target) -> Any:
    piece = int(config.piece)  # type: ignore[attr-defined]
    return replace(p, batch=2, q_heads=p.group, kv_heads=1, seq_k=min(p.seq_k, 256 * piece + 77))


def _tolerance(p: Any) -> list[tuple[float, float]]:
    import torch

    from ..testing.tolerances import tolerance

    out = tolerance(getattr(torch, p.dtype), reduction=p.seq_k)
    lse = tolerance(torch.float32, reduction=p.seq_k)
    return [(out.atol, out.rtol), (lse.atol, lse.rtol)]


def _device_launcher(p: Any, config: KernelConfig, target: Target) -> Any:
    from ..attention.decode_host import stream_kernel_args
    from ..interp import TensorSpec, dtypes
    from .device import device_runner

    rng = np.random.default_rng(0)
    args = []
    for a in stream_kernel_args(p, config, BLOCK_SIZE):  # type: ignore[arg-type]
        if isinstance(a, TensorSpec):
            if a.dtype == "int32":
                a = np.zeros(a.shape, np.int32)
            elif a.dtype == "uint8":
                a = np.ones(a.shape, np.uint8)
            else:
                a = rng.standard_normal(a.shape).astype(dtypes.as_dtype(a.dtype))
        args.append(a)
    return device_runner(_kernel(), tuple(args), config, target)


def make_problem(layout: str) -> Any:
    """(model shape, cache-length bucket, dtype) -> the op's lookup problem; the shape
    may name its cache layout (`llama3-8b,layout=paged`), else `layout`."""

    def make(shape: str, bucket: int, dtype: str) -> Any:
        from ..attention.decode_host import DecodeProblem
        from ..model_shapes import ATTENTION_SHAPES
        from ..runtime.buckets import bucket as to_bucket
        from .shapes import resolve_shape

        parts = [x.strip() for x in shape.split(",")]
        chosen = [x.partition("=")[2] for x in parts if x.startswith("layout=")]
        if any(c not in LAYOUTS for c in chosen) or len(chosen) > 1:
            raise ValueError(
                f"--shape: expected at most one layout=L with L in {LAYOUTS}; got {shape!r}"
            )
        s = resolve_shape(
            ATTENTION_SHAPES, ",".join(x for x in parts if not x.startswith("layout="))
        )
        return DecodeProblem(1, s.num_heads, s.num_kv_heads, 1, to_bucket(bucket), s.head_dim,
                             dtype, chosen[0] if chosen else layout)  # fmt: skip

    return make


def tunable(lnc: int = 1) -> Tunable:
    """The decode family's `Tunable` as launched at `lnc` (LNC 2: the tiles shared out
    between the two programs, a single sequence's keys split in two)."""
    from ..attention.decode_host import StreamConfig

    return Tunable(
        op=OP,
        config_cls=StreamConfig,
        trace=lambda p, c, t: _trace(p, c, t, lnc),
        reduced=_reduced,
        run_numeric=lambda p, c, t, seed: _numeric(p, c, t, seed, lnc),
        tolerance=_tolerance,
        bucket_key=lambda p: (
            f"s{p.seq_q}x{p.seq_k}-h{p.q_heads}:{p.kv_heads}-d{p.head_dim}-b{p.batch}-{p.layout}"
        ),
        dtype=lambda p: p.dtype,
        kernels=(_kernel(),),
        device_launcher=_device_launcher,
        describe=lambda p: (
            f"B={p.batch} Hq={p.q_heads} Hkv={p.kv_heads} Sq={p.seq_q} cache={p.seq_k} "
            f"D={p.head_dim} {p.dtype} {p.layout}"
        ),
        lnc=lnc,
    )


def specs() -> list[Any]:
    """The `OpSpec`s of the family: one op, its standard problems contiguous and paged
    (the op's lookup key carries the layout: both paged layouts look up "paged")."""
    from .families import OpSpec

    return [
        OpSpec(
            op=OP,
            family="attention",
            make_tunable=tunable,
            make_problem=make_problem("contiguous"),
            shapes=(
                "llama3-8b",
                "llama3-70b",
                "llama3-8b,layout=paged",
                "llama3-70b,layout=paged",
            ),
            bucket_dim="seq",
            standard_buckets=(2048, 32768, 131072),
        )
    ]


def register(ops: dict[str, Any]) -> None:
    """Add the family's specs to `ops` (`families.OPS`)."""
    for s in specs():
        ops[s.op] = s


__all__ = ["OP", "make_problem", "register", "specs", "tunable"]
