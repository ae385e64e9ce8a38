"""The interfaces the TorchTitan and Hugging Face Kernels integrations rely on, checked at
the pinned versions: a failure names the package, the installed and the tested version
and the seam that moved."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch

PINS = {"torchtitan": "0.3.0", "kernels": "0.19.1", "transformers": "5.25.0"}


def _installed(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def _seam(package: str, what: str, ok: bool) -> None:
    assert ok, (
        f"{package} {_installed(package)} (integration tested with {PINS[package]}): {what} "
        "changed; update nki_kernels/integrations and this test"
    )


def _attr(package: str, module: str, name: str):
    """`module.name`, or a failure naming the package, its versions and the seam."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        _seam(package, f"{module}.{name}", False)


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("package", sorted(PINS))
def test_pinned_version_installed(package: str) -> None:
    got = _installed(package)
    assert got == PINS[package], (
        f"{package}: expected the pinned {PINS[package]} (make install: the integrations "
        f"extra; torchtitan with --no-deps); got {got}"
    )


def test_integration_modules_pin_the_same_versions() -> None:
    from nki_kernels.integrations import hf_kernels, torchtitan

    assert torchtitan.TESTED_VERSION == PINS["torchtitan"]
    assert hf_kernels.TESTED_VERSION == PINS["kernels"]


def test_torchtitan_seams() -> None:
    import nki_kernels.integrations.torchtitan  # noqa: F401  (the triton stand-in first)

    attn = importlib.import_module("torchtitan.models.common.attention")
    moe = importlib.import_module("torchtitan.models.common.moe")
    decoder = importlib.import_module("torchtitan.models.common.decoder")
    model = importlib.import_module("torchtitan.protocols.model")
    p = "torchtitan"
    _seam(
        p,
        "VarlenMetadata fields",
        attn.VarlenMetadata._fields[:4] == ("cu_seq_q", "cu_seq_k", "max_q", "max_k"),
    )
    varlen = {f.name for f in dataclasses.fields(attn.VarlenAttention.Config)}
    _seam(p, "VarlenAttention.Config.window_size", "window_size" in varlen)
    for cls in (attn.VarlenAttention, attn.FlexAttention):
        params = _params(cls.forward)
        _seam(
            p,
            f"{cls.__name__}.forward(q, k, v, *, attention_masks, scale, out_transform)",
            params[1:4] == ["q_BLNH", "k_BLNH", "v_BLNH"]
            and {"attention_masks", "scale", "out_transform"} <= set(params),
        )
    _seam(
        p,
        "GroupedExperts._grouped_mm(*, A, B_t, offs)",
        _params(moe.GroupedExperts._grouped_mm)[1:] == ["A", "B_t", "offs"],
    )
    _seam(
        p,
        "GroupedExperts weights w1_EFD / w2_EDF / w3_EFD",
        {"w1_EFD", "w2_EDF", "w3_EFD"}
        <= set(inspect.getsource(moe.GroupedExperts.__init__).replace("self.", " ").split()),
    )
    router = {f.name for f in dataclasses.fields(moe.TokenChoiceTopKRouter.Config)}
    _seam(
        p,
        "TokenChoiceTopKRouter.Config options",
        {
            "top_k",
            "score_func",
            "route_norm",
            "route_scale",
            "num_expert_groups",
            "num_limited_groups",
            "_debug_force_load_balance",
        }
        <= router,
    )
    _seam(
        p,
        "TokenChoiceTopKRouter.forward(x, expert_bias)",
        _params(moe.TokenChoiceTopKRouter.forward)[1:] == ["x_BLD", "expert_bias_E"],
    )
    _seam(
        p,
        "MoE buffers expert_bias_E / tokens_per_expert_E",
        "expert_bias_E" in inspect.getsource(moe.MoE.__init__)
        and "tokens_per_expert_E" in inspect.getsource(moe.MoE.__init__),
    )
    _seam(
        p,
        "Decoder.get_attention_masks(positions)",
        _params(decoder.Decoder.get_attention_masks)[1:] == ["positions"],
    )
    _seam(p, "ModelConfigConverter.convert", hasattr(model.ModelConfigConverter, "convert"))
    for family in ("llama3", "deepseek_v3"):
        reg = importlib.import_module(f"torchtitan.models.{family}").model_registry
        _seam(
            p,
            f"{family}.model_registry(flavor, attn_backend, converters)",
            {"flavor", "attn_backend", "converters"} <= set(_params(reg)),
        )
    spec = _attr(p, "torchtitan.protocols.model_spec", "ModelSpec")
    _seam(
        p,
        "ModelSpec.post_optimizer_build_fn",
        "post_optimizer_build_fn" in {f.name for f in dataclasses.fields(spec)},
    )
    hook = _attr(p, "torchtitan.components.optimizer", "register_moe_load_balancing_hook")
    _seam(
        p,
        "register_moe_load_balancing_hook(optimizers, model_parts, parallel_dims)",
        _params(hook) == ["optimizers", "model_parts", "parallel_dims"],
    )
    apply_fsdp = _attr(p, "torchtitan.distributed.fsdp", "apply_fsdp_to_decoder")
    _seam(
        p,
        "apply_fsdp_to_decoder(model, mesh, *, param_dtype, reduce_dtype, pp_enabled)",
        {"param_dtype", "reduce_dtype", "pp_enabled"} <= set(_params(apply_fsdp)),
    )
    full_ac = _attr(p, "torchtitan.distributed.activation_checkpoint", "FullAC")
    _seam(p, "FullAC.Config().build(...).apply(model)", hasattr(full_ac, "Config"))


def test_kernels_seams() -> None:
    import kernels

    p = "kernels"
    _seam(
        p,
        "kernelize(model, *, mode, device, use_fallback)",
        {"mode", "device", "use_fallback"} <= set(_params(kernels.kernelize)),
    )
    _seam(
        p,
        "Mode.TRAINING / TORCH_COMPILE / INFERENCE",
        all(hasattr(kernels.Mode, m) for m in ("TRAINING", "TORCH_COMPILE", "INFERENCE")),
    )
    _seam(
        p,
        "LocalLayerRepository(repo_path, *, layer_name)",
        _params(kernels.LocalLayerRepository.__init__)[1:3] == ["repo_path", "layer_name"],
    )
    _seam(
        p,
        "replace_kernel_forward_from_hub(cls, layer_name)",
        _params(kernels.replace_kernel_forward_from_hub)[:2] == ["cls", "layer_name"],
    )


def test_transformers_seams() -> None:
    """What the kernels layers copy or read of transformers' modules."""
    from transformers.models.llama import modeling_llama
    from transformers.models.mixtral import modeling_mixtral

    p = "transformers"
    _seam(
        p,
        "LlamaRMSNorm marked 'RMSNorm' (use_kernel_forward_from_hub)",
        getattr(modeling_llama.LlamaRMSNorm, "kernel_layer_name", None) == "RMSNorm",
    )
    for cls in (modeling_llama.LlamaAttention, modeling_mixtral.MixtralAttention):
        _seam(
            p,
            f"{cls.__name__}.forward(hidden_states, position_embeddings, attention_mask, ...)",
            _params(cls.forward)[1:4] == ["hidden_states", "position_embeddings", "attention_mask"],
        )
    moe = modeling_mixtral.MixtralSparseMoeBlock
    _seam(
        p,
        "MixtralSparseMoeBlock.forward(hidden_states)",
        _params(moe.forward)[1:] == ["hidden_states"],
    )
    experts = inspect.getsource(modeling_mixtral.MixtralExperts.__init__)
    _seam(
        p,
        "MixtralExperts gate_up_proj / down_proj",
        "gate_up_proj" in experts and "down_proj" in experts,
    )
    t, cos = torch.ones(1, 1, 2, 4), torch.ones(1, 2, 4)  # q, k [B, N, S, D]; cos, sin [B, S, D]
    rotated = modeling_llama.apply_rotary_pos_emb(t, t, cos, cos)
    _seam(
        p,
        "apply_rotary_pos_emb(q, k, cos, sin) -> (q, k)",
        len(rotated) == 2 and all(r.shape == t.shape for r in rotated),
    )


@pytest.mark.parametrize("package", sorted(PINS))
def test_a_moved_seam_fails_naming_the_package_and_its_versions(package: str) -> None:
    with pytest.raises(AssertionError) as err:
        _seam(package, "some_function(a, b)", False)
    assert str(err.value).startswith(
        f"{package} {_installed(package)} (integration tested with {PINS[package]}): "
        "some_function(a, b) changed"
    )
    with pytest.raises(AssertionError, match=f"{package} .*: torch.no_such_module.f"):
        _attr(package, "torch.no_such_module", "f")
