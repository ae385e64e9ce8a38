"""`nki_kernels.nn.MoE`: a sparse mixture-of-experts feed-forward layer on `torch.ops.nki.moe_mlp`.

Parameters (the op's layout):

- `gate.weight` [E, H]: the router, logits = x @ gate.weight^T (a plain torch matmul);
- `w_gate_up` [E, H, 2I]: per expert, the gate projection in columns [:I] and the up
  projection in columns [I:], both applied as x @ W;
- `w_down` [E, I, H]: per expert, the down projection, applied as act @ W.

Loading a Mixtral-style sparse-MoE block (`gate` = Linear(H, E, bias=False); `experts[e]`
with `w1` = Linear(H, I) the gate projection, `w3` = Linear(H, I) the up projection and
`w2` = Linear(I, H) the down projection; routing softmax -> top-k -> renormalize):

    gate.weight              <- block.gate.weight                      [E, H]
    w_gate_up[e, :, :I]      <- block.experts[e].w1.weight.T           [H, I]
    w_gate_up[e, :, I:]      <- block.experts[e].w3.weight.T           [H, I]
    w_down[e]                <- block.experts[e].w2.weight.T           [I, H]

(nn.Linear stores weight as [out, in], so each projection is transposed once, at load.)

Hugging Face transformers 5 fuses the experts (`MixtralExperts`, `Qwen2MoeExperts`, ...):
`block.gate` is a router module with `weight` [E, H] and `top_k`, and
`block.experts.gate_up_proj` [E, 2I, H] (gate rows [:I], up rows [I:]) and
`block.experts.down_proj` [E, H, I], both applied as F.linear (x @ W^T):

    w_gate_up <- block.experts.gate_up_proj.transpose(1, 2)            [E, H, 2I]
    w_down    <- block.experts.down_proj.transpose(1, 2)               [E, I, H]

`load_mixtral` / `from_mixtral` read either layout. `forward(x, return_router_logits=True)`
also returns the router logits [T, E] (for a load-balancing auxiliary loss).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch
from torch import Tensor, nn

from ..moe.reference import MoERouting
from ..ops import moe as _moe_ops  # noqa: F401  (registers torch.ops.nki.moe_*)
from ..ops.checks import check_tensor
from ..ops.moe import MAX_EXPERTS, MIN_EXPERTS, _check_routing


class MoE(nn.Module):
    """SwiGLU mixture of experts: y = sum_j w_j * expert_{e_j}(x) over the top-k experts.

    `forward(x)` takes [..., H] and returns [..., H]; tokens are the flattened leading dims.
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        *,
        device: Any = None,
        dtype: torch.dtype | None = None,
        **routing: Any,
    ) -> None:
        """`routing`: renormalize (True), scoring ('softmax'), capacity_factor (None), as
        in `torch.ops.nki.moe_mlp` (`moe.reference.MoERouting`)."""
        super().__init__()
        for name, size in (("hidden_size", hidden_size), ("intermediate_size", intermediate_size),
                           ("num_experts", num_experts)):  # fmt: skip
            if isinstance(size, bool) or not isinstance(size, numbers.Integral) or size < 1:
                raise ValueError(f"{name}: expected a positive int; got {size!r}")
        if not MIN_EXPERTS <= num_experts <= MAX_EXPERTS:
            raise ValueError(
                f"num_experts: expected {MIN_EXPERTS}..{MAX_EXPERTS}; got {num_experts}"
            )
        r = MoERouting(top_k, **routing)
        _check_routing(torch.empty(1, num_experts, device="meta"), top_k, r.renormalize, r.scoring)
        factory = {"device": device, "dtype": dtype}
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_experts = num_experts
        self.routing = MoERouting(top_k, **routing)
        self.gate = nn.Linear(hidden_size, num_experts, bias=False, **factory)
        self.w_gate_up = nn.Parameter(
            torch.empty(num_experts, hidden_size, 2 * intermediate_size, **factory)
        )
        self.w_down = nn.Parameter(
            torch.empty(num_experts, intermediate_size, hidden_size, **factory)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Uniform(+-1/sqrt(fan_in)) per projection, as nn.Linear initializes."""
        self.gate.reset_parameters()
        with torch.no_grad():
            self.w_gate_up.uniform_(-(self.hidden_size**-0.5), self.hidden_size**-0.5)
            self.w_down.uniform_(-(self.intermediate_size**-0.5), self.intermediate_size**-0.5)

    def forward(self, x: Tensor, return_router_logits: bool = False) -> Any:
        """Route every token of `x` [..., H] to its top-k experts and combine their outputs;
        with `return_router_logits`, `(y, router_logits [T, E])`."""
        check_tensor("x", x, nonempty=False)
        if x.shape[-1] != self.hidden_size:
            raise ValueError(
                f"x: expected hidden size (last dim) {self.hidden_size}; got {tuple(x.shape)}"
            )
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.gate(tokens)
        y = torch.ops.nki.moe_mlp(
            tokens,
            logits,
            self.w_gate_up,
            self.w_down,
            **self.routing.kwargs(),
        ).reshape(x.shape)
        return (y, logits) if return_router_logits else y

    @torch.no_grad()
    def load_mixtral(self, block: nn.Module) -> MoE:
        """Copy the weights of a Mixtral-style sparse-MoE block, per-expert Linears or
        transformers 5's fused experts (mappings in the module doc)."""
        src: Any = block
        if _is_fused(src):
            return self._load_fused(src)
        experts = list(src.experts)
        e, i = self.num_experts, self.intermediate_size
        if len(experts) != e:
            raise ValueError(f"block.experts: expected {e} experts; got {len(experts)}")
        gate_w = src.gate.weight
        if tuple(gate_w.shape) != (e, self.hidden_size):
            raise ValueError(
                f"block.gate.weight: expected {(e, self.hidden_size)}; got {tuple(gate_w.shape)}"
            )
        self.gate.weight.copy_(gate_w)
        for idx, ex in enumerate(experts):
            for name, shape in (("w1", (i, self.hidden_size)), ("w3", (i, self.hidden_size))):
                w = getattr(ex, name).weight
                if tuple(w.shape) != shape:
                    raise ValueError(
                        f"block.experts[{idx}].{name}.weight: expected {shape}; "
                        f"got {tuple(w.shape)}"
                    )
            if tuple(ex.w2.weight.shape) != (self.hidden_size, i):
                raise ValueError(
                    f"block.experts[{idx}].w2.weight: expected {(self.hidden_size, i)}; got "
                    f"{tuple(ex.w2.weight.shape)}"
                )
            self.w_gate_up[idx, :, :i].copy_(ex.w1.weight.T)
            self.w_gate_up[idx, :, i:].copy_(ex.w3.weight.T)
            self.w_down[idx].copy_(ex.w2.weight.T)
        return self

    def _load_fused(self, src: Any) -> MoE:
        e, h, i = self.num_experts, self.hidden_size, self.intermediate_size
        for name, t, shape in (
            ("block.gate.weight", src.gate.weight, (e, h)),
            ("block.experts.gate_up_proj", src.experts.gate_up_proj, (e, 2 * i, h)),
            ("block.experts.down_proj", src.experts.down_proj, (e, h, i)),
        ):
            if tuple(t.shape) != shape:
                raise ValueError(f"{name}: expected {shape}; got {tuple(t.shape)}")
        self.gate.weight.copy_(src.gate.weight)
        self.w_gate_up.copy_(src.experts.gate_up_proj.transpose(1, 2))
        self.w_down.copy_(src.experts.down_proj.transpose(1, 2))
        return self

    @classmethod
    def from_mixtral(cls, block: nn.Module, top_k: int | None = None, **kwargs: Any) -> MoE:
        """A new MoE (softmax scoring, renormalized top-k) holding `block`'s weights.

        `top_k` defaults to the block's router's (`block.gate.top_k`, transformers 5)."""
        src: Any = block
        gate_w = src.gate.weight
        e, h = gate_w.shape
        if top_k is None:
            top_k = getattr(src.gate, "top_k", None) or getattr(src, "top_k", None)
            if top_k is None:
                raise ValueError("top_k: expected an int (the block's router has no top_k)")
        if _is_fused(src):
            i = src.experts.down_proj.shape[2]
        else:
            i = src.experts[0].w1.weight.shape[0]
        kwargs.setdefault("dtype", gate_w.dtype)
        kwargs.setdefault("device", gate_w.device)
        return cls(h, i, e, top_k, **kwargs).load_mixtral(block)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
            f"num_experts={self.num_experts}, {self.routing}"
        )


def _is_fused(block: Any) -> bool:
    """transformers 5's layout: one experts module holding [E, ...] weight tensors."""
    return hasattr(block.experts, "gate_up_proj") and hasattr(block.experts, "down_proj")
