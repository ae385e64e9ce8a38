"""Model a kernel's latency on trn1/trn2/trn3 from its trace (the cost model; no hardware).

`nki-kernels estimate <kernel> --shape ... --target trn2 [--timeline out.json]`; every
figure printed is labeled "modeled (cost model vN, target)". The command itself lives in
`nki_kernels.perfmodel.cli`.
"""

from __future__ import annotations

import argparse

NAME = "estimate"
HELP = "model a kernel's latency from its trace (cost model; no hardware)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `estimate` (see nki_kernels.perfmodel.cli.configure)."""
    from ..perfmodel.cli import configure

    configure(parser)


def run(args: argparse.Namespace) -> int:
    """Run `estimate`; returns the exit status."""
    from ..perfmodel.cli import run as run_estimate

    return run_estimate(args)
