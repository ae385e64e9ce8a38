"""TorchNeuron's native path for each op's plain PyTorch code, modeled step by step.

"Native" is what a Trainium user gets from TorchNeuron without this library, case by
case, as the public sources describe it (FACTS.md part 2; re-read before relying on it):

- `F.scaled_dot_product_attention` on neuron tensors goes to AWS's NKI flash-attention
  kernels (forward and backward) when seq_q and seq_k are multiples of 512, head_dim <=
  128 and there is no dropout and no attn_mask (TorchNeuron's "overrideable" SDPA backend
  tries the flash kernel first); `sdpa_route` states the rule. There the native figure
  is AWS's kernel, priced through the interpreter (`bench.peer`). Elsewhere it falls back
  to the decomposition S = Q K^T -> softmax -> P V (`attention_fwd` / `attention_bwd`),
  every masked tile computed in full, as a dense composition does.
- `aten::_fused_rms_norm` is lowered as one unit: the forward is one fused pass
  (`norm_steps.norm_rows`: x read once, y written once). LayerNorm and the residual-add
  variant are taken to lower the same way (generous). The backward is two fused passes
  with no fp32 intermediate in HBM (see `norm_steps`).
- Dropless MoE: NxD's `forward_blockwise` (aws-neuron/neuronx-distributed @ fbac349b,
  `modules/moe/expert_mlps_v2.py`) and TorchNeuron's `aten::_grouped_mm` (128-aligned
  group offsets); GShard capacity-factor routing, which may drop tokens, is labelled as
  such (`moe_native`).

Every step is a well-tiled NKI kernel (`steps.py`, `norm_steps.py`) priced by the same
cost model as the hand-written kernels, steps separated by an HBM round trip, identical
steps back to back without launch gaps, layouts (transposes) free. On hardware the
baseline is the same PyTorch code under TorchNeuron, measured; that has not been run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..interp import TensorSpec
from ..interp.launch import Kernel
from ..targets import Target, get_target
from . import norm_steps, steps


@dataclass(frozen=True)
class Step:
    """One native step: a kernel launch, repeated `repeat` times with identical shapes."""

    name: str
    kernel: Kernel
    args: tuple[Any, ...]
    repeat: int = 1


def _t(shape: tuple[int, ...], dtype: str) -> TensorSpec:
    return TensorSpec(shape, dtype)


F32 = "float32"


def rms_norm_fwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    x = _t((rows, hidden), dtype)
    w = _t((hidden,), dtype)
    return [Step("fused rms_norm (one pass)", norm_steps.norm_rows, (x, None, w, False, dtype))]


def _norm_bwd(rows: int, hidden: int, dtype: str, centered: bool) -> list[Step]:
    x = _t((rows, hidden), dtype)
    rstd = _t((rows, 1), F32)
    w = _t((hidden,), dtype)
    # dx = rstd * (dy * w - x_hat * c / H) [- mean term]: five element-wise operations,
    # fused into one streaming pass over dy and x (row vector rstd, column vector w)
    dx_ops = 4 if centered else 3
    return [
        Step(
            "c = rowsum(dy w x_hat), dw" + (", db" if centered else "") + " = column sums",
            norm_steps.norm_bwd_reduce,
            (x, x, rstd, w, centered),
        ),
        Step("dx (one streaming pass)", steps.stream_rows, (x, x, rstd, w, 0, dx_ops, dtype)),
    ]


def rms_norm_bwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    return _norm_bwd(rows, hidden, dtype, centered=False)


def layer_norm_fwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    x = _t((rows, hidden), dtype)
    w = _t((hidden,), dtype)
    # nn.LayerNorm / F.layer_norm with weight and bias (our layer_norm rows have both)
    return [
        Step(
            "fused layer_norm (one pass)",
            norm_steps.norm_rows,
            (x, None, w, True, dtype, w, 1e-5),
        )
    ]


def layer_norm_bwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    return _norm_bwd(rows, hidden, dtype, centered=True)


def add_rms_norm_fwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    x = _t((rows, hidden), dtype)
    w = _t((hidden,), dtype)
    return [
        Step(
            "fused x + residual, rms_norm (one pass)", norm_steps.norm_rows, (x, x, w, False, dtype)
        )
    ]


# TorchNeuron's flash-kernel route for SDPA (FACTS.md part 2, TorchNeuron): both lengths
# multiples of 512, head_dim <= 128, no attn_mask tensor, no dropout. is_causal is not a
# mask tensor: causal attention takes the kernel.
SDPA_FLASH_MULTIPLE = 512
SDPA_FLASH_MAX_HEAD_DIM = 128


def sdpa_route(
    seq_q: int, seq_k: int, head_dim: int, attn_mask: bool = False, dropout_p: float = 0.0
) -> str:
    """'aws_flash' where TorchNeuron's SDPA calls AWS's NKI flash kernel, else 'decomposition'."""
    if (
        seq_q % SDPA_FLASH_MULTIPLE == 0
        and seq_k % SDPA_FLASH_MULTIPLE == 0
        and head_dim <= SDPA_FLASH_MAX_HEAD_DIM
        and not attn_mask
        and dropout_p == 0.0
    ):
        return "aws_flash"
    return "decomposition"


def attention_fwd(batch: int, heads: int, sq: int, sk: int, d: int, dtype: str) -> list[Step]:
    n = batch * heads
    return [
        Step("S = Q K^T", steps.matmul_step, (_t((d, sq), dtype), _t((d, sk), dtype), dtype), n),
        Step(
            "P = softmax(S)",
            steps.softmax_rows,
            (_t((sq, sk), dtype), 1.0 / math.sqrt(d), dtype),
            n,
        ),
        Step("O = P V", steps.matmul_step, (_t((sk, sq), dtype), _t((sk, d), dtype), dtype), n),
    ]


def attention_bwd(batch: int, heads: int, sq: int, sk: int, d: int, dtype: str) -> list[Step]:
    n = batch * heads
    s = _t((sq, sk), dtype)
    return [
        Step("dP = dO V^T", steps.matmul_step, (_t((d, sq), dtype), _t((d, sk), dtype), dtype), n),
        Step("D = rowsum(dO * O)", steps.reduce_rows, (_t((sq, d), dtype), False, 1), n),
        Step(
            "dS = P * (dP - D)", steps.stream_rows, (s, s, _t((sq, 1), F32), None, 0, 1, dtype), n
        ),
        Step("dQ = dS K", steps.matmul_step, (_t((sk, sq), dtype), _t((sk, d), dtype), dtype), n),
        Step("dK = dS^T Q", steps.matmul_step, (_t((sq, sk), dtype), _t((sq, d), dtype), dtype), n),
        Step("dV = P^T dO", steps.matmul_step, (_t((sq, sk), dtype), _t((sq, d), dtype), dtype), n),
    ]


@dataclass(frozen=True)
class NativeEstimate:
    """Modeled latency of a native composition: the sum of its steps' modeled latencies."""

    latency_ns: float
    flops: float
    hbm_bytes: float
    steps: tuple[tuple[str, float], ...]  # (step name, modeled ns including repeats)
    target: str
    cost_model: str

    @property
    def label(self) -> str:
        return f"modeled (cost model {self.cost_model}, {self.target})"


def price(step_list: list[Step], target: str | Target) -> NativeEstimate:
    """Price every step trace-only with the cost model and add them up (launches run
    back to back: an HBM round trip separates steps, nothing overlaps across them)."""
    from ..perfmodel import COST_MODEL_VERSION, estimate

    total = flops = nbytes = 0.0
    parts = []
    for st in step_list:
        est = estimate(st.kernel, *st.args, target=target)
        ns = est.latency_ns * st.repeat
        total += ns
        flops += est.flops * st.repeat
        nbytes += (est.hbm_read_bytes + est.hbm_write_bytes) * st.repeat
        parts.append((st.name, ns))
    name = get_target(target).name
    return NativeEstimate(total, flops, nbytes, tuple(parts), name, COST_MODEL_VERSION)
