"""TorchTitan (0.3.0): the NKI ops selected by TorchTitan's own model-config converters.

    from torchtitan.models.llama3 import model_registry
    from nki_kernels.integrations.torchtitan import NkiConverter

    spec = model_registry("debugmodel", converters=[NkiConverter.Config()])
    model = spec.model.build()          # a stock Llama3Model on the NKI ops

TorchTitan 0.3.0 builds every module from a tree of `Config` dataclasses, and a
`ModelConfigConverter` rewrites that tree before the build (its Float8 / MXFP8 / LoRA
converters work this way). `NkiConverter` replaces, by config class:

- the inner attention: `FlexAttention.Config` -> `NkiFlexAttention` (the BlockMask the
  model builds, causal + packed documents, sliding window or any mask_mod, GQA,
  score_mod, the LSE for `out_transform`) and `VarlenAttention.Config` ->
  `NkiVarlenAttention` (cu_seqlens documents, `window_size` causal / full / sliding,
  GQA, LSE). Both subclass TorchTitan's, so `Decoder.get_attention_masks` builds the
  same masks; DeepSeek's MLA (value head dim != query head dim) is zero-padded;
- every `RMSNorm.Config` -> `NkiRMSNorm` (`torch.ops.nki.rms_norm`);
- the MoE: `MoE.Config` -> `NkiMoE`, which runs routing and experts in one
  `torch.ops.nki.moe_mlp` when the router's options map onto the kernel's (softmax or
  sigmoid scores, `route_norm`, `route_scale`, no expert groups, a zero load-balancing
  bias), else the router and `torch.ops.nki.moe_experts` (when the build has it), else
  TorchTitan's own dispatch with `NkiGroupedExperts`, whose `_grouped_mm(A, B_t, offs)`
  seam calls `torch.ops.nki.grouped_mm` when the build has it;
  `TokenChoiceTopKRouter.Config` -> `NkiRouter` (top-k on `torch.ops.nki.moe_route`
  when its options allow). What ran where is counted in `fallbacks()`.

Parameters, buffers and state_dict keys are TorchTitan's, so checkpoints, FSDP2
(`apply_fsdp_to_decoder`) and activation checkpointing apply unchanged.

TorchTitan 0.3.0 imports triton at module level for its CUDA-only expert-parallel
dispatch (`distributed.minimal_async_ep.kernels`); CPU and Neuron builds of torch have
no triton, so when triton is absent that one module is registered as a stand-in whose
functions raise (expert parallelism over CUDA symmetric memory is unavailable anyway).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

PACKAGE = "torchtitan"
TESTED_VERSION = "0.3.0"
_EP_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"


def installed_version() -> str:
    """The installed torchtitan's version ('' when absent)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return ""


def _triton_absent() -> bool:
    try:
        return importlib.util.find_spec("triton") is None
    except (ImportError, ValueError):  # present in sys.modules without a spec, or broken
        return False


def _triton_stand_in() -> None:
    """Register the stand-in only when triton cannot be found at all and the real module
    was not imported: an installed triton, even a broken one, is never shadowed."""
    if not _triton_absent() or _EP_KERNELS in sys.modules:
        return
    stand_in = types.ModuleType(_EP_KERNELS)

    def missing(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def needs_triton(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(
                f"torchtitan's minimal async expert parallelism ({name}) needs triton and "
                "CUDA; this torch build has no triton"
            )

        return needs_triton

    stand_in.__getattr__ = missing  # type: ignore[method-assign]
    sys.modules[_EP_KERNELS] = stand_in


_triton_stand_in()
try:
    from torch.nn.attention.flex_attention import BlockMask
    from torchtitan.models.common.attention import FlexAttention, VarlenAttention, VarlenMetadata
    from torchtitan.models.common.moe import GroupedExperts, MoE, TokenChoiceTopKRouter
    from torchtitan.models.common.nn_modules import RMSNorm
    from torchtitan.protocols.model import ModelConfigConverter
    from torchtitan.protocols.module import Module
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        f"nki_kernels.integrations.torchtitan needs torchtitan=={TESTED_VERSION} "
        f"(installed: {installed_version() or 'none'}): {e}. Install it with "
        f"`pip install --no-deps torchtitan=={TESTED_VERSION}` and the `integrations` extra."
    ) from e

import nki_kernels  # noqa: E402  (registers the ops)

from ..nn.norm import RMSNorm as _NkiRMSNormModule  # noqa: E402
from ..ops import moe as _moe_ops  # noqa: E402

_COUNTS: Counter[str] = Counter()
_COUNTS_LOCK = threading.Lock()


def _record_path(path: str) -> None:
    """One more call on `path`. Eager calls take the lock (forwards may run on several
    threads). Inside torch.compile no lock is taken (Dynamo cannot trace one under
    fullgraph): the increment is a side effect that Dynamo applies after each run of
    the compiled graph, so it still counts calls, but unserialized against threads."""
    if torch.compiler.is_compiling():
        _COUNTS[path] += 1
        return
    with _COUNTS_LOCK:
        _COUNTS[path] += 1


def fallbacks() -> dict[str, int]:
    """Calls by path since the last reset: 'moe: fused moe_mlp', 'moe: torch dispatch
    (expert groups)', 'grouped_mm: torch._grouped_mm (no torch.ops.nki.grouped_mm)', ..."""
    with _COUNTS_LOCK:
        return dict(_COUNTS)


def reset_fallbacks() -> None:
    """Zero the counters of `fallbacks()`."""
    with _COUNTS_LOCK:
        _COUNTS.clear()


def has_op(name: str) -> bool:
    """Whether this build registers `torch.ops.nki.<name>`."""
    try:
        getattr(torch.ops.nki, name)
    except (AttributeError, RuntimeError):
        return False
    return True


def has_grouped_mm() -> bool:
    """Whether this build registers `torch.ops.nki.grouped_mm`."""
    return has_op("grouped_mm")


# ---- attention ------------------------------------------------------------------------
def _pad_head_dims(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
    """One head dim for q, k and v (zero columns change no score and no output column):
    MLA's value head dim differs from its query / key head dim."""
    dqk, dv = q.shape[-1], v.shape[-1]
    if dqk == dv:
        return q, k, v, dv
    d = max(dqk, dv)
    pad = lambda t: F.pad(t, (0, d - t.shape[-1]))  # noqa: E731
    return pad(q), pad(k), pad(v), dv


def _lse_out(out_BNLH: Tensor, lse_BNL: Tensor | None, dv: int, out_transform: Any) -> Tensor:
    out_BLNH = out_BNLH[..., :dv].transpose(1, 2)
    if out_transform is None:
        return out_BLNH
    assert lse_BNL is not None
    return out_transform(out_BLNH, lse_BNL.transpose(1, 2))  # type: ignore[no-any-return]


class NkiFlexAttention(FlexAttention):
    """TorchTitan's FlexAttention call (q, k, v [B, L, N, H], a BlockMask) on the NKI
    flash-attention kernels (`nki_kernels.flex_attention`: the mask_mod is evaluated
    once per call into the kernels' tile plan)."""

    @dataclass(kw_only=True, slots=True)
    class Config(FlexAttention.Config):
        pass

    def forward(  # type: ignore[override]
        self,
        q_BLNH: Tensor,
        k_BLNH: Tensor,
        v_BLNH: Tensor,
        *,
        attention_masks: Any,
        score_mod: Any = None,
        scale: float | None = None,
        enable_gqa: bool = False,
        out_transform: Any = None,
        **kwargs: Any,
    ) -> Tensor:
        if not isinstance(attention_masks, BlockMask):
            raise TypeError(
                "attention_masks: expected a torch BlockMask (the model's flex masks); got "
                f"{type(attention_masks).__name__}"
            )
        scale = q_BLNH.shape[-1] ** -0.5 if scale is None else scale
        q, k, v, dv = _pad_head_dims(q_BLNH, k_BLNH, v_BLNH)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        want_lse = out_transform is not None
        res: Any = nki_kernels.flex_attention(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=attention_masks,
            scale=scale,
            enable_gqa=q.shape[1] != k.shape[1],
            return_lse=want_lse,
        )
        out, lse = res if want_lse else (res, None)
        return _lse_out(out, lse, dv, out_transform)


def window_to_sliding(window_size: tuple[int, int]) -> tuple[bool, int | None]:
    """TorchTitan's (left, right) window -> (causal, sliding_window of the ops)."""
    left, right = (int(w) for w in window_size)
    if right == 0 and left == -1:
        return True, None
    if right == 0 and left >= 0:
        return True, left + 1  # the query itself and `left` keys before it
    if right == -1 and left == -1:
        return False, None
    raise ValueError(
        f"window_size: expected (-1, 0) causal, (W, 0) sliding or (-1, -1) full; got "
        f"{tuple(window_size)}"
    )


def _segments(cu: Tensor, total: int) -> Tensor:
    pos = torch.arange(total, device=cu.device)
    return torch.searchsorted(cu[1:].to(torch.int64), pos, right=True)


class NkiVarlenAttention(VarlenAttention):
    """TorchTitan's VarlenAttention call (documents by cu_seqlens, `window_size`) on the
    NKI flash-attention kernels, in the inputs' dtype (TorchTitan's own casts to bf16
    for flash-attn). Documents that stay within a batch row run as `segment_ids` per
    row; documents across rows run packed as one row."""

    @dataclass(kw_only=True, slots=True)
    class Config(VarlenAttention.Config):
        pass

    def __init__(self, config: Config) -> None:
        Module.__init__(self)  # not VarlenAttention's: it selects a CUDA flash-attn impl
        self.window_size = config.window_size
        self.causal, self.sliding = window_to_sliding(config.window_size)

    def forward(  # type: ignore[override]
        self,
        q_BLNH: Tensor,
        k_BLNH: Tensor,
        v_BLNH: Tensor,
        *,
        attention_masks: Any,
        scale: float | None = None,
        out_transform: Any = None,
        **kwargs: Any,
    ) -> Tensor:
        if not isinstance(attention_masks, VarlenMetadata):
            raise TypeError(
                "attention_masks: expected a VarlenMetadata (cu_seq_q, cu_seq_k, max_q, "
                f"max_k); got {type(attention_masks).__name__}"
            )
        meta = attention_masks
        b, length = q_BLNH.shape[:2]
        total = b * length
        cu_q, cu_k = meta.cu_seq_q, meta.cu_seq_k
        if cu_q is not cu_k and not torch.equal(cu_q.cpu(), cu_k.cpu()):
            raise ValueError(
                "attention_masks: expected cu_seq_q == cu_seq_k (self-attention over the "
                "same packed tokens); got different offsets"
            )
        scale = q_BLNH.shape[-1] ** -0.5 if scale is None else scale
        q, k, v, dv = _pad_head_dims(q_BLNH, k_BLNH, v_BLNH)
        seg = _segments(cu_q, total)
        rows = torch.arange(b + 1, device=cu_q.device) * length
        per_row = bool(torch.isin(rows, cu_q.to(rows.dtype)).all())
        if per_row:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            seg = seg.view(b, length)
        else:  # one packed row [1, N, B*L, H]
            q, k, v = (t.reshape(1, total, *t.shape[2:]).transpose(1, 2) for t in (q, k, v))
            seg = seg.view(1, total)
        want_lse = out_transform is not None
        out, lse = torch.ops.nki.flash_attention(
            q,
            k,
            v,
            segment_ids=seg,
            causal=self.causal,
            softmax_scale=scale,
            sliding_window=self.sliding,
            return_lse=want_lse,
        )
        if not per_row:  # [1, N, B*L, H] -> [B, N, L, H]; lse [1, N, B*L] -> [B, N, L]
            out = out[0].transpose(0, 1).reshape(b, length, *out.shape[1:2], out.shape[-1])
            out = out.transpose(1, 2)
            lse = lse[0].view(lse.shape[1], b, length).transpose(0, 1)
        return _lse_out(out, lse if want_lse else None, dv, out_transform)


# ---- norms ----------------------------------------------------------------------------
class NkiRMSNorm(RMSNorm):
    """TorchTitan's RMSNorm (torch.nn.RMSNorm's parameters and eps) on
    `torch.ops.nki.rms_norm`."""

    @dataclass(kw_only=True, slots=True)
    class Config(RMSNorm.Config):
        pass

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return _NkiRMSNormModule.forward(self, x)  # type: ignore[arg-type]


# ---- MoE ------------------------------------------------------------------------------
class NkiGroupedExperts(GroupedExperts):
    """TorchTitan's GroupedExperts with its `_grouped_mm(A, B_t, offs)` seam on
    `torch.ops.nki.grouped_mm` (A [R, K] sorted by expert, B_t [E, K, N], offs the
    cumulative group ends); torch._grouped_mm where the build has no such op."""

    @dataclass(kw_only=True, slots=True)
    class Config(GroupedExperts.Config):
        pass

    def _grouped_mm(self, *, A: Tensor, B_t: Tensor, offs: Tensor) -> Tensor:
        if has_grouped_mm():
            _record_path("grouped_mm: torch.ops.nki.grouped_mm")
            return torch.ops.nki.grouped_mm(A, B_t, offs)  # type: ignore[no-any-return]
        _record_path("grouped_mm: torch._grouped_mm (no torch.ops.nki.grouped_mm)")
        return torch._grouped_mm(A, B_t, offs=offs)


def _route_unsupported(router: Any, bias: Tensor | None) -> str | None:
    """Why the router's options do not map onto the NKI routing (None: they do)."""
    if router.num_expert_groups is not None:
        return "expert groups"
    if router._debug_force_load_balance:
        return "forced load balance (debug)"
    if router.score_func not in _moe_ops.SCORINGS:
        return f"score_func {router.score_func!r}"
    if not 1 <= router.top_k <= min(router.num_experts, _moe_ops.TOPK_MAX):
        return f"top_k {router.top_k}"
    if not _moe_ops.MIN_EXPERTS <= router.num_experts <= _moe_ops.MAX_EXPERTS:
        return f"{router.num_experts} experts"
    if bias is not None and bool((bias != 0).any()):
        return "a non-zero load-balancing bias (it changes the choice, not the weights)"
    return None


def _gate_logits(router: Any, x_TD: Tensor) -> Tensor:
    with torch.autocast(device_type=x_TD.device.type, dtype=torch.float32):
        return router.gate(x_TD).float()  # type: ignore[no-any-return]


def _scores(router: Any, logits: Tensor) -> Tensor:
    if router.score_func == "sigmoid":
        return torch.sigmoid(logits)
    return F.softmax(logits, dim=-1)


class NkiRouter(TokenChoiceTopKRouter):
    """TorchTitan's token-choice top-k router (sigmoid / softmax scores, `route_norm`,
    `route_scale`, expert groups, load-balancing bias) with the top-k and its weights
    on `torch.ops.nki.moe_route` when the options map onto it; TorchTitan's own code
    otherwise (expert groups, a non-zero bias, forced balance)."""

    @dataclass(kw_only=True, slots=True)
    class Config(TokenChoiceTopKRouter.Config):
        pass

    def forward(  # type: ignore[override]
        self, x_BLD: Tensor, expert_bias_E: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        why = _route_unsupported(self, expert_bias_E)
        if why is not None:
            _record_path(f"router: torch ({why})")
            return super().forward(x_BLD, expert_bias_E)  # type: ignore[no-any-return]
        _record_path("router: moe_route")
        b, length, d = x_BLD.shape
        logits = _gate_logits(self, x_BLD.reshape(b * length, d))
        weights, ids = torch.ops.nki.moe_route(
            logits,
            top_k=self.top_k,
            renormalize=bool(self.route_norm),
            scoring=self.score_func,
        )
        weights = weights * self.route_scale
        shape = (b, length, self.top_k)
        scores = _scores(self, logits).view(b, length, -1)
        return weights.view(shape), ids.to(torch.int64).view(shape), scores


class NkiMoE(MoE):
    """TorchTitan's MoE layer on the NKI ops, the first that applies:

    1. `fused`: routing and experts in one `torch.ops.nki.moe_mlp` when the router's
       options map onto the kernel's (see `_route_unsupported`);
    2. `nki_experts`: the router as configured (`NkiRouter`: any of TorchTitan's
       options) and the experts on `torch.ops.nki.moe_experts`, when the build has it;
    3. TorchTitan's own dispatch and combine around `NkiGroupedExperts`.

    The experts compute in bf16, as TorchTitan's GroupedExperts does; the shared
    experts and the load-balancing counters are TorchTitan's. 1 and 2 pass w1 / w3 / w2
    as transposed views, gate and up apart (`_weights`): the kernels read them where they
    lie and write their gradients in that layout, forward and backward, no per-call
    concatenation or transpose; a cast only for parameters not already bf16. At decode
    sizes (<= 64 tokens) without gradients, 1 and 2 route as configured and the experts
    run one decode launch (`_decode`)."""

    @dataclass(kw_only=True, slots=True)
    class Config(MoE.Config):
        fused: bool = True
        nki_experts: bool = True

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.fused = config.fused
        self.nki_experts = config.nki_experts

    def _count(self, ids: Tensor) -> None:
        me: Any = self
        if self.training:
            with torch.no_grad():
                counts = torch.bincount(ids.reshape(-1), minlength=me.router.num_experts)
                me.tokens_per_expert_E.add_(counts.to(me.tokens_per_expert_E.dtype))

    def _weights(self) -> tuple[Tensor, Tensor, Tensor]:
        """(gate [E, H, I], down [E, I, H], up [E, H, I]): transposed views of w1 / w2 /
        w3 as they lie, gate and up apart (the kernels read that storage in place, and
        the gradients come back in it: no concatenation, no transpose copy); bf16 as
        TorchTitan's GroupedExperts computes (a cast per call only for parameters not
        already bf16)."""
        experts: Any = self.routed_experts.inner_experts  # type: ignore[union-attr]
        ws = (experts.w1_EFD, experts.w2_EDF, experts.w3_EFD)
        gate, down, up = (w.transpose(1, 2).bfloat16() for w in ws)
        return gate, down, up

    def _decodes(self, x_BLD: Tensor) -> bool:
        """A call for the decode launch: <= 64 tokens, no gradient asked of it."""
        from ..ops.moe_decode import DECODE_MAX_TOKENS

        experts: Any = self.routed_experts.inner_experts  # type: ignore[union-attr]
        ws = (experts.w1_EFD, experts.w2_EDF, experts.w3_EFD)
        t = x_BLD.shape[0] * x_BLD.shape[1]
        grad = torch.is_grad_enabled() and any(w.requires_grad for w in (x_BLD, *ws))
        return 0 < t <= DECODE_MAX_TOKENS and not grad

    def _decode(self, x_TD: Tensor, weights: Tensor, ids: Tensor) -> Tensor:
        """One decode launch (`moe_gated_experts`' decode form) on w1 [E, I, H], w3 and
        w2 [E, H, I] as transposed views: the kernel reads that storage (DMA
        transposes), gate and up as two tensors; bf16 as the other paths."""
        from ..ops.moe_gated_experts import moe_gated_experts

        experts: Any = self.routed_experts.inner_experts  # type: ignore[union-attr]
        w1, w3, w2 = (w.transpose(1, 2).bfloat16()  # a no-op for bf16 parameters
                      for w in (experts.w1_EFD, experts.w3_EFD, experts.w2_EDF))  # fmt: skip
        return moe_gated_experts(x_TD.bfloat16(), weights.float(), ids, w1, w2, w_up=w3)

    def forward(self, x_BLD: Tensor) -> Tensor:  # type: ignore[override]
        me: Any = self
        router = me.router
        why = "disabled (fused=False)" if not self.fused else None
        why = why or _route_unsupported(router, me.expert_bias_E)
        b, length, d = x_BLD.shape
        x_TD = x_BLD.reshape(b * length, d)
        decode = self._decodes(x_BLD) and (why is None or self.nki_experts)
        if decode:
            _record_path("moe: decode launch (weights as they lie)")
            if why is None:  # the fused path's routing: TorchTitan's options on moe_route
                weights, ids, _ = NkiRouter.forward(router, x_BLD, None)
            else:
                weights, ids, _ = router(x_BLD, me.expert_bias_E)
            self._count(ids)
            out = self._decode(x_TD, weights.reshape(b * length, -1), ids.reshape(b * length, -1))
            out = out.type_as(x_BLD)
        elif why is None:
            _record_path("moe: fused moe_mlp")
            logits = _gate_logits(router, x_TD)
            self._count(torch.topk(_scores(router, logits), router.top_k, dim=-1).indices)
            gate, down, up = self._weights()
            out = torch.ops.nki.moe_mlp(
                x_TD.bfloat16(),
                logits,
                gate,
                down,
                up,
                top_k=router.top_k,
                renormalize=bool(router.route_norm),
                scoring=router.score_func,
            ).type_as(x_BLD)
            if router.route_scale != 1.0:
                out = out * router.route_scale
        elif self.nki_experts and has_op("moe_experts"):
            _record_path(f"moe: router + moe_experts (not fused: {why})")
            weights, ids, _ = router(x_BLD, me.expert_bias_E)
            self._count(ids)
            gate, down, up = self._weights()
            out = torch.ops.nki.moe_experts(
                x_TD.bfloat16(),
                weights.reshape(b * length, -1).float(),
                ids.reshape(b * length, -1),
                gate,
                down,
                up,
            ).type_as(x_BLD)
        else:
            _record_path(f"moe: torch dispatch (not fused: {why})")
            return super().forward(x_BLD)  # type: ignore[no-any-return]
        out = out.view(b, length, d)
        if me.shared_experts is not None:
            out = out + me.shared_experts(x_BLD)
        return out


# ---- the converter --------------------------------------------------------------------
_SWAPS: dict[str, tuple[type, type]] = {
    "attention": (FlexAttention.Config, NkiFlexAttention.Config),
    "varlen": (VarlenAttention.Config, NkiVarlenAttention.Config),
    "norms": (RMSNorm.Config, NkiRMSNorm.Config),
    "experts": (GroupedExperts.Config, NkiGroupedExperts.Config),
    "router": (TokenChoiceTopKRouter.Config, NkiRouter.Config),
    "moe": (MoE.Config, NkiMoE.Config),
}


def _as(new_cls: type, cfg: Any, **extra: Any) -> Any:
    values = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.init}
    return new_cls(**values, **extra)


def _replace_all(root: Any, old_cls: type, new_cls: type, **extra: Any) -> int:
    found = [
        (parent, attr, cfg)
        for _, cfg, parent, attr in root.traverse(old_cls, recurse=True)
        if type(cfg) is old_cls and parent is not None
    ]
    for parent, attr, cfg in found:
        new = _as(new_cls, cfg, **extra)
        if isinstance(parent, list):
            parent[attr] = new
        else:
            setattr(parent, attr, new)
    return len(found)


class NkiConverter(ModelConfigConverter):
    """Rewrites a TorchTitan model config so the built model runs on the NKI ops (see the
    module doc). `attention`, `norms`, `moe` choose what is swapped; `fused_moe=False`
    keeps TorchTitan's dispatch with the experts' grouped matmuls on the NKI op."""

    @dataclass(kw_only=True, slots=True)
    class Config(ModelConfigConverter.Config):
        attention: bool = True
        norms: bool = True
        moe: bool = True
        fused_moe: bool = True

    def __init__(self, config: Config) -> None:
        self.config = config
        self.replaced: dict[str, int] = {}

    def convert(self, model_config: Any) -> Any:
        c = self.config
        chosen = {
            "attention": c.attention,
            "varlen": c.attention,
            "norms": c.norms,
            "experts": c.moe,
            "router": c.moe,
            "moe": c.moe,
        }
        for kind, (old, new) in _SWAPS.items():
            if chosen[kind]:
                extra = {"fused": c.fused_moe} if kind == "moe" else {}
                self.replaced[kind] = _replace_all(model_config, old, new, **extra)
        return model_config


__all__ = [
    "PACKAGE",
    "TESTED_VERSION",
    "NkiConverter",
    "NkiFlexAttention",
    "NkiGroupedExperts",
    "NkiMoE",
    "NkiRMSNorm",
    "NkiRouter",
    "NkiVarlenAttention",
    "fallbacks",
    "has_grouped_mm",
    "has_op",
    "installed_version",
    "reset_fallbacks",
    "window_to_sliding",
]
