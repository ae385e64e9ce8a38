"""The flash-attention tuner family: `flash_attention_fwd` as a `Tunable` (registered in
`families.OPS` as "flash_attention").

Trials price a proxy problem (`_attn_proxy`: one KV-head group per LNC program, at most
ATTN_PROXY_QUERIES query rows); the export re-prices the full problem as units of one
group per program run one after another (`_attn_units`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from ..kernel_config import KernelConfig
from ..targets import Target
from .family_common import by_model, config_cls, np_dtype, to_numpy
from .tunable import Tunable

ATTN_PROXY_QUERIES = 2048  # query rows priced per trial (keys stay at the full length)


class AttentionOp:
    """Flash attention forward: launch arguments, numeric run and reference."""

    op = "flash_attention"

    def __init__(self, lnc: int = 1) -> None:
        self.lnc = lnc

    def kernel(self) -> Any:
        from ..attention.flash_fwd import flash_attention_fwd

        return flash_attention_fwd

    def _mask(self, p: Any) -> tuple[Any, tuple[Any, ...]]:
        """(kernel bounds fp32 [B, 128, 2, nq] or None, static tile plan)."""
        from ..attention import masks

        if p.mask == "none":
            return None, ()
        if p.mask != "causal":
            raise ValueError(f"mask: the tuner prices 'none' or 'causal'; got {p.mask!r}")
        lo, hi = masks.query_bounds(p.batch, p.seq_q, p.seq_k, causal=True)
        plan = masks.tile_plan(masks.classify_tiles(lo, hi, p.seq_k))
        return masks.kernel_bounds(lo, hi), plan

    def trace(self, p: Any, config: KernelConfig, target: Target) -> Any:
        from ..interp import TensorSpec, run

        bounds, plan = self._mask(p)
        spec = None if bounds is None else TensorSpec(bounds.shape, "float32")
        q = TensorSpec((p.batch, p.q_heads, p.seq_q, p.head_dim), p.dtype)
        kv = TensorSpec((p.batch, p.kv_heads, p.seq_k, p.head_dim), p.dtype)
        scale = 1.0 / math.sqrt(p.head_dim)
        kw = config.to_dict()
        return run(self.kernel(), q, kv, kv, spec, scale, plan, target=target, lnc=self.lnc,
                   trace_only=True, **kw).trace  # fmt: skip

    def numeric(
        self, p: Any, config: KernelConfig, target: Target, seed: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        import torch

        from ..attention.reference import attention_reference
        from ..interp import run

        args = self.args(p, seed)
        q, k, v, _, scale, _ = args
        out, lse = run(self.kernel(), *args, target=target, lnc=self.lnc,
                       **config.to_dict()).outputs  # fmt: skip
        t = [torch.from_numpy(a.astype(np.float32)) for a in (q, k, v)]
        ref_out, ref_lse = attention_reference(*t, causal=p.mask == "causal", softmax_scale=scale)
        from ..ops.attention import _lse_from_kernel  # the kernels' partition-major lse

        lse = _lse_from_kernel(torch.from_numpy(np.asarray(lse, np.float32)))[:, :, : p.seq_q]
        got = [np.asarray(out, np.float64), to_numpy(lse).astype(np.float64)]
        return got, [to_numpy(ref_out), to_numpy(ref_lse)]

    def args(self, p: Any, seed: int) -> tuple[Any, ...]:
        """Seeded q, k, v and the mask operands: the kernel's positional arguments."""
        rng = np.random.default_rng(seed)
        dt = np_dtype(p.dtype)
        q = rng.standard_normal((p.batch, p.q_heads, p.seq_q, p.head_dim)).astype(dt)
        k = rng.standard_normal((p.batch, p.kv_heads, p.seq_k, p.head_dim)).astype(dt)
        v = rng.standard_normal((p.batch, p.kv_heads, p.seq_k, p.head_dim)).astype(dt)
        bounds, plan = self._mask(p)
        return (q, k, v, bounds, 1.0 / math.sqrt(p.head_dim), plan)

    def device_launcher(self, p: Any, config: KernelConfig, target: Target) -> Any:
        from .device import device_runner

        return device_runner(self.kernel(), self.args(p, 0), config, target)

    def reduced(self, p: Any, config: KernelConfig, target: Target) -> Any:
        """Two query tiles per interleave group plus a ragged one; two key steps plus a
        ragged sub-tile; GQA groups of two query heads, one per LNC program."""
        qt, kv = int(getattr(config, "q_tiles", 1)), int(getattr(config, "kv_tile", 512))
        sq = min(p.seq_q, 2 * 128 * qt + 77)
        sk = min(p.seq_k, 2 * kv + 77)
        return replace(p, seq_q=sq, seq_k=sk, q_heads=2 * self.lnc, kv_heads=self.lnc, batch=1)

    def tolerance(self, p: Any) -> list[tuple[float, float]]:
        import torch

        from ..testing.tolerances import tolerance

        tol = tolerance(getattr(torch, p.dtype), reduction=p.seq_k)
        return [(tol.atol, tol.rtol)] * 2

    def tunable(self) -> Tunable:
        return Tunable(
            op=self.op,
            config_cls=config_cls("flash_attention"),
            trace=self.trace,
            reduced=self.reduced,
            run_numeric=self.numeric,
            tolerance=self.tolerance,
            bucket_key=lambda p: (
                f"s{p.seq_q}x{p.seq_k}-h{p.q_heads}:{p.kv_heads}-d{p.head_dim}-b{p.batch}-{p.mask}"
            ),
            dtype=lambda p: p.dtype,
            kernels=(self.kernel(),),
            device_launcher=self.device_launcher,
            search_problem=lambda p: _attn_proxy(p, self.lnc),
            repricing=lambda p: _attn_units(p, self.lnc),
            describe=lambda p: (
                f"B={p.batch} Hq={p.q_heads} Hkv={p.kv_heads} Sq={p.seq_q} Sk={p.seq_k} "
                f"D={p.head_dim} {p.dtype} mask={p.mask}"
            ),
            lnc=self.lnc,
        )


def _attn_items(p: Any, lnc: int) -> Any:
    """The problem of `lnc` (sequence, KV-head group) items -- one per LNC program, which
    is how the kernel splits them (`flash_fwd`: items round robin over the programs) --
    or of every item when there are fewer."""
    kv = min(p.kv_heads, lnc)
    batch = min(p.batch, -(-lnc // kv))
    return replace(p, batch=batch, q_heads=kv * (p.q_heads // p.kv_heads), kv_heads=kv)


def _attn_proxy(p: Any, lnc: int = 1) -> Any:
    """One KV-head group of one sequence per LNC program, and at most ATTN_PROXY_QUERIES
    query rows (the last ones: under a bottom-right causal mask they see the most keys).
    Heads and sequences run the same tile schedule one after another on each program, and
    every query tile streams all its keys, so configs rank alike on the proxy. At LNC 2 a
    proxy of one group would leave the second program idle and rank the configs as at
    LNC 1, so it has one group per program."""
    return replace(_attn_items(p, lnc), seq_q=min(p.seq_q, ATTN_PROXY_QUERIES))


def _attn_units(p: Any, lnc: int = 1) -> tuple[Any, int]:
    """One unit of `lnc` (sequence, KV-head group) items at full length -- one per LNC
    program -- and how many units run one after another: each program runs its items in
    turn with the same schedule, so the busiest program runs ceil(items / lnc) of them."""
    unit = _attn_items(p, lnc)
    n_unit = unit.batch * unit.kv_heads
    return unit, -(-(p.batch * p.kv_heads) // n_unit)


def attention_problem(mask: str) -> Callable[[str, int, str], Any]:
    def make(shape: str, bucket: int, dtype: str) -> Any:
        from ..attention.config import AttentionProblem
        from ..model_shapes import ATTENTION_SHAPES
        from ..runtime.buckets import bucket as to_bucket

        s = by_model(ATTENTION_SHAPES, shape)
        n = to_bucket(bucket)
        return AttentionProblem(
            seq_q=n, seq_k=n, head_dim=s.head_dim, q_heads=s.num_heads,
            kv_heads=s.num_kv_heads, batch=1, dtype=dtype, mask=mask,
        )  # fmt: skip

    return make
