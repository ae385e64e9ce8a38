"""A profiler-style text summary of an `Estimate`, with the profiler's metric names."""

from __future__ import annotations

from .ceiling import label
from .estimate import Estimate

_WIDTH = 38


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def _row(name: str, value: str) -> str:
    return f"  {name}".ljust(_WIDTH) + value


def summary(est: Estimate, title: str = "") -> str:
    """Several lines: latency, utilization metrics and the roofline, all labeled modeled."""
    head = f"{title}: " if title else ""
    lines = [
        f"{head}{est.label}",
        _row("total_time", f"{est.latency_ns / 1e3:12.3f} us"),
        # above the best published MFU of its kind of work: a ceiling (perfmodel.ceiling)
        _row("mfu_estimated_percent", label(f"{100 * est.mfu:12.2f}", title, est.mfu)),
        _row("hfu_estimated_percent", f"{100 * est.hfu:12.2f}"),
        _row("mbu_estimated_percent", f"{100 * est.mbu:12.2f}"),
    ]
    for eng in ("tensor", "vector", "scalar", "gpsimd"):
        lines.append(_row(f"{eng}_engine_active_time_percent", f"{est.active_pct[eng]:12.2f}"))
    lines += [
        _row("dma_active_time_percent", f"{est.active_pct['dma']:12.2f}"),
        _row("hbm_read_bytes", f"{est.hbm_read_bytes:12d}  ({_bytes(est.hbm_read_bytes)})"),
        _row("hbm_write_bytes", f"{est.hbm_write_bytes:12d}  ({_bytes(est.hbm_write_bytes)})"),
        _row("mm_arithmetic_intensity", f"{est.arithmetic_intensity:12.2f}  FLOP/B"),
        _row(
            "roofline bound",
            f"{est.roofline_ns / 1e3:12.3f} us  ({est.bound_by}-bound; compute "
            f"{est.compute_bound_ns / 1e3:.3f} us, HBM {est.memory_bound_ns / 1e3:.3f} us)",
        ),
        _row("busiest engine", f"{est.bottleneck:>12s}"),
        _row("instructions", ", ".join(f"{k} {v}" for k, v in est.counts.items() if v)),
    ]
    return "\n".join(lines)
