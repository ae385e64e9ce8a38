"""Native's dropless MoE forward at decode on a logical core of several physical cores.

At decode (at most `ops.moe_decode.DECODE_MAX_TOKENS` tokens) a core's time is mostly
the expert weights it streams, so how the compiler splits the composition across the
LNC's cores decides native's figure. Two lowerings of `baselines.moe_native`'s
compositions (`_grouped_mm`, and NxD's blockwise for completeness), per core:

- token split: each core routes ceil(T / lnc) of the tokens through the composition on
  whole experts, so each core streams every expert its tokens touch (the split the
  op-level benchmark uses for every composition, `bench.compare.LNC2_METHOD`);
- weight split: each core runs all T tokens through the composition on ceil(I / lnc) of
  each touched expert's intermediate columns (its gate / up columns and the matching
  rows of the down projection), so each core streams about 1 / lnc of the touched
  weights; the down projection then leaves a partial sum of the output [T, H] on each
  core, and each core adds the other cores' partials into its 1 / lnc of the output
  columns (one streaming pass per other core over [T, ceil(H / lnc)], the partials read
  from shared HBM, where the composition's scatter wrote them). The partials are in the
  output dtype, as a tensor-parallel row-split linear reduces its output (the cheaper
  choice, so the one favourable to native); the barrier between the cores is not priced.
  The router runs on all T tokens on each core (both need the routing).

The weight split is what the ledger's own decode matmuls assume (`trainium.matmul` splits
weight columns at a small batch), and AWS's MLP kernel picks it for small token counts in
some shapes (aws-neuron/nki-library, `core/mlp/mlp_cte/mlp_cte_sharding.py`,
`calculate_sharding`: shard on the intermediate dimension at two workers when batch x
sequence <= 256 and H >= 7168, I >= 1024, or whenever I > 4096). Which one a compiler
picks for the plain PyTorch code is not public, so the ledger prices native's decode MoE
as the faster of the lowerings, per parameter set: the one most favourable to native.
Every step is a well-tiled native step (`baselines.steps`), priced by `native.price`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..baselines import moe_native, native, steps
from ..baselines.native import Step
from ..dtypes import dtype_bytes
from ..interp import TensorSpec

TOKEN_SPLIT, WEIGHT_SPLIT = "token split", "weight split"


def _per_core(n: int, lnc: int) -> int:
    return -(-n // lnc)


def partial_sum_reduction(tokens: int, hidden: int, dtype: str, lnc: int) -> list[Step]:
    """Each core's share of adding the lnc partial outputs: its ceil(H / lnc) columns,
    one streaming add per other core's partial."""
    if lnc < 2:
        return []
    x = TensorSpec((tokens, _per_core(hidden, lnc)), dtype)
    return [
        Step(
            "out = sum of the cores' partial outputs (own columns)",
            steps.stream_rows,
            (x, x, None, None, 0, 0, dtype),
            lnc - 1,
        )
    ]


def lowerings(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype: str,
    lnc: int,
    counts: Sequence[int],
    part_counts: Sequence[int],
) -> dict[str, list[Step]]:
    """One core's steps under each lowering, named "<split>, <composition>". `counts`:
    routed rows per expert of all `tokens`; `part_counts`: of the first ceil(T / lnc)."""
    part = _per_core(tokens, lnc)
    out = {
        f"{TOKEN_SPLIT}, _grouped_mm": moe_native.grouped_mm_fwd(
            part, hidden, inter, experts, dtype, part_counts
        ),
        f"{TOKEN_SPLIT}, NxD blockwise": moe_native.blockwise_fwd(
            part, hidden, inter, experts, top_k, dtype
        ),
    }
    if lnc < 2:
        return out
    cols = _per_core(inter, lnc)
    reduce = partial_sum_reduction(tokens, hidden, dtype, lnc)
    out[f"{WEIGHT_SPLIT}, _grouped_mm"] = [
        *moe_native.grouped_mm_fwd(tokens, hidden, cols, experts, dtype, counts),
        *reduce,
    ]
    out[f"{WEIGHT_SPLIT}, NxD blockwise"] = [
        *moe_native.blockwise_fwd(tokens, hidden, cols, experts, top_k, dtype),
        *reduce,
    ]
    return out


def weight_bytes(step_list: Sequence[Step]) -> int:
    """Bytes of expert weights the steps' matmuls read (their second operand), repeats
    included: what a core streams from HBM for the experts."""
    total = 0
    for st in step_list:
        if st.kernel is steps.matmul_step:
            b = st.args[1]
            total += math.prod(b.shape) * dtype_bytes(b.dtype) * st.repeat
    return total


def price_lowerings(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype: str,
    lnc: int,
    counts: Sequence[int],
    part_counts: Sequence[int],
    target: object,
) -> dict[str, float]:
    """us of one core under each lowering (`lowerings`) on `target`."""
    built = lowerings(tokens, hidden, inter, experts, top_k, dtype, lnc, counts, part_counts)
    return {name: native.price(st, target).latency_ns / 1e3 for name, st in built.items()}


def decode_us(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype: str,
    lnc: int,
    target: object,
) -> float:
    """us of one core under the fastest lowering on `target` (one parameter set), the
    tokens routed as the benchmark's uniform routing (`bench.compare.expert_counts`)."""
    from ..bench.compare import expert_counts

    counts = expert_counts("uniform", tokens, experts, top_k)
    part = expert_counts("uniform", _per_core(tokens, lnc), experts, top_k)
    got = price_lowerings(tokens, hidden, inter, experts, top_k, dtype, lnc, counts, part, target)
    return min(got.values())
