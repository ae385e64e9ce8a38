"""The shape options shared by `nki-kernels ledger` and `nki-kernels bench --model`, and
the `bench --model` entry point (one pricing, two reports)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

DEFAULT_SEQ = 8192
DEFAULT_DECODE_BATCH = 64
DEFAULT_CONTEXT = 32768


def add_shape_arguments(parser: argparse.ArgumentParser, model_required: bool = True) -> None:
    from .models import MODELS

    parser.add_argument(
        "--model",
        required=model_required,
        metavar="NAME|CONFIG",
        help=f"one of {', '.join(MODELS)}, or a transformers config.json (or its directory)",
    )
    parser.add_argument(
        "--phase",
        choices=("train", "prefill", "decode"),
        default=None,
        help="training step (fwd + bwd), prefill (fwd) or one decode step (default: train)",
    )
    parser.add_argument(
        "--seq", type=int, help=f"tokens per sequence, train / prefill (default {DEFAULT_SEQ})"
    )
    parser.add_argument(
        "--batch",
        type=int,
        help="sequences per logical core (per GPU) in one step (default 1; decode "
        f"{DEFAULT_DECODE_BATCH})",
    )
    parser.add_argument(
        "--context",
        type=int,
        help=f"cached tokens per sequence, decode (default {DEFAULT_CONTEXT})",
    )
    parser.add_argument("--target", choices=("trn2", "trn3"), default=None, help="default trn2")
    parser.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2),
        help="logical core config (default: the project's default for the target, 2)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        help="ledger cache of priced components (default ~/.cache/nki-kernels/"
        "ledger_rows.jsonl; '-' = do not write)",
    )
    if "--reprice" not in parser._option_string_actions:  # bench has its own (same sense)
        parser.add_argument(
            "--reprice", action="store_true", help="ignore cached ledger rows and price again"
        )
    parser.add_argument(
        "--refresh-stale",
        action="store_true",
        help="price again the cached ledger rows whose kernels, configs or compositions "
        "changed since they were priced (default: print them marked 'stale')",
    )


def default_lnc(target: str) -> int:
    """The project's LNC default for the target (the op-level benchmark's)."""
    from ..bench.compare import DEFAULT_LNC

    return int(DEFAULT_LNC.get(target, 2))


def _positive(name: str, v: int | None) -> None:
    if v is not None and v < 1:
        raise ValueError(f"{name}: expected a positive integer; got {v}")


def step_from_args(args: argparse.Namespace) -> Any:
    from .layers import Step

    phase = args.phase or "train"
    for name in ("seq", "batch", "context"):
        _positive(f"--{name}", getattr(args, name))
    if phase == "decode":
        if args.seq is not None:
            raise ValueError("--seq: not used with --phase decode (give --context)")
        return Step(
            "decode", args.batch or DEFAULT_DECODE_BATCH, context=args.context or DEFAULT_CONTEXT
        )
    if args.context is not None:
        raise ValueError(f"--context: only with --phase decode (phase is {phase})")
    return Step(phase, args.batch or 1, seq=args.seq or DEFAULT_SEQ)


def plot_steps(args: argparse.Namespace) -> list[Any]:
    """The three steps `--plot` charts: train and prefill at the given (or default) seq,
    decode at the given (or default) batch and context."""
    from .layers import Step

    seq = args.seq or DEFAULT_SEQ
    # --batch means sequences per step of the phase it was given with; the other phases
    # keep their defaults (a decode batch of 64 is not 64 training sequences per core)
    decode = (args.phase or "train") == "decode"
    seq_batch = (None if decode else args.batch) or 1
    dec_batch = (args.batch if decode else None) or DEFAULT_DECODE_BATCH
    return [
        Step("train", seq_batch, seq=seq),
        Step("prefill", seq_batch, seq=seq),
        Step("decode", dec_batch, context=args.context or DEFAULT_CONTEXT),
    ]


def store_from_args(args: argparse.Namespace) -> Any:
    from .store import RowStore

    return RowStore(cache=args.cache, reprice=args.reprice, refresh_stale=args.refresh_stale)


SHAPE_OPTIONS = ("phase", "seq", "batch", "context", "target", "lnc")


def wants_model(args: argparse.Namespace) -> bool:
    """`bench` was given --model or one of its shape options."""
    return args.model is not None or any(getattr(args, o) is not None for o in SHAPE_OPTIONS)


def run_bench_model(args: argparse.Namespace) -> int:
    """`nki-kernels bench --model ...`: ours vs native vs AWS per op at that shape."""
    import time

    from .ledger import build
    from .models import get_model
    from .report import bench_model_text

    t0 = time.perf_counter()
    try:
        if args.model is None:
            given = [f"--{o}" for o in SHAPE_OPTIONS if getattr(args, o) is not None]
            raise ValueError(f"--model: required with {', '.join(given)}")
        model = get_model(args.model)
        step = step_from_args(args)
        led = build(
            model,
            step,
            args.target or "trn2",
            args.lnc or default_lnc(args.target or "trn2"),
            store_from_args(args),
            impls=("ours", "native", "aws"),
        )
    except ValueError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    print(bench_model_text(led))
    print(
        f"\n({time.perf_counter() - t0:.0f} s; nki-kernels ledger prices the same ops per dollar)"
    )
    return 0
