"""`patch` / `unpatch` for Hugging Face transformers (5.x) decoder models.

For Llama, Mistral, Qwen2, Qwen3, Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3 and
GPT-OSS (`config.model_type`):

- every `*RMSNorm` module (the layers' norms, the final norm, Qwen3's q / k norms)
  becomes `nki_kernels.nn.RMSNorm` holding the *same* weight Parameter;
- attention runs the "nki" attention implementation (`hf_attention`: the attention
  function and its mask function, registered together);
- every sparse-MoE block (transformers 5's fused experts: `gate` router, `experts` with
  `gate_up_proj` / `down_proj`, Qwen2-MoE's shared expert) becomes `HFSparseMoeBlock`,
  which keeps the block's own router and experts modules as children: the parameters and
  state_dict keys do not change, the optimizer keeps its references, and the router still
  runs as a module, so `output_router_logits=True` (the load-balancing loss) sees it;
- the experts' [E, 2I, H] / [E, H, I] Parameters reach the kernels as transposed views,
  no copy: the decode kernel and the blockwise prefill / training kernels read that
  storage in place (DMA transposes), and the backward writes the weight gradients in
  the Parameters' layout;
- a shared expert (Qwen2-MoE's sigmoid-gated `shared_expert`, DeepSeek-V3's
  `shared_experts`: nn.Linear gate / up / down) is fused into the decode launch for calls
  of <= 64 tokens that need no gradient (generate), its Linear weights read where they
  lie (`moe_gated_experts(shared_up=...)`); otherwise it runs as the model's own module;
  DeepSeek-V3's MoE block becomes `HFSharedMoE` for that (same children);
- DeepSeek-V3's router module (group-limited sigmoid top-k with a selection-only
  correction bias and a routed scaling factor) runs `moe.routing.route` (the NKI router)
  as a subclass of its class sharing its Parameters, buffer and hooks (transformers'
  router-logit recorder still finds it); its `experts` modules become `HFExperts` on
  `torch.ops.nki.moe_experts`, holding the same Parameters; its attention (MLA) keeps
  the model's implementation (reported as skipped);
- GPT-OSS's router module (its linear with bias, softmax over the top-k logits) runs
  `route` the same way; its `experts` become `HFGatedExperts` on `moe_gated_experts`
  (gate_up / down biases, the clamped SwiGLU over interleaved gate / up columns, the
  model's alpha and limit), holding the same Parameters; its attention (learned sinks,
  sliding-window layers) runs the "nki" implementation with the sinks (`sink_attention`,
  or flash_attention's log-sum-exp joined with the sink).

`unpatch` puts every original module and the previous attention implementation back.
"""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.norm import RMSNorm
from . import hf_attention

SUPPORTED_MODEL_TYPES = (
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v3",
    "gpt_oss",
)
# models whose router is not softmax-top-k over `gate`'s logits: their router module runs
# `moe.routing.route` (the NKI router with their options) and their `experts` module
# (transformers' experts seam, experts(hidden, top_k_index, top_k_weights)) the NKI experts
OWN_ROUTER_TYPES = ("deepseek_v3", "gpt_oss")
MOE_MLP_EXPERTS = (2, 128)  # moe_mlp's own router (top-k <= 8); wider blocks: moe_experts
# models whose attention stays the model's: (model_type, why)
OWN_ATTENTION = {
    "deepseek_v3": (
        "multi-head latent attention (q/k and v head dims differ): not on flash_attention"
    ),
}


@dataclass(frozen=True)
class Replacement:
    """One change `patch` made: where, what was there, what is there now."""

    path: str
    before: str
    after: str


@dataclass
class PatchReport:
    """What `patch` replaced (and what `unpatch` will restore)."""

    replaced: list[Replacement] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Replacements by kind ('RMSNorm -> nki RMSNorm': n, ...)."""
        out: dict[str, int] = {}
        for r in self.replaced:
            key = f"{r.before} -> {r.after}"
            out[key] = out.get(key, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"{n:4d} x {kind}" for kind, n in self.counts().items()]
        lines += [f"skipped {path}: {why}" for path, why in self.skipped]
        return "\n".join(lines) or "nothing replaced"


class HFSparseMoeBlock(nn.Module):
    """A transformers-5 sparse-MoE block on `torch.ops.nki.moe_mlp` (SwiGLU experts); with
    more than 128 experts or top-k > 8 (up to 512 / 16) on the gate's own routing and
    `torch.ops.nki.moe_experts`.

    Children are the original block's: `gate` (router, its logits [T, E] feed the op),
    `experts` (weights read through transposed views, no copy) and, for Qwen2-MoE,
    `shared_expert` / `shared_expert_gate` (fused into the decode launch with the gate's
    own routing at decode sizes without gradients: `shared_decode_weights`).
    """

    def __init__(self, block: nn.Module, renormalize: bool) -> None:
        super().__init__()
        src: Any = block
        for name, child in src.named_children():  # in the block's order: same state_dict
            self.add_module(name, child)
        self.top_k = int(src.gate.top_k)
        self.renormalize = renormalize
        e = int(src.experts.gate_up_proj.shape[0])
        # moe_mlp's router takes 2..128 experts and top-k <= 8; beyond that (up to 512 /
        # 16) the model's own router feeds moe_experts
        self.on_moe_mlp = MOE_MLP_EXPERTS[0] <= e <= MOE_MLP_EXPERTS[1] and self.top_k <= 8
        self.jitter_noise = float(getattr(src, "jitter_noise", 0.0) or 0.0)

    def forward(self, hidden_states: Tensor) -> Tensor:
        """[B, S, H] -> [B, S, H] (the router's logits are recorded by its own module)."""
        shape = hidden_states.shape
        if self.training and self.jitter_noise > 0:
            noise = torch.empty_like(hidden_states).uniform_(
                1.0 - self.jitter_noise, 1.0 + self.jitter_noise
            )
            hidden_states = hidden_states * noise
        tokens = hidden_states.reshape(-1, shape[-1])
        me: Any = self
        ex = me.experts
        fused = None
        if hasattr(self, "shared_expert"):
            fused = shared_decode_weights(me.shared_expert, me.shared_expert_gate, tokens,
                                          ex.gate_up_proj, ex.down_proj)  # fmt: skip
        if fused is not None:  # the model's own routing, one decode launch with the shared
            from ..ops.moe_gated_experts import moe_gated_experts

            _, weights, ids = me.gate(tokens)
            out = moe_gated_experts(tokens, weights, ids, ex.gate_up_proj.transpose(1, 2),
                                    ex.down_proj.transpose(1, 2), **fused)  # fmt: skip
            return out.reshape(shape)
        if self.on_moe_mlp:
            logits = me.gate(tokens)[0]
            out = torch.ops.nki.moe_mlp(
                tokens,
                logits,
                ex.gate_up_proj.transpose(1, 2),
                ex.down_proj.transpose(1, 2),
                top_k=self.top_k,
                renormalize=self.renormalize,
            )
        else:
            _, weights, ids = me.gate(tokens)
            out = torch.ops.nki.moe_experts(tokens, weights, ids, ex.gate_up_proj.transpose(1, 2),
                                            ex.down_proj.transpose(1, 2))  # fmt: skip
        if hasattr(self, "shared_expert"):
            out = out + F.sigmoid(me.shared_expert_gate(tokens)) * me.shared_expert(tokens)
        return out.reshape(shape)


def shared_decode_weights(
    shared: nn.Module, gate: nn.Module | None, tokens: Tensor, *params: Tensor
) -> dict[str, Any] | None:
    """The shared expert's weights as `moe_gated_experts` keywords when this call is fused
    into the decode launch (T <= 64, no gradient asked of any input, SwiGLU nn.Linear
    gate / up / down without biases in the tokens' dtype; `gate`: Qwen2-MoE's [1, H]
    sigmoid gate), else None (the model's own module runs). Views only: no copy."""
    from ..ops.moe_decode import DECODE_MAX_TOKENS

    if tokens.shape[0] > DECODE_MAX_TOKENS or tokens.shape[0] == 0:
        return None
    lins = [getattr(shared, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    if not all(type(m) is nn.Linear and m.bias is None for m in lins):
        return None
    if type(getattr(shared, "act_fn", None)).__name__ != "SiLUActivation":
        return None
    if gate is not None and not (type(gate) is nn.Linear and gate.bias is None
                                 and tuple(gate.weight.shape) == (1, tokens.shape[1])):  # fmt: skip
        return None
    g_w, u_w, d_w = (m.weight for m in lins)  # type: ignore[union-attr]
    ws = [g_w, u_w, d_w] + ([gate.weight] if gate is not None else [])  # type: ignore[union-attr]
    if any(w.dtype != tokens.dtype or w.device != tokens.device for w in ws):
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (tokens, *ws, *params)):
        return None
    out = {"shared_gate_up": g_w.t(), "shared_up": u_w.t(), "shared_down": d_w.t()}
    if gate is not None:
        out["shared_gate"] = gate.weight.reshape(-1)  # type: ignore[union-attr]
    return out


class HFSharedMoE(nn.Module):
    """DeepSeek-V3's MoE block (router `gate`, `experts`, `shared_experts`) with the
    shared expert fused into the decode launch at decode sizes without gradients
    (`shared_decode_weights`); otherwise the block's own computation (its children,
    patched or not). Children are the block's: same Parameters and state_dict keys."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        for name, child in block.named_children():
            self.add_module(name, child)

    def forward(self, hidden_states: Tensor) -> Tensor:
        """[B, S, H] -> [B, S, H]."""
        me: Any = self
        shape = hidden_states.shape
        tokens = hidden_states.reshape(-1, shape[-1])
        ex = me.experts
        fused = shared_decode_weights(me.shared_experts, None, tokens, ex.gate_up_proj,
                                      ex.down_proj)  # fmt: skip
        _, weights, ids = me.gate(hidden_states)
        if fused is not None:
            from ..ops.moe_gated_experts import moe_gated_experts

            out = moe_gated_experts(tokens, weights, ids, ex.gate_up_proj.transpose(1, 2),
                                    ex.down_proj.transpose(1, 2), **fused)  # fmt: skip
            return out.reshape(shape)
        out = ex(tokens, ids, weights).reshape(shape)
        return out + me.shared_experts(hidden_states)  # type: ignore[no-any-return]


class HFExperts(nn.Module):
    """transformers' fused experts module on `torch.ops.nki.moe_experts` (SwiGLU).

    Holds the original `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I] Parameters
    (same state_dict keys) and reads them through transposed views; routing comes from
    the caller (the model's own router: DeepSeek-V3's group-limited sigmoid top-k with
    its correction bias and scaling factor stays exactly the model's).
    """

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        src: Any = experts
        self.gate_up_proj = src.gate_up_proj
        self.down_proj = src.down_proj
        self.num_experts = int(src.gate_up_proj.shape[0])

    def forward(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        """[T, H], ids [T, k], weights [T, k] -> [T, H]."""
        return torch.ops.nki.moe_experts(
            hidden_states,
            top_k_weights,
            top_k_index,
            self.gate_up_proj.transpose(1, 2),
            self.down_proj.transpose(1, 2),
        )


class HFGatedExperts(nn.Module):
    """transformers' GPT-OSS experts module on `moe_gated_experts` (NKI grouped_mm and
    expert_act kernels): gate_up_proj [E, H, 2I] with (gate, up) interleaved, down_proj
    [E, I, H], both biases, the clamped SwiGLU with the module's alpha and limit. Holds
    the original Parameters (same state_dict keys); routing comes from the caller."""

    def __init__(self, experts: nn.Module) -> None:
        super().__init__()
        src: Any = experts
        self.gate_up_proj = src.gate_up_proj
        self.gate_up_proj_bias = src.gate_up_proj_bias
        self.down_proj = src.down_proj
        self.down_proj_bias = src.down_proj_bias
        self.alpha = float(src.alpha)
        self.limit = float(src.limit)
        self.num_experts = int(src.gate_up_proj.shape[0])

    def forward(
        self, hidden_states: Tensor, router_indices: Tensor, routing_weights: Tensor
    ) -> Tensor:
        """[T, H], ids [T, k], weights [T, k] -> [T, H]."""
        from ..ops.moe_gated_experts import moe_gated_experts

        return moe_gated_experts(
            hidden_states,
            routing_weights,
            router_indices,
            self.gate_up_proj,
            self.down_proj,
            b_gate_up=self.gate_up_proj_bias,
            b_down=self.down_proj_bias,
            activation="gpt_oss",
            interleaved=True,
            alpha=self.alpha,
            limit=self.limit,
        )


def _deepseek_v3_route(self: Any, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """DeepseekV3TopkRouter.forward on the NKI router: fp32 logits (the model's linear),
    then sigmoid scores, the correction bias for selection only, group-limited top-k,
    renormalization (+ 1e-20) and the routed scaling factor (`moe.routing.route`)."""
    from ..moe.routing import route

    h = hidden_states.view(-1, self.hidden_dim)
    logits = F.linear(h.type(torch.float32), self.weight.type(torch.float32))
    weights, ids = route(
        logits, top_k=self.top_k, scoring="sigmoid", bias=self.e_score_correction_bias,
        n_group=self.num_group, topk_group=self.topk_group,
        renormalize=bool(self.norm_topk_prob), scaling=float(self.routed_scaling_factor),
    )  # fmt: skip
    return logits, weights, ids


def _gpt_oss_route(self: Any, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """GptOssTopKRouter.forward on the NKI router: the model's linear (with its bias),
    then the softmax over the top-k logits (`moe.routing.route`)."""
    from ..moe.routing import route

    logits = F.linear(hidden_states, self.weight, self.bias)
    weights, ids = route(logits, top_k=self.top_k, softmax_after_topk=True, renormalize=False)
    return logits, weights.to(logits.dtype), ids


ROUTE_FORWARDS = {"deepseek_v3": _deepseek_v3_route, "gpt_oss": _gpt_oss_route}
_ROUTER_CLASSES: dict[type, type] = {}
_ROUTER_CLASSES_LOCK = threading.Lock()


def _is_own_router(m: nn.Module, kind: str) -> bool:
    """The router module of DeepSeek-V3 / GPT-OSS (their routing options in one module)."""
    name = type(m).__name__
    return kind in ROUTE_FORWARDS and name.endswith(("TopkRouter", "TopKRouter"))


def router_unsupported(kind: str, router: nn.Module) -> str | None:
    """Why a router cannot run on `moe.routing.route` (None: it can)."""
    r: Any = router
    e, k = int(r.weight.shape[0]), int(r.top_k)
    if not 1 <= e <= 512 or not 1 <= k <= min(e, 16):
        return f"{e} experts, top-{k} (supported: up to 512 experts, top-k <= 16)"
    if kind == "deepseek_v3":
        n, g = int(r.num_group), int(r.topk_group)
        if e % n or not 1 <= g <= n or g * (e // n) < k:
            return f"n_group {n} / topk_group {g} do not hold top-{k} of {e} experts"
    return None


def _nki_router(old: nn.Module, kind: str) -> nn.Module:
    """The same router (same Parameters, buffers and hooks; a subclass of its class, so
    transformers' router-logit recorder still finds it) whose forward runs `route`."""
    cls = type(old)
    with _ROUTER_CLASSES_LOCK:  # models patched on several threads share one subclass
        sub = _ROUTER_CLASSES.get(cls)
        if sub is None:
            body = {"forward": ROUTE_FORWARDS[kind], "__module__": __name__}
            sub = _ROUTER_CLASSES[cls] = type(f"Nki{cls.__name__}", (cls,), body)
    new = copy.copy(old)
    new.__class__ = sub
    return new


def _is_gpt_oss_experts(m: nn.Module) -> bool:
    return (
        all(
            isinstance(getattr(m, n, None), torch.Tensor)
            for n in ("gate_up_proj", "gate_up_proj_bias", "down_proj", "down_proj_bias")
        )
        and hasattr(m, "alpha")
        and hasattr(m, "limit")
    )


def experts_unsupported(model: nn.Module, experts: nn.Module) -> str | None:
    """Why an experts module cannot run on `moe_experts` / `moe_gated_experts` (None: it can)."""
    config: Any = model.config
    gpt_oss = _model_type(model) == "gpt_oss"
    if gpt_oss and not _is_gpt_oss_experts(experts):
        return "GPT-OSS experts without gate_up_proj / down_proj and their biases"
    if not gpt_oss and (
        getattr(experts, "gate_up_proj_bias", None) is not None or hasattr(experts, "alpha")
    ):
        return "experts with biases outside GPT-OSS (no patch rule for this model type)"
    act = getattr(config, "hidden_act", "silu")
    if act != "silu" and not gpt_oss:
        return f"expert activation {act!r} (the kernel is SwiGLU: silu)"
    w: Any = getattr(experts, "gate_up_proj", None)
    if w is None or w.dim() != 3:
        return "experts without a fused gate_up_proj [E, 2I, H]"
    e, k = int(w.shape[0]), int(getattr(config, "num_experts_per_tok", 1))
    if not 1 <= e <= 512 or not 1 <= k <= min(e, 16):
        return f"{e} experts, top-{k} (supported: 1..512 experts, top-k <= 16)"
    if w.dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {w.dtype} (supported: float32, bfloat16)"
    return None


def _is_shared_moe(m: nn.Module) -> bool:
    """DeepSeek-V3's MoE block: router `gate`, fused `experts`, MLP `shared_experts`."""
    return all(hasattr(m, n) for n in ("gate", "experts", "shared_experts")) and hasattr(
        m.experts, "gate_up_proj"
    )


def is_hf_model(model: nn.Module) -> bool:
    """A transformers PreTrainedModel (has a config with an attention implementation)."""
    config = getattr(model, "config", None)
    return config is not None and hasattr(config, "_attn_implementation")


def _model_type(model: nn.Module) -> str:
    return str(getattr(model.config, "model_type", ""))  # type: ignore[union-attr]


def is_hf_rmsnorm(m: nn.Module) -> bool:
    """transformers' RMSNorm modules: weight * x / rms(x), eps in `variance_epsilon`."""
    w = getattr(m, "weight", None)
    return (
        type(m).__name__.endswith("RMSNorm")
        and hasattr(m, "variance_epsilon")
        and isinstance(w, nn.Parameter)
        and w.dim() == 1
    )


def is_hf_sparse_moe(m: nn.Module) -> bool:
    """transformers 5's sparse-MoE blocks (router `gate` + fused `experts`)."""
    gate, experts = getattr(m, "gate", None), getattr(m, "experts", None)
    return (
        gate is not None
        and hasattr(gate, "top_k")
        and hasattr(gate, "weight")
        and experts is not None
        and hasattr(experts, "gate_up_proj")
        and hasattr(experts, "down_proj")
    )


def _is_experts_seam(m: nn.Module) -> bool:
    """A fused experts module called as experts(hidden, top_k_index, top_k_weights)."""
    return type(m).__name__.endswith("Experts") and hasattr(m, "gate_up_proj")


def moe_unsupported(model: nn.Module, block: nn.Module) -> str | None:
    """Why `block` cannot run on `moe_mlp` (None: it can)."""
    config: Any = model.config
    w: Any = getattr(block.experts, "gate_up_proj")  # noqa: B009
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        return f"expert activation {act!r} (the kernel is SwiGLU: silu)"
    e, k = int(w.shape[0]), int(block.gate.top_k)  # type: ignore[union-attr, arg-type]
    if not 2 <= e <= 512 or not 1 <= k <= min(e, 16):
        return f"{e} experts, top-{k} (supported: 2..512 experts, top-k <= 16)"
    if w.dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {w.dtype} (supported: float32, bfloat16)"
    return None


def _set_child(model: nn.Module, path: str, new: nn.Module) -> nn.Module:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    old = getattr(parent, name)
    setattr(parent, name, new)
    return old


def _nki_norm(old: nn.Module) -> RMSNorm:
    w: Any = old.weight
    new = RMSNorm(w.shape[0], eps=float(old.variance_epsilon), device="meta")  # type: ignore[arg-type]
    new.weight = w
    return new


def _set_attn(model: nn.Module, name: str) -> None:
    model.set_attn_implementation(name)  # type: ignore[operator]


def patch_hf(
    model: nn.Module, *, attention: bool = True, norms: bool = True, moe: bool = True
) -> PatchReport:
    """Patch a transformers model in place (see module doc); returns what was replaced."""
    kind = _model_type(model)
    if kind not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model: expected a transformers model of type {', '.join(SUPPORTED_MODEL_TYPES)}; "
            f"got model_type {kind!r}"
        )
    if getattr(model, "_nki_patch", None) is not None:
        raise RuntimeError("model: already patched by nki_kernels.patch (unpatch it first)")
    report = PatchReport()
    undo: list[tuple[str, nn.Module]] = []
    for path, m in list(model.named_modules()):
        if norms and is_hf_rmsnorm(m):
            undo.append((path, _set_child(model, path, _nki_norm(m))))
            report.replaced.append(Replacement(path, type(m).__name__, "nki_kernels.nn.RMSNorm"))
        elif moe and _is_own_router(m, kind):
            why = router_unsupported(kind, m)
            if why is not None:
                report.skipped.append((path, why))
                continue
            router = _nki_router(m, kind)
            undo.append((path, _set_child(model, path, router)))
            report.replaced.append(Replacement(path, type(m).__name__, type(router).__name__))
        elif moe and kind == "deepseek_v3" and _is_shared_moe(m):
            why = experts_unsupported(model, m.experts)  # type: ignore[arg-type]
            why = why or router_unsupported(kind, m.gate)  # type: ignore[arg-type]
            if why is not None:
                report.skipped.append((path, why))
                continue
            block = HFSharedMoE(m)
            undo.append((path, _set_child(model, path, block)))
            report.replaced.append(Replacement(path, type(m).__name__, "HFSharedMoE"))
        elif moe and kind in OWN_ROUTER_TYPES and _is_experts_seam(m):
            why = experts_unsupported(model, m)
            if why is not None:
                report.skipped.append((path, why))
                continue
            new: nn.Module = HFGatedExperts(m) if kind == "gpt_oss" else HFExperts(m)
            undo.append((path, _set_child(model, path, new)))
            report.replaced.append(Replacement(path, type(m).__name__, type(new).__name__))
        elif moe and kind not in OWN_ROUTER_TYPES and is_hf_sparse_moe(m):
            why = moe_unsupported(model, m)
            if why is not None:
                report.skipped.append((path, why))
                continue
            renorm = bool(getattr(m.gate, "norm_topk_prob", True))
            undo.append((path, _set_child(model, path, HFSparseMoeBlock(m, renorm))))
            report.replaced.append(Replacement(path, type(m).__name__, "HFSparseMoeBlock"))
    previous = None
    if attention and kind in OWN_ATTENTION:
        report.skipped.append(("config._attn_implementation", OWN_ATTENTION[kind]))
    elif attention:
        hf_attention.register()
        previous = model.config._attn_implementation  # type: ignore[union-attr]
        _set_attn(model, hf_attention.NAME)
        report.replaced.append(Replacement("config._attn_implementation", str(previous), "nki"))
    model._nki_patch = (undo, previous)  # type: ignore[assignment]
    return report


def unpatch_hf(model: nn.Module) -> PatchReport:
    """Undo `patch_hf`: the original modules and attention implementation come back."""
    state = getattr(model, "_nki_patch", None)
    if state is None:
        raise RuntimeError("model: not patched by nki_kernels.patch")
    undo, previous = state
    report = PatchReport()
    for path, old in reversed(undo):
        new = _set_child(model, path, old)
        report.replaced.append(Replacement(path, type(new).__name__, type(old).__name__))
    if previous is not None:
        _set_attn(model, previous)
        report.replaced.append(Replacement("config._attn_implementation", "nki", previous))
    model._nki_patch = None  # type: ignore[assignment]
    return report


__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HFExperts",
    "HFGatedExperts",
    "HFSharedMoE",
    "HFSparseMoeBlock",
    "PatchReport",
    "Replacement",
    "is_hf_model",
    "patch_hf",
    "unpatch_hf",
]
