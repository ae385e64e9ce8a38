"""Modeled cost of `moe_gated_experts`' dispatch and combine (`row_gather.py`).

One physical core's share of the layer forward (`tokens` tokens, top-k), bf16 rows:
the dispatch is `gather_rows_sum` over the R = T k sorted rows (k = 1: a pure row
gather), the combine `gather_rows_sum` over the T tokens (k weighted rows each, fp32
out). Both are bandwidth work: the figure that says how good they are is the modeled
fraction of HBM bandwidth (MBU) on the bytes they must move, not a ratio against a
native composition (whose per-group gathers `baselines.moe_native` prices as separate
launches, which would flatter ours).

Band: the range over the cost model's parameter sets widened by its structural error;
every figure "modeled (cost model vN, target)", never a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..interp import TensorSpec
from ..interp.trace import Trace
from ..perfmodel import COST_MODEL_VERSION, estimate_trace, trace_kernel
from ..perfmodel.band import band
from ..targets import Target, get_target
from .row_gather import gather_rows_sum


@dataclass(frozen=True)
class GatherPrice:
    """One launch: modeled us (band) and MBU (fraction of HBM bandwidth)."""

    name: str
    us: float
    us_band: tuple[float, float]
    mbu: float
    hbm_mb: float
    label: str


def _price(name: str, trace: Trace, target: Target) -> GatherPrice:
    est = estimate_trace(trace, target)
    lo, hi = band(trace, target)
    return GatherPrice(
        name, est.latency_ns / 1e3, (lo / 1e3, hi / 1e3), est.mbu, est.hbm_bytes / 1e6,
        f"modeled (cost model {COST_MODEL_VERSION}, {est.target})",
    )  # fmt: skip


def price_dispatch_combine(
    tokens: int, hidden: int, top_k: int, target: str = "trn2", dtype: str = "bfloat16"
) -> tuple[GatherPrice, GatherPrice]:
    """(dispatch, combine) of one core's share (see the module docstring)."""
    tgt = get_target(target)
    dispatch, combine = dispatch_combine_traces(tokens, hidden, top_k, tgt, dtype)
    return _price("dispatch", dispatch, tgt), _price("combine", combine, tgt)


def dispatch_combine_traces(
    tokens: int, hidden: int, top_k: int, tgt: Target, dtype: str = "bfloat16"
) -> tuple[Trace, Trace]:
    """The traces of the dispatch and of the combine launch (one core's share)."""
    rows = tokens * top_k
    dispatch = trace_kernel(
        gather_rows_sum, TensorSpec((tokens, hidden), dtype), TensorSpec((rows, 1), "int32"),
        None, dtype, target=tgt,
    )  # fmt: skip
    combine = trace_kernel(
        gather_rows_sum, TensorSpec((rows, hidden), dtype), TensorSpec((tokens, top_k), "int32"),
        TensorSpec((tokens, top_k), "float32"), "float32", target=tgt,
    )  # fmt: skip
    return dispatch, combine
