"""Tune a kernel's tile sizes per shape bucket with Optuna; export to the config store.

The command lives in `nki_kernels.autotune.cli`.
"""

from __future__ import annotations

import argparse

NAME = "tune"
HELP = "autotune tile sizes per shape bucket (Optuna; cost model or hardware)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tune`."""
    from ..autotune.cli import add_tune_arguments

    add_tune_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run `tune`; returns the exit status."""
    from ..autotune.cli import run_command, run_tune

    return run_command(NAME, run_tune, args)
