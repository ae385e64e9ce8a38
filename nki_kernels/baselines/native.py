"""Native-lowering models: each op's plain PyTorch composition as a sequence of steps.

Without hardware, "what the compiler does with the plain PyTorch composition" is modeled
as that composition's unfused steps (`steps.py`), each a well-tiled kernel with an HBM
round trip in between, priced by the same cost model as the hand-written kernels. The
model is deliberately generous to the compiler: element-wise chains fuse into one
streaming step, layouts (transposes) are free, and identical per-head / per-expert steps
run back to back with no launch gaps. On hardware the baseline is instead the reference
module under `torch.compile(backend="neuron")`, measured.

Compositions (forward unless noted):
- rms_norm: row reduction (sum of squares) -> scale step (x * rstd * w).
- rms_norm backward: u = dy * x * rstd -> dw = column sum of u (matmul with ones) ->
  c = row sum of u * w -> dx = stream(dy, x, rstd, c, w).
- layer_norm: row statistics (mean, var) -> scale-shift step; backward as rms_norm plus
  a column sum for dbias.
- add_rms_norm: add step (writes x + residual) -> rms_norm on the sum.
- attention (per batch x query head): S = Q K^T -> softmax(scale * S, masked) -> O = P V.
  Masked (causal / window) tiles are computed in full, as a dense composition does.
- attention backward (per batch x query head, P saved): dP = dO V^T; dS = P * (dP - D);
  dQ = dS K; dK = dS^T Q; dV = P^T dO.
- moe_mlp: softmax over router logits and top-k -> per expert: gather its tokens (static
  capacity C = ceil(capacity_factor * T * k / E), GShard style, 1.25 by default) ->
  gate/up matmul -> SwiGLU step -> down matmul -> weighted combine (gather + add + scatter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..interp import TensorSpec
from ..interp.launch import Kernel
from . import steps


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
    return [
        Step("sum of squares", steps.reduce_rows, (x, True, 1)),
        Step(
            "x * rstd * w",
            steps.stream_rows,
            (x, None, _t((rows, 1), F32), _t((hidden,), dtype), 0, 1, dtype),
        ),
    ]


def rms_norm_bwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    x = _t((rows, hidden), dtype)
    u = _t((rows, hidden), F32)
    return [
        Step("u = dy * x * rstd", steps.stream_rows, (x, x, _t((rows, 1), F32), None, 0, 1, F32)),
        Step("dw = colsum(u)", steps.matmul_step, (_t((rows, 1), F32), u, F32)),
        Step("c = rowsum(u * w)", steps.reduce_rows, (u, False, 1)),
        Step(
            "dx", steps.stream_rows, (x, x, _t((rows, 1), F32), _t((hidden,), dtype), 0, 3, dtype)
        ),
    ]


def layer_norm_fwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    x = _t((rows, hidden), dtype)
    return [
        Step("mean, var", steps.reduce_rows, (x, False, 2)),
        Step(
            "(x - mean) * rstd * w + b",
            steps.stream_rows,
            (x, None, _t((rows, 1), F32), _t((hidden,), dtype), 0, 2, dtype),
        ),
    ]


def layer_norm_bwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    return [
        *rms_norm_bwd(rows, hidden, dtype),
        Step(
            "db = colsum(dy)",
            steps.matmul_step,
            (_t((rows, 1), dtype), _t((rows, hidden), dtype), F32),
        ),
    ]


def add_rms_norm_fwd(rows: int, hidden: int, dtype: str) -> list[Step]:
    x = _t((rows, hidden), dtype)
    return [
        Step("s = x + residual", steps.stream_rows, (x, x, None, None, 0, 0, dtype)),
        *rms_norm_fwd(rows, hidden, dtype),
    ]


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


def moe_capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def moe_fwd(
    tokens: int,
    hidden: int,
    inter: int,
    experts: int,
    top_k: int,
    dtype: str,
    capacity_factor: float = 1.25,
) -> list[Step]:
    c = moe_capacity(tokens, experts, top_k, capacity_factor)
    idx = _t((c, 1), "int32")
    return [
        Step("router softmax", steps.softmax_rows, (_t((tokens, experts), F32), 1.0, F32)),
        Step("top-k", steps.reduce_rows, (_t((tokens, experts), F32), False, 2)),
        Step("gather tokens", steps.gather_rows, (_t((tokens, hidden), dtype), idx), experts),
        Step(
            "x W_gate_up",
            steps.matmul_step,
            (_t((hidden, c), dtype), _t((hidden, 2 * inter), dtype), dtype),
            experts,
        ),
        Step(
            "silu(g) * u",
            steps.stream_rows,
            (_t((c, inter), dtype), _t((c, inter), dtype), None, None, 1, 1, dtype),
            experts,
        ),
        Step(
            "h W_down",
            steps.matmul_step,
            (_t((inter, c), dtype), _t((inter, hidden), dtype), dtype),
            experts,
        ),
        Step("gather out rows", steps.gather_rows, (_t((tokens, hidden), dtype), idx), experts),
        Step(
            "out += w * y",
            steps.stream_rows,
            (_t((c, hidden), dtype), _t((c, hidden), dtype), _t((c, 1), F32), None, 0, 0, dtype),
            experts,
        ),
        Step("scatter out rows", steps.gather_rows, (_t((c, hidden), dtype), idx), experts),
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


def price(step_list: list[Step], target: str) -> NativeEstimate:
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
    return NativeEstimate(total, flops, nbytes, tuple(parts), target, COST_MODEL_VERSION)
