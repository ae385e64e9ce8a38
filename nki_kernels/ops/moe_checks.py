"""Argument checks of the MoE ops (`moe.py`, `moe_experts.py`, ...): routing options, the
hidden / logits / weight tensors and their shapes, the backward's ids. Each error names
the argument, the expected and the received value."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ..moe.reference import MoERouting
from ..moe.router import TOPK_MAX
from .checks import FLOAT_DTYPES, check_positive, check_tensor

MIN_EXPERTS, MAX_EXPERTS = 2, 128
ID_DTYPES = (torch.int32, torch.int64)
HIDDEN_DTYPES = (torch.float32, torch.bfloat16)
SCORINGS = ("softmax", "sigmoid")


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
    check_up_down(w_gate_up, w_up, w_down, hidden)
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
    check_route_grads(router_logits, ids, grad_weights)


def _check_ids(ids: Tensor, e: int) -> None:
    """ids' values are expert ids in [0, E)."""
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= e:
        raise ValueError(f"ids: expected expert ids in [0, {e}); got min {lo}, max {hi}")


def check_route_grads(router_logits: Tensor, ids: Tensor, grad_weights: Tensor) -> None:
    """A router backward's grad_weights: ids' shape, and both on router_logits' device."""
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


def check_up_down(w_gate_up: Tensor, w_up: Tensor | None, w_down: Tensor, hidden: Tensor) -> None:
    """w_up (if given) against w_gate_up, and w_down [E, I, H] against both and hidden."""
    e, h = int(w_gate_up.shape[0]), int(hidden.shape[-1])
    check_up(w_gate_up, w_up, hidden)
    i = gate_up_width(w_gate_up, w_up) // 2
    if tuple(w_down.shape) != (e, i, h):
        raise ValueError(
            f"w_down: expected [E, I, H] = {(e, i, h)} (from w_gate_up and hidden); got "
            f"{tuple(w_down.shape)}"
        )
