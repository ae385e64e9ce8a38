"""The DMA-size sweep: modeled HBM -> SBUF throughput against bytes per partition."""

from __future__ import annotations

from dataclasses import dataclass

from ..interp import TensorSpec
from ..targets import Target, get_target
from .api import trace_kernel
from .calibration import PUBLISHED_DMA_EFFICIENCY, SWEEP_BYTES_PER_PARTITION, dma_sweep
from .timeline import schedule


@dataclass(frozen=True)
class SweepPoint:
    """Steady-state throughput of [128, bytes_per_partition] transfers."""

    bytes_per_partition: int
    bytes_per_ns: float
    efficiency_pct: float
    published_pct: float | None


def dma_throughput(
    target: str | Target,
    bytes_per_partition: int,
    total_per_partition: int = SWEEP_BYTES_PER_PARTITION,
) -> float:
    """Bytes per ns of a stream of [128, bytes_per_partition] bf16 HBM -> SBUF copies.

    Measured between the first transfer's start and the last one's end, so the one-off
    trigger latency does not count (the curve is a steady-state efficiency).
    """
    tgt = get_target(target)
    if bytes_per_partition < 2 or total_per_partition % bytes_per_partition:
        raise ValueError(
            f"bytes_per_partition: expected an even divisor of {total_per_partition}; "
            f"got {bytes_per_partition}"
        )
    slots = max(2, min(32, tgt.sbuf_usable_bytes // bytes_per_partition))
    p = tgt.partitions
    src = TensorSpec((p, total_per_partition // 2), "bfloat16")
    trace = trace_kernel(dma_sweep, src, bytes_per_partition, slots, target=tgt)
    sched = schedule(trace, tgt)
    loads = [i for i, ins in enumerate(trace.instrs) if ins.attrs.get("dst_space") == "sbuf"]
    t0 = min(sched.start[i] for i in loads)
    t1 = max(sched.end[i] for i in loads)
    return p * total_per_partition / (t1 - t0)


def dma_sweep_table(
    target: str | Target = "trn2", sizes: tuple[int, ...] = tuple(PUBLISHED_DMA_EFFICIENCY)
) -> list[SweepPoint]:
    """Efficiency of each size relative to 32 KiB per partition, with the published curve."""
    ref = dma_throughput(target, 32768)
    return [
        SweepPoint(b, bw, 100.0 * bw / ref, PUBLISHED_DMA_EFFICIENCY.get(b))
        for b in sizes
        for bw in (dma_throughput(target, b),)
    ]
