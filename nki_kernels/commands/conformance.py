"""Run the NKI kernels of a local AWS checkout through the interpreter.

PATH is an aws-neuron/nki-library checkout (with src/nkilib_src/nkilib) or an
aws-neuron-sdk checkout (with nki/examples). Each kernel is imported unmodified, run at a
small shape against its own reference, and reported as pass / wrong / rejected (with the
interpreter's rule) / missing-API (a documented NKI name the interpreter lacks) / error.
--imports also tries to import every kernel module of the checkout. --aws-tests runs
nki-library's own test cases instead (its `test/integration` tests marked `fast`, with
their inputs, golden outputs and tolerances; each test file in a subprocess, at most
--timeout seconds, --jobs at once). Results are cached per file (--cache DIR); a re-run
skips files whose cached run matches the checkout's commit and the interpreter version
(--rerun runs them again); --report prints the per-file table from the cache without
running anything, --out FILE also writes it to FILE.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    parser.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="SUBSTR",
        help="only the AWS test files whose path contains SUBSTR (repeatable; --aws-tests)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="test files run at once (--aws-tests)")
    parser.add_argument(
        "--max-cases",
        type=int,
        default=None,
        metavar="N",
        help="a quick look: only the first N unskipped cases of each file (--aws-tests)",
    )
    parser.add_argument(
        "--cache",
        default=str(Path.home() / ".cache" / "nki-kernels" / "aws-tests"),
        metavar="DIR",
        help="per-file result cache (--aws-tests)",
    )
    parser.add_argument(
        "--rerun", action="store_true", help="run files again even when cached (--aws-tests)"
    )
    parser.add_argument(
        "--report", action="store_true", help="print the table from the cache only (--aws-tests)"
    )
    parser.add_argument("--out", default=None, metavar="FILE", help="also write the table here")


def run(args: argparse.Namespace) -> int:
    """Print the table; exit 0 when every case ran (whatever its outcome), 2 on bad PATH."""
    from ..conformance import loader
    from ..conformance.runner import import_table, run_cases, table
    from ..conformance.suites import cases_for

    try:
        kind = loader.checkout_kind(args.path)
    except FileNotFoundError as e:
        print(
            f"nki-kernels conformance: error: PATH: {e} (clone one first: git clone "
            "https://github.com/aws-neuron/nki-library, or aws-neuron/aws-neuron-sdk)",
            file=sys.stderr,
        )
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
    from ..conformance import aws_runs, aws_tests

    if kind != "nki-library":
        print("conformance: --aws-tests needs an nki-library checkout", file=sys.stderr)
        return 2
    root = Path(args.path)
    mods = aws_tests.test_modules(root)
    if args.file:
        mods = [m for m in mods if any(f in str(m) for f in args.file)]
        if not mods:
            print(f"conformance: --file: no AWS test file matches {args.file}", file=sys.stderr)
            return 2
    cache = Path(args.cache)
    if args.report:
        rels = {str(m.relative_to(root)) for m in mods}
        runs = [r for r in aws_runs.load_cache(cache) if r.file in rels]
    else:
        print(f"nki-library checkout {args.path}: {len(mods)} test files (interpreter, numeric)")

        def progress(run: aws_runs.FileRun, cached: bool) -> None:
            counts = aws_runs.summary(run.results)
            how = "cached" if cached else f"{run.seconds:.0f} s"
            print(f"  {run.file}: {counts} ({how})", flush=True)

        runs = aws_runs.run_files(
            root, mods, args.timeout, args.select, args.jobs, cache, args.rerun, progress,
            args.max_cases,
        )  # fmt: skip
        print()
    text = aws_runs.file_table(runs)
    print(text)
    if args.out:
        from ..runtime.atomic_files import write_text_atomic

        write_text_atomic(args.out, text + "\n")
    return 0
