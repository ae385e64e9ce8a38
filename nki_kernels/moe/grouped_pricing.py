"""Modeled cost of `torch.ops.nki.grouped_mm` and of an MoE layer run through it.

`price_grouped_mm(counts, k, n, target)` prices one forward launch for groups of
`counts[g]` rows (x [sum counts, K] @ W [G, K, N]). Every block of s sub-tiles issues
the same instruction sequence, and a block does not overlap the next (its rows are
gathered and transposed at its start), so

    latency = fixed + sum over block sizes s of  blocks(s) * increment(s),

increment(s) = lat(2 blocks of size s) - lat(1 block), fixed = lat(1) - increment, each
interpreted trace-only with the plan's block counts as static loops (`static_kinds`;
the op runs device loops with the same bodies). At LNC 2 the programs take alternate
blocks of each size: the busier program's ceil(blocks / 2) count.

`moe_layer_rows` compares, per physical core, TorchNeuron's `aten::_grouped_mm` MoE
composition (`baselines.moe_native.grouped_mm_fwd`: router, gathers, the two grouped
GEMMs with 128-row groups, silu * up, combine) with the same composition whose two
GEMMs run on our kernel (what TorchTitan's `_grouped_mm` seam swaps); the other steps
are the native ones in both. Bands: the range over the cost model's parameter sets.
Every figure is "modeled (cost model vN, target)", never a measurement.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..baselines import moe_native
from ..baselines.native import price as price_native
from ..bench.bands import parameter_sets
from ..interp import TensorSpec
from ..perfmodel import COST_MODEL_VERSION, estimate_trace, trace_kernel
from ..targets import Target, get_target
from .group_plan import P, max_blocks, plan_row_blocks
from .grouped_gemm import grouped_mm_fwd

GEMM_STEPS = ("x W_gate_up", "h W_down")  # the native composition's grouped GEMM steps


def tile_config(k: int, n: int, itemsize: int) -> tuple[int, int]:
    """The op's (block_rows, unit_bytes) (ops.grouped_mm.tile_sizes)."""
    from ..ops.grouped_mm import tile_sizes

    return tile_sizes(k, n, itemsize)


@functools.lru_cache(maxsize=512)
def _block_latency(
    kind: int, blocks: int, m: int, k: int, n: int, groups: int, dtype: str, tgt: Target, lnc: int
) -> tuple[float, ...]:
    """ns of `blocks` blocks of kind index `kind` (s = NS - kind), per parameter set
    (`bench.bands.parameter_sets` order: the shipped set first)."""
    rows, unit_bytes = tile_config(k, n, 2 if dtype != "float32" else 4)
    ns = rows // P
    kinds = [0] * (ns + 1)
    kinds[kind] = blocks
    nb = max(1, blocks)
    specs = (
        TensorSpec((m, k), dtype),
        TensorSpec((groups, k, n), dtype),
        TensorSpec((nb, P, ns), "int32"),
        TensorSpec((nb, 1), "int32"),
        TensorSpec((1, ns + 2), "int32"),
    )
    trace = trace_kernel(
        grouped_mm_fwd, *specs, "kn", unit_bytes, tuple(kinds), target=tgt, lnc=lnc
    )
    return tuple(estimate_trace(trace, t).latency_ns for t in parameter_sets(tgt))


@dataclass(frozen=True)
class GroupedPricing:
    """Modeled latency (ns) of one grouped_mm launch, per cost-model parameter set."""

    latency_ns: tuple[float, ...]  # per parameter set, the shipped one first
    blocks: dict[int, int]  # block size in sub-tiles -> blocks
    padded_rows: int


def price_grouped_mm(
    counts: Sequence[int], k: int, n: int, target: str | Target = "trn2",
    dtype: str = "bfloat16", lnc: int = 1,
) -> GroupedPricing:  # fmt: skip
    """One forward launch for groups of counts[g] rows (module docstring)."""
    tgt = get_target(target)
    m = int(sum(counts))
    offs = np.cumsum(np.asarray(counts, dtype=np.int64)).astype(np.int32)
    rows = tile_config(k, n, 2 if dtype != "float32" else 4)[0]
    ns = rows // P
    plan = plan_row_blocks(offs, m, rows)
    bounds = plan.kind_bounds[0]
    per_kind = [int(bounds[j + 1] - bounds[j]) for j in range(ns)]
    g = len(counts)
    assert plan.slot_rows.shape[0] == max_blocks(m, g, rows, tail=True)
    total: list[float] | None = None
    for j, c in enumerate(per_kind):
        if c == 0:
            continue
        one = _block_latency(j, lnc, m, k, n, g, dtype, tgt, lnc)  # 1 per program
        two = _block_latency(j, 2 * lnc, m, k, n, g, dtype, tgt, lnc)  # 2 per program
        incs = [b - a for a, b in zip(one, two)]
        if total is None:
            total = [a - d for a, d in zip(one, incs)]  # the fixed part
        total = [x + math.ceil(c / lnc) * d for x, d in zip(total, incs)]
    blocks = {ns - j: c for j, c in enumerate(per_kind) if c}
    return GroupedPricing(tuple(total or ()), blocks, plan.padded_rows)


@dataclass(frozen=True)
class LayerComparison:
    """Native `_grouped_mm` MoE composition vs the same with our grouped GEMMs (per core)."""

    native_us: float
    ours_us: float
    speedup: float
    speedup_band: tuple[float, float]
    native_gemm_us: float
    ours_gemm_us: float
    label: str


def moe_layer_comparison(
    tokens: int, hidden: int, inter: int, experts: int, counts: Sequence[int],
    target: str = "trn2", dtype: str = "bfloat16",
) -> LayerComparison:  # fmt: skip
    """One physical core's share (`tokens`, `counts`) of an MoE layer forward."""
    tgt = get_target(target)
    steps = moe_native.grouped_mm_fwd(tokens, hidden, inter, experts, dtype, counts)
    gate_up = price_grouped_mm(counts, hidden, 2 * inter, tgt, dtype)
    down = price_grouped_mm(counts, inter, hidden, tgt, dtype)
    ratios = []
    shipped = None
    for idx, t in enumerate(parameter_sets(tgt)):
        nat = price_native(steps, t)
        gemm_native = sum(ns for name, ns in nat.steps if name in GEMM_STEPS)
        ours_gemm = gate_up.latency_ns[idx] + down.latency_ns[idx]
        ours = nat.latency_ns - gemm_native + ours_gemm
        ratios.append(nat.latency_ns / ours)
        if idx == 0:
            shipped = (nat.latency_ns, ours, gemm_native, ours_gemm)
    assert shipped is not None
    nat_ns, ours_ns, gn, go = shipped
    label = f"modeled (cost model {COST_MODEL_VERSION}, {tgt.name})"
    return LayerComparison(
        nat_ns / 1e3, ours_ns / 1e3, nat_ns / ours_ns, (min(ratios), max(ratios)),
        gn / 1e3, go / 1e3, label,
    )  # fmt: skip
