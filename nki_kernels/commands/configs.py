"""Show or compare stored tuned configs (provenance, latency vs default, stale hashes).

The command lives in `nki_kernels.autotune.configs_cli`.
"""

from __future__ import annotations

import argparse

NAME = "configs"
HELP = "show / diff tuned configs in the config store"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `configs`."""
    from ..autotune.configs_cli import add_configs_arguments

    add_configs_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Run `configs`; returns the exit status."""
    from ..autotune.cli import run_command
    from ..autotune.configs_cli import run_configs

    return run_command(NAME, run_configs, args)
