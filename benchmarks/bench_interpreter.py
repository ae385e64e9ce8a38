"""Interpreter benchmark script: trace-only instructions/s and numeric matmul vs NumPy.

    python benchmarks/bench_interpreter.py [--quick] [--repeats N] [--check]

Prints measured CPU times of the interpreter on this machine (the same report as
`nki-kernels bench`); the goals are >= 50,000 instructions/s trace-only on one core and a
1024^3 bf16 tiled matmul in numeric mode within 5x of numpy.matmul on fp32 operands.
"""

from __future__ import annotations

import argparse
import sys

from nki_kernels.commands import interp_bench


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    interp_bench.add_arguments(parser)
    return interp_bench.run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
