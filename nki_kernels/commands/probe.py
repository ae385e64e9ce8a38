"""Which of a model's ops nki-kernels takes over, which not, and why (a dense mask,
dropout, head_dim, dtype, ...). It inspects modules and config; nothing runs.

MODEL: a built-in tiny model (tiny-llama, tiny-mixtral, or a transformers model type:
llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe), a local directory holding a
transformers config.json (built on the meta device: no weights, no download), or a
Python entry point module:function returning an nn.Module."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

NAME = "probe"
HELP = "list which of a model's ops nki-kernels takes over, and why not for the others"


def load_model(spec: str) -> Any:
    """The model named by `spec` (see the command's description)."""
    from ..parity.models import BUILTIN, MODEL_TYPES, tiny_model

    if spec in BUILTIN:
        return BUILTIN[spec]()
    if spec in MODEL_TYPES:
        return tiny_model(spec)
    path = Path(spec)
    if (path / "config.json").is_file():
        import torch
        import transformers

        config = transformers.AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            return transformers.AutoModelForCausalLM.from_config(config)
    module, sep, attr = spec.partition(":")
    if not sep:
        raise SystemExit(
            f"MODEL: expected a built-in name ({', '.join([*BUILTIN, *MODEL_TYPES])}), a "
            f"directory with config.json or module:function; got {spec!r}"
        )
    return getattr(importlib.import_module(module), attr)()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's options."""
    p.add_argument("model", metavar="MODEL")


def run(args: argparse.Namespace) -> int:
    """Print the findings table."""
    from ..integrations.probe import probe, render

    print(render(probe(load_model(args.model))))
    return 0
