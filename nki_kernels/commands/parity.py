"""The golden-batch check: train a model N steps on the reference ops and on the NKI ops
(or on CPU and on the neuron device) with the same seed and data order, and report the
per-step loss deltas against a tolerance fixed from the noise floor before the run, the
first divergent step, non-finite gradients and a save / reload / continue check.

--model and --data take a built-in name or a Python entry point `module:function`:
model_factory(seed=, dtype=) -> nn.Module whose forward(**batch) returns a loss (or an
output with .loss); data_factory(seed, step) -> dict of the forward's arguments.
--model also takes a TorchTitan config name (`llama3_debugmodel`, `deepseekv3_debugmodel`;
`@N` keeps the first N blocks), trained with and without `NkiConverter` on packed-document
batches, and `kernels:<built-in>` (a tiny transformers model kernelized from the local
Hugging Face Kernels layer repository)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

NAME = "parity"
HELP = "golden-batch check: reference vs NKI ops, loss per step within the noise floor"

DTYPES = ("float32", "bfloat16")


def _entry(spec: str, builtin: dict[str, Any], what: str) -> Any:
    if spec in builtin:
        return builtin[spec]
    module, sep, attr = spec.partition(":")
    if not sep:
        raise SystemExit(
            f"--{what}: expected one of {', '.join(builtin)} or module:function; got {spec!r}"
        )
    return getattr(importlib.import_module(module), attr)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The command's options."""
    p.add_argument(
        "--model",
        action="append",
        help="tiny-llama, tiny-mixtral, a TorchTitan config name (llama3_debugmodel[@layers], "
        "deepseekv3_debugmodel), kernels:tiny-llama or module:fn (repeatable; default: "
        "both built-ins)",
    )
    p.add_argument(
        "--data",
        default=None,
        help="tiny-lm, packed-docs or module:fn (default: packed-docs for TorchTitan models, "
        "tiny-lm otherwise)",
    )
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="N > 1: the same check under DDP and FSDP2 on N CPU processes (torchrun, gloo), "
        "with a sharded checkpoint restored mid-run in fresh processes",
    )
    p.add_argument(
        "--device",
        choices=("neuron",),
        default=None,
        help="compare the NKI ops on the neuron device against CPU",
    )
    p.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="|Δloss| bound (default: from the noise floor)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("parity-report"),
        help="directory for <model>-<dtype>.json and parity.png",
    )


def _is_titan(spec: str) -> bool:
    from ..parity.titan import parse

    return parse(spec.partition("@")[0]) is not None


def _data_for(spec: str, given: str | None) -> str:
    return given or ("packed-docs" if _is_titan(spec) else "tiny-lm")


def _model_factory(spec: str, builtin: dict[str, Any]) -> Any:
    from ..parity.models import special_factory

    return special_factory(spec) or _entry(spec, builtin, "model")


def _distributed(args: argparse.Namespace) -> int:
    from ..parity import distributed

    models = args.model or ["tiny-llama", "tiny-mixtral"]
    data = {_data_for(m, args.data) for m in models}
    if len(data) > 1:
        raise SystemExit(
            "--data: TorchTitan and transformers models take different batches; with --nproc, "
            "run them in separate commands or pass --data"
        )
    reports = distributed.launch(
        args.nproc, models, data.pop(), args.steps, args.seed, args.lr, args.tolerance, args.out
    )
    for m, r in reports.items():
        print("\n".join(distributed.summary(r)))
        print(f"[parity] wrote {distributed.report_path(args.out, m, args.nproc)}")
    png = distributed.plot(list(reports.values()), args.out / f"parity-dist{args.nproc}.png")
    print(f"[parity] wrote {png}" if png else "[parity] no plot (matplotlib not installed)")
    return 0 if all(r["passed"] for r in reports.values()) else 1


def run(args: argparse.Namespace) -> int:
    """Run the check for each model; exit 1 when any fails."""
    import torch

    from ..parity import report as rep
    from ..parity.data import BUILTIN as DATA
    from ..parity.harness import run_parity
    from ..parity.models import BUILTIN as MODELS

    if args.nproc < 1:  # 0 or less ran the single-process check as if 1 had been given
        raise ValueError(f"--nproc: expected an int >= 1; got {args.nproc}")
    if args.nproc > 1:
        return _distributed(args)
    if args.device == "neuron":
        from ..testing import neuron_device

        emulated = neuron_device.install()  # before any backward (no-op with a real device)
        print(
            "[parity] device neuron: EMULATED (host memory; the NKI ops run in the "
            "interpreter, as on CPU: this checks the neuron code path, not Trainium)"
            if emulated
            else "[parity] device neuron: a real Neuron device (TorchNeuron)"
        )
    reports = []
    for spec in args.model or list(MODELS):
        factory = _model_factory(spec, MODELS)
        data = _entry(_data_for(spec, args.data), DATA, "data")
        r = run_parity(
            factory,
            data,
            name=spec,
            steps=args.steps,
            seed=args.seed,
            dtype=getattr(torch, args.dtype),
            lr=args.lr,
            device=args.device,
            tolerance=args.tolerance,
        )
        print(rep.table(r))
        stem = spec.replace(":", "_").replace("@", "-")
        path = rep.write_json(r, args.out / f"{stem}-{args.dtype}.json")
        print(f"[parity] wrote {path}")
        reports.append(r)
    png = rep.plot(reports, args.out / f"parity-{args.dtype}.png")
    print(f"[parity] wrote {png}" if png else "[parity] no plot (matplotlib not installed)")
    return 0 if all(r.passed for r in reports) else 1
