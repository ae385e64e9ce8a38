"""The main job: every kernel family against the compiler's native lowering.

Prints one Markdown comparison table (NKI kernel vs native lowering, modeled latency,
speedup, MFU / share of the HBM bound, busiest engine), appends the rows with their
provenance to a JSON-lines file and, with --plot, draws a speedup chart from them.
Without hardware every figure is "modeled (cost model vN, target)"; none is a
measurement. `--full` runs the issues' whole benchmark matrix (slow: tens of minutes).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

NAME = "bench"
HELP = "compare every kernel with the native lowering (modeled tables)"

DEFAULT_ROWS = Path("benchmarks/results/comparison.jsonl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..bench.compare import SUITES

    parser.add_argument(
        "--suite",
        action="append",
        choices=sorted(SUITES),
        help="run only these families (repeatable; default: all)",
    )
    parser.add_argument("--full", action="store_true", help="the whole benchmark matrix")
    parser.add_argument(
        "--rows",
        type=Path,
        default=DEFAULT_ROWS,
        help=f"append rows to this JSON-lines file (default {DEFAULT_ROWS}; '-' = none)",
    )
    parser.add_argument("--plot", type=Path, help="draw the speedups into this PNG file")


def run(args: argparse.Namespace) -> int:
    from ..bench.compare import SUITES
    from ..bench.rows import append_rows
    from ..bench.table import comparison_table
    from ..perfmodel import COST_MODEL_VERSION

    names = args.suite or list(SUITES)
    all_rows = []
    print(
        f"nki-kernels vs native lowering -- modeled (cost model {COST_MODEL_VERSION}); "
        "no figure below is a hardware measurement.\n"
    )
    for name in names:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # config-store fallbacks to heuristic defaults
            rows = SUITES[name].rows(args.full)
        print(f"## {name}  ({time.perf_counter() - t0:.0f} s to price)\n")
        print(comparison_table(rows))
        print()
        sys.stdout.flush()
        all_rows.extend(rows)
    if str(args.rows) != "-":
        append_rows(args.rows, all_rows)
        print(f"rows appended to {args.rows}")
    if args.plot:
        from ..bench.plot import speedup_chart

        speedup_chart(all_rows, args.plot)
        print(f"chart written to {args.plot}")
    return 0
