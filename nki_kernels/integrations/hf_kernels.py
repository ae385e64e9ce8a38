"""Hugging Face Kernels (`kernels` 0.19.1): the NKI layers as a local layer repository.

    from kernels import Mode
    from nki_kernels.integrations import hf_kernels

    hf_kernels.kernelize_model(model, device="neuron", mode=Mode.TRAINING)

The repository is a local directory shipped with the package (`REPO_PATH`:
`torch-universal/{metadata.json, nki_layers/}`, one variant directory, which kernels
finds at a repository's top level as under the Hub's `build/`); a universal variant, so
the same files load for `device="cpu"` and `device="neuron"`, nothing is downloaded.
Its layers (`nki_layers/layers.py`) follow the kernels rules: stateless, the replaced
layer's forward signature, `has_backward` / `can_torch_compile` declared.

Layers and the transformers classes they replace:

- `RMSNorm`: every class transformers marks `@use_kernel_forward_from_hub("RMSNorm")`
  (Llama, Mistral, Qwen, Mixtral, ...);
- `LlamaAttention`, `MixtralAttention`: not marked by transformers 5.25; `mark_layers()`
  marks them with kernels' `replace_kernel_forward_from_hub` (the package's function
  for layers it does not own);
- `MixtralSparseMoeBlock`: marked the same way.

`mapping()` is the kernels mapping (layer name -> {device: LocalLayerRepository}), for
`use_kernel_mapping` / `register_kernel_mapping` when you call `kernelize` yourself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

PACKAGE = "kernels"
TESTED_VERSION = "0.19.1"
REPO_PATH = Path(__file__).parent / "kernels_repo"
LAYERS = ("RMSNorm", "LlamaAttention", "MixtralAttention", "MixtralSparseMoeBlock")
DEVICES = ("cpu", "neuron")
# transformers classes kernels' kernelize does not see unless marked
_UNMARKED = {
    "LlamaAttention": ("transformers.models.llama.modeling_llama", "LlamaAttention"),
    "MixtralAttention": ("transformers.models.mixtral.modeling_mixtral", "MixtralAttention"),
    "MixtralSparseMoeBlock": (
        "transformers.models.mixtral.modeling_mixtral",
        "MixtralSparseMoeBlock",
    ),
}


def installed_version() -> str:
    """The installed kernels package's version ('' when absent)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return ""


def _kernels() -> Any:
    try:
        import kernels
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"nki_kernels.integrations.hf_kernels needs kernels=={TESTED_VERSION} "
            f"(installed: {installed_version() or 'none'}): pip install 'nki-kernels[integrations]'"
        ) from e
    return kernels


def mark_layers() -> list[str]:
    """Mark the transformers classes of `_UNMARKED` for kernelize (idempotent); returns
    the layer names marked."""
    import importlib

    kernels = _kernels()
    done = []
    for layer, (module, cls_name) in _UNMARKED.items():
        cls = getattr(importlib.import_module(module), cls_name)
        if getattr(cls, "kernel_layer_name", None) != layer:
            kernels.replace_kernel_forward_from_hub(cls, layer)
        done.append(layer)
    return done


def mapping(devices: tuple[str, ...] = DEVICES) -> dict[str, dict[str, Any]]:
    """{layer name: {device: LocalLayerRepository(REPO_PATH, layer_name)}}."""
    kernels = _kernels()
    return {
        name: {d: kernels.LocalLayerRepository(REPO_PATH, layer_name=name) for d in devices}
        for name in LAYERS
    }


def layer_classes() -> dict[str, type]:
    """The repository's layer classes by name, loaded as kernelize loads them."""
    return {name: repo.load() for name, repo in ((n, r["cpu"]) for n, r in mapping().items())}


def kernelize_model(model: nn.Module, *, device: str = "cpu", mode: Any = None) -> nn.Module:
    """`kernels.kernelize(model, device=device, mode=mode)` with this repository's mapping
    (default mode: Mode.TRAINING). Layers whose declared support lacks what `mode` asks
    for keep their original forward (kernels' own rule)."""
    kernels = _kernels()
    mark_layers()
    if device not in DEVICES:
        raise ValueError(f"device: expected one of {DEVICES}; got {device!r}")
    with kernels.use_kernel_mapping(mapping()):
        return kernels.kernelize(  # type: ignore[no-any-return]
            model, device=device, mode=kernels.Mode.TRAINING if mode is None else mode
        )


def kernelized(model: nn.Module) -> dict[str, int]:
    """Modules whose forward comes from this repository, by layer name."""
    out: dict[str, int] = {}
    for m in model.modules():
        fwd = m.__dict__.get("forward")
        owner = getattr(getattr(fwd, "__func__", None), "__qualname__", "")
        name = owner.split(".")[0]
        if name in LAYERS and getattr(fwd, "__module__", "").endswith("layers"):
            out[name] = out.get(name, 0) + 1
    return out


__all__ = [
    "DEVICES",
    "LAYERS",
    "PACKAGE",
    "REPO_PATH",
    "TESTED_VERSION",
    "installed_version",
    "kernelize_model",
    "kernelized",
    "layer_classes",
    "mapping",
    "mark_layers",
]
