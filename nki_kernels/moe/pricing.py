"""Modeled cost of the MoE layer on real shapes: trace-only pricing by representative blocks.

A Mixtral-size forward runs ~13k instructions per block and T = 16384 tokens make 64+
blocks, so the full trace would take minutes to interpret and price. Every block of the
blockwise kernel issues the same instruction sequence (shapes are static; only the run-time
expert id and token indices differ, and neither changes a trace record's cost), so the
kernel's latency is

    lat(n blocks) = prologue + combine(T) + n * per-block steady-state time,

exact once the software pipeline reaches its periodic regime. `price_blocks` interprets
the kernel (trace-only, the full T for the combine) with n0, n0 + 1 and n0 + 2 static
blocks, takes the last increment as the per-block time and extrapolates to the routing's
used blocks; the two increments are reported so the reader sees how close to periodic
the schedule is (`extrapolation_check`: |d2 - d1| / d2). Used blocks <= n0 + 2 are priced
exactly. Routing (uniform, skewed) only changes the number of used blocks.

The blocks are priced as a static loop; in the op, blocks past the static lower bound run
in a device loop whose body is the same instruction sequence with run-time (register)
offsets for the metadata and the y_slots store.

Every figure is "modeled (cost model vN, target)"; nothing here is a measurement.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..interp import TensorSpec
from ..model_shapes import MoEShape
from ..perfmodel import COST_MODEL_VERSION, Estimate, estimate_trace, modeled_label, trace_kernel
from ..targets import Target, get_target
from .blockwise_mlp import moe_mlp_fwd
from .blockwise_mlp_bwd import moe_mlp_bwd
from .config import MoEMLPBwdConfig, MoEMLPConfig, MoEProblem
from .grouping import plan_blocks
from .router import moe_router_fwd

REPRESENTATIVE_BLOCKS = 2  # n0: blocks before the first measured increment


def routing(kind: str, tokens: int, experts: int, top_k: int) -> np.ndarray:
    """Expert ids [T, k]: 'uniform' (exactly balanced) or 'skewed' (every token's first
    choice is expert 0, the other choices balanced over the remaining experts)."""
    t = np.arange(tokens)[:, None]
    j = np.arange(top_k)[None, :]
    if kind == "uniform":
        return (t * top_k + j) % experts
    if kind == "skewed":
        rest = 1 + (t * (top_k - 1) + j - 1) % (experts - 1)
        return np.where(j == 0, 0, rest)
    raise ValueError(f"kind: expected 'uniform' or 'skewed'; got {kind!r}")


def used_blocks(ids: np.ndarray, experts: int, block_size: int) -> int:
    """Blocks the plan of this routing uses (weights do not matter)."""
    w = np.full(ids.shape, 1.0 / ids.shape[1], dtype=np.float32)
    return plan_blocks(ids, w, experts, block_size).used_blocks


def _fwd_specs(p: MoEProblem, nb: int, block: int) -> tuple[TensorSpec, ...]:
    dt, t, h, i, e, k = p.dtype, p.tokens, p.hidden, p.intermediate, p.experts, p.top_k
    return (
        TensorSpec((t, h), dt),
        TensorSpec((e, h, 2 * i), dt),
        TensorSpec((e, i, h), dt),
        TensorSpec((nb, 128, block // 128), "int32"),
        TensorSpec((nb, 1), "int32"),
        TensorSpec((1, 1), "int32"),
        TensorSpec((t, k), "int32"),
        TensorSpec((t, k), "float32"),
    )


def _bwd_specs(p: MoEProblem, nb: int, block: int) -> tuple[TensorSpec, ...]:
    dt, t, h, i, e, k = p.dtype, p.tokens, p.hidden, p.intermediate, p.experts, p.top_k
    return (
        TensorSpec((t, h), dt),
        TensorSpec((e, h, 2 * i), dt),
        TensorSpec((e, i, h), dt),
        TensorSpec((t, h), dt),
        TensorSpec((nb, 128, block // 128), "int32"),
        TensorSpec((nb, 128, block // 128), "float32"),
        TensorSpec((nb, block), "float32"),
        TensorSpec((nb, 1), "int32"),
        TensorSpec((1, 1), "int32"),
        TensorSpec((t, k), "int32"),
        TensorSpec((e, h, 2 * i), "float32"),
        TensorSpec((e, i, h), "float32"),
    )


@functools.lru_cache(maxsize=256)
def _price(kind: str, p: MoEProblem, cfg: Any, nb: int, target: Target) -> Estimate:
    if kind == "fwd":
        specs = _fwd_specs(p, nb, cfg.block_size)
        kernel = moe_mlp_fwd
    else:
        specs = _bwd_specs(p, nb, cfg.block_size)
        kernel = moe_mlp_bwd
    fields = cfg.to_dict()
    trace = trace_kernel(kernel, *specs, nb, True, *fields.values(), target=target)
    return estimate_trace(trace, target)


@dataclass(frozen=True)
class BlockPricing:
    """Latency of the blockwise kernel for `blocks` used blocks (extrapolated or exact).

    Engine busy times and the roofline terms are extrapolated the same way as latency.
    """

    latency_ns: float
    per_block_ns: float
    extrapolation_check: float  # |d2 - d1| / d2 of the last two increments (0 if exact)
    exact: bool
    busy_ns: dict[str, float]
    compute_bound_ns: float
    memory_bound_ns: float

    @property
    def active_pct(self) -> dict[str, float]:
        return {k: 100.0 * v / self.latency_ns for k, v in self.busy_ns.items()}

    @property
    def busiest(self) -> str:
        return max(self.busy_ns, key=lambda k: self.busy_ns[k])

    @property
    def roofline_bound(self) -> str:
        return "tensor" if self.compute_bound_ns >= self.memory_bound_ns else "hbm"


def price_blocks(kind: str, p: MoEProblem, cfg: Any, blocks: int, target: Target) -> BlockPricing:
    """Modeled latency of the forward ('fwd') or backward ('bwd') kernel with `blocks` used."""
    n0 = REPRESENTATIVE_BLOCKS
    if blocks <= n0 + 2:
        e = _price(kind, p, cfg, blocks, target)
        busy = dict(e.busy_ns)
        return BlockPricing(
            e.latency_ns,
            e.latency_ns / blocks,
            0.0,
            True,
            busy,
            e.compute_bound_ns,
            e.memory_bound_ns,
        )
    e0, e1, e2 = (_price(kind, p, cfg, n, target) for n in (n0, n0 + 1, n0 + 2))
    extra = blocks - n0 - 2

    def ext(a1: float, a2: float) -> float:
        return a2 + extra * (a2 - a1)

    d1, d2 = e1.latency_ns - e0.latency_ns, e2.latency_ns - e1.latency_ns
    busy = {k: ext(e1.busy_ns[k], e2.busy_ns[k]) for k in e2.busy_ns}
    return BlockPricing(
        ext(e1.latency_ns, e2.latency_ns),
        d2,
        abs(d2 - d1) / d2 if d2 else 0.0,
        False,
        busy,
        ext(e1.compute_bound_ns, e2.compute_bound_ns),
        ext(e1.memory_bound_ns, e2.memory_bound_ns),
    )


def price_router(p: MoEProblem, target: Target, logits_dtype: str = "bfloat16") -> Estimate:
    """Modeled cost of the NKI router on [T, E] logits (softmax, renormalized top-k)."""
    logits = TensorSpec((p.tokens, p.experts), logits_dtype)
    trace = trace_kernel(moe_router_fwd, logits, p.top_k, "softmax", True, target=target)
    return estimate_trace(trace, target)


def layer_row(
    shape: MoEShape,
    tokens: int,
    kind: str,
    target: str | Target,
    dtype: str = "bfloat16",
    backward: bool = False,
) -> dict[str, Any]:
    """One benchmark row: modeled forward (router + experts + combine) of one MoE layer."""
    tgt = get_target(target)
    p = MoEProblem(tokens, shape.hidden, shape.intermediate, shape.num_experts, shape.top_k, dtype)
    cfg = MoEMLPConfig.heuristic(p, tgt)
    ids = routing(kind, tokens, shape.num_experts, shape.top_k)
    blocks = used_blocks(ids, shape.num_experts, cfg.block_size)
    mlp = price_blocks("fwd", p, cfg, blocks, tgt)
    router = price_router(p, tgt)
    latency = mlp.latency_ns + router.latency_ns
    routed_flops = 2 * tokens * shape.top_k * 3 * shape.hidden * shape.intermediate
    peak = tgt.tensor_peak_flops_per_ns
    row: dict[str, Any] = {
        "label": modeled_label(tgt.name),
        "cost_model": COST_MODEL_VERSION,
        "target": tgt.name,
        "model": shape.model,
        "tokens": tokens,
        "routing": kind,
        "dtype": dtype,
        "config": cfg.to_dict(),
        "blocks": blocks,
        "latency_ms": latency / 1e6,
        "mlp_ms": mlp.latency_ns / 1e6,
        "router_ms": router.latency_ns / 1e6,
        "per_block_us": mlp.per_block_ns / 1e3,
        "mfu_routed_pct": 100.0 * routed_flops / (latency * peak),
        "roofline_bound": mlp.roofline_bound,
        "busiest_engine": mlp.busiest,
        "active_pct": {k: round(v, 1) for k, v in mlp.active_pct.items()},
        "priced_exactly": mlp.exact,
        "extrapolation_check": mlp.extrapolation_check,
    }
    if backward:
        bcfg = MoEMLPBwdConfig.heuristic(p, tgt)
        bblocks = used_blocks(ids, shape.num_experts, bcfg.block_size)
        bwd = price_blocks("bwd", p, bcfg, bblocks, tgt)
        row["bwd_config"] = bcfg.to_dict()
        row["bwd_ms"] = bwd.latency_ns / 1e6
        row["bwd_mfu_routed_pct"] = 100.0 * 2 * routed_flops / (bwd.latency_ns * peak)
        row["bwd_busiest_engine"] = bwd.busiest
    return row


def pricing_dict(b: BlockPricing) -> dict[str, Any]:
    """A JSON-ready view of a BlockPricing."""
    return {**asdict(b), "active_pct": b.active_pct, "roofline_bound": b.roofline_bound}
