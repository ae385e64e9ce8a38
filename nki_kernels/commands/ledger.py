"""What a model's training step or serving step costs, per layer and per dollar: Trainium
with this library's kernels vs TorchNeuron's native path (modeled by the cost model, with
its band), beside a GPU (measured rows). `nki_kernels/ledger/instances.json` records each
instance's hardware and the prices found for it, each with its kind (On-Demand / Capacity
Block), source and date; none was read on AWS's own page, so none is used unasked: give
one with `--price INSTANCE=USD_PER_HOUR[:KIND]`, or `--price INSTANCE=recorded` for the
instance's first recorded price (printed with its kind and source).

Committed rows cover every model at train / prefill S = 4096 and 8192 and decode B = 64 x
32K; a row priced before a change to the kernel, config or composition it prices is
printed marked 'stale' (`--refresh-stale` prices it again).

Examples:
  nki-kernels ledger --model llama3-8b --phase train --seq 8192
  nki-kernels ledger --model llama3-8b --phase decode --batch 64 --context 32768
  nki-kernels ledger --model mixtral-8x7b --phase train --seq 4096 \\
      --price trn2.48xlarge=USD --price p5en.48xlarge=USD \\
      --port-weeks 8 --engineer-cost 5000 --monthly-spend 200000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..ledger.ledger import Ledger
    from ..ledger.prices import Instance

NAME = "ledger"
HELP = "per-layer step time, tokens/s and cost per million tokens: ours vs native vs GPU"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..ledger.cli_args import add_shape_arguments

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    add_shape_arguments(parser)
    parser.add_argument(
        "--global-batch",
        type=int,
        help="train: sequences per optimizer step, to print the step time on one instance",
    )
    parser.add_argument("--instance", help="Trainium instance (default trn2.48xlarge / trn3-chip)")
    parser.add_argument("--gpu-instance", default=None, help="default p5en.48xlarge")
    parser.add_argument(
        "--gpu-rows", type=Path, help="measured GPU rows (default benchmarks/data/gpu_rows.jsonl)"
    )
    parser.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="INSTANCE=USD_PER_HOUR[:KIND]",
        help="an instance's hourly price (repeatable; KIND: on-demand, capacity-block, "
        "savings-plan, spot), or INSTANCE=recorded for its first price recorded in the data "
        "file; overrides the data file",
    )
    parser.add_argument("--port-weeks", type=float, help="engineer-weeks to port (payback)")
    parser.add_argument(
        "--engineer-cost", type=float, default=None, help="USD per engineer-week (payback)"
    )
    parser.add_argument(
        "--monthly-spend", type=float, help="current monthly GPU spend in USD (payback)"
    )
    parser.add_argument("--detail", action="store_true", help="every op with its source")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="draw cost per million tokens for train, prefill and decode (the given or "
        "default shapes) into this file",
    )


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ValueError as exc:
        print(f"ledger: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from ..ledger.cli_args import default_lnc, step_from_args, store_from_args
    from ..ledger.gpu import GPU_ROWS, GpuRows
    from ..ledger.ledger import build
    from ..ledger.models import get_model
    from ..ledger.prices import (
        DEFAULT_GPU_INSTANCE,
        DEFAULT_INSTANCE,
        load_instances,
        with_overrides,
    )
    from ..ledger.report import ledger_text

    model = get_model(args.model)
    step = step_from_args(args)
    target = args.target or "trn2"
    instances = with_overrides(load_instances()[0], args.price)
    trn_name = args.instance or DEFAULT_INSTANCE[target]
    gpu_name = args.gpu_instance or DEFAULT_GPU_INSTANCE
    for opt, name in (("--instance", trn_name), ("--gpu-instance", gpu_name)):
        if name not in instances:
            raise ValueError(f"{opt}: expected one of {', '.join(instances)}; got {name!r}")
    trn, gpu_inst = instances[trn_name], instances[gpu_name]
    if trn.accelerator != target:
        raise ValueError(f"--instance: {trn_name} carries {trn.accelerator}, not --target {target}")
    if gpu_inst.accelerator.startswith("trn"):
        raise ValueError(f"--gpu-instance: expected a GPU instance; got {gpu_name}")
    if args.global_batch is not None and args.global_batch < 1:
        raise ValueError(f"--global-batch: expected a positive integer; got {args.global_batch}")
    payback_args = (args.port_weeks, args.engineer_cost, args.monthly_spend)
    if any(a is not None for a in payback_args) and any(a is None for a in payback_args):
        raise ValueError("--port-weeks, --engineer-cost and --monthly-spend go together")
    gpu = GpuRows.load(args.gpu_rows or GPU_ROWS)
    if gpu.device not in gpu_inst.accelerator and gpu_inst.accelerator not in gpu.device:
        print(
            f"ledger: note: the GPU rows are {gpu.device}; {gpu_name} carries "
            f"{gpu_inst.accelerator} (its figures are the rows' device, not its own)",
            file=sys.stderr,
        )
    lnc = args.lnc or default_lnc(target)
    store = store_from_args(args)
    led = build(model, step, target, lnc, store, gpu)
    print(ledger_text(led, trn, gpu_inst, args.detail))
    if args.global_batch and step.phase == "train":
        per_step = args.global_batch / (trn.logical_cores(lnc) * step.batch)
        for impl in ("ours", "native"):
            f = led.step_total(impl)
            if f is not None:
                print(
                    f"  optimizer step of {args.global_batch} sequences on one {trn.name}, "
                    f"{impl} (modeled): {per_step * f.us / 1e6:,.2f} s"
                )
    if args.port_weeks is not None:
        _payback(led, trn, gpu_inst, args)
    if args.plot is not None:
        _plot(args, model, target, lnc, store, gpu, trn, gpu_inst)
    if store.priced:
        if store.cache is not None and str(store.cache) == "-":
            print(f"\n{len(store.priced)} components priced now (not cached: --cache -).")
        else:
            where = store.cache if store.cache is not None else "the user cache"
            print(f"\n{len(store.priced)} components priced now and cached in {where}.")
    return 0


def _payback(led: Ledger, trn: Instance, gpu_inst: Instance, args: argparse.Namespace) -> None:
    from ..ledger.prices import payback

    gpu_cost = led.cost("gpu", gpu_inst)["usd_per_m"]
    if gpu_cost is None:
        raise ValueError(
            f"--price: the payback needs {gpu_inst.name}'s price: "
            f"--price {gpu_inst.name}=USD_PER_HOUR"
        )
    print("\nPayback (moving the GPU spend to Trainium at these per-token costs):")
    spend = (args.port_weeks, args.engineer_cost, args.monthly_spend)
    for impl in ("ours", "native"):
        cost = led.cost(impl, trn)
        c = cost["usd_per_m"]
        if c is None:
            raise ValueError(
                f"--price: the payback needs {trn.name}'s price: --price {trn.name}=USD_PER_HOUR"
            )
        p = payback(*spend, c / gpu_cost)
        band = ""
        lo, hi = cost.get("usd_per_m_lo"), cost.get("usd_per_m_hi")
        if lo is not None and hi is not None:
            ends = [payback(*spend, x / gpu_cost).months for x in (lo, hi)]
            band = (
                " (over the band: "
                + " to ".join("never" if m is None else f"{m:.1f}" for m in ends)
                + " months)"
            )
        print(f"  {impl}: cost per token {c / gpu_cost:.2f}x the GPU's; {p.text()}{band}")
    print(
        "  (modeled Trainium cost vs measured GPU cost, the move priced at the prices "
        "named above; porting time and engineer cost are your inputs)"
    )


def _plot(
    args: argparse.Namespace,
    model: object,
    target: str,
    lnc: int,
    store: object,
    gpu: object,
    trn: Instance,
    gpu_inst: Instance,
) -> None:
    from ..ledger.cli_args import plot_steps
    from ..ledger.ledger import build
    from ..ledger.plot import cost_chart

    steps = plot_steps(args)
    leds = [build(model, s, target, lnc, store, gpu) for s in steps]  # type: ignore[arg-type]
    print(f"chart written to {cost_chart(leds, trn, gpu_inst, args.plot)}")
