"""TorchTitan models for the parity harness, by TorchTitan's config names.

    llama3_debugmodel, deepseekv3_debugmodel        (`<module>_<flavor>`, any flavor)

`titan_factory(name)` returns a model factory for `run_parity` / `--nproc`: it builds the
model from TorchTitan's `model_registry(flavor, attn_backend=...)`, with
`NkiConverter` in its `converters` list for the NKI run and without it for the
reference. TorchTitan's own inner attention does not train on CPU (FlexAttention:
"does not support backward on CPU"; varlen: CUDA flash-attn only), so the reference
replaces only that module, by a converter of the same kind, with torch's SDPA on the
same mask (the BlockMask's mask_mod, or the cu_seqlens documents and window, made
dense); everything else is stock TorchTitan, including its bf16 grouped-mm experts.
The noise floor's second implementation runs SDPA on its math backend and the experts
one at a time with their products kept in fp32 (TorchTitan's experts compute in bf16
whatever the model's dtype; where a bf16 result is rounded is an implementation's free
choice, so that gap is part of the floor).

The optimizer gets what TorchTitan's trainer gives it: the model spec's
`post_optimizer_build_fn` (for MoE models, `register_moe_load_balancing_hook`: before each
step, the expert bias moves by the load-balance coefficient against each expert's token
count, summed over the ranks), called by `TitanLM.attach_optimizer`.

`titan_batches(seed, step)`: tokens [2, 64] in three packed documents (positions reset
to 0 at each start, as TorchTitan's dataloader emits them), labels the next token.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

FAMILIES = {"llama3": "torchtitan.models.llama3", "deepseekv3": "torchtitan.models.deepseek_v3"}
VOCAB, BATCH, SEQ, POOL = 2048, 2, 64, 4
DOC_STARTS = (0, 23, 41)


def parse(name: str) -> tuple[str, str] | None:
    """('llama3', 'debugmodel') for 'llama3_debugmodel'; None when not a TorchTitan name."""
    family, _, flavor = name.partition("_")
    return (family, flavor) if family in FAMILIES and flavor else None


def _sdpa(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, scale: float | None, math: bool
) -> Tensor:
    """q, k, v [B, L, N, H] -> [B, L, N, H] with a bool mask [B|1, 1, L, L]; `math`: on
    SDPA's math backend. The backend is chosen here, inside the module's forward, so an
    activation-checkpoint recomputation (run during backward) uses the same one."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    with sdpa_kernel([SDPBackend.MATH]) if math else contextlib.nullcontext():
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
    return out.transpose(1, 2)


def _reference_classes() -> dict[str, Any]:
    from torch.nn.attention.flex_attention import create_mask

    from ..integrations import torchtitan as tt

    class TorchFlexReference(tt.FlexAttention):
        """The FlexAttention call on torch's SDPA with the BlockMask's mask_mod."""

        math_sdpa = False  # the noise floor's run: SDPA's math backend

        @dataclass(kw_only=True, slots=True)
        class Config(tt.FlexAttention.Config):
            pass

        def forward(self, q, k, v, *, attention_masks, scale=None, **kw):  # type: ignore[no-untyped-def, override]
            b, length = q.shape[:2]
            allowed = create_mask(attention_masks.mask_mod, b, 1, length, length, q.device)
            return _sdpa(q, k, v, allowed, scale, self.math_sdpa)

    class TorchVarlenReference(tt.NkiVarlenAttention):
        """The VarlenAttention call on torch's SDPA with its documents and window."""

        math_sdpa = False  # the noise floor's run: SDPA's math backend

        @dataclass(kw_only=True, slots=True)
        class Config(tt.VarlenAttention.Config):
            pass

        def forward(self, q, k, v, *, attention_masks, scale=None, **kw):  # type: ignore[no-untyped-def, override]
            b, length = q.shape[:2]
            seg = tt._segments(attention_masks.cu_seq_q, b * length).view(b, length)
            i = torch.arange(length).view(length, 1)
            j = torch.arange(length).view(1, length)
            allowed = seg[:, :, None] == seg[:, None, :]
            if self.causal:
                allowed = allowed & (j <= i)
            if self.sliding is not None:
                allowed = allowed & (j > i - self.sliding)
            math = self.math_sdpa
            return _sdpa(q, k, v, allowed.unsqueeze(1), scale, math)

    class LoopGroupedExperts(tt.GroupedExperts):
        """The noise floor's second bf16 experts: one expert at a time, the same bf16
        inputs and weights, products kept in fp32 (TorchTitan's rounds each grouped
        matmul's output, and so SiLU(gate) * up, to bf16 before the down projection)."""

        @dataclass(kw_only=True, slots=True)
        class Config(tt.GroupedExperts.Config):
            pass

        def _grouped_mm(self, *, A, B_t, offs):  # type: ignore[no-untyped-def, override]
            outs, start = [], 0
            for e, end in enumerate(offs.tolist()):
                outs.append(A[start:end].float() @ B_t[e].float())
                start = end
            return torch.cat(outs)

    class ReferenceConverter(tt.ModelConfigConverter):
        """Only the inner attention (and, for the floor, the experts) replaced."""

        @dataclass(kw_only=True, slots=True)
        class Config(tt.ModelConfigConverter.Config):
            loop_experts: bool = False

        def __init__(self, config):  # type: ignore[no-untyped-def]
            self.config = config

        def convert(self, model_config):  # type: ignore[no-untyped-def]
            tt._replace_all(model_config, tt.FlexAttention.Config, TorchFlexReference.Config)
            tt._replace_all(model_config, tt.VarlenAttention.Config, TorchVarlenReference.Config)
            if self.config.loop_experts:
                tt._replace_all(model_config, tt.GroupedExperts.Config, LoopGroupedExperts.Config)
            return model_config

    return {"converter": ReferenceConverter}


class DataParallelDims:
    """What `register_moe_load_balancing_hook` reads of TorchTitan's ParallelDims, for
    data parallelism only (gloo on CPU: ParallelDims builds its meshes for TorchTitan's
    accelerator type): the "loss" mesh is the world (None in one process), no expert or
    tensor parallelism."""

    ep_enabled = False
    tp = 1

    def __init__(self) -> None:
        self._mesh: Any = None

    def get_optional_mesh(self, dims: str) -> Any:
        import torch.distributed as dist

        if dims != "loss":
            raise ValueError(f"dims: expected 'loss' (data parallelism only); got {dims!r}")
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return None
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            world = dist.get_world_size()
            self._mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("loss",))
        return self._mesh


class TitanLM(nn.Module):
    """A TorchTitan decoder with a causal-LM loss: forward(tokens, positions, labels) ->
    mean cross entropy (fp32). `layers` is TorchTitan's ModuleDict (FSDP2 and
    activation checkpointing wrap its blocks)."""

    def __init__(
        self,
        model: nn.Module,
        replaced: dict[str, int] | None = None,
        post_optimizer_build_fn: Any = None,
    ) -> None:
        super().__init__()
        self.model = model
        self.nki_replaced = replaced or {}
        self.math_sdpa = False
        self.post_optimizer_build_fn = post_optimizer_build_fn

    def attach_optimizer(self, opt: torch.optim.Optimizer) -> None:
        """Give `opt` the model spec's post-optimizer hooks, as TorchTitan's trainer does
        (a torch optimizer has the container's `register_step_pre_hook`)."""
        if self.post_optimizer_build_fn is not None:
            self.post_optimizer_build_fn(opt, [self.model], DataParallelDims())

    @property
    def layers(self) -> nn.Module:
        return self.model.layers  # type: ignore[return-value]

    def parity_alternative(self) -> TitanLM:
        """The same model on the noise floor's second torch implementation: each
        reference attention module on SDPA's math backend."""
        self.math_sdpa = True
        for m in self.model.modules():
            if hasattr(type(m), "math_sdpa"):
                cast(Any, m).math_sdpa = True  # a plain attribute, not a parameter / submodule
        return self

    def forward(self, tokens: Tensor, positions: Tensor, labels: Tensor) -> Tensor:
        masks = self.model.get_attention_masks(positions)  # type: ignore[operator]
        logits = self.model(tokens, positions, masks)
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def build(
    name: str,
    *,
    nki: bool,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    layers: int | None = None,
    attn_backend: str = "flex",
    alternative: bool = False,
) -> TitanLM:
    """TorchTitan's `name` model (see module doc), its first `layers` blocks if given."""
    import importlib

    from ..integrations import torchtitan as tt

    parsed = parse(name)
    if parsed is None:
        raise ValueError(
            f"model: expected a TorchTitan config name <module>_<flavor> with module in "
            f"{', '.join(FAMILIES)} (e.g. llama3_debugmodel); got {name!r}"
        )
    family, flavor = parsed
    registry = importlib.import_module(FAMILIES[family]).model_registry
    if nki:
        conv = tt.NkiConverter.Config()
    else:
        conv = _reference_classes()["converter"].Config(loop_experts=alternative)
    spec = registry(flavor, attn_backend=attn_backend, converters=[conv])
    config = spec.model
    if layers is not None:
        config.layers = config.layers[:layers]
    torch.manual_seed(seed)
    model = config.build()
    model.init_states(buffer_device=None)
    replaced = Counter(type(m).__name__ for m in model.modules() if type(m).__name__[:3] == "Nki")
    lm = TitanLM(cast_real(model, dtype), dict(replaced), spec.post_optimizer_build_fn)
    return lm.parity_alternative() if alternative else lm


def cast_real(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model` with its real floating-point parameters and buffers in `dtype`, in place.

    `nn.Module.to(dtype)` also casts complex tensors, and TorchTitan keeps its rotary
    table (`rope.cache`) complex: a real dtype would drop its imaginary part."""
    if not dtype.is_floating_point:
        raise ValueError(f"dtype: expected a real floating-point dtype; got {dtype}")
    return model._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)


def titan_factory(name: str, layers: int | None = None, attn_backend: str = "flex") -> Any:
    """A model factory for the harness: factory(seed=, dtype=, nki=, alternative=)."""

    def factory(
        seed: int = 0, dtype: torch.dtype = torch.float32, nki: bool = False, alternative=False
    ) -> TitanLM:
        return build(
            name,
            nki=nki,
            seed=seed,
            dtype=dtype,
            layers=layers,
            attn_backend=attn_backend,
            alternative=alternative,
        )

    factory.builds_nki = True  # type: ignore[attr-defined]
    factory.titan_name = name  # type: ignore[attr-defined]
    return factory


def titan_batches(seed: int, step: int) -> dict[str, Any]:
    """A packed-document batch for `step` (see module doc); steps cycle through 4."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step % POOL)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    positions = torch.arange(SEQ).repeat(BATCH, 1)
    for start, end in zip(DOC_STARTS, (*DOC_STARTS[1:], SEQ)):
        positions[:, start:end] = torch.arange(end - start)
    return {"tokens": ids[:, :-1], "positions": positions, "labels": ids[:, 1:]}


__all__ = [
    "FAMILIES",
    "DataParallelDims",
    "TitanLM",
    "build",
    "cast_real",
    "parse",
    "titan_batches",
    "titan_factory",
]
