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
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..moe.reference import MoERouting
from ..ops import moe as _moe_ops  # noqa: F401  (registers torch.ops.nki.moe_*)


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

    def forward(self, x: Tensor) -> Tensor:
        """Route every token of `x` [..., H] to its top-k experts and combine their outputs."""
        tokens = x.reshape(-1, x.shape[-1])
        logits = self.gate(tokens)
        y = torch.ops.nki.moe_mlp(
            tokens,
            logits,
            self.w_gate_up,
            self.w_down,
            **self.routing.kwargs(),
        )
        return y.reshape(x.shape)

    @torch.no_grad()
    def load_mixtral(self, block: nn.Module) -> MoE:
        """Copy the weights of a Mixtral-style sparse-MoE block (mapping in the module doc)."""
        src: Any = block
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

    @classmethod
    def from_mixtral(cls, block: nn.Module, top_k: int, **kwargs: Any) -> MoE:
        """A new MoE (softmax scoring, renormalized top-k) holding `block`'s weights."""
        src: Any = block
        gate_w = src.gate.weight
        e, h = gate_w.shape
        i = src.experts[0].w1.weight.shape[0]
        kwargs.setdefault("dtype", gate_w.dtype)
        kwargs.setdefault("device", gate_w.device)
        return cls(h, i, e, top_k, **kwargs).load_mixtral(block)

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, intermediate_size={self.intermediate_size}, "
            f"num_experts={self.num_experts}, {self.routing}"
        )
