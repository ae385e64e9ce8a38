"""Choose bucket boundaries for a length distribution (exact optimum vs the defaults).

The command lives in `nki_kernels.autotune.buckets_cli`.
"""

from __future__ import annotations

import argparse

NAME = "buckets"
HELP = "optimal bucket boundaries for observed lengths"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `buckets`."""
    from ..autotune.buckets_cli import add_buckets_arguments

    add_buckets_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run `buckets`; returns the exit status."""
    from ..autotune.buckets_cli import run_buckets
    from ..autotune.cli import run_command

    return run_command(NAME, run_buckets, args)
