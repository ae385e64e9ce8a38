"""Run the project's benchmarks. For now this is the interpreter benchmark
(`nki-kernels interp-bench`): measured CPU times of the NKI interpreter itself."""

from __future__ import annotations

import argparse

from . import interp_bench

NAME = "bench"
HELP = "run the benchmarks (for now: the interpreter benchmark)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    interp_bench.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    return interp_bench.run(args)
