"""Modeled cost of the MoE kernels on real shapes: trace-only pricing by representative blocks.

Entry point for tools (the autotuner, benchmarks):

    price_kernel(kind, problem, config, target, routing="uniform", may_drop=True)
        -> BlockPricing  (latency_ns, per-engine busy_ns, roofline terms, the check)

prices one launch of the forward ('fwd', `blockwise_mlp.moe_mlp_fwd`, with its combine)
or backward ('bwd', `blockwise_mlp_bwd.moe_mlp_bwd`, with its weight gradients and
combine) expert kernel for `problem` (a bucketed `MoEProblem`, whose `tokens` is the
padded token count the kernel sees) under `config` on `target`. `routing` is 'uniform'
(exactly balanced; the autotuner's "balanced routing"), 'skewed' (see `routing`), or the
used blocks: an int (the backward's fixed plan; for the forward, that many blocks of the
largest size) or, for the forward, a tuple of block counts per size (its sized plan).
`may_drop` is the flag the kernel is launched with; the op always passes True (padded
tokens and capacity drops have no slot), so that is the default. Router kernels are not
included (`price_router`, `price_router_bwd`).

Method. A Mixtral-size forward runs ~13k instructions per block (the backward ~50k) and
T = 16384 tokens make 64+ blocks, so the full trace would take minutes to interpret and
price. Every block of the blockwise kernels issues the same instruction sequence (shapes
are static; only the run-time expert id and token indices differ, and neither changes a
trace record's cost), so a kernel's latency is

    lat(n blocks) = fixed part (prologue, combine over T, per-panel setup) + sum of the
                    blocks' steady-state increments,

exact once the software pipeline reaches its periodic regime. The backward alternates two
buffer sets between consecutive blocks and rotates its strip sets, so its increments
repeat with a period of up to 4 blocks; the forward's at LNC 2 with period 2 (its
programs take alternate blocks; a block added to the program that is behind costs
little; n0 is doubled so that each program is past its first block). The backward is
traced with n0, n0 + 2 and n0 + 4 blocks (n0 = 4) and extrapolated by the mean increment
over those 4 blocks (`extrapolation_check` = |d2 - d1| / d2 of its two 2-block halves);
the forward as described at `price_fwd_kinds`. Used blocks <= n0 + 4 (backward) are
priced exactly. Routing (uniform, skewed) only changes the used blocks.

The forward runs the sized plan: blocks of s = 1 .. B/128 sub-tiles, each size one
device loop. `price_fwd_kinds` prices each size present by its own increment (traces of
n0, n0 + lnc, n0 + 2 lnc blocks all of that size) and adds them per program in plan
order (a test checks a mixed plan against its full trace, within 2 %).

The backward is traced exactly when the full trace is small (`BWD_EXACT_INSTRUCTIONS`;
the 64-expert and Qwen3-MoE-like shapes at 2,048 tokens): its increments are not
periodic on every shape.

The blocks are priced as a static loop; in the op, blocks past the static lower bound run
in device loops whose bodies are the same instruction sequences (block indices are
registers in both).

Training: `moe_mlp`'s backward reads the gate / up its forward saved, so the backward is
priced in that mode (the saved [2I, slots] array among its inputs), and `layer_row`'s
backward rows also price that training forward (`price_fwd_kinds(save=...)`: the same
blocks plus each I tile's gate / up copies and stores, and the holes' zero stores).

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
from .grouping import gate_up_columns, kind_counts, plan_blocks
from .router import moe_router_bwd, moe_router_fwd

# n0: blocks before the first measured increment (the forward's first blocks have no
# weight prefetch ahead of them and its DMA queues settle over ~4 blocks: at the
# fine-grained shape the increments after 2 blocks differ by 18 %, after 4 by < 1 %;
# the backward's first 3 increments are transients where the next block's rows are
# prefetched: from 1 block on, the Qwen3-MoE-like backward was understated by 14 % per
# block)
REPRESENTATIVE_BLOCKS = {"fwd": 4, "bwd": 4}
# the backward's increments repeat with a period of up to 4 blocks (two buffer sets, a
# rotating strip set: at the Qwen3-MoE-like shape 147, 206, 89, 147 us), so it is
# extrapolated by the mean increment over BWD_WINDOW blocks from n0 on
BWD_WINDOW = 4
# ... but not on every shape: the 64-expert shape's increments (gate / up saved) run 208,
# 208, 340, 77, 208, 402, 15 us from block 3 on, so its window of blocks 4-8 gave 257 us
# per block against 208 on most of the full trace (64 blocks: 16.8 ms extrapolated, 13.9
# ms traced). A plan whose full trace stays within this many instructions (the n0
# trace's count per block times the blocks; ~15 s to trace and schedule at that shape)
# is traced exactly
BWD_EXACT_INSTRUCTIONS = 150_000
KINDS = ("fwd", "bwd")


def routing_ids(kind: str, tokens: int, experts: int, top_k: int) -> np.ndarray:
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


routing = routing_ids  # the benchmark's name for it


def used_blocks(ids: np.ndarray, experts: int, block_size: int) -> int:
    """Blocks the plan of this routing uses (weights do not matter)."""
    w = np.full(ids.shape, 1.0 / ids.shape[1], dtype=np.float32)
    return plan_blocks(ids, w, experts, block_size).used_blocks


def used_kinds(ids: np.ndarray, experts: int, block_size: int) -> tuple[int, ...]:
    """Blocks of each size (B/128 sub-tiles first) of the forward's sized plan."""
    w = np.full(ids.shape, 1.0 / ids.shape[1], dtype=np.float32)
    return kind_counts(plan_blocks(ids, w, experts, block_size, sized=True).kind_bounds)


def save_plan(ids: np.ndarray, experts: int, blocks: tuple[int, int]) -> tuple[int, int, int]:
    """(holes, tail column, saved columns) of the training forward's gate / up save for
    this routing:
    forward blocks of blocks[0], the backward's of blocks[1] (`grouping.gate_up_columns`)."""
    w = np.full(ids.shape, 1.0 / ids.shape[1], dtype=np.float32)
    fwd = plan_blocks(ids, w, experts, blocks[0], sized=True)
    bwd = plan_blocks(ids, w, experts, blocks[1])
    _, holes = gate_up_columns(fwd, bwd)
    return int(holes[0, 0]), int(holes[-1, 0]), (holes.shape[0] - 1) * 128


def _fwd_specs(p: MoEProblem, nb: int, block: int) -> tuple[TensorSpec, ...]:
    dt, t, h, i, e, k = p.dtype, p.tokens, p.hidden, p.intermediate, p.experts, p.top_k
    return (
        TensorSpec((t, h), dt),
        TensorSpec((e, h, 2 * i), dt),
        TensorSpec((e, i, h), dt),
        TensorSpec((nb, 128, block // 128), "int32"),
        TensorSpec((nb, 1), "int32"),
        TensorSpec((1, block // 128 + 1), "int32"),
        TensorSpec((t, k), "int32"),
        TensorSpec((t, k), "float32"),
        None,  # inference: nothing saved (the training forward: `price_save`)
        None,
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
        TensorSpec((nb, 1), "int32"),
        TensorSpec((nb, 1), "float32"),
        TensorSpec((1, 1), "int32"),
        TensorSpec((t, k), "int32"),
        TensorSpec((e, h, 2 * i), dt),
        TensorSpec((e, i, h), dt),
        TensorSpec((2 * i, (nb + 2) * block), dt),  # the forward's saved gate / up
    )


@functools.lru_cache(maxsize=256)
def _price(
    kind: str,
    p: MoEProblem,
    cfg: Any,
    blocks: int | tuple[int, ...],
    target: Target,
    may_drop: bool = True,
    lnc: int = 1,
    save: tuple[int, int, int] | None = None,
    transposed: tuple[bool, bool] = (False, False),
) -> Estimate:
    """One trace-only launch: the backward with `blocks` static blocks, the forward with
    `blocks` = its static_kinds (blocks of each size, largest first); `save` = (holes,
    tail column, saved columns): the training forward, gate / up saved (`save_plan`);
    `transposed` (forward): gate/up, down stored as the parameters hold them
    (moe/param_layout.py)."""
    statics: dict[str, Any] = {}
    if kind == "fwd":
        assert isinstance(blocks, tuple)
        nb = sum(blocks)
        specs = _fwd_specs(p, nb, cfg.block_size)
        if any(transposed):  # the storage [E, 2I, H] / [E, H, I]
            e, h, i = p.experts, p.hidden, p.intermediate
            gu = TensorSpec((e, 2 * i, h), p.dtype) if transposed[0] else specs[1]
            dn = TensorSpec((e, h, i), p.dtype) if transposed[1] else specs[2]
            specs = (specs[0], gu, dn, *specs[3:])
            statics["transposed"] = tuple(transposed)
        if save is not None:
            cols = TensorSpec((nb, 1), "int32")
            specs = (*specs[:-2], cols, TensorSpec((save[2] // 128 + 1, 1), "int32"))
            statics["static_holes"] = save[0:2]
        kernel = moe_mlp_fwd
    else:
        assert isinstance(blocks, int)
        nb = blocks
        specs = _bwd_specs(p, nb, cfg.block_size)
        kernel = moe_mlp_bwd
    fields = cfg.to_dict()
    values = fields.values()
    trace = trace_kernel(
        kernel, *specs, blocks, may_drop, *values, target=target, lnc=lnc, **statics
    )
    return estimate_trace(trace, target)


@dataclass(frozen=True)
class BlockPricing:
    """Latency of a blockwise kernel for `blocks` used blocks (extrapolated or exact).

    Engine busy times and the roofline terms are extrapolated the same way as latency.
    """

    latency_ns: float
    per_block_ns: float
    extrapolation_check: float  # |d3 - d1| / d3 of same-parity increments (0 if exact)
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


def price_blocks(
    kind: str,
    p: MoEProblem,
    cfg: Any,
    blocks: int,
    target: Target,
    may_drop: bool = True,
    lnc: int = 1,
    exact_instructions: int = BWD_EXACT_INSTRUCTIONS,
) -> BlockPricing:
    """Modeled latency of the forward ('fwd') or backward ('bwd') kernel with `blocks` used,
    launched as kernel[lnc] (LNC 2: both programs traced, each on its own core);
    `exact_instructions`: the backward's exact-trace budget (`bwd_trace_blocks`)."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {KINDS}; got {kind!r}")
    if kind == "fwd":
        ns = cfg.block_size // 128
        kinds = (blocks,) + (0,) * (ns - 1) if isinstance(blocks, int) else tuple(blocks)
        if len(kinds) != ns or min(kinds) < 0 or sum(kinds) < 1:
            raise ValueError(
                f"blocks: expected a positive int or {ns} block counts (one per size); got "
                f"{blocks!r}"
            )
        return price_fwd_kinds(p, cfg, kinds, target, may_drop, lnc)
    if not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"blocks: expected a positive int; got {blocks!r}")
    n0 = REPRESENTATIVE_BLOCKS["bwd"]
    count = None
    if blocks > n0 + BWD_WINDOW:  # the n0 trace's size decides: exact or extrapolated
        count = _price(kind, p, cfg, n0, target, may_drop, lnc).instructions
    ns = bwd_trace_blocks(blocks, count, exact_instructions)
    est = [_price(kind, p, cfg, n, target, may_drop, lnc) for n in ns]
    if len(ns) == 1:
        e = est[0]
        return BlockPricing(
            e.latency_ns,
            e.latency_ns / blocks,
            0.0,
            True,
            dict(e.busy_ns),
            e.compute_bound_ns,
            e.memory_bound_ns,
        )
    lat = [e.latency_ns for e in est]
    d1, d2 = lat[1] - lat[0], lat[2] - lat[1]
    busy = {k: bwd_extrapolate([e.busy_ns[k] for e in est], blocks) for k in est[2].busy_ns}
    return BlockPricing(
        bwd_extrapolate(lat, blocks),
        (lat[2] - lat[0]) / BWD_WINDOW,
        abs(d2 - d1) / d2 if d2 else 0.0,
        False,
        busy,
        bwd_extrapolate([e.compute_bound_ns for e in est], blocks),
        bwd_extrapolate([e.memory_bound_ns for e in est], blocks),
    )


def bwd_trace_blocks(
    blocks: int, n0_instructions: int | None = None, budget: int = BWD_EXACT_INSTRUCTIONS
) -> list[int]:
    """The block counts the backward is traced with for `blocks` used blocks: [blocks]
    (priced exactly) up to n0 + BWD_WINDOW, or when the n0 trace's `n0_instructions`
    scaled to `blocks` stay within `budget`; else n0, n0 + BWD_WINDOW / 2, n0 + BWD_WINDOW."""
    n0 = REPRESENTATIVE_BLOCKS["bwd"]
    if blocks <= n0 + BWD_WINDOW:
        return [blocks]
    if n0_instructions is not None and n0_instructions * blocks <= budget * n0:
        return [blocks]
    return [n0, n0 + BWD_WINDOW // 2, n0 + BWD_WINDOW]


def bwd_extrapolate(vals: list[float], blocks: int) -> float:
    """A figure of the traces `bwd_trace_blocks(blocks)` taken to `blocks` blocks: the
    last trace plus the mean increment over the window per further block
    (`extrapolation_check` = how far the window's two half-window increments differ)."""
    if len(vals) == 1:
        return vals[0]
    rest = blocks - (REPRESENTATIVE_BLOCKS["bwd"] + BWD_WINDOW)
    return vals[2] + rest * (vals[2] - vals[0]) / BWD_WINDOW


def _estimate_parts(e: Estimate) -> list[float]:
    """latency, compute bound, memory bound, then busy ns per engine (sorted names)."""
    return [e.latency_ns, e.compute_bound_ns, e.memory_bound_ns] + [
        e.busy_ns[k] for k in sorted(e.busy_ns)
    ]


def price_fwd_kinds(
    p: MoEProblem,
    cfg: Any,
    kinds: tuple[int, ...],
    target: Target,
    may_drop: bool = True,
    lnc: int = 1,
    save: tuple[int, int, int] | None = None,
    transposed: tuple[bool, bool] = (False, False),
) -> BlockPricing:
    """The forward with kinds[j] blocks of B/128 - j sub-tiles (the sized plan); `save`
    (`save_plan`): the training forward, every trace with the plan's holes (a fixed cost);
    `transposed`: the weights in the parameters' layouts (`_price`).

    Per size s present: traces of n0, n0 + lnc and n0 + 2 lnc blocks all of size s (n0 =
    4 per program) give its steady-state increment per program-block, inc_s (the last
    one; `extrapolation_check` = the largest |d2 - d1| / d2); the fixed part comes from
    the largest size's n0 trace. Each program's latency = fixed + sum over sizes of its
    blocks of that size (blocks b = p, p + lnc, ... in plan order) * inc_s; the busier
    program's is the launch's. Plans of at most n0 + 2 lnc blocks are traced exactly.
    """
    ns = len(kinds)
    total = sum(kinds)
    n0 = REPRESENTATIVE_BLOCKS["fwd"] * lnc
    if total <= n0 + 2 * lnc:
        e = _price("fwd", p, cfg, tuple(kinds), target, may_drop, lnc, save, transposed)
        return BlockPricing(
            e.latency_ns, e.latency_ns / total, 0.0, True, dict(e.busy_ns),
            e.compute_bound_ns, e.memory_bound_ns,
        )  # fmt: skip

    def only(j: int, n: int) -> tuple[int, ...]:
        return tuple(n if q == j else 0 for q in range(ns))

    present = [j for j in range(ns) if kinds[j]]
    inc: dict[int, list[float]] = {}
    check = 0.0
    fixed: list[float] = []
    names: list[str] = []
    for j in present:
        est = [
            _price("fwd", p, cfg, only(j, n0 + m * lnc), target, may_drop, lnc, save, transposed)
            for m in range(3)
        ]
        parts = [_estimate_parts(e) for e in est]
        d1 = [b - a for a, b in zip(parts[0], parts[1])]
        d2 = [b - a for a, b in zip(parts[1], parts[2])]
        inc[j] = d2
        check = max(check, abs(d2[0] - d1[0]) / d2[0] if d2[0] else 0.0)
        if not fixed:  # the largest size present
            per_prog = n0 // lnc
            fixed = [a - per_prog * d for a, d in zip(parts[0], d2)]
            names = sorted(est[0].busy_ns)
    bounds = np.concatenate([[0], np.cumsum(kinds)])
    best: list[float] = []
    for pid in range(lnc):
        mine = fixed[:]
        for j in present:
            lo, hi = int(bounds[j]), int(bounds[j + 1])
            first = lo + (pid - lo) % lnc
            count = max(0, -(-(hi - first) // lnc))
            mine = [x + count * d for x, d in zip(mine, inc[j])]
        if not best or mine[0] > best[0]:
            best = mine
    busy = dict(zip(names, best[3:]))
    per_block = sum(kinds[j] * inc[j][0] for j in present) / total * lnc
    return BlockPricing(best[0], per_block, check, False, busy, best[1], best[2])


def price_kernel(
    kind: str,
    problem: MoEProblem,
    config: Any,
    target: str | Target,
    routing: str | int = "uniform",
    may_drop: bool = True,
) -> BlockPricing:
    """Modeled cost of one launch of the forward or backward expert kernel (see module doc).

    `routing`: 'uniform', 'skewed' or the number of used blocks; `may_drop`: the kernel's
    flag (True, as the op launches it). Cost: 4 trace-only runs of 4..7 (forward) or
    4, 6 and 8 (backward) blocks, cached per (kind, problem, config, blocks, target, may_drop).
    """
    tgt = get_target(target)
    block = config.block_size
    blocks: int | tuple[int, ...]
    if isinstance(routing, str):
        ids = routing_ids(routing, problem.tokens, problem.experts, problem.top_k)
        if kind == "fwd":
            blocks = used_kinds(ids, problem.experts, block)
        else:
            blocks = used_blocks(ids, problem.experts, block)
    else:
        blocks = routing
    return price_blocks(kind, problem, config, blocks, tgt, may_drop)


def price_router(
    p: MoEProblem, target: Target, logits_dtype: str = "bfloat16", lnc: int = 1
) -> Estimate:
    """Modeled cost of the NKI router on [T, E] logits (softmax, renormalized top-k),
    launched as kernel[lnc]."""
    logits = TensorSpec((p.tokens, p.experts), logits_dtype)
    trace = trace_kernel(moe_router_fwd, logits, p.top_k, "softmax", True, target=target, lnc=lnc)
    return estimate_trace(trace, target)


def price_router_bwd(
    p: MoEProblem, target: Target, logits_dtype: str = "bfloat16", lnc: int = 1
) -> Estimate:
    """Modeled cost of the NKI router backward (d logits from d weights, softmax),
    launched as kernel[lnc]."""
    logits = TensorSpec((p.tokens, p.experts), logits_dtype)
    ids = TensorSpec((p.tokens, p.top_k), "int32")
    dw = TensorSpec((p.tokens, p.top_k), "float32")
    trace = trace_kernel(moe_router_bwd, logits, ids, dw, "softmax", True, target=target, lnc=lnc)
    return estimate_trace(trace, target)


def layer_row(
    shape: MoEShape,
    tokens: int,
    kind: str,
    target: str | Target,
    dtype: str = "bfloat16",
    backward: bool = False,
    lnc: int = 1,
    bands: bool = False,
) -> dict[str, Any]:
    """One benchmark row: modeled forward (router + experts + combine) of one MoE layer;
    with `backward`, also the op's backward: router recompute + expert backward (dgrad,
    weight gradients, combine) + router backward. `lnc` 2: the routers and the expert
    kernels launched as kernel[2] on the whole batch (per logical core).
    `bands`: also `latency_band_ms` (and `bwd_band_ms`), the range of the same pricing
    over the cost model's parameter sets (`perfmodel.band.parameter_sets`)."""
    if lnc not in (1, 2):
        raise ValueError(f"lnc: expected 1 or 2; got {lnc}")
    tgt = get_target(target)
    p = MoEProblem(tokens, shape.hidden, shape.intermediate, shape.num_experts, shape.top_k, dtype)
    cfg = MoEMLPConfig.heuristic(p, tgt)
    ids = routing_ids(kind, tokens, shape.num_experts, shape.top_k)
    kinds = used_kinds(ids, shape.num_experts, cfg.block_size)
    blocks = sum(kinds)
    mlp = price_blocks("fwd", p, cfg, kinds, tgt, lnc=lnc)
    router = price_router(p, tgt, lnc=lnc)
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
        "block_sizes": {str(128 * (len(kinds) - j)): c for j, c in enumerate(kinds) if c},
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
        # training runs the forward that saves gate / up for this backward
        save = save_plan(ids, shape.num_experts, (cfg.block_size, bcfg.block_size))
        train = price_fwd_kinds(p, cfg, kinds, tgt, lnc=lnc, save=save)
        row["train_fwd_ms"] = (train.latency_ns + router.latency_ns) / 1e6
        row["train_fwd_mlp_ms"] = train.latency_ns / 1e6
        row["save_holes"] = save[0]
        bwd = price_blocks("bwd", p, bcfg, bblocks, tgt, lnc=lnc)
        routers = router.latency_ns + price_router_bwd(p, tgt, lnc=lnc).latency_ns
        bwd_ns = bwd.latency_ns + routers
        row["bwd_config"] = bcfg.to_dict()
        row["bwd_blocks"] = bblocks
        row["bwd_ms"] = bwd_ns / 1e6
        row["bwd_mlp_ms"] = bwd.latency_ns / 1e6
        row["bwd_mfu_routed_pct"] = 100.0 * 2 * routed_flops / (bwd_ns * peak)
        row["bwd_busiest_engine"] = bwd.busiest
        row["bwd_active_pct"] = {k: round(v, 1) for k, v in bwd.active_pct.items()}
        row["bwd_extrapolation_check"] = bwd.extrapolation_check
    if bands:
        bwd_plan = (bcfg, bblocks) if backward else None
        row.update(_layer_bands(p, cfg, kinds, tgt, lnc, bwd_plan))
    return row


def _layer_bands(
    p: MoEProblem,
    cfg: Any,
    blocks: tuple[int, ...],
    tgt: Target,
    lnc: int,
    bwd_plan: tuple[Any, int] | None,
) -> dict[str, Any]:
    """The forward's (and, with `bwd_plan` = (backward config, used blocks), the
    backward's) latency band in ms: `layer_row`'s pricing repeated under every parameter
    set of the target's band."""
    from ..perfmodel.band import parameter_sets

    fwd, bwd = [], []
    for t in parameter_sets(tgt):
        router = price_router(p, t, lnc=lnc).latency_ns
        fwd.append(price_blocks("fwd", p, cfg, blocks, t, lnc=lnc).latency_ns + router)
        if bwd_plan is not None:
            b = price_blocks("bwd", p, bwd_plan[0], bwd_plan[1], t, lnc=lnc).latency_ns
            bwd.append(b + router + price_router_bwd(p, t, lnc=lnc).latency_ns)
    out: dict[str, Any] = {"latency_band_ms": [min(fwd) / 1e6, max(fwd) / 1e6]}
    if bwd_plan is not None:
        out["bwd_band_ms"] = [min(bwd) / 1e6, max(bwd) / 1e6]
    return out


def pricing_dict(b: BlockPricing) -> dict[str, Any]:
    """A JSON-ready view of a BlockPricing."""
    return {**asdict(b), "active_pct": b.active_pct, "roofline_bound": b.roofline_bound}
