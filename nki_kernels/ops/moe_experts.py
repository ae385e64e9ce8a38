"""`torch.ops.nki.moe_experts`: the SwiGLU expert layer on routing computed elsewhere.

    moe_experts(hidden [T, H], weights [T, k] float, ids [T, k] int32/int64,
                w_gate_up [E, H, 2I], w_down [E, I, H], w_up=None) -> [T, H]
    out[t] = sum_j weights[t, j] * (silu(x Wg_e) * (x Wu_e)) Wd_e,  e = ids[t, j]

Weights as in `moe_mlp`: transposed views of the parameters' storage are read in place
(`w_up`: the up weight apart, w_gate_up then the gate's [E, H, I]).

The same NKI kernels as `moe_mlp` (block plan, blockwise expert MLP and combine, or for
T <= 64 the decode mode of moe_decode.py; the backward's dgrad, on-chip weight-gradient
sums and combine), without the router: any
routing -- DeepSeek-V3's group-limited sigmoid top-k with a selection-only bias, GPT-OSS's
softmax over the selected logits, `moe.routing.route` -- produces (weights, ids) and this
op runs the experts. Differentiable in hidden, weights, w_gate_up and w_down (the
weights' gradient, d out / d weights[t, j] = <grad[t], y_e(x_t)>, comes from the
backward kernel). Up to 512 experts and k <= 16. A NaN / Inf in a token's hidden row or
weights stays in that token's output row (and in the weight gradients of its experts).

An id equal to E marks a slot whose expert is not on this rank (transformers' expert-
parallel mask value), as in `moe_gated_experts`: it contributes nothing, whatever its
weight (NaN / Inf too), and gets no gradient. Before the plan such a slot takes its
token's lowest on-rank id (0 when it has none) and weight 0 (selects); then, in the
block plan, its slot becomes a padding slot (no token row, weight 0) and the token's
entry for it a dropped one (the combine skips it), so it is never multiplied into
anything. The decode mode (T <= 64) has no plan: there the slot's weight-0 duplicate of
an id its token already uses adds exactly 0 to that expert's weight, and a token with
no on-rank slot has its output row selected to 0.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ..moe.blockwise_mlp import moe_mlp_fwd
from ..moe.blockwise_mlp_bwd import moe_mlp_bwd
from ..moe.config import MoEMLPBwdConfig, MoEMLPConfig
from ..runtime import lookup_config, pad_to_bucket, unpad
from ..targets import get_target
from .checks import FLOAT_DTYPES, check_tensor
from .moe import (
    HIDDEN_DTYPES,
    ID_DTYPES,
    _bucket_floor,
    _plan,
    _problem,
    _save_plan,
    _save_width,
    _saved_gate_up,
    gate_up_width,
    launch_experts_bwd,
    launch_experts_fwd,
)
from .moe_checks import check_up_down
from .moe_decode import decode_experts, use_decode_mode
from .registry import call_host_op, define_op, route_recorded_calls, tracing

MAX_EXPERTS, MAX_TOP_K = 512, 16


def _check(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
) -> None:
    check_tensor("hidden", hidden, dtypes=HIDDEN_DTYPES, min_dim=2)
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected 2 dims [T, H]; got {tuple(hidden.shape)}")
    t, h = hidden.shape
    check_tensor("weights", weights, dtypes=FLOAT_DTYPES, min_dim=2)
    check_tensor("ids", ids, dtypes=ID_DTYPES, min_dim=2)
    for arg, x in (("weights", weights), ("ids", ids)):
        if x.dim() != 2 or x.shape[0] != t:
            raise ValueError(f"{arg}: expected [T={t}, k] (T from hidden); got {tuple(x.shape)}")
    k = ids.shape[1]
    if tuple(weights.shape) != tuple(ids.shape):
        raise ValueError(
            f"weights: expected shape {tuple(ids.shape)} (as ids); got {tuple(weights.shape)}"
        )
    for arg, w in (("w_gate_up", w_gate_up), ("w_down", w_down)):
        check_tensor(arg, w, dtypes=HIDDEN_DTYPES, min_dim=3)
        if w.dim() != 3:
            raise ValueError(f"{arg}: expected 3 dims; got {tuple(w.shape)}")
        if w.dtype != hidden.dtype:
            raise TypeError(f"{arg}: expected dtype {hidden.dtype} (as hidden); got {w.dtype}")
    e = w_gate_up.shape[0]
    if not 1 <= e <= MAX_EXPERTS:
        raise ValueError(f"w_gate_up: expected E (dim 0) in 1..{MAX_EXPERTS}; got {e}")
    if not 1 <= k <= min(MAX_TOP_K, e):
        raise ValueError(
            f"ids: expected 1..{min(MAX_TOP_K, e)} columns (k <= 16 and <= E = {e}); got {k}"
        )
    if w_gate_up.shape[1] != h or (w_gate_up.shape[2] % 2 and w_up is None):
        want = "I] (the gate's: w_up given)" if w_up is not None else "2I]"
        raise ValueError(
            f"w_gate_up: expected [E, H={h}, {want} (H from hidden); got {tuple(w_gate_up.shape)}"
        )
    check_up_down(w_gate_up, w_up, w_down, hidden)
    for arg, x in (
        ("weights", weights),
        ("ids", ids),
        ("w_gate_up", w_gate_up),
        ("w_down", w_down),
    ):
        if x.device != hidden.device:
            raise ValueError(f"{arg}: expected device {hidden.device} (as hidden); got {x.device}")


def _check_ids(ids: Tensor, e: int) -> None:
    """ids' values are expert ids in [0, E], E meaning not on this rank (eager only)."""
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi > e:
        raise ValueError(
            f"ids: expected expert ids in [0, {e}] ({e}: not on this rank); got min {lo}, max {hi}"
        )


def _on_rank(weights: Tensor, ids: Tensor, e: int) -> tuple[Tensor, Tensor, Tensor]:
    """(weights, ids, off): each id-E slot (`off`) given its token's lowest on-rank id
    (0 when none) and weight 0, by selects."""
    off = ids == e
    lowest = torch.where(off, e, ids).amin(dim=1, keepdim=True)
    lowest = torch.where(lowest == e, 0, lowest)
    ids = torch.where(off, lowest, ids)
    weights = torch.where(off, torch.zeros_like(weights), weights)
    return weights, ids, off


def _drop_off_rank(m: dict[str, Tensor], off: Tensor, t: int) -> dict[str, Tensor]:
    """The plan with each off-rank slot a padding slot (token T, weight 0) and its token
    entry a dropped one (slot NB * B: the combine skips it)."""
    nb, p, ns = m["slot_token"].shape  # slot s = b * B + c * 128 + p  ->  [b, p, c]
    total = nb * p * ns
    off_p, _ = pad_to_bucket(off, 0)  # padded tokens: never off-rank
    where = torch.where(off_p, m["token_slot"].to(torch.int64), total).reshape(-1)
    hit = torch.zeros(total + 1, dtype=torch.int32, device=off.device)
    hit = hit.scatter(0, where, torch.ones_like(where, dtype=torch.int32))[:total]
    hit = hit.view(nb, ns, p).transpose(1, 2) > 0
    out = dict(m)
    out["slot_token"] = torch.where(hit, t, m["slot_token"])
    out["slot_weight"] = torch.where(hit, 0.0, m["slot_weight"])
    out["token_slot"] = torch.where(off_p, total, m["token_slot"])
    out["token_weight"] = torch.where(off_p, 0.0, m["token_weight"])
    return out


def _padded(weights: Tensor, ids: Tensor) -> tuple[Tensor, Tensor]:
    """weights (fp32) and ids (int32) padded to the token bucket (padded tokens route
    nowhere: the plan reads the first T rows only)."""
    wp, _ = pad_to_bucket(weights.detach().to(torch.float32), 0)
    ip, _ = pad_to_bucket(ids.detach().to(torch.int32), 0)
    return wp, ip


def _config_and_plan(
    op: str,
    kernel: Any,
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_up: Tensor | None = None,
) -> tuple[Any, int, dict[str, Tensor], tuple[Tensor, Tensor]]:
    """(config, static block count, the plan with off-rank slots dropped, the padded
    on-rank (weights, ids) it was planned from)."""
    e = w_gate_up.shape[0]
    if not tracing(ids):
        _check_ids(ids, e)
    weights, ids, off = _on_rank(weights, ids, e)
    wp, ip = _padded(weights, ids)
    problem = _problem(wp.shape[0], w_gate_up, ids.shape[1], w_up)
    cfg = lookup_config(op, problem, kernel, target=get_target(None))
    assert isinstance(cfg, MoEMLPConfig | MoEMLPBwdConfig)
    sized = isinstance(cfg, MoEMLPConfig)  # the forward runs variable-size blocks
    meta, static = _plan(wp, ip, hidden.shape[0], e, cfg.block_size, None, sized)
    return cfg, static, _drop_off_rank(meta, off, hidden.shape[0]), (wp, ip)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    hidden, weights, ids, w_gate_up, w_down, w_up = ctx.saved_tensors
    dh, dw, dgu, dd, dup = torch.ops.nki.moe_experts_backward(
        grad, hidden, weights, ids, w_gate_up, w_down, None, w_up
    )
    return dh, dw.to(weights.dtype), None, dgu, dd, (dup if w_up is not None else None)


def _train_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.save_for_backward(*inputs, output[1])


def _train_backward(ctx: Any, grad: Tensor, grad_gate_up: Any) -> tuple[Any, ...]:
    hidden, weights, ids, w_gate_up, w_down, w_up, gate_up = ctx.saved_tensors
    dh, dw, dgu, dd, dup = torch.ops.nki.moe_experts_backward(
        grad, hidden, weights, ids, w_gate_up, w_down, gate_up, w_up
    )
    return dh, dw.to(weights.dtype), None, dgu, dd, (dup if w_up is not None else None)


def _examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    t, h, i, e, k = 37, 32, 48, 6, 3
    x = torch.randn(t, h, generator=g, requires_grad=True)
    w = torch.rand(t, k, generator=g, requires_grad=True)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)])
    wgu = (torch.randn(e, h, 2 * i, generator=g) / h**0.5).requires_grad_()
    wd = (torch.randn(e, i, h, generator=g) / i**0.5).requires_grad_()
    # gate and up as two tensors, transposed storage (TorchTitan's w1 / w3 [E, I, H])
    gate, up = ((torch.randn(e, i, h, generator=g) / h**0.5).transpose(1, 2).requires_grad_()
                for _ in range(2))  # fmt: skip
    x2 = torch.randn(70, h, generator=g, requires_grad=True)
    w2 = torch.rand(70, k, generator=g, requires_grad=True)
    ids2 = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(70)])
    return [((x, w, ids, wgu, wd), {}), ((x2, w2, ids2, gate, wd, up), {})]


@define_op(
    "moe_experts",
    fake=lambda hidden, *a: torch.empty_like(hidden),
    validate=_check,
    backward=_backward,
    setup_context=_setup,
    examples=_examples,
    traceable=True,
)
def moe_experts(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
) -> Tensor:
    """sum_j weights[t, j] * SwiGLU-expert_{ids[t, j]}(hidden[t]) (NKI expert kernels);
    `w_up`: the up weight as a tensor of its own (w_gate_up then the gate's [E, H, I])."""
    return _experts_forward(hidden, weights, ids, (w_gate_up, w_down, w_up), save=False)[0]


def _experts_forward(
    hidden: Tensor, weights: Tensor, ids: Tensor, ws: tuple[Any, Any, Any], save: bool
) -> tuple[Tensor, Tensor | None]:
    """(out, the saved gate / up or None): the body of `moe_experts` (save=False) and of
    `moe_experts_train` (save=True; decode-mode calls save nothing, the backward recomputes)."""
    t = hidden.shape[0]
    w_gate_up, w_down, w_up = ws
    if use_decode_mode(t, None):  # T <= 64: the decode kernel (moe_decode.py)
        e = w_gate_up.shape[0]
        if not tracing(ids):
            _check_ids(ids, e)
        w_on, ids_on, off = _on_rank(weights.detach(), ids, e)
        wgu, wd = w_gate_up.detach(), w_down.detach()
        wup = None if w_up is None else w_up.detach()
        out = decode_experts(hidden.detach(), w_on, ids_on, wgu, wd, wup)
        return torch.where(off.all(dim=1, keepdim=True), torch.zeros_like(out), out), None
    cfg, _, m, (wp, ip) = _config_and_plan(
        "moe_mlp", moe_mlp_fwd, hidden, weights, ids, w_gate_up, w_up
    )
    assert isinstance(cfg, MoEMLPConfig)
    hp, _ = pad_to_bucket(hidden.detach(), 0)
    if not save:
        out = launch_experts_fwd(hp, w_gate_up, w_down, cfg, m, w_up=w_up)
        return unpad(out, 0, t).contiguous(), None
    problem = _problem(wp.shape[0], w_gate_up, ids.shape[1], w_up)
    bcfg = lookup_config("moe_mlp_bwd", problem, moe_mlp_bwd, target=get_target(None))
    assert isinstance(bcfg, MoEMLPBwdConfig)
    # the backward plans the same padded on-rank routing (off-rank slots only become
    # padding slots there, which keeps every block's columns)
    lowest = min(t, _bucket_floor(wp.shape[0]))
    args = (wp, ip, t, w_gate_up.shape[0], cfg.block_size, bcfg.block_size, None, lowest)
    plan = call_host_op("moe_save_plan", *args) if tracing(wp, ip) else _save_plan(*args)
    out, gate_up = launch_experts_fwd(hp, w_gate_up, w_down, cfg, m, tuple(plan), w_up)
    return unpad(out, 0, t).contiguous(), gate_up


def _train_fake(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    t, k = int(hidden.shape[0]), int(ids.shape[1])
    e, i2 = int(w_gate_up.shape[0]), gate_up_width(w_gate_up, w_up)
    if use_decode_mode(t, None):
        return torch.empty_like(hidden), hidden.new_empty((i2, 0))
    from ..runtime.buckets import bucket

    tb = bucket(t)
    problem = _problem(tb, w_gate_up, k, w_up)
    bcfg = lookup_config("moe_mlp_bwd", problem, moe_mlp_bwd, target=get_target(None))
    assert isinstance(bcfg, MoEMLPBwdConfig)
    width = _save_width(tb, k, e, bcfg.block_size, None)
    return torch.empty_like(hidden), hidden.new_empty((i2, width))


@define_op(
    "moe_experts_train",
    fake=_train_fake,
    validate=_check,
    backward=_train_backward,
    setup_context=_train_setup,
    examples=_examples,
    traceable=True,
)
def moe_experts_train(
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    w_up: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(`moe_experts`' output, the saved pre-activation gate / up [2I, slots of the
    backward's plan], or [2I, 0] in decode mode): what `moe_experts` runs when autograd
    records it."""
    out, gate_up = _experts_forward(hidden, weights, ids, (w_gate_up, w_down, w_up), save=True)
    if gate_up is None:  # decode mode: nothing saved, the backward recomputes
        gate_up = hidden.new_empty((gate_up_width(w_gate_up, w_up), 0))
    return out, gate_up


route_recorded_calls(moe_experts, "moe_experts", "moe_experts_train")


def _bwd_fake(
    grad: Tensor,
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    gate_up: Tensor | None = None,
    w_up: Tensor | None = None,
) -> Any:
    return (
        torch.empty_like(hidden),
        weights.new_empty(weights.shape, dtype=torch.float32),
        torch.empty_like(w_gate_up),
        torch.empty_like(w_down),
        hidden.new_empty((0,)) if w_up is None else torch.empty_like(w_up),
    )


@define_op(
    "moe_experts_backward",
    fake=_bwd_fake,
    validate=lambda grad, *a: _check(*a[:5], *a[6:7]),
    examples=lambda: [((torch.randn(37, 32), *(x.detach() for x in _examples()[0][0])), {})],
    traceable=True,
)
def moe_experts_backward(
    grad: Tensor,
    hidden: Tensor,
    weights: Tensor,
    ids: Tensor,
    w_gate_up: Tensor,
    w_down: Tensor,
    gate_up: Tensor | None = None,
    w_up: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(d hidden, d weights (fp32), d w_gate_up, d w_down, d w_up (empty without w_up)) of
    `moe_experts` (NKI kernels), each weight gradient in its weight's layout; `gate_up`:
    `moe_experts_train`'s saved gate / up (None or empty: recomputed)."""
    t = hidden.shape[0]
    cfg, static, m, _ = _config_and_plan(
        "moe_mlp_bwd", moe_mlp_bwd, hidden, weights, ids, w_gate_up, w_up
    )
    assert isinstance(cfg, MoEMLPBwdConfig)
    hp, _ = pad_to_bucket(hidden.detach(), 0)
    gp, _ = pad_to_bucket(grad.detach().to(hidden.dtype), 0)
    width = gate_up_width(w_gate_up, w_up)
    saved = _saved_gate_up(gate_up, width, m, cfg.block_size, "moe_experts_train")
    dh, dw, dgu, dd, dup = launch_experts_bwd(
        hp, gp, w_gate_up, w_down, cfg, (m, static), saved, w_up
    )
    dw = unpad(dw, 0, t)
    dw = torch.where(ids == w_gate_up.shape[0], torch.zeros_like(dw), dw)  # not on this rank
    dup = hidden.new_empty((0,)) if dup is None else dup
    return unpad(dh, 0, t).contiguous(), dw.contiguous(), dgu, dd, dup
