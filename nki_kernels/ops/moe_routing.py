"""`torch.ops.nki.moe_route_options`: every routing option of 2026's MoE models on the NKI
router kernel (`moe/router_options.py`), forward and backward.

    moe_route_options(router_logits [T, E], bias [E] | None, *, top_k, scoring="softmax",
                      softmax_after_topk=False, n_group=0, topk_group=0, renormalize=True,
                      scaling=1.0) -> (weights [T, k] fp32, ids [T, k] int32)

The options are those of `moe.routing.route` (which calls this op; n_group = 0: no
groups). A call pads T to its bucket (padded tokens' rows are dropped), runs the kernel
and unpads; the backward (`moe_route_options_backward`, NKI) takes the forward's ids, so
d logits follows the selection that was made; bias and groups only select (no gradient).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..moe.router_options import moe_route_options_bwd, moe_route_options_fwd
from ..moe.routing import MAX_TOP_K, _check
from ..runtime import launch, pad_to_bucket, unpad
from ..targets import get_target
from .checks import FLOAT_DTYPES, check_tensor
from .moe_checks import check_route_grads
from .registry import define_op, tracing

OPTION_DEFAULTS: dict[str, Any] = {
    "scoring": "softmax",
    "softmax_after_topk": False,
    "n_group": 0,
    "topk_group": 0,
    "renormalize": True,
    "scaling": 1.0,
}
GRAD_OPTIONS = ("scoring", "softmax_after_topk", "renormalize", "scaling")


def _options(kw: dict[str, Any]) -> dict[str, Any]:
    return {**OPTION_DEFAULTS, **{k: v for k, v in kw.items() if k in OPTION_DEFAULTS}}


def _check_flags(o: dict[str, Any]) -> None:
    for arg in ("softmax_after_topk", "renormalize"):
        if not isinstance(o[arg], bool):
            raise TypeError(f"{arg}: expected a bool; got {o[arg]!r}")
    s = o["scaling"]
    if isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s):
        raise TypeError(f"scaling: expected a finite number; got {s!r}")
    for arg in ("n_group", "topk_group"):
        if isinstance(o[arg], bool) or not isinstance(o[arg], int):
            raise TypeError(f"{arg}: expected an int (0: no groups); got {o[arg]!r}")


def _validate(router_logits: Tensor, bias: Tensor | None = None, **kw: Any) -> None:
    o = _options(kw)
    _check_flags(o)
    groups = (o["n_group"] or None, o["topk_group"] or None)
    top_k: Any = kw.get("top_k")  # checked by _check
    _check(router_logits, top_k, o["scoring"], bias, groups, o["softmax_after_topk"])
    # the kernel reads fp32 / bf16 / fp16 logits, one or more tokens
    check_tensor("router_logits", router_logits, dtypes=FLOAT_DTYPES, min_dim=2)
    if bias is not None:
        check_tensor("bias", bias, dtypes=FLOAT_DTYPES, min_dim=1)
        if bias.device != router_logits.device:
            raise ValueError(
                f"bias: expected device {router_logits.device} (as router_logits); got "
                f"{bias.device}"
            )


def _fake(router_logits: Tensor, bias: Tensor | None = None, **kw: Any) -> tuple[Tensor, Tensor]:
    t, k = router_logits.shape[0], kw["top_k"]
    return (
        router_logits.new_empty((t, k), dtype=torch.float32),
        router_logits.new_empty((t, k), dtype=torch.int32),
    )


def _setup(
    ctx: Any, inputs: tuple[Any, ...], keyword_only_inputs: dict[str, Any], output: Any
) -> None:
    ctx.save_for_backward(inputs[0], output[1])
    o = _options(keyword_only_inputs)
    ctx.opts = {k: o[k] for k in GRAD_OPTIONS}


def _backward(ctx: Any, grad_weights: Tensor | None, grad_ids: Any) -> tuple[Any, ...]:
    logits, ids = ctx.saved_tensors
    if grad_weights is None:
        grad_weights = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
    d = torch.ops.nki.moe_route_options_backward(logits, ids, grad_weights, **ctx.opts)
    return d, None


def _examples() -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    g = torch.Generator().manual_seed(0)
    lg = torch.randn(37, 16, generator=g, requires_grad=True)
    bias = torch.randn(16, generator=g) * 0.3
    lb = torch.randn(5, 12, generator=g).to(torch.bfloat16)
    return [
        (
            (lg, bias),
            {"top_k": 4, "scoring": "sigmoid", "n_group": 4, "topk_group": 2, "scaling": 2.5},
        ),
        ((lg, None), {"top_k": 3, "softmax_after_topk": True, "renormalize": False}),
        ((lb, None), {"top_k": 9, "renormalize": False}),
    ]


@define_op(
    "moe_route_options",
    fake=_fake,
    validate=_validate,
    backward=_backward,
    setup_context=_setup,
    examples=_examples,
    traceable=True,
)
def moe_route_options(
    router_logits: Tensor,
    bias: Tensor | None = None,
    *,
    top_k: int,
    scoring: str = "softmax",
    softmax_after_topk: bool = False,
    n_group: int = 0,
    topk_group: int = 0,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """(weights [T, k] fp32, ids [T, k] int32) of the top-k experts (NKI router)."""
    t = router_logits.shape[0]
    lp, _ = pad_to_bucket(router_logits.detach(), 0)
    b = None if bias is None else bias.detach().contiguous()
    weights, ids = launch(
        moe_route_options_fwd,
        lp.contiguous(),
        b,
        top_k,
        scoring,
        softmax_after_topk,
        n_group,
        topk_group,
        renormalize,
        float(scaling),
        target=get_target(None),
    )
    return unpad(weights, 0, t).contiguous(), unpad(ids, 0, t).contiguous()


def _check_bwd(router_logits: Tensor, ids: Tensor, grad_weights: Tensor, **kw: Any) -> None:
    o = _options(kw)
    _check_flags(o)
    _check(router_logits, 1, o["scoring"], None, (None, None))
    t, e = router_logits.shape
    check_tensor("ids", ids, dtypes=(torch.int32, torch.int64), min_dim=2)
    if ids.dim() != 2 or ids.shape[0] != t or not 1 <= ids.shape[1] <= min(e, MAX_TOP_K):
        raise ValueError(
            f"ids: expected [T={t}, k] with k in 1..{min(e, MAX_TOP_K)}; got {tuple(ids.shape)}"
        )
    check_route_grads(router_logits, ids, grad_weights)


@define_op(
    "moe_route_options_backward",
    fake=lambda router_logits, ids, grad_weights, **kw: torch.empty_like(router_logits),
    validate=_check_bwd,
    examples=lambda: [
        (
            (torch.randn(9, 6), torch.tensor([[4, 1]] * 9, dtype=torch.int32), torch.randn(9, 2)),
            {"scoring": "sigmoid", "renormalize": True, "scaling": 2.5},
        ),
        (
            (torch.randn(9, 6), torch.tensor([[0, 5]] * 9, dtype=torch.int32), torch.randn(9, 2)),
            {"softmax_after_topk": True, "renormalize": False},
        ),
    ],
    traceable=True,
)
def moe_route_options_backward(
    router_logits: Tensor,
    ids: Tensor,
    grad_weights: Tensor,
    *,
    scoring: str = "softmax",
    softmax_after_topk: bool = False,
    renormalize: bool = True,
    scaling: float = 1.0,
) -> Tensor:
    """d router_logits [T, E] (its dtype) from d weights and the forward's ids (NKI)."""
    e = router_logits.shape[1]
    if not tracing(ids) and ids.numel():  # values are read only where there are values
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= e:
            raise ValueError(f"ids: expected expert ids in [0, {e}); got min {lo}, max {hi}")
    t = router_logits.shape[0]
    lp, _ = pad_to_bucket(router_logits.detach(), 0)
    ip, _ = pad_to_bucket(ids.detach().to(torch.int32), 0)
    gp, _ = pad_to_bucket(grad_weights.detach().to(torch.float32), 0)
    d = launch(
        moe_route_options_bwd,
        lp.contiguous(),
        ip.contiguous(),
        gp.contiguous(),
        scoring,
        softmax_after_topk,
        renormalize,
        float(scaling),
        target=get_target(None),
    )
    return unpad(d, 0, t).contiguous()
