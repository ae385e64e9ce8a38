"""`Estimate`: the cost model's answer for one kernel launch, as plain data.

Definitions (the profiler's, HARDWARE.md):

- MFU = 2 x MACs / (2 x 128 x 128 x TensorE clock x latency x cores): matmul FLOPs only;
  HFU counts what the PE array does, transposes included. Both use the bf16 peak, so an
  fp8 `double_row` kernel can exceed 1.
- MBU = HBM bytes (read + written) / (HBM bandwidth x latency x cores).
- Roofline bound = max(TensorE time at peak for the trace's matmul mix, HBM bytes /
  bandwidth); the bounding resource is whichever is larger. The timeline never beats it:
  TensorE instructions cost at least their FLOPs at peak, and HBM traffic passes through
  one bandwidth-limited FIFO per core.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..interp.trace import Trace
from ..targets import SHIPPED_PARAMETERS, TARGETS, Target
from .costs import hardware_flops, tensor_ideal_ns
from .timeline import COMPUTE_ENGINES, Schedule

# v2: fitted to published Trainium measurements (anchors.json); merged contiguous DMA
# rows, tensor_scalar_reduce N + 64, shared VectorE/GpSimd SBUF port. v3: the guides'
# rules audited one by one (VectorE 2x modes incl. PSUM copies, 16-byte strides, PSUM
# banks, dead PSUM memsets, ...), trn2 refit with TensorE and SBUF-transpose parameters
# (fit_v3.json), bands with a structural term (cost-model.md).
COST_MODEL_VERSION = "v3"
ENGINES = (*COMPUTE_ENGINES, "dma")


def modeled_label(
    target: str, version: str = COST_MODEL_VERSION, parameters: str | None = None
) -> str:
    """The provenance tag every printed figure carries.

    'modeled (cost model v3, trn2)' with the shipped parameters; a calibration override
    (or any parameter set other than the shipped one) is named after the target.
    `parameters` defaults to that of the target currently in use under this name.
    """
    if parameters is None:
        tgt = TARGETS.get(target)
        parameters = tgt.parameters if tgt is not None else SHIPPED_PARAMETERS
    extra = "" if parameters == SHIPPED_PARAMETERS else f", {parameters}"
    return f"modeled (cost model {version}, {target}{extra})"


@dataclass(frozen=True)
class Estimate:
    """Modeled latency and utilization of one kernel launch (never a measurement).

    Times are ns; `busy_ns` / `active_pct` are per engine kind ('tensor', 'vector',
    'scalar', 'gpsimd', 'dma'), summed over LNC cores; for 'dma' busy is the mean over
    the 16 DMA engines. `mfu`, `hfu`, `mbu` are fractions (0.5 = 50 %).
    """

    target: str
    lnc: int
    latency_ns: float
    busy_ns: Mapping[str, float]
    active_pct: Mapping[str, float]
    flops: int
    hw_flops: int
    mfu: float
    hfu: float
    hbm_read_bytes: int
    hbm_write_bytes: int
    mbu: float
    compute_bound_ns: float
    memory_bound_ns: float
    roofline_ns: float
    bound_by: str
    bottleneck: str
    instructions: int
    counts: Mapping[str, int]
    dma_bytes: int
    model_version: str = COST_MODEL_VERSION
    parameters: str = SHIPPED_PARAMETERS

    @property
    def latency_ms(self) -> float:
        """Modeled latency in milliseconds."""
        return self.latency_ns / 1e6

    @property
    def label(self) -> str:
        """'modeled (cost model v3, trn2)' (+ the override's provenance, if any)."""
        return modeled_label(self.target, self.model_version, self.parameters)

    @property
    def hbm_bytes(self) -> int:
        """HBM bytes read plus written."""
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per HBM byte (the profiler's mm_arithmetic_intensity)."""
        return self.flops / self.hbm_bytes if self.hbm_bytes else float("inf")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields, with the provenance label."""
        return {
            "label": self.label,
            "model_version": self.model_version,
            "parameters": self.parameters,
            "target": self.target,
            "lnc": self.lnc,
            "latency_ns": self.latency_ns,
            "busy_ns": dict(self.busy_ns),
            "active_pct": dict(self.active_pct),
            "flops": self.flops,
            "hw_flops": self.hw_flops,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "hbm_read_bytes": self.hbm_read_bytes,
            "hbm_write_bytes": self.hbm_write_bytes,
            "mbu": self.mbu,
            "compute_bound_ns": self.compute_bound_ns,
            "memory_bound_ns": self.memory_bound_ns,
            "roofline_ns": self.roofline_ns,
            "bound_by": self.bound_by,
            "bottleneck": self.bottleneck,
            "instructions": self.instructions,
            "counts": dict(self.counts),
            "dma_bytes": self.dma_bytes,
        }


def _totals(trace: Trace, tgt: Target) -> tuple:
    """(counts per engine, FLOPs, hardware FLOPs, DMA bytes, TensorE ns at peak, HBM bytes
    read, written) of `trace`: the same sums for every parameter set that keeps the
    TensorE peak rules, so within `compiled.reuse_compiled` they are summed once."""
    from .compiled import cached

    key = (tgt.tensor_peak_flops_per_ns, tgt.fp32_matmul_slowdown, tgt.fp8_matmul_speedup)
    return cached(trace, ("totals", key), lambda: _sum_totals(trace, tgt))


def _sum_totals(trace: Trace, tgt: Target) -> tuple:
    flops = hw = dma_bytes = 0
    ideal = 0.0
    counts = dict.fromkeys(ENGINES, 0)
    for ins in trace.instrs:
        counts[ins.engine] = counts.get(ins.engine, 0) + 1
        if ins.engine == "tensor":
            flops += ins.flops
            hw += hardware_flops(ins)
            ideal += tensor_ideal_ns(ins, tgt)
        elif ins.engine == "dma":
            dma_bytes += ins.nbytes
    return counts, flops, hw, dma_bytes, ideal, trace.hbm_read_bytes, trace.hbm_write_bytes


def _bounds(trace: Trace, tgt: Target, cores: int) -> tuple[float, float]:
    """(TensorE time at peak, HBM bytes / bandwidth) in ns per core: the roofline terms."""
    ideal, hbm_r, hbm_w = (_totals(trace, tgt)[i] for i in (4, 5, 6))
    return ideal / cores, (hbm_r + hbm_w) / (tgt.hbm_bytes_per_ns * cores)


def roofline_ns(trace: Trace, target: Target, lnc: int | None = None) -> float:
    """The roofline bound of `trace` on `target`: no schedule is faster (the timeline
    guarantees it, `build_estimate` checks it)."""
    return max(_bounds(trace, target, max(1, lnc if lnc is not None else trace.lnc)))


def build_estimate(trace: Trace, sched: Schedule) -> Estimate:
    """Fold a trace and its schedule into an `Estimate` (checks latency >= roofline)."""
    tgt: Target = sched.target
    cores = max(1, sched.lnc)
    counts, flops, hw, dma_bytes, _ideal, hbm_r, hbm_w = _totals(trace, tgt)
    counts = dict(counts)
    latency = sched.latency_ns
    compute_bound, memory_bound = _bounds(trace, tgt, cores)
    roofline = max(compute_bound, memory_bound)
    if latency < roofline * (1.0 - 1e-9):
        raise AssertionError(
            f"cost model invariant broken: latency {latency:.1f} ns < roofline {roofline:.1f} ns"
        )
    busy = dict(sched.busy_ns)
    span = latency * cores
    active = {k: (100.0 * v / span if span else 0.0) for k, v in busy.items()}
    peak = tgt.tensor_peak_flops_per_ns * span
    bw = tgt.hbm_bytes_per_ns * span
    bottleneck = max(busy, key=lambda k: busy[k]) if any(busy.values()) else "none"
    return Estimate(
        target=tgt.name,
        lnc=cores,
        latency_ns=latency,
        busy_ns=busy,
        active_pct=active,
        flops=flops,
        hw_flops=hw,
        mfu=flops / peak if peak else 0.0,
        hfu=hw / peak if peak else 0.0,
        hbm_read_bytes=hbm_r,
        hbm_write_bytes=hbm_w,
        mbu=(hbm_r + hbm_w) / bw if bw else 0.0,
        compute_bound_ns=compute_bound,
        memory_bound_ns=memory_bound,
        roofline_ns=roofline,
        bound_by="tensor" if compute_bound >= memory_bound else "hbm",
        bottleneck=bottleneck,
        instructions=len(trace.instrs),
        counts=counts,
        dma_bytes=dma_bytes,
        parameters=tgt.parameters,
    )
