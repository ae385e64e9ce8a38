"""Benchmark the NKI interpreter itself (measured CPU times of the interpreter on this
machine, not modeled hardware figures):

1. trace-only throughput: instructions per second when the interpreter records the trace
   of realistic kernels without doing the arithmetic (goal: >= 50,000/s on one core);
2. numeric mode: time of a 1024^3 bf16 tiled matmul kernel as a ratio to `numpy.matmul`
   of the same data converted to fp32 (goal: <= 5x).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

NAME = "interp-bench"
HELP = "measure the interpreter: trace-only instructions/s and numeric matmul vs NumPy"

TRACE_GOAL = 50_000  # instructions per second, one core
NUMERIC_GOAL = 5.0  # interpreter time / numpy.matmul time


@dataclass(frozen=True)
class TraceFigure:
    """Trace-only run of one workload (best of `repeats`, thread CPU time)."""

    workload: str
    instructions: int
    cpu_seconds: float
    repeats: int

    @property
    def per_second(self) -> float:
        """Instructions traced per second of CPU time."""
        return self.instructions / self.cpu_seconds


@dataclass(frozen=True)
class NumericFigure:
    """Numeric-mode matmul against numpy.matmul (best of `repeats`, wall clock)."""

    shape: tuple[int, int, int]
    interpreter_seconds: float
    numpy_seconds: float
    max_abs_error: float
    repeats: int

    @property
    def ratio(self) -> float:
        """Interpreter time over numpy.matmul time."""
        return self.interpreter_seconds / self.numpy_seconds


def _best(fn: Callable[[], Any], repeats: int, clock: Callable[[], float]) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeats):
        t0 = clock()
        result = fn()
        best = min(best, clock() - t0)
    return best, result


def trace_only_throughput(
    matmul_shape: tuple[int, int, int] = (4096, 4096, 4096),
    rmsnorm_shape: tuple[int, int] = (65536, 1024),
    repeats: int = 5,
) -> list[TraceFigure]:
    """Trace-only runs of the demo kernels in bf16; CPU time of this thread (one core)."""
    import ml_dtypes

    from ..examples import matmul_at_b, rmsnorm
    from ..interp import TensorSpec, run

    bf16 = ml_dtypes.bfloat16
    k, m, n = matmul_shape
    rows, h = rmsnorm_shape
    workloads = [
        (
            f"matmul_at_b K={k} M={m} N={n} bf16",
            lambda: run(
                matmul_at_b, TensorSpec((k, m), bf16), TensorSpec((k, n), bf16), trace_only=True
            ),
        ),
        (
            f"rmsnorm {rows} x {h} bf16",
            lambda: run(
                rmsnorm, TensorSpec((rows, h), bf16), TensorSpec((h,), bf16), trace_only=True
            ),
        ),
    ]
    figures = []
    for label, fn in workloads:
        seconds, result = _best(fn, repeats, time.thread_time)
        figures.append(TraceFigure(label, len(result.trace), seconds, repeats))
    return figures


def numeric_matmul(size: int = 1024, repeats: int = 5, seed: int = 0) -> NumericFigure:
    """The bf16 demo matmul on size^3 data vs numpy.matmul on the fp32-converted operands."""
    import ml_dtypes
    import numpy as np

    from ..examples import matmul_at_b
    from ..interp import run

    rng = np.random.default_rng(seed)
    a = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((size, size)).astype(ml_dtypes.bfloat16)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)  # conversion is not timed
    at32 = a32.T
    interp_s, res = _best(lambda: run(matmul_at_b, a, b), repeats, time.perf_counter)
    numpy_s, ref = _best(lambda: np.matmul(at32, b32), repeats, time.perf_counter)
    err = float(np.abs(res.outputs.astype(np.float32) - ref).max())
    return NumericFigure((size, size, size), interp_s, numpy_s, err, repeats)


def format_report(trace: list[TraceFigure], numeric: NumericFigure | None) -> str:
    """The benchmark's printed report; every figure says it is a measured CPU time."""
    lines = ["NKI interpreter benchmark -- measured CPU times of the interpreter on this machine"]
    total_i = sum(f.instructions for f in trace)
    total_s = sum(f.cpu_seconds for f in trace)
    lines.append("trace-only throughput (thread CPU time, one core, best of each):")
    for f in trace:
        lines.append(
            f"  {f.workload:<38} {f.instructions:>7} instr  {f.cpu_seconds * 1e3:8.1f} ms  "
            f"{f.per_second:>9,.0f} instr/s (best of {f.repeats})"
        )
    if trace:
        rate = total_i / total_s
        verdict = "met" if rate >= TRACE_GOAL else "NOT met"
        lines.append(
            f"  overall: {rate:,.0f} instructions/s measured (goal >= {TRACE_GOAL:,}/s: {verdict})"
        )
    if numeric is not None:
        k, m, n = numeric.shape
        verdict = "met" if numeric.ratio <= NUMERIC_GOAL else "NOT met"
        lines += [
            f"numeric mode, {k}x{m}x{n} bf16 tiled matmul (wall clock, best of {numeric.repeats}):",
            f"  interpreter (matmul_at_b, bf16 in, fp32 PSUM, bf16 out): "
            f"{numeric.interpreter_seconds * 1e3:8.1f} ms",
            f"  numpy.matmul of the fp32-converted operands:            "
            f"{numeric.numpy_seconds * 1e3:8.1f} ms",
            f"  ratio: {numeric.ratio:.2f}x measured (goal <= {NUMERIC_GOAL:g}x: {verdict}); "
            f"max |interpreter - numpy| = {numeric.max_abs_error:.3g} (bf16 output rounding)",
        ]
    return "\n".join(lines)


def goals_met(trace: list[TraceFigure], numeric: NumericFigure | None) -> bool:
    """Whether both figures reach their goals."""
    rate = sum(f.instructions for f in trace) / sum(f.cpu_seconds for f in trace)
    return rate >= TRACE_GOAL and (numeric is None or numeric.ratio <= NUMERIC_GOAL)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1; got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `interp-bench`: --quick, --repeats, --check."""
    parser.add_argument(
        "--quick", action="store_true", help="small shapes and one repeat (a smoke run)"
    )
    parser.add_argument(
        "--repeats", type=_positive_int, default=None, help="repeats per figure (best of)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a figure misses its goal")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print its report; with --check, exit 1 on a missed goal."""
    repeats = args.repeats or (1 if args.quick else 5)
    if args.quick:
        trace = trace_only_throughput((512, 512, 1024), (1024, 256), repeats)
        numeric = numeric_matmul(256, repeats)
    else:
        trace = trace_only_throughput(repeats=repeats)
        numeric = numeric_matmul(1024, repeats)
    print(format_report(trace, numeric))
    if args.check and not goals_met(trace, numeric):
        return 1
    return 0
