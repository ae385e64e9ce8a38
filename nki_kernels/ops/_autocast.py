"""Autocast rules of the `torch.ops.nki.*` ops: each behaves as its torch counterpart does
inside `torch.autocast("cpu" | "neuron", dtype=...)`.

A custom op has no autocast rule by default: autocast passes it by and it computes in
whatever dtypes it is given (so an fp32 model under bf16 autocast ran its MoE in fp32,
and `flash_attention` returned fp32 where SDPA returns bf16). The rules, by op:

- "lower" (`flash_attention` and `decode_attention`, like SDPA; `moe_mlp`'s hidden
  states and expert weights, like `linear`): floating inputs are cast to the autocast
  dtype. Where the op has no kernel for that dtype (the MoE kernels take fp32 and bf16,
  not fp16) it computes in fp32 and rounds its output to the autocast dtype, so the
  result's dtype is what torch would give;
- "input" (the norms, like `layer_norm` / `rms_norm` on CPU, which compute in their
  input's dtype): parameters (weight, bias) are cast to the activation's dtype, and the
  activations of `add_rms_norm` (x, residual) to their promoted dtype, as `x + residual`;
- "none" (`moe_route`, like `softmax` on CPU; and the backward ops, which autograd calls
  with the forward's dtypes): no rule, the op runs on its inputs as given.

A rule runs once, above autograd (the casts are recorded and differentiated), then
re-dispatches the op with autocast excluded, as `torch.library.register_autocast` does;
it is written here instead because that helper casts to one fixed dtype, while torch's
own "lower precision" ops follow the dtype of the enclosing autocast region.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from .registry import NAMESPACE

LOWER, INPUT, NONE = "lower", "input", "none"
ALL_FLOAT = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Rule:
    """An op's autocast rule: `kind`, the positions of the activations it casts (promoted
    together), the positions of the parameters that follow them, the dtypes it computes in."""

    kind: str
    activations: tuple[int, ...] = ()
    params: tuple[int, ...] = ()
    dtypes: tuple[torch.dtype, ...] = ALL_FLOAT


RULES: dict[str, Rule] = {
    "flash_attention": Rule(LOWER, (0, 1, 2)),
    "decode_attention": Rule(LOWER, (0, 1, 2)),
    "moe_mlp": Rule(LOWER, (0, 2, 3, 4), dtypes=(torch.float32, torch.bfloat16)),
    "grouped_mm": Rule(LOWER, (0, 1)),
    "moe_experts": Rule(LOWER, (0, 3, 4, 5), dtypes=(torch.float32, torch.bfloat16)),
    "rms_norm": Rule(INPUT, (0,), (1,)),
    "layer_norm": Rule(INPUT, (0,), (1, 2)),
    "add_rms_norm": Rule(INPUT, (0, 1), (2,)),
    "moe_route": Rule(NONE),
    "moe_route_options": Rule(NONE),  # as moe_route: the router computes in fp32
    "flash_attention_backward": Rule(NONE),
    "rms_norm_backward": Rule(NONE),
    "layer_norm_backward": Rule(NONE),
    "add_rms_norm_backward": Rule(NONE),
    "moe_route_backward": Rule(NONE),
    "moe_route_options_backward": Rule(NONE),
    "moe_mlp_backward": Rule(NONE),
    "moe_mlp_train": Rule(NONE),  # called by moe_mlp's autograd kernel, after its casts
    "moe_experts_train": Rule(NONE),  # called by moe_experts' autograd kernel, after its casts
    "grouped_mm_weight_grad": Rule(NONE),
    "moe_experts_backward": Rule(NONE),
    # as grouped_mm (its unfused form): hidden, expert / bias / shared weights lowered
    "moe_gated_decode": Rule(LOWER, (0, 3, 4, 5, 6, 7, 8, 9)),
    "expert_act": Rule(INPUT, (0,), (1,)),  # the bias follows the grouped_mm output's dtype
    "expert_act_backward": Rule(NONE),
    "moe_dispatch": Rule(NONE),  # a row gather (as index_select): the rows' own dtype
    "moe_dispatch_backward": Rule(NONE),
    "moe_combine": Rule(NONE),  # fp32 sums of the expert rows as given
    "moe_combine_backward": Rule(NONE),
    # serving: the KV cache (written in place) fixes the dtype; q, k, v must match it
    "serving_attention": Rule(NONE),
    "kv_cache_write": Rule(NONE),
    "sink_attention": Rule(LOWER, (0, 1, 2)),  # as flash_attention; the sinks stay fp32
}

_AUTOCAST_KEYS = {"cpu": "AutocastCPU", "neuron": "AutocastPrivateUse1"}
_registered: set[str] = set()
_LIB: torch.library.Library | None = None


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
        return x.to(dtype)
    return x


def _cast_at(args: tuple[Any, ...], positions: tuple[int, ...], dtype: torch.dtype) -> tuple:
    return tuple(_cast(a, dtype) if i in positions else a for i, a in enumerate(args))


def cast_args(rule: Rule, device: str, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], Any]:
    """The arguments as `rule` casts them inside autocast on `device`, and the dtype the
    outputs are rounded to afterwards (None: kept)."""
    if rule.kind == LOWER:
        want = torch.get_autocast_dtype(device)
        run = want if want in rule.dtypes else torch.float32
        return _cast_at(args, rule.activations, run), (want if run != want else None)
    dts = [args[i].dtype for i in rule.activations if isinstance(args[i], torch.Tensor)]
    target = dts[0]
    for d in dts[1:]:
        target = torch.promote_types(target, d)
    return _cast_at(args, rule.activations + rule.params, target), None


def _round(out: Any, dtype: torch.dtype) -> Any:
    if isinstance(out, tuple):
        return tuple(_round(o, dtype) for o in out)
    return _cast(out, dtype)


def _kernel(name: str, key: str, device: str) -> Callable[..., Any]:
    rule = RULES[name]
    op = getattr(getattr(torch.ops, NAMESPACE), name).default
    excluded = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, key))

    def autocast_kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        cast, round_to = cast_args(rule, device, args)
        with torch._C._ExcludeDispatchKeyGuard(excluded):
            out = op(*cast, **kwargs)
        return _round(out, round_to) if round_to is not None else out

    return autocast_kernel


def register(ops: Mapping[str, Any]) -> None:
    """Install the autocast rule of every op in `ops` that has one (idempotent)."""
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library(NAMESPACE, "IMPL")
    pu1 = torch._C._get_privateuse1_backend_name()
    devices = ["cpu"] + (["neuron"] if pu1 in ("privateuseone", "neuron") else [])
    for name in ops:
        if name in _registered or name not in RULES or RULES[name].kind == NONE:
            continue
        for device in devices:
            key = _AUTOCAST_KEYS[device]
            _LIB.impl(
                name,
                _kernel(name, key, pu1 if device == "neuron" else device),
                key,
                with_keyset=True,
            )
        _registered.add(name)


__all__ = ["INPUT", "LOWER", "NONE", "RULES", "Rule", "cast_args", "register"]
