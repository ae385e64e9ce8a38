"""MoE experts with the options of 2026's models, composed on `torch.ops.nki.grouped_mm`.

    moe_gated_experts(hidden [T, H], weights [T, k], ids [T, k], w_gate_up [E, H, 2I],
                      w_down [E, I, H], *, b_gate_up [E, 2I] = None, b_down [E, H] = None,
                      activation = "swiglu" | "geglu" | "gpt_oss", interleaved = False,
                      alpha = 1.702, limit = 7.0, shared_gate_up [H, 2Is] = None,
                      shared_down [Is, H] = None, shared_gate [H] = None,
                      shared_up [H, Is] = None) -> [T, H]

    out[t] = sum_j weights[t, j] * (act(x_t W_gu[e] + b_gu[e]) W_d[e] + b_d[e]),  e = ids[t, j]
           + sigmoid(x_t . shared_gate) * act(x_t S_gu) S_d      (shared expert; ungated: 1)

The pieces (each differentiable, each traceable by `torch.compile(fullgraph=True)`):

- dispatch: the T * k assignments sorted by expert (a stable sort: ties keep token
  order), `offs` = cumulative counts (torch ops on T * k ids); the token rows gathered
  in that order by `torch.ops.nki.moe_dispatch` (NKI row gather, `moe/row_gather.py`);
- the two expert matmuls: `torch.ops.nki.grouped_mm` (NKI; 128-row-granular blocks, empty
  experts cost nothing) -- the weights may be transposed views (transformers' [E, 2I, H]
  parameters pass `.transpose(1, 2)` without a copy);
- `torch.ops.nki.expert_act` (NKI, `moe/expert_act.py`): per-expert bias + the gated
  activation between them, and the down bias after the second (activation "none");
  backward: `expert_act_backward` (NKI) for d h, the bias gradient as the per-expert row
  sum of d h on grouped_mm's weight-gradient kernel (d b[e] = 1^T dh_e);
- combine: out[t] = sum_j w[t, j] y[slot(t, j)] in fp32 by `torch.ops.nki.moe_combine`
  (NKI: each token's k rows gathered and summed with their weights), one rounding at the
  end (after the shared expert); backward: the other direction's gathers (NKI);
- shared expert: the same kernels with one group of all T rows (not fused into the routed
  launches: a separate pair of grouped_mm calls); its sigmoid gate's logits [T, 1] are a
  one-group grouped_mm too. `shared_up` [H, Is] gives the up projection as a tensor of
  its own (nn.Linear modules: gate_proj.weight.t(), up_proj.weight.t(), down_proj.weight.t()),
  shared_gate_up then being the gate's [H, Is] alone. Gate and up apart (`w_up`,
  `shared_up`): the decode launch and, without gradients, the composition read each where
  it lies (one grouped_mm per weight, the [R, I] halves joined: no weight copy); with
  gradients the composition joins the weights (torch.cat, a copy per call), since
  grouped_mm's d x contracts gate and up in one fp32 sum.

Decode sizes: T <= 64 without gradients (no input requiring one, or grad mode off) is one
launch of the decode MoE kernel instead (`torch.ops.nki.moe_gated_decode`, forward only,
`moe/decode_mlp.py`), the shared expert fused into it; a call that needs gradients runs
the composition above, whose kernels keep what its backward reads.

An id equal to E marks a slot whose expert is not on this rank (transformers' expert-
parallel mask value, `distributed/expert_parallel.py`): its row is selected away before
the experts and after them, so it contributes nothing, whatever its weight (NaN too),
and gets no gradient.

GPT-OSS: activation "gpt_oss" (gate clamped above at `limit`, up to [-limit, limit],
(up + 1) * gate * sigmoid(alpha * gate): transformers' GptOssExperts._apply_gate) with
interleaved (gate, up) columns and both biases. A NaN / Inf in a token stays in its row
(and in the gradients of the experts it was routed to).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..moe.expert_act import ACTIVATIONS, expert_act_bwd, expert_act_fwd
from ..runtime import launch, pad_to_bucket, unpad
from ..targets import get_target
from . import moe_dispatch  # noqa: F401  (registers moe_dispatch / moe_combine)
from .checks import FLOAT_DTYPES, check_is_tensor, check_tensor
from .moe_decode import DECODE_MAX_TOKENS, decode_gated_experts
from .registry import define_op, tracing

GATED = tuple(a for a in ACTIVATIONS if a != "none")
MAX_EXPERTS, MAX_TOP_K = 512, 16


# ---- expert_act ---------------------------------------------------------------------------
def _check_options(activation: str, interleaved: bool, alpha: float, limit: float) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}; got {activation!r}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved: expected a bool; got {interleaved!r}")
    for arg, v in (("alpha", alpha), ("limit", limit)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise TypeError(f"{arg}: expected a finite number; got {v!r}")
    if activation == "gpt_oss" and not limit > 0:
        raise ValueError(f"limit: expected > 0 for activation 'gpt_oss'; got {limit}")


def _check_act(
    h: Tensor,
    bias: Tensor | None,
    offs: Tensor,
    activation: str,
    interleaved: bool,
    alpha: float,
    limit: float,
) -> None:
    _check_options(activation, interleaved, alpha, limit)
    check_tensor("h", h, dtypes=FLOAT_DTYPES, min_dim=2, nonempty=False)
    if h.dim() != 2:
        raise ValueError(f"h: expected 2 dims [M, N]; got {tuple(h.shape)}")
    if activation != "none" and h.shape[1] % 2:
        raise ValueError(f"h: expected an even width 2I (gate and up); got {h.shape[1]}")
    check_tensor("offs", offs, dtypes=(torch.int32,), min_dim=1)
    if offs.dim() != 1:
        raise ValueError(f"offs: expected 1 dim [G]; got {tuple(offs.shape)}")
    if bias is not None:
        check_tensor("bias", bias, dtypes=FLOAT_DTYPES, min_dim=2)
        expected = (offs.shape[0], h.shape[1])
        if tuple(bias.shape) != expected:
            raise ValueError(
                f"bias: expected [G, N] = {expected} (G from offs, N from h); got "
                f"{tuple(bias.shape)}"
            )
        if bias.dtype != h.dtype:
            raise TypeError(f"bias: expected dtype {h.dtype} (as h); got {bias.dtype}")
    for arg, t in (("bias", bias), ("offs", offs)):
        if t is not None and t.device != h.device:
            raise ValueError(f"{arg}: expected device {h.device} (as h); got {t.device}")


def _width(h: Tensor, activation: str) -> int:
    return h.shape[1] if activation == "none" else h.shape[1] // 2


def _row_group(offs: Tensor, rows: int) -> Tensor:
    """[rows, 1] int32: the group of each row (rows past offs[-1]: the last group's)."""
    r = torch.arange(rows, dtype=torch.int32, device=offs.device)
    g = torch.searchsorted(offs, r, right=True)
    return g.clamp(max=offs.shape[0] - 1).to(torch.int32).unsqueeze(1)


def _act_launch(kernel: Any, tensors: tuple[Any, ...], *options: Any) -> Tensor:
    activation, interleaved, alpha, limit = options
    return launch(
        kernel,
        *tensors,
        target=get_target(None),
        activation=activation,
        interleaved=interleaved,
        alpha=float(alpha),
        limit=float(limit),
    )


def _act_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    h, bias, offs, *options = inputs
    ctx.save_for_backward(h, bias, offs)
    ctx.options = options


def _act_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    h, bias, offs = ctx.saved_tensors
    activation = ctx.options[0]
    dy = grad.to(h.dtype)
    if activation == "none":
        dh = dy.contiguous()
    else:
        dh = torch.ops.nki.expert_act_backward(dy, h, bias, offs, *ctx.options)
    db = None
    if bias is not None and ctx.needs_input_grad[1]:
        ones = torch.ones((h.shape[0], 1), dtype=h.dtype, device=h.device)
        db = torch.ops.nki.grouped_mm_weight_grad(ones, dh, offs)[:, 0, :]
    return dh if ctx.needs_input_grad[0] else None, db, None, None, None, None, None


def _act_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    h = torch.randn(37, 16, generator=g, requires_grad=True)
    b = torch.randn(3, 16, generator=g, requires_grad=True)
    offs = torch.tensor([10, 10, 37], dtype=torch.int32)
    return [
        ((h, b, offs, "gpt_oss", True, 1.702, 7.0), {}),
        ((h, None, offs, "swiglu", False, 1.0, 1.0), {}),
        ((h, b, offs, "none", False, 1.0, 1.0), {}),
    ]


@define_op(
    "expert_act",
    fake=lambda h, bias, offs, activation, *a: h.new_empty((h.shape[0], _width(h, activation))),
    validate=_check_act,
    backward=_act_backward,
    setup_context=_act_setup,
    examples=_act_examples,
    traceable=True,
)
def expert_act(
    h: Tensor,
    bias: Tensor | None,
    offs: Tensor,
    activation: str,
    interleaved: bool,
    alpha: float,
    limit: float,
) -> Tensor:
    """act(h + bias[group of row]) on rows sorted by group (grouped_mm's offs) (NKI)."""
    m = h.shape[0]
    if m == 0:
        return h.new_zeros((0, _width(h, activation)))
    hp, _ = pad_to_bucket(h.detach(), 0)
    rg = _row_group(offs, hp.shape[0])
    b = None if bias is None else bias.detach().contiguous()
    opts = (activation, interleaved, alpha, limit)
    out = _act_launch(expert_act_fwd, (hp.contiguous(), b, rg), *opts)
    return unpad(out, 0, m).contiguous()


@define_op(
    "expert_act_backward",
    fake=lambda grad, h, *a: torch.empty_like(h),
    validate=lambda grad, *a: _check_act(*a),
    examples=lambda: [
        ((torch.randn(37, 8), *(x.detach() if isinstance(x, Tensor) else x for x in e[0])), {})
        for e in _act_examples()[:2]
    ],
    traceable=True,
)
def expert_act_backward(
    grad: Tensor,
    h: Tensor,
    bias: Tensor | None,
    offs: Tensor,
    activation: str,
    interleaved: bool,
    alpha: float,
    limit: float,
) -> Tensor:
    """d h of a gated `expert_act` (NKI); d bias is the per-group row sum of it."""
    if activation == "none":
        raise ValueError("activation: expected a gated activation for the backward; got 'none'")
    m = h.shape[0]
    if m == 0:
        return torch.zeros_like(h)
    hp, _ = pad_to_bucket(h.detach(), 0)
    gp, _ = pad_to_bucket(grad.detach().to(h.dtype), 0)
    rg = _row_group(offs, hp.shape[0])
    b = None if bias is None else bias.detach().contiguous()
    opts = (activation, interleaved, alpha, limit)
    dh = _act_launch(expert_act_bwd, (hp.contiguous(), b, rg, gp.contiguous()), *opts)
    return unpad(dh, 0, m).contiguous()


# ---- the expert layer ---------------------------------------------------------------------
def _check_layer(
    hidden: Tensor, weights: Tensor, ids: Tensor, w_gate_up: Tensor, w_down: Tensor,
    w_up: Tensor | None = None,
) -> None:  # fmt: skip
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES, min_dim=2)
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected 2 dims [T, H]; got {tuple(hidden.shape)}")
    t, h = hidden.shape
    check_tensor("weights", weights, dtypes=FLOAT_DTYPES, min_dim=2)
    check_tensor("ids", ids, dtypes=(torch.int32, torch.int64), min_dim=2)
    if ids.dim() != 2 or ids.shape[0] != t or tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(
            f"weights / ids: expected [T={t}, k] each (T from hidden); got "
            f"{tuple(weights.shape)} / {tuple(ids.shape)}"
        )
    named = (("w_gate_up", w_gate_up), ("w_down", w_down), ("w_up", w_up))
    for arg, w in ((a, w) for a, w in named if w is not None):
        check_tensor(arg, w, dtypes=FLOAT_DTYPES, min_dim=3)
        if w.dim() != 3 or w.dtype != hidden.dtype:
            raise ValueError(
                f"{arg}: expected 3 dims of dtype {hidden.dtype} (as hidden); got "
                f"{tuple(w.shape)} {w.dtype}"
            )
    e = w_gate_up.shape[0]
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(f"w_gate_up: expected E (dim 0) in 1..{MAX_EXPERTS}; got {e}")
    if not 1 <= ids.shape[1] <= min(MAX_TOP_K, e):
        raise ValueError(f"ids: expected 1..{min(MAX_TOP_K, e)} columns; got {ids.shape[1]}")
    if w_up is not None:  # the gate's and the up's weights apart
        if w_gate_up.shape[1] != h:
            raise ValueError(
                f"w_gate_up: expected the gate's [E, H={h}, I] (w_up given); got "
                f"{tuple(w_gate_up.shape)}"
            )
        if w_up.shape != w_gate_up.shape:
            raise ValueError(
                f"w_up: expected [E, H, I] = {tuple(w_gate_up.shape)} (as w_gate_up); got "
                f"{tuple(w_up.shape)}"
            )
        i = w_gate_up.shape[2]
    elif w_gate_up.shape[1] != h or w_gate_up.shape[2] % 2:
        raise ValueError(f"w_gate_up: expected [E, H={h}, 2I]; got {tuple(w_gate_up.shape)}")
    else:
        i = w_gate_up.shape[2] // 2
    if tuple(w_down.shape) != (e, i, h):
        raise ValueError(f"w_down: expected [E, I, H] = {(e, i, h)}; got {tuple(w_down.shape)}")
    if not torch.compiler.is_compiling() and not tracing(ids) and ids.numel():  # eager only
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi > e:
            raise ValueError(
                f"ids: expected expert ids in [0, {e}] ({e}: not on this rank); got min {lo}, "
                f"max {hi}"
            )


def _check_shared(
    hidden: Tensor, gu: Tensor | None, down: Tensor | None, gate: Tensor | None,
    up: Tensor | None = None,
) -> None:  # fmt: skip
    if (gu is None) != (down is None) or ((gate is not None or up is not None) and gu is None):
        named = (("shared_gate_up", gu), ("shared_down", down), ("shared_gate", gate),
                 ("shared_up", up))  # fmt: skip
        given = [n for n, t in named if t is not None]
        raise ValueError(
            "shared_gate_up / shared_down: give both (and shared_gate / shared_up only with "
            f"them); got {', '.join(given)}"
        )
    if gu is None or down is None:
        return
    h = hidden.shape[1]
    if up is None:
        if gu.dim() != 2 or gu.shape[0] != h or gu.shape[1] % 2 or gu.dtype != hidden.dtype:
            raise ValueError(
                f"shared_gate_up: expected [H={h}, 2Is] of dtype {hidden.dtype}; got "
                f"{tuple(gu.shape)} {gu.dtype}"
            )
        si = gu.shape[1] // 2
    else:
        if gu.dim() != 2 or gu.shape[0] != h or gu.dtype != hidden.dtype:
            raise ValueError(
                f"shared_gate_up: expected the gate's [H={h}, Is] (shared_up given) of dtype "
                f"{hidden.dtype}; got {tuple(gu.shape)} {gu.dtype}"
            )
        si = gu.shape[1]
        if tuple(up.shape) != (h, si) or up.dtype != hidden.dtype:
            raise ValueError(
                f"shared_up: expected [H, Is] = {(h, si)} of dtype {hidden.dtype} (as "
                f"shared_gate_up); got {tuple(up.shape)} {up.dtype}"
            )
    if tuple(down.shape) != (si, h) or down.dtype != hidden.dtype:
        raise ValueError(
            f"shared_down: expected [Is, H] = {(si, h)} of dtype {hidden.dtype}; "
            f"got {tuple(down.shape)} {down.dtype}"
        )
    if gate is not None and (tuple(gate.shape) != (h,) or gate.dtype != hidden.dtype):
        raise ValueError(
            f"shared_gate: expected [H={h}] of dtype {hidden.dtype}; got "
            f"{tuple(gate.shape)} {gate.dtype}"
        )


def _mlp(
    x: Tensor, offs: Tensor, w_gu: Tensor, w_d: Tensor, b_gu: Any, b_d: Any, o: tuple,
    w_up: Tensor | None = None,
) -> Tensor:  # fmt: skip
    """act(x W_gu + b_gu) W_d + b_d per group (rows sorted by group). `w_up`: the up
    weight apart (w_gu then the gate's), each read where it lies by its own grouped_mm;
    a column of x W depends on that column's weights only, so [x W_g, x W_u] is x W_gu
    bit for bit."""
    h = torch.ops.nki.grouped_mm(x, w_gu, offs)
    if w_up is not None:
        h = torch.cat([h, torch.ops.nki.grouped_mm(x, w_up, offs)], dim=1)
    a = torch.ops.nki.expert_act(h, b_gu, offs, *o)
    y = torch.ops.nki.grouped_mm(a, w_d, offs)
    if b_d is not None:
        y = torch.ops.nki.expert_act(y, b_d, offs, "none", False, 1.0, 1.0)
    return y


def moe_gated_experts(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    *,
    b_gate_up: Tensor | None = None,
    b_down: Tensor | None = None,
    activation: str = "swiglu",
    interleaved: bool = False,
    alpha: float = 1.702,
    limit: float = 7.0,
    shared_gate_up: Tensor | None = None,
    shared_down: Tensor | None = None,
    shared_gate: Tensor | None = None,
    shared_up: Tensor | None = None,
    w_up: Tensor | None = None,
) -> Tensor:
    """[T, H]: the routed experts (with biases and the chosen activation) plus the shared
    expert; see the module docstring. T <= 64 without gradients: one decode launch."""
    args = (hidden, weights, ids, w_gate_up, w_down, b_gate_up, b_down,
            shared_gate_up, shared_down, shared_gate)  # fmt: skip
    _check_gated(*args, activation, interleaved, alpha, limit, shared_up, w_up)
    t, k = ids.shape
    e = w_gate_up.shape[0]
    grad = _needs_grad((*args, shared_up, w_up))
    if t <= DECODE_MAX_TOKENS and not grad:
        out = torch.ops.nki.moe_gated_decode(
            *args, activation, interleaved, alpha, limit, shared_up, w_up
        )
        return out.to(hidden.dtype)  # under autocast the op returns the autocast dtype
    if grad:
        # d hidden contracts gate and up in one fp32 sum (grouped_mm's backward on the
        # joined weight); two grouped_mm calls would round each half first: joined here
        if w_up is not None:
            w_gate_up, w_up = torch.cat([w_gate_up, w_up], dim=2), None
        if shared_up is not None and shared_gate_up is not None:
            shared_gate_up, shared_up = torch.cat([shared_gate_up, shared_up], dim=1), None
    opts = (activation, interleaved, float(alpha), float(limit))
    flat = ids.reshape(-1).to(torch.int64)
    order = torch.argsort(flat, stable=True)  # id E (not on this rank) sorts to the tail
    counts = torch.zeros(e + 1, dtype=torch.int64, device=flat.device)
    counts = counts.scatter_add(0, flat, torch.ones_like(flat))
    offs = counts[:e].cumsum(0).to(torch.int32)  # tail rows: in no group
    # the permutation both ways: each sorted row's token and flat slot (T / T k: a row
    # serving no slot), each slot's sorted row (T k: not on this rank)
    r = t * k
    on_rank = flat.index_select(0, order) < e
    row_token = torch.where(on_rank, order // k, t).to(torch.int32)
    row_slot = torch.where(on_rank, order, r).to(torch.int32)
    slot = torch.empty_like(order).scatter(0, order, torch.arange(r, device=order.device))
    slot = torch.where(flat < e, slot, r).to(torch.int32).view(t, k)
    x_sorted = torch.ops.nki.moe_dispatch(hidden, row_token, slot)
    y = _mlp(x_sorted, offs, w_gate_up, w_down, b_gate_up, b_down, opts, w_up)
    out = torch.ops.nki.moe_combine(y, weights, slot, row_token, row_slot)
    if shared_gate_up is not None and shared_down is not None:
        one = torch.full((1,), t, dtype=torch.int32, device=hidden.device)
        s_up = None if shared_up is None else shared_up[None]
        s = _mlp(hidden, one, shared_gate_up[None], shared_down[None], None, None, opts, s_up)
        s = s.to(torch.float32)
        if shared_gate is not None:
            logit = torch.ops.nki.grouped_mm(hidden, shared_gate.reshape(1, -1, 1), one)
            s = torch.sigmoid(logit.to(torch.float32)) * s
        out = out + s
    return out.to(hidden.dtype)


# ---- the decode form ----------------------------------------------------------------------
def _check_gated(
    hidden: Tensor, weights: Tensor, ids: Tensor, w_gate_up: Tensor, w_down: Tensor,
    b_gate_up: Tensor | None, b_down: Tensor | None, shared_gate_up: Tensor | None,
    shared_down: Tensor | None, shared_gate: Tensor | None, activation: str,
    interleaved: bool, alpha: float, limit: float, shared_up: Tensor | None = None,
    w_up: Tensor | None = None,
) -> None:  # fmt: skip
    _check_layer(hidden, weights, ids, w_gate_up, w_down, w_up)
    optional = {"b_gate_up": b_gate_up, "b_down": b_down, "shared_gate_up": shared_gate_up,
                "shared_down": shared_down, "shared_gate": shared_gate,
                "shared_up": shared_up, "w_up": w_up}  # fmt: skip
    check_is_tensor(**{arg: t for arg, t in optional.items() if t is not None})
    _check_options(activation, interleaved, alpha, limit)
    if activation not in GATED:
        raise ValueError(f"activation: expected one of {GATED}; got {activation!r}")
    _check_shared(hidden, shared_gate_up, shared_down, shared_gate, shared_up)
    if w_up is not None and interleaved:
        raise ValueError(
            "w_up: expected None with interleaved=True (gate and up are then one "
            "interleaved w_gate_up)"
        )
    if shared_up is not None and interleaved:
        raise ValueError(
            "shared_up: expected None with interleaved=True (the shared expert's "
            "gate and up are then one interleaved shared_gate_up)"
        )
    e = w_gate_up.shape[0]
    for arg, b, n in (
        ("b_gate_up", b_gate_up, w_down.shape[1] * 2),
        ("b_down", b_down, w_down.shape[2]),
    ):
        if b is not None and tuple(b.shape) != (e, n):
            raise ValueError(f"{arg}: expected [E, N] = {(e, n)}; got {tuple(b.shape)}")
        if b is not None and b.dtype != hidden.dtype:
            raise TypeError(f"{arg}: expected dtype {hidden.dtype} (as hidden); got {b.dtype}")
    for arg, x in (("weights", weights), ("ids", ids), ("w_gate_up", w_gate_up),
                   ("w_down", w_down), ("b_gate_up", b_gate_up), ("b_down", b_down),
                   ("shared_gate_up", shared_gate_up), ("shared_down", shared_down),
                   ("shared_gate", shared_gate), ("shared_up", shared_up),
                   ("w_up", w_up)):  # fmt: skip
        if x is not None and x.device != hidden.device:
            raise ValueError(f"{arg}: expected device {hidden.device} (as hidden); got {x.device}")


def _needs_grad(tensors: tuple[Tensor | None, ...]) -> bool:
    """Autograd will ask for a gradient of the layer: the grouped composition runs (its
    kernels save what the backward needs), else the forward-only decode launch."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def _decode_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    t, h, i, e, k, si = 9, 32, 24, 5, 2, 40
    ids = torch.stack([torch.randperm(e + 1, generator=g)[:k] for _ in range(t)])  # E: off rank
    base = (torch.randn(t, h, generator=g), torch.rand(t, k, generator=g), ids,
            torch.randn(e, h, 2 * i, generator=g) / h**0.5,
            torch.randn(e, i, h, generator=g) / i**0.5)  # fmt: skip
    biases = (torch.randn(e, 2 * i, generator=g), torch.randn(e, h, generator=g))
    shared = (torch.randn(h, 2 * si, generator=g) / h**0.5,
              torch.randn(si, h, generator=g) / si**0.5,
              torch.randn(h, generator=g) / h**0.5)  # fmt: skip
    # transformers' layouts: experts [E, 2I, H] / [E, H, I], the shared expert as nn.Linear
    # weights (gate, up [Is, H], down [H, Is]), all passed as transposed views
    hf = (torch.randn(e, 2 * i, h, generator=g).transpose(1, 2) / h**0.5,
          torch.randn(e, h, i, generator=g).transpose(1, 2) / i**0.5)  # fmt: skip
    lin = [torch.randn(si, h, generator=g).t() / h**0.5 for _ in range(2)]
    lin_down = torch.randn(h, si, generator=g).t() / si**0.5
    return [
        ((*base, *biases, None, None, None, "gpt_oss", True, 1.702, 7.0), {}),
        ((*base, None, None, *shared, "swiglu", False, 1.702, 7.0), {}),
        ((*base, None, None, *shared[:2], None, "geglu", False, 1.702, 7.0), {}),
        ((*base[:3], *hf, None, None, lin[0], lin_down, shared[2], "swiglu", False, 1.702,
          7.0, lin[1]), {}),
    ]  # fmt: skip


def _check_decode(hidden: Tensor, *args: Any) -> None:
    _check_gated(hidden, *args)
    if hidden.shape[0] > DECODE_MAX_TOKENS:
        raise ValueError(
            f"hidden: expected at most {DECODE_MAX_TOKENS} tokens; got {hidden.shape[0]}"
        )


@define_op(
    "moe_gated_decode",
    fake=lambda hidden, *a: torch.empty_like(hidden),
    validate=_check_decode,
    examples=_decode_examples,
    traceable=True,
)
def moe_gated_decode(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    b_gate_up: Tensor | None,
    b_down: Tensor | None,
    shared_gate_up: Tensor | None,
    shared_down: Tensor | None,
    shared_gate: Tensor | None,
    activation: str,
    interleaved: bool,
    alpha: float,
    limit: float,
    shared_up: Tensor | None = None,
    w_up: Tensor | None = None,
) -> Tensor:
    """`moe_gated_experts`' layer for T <= 64 in one launch of the decode kernel
    (moe/decode_mlp.py), the shared expert included; forward only (no autograd)."""
    shared = None
    if shared_gate_up is not None and shared_down is not None:
        shared = (shared_gate_up.detach(), shared_down.detach(),
                  None if shared_gate is None else shared_gate.detach(),
                  None if shared_up is None else shared_up.detach())  # fmt: skip
    return decode_gated_experts(
        hidden.detach(), weights.detach(), ids, w_gate_up.detach(), w_down.detach(),
        None if b_gate_up is None else b_gate_up.detach(),
        None if b_down is None else b_down.detach(),
        activation, interleaved, alpha, limit, shared,
        None if w_up is None else w_up.detach(),
    )  # fmt: skip
