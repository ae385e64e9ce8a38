"""The interfaces the TorchTitan and Hugging Face Kernels integrations rely on, checked at
the pinned versions: a failure names the package, the installed and the tested version
and the seam that moved."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from importlib.metadata import PackageNotFoundError, version

import pytest

PINS = {"torchtitan": "0.3.0", "kernels": "0.19.1"}


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


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("package", sorted(PINS))
def test_pinned_version_installed(package: str) -> None:
    got = _installed(package)
    assert got == PINS[package], (
        f"{package}: expected the pinned {PINS[package]} (make install; torchtitan with "
        f"--no-deps); got {got}"
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
    from transformers.models.llama import modeling_llama

    _seam(
        p,
        "transformers' LlamaRMSNorm marked 'RMSNorm'",
        getattr(modeling_llama.LlamaRMSNorm, "kernel_layer_name", None) == "RMSNorm",
    )
