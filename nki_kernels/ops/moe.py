"""MoE ops: `torch.ops.nki.moe_route` and `torch.ops.nki.moe_mlp` (+ their backward ops).

    moe_route(router_logits [T, E], *, top_k, renormalize=True, scoring="softmax")
        -> (weights [T, k] fp32, ids [T, k] int32)
    moe_mlp(hidden [T, H], router_logits [T, E], w_gate_up [E, H, 2I], w_down [E, I, H],
            w_up=None, *, top_k, renormalize=True, scoring="softmax",
            capacity_factor=None) -> [T, H]

The weights may be transposed views of row-major storage (transformers' [E, 2I, H] /
[E, H, I], TorchTitan's w1 / w3 [E, I, H] and w2 [E, H, I]; `w_up`: the up weight as a
tensor of its own, w_gate_up then the gate's [E, H, I]): every kernel reads them in place
and the weight gradients come back in the same layout (`moe_launch.kernel_weights`).

Both differentiate (hidden, router_logits, w_gate_up, w_down) with NKI backward kernels.
A call runs: pad T to its bucket (padded tokens route nowhere) -> NKI router -> host
block plan (grouping.py; variable-size blocks) -> config lookup per bucket -> NKI
blockwise MLP -> unpad. Decode-sized dropless calls (T <= 64) run the decode mode
instead (moe_decode.py: the router, then one decode-kernel launch that streams only the
touched experts' weights).
The backward recomputes the routing from the logits (cheap, deterministic) instead of
saving it, plans its own blocks and accumulates the weight gradients on chip in fp32
(one rounding to the weights' dtype). It does not recompute the experts' gate / up
projections: when autograd records the call (grad enabled, an input requiring grad),
`moe_mlp` runs as `moe_mlp_train`, whose forward kernel also stores the pre-activation
gate and up of every routed row ([2I, slots] in the weights' dtype, laid out by the
backward's block plan), saved for the backward like autograd saves `_grouped_mm`'s
outputs. Inference calls run the plain forward and store nothing.

Every op's body is traceable (`define_op(traceable=True)`): under `torch.compile` the
router and expert kernels are graph nodes, and the block plan, which reads the routing,
is one `nki_host::moe_block_plan` node; its static block count depends on shapes only.

This module registers the ops; their argument checks are in `moe_checks.py`, the host
block plans and save plans in `moe_plans.py`, the kernel launches in `moe_launch.py`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..moe.blockwise_mlp import moe_mlp_fwd
from ..moe.blockwise_mlp_bwd import moe_mlp_bwd
from ..moe.config import MoEMLPBwdConfig, MoEMLPConfig, MoEProblem
from ..moe.reference import MoERouting
from ..moe.router import TOPK_MAX, moe_router_bwd
from ..runtime import launch, lookup_config, pad_to_bucket, unpad
from ..runtime.buckets import bucket
from ..targets import get_target
from .moe_checks import (
    HIDDEN_DTYPES,
    ID_DTYPES,
    MAX_EXPERTS,
    MIN_EXPERTS,
    SCORINGS,
    _check_ids,
    _check_mlp,
    _check_route_bwd,
    _check_routing,
    check_up,
    gate_up_width,
)
from .moe_decode import decode_experts, use_decode_mode
from .moe_launch import _route, _routed_plan, kernel_weights, launch_experts_bwd, launch_experts_fwd
from .moe_plans import (
    _bucket_floor,
    _dtype_name,
    _plan,
    _problem,
    _save_plan,
    _save_width,
    _saved_gate_up,
)
from .registry import call_host_op, define_op, route_recorded_calls, tracing


# ---- moe_route ------------------------------------------------------------------------------
def _route_fake(
    router_logits: Tensor, *, top_k: int, renormalize: bool = True, scoring: str = "softmax"
) -> tuple[Tensor, Tensor]:
    t = router_logits.shape[0]
    return (
        router_logits.new_empty((t, top_k), dtype=torch.float32),
        router_logits.new_empty((t, top_k), dtype=torch.int32),
    )


def _route_setup_ctx(
    ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any
) -> None:
    ctx.save_for_backward(inputs[0], output[1])
    ctx.renormalize = keyword_only_inputs.get("renormalize", True)
    ctx.scoring = keyword_only_inputs.get("scoring", "softmax")


def _route_backward(ctx: Any, grad_weights: Tensor | None, grad_ids: Any) -> tuple[Any, ...]:
    logits, ids = ctx.saved_tensors
    if grad_weights is None:
        grad_weights = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
    d_logits = torch.ops.nki.moe_route_backward(
        logits, ids, grad_weights, renormalize=ctx.renormalize, scoring=ctx.scoring
    )
    return (d_logits,)


def _route_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    lg = torch.randn(37, 8, generator=g, requires_grad=True)
    lb = torch.randn(5, 4, generator=g).to(torch.bfloat16)
    return [
        ((lg,), {"top_k": 2}),
        ((lb,), {"top_k": 1, "renormalize": False, "scoring": "sigmoid"}),
    ]


@define_op(
    "moe_route",
    fake=_route_fake,
    validate=lambda router_logits, **kw: _check_routing(
        router_logits, kw.get("top_k"), kw.get("renormalize", True), kw.get("scoring", "softmax")
    ),
    backward=_route_backward,
    setup_context=_route_setup_ctx,
    examples=_route_examples,
    traceable=True,
)
def moe_route(
    router_logits: Tensor, *, top_k: int, renormalize: bool = True, scoring: str = "softmax"
) -> tuple[Tensor, Tensor]:
    """The NKI router: (weights [T, k] fp32, ids [T, k] int32) of the top-k experts."""
    t = router_logits.shape[0]
    padded, _ = pad_to_bucket(router_logits.detach(), 0)
    weights, ids = _route(padded, top_k, scoring, renormalize)
    return unpad(weights, 0, t).contiguous(), unpad(ids, 0, t).contiguous()


@define_op(
    "moe_route_backward",
    fake=lambda router_logits, ids, grad_weights, **kw: torch.empty_like(router_logits),
    validate=lambda router_logits, ids, grad_weights, **kw: _check_route_bwd(
        router_logits, ids, grad_weights, kw.get("renormalize", True), kw.get("scoring", "softmax")
    ),
    examples=lambda: [
        (
            (torch.randn(9, 4), torch.tensor([[0, 1]] * 9, dtype=torch.int32), torch.randn(9, 2)),
            {"renormalize": True, "scoring": "softmax"},
        )
    ],
    traceable=True,
)
def moe_route_backward(
    router_logits: Tensor,
    ids: Tensor,
    grad_weights: Tensor,
    *,
    renormalize: bool = True,
    scoring: str = "softmax",
) -> Tensor:
    """d router_logits from d weights (NKI router backward)."""
    if not tracing(ids):  # values are read only where there are values
        _check_ids(ids, router_logits.shape[1])
    t = router_logits.shape[0]
    lp, _ = pad_to_bucket(router_logits.detach(), 0)
    ip, _ = pad_to_bucket(ids.to(torch.int32), 0)
    gp, _ = pad_to_bucket(grad_weights.detach().to(torch.float32), 0)
    d = launch(moe_router_bwd, lp, ip, gp, scoring, renormalize, target=get_target(None))
    return unpad(d, 0, t).contiguous()


# ---- moe_mlp -------------------------------------------------------------------------------
def _mlp_fake(hidden: Tensor, *args: Any, **kw: Any) -> Tensor:
    return torch.empty_like(hidden)


def _mlp_validate(
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
    **kw: Any,
) -> None:
    r = MoERouting(**{"top_k": None, **kw})  # a missing top_k fails the check by name
    _check_mlp(hidden, router_logits, w_gate_up, w_down, r, w_up)


def _mlp_setup(
    ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Tensor
) -> None:
    ctx.save_for_backward(*inputs)
    ctx.opts = MoERouting(**keyword_only_inputs).kwargs()


def _mlp_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    hidden, logits, w_gate_up, w_down, w_up = ctx.saved_tensors
    dh, dl, dgu, dd, dup = torch.ops.nki.moe_mlp_backward(
        grad, hidden, logits, w_gate_up, w_down, None, w_up, **ctx.opts
    )
    return dh, dl, dgu, dd, (dup if w_up is not None else None)


def mlp_examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Small sample calls (opcheck, tests)."""
    g = torch.Generator().manual_seed(0)
    t, h, i, e = 37, 64, 96, 4
    x = torch.randn(t, h, generator=g, requires_grad=True)
    lg = torch.randn(t, e, generator=g, requires_grad=True)
    wgu = (torch.randn(e, h, 2 * i, generator=g) / h**0.5).requires_grad_()
    wd = (torch.randn(e, i, h, generator=g) / i**0.5).requires_grad_()
    xb = torch.randn(3, h, generator=g).to(torch.bfloat16)
    # gate and up as two tensors, each transposed storage (TorchTitan's w1 / w3 [E, I, H])
    x2 = torch.randn(70, h, generator=g, requires_grad=True)
    ws = [torch.randn(e, i, h, generator=g) / h**0.5 for _ in range(2)]
    gate, up = (w.transpose(1, 2).requires_grad_() for w in ws)
    return [
        ((x, lg, wgu, wd), {"top_k": 2}),
        (
            (xb, torch.randn(3, e, generator=g), wgu.detach().bfloat16(), wd.detach().bfloat16()),
            {"top_k": 1, "scoring": "sigmoid", "capacity_factor": 1.0},
        ),
        ((x2, torch.randn(70, e, generator=g), gate, wd, up), {"top_k": 2}),
    ]


def _mlp_forward(
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    routing: MoERouting,
    save: bool,
    w_up: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """(out, the saved gate / up or None): the body of `moe_mlp` (save=False) and of
    `moe_mlp_train` (save=True; decode-mode calls save nothing, the backward recomputes)."""
    t = hidden.shape[0]
    top_k, scoring, renormalize = routing.top_k, routing.scoring, routing.renormalize
    lp, _ = pad_to_bucket(router_logits.detach(), 0)
    if use_decode_mode(t, routing.capacity_factor):  # T <= 64: moe_decode.py
        weights, ids = _route(lp, top_k, scoring, renormalize)
        wd_, wgu_ = w_down.detach(), w_gate_up.detach()
        wup = None if w_up is None else w_up.detach()
        out = decode_experts(hidden.detach(), weights[:t], ids[:t], wgu_, wd_, wup)
        return out, None
    hp, _ = pad_to_bucket(hidden.detach(), 0)
    weights, ids = _route(lp, top_k, scoring, renormalize)
    problem = _problem(lp.shape[0], w_gate_up, top_k, w_up)
    target = get_target(None)
    cfg = lookup_config("moe_mlp", problem, moe_mlp_fwd, target=target)
    assert isinstance(cfg, MoEMLPConfig)
    e, cf = w_gate_up.shape[0], routing.capacity_factor
    m, _ = _plan(weights, ids, t, e, cfg.block_size, cf, sized=True)
    if not save:
        out = launch_experts_fwd(hp, w_gate_up, w_down, cfg, m, w_up=w_up)
        return unpad(out, 0, t).contiguous(), None
    bcfg = lookup_config("moe_mlp_bwd", problem, moe_mlp_bwd, target=target)
    assert isinstance(bcfg, MoEMLPBwdConfig)
    lowest = min(t, _bucket_floor(lp.shape[0]))
    args = (weights, ids, t, e, cfg.block_size, bcfg.block_size, cf, lowest)
    if tracing(weights, ids):
        save_plan = call_host_op("moe_save_plan", *args)
    else:
        save_plan = _save_plan(*args)
    out, gate_up = launch_experts_fwd(hp, w_gate_up, w_down, cfg, m, tuple(save_plan), w_up)
    return unpad(out, 0, t).contiguous(), gate_up


@define_op(
    "moe_mlp",
    fake=_mlp_fake,
    validate=_mlp_validate,
    backward=_mlp_backward,
    setup_context=_mlp_setup,
    examples=mlp_examples,
    traceable=True,
)
def moe_mlp(
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
    *,
    top_k: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    capacity_factor: float | None = None,
) -> Tensor:
    """SwiGLU mixture of experts: sum_j w[t, j] * expert_{ids[t, j]}(hidden[t]) (NKI).
    `w_up` (optional): the up weight [E, H, I] as a tensor of its own, w_gate_up then the
    gate's [E, H, I] (TorchTitan's w1 / w3, passed as transposed views, no copy)."""
    routing = MoERouting(top_k, renormalize, scoring, capacity_factor)
    return _mlp_forward(hidden, router_logits, w_gate_up, w_down, routing, False, w_up)[0]


def _train_fake(
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
    **kw: Any,
) -> tuple[Tensor, Tensor]:
    r = MoERouting(**kw)
    # the saved width follows T's bucket and the backward's config for the shape: symbolic
    # sizes (dynamic=True) are specialized
    t = int(hidden.shape[0])
    e, h, i2 = int(w_gate_up.shape[0]), int(w_gate_up.shape[1]), gate_up_width(w_gate_up, w_up)
    if use_decode_mode(t, r.capacity_factor):
        return torch.empty_like(hidden), hidden.new_empty((i2, 0))
    tb = bucket(t)
    problem = MoEProblem(tb, h, i2 // 2, e, r.top_k, _dtype_name(w_gate_up))
    bcfg = lookup_config("moe_mlp_bwd", problem, moe_mlp_bwd, target=get_target(None))
    assert isinstance(bcfg, MoEMLPBwdConfig)
    width = _save_width(tb, r.top_k, e, bcfg.block_size, r.capacity_factor)
    return torch.empty_like(hidden), hidden.new_empty((i2, width))


def _train_setup(
    ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any
) -> None:
    ctx.save_for_backward(*inputs, output[1])
    ctx.opts = MoERouting(**keyword_only_inputs).kwargs()


def _train_backward(ctx: Any, grad: Tensor, grad_gate_up: Any) -> tuple[Any, ...]:
    hidden, logits, w_gate_up, w_down, w_up, gate_up = ctx.saved_tensors
    dh, dl, dgu, dd, dup = torch.ops.nki.moe_mlp_backward(
        grad, hidden, logits, w_gate_up, w_down, gate_up, w_up, **ctx.opts
    )
    return dh, dl, dgu, dd, (dup if w_up is not None else None)


@define_op(
    "moe_mlp_train",
    fake=_train_fake,
    validate=_mlp_validate,
    backward=_train_backward,
    setup_context=_train_setup,
    examples=mlp_examples,
    traceable=True,
)
def moe_mlp_train(
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
    *,
    top_k: int,
    renormalize: bool = True,
    scoring: str = "softmax",
    capacity_factor: float | None = None,
) -> tuple[Tensor, Tensor]:
    """(`moe_mlp`'s output, the saved pre-activation gate / up [2I, slots of the backward's
    plan], or [2I, 0] in decode mode): what `moe_mlp` runs when autograd records it."""
    routing = MoERouting(top_k, renormalize, scoring, capacity_factor)
    out, gate_up = _mlp_forward(hidden, router_logits, w_gate_up, w_down, routing, True, w_up)
    if gate_up is None:  # decode mode: nothing saved, the backward recomputes
        gate_up = hidden.new_empty((gate_up_width(w_gate_up, w_up), 0))
    return out, gate_up


route_recorded_calls(moe_mlp, "moe_mlp", "moe_mlp_train")


def _mlp_bwd_fake(
    grad: Tensor,
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    gate_up: Tensor | None = None,
    w_up: Tensor | None = None,
    **kw: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return (
        torch.empty_like(hidden),
        torch.empty_like(router_logits),
        torch.empty_like(w_gate_up),
        torch.empty_like(w_down),
        hidden.new_empty((0,)) if w_up is None else torch.empty_like(w_up),
    )


@define_op(
    "moe_mlp_backward",
    fake=_mlp_bwd_fake,
    validate=lambda grad, hidden, router_logits, w_gate_up, w_down, gate_up=None, w_up=None, **kw: (
        _mlp_validate(hidden, router_logits, w_gate_up, w_down, w_up, **kw)
    ),
    examples=lambda: [
        ((torch.randn(a[0].shape), *(x.detach() for x in a)), MoERouting(**kw).kwargs())
        for a, kw in mlp_examples()[:1]
    ],
    traceable=True,
)
def moe_mlp_backward(
    grad: Tensor,
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    gate_up: Tensor | None = None,
    w_up: Tensor | None = None,
    *,
    top_k: int,
    renormalize: bool,
    scoring: str,
    capacity_factor: float | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(d hidden, d router_logits, d w_gate_up, d w_down, d w_up (empty without w_up)) of
    `moe_mlp` (NKI kernels), each weight gradient in its weight's layout; `gate_up`:
    `moe_mlp_train`'s saved gate / up (None or empty: recomputed)."""
    routing = MoERouting(top_k, renormalize, scoring, capacity_factor)
    target = get_target(None)
    t = hidden.shape[0]
    hp, _ = pad_to_bucket(hidden.detach(), 0)
    gp, _ = pad_to_bucket(grad.detach().to(hidden.dtype), 0)
    lp, _ = pad_to_bucket(router_logits.detach(), 0)
    cfg, static, m, ids = _routed_plan(
        "moe_mlp_bwd", moe_mlp_bwd, hidden, lp, w_gate_up, routing, w_up
    )
    assert isinstance(cfg, MoEMLPBwdConfig)
    width = gate_up_width(w_gate_up, w_up)
    saved = _saved_gate_up(gate_up, width, m, cfg.block_size, "moe_mlp_train")
    dh, dw, dgu, dd, dup = launch_experts_bwd(
        hp, gp, w_gate_up, w_down, cfg, (m, static), saved, w_up
    )
    dl = launch(moe_router_bwd, lp, ids, dw, scoring, renormalize, target=target)
    return (
        unpad(dh, 0, t).contiguous(),
        unpad(dl, 0, t).contiguous(),
        dgu,
        dd,
        hidden.new_empty((0,)) if dup is None else dup,
    )


# the checks, plans and launches live in moe_checks.py, moe_plans.py and moe_launch.py;
# the other MoE op modules and the integrations import them from here as well
__all__ = [
    "HIDDEN_DTYPES",
    "ID_DTYPES",
    "MAX_EXPERTS",
    "MIN_EXPERTS",
    "SCORINGS",
    "TOPK_MAX",
    "_bucket_floor",
    "_check_routing",
    "_plan",
    "_problem",
    "_save_plan",
    "_save_width",
    "_saved_gate_up",
    "check_up",
    "gate_up_width",
    "kernel_weights",
    "launch_experts_bwd",
    "launch_experts_fwd",
    "mlp_examples",
    "moe_mlp",
    "moe_mlp_backward",
    "moe_mlp_train",
    "moe_route",
    "moe_route_backward",
]
