"""Run the NKI kernels of a local AWS checkout through the interpreter.

PATH is an aws-neuron/nki-library checkout (with src/nkilib_src/nkilib) or an
aws-neuron-sdk checkout (with nki/examples). Each kernel is imported unmodified, run at a
small shape against its own reference, and reported as pass / wrong / rejected (with the
interpreter's rule) / missing-API (a documented NKI name the interpreter lacks) / error.
--imports also tries to import every kernel module of the checkout. --aws-tests runs
nki-library's own test cases instead (its `test/integration` tests marked `fast`, with
their inputs, golden outputs and tolerances; each test file in a subprocess, at most
--timeout seconds).
"""

from __future__ import annotations

import argparse
import sys

NAME = "conformance"
HELP = "run an AWS nki-library / aws-neuron-sdk checkout's kernels in the interpreter"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `conformance`: PATH, --kernel NAME (repeatable), --imports, --seed."""
    parser.add_argument("path", metavar="PATH", help="local nki-library or aws-neuron-sdk checkout")
    parser.add_argument(
        "--kernel",
        action="append",
        default=[],
        metavar="NAME",
        help="run only the cases of this kernel (repeatable)",
    )
    parser.add_argument(
        "--imports", action="store_true", help="also import every kernel module of the checkout"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    parser.add_argument(
        "--aws-tests",
        action="store_true",
        help="run nki-library's own fast test cases (test/integration) instead",
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds per AWS test file (--aws-tests)"
    )
    parser.add_argument(
        "-k", dest="select", default=None, metavar="EXPR", help="pytest -k filter (--aws-tests)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the table; exit 0 when every case ran (whatever its outcome), 2 on bad PATH."""
    from ..conformance import loader
    from ..conformance.runner import import_table, run_cases, table
    from ..conformance.suites import cases_for

    try:
        kind = loader.checkout_kind(args.path)
    except FileNotFoundError as e:
        print(f"conformance: {e}", file=sys.stderr)
        return 2
    if args.aws_tests:
        return _aws_tests(args, kind)
    cases = cases_for(kind)
    if args.kernel:
        unknown = sorted(set(args.kernel) - {c.kernel for c in cases})
        if unknown:
            print(f"conformance: --kernel: no cases for {unknown}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c.kernel in args.kernel]
    print(f"{kind} checkout {args.path}: {len(cases)} cases (interpreter, numeric mode)\n")
    print(table(run_cases(args.path, cases, args.seed)))
    if args.imports:
        print()
        print(import_table(args.path))
    return 0


def _aws_tests(args: argparse.Namespace, kind: str) -> int:
    from pathlib import Path

    from ..conformance import aws_tests

    if kind != "nki-library":
        print("conformance: --aws-tests needs an nki-library checkout", file=sys.stderr)
        return 2
    root = Path(args.path)
    mods = aws_tests.test_modules(root)
    print(f"nki-library checkout {args.path}: {len(mods)} test files (interpreter, numeric)\n")
    print(aws_tests.table(aws_tests.run_all(root, mods, args.timeout, args.select)))
    return 0
