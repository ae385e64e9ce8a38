"""Choose bucket boundaries for a length distribution (exact optimum vs the defaults).

The command lives in `nki_kernels.autotune.cli`.
"""

from __future__ import annotations

import argparse

NAME = "buckets"
HELP = "optimal bucket boundaries for observed lengths"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `buckets`."""
    from ..autotune.cli import add_buckets_arguments

    add_buckets_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run `buckets`; returns the exit status."""
    from ..autotune.cli import run_buckets

    return run_buckets(args)
