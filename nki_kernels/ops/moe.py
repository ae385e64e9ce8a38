"""MoE ops: `torch.ops.nki.moe_route` and `torch.ops.nki.moe_mlp` (+ their backward ops).

    moe_route(router_logits [T, E], *, top_k, renormalize=True, scoring="softmax")
        -> (weights [T, k] fp32, ids [T, k] int32)
    moe_mlp(hidden [T, H], router_logits [T, E], w_gate_up [E, H, 2I], w_down [E, I, H],
            w_up=None, *, top_k, renormalize=True, scoring="softmax",
            capacity_factor=None) -> [T, H]

The weights may be transposed views of row-major storage (transformers' [E, 2I, H] /
[E, H, I], TorchTitan's w1 / w3 [E, I, H] and w2 [E, H, I]; `w_up`: the up weight as a
tensor of its own, w_gate_up then the gate's [E, H, I]): every kernel reads them in place
and the weight gradients come back in the same layout (`kernel_weights`).

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
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..moe.blockwise_mlp import moe_mlp_fwd
from ..moe.blockwise_mlp_bwd import moe_mlp_bwd
from ..moe.config import MoEMLPBwdConfig, MoEMLPConfig, MoEProblem
from ..moe.grouping import PARTITIONS, gate_up_columns, max_blocks, min_blocks, plan_blocks
from ..moe.reference import MoERouting, capacity
from ..moe.router import TOPK_MAX, moe_router_bwd, moe_router_fwd
from ..moe.split_kernels import moe_mlp_bwd_split, moe_mlp_fwd_split
from ..runtime import launch, lookup_config, pad_to_bucket, unpad
from ..runtime.buckets import bucket, current_policy
from ..runtime.host_array import host_numpy
from ..targets import get_target
from .checks import FLOAT_DTYPES, check_positive, check_tensor
from .moe_decode import decode_experts, kernel_layout, like_layout, use_decode_mode
from .registry import call_host_op, define_host_op, define_op, route_recorded_calls, tracing

MIN_EXPERTS, MAX_EXPERTS = 2, 128
ID_DTYPES = (torch.int32, torch.int64)
HIDDEN_DTYPES = (torch.float32, torch.bfloat16)
SCORINGS = ("softmax", "sigmoid")


# ---- argument checks ------------------------------------------------------------------
def _check_routing(router_logits: Tensor, top_k: Any, renormalize: Any, scoring: Any) -> int:
    check_tensor("router_logits", router_logits, dtypes=FLOAT_DTYPES, min_dim=2)
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits: expected 2 dims [T, E]; got {tuple(router_logits.shape)}")
    e = router_logits.shape[1]
    if not MIN_EXPERTS <= e <= MAX_EXPERTS:
        raise ValueError(
            f"router_logits: expected E (dim 1) in {MIN_EXPERTS}..{MAX_EXPERTS}; got {e}"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise TypeError(f"top_k: expected an int; got {type(top_k).__name__}")
    if not 1 <= top_k <= min(e, TOPK_MAX):
        raise ValueError(
            f"top_k: expected 1..{min(e, TOPK_MAX)} (<= E = {e} and <= {TOPK_MAX}); got {top_k}"
        )
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool; got {type(renormalize).__name__}")
    if scoring not in SCORINGS:
        raise ValueError(f"scoring: expected one of {SCORINGS}; got {scoring!r}")
    return e


def gate_up_width(w_gate_up: Tensor, w_up: Tensor | None) -> int:
    """2I: w_gate_up's columns, or the gate's and up's (`w_up`: the up weight alone)."""
    return int(w_gate_up.shape[2]) * (2 if w_up is not None else 1)


def check_up(w_gate_up: Tensor, w_up: Tensor | None, hidden: Tensor) -> None:
    """`w_up` (the up weight alone, w_gate_up then the gate's): as w_gate_up."""
    if w_up is None:
        return
    check_tensor("w_up", w_up, dtypes=HIDDEN_DTYPES, min_dim=3)
    if tuple(w_up.shape) != tuple(w_gate_up.shape):
        raise ValueError(
            f"w_up: expected the shape of w_gate_up (the gate's [E, H, I] when w_up is given) "
            f"{tuple(w_gate_up.shape)}; got {tuple(w_up.shape)}"
        )
    if w_up.dtype != hidden.dtype:
        raise TypeError(f"w_up: expected dtype {hidden.dtype} (as hidden); got {w_up.dtype}")
    if w_up.device != hidden.device:
        raise ValueError(f"w_up: expected device {hidden.device} (as hidden); got {w_up.device}")


def _check_mlp(
    hidden: Tensor,
    router_logits: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    r: MoERouting,
    w_up: Tensor | None = None,
) -> None:
    e = _check_routing(router_logits, r.top_k, r.renormalize, r.scoring)
    check_tensor("hidden", hidden, dtypes=HIDDEN_DTYPES, min_dim=2)
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected 2 dims [T, H]; got {tuple(hidden.shape)}")
    t, h = hidden.shape
    for arg, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        check_tensor(arg, w, dtypes=HIDDEN_DTYPES, min_dim=3)
        if w.dim() != 3:
            raise ValueError(f"{arg}: expected 3 dims; got {tuple(w.shape)}")
        if w.dtype != hidden.dtype:
            raise TypeError(f"{arg}: expected dtype {hidden.dtype} (as hidden); got {w.dtype}")
    for arg, x in (("router_logits", router_logits), ("w_gate_up", w_gate_up), ("w_down", w_down)):
        if x.device != hidden.device:
            raise ValueError(f"{arg}: expected device {hidden.device} (as hidden); got {x.device}")
    if router_logits.shape[0] != t:
        raise ValueError(
            f"router_logits: expected {t} rows (hidden has T = {t}); got {router_logits.shape[0]}"
        )
    split = w_up is not None
    if w_gate_up.shape[0] != e or w_gate_up.shape[1] != h or (w_gate_up.shape[2] % 2 and not split):
        want = "I] (the gate's: w_up given)" if split else "2I]"
        raise ValueError(
            f"w_gate_up: expected [E={e}, H={h}, {want} (E from router_logits, H from hidden); "
            f"got {tuple(w_gate_up.shape)}"
        )
    check_up(w_gate_up, w_up, hidden)
    i = gate_up_width(w_gate_up, w_up) // 2
    if tuple(w_down.shape) != (e, i, h):
        raise ValueError(
            f"w_down: expected [E, I, H] = {(e, i, h)} (from w_gate_up and hidden); got "
            f"{tuple(w_down.shape)}"
        )
    if r.capacity_factor is not None:
        check_positive("capacity_factor", r.capacity_factor)
        if not math.isfinite(r.capacity_factor):
            raise ValueError(
                f"capacity_factor: expected a finite number > 0 (or None: dropless); got "
                f"{r.capacity_factor}"
            )


def _check_route_bwd(
    router_logits: Tensor, ids: Tensor, grad_weights: Tensor, renormalize: Any, scoring: Any
) -> None:
    """Checks of `moe_route_backward` (metadata only; the ids' values are checked by
    `_check_ids` where data can be read)."""
    check_tensor("ids", ids, dtypes=ID_DTYPES, min_dim=2)
    if ids.dim() != 2:
        raise ValueError(f"ids: expected 2 dims [T, k]; got {tuple(ids.shape)}")
    check_tensor("router_logits", router_logits, dtypes=FLOAT_DTYPES, min_dim=2)
    e, k = int(router_logits.shape[-1]), int(ids.shape[1])
    if not 1 <= k <= min(e, TOPK_MAX):
        raise ValueError(
            f"ids: expected 1..{min(e, TOPK_MAX)} columns (top_k <= E = {e} and <= {TOPK_MAX}); "
            f"got shape {tuple(ids.shape)}"
        )
    _check_routing(router_logits, k, renormalize, scoring)
    t = router_logits.shape[0]
    if ids.shape[0] != t:
        raise ValueError(f"ids: expected {t} rows (router_logits has T = {t}); got {ids.shape[0]}")
    check_tensor("grad_weights", grad_weights, dtypes=FLOAT_DTYPES, min_dim=2)
    if tuple(grad_weights.shape) != tuple(ids.shape):
        raise ValueError(
            f"grad_weights: expected shape {tuple(ids.shape)} (as ids); got "
            f"{tuple(grad_weights.shape)}"
        )
    for arg, x in (("ids", ids), ("grad_weights", grad_weights)):
        if x.device != router_logits.device:
            raise ValueError(
                f"{arg}: expected device {router_logits.device} (as router_logits); got {x.device}"
            )


def _check_ids(ids: Tensor, e: int) -> None:
    """ids' values are expert ids in [0, E)."""
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= e:
        raise ValueError(f"ids: expected expert ids in [0, {e}); got min {lo}, max {hi}")


# ---- host plumbing -----------------------------------------------------------------------
def _dtype_name(t: Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _bucket_floor(tb: int) -> int:
    """The smallest token count that pads to bucket `tb` (static plan bounds hold for it)."""
    lower = [b for b in current_policy().buckets(tb) if b < tb]
    return (lower[-1] + 1) if lower else 1


def _route(logits: Tensor, top_k: int, scoring: str, renormalize: bool) -> tuple[Tensor, Tensor]:
    return launch(moe_router_fwd, logits, top_k, scoring, renormalize, target=get_target(None))


PLAN_TENSORS = (
    "slot_token",
    "slot_weight",
    "block_expert",
    "block_keep",
    "block_count",
    "token_slot",
    "token_weight",
    "kind_bounds",
)


def _block_plan(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block: int,
    capacity_factor: float | None,
    min_tokens: int,
    sized: bool,
) -> list[Tensor]:
    """The host block plan (grouping.py; `sized`: variable-size blocks, the forward's) of
    the padded routing as tensors on its device (`PLAN_TENSORS`); the body of the
    `nki_host::moe_block_plan` node under tracing."""
    tb = weights.shape[0]
    w, i = host_numpy(weights[:tokens]), host_numpy(ids[:tokens])
    plan = plan_blocks(
        i, w, experts, block, capacity_factor, num_tokens=tb, min_tokens=min_tokens, sized=sized
    )
    return [torch.from_numpy(getattr(plan, n)).to(weights.device) for n in PLAN_TENSORS]


def _block_plan_fake(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block: int,
    capacity_factor: float | None,
    min_tokens: int,
    sized: bool,
) -> list[Tensor]:
    tb, k = ids.shape
    cap = None if capacity_factor is None else capacity(tb, experts, k, capacity_factor)
    nb = max_blocks(tb, k, experts, block, cap)
    ns = block // PARTITIONS
    i32, f32 = torch.int32, torch.float32
    shapes = (
        ((nb, PARTITIONS, ns), i32),
        ((nb, PARTITIONS, ns), f32),
        ((nb, 1), i32),
        ((nb, 1), f32),
        ((1, 1), i32),
        ((tb, k), i32),
        ((tb, k), f32),
        ((1, ns + 1), i32),
    )
    return [weights.new_empty(shape, dtype=dt) for shape, dt in shapes]


define_host_op("moe_block_plan", _block_plan, fake=_block_plan_fake)


def _plan(
    weights: Tensor,
    ids: Tensor,
    t: int,
    e: int,
    block: int,
    cf: float | None,
    sized: bool = False,
) -> tuple[dict[str, Tensor], int]:
    """(plan tensors by name, static block count) of the padded routing (`sized`: the
    forward's variable-size blocks). The static count depends on shapes only; the plan
    reads the routing, so while the op body is traced it is the `nki_host::moe_block_plan`
    node."""
    tb, k = ids.shape
    lowest = min(t, _bucket_floor(tb))
    static = min_blocks(lowest, k, e, block, None if cf is None else capacity(lowest, e, k, cf))
    if tracing(weights, ids):
        tensors = call_host_op("moe_block_plan", weights, ids, t, e, block, cf, lowest, sized)
    else:
        tensors = _block_plan(weights, ids, t, e, block, cf, lowest, sized)
    return dict(zip(PLAN_TENSORS, tensors)), static


def _problem(tb: int, w_gate_up: Tensor, top_k: int, w_up: Tensor | None = None) -> MoEProblem:
    e, h = int(w_gate_up.shape[0]), int(w_gate_up.shape[1])
    i = gate_up_width(w_gate_up, w_up) // 2
    return MoEProblem(tb, h, i, e, top_k, _dtype_name(w_gate_up))


def _routed_plan(
    op: str,
    kernel: Any,
    hidden: Tensor,
    lp: Tensor,
    w_gate_up: Tensor,
    r: MoERouting,
    w_up: Tensor | None = None,
) -> tuple[Any, int, dict[str, Tensor], Tensor]:
    """Route the padded logits `lp`, look up `op`'s config for the bucket and plan its
    blocks: (config, static blocks, plan tensors on hidden's device, expert ids)."""
    weights, ids = _route(lp, r.top_k, r.scoring, r.renormalize)
    problem = _problem(lp.shape[0], w_gate_up, r.top_k, w_up)
    cfg = lookup_config(op, problem, kernel, target=get_target(None))
    t, e = hidden.shape[0], w_gate_up.shape[0]
    assert isinstance(cfg, MoEMLPConfig | MoEMLPBwdConfig)
    sized = isinstance(cfg, MoEMLPConfig)  # the forward runs variable-size blocks
    meta, static = _plan(weights, ids, t, e, cfg.block_size, r.capacity_factor, sized)
    return cfg, static, meta, ids


def _save_plan(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block_fwd: int,
    block_bwd: int,
    capacity_factor: float | None,
    min_tokens: int,
) -> list[Tensor]:
    """[save_cols, save_holes] (`grouping.gate_up_columns`) of the forward's sized plan
    and the backward's fixed one (block sizes `block_fwd`, `block_bwd`) of the padded routing;
    the body of the `nki_host::moe_save_plan` node under tracing."""
    tb = weights.shape[0]
    w, i = host_numpy(weights[:tokens]), host_numpy(ids[:tokens])
    kw = {"num_tokens": tb, "min_tokens": min_tokens}
    fwd = plan_blocks(i, w, experts, block_fwd, capacity_factor, sized=True, **kw)
    bwd = plan_blocks(i, w, experts, block_bwd, capacity_factor, **kw)
    return [torch.from_numpy(a).to(weights.device) for a in gate_up_columns(fwd, bwd)]


def _saved_gate_up(
    gate_up: Tensor | None, width: int, m: dict[str, Tensor], block: int, op: str
) -> Tensor | None:
    """The forward's saved gate / up for the backward plan `m` (None or empty: recomputed),
    its shape checked against that plan (`width`: 2I)."""
    if gate_up is None or not gate_up.numel():
        return None
    want = (width, (m["slot_token"].shape[0] + 2) * block)
    if tuple(gate_up.shape) != want:
        raise ValueError(
            f"gate_up: expected [2I, (NB + 2) * B] = {want} ({op}'s save for this bucket's "
            f"backward plan); got {tuple(gate_up.shape)}"
        )
    return gate_up.detach()


def _save_width(tb: int, k: int, e: int, block_bwd: int, cf: float | None) -> int:
    """Columns of the saved gate / up: (the backward plan's NB + 2) * its block size."""
    cap = None if cf is None else capacity(tb, e, k, cf)
    return (max_blocks(tb, k, e, block_bwd, cap) + 2) * block_bwd


def _save_plan_fake(
    weights: Tensor,
    ids: Tensor,
    tokens: int,
    experts: int,
    block_fwd: int,
    block_bwd: int,
    capacity_factor: float | None,
    min_tokens: int,
) -> list[Tensor]:
    tb, k = ids.shape
    cap = None if capacity_factor is None else capacity(tb, experts, k, capacity_factor)
    nb = max_blocks(tb, k, experts, block_fwd, cap)
    width = _save_width(tb, k, experts, block_bwd, capacity_factor)
    return [
        weights.new_empty((nb, 1), dtype=torch.int32),
        weights.new_empty((width // PARTITIONS + 1, 1), dtype=torch.int32),
    ]


define_host_op("moe_save_plan", _save_plan, fake=_save_plan_fake)


def kernel_weights(
    w_gate_up: Tensor, w_down: Tensor, w_up: Tensor | None, dt: torch.dtype
) -> tuple[tuple[Tensor, Tensor, Tensor | None], tuple[bool, bool]]:
    """((gate/up, down, up or None) as the blockwise kernels read them, (gate/up, down)
    stored transposed): row-major weights and transposed views of row-major storage
    (transformers' [E, 2I, H] / [E, H, I], TorchTitan's w1 / w3 [E, I, H] and w2
    [E, H, I]) reach the kernels as they lie, no copy (`moe_decode.kernel_layout`,
    `moe/param_layout.py`); another layout is copied row-major on each call."""
    wgu, gu_t = kernel_layout(w_gate_up.detach(), dt)
    wd, dn_t = kernel_layout(w_down.detach(), dt)
    wup = None if w_up is None else like_layout(w_up.detach(), gu_t, dt)
    return (wgu, wd, wup), (gu_t, dn_t)


def launch_experts_fwd(
    hp: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    cfg: MoEMLPConfig,
    m: dict[str, Tensor],
    save: tuple[Tensor, Tensor] | None = None,
    w_up: Tensor | None = None,
) -> Any:
    """The forward expert kernel on padded rows `hp` and a sized block plan `m` (the
    launch `moe_mlp` and `moe_experts` share); with `save` = (save_cols, save_holes)
    (`_save_plan`), (out, gate_up) with the pre-activation gate / up saved. The weights
    are read in their own layouts (`kernel_weights`); `w_up`: the up weight alone
    (w_gate_up then the gate's)."""
    cols, holes = (None, None) if save is None else save
    (wgu, wd, wup), transposed = kernel_weights(w_gate_up, w_down, w_up, hp.dtype)
    kernel, ws = (moe_mlp_fwd, (wgu,)) if wup is None else (moe_mlp_fwd_split, (wgu, wup))
    return launch(
        kernel,
        hp,
        *ws,
        wd,
        m["slot_token"],
        m["block_expert"],
        m["kind_bounds"],
        m["token_slot"],
        m["token_weight"],
        cols,
        holes,
        config=cfg,
        target=get_target(None),
        static_kinds=None,  # one device loop per block size over kind_bounds
        may_drop=True,  # static per bucket: padded tokens (and drops) have no slot
        transposed=transposed,
    )


def launch_experts_bwd(
    hp: Tensor,
    gp: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    cfg: MoEMLPBwdConfig,
    plan: tuple[dict[str, Tensor], int],
    gate_up: Tensor | None = None,
    w_up: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(d hidden, d weights per slot [T, k] fp32, d w_gate_up, d w_down, d w_up or None)
    of the expert kernels on padded rows / grads and a fixed block plan (the launch
    `moe_mlp` and `moe_experts` share). The weights are read in their own layouts
    (`kernel_weights`) and each weight gradient is written in its weight's layout (a
    transposed view of the same storage layout: no transpose copy), in place for every
    expert with a block (fp32 sums on chip, one rounding); the others stay zero.
    `gate_up`: the forward's saved gate / up for this plan (None: recomputed)."""
    m, static = plan
    (wgu, wd, wup), transposed = kernel_weights(w_gate_up, w_down, w_up, hp.dtype)

    def zeros(w: Tensor) -> Tensor:
        return torch.zeros(w.shape, dtype=w.dtype, device=hp.device)

    dgu, dd = zeros(wgu), zeros(wd)
    dup = None if wup is None else zeros(wup)
    kernel, ws, dws = moe_mlp_bwd, (wgu,), (dgu,)
    if wup is not None:
        kernel, ws, dws = moe_mlp_bwd_split, (wgu, wup), (dgu, dup)
    dh, dw = launch(
        kernel,
        hp,
        *ws,
        wd,
        gp,
        m["slot_token"],
        m["slot_weight"],
        m["block_expert"],
        m["block_keep"],
        m["block_count"],
        m["token_slot"],
        *dws,
        dd,
        gate_up,
        config=cfg,
        target=get_target(None),
        mutated=tuple(range(len(ws) + 9, 2 * len(ws) + 10)),
        static_blocks=static,
        may_drop=True,  # static per bucket: padded tokens (and drops) have no slot
        transposed=transposed,
    )

    def as_param(g: Tensor, t: bool) -> Tensor:  # the parameter's view of the storage
        return g.transpose(1, 2) if t else g

    gu_t, dn_t = transposed
    dup = None if dup is None else as_param(dup, gu_t)
    return dh, dw, as_param(dgu, gu_t), as_param(dd, dn_t), dup


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
