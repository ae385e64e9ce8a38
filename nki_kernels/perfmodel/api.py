"""Entry points: price a kernel (trace-only interpretation) or an existing trace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..interp import run
from ..interp.trace import Trace
from ..targets import Target, get_target
from .estimate import Estimate, build_estimate
from .timeline import Schedule, schedule


def trace_kernel(
    kernel: Callable[..., Any],
    *args: Any,
    target: str | Target = "trn2",
    lnc: int = 1,
    **kwargs: Any,
) -> Trace:
    """Interpret `kernel` in trace-only mode (no arithmetic) and return its trace.

    `args` are `TensorSpec`s (or arrays; their values are not used) and
    specialization-time values, exactly as for `nki_kernels.interp.run`.
    """
    tgt = get_target(target)
    return run(kernel, *args, target=tgt, lnc=lnc, trace_only=True, **kwargs).trace


def estimate_trace(trace: Trace, target: str | Target | None = None) -> Estimate:
    """Model `trace` on `target` (default: the target it was recorded for)."""
    return build_estimate(trace, schedule(trace, target))


def estimate(
    kernel: Callable[..., Any],
    *args: Any,
    target: str | Target = "trn2",
    lnc: int = 1,
    **kwargs: Any,
) -> Estimate:
    """Modeled latency and utilization of one launch of `kernel` on `target`.

    Example: `estimate(matmul, TensorSpec((K, M), "bfloat16"), TensorSpec((K, N),
    "bfloat16"), target="trn2").latency_ns`. The result is labeled
    "modeled (cost model vN, target)"; it is never a measurement.
    """
    trace = trace_kernel(kernel, *args, target=target, lnc=lnc, **kwargs)
    return estimate_trace(trace, target)


def schedule_kernel(
    kernel: Callable[..., Any],
    *args: Any,
    target: str | Target = "trn2",
    lnc: int = 1,
    **kwargs: Any,
) -> tuple[Trace, Schedule, Estimate]:
    """Trace, full schedule (with per-DMA-engine segments) and estimate of one launch."""
    trace = trace_kernel(kernel, *args, target=target, lnc=lnc, **kwargs)
    sched = schedule(trace, target, record=True)
    return trace, sched, build_estimate(trace, sched)
