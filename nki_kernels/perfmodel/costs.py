"""Instruction costs: how long one trace record keeps its engine busy, in nanoseconds.

All figures come from the `Target` (nki_kernels/targets.py, with sources there); this
module only turns them into per-instruction costs:

- TensorE: the initiation interval of a MultiplyMoving, `max(N, 64)` cycles for N moving
  columns (LoadStationary of the next weights runs in the background and, at <= M/4
  cycles, always hides under the 64-cycle floor); fp32 operands 4x; transposes (identity
  matmuls) `max(P, 64)` cycles with their own fp32 factor; fp8 `double_row` contracts 2K
  rows in the same cycles, so it doubles the FLOPs per cycle rather than shortening one;
  `nc_matmul_mx` likewise contracts 4x the rows (K = 4 x partitions) in those cycles.
- VectorE / ScalarE / GpSimd: `max(MIN_II, cycles_per_element * N / perf_mode) + extra`
  cycles; N is elements per partition (fewer than 128 partitions cost the same). Perf
  modes: bf16/fp16 SBUF copy and tensor_scalar (VectorE up to 4x on trn2+; ScalarE 2x on
  trn3), all-bf16 tensor_tensor (VectorE 2x on trn2+), tensor_tensor with a PSUM input
  N instead of 2N, bf16 add/max reductions N/2.
- Shared ports (trainium2_arch): VectorE and GpSimd share an SBUF port -- always on
  NC-v2, only for VectorE perf-mode instructions on NC-v3+; VectorE and ScalarE share
  PSUM access on NC-v2. An instruction holding a port cannot overlap another holder
  (`port_mask`).
- DMA: see `dma_plan`; transposes at their documented fraction of the copy rate (HBM ->
  SBUF and SBUF -> SBUF differ), in whole [128, 16]-element destination blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..interp.trace import HBM, PSUM, Instr
from ..targets import Target

# VectorE fast reductions: "tensor_reduce N (N/2 bf16 add/max)" (HARDWARE.md). H
_FAST_REDUCE_OPS = frozenset({"add", "maximum", "max"})
# all-bf16 tensor_tensor that the perf mode covers (HARDWARE.md). M
_FAST_TT_OPS = frozenset({"add", "subtract", "multiply"})
# DMA transposes write [128 partitions, 16 elements] destination blocks (trainium2_arch). H
TRANSPOSE_BLOCK = 16
# GpSimd rsqrt throughput relative to ScalarE's one element per cycle (nki.api.shared). H
GPSIMD_RSQRT_SLOWDOWN = 4.0
# Most-minor free-dimension stride above which SBUF / PSUM deliver half their bandwidth
# (trainium_inferentia2_arch, "Access pattern"; NC-v2, assumed to carry over). H / L v3+
STRIDE_FREE_BYTES = 16
# nc_matmul_mx contracts 4 values per PE per cycle (trainium3_arch, Quad-MXFP8/MXFP4). H
MX_MATMUL_SPEEDUP = 4.0


def _opcode_table(target: Target) -> dict[str, tuple[float, float]]:
    table = {op: (per, extra) for op, per, extra in target.elementwise_cycles}
    table["tensor_tensor_scan"] = (target.scan_cycles_per_element, 0.0)
    return table


def engine_ghz(target: Target, engine: str) -> float:
    """Clock of a compute engine in GHz (cycles per ns)."""
    if engine == "tensor":
        return target.tensor_ghz
    if engine == "vector":
        return target.vector_ghz
    if engine == "scalar":
        return target.scalar_ghz
    if engine == "gpsimd":
        return target.gpsimd_ghz
    raise ValueError(f"engine: expected tensor/vector/scalar/gpsimd; got {engine!r}")


def tensor_cycles(instr: Instr, target: Target) -> float:
    """TensorE cycles of one matmul or transpose at full clock (before throttling)."""
    a = instr.attrs
    n = a.get("N", instr.n)
    cycles = float(max(n, target.matmul_min_cycles)) + target.matmul_extra_cycles
    if a.get("transpose"):
        if a.get("fp32"):
            cycles *= target.fp32_transpose_slowdown
        cycles *= target.tensor_transpose_factor
    elif a.get("fp32"):
        cycles *= target.fp32_matmul_slowdown
    return cycles


def tensor_ideal_ns(instr: Instr, target: Target) -> float:
    """Time the instruction's FLOPs need at the TensorE peak of its dtype (roofline term)."""
    if not instr.flops:
        return 0.0
    peak = target.tensor_peak_flops_per_ns
    a = instr.attrs
    if a.get("fp32"):
        peak /= target.fp32_matmul_slowdown
    elif a.get("double_row"):
        peak *= target.fp8_matmul_speedup
    elif a.get("mx"):
        # "An MX matmul with either the MXFP8 or MXFP4 datatype runs at 4x the throughput
        # compared to a BF16/FP16 matmul" (trainium3_arch): 4x the contraction per cycle
        peak *= MX_MATMUL_SPEEDUP
    return instr.flops / peak


def hardware_flops(instr: Instr) -> int:
    """FLOPs the PE array performs, transposes included (the HFU numerator)."""
    a = instr.attrs
    if instr.engine != "tensor":
        return 0
    if "K" in a and "M" in a and "N" in a:
        return 2 * int(a["K"]) * int(a["M"]) * int(a["N"])
    return instr.flops


def elementwise_cycles(
    instr: Instr, target: Target, table: dict[str, tuple[float, float]] | None = None
) -> float:
    """Busy cycles of a VectorE / ScalarE / GpSimd instruction on its own engine clock."""
    op = instr.opcode
    a = instr.attrs
    eng = instr.engine
    per, extra = (table or _opcode_table(target)).get(op, (1.0, 0.0))
    n = float(instr.n)
    if op == "tensor_tensor" or op == "scalar_tensor_tensor":
        if a.get("psum_in"):
            per = 1.0
        elif a.get("fast") and eng == "vector" and a.get("op") in _FAST_TT_OPS:
            per /= target.vector_bf16_tt_speedup
    elif op in ("tensor_copy", "tensor_scalar"):
        per /= copy_speedup(instr, target)
        if eng == "gpsimd" and op == "tensor_scalar" and a.get("op") == "rsqrt":
            # "the computation throughput of reverse square root on GpSIMD Engine is 4x
            # lower than Scalar Engine" (nki.api.shared, engine selection)
            per *= GPSIMD_RSQRT_SLOWDOWN
    elif op == "tensor_reduce":
        if a.get("fast") and a.get("op") in _FAST_REDUCE_OPS:
            per = 0.5
    elif op == "activation" and a.get("reduce"):
        extra += target.activation_reduce_cycles
    if a.get("stride_bytes", 0) > STRIDE_FREE_BYTES:
        # "If the most-minor F dimension stride exceeds 16 bytes, the achievable bandwidth
        # of each tensor read/write interface will be half of the peak bandwidth, which
        # translates to roughly 50% performance hit on the instructions" (trainium arch)
        per *= target.strided_access_slowdown
    if eng == "gpsimd":
        extra = max(extra, float(target.gpsimd_startup_cycles))
    return max(float(target.min_instr_cycles), per * n) + extra


def copy_speedup(instr: Instr, target: Target) -> float:
    """Perf-mode factor of a `tensor_copy` / `tensor_scalar` (trainium2_arch, VectorE
    performance mode; trainium3_arch, ScalarE performance mode).

    VectorE: 4x when both tensors are in SBUF, BF16/FP16 and contiguous in the most-minor
    free dimension; 2x when they are BF16/FP16 in SBUF but not contiguous, or BF16/FP16
    and contiguous with one of them in PSUM. ScalarE (NC-v4): the same 2x mode.
    Traces without `half` / `psum_any` (older ones) read `fast` as SBUF, BF16, contiguous.
    """
    a = instr.attrs
    half = a.get("half", a.get("fast", False))
    if not half:
        return 1.0
    psum = a.get("psum_any", a.get("psum_in", False))
    contig = a.get("contig", True)
    if instr.engine == "vector":
        if psum:
            return target.vector_bf16_2x_speedup if contig else 1.0
        return target.vector_bf16_copy_speedup if contig else target.vector_bf16_2x_speedup
    if instr.engine == "scalar" and (contig or not psum):
        return target.scalar_bf16_speedup
    return 1.0


PORT_SBUF_VG = 1  # VectorE / GpSimd SBUF port
PORT_PSUM_VS = 2  # VectorE / ScalarE PSUM access (NC-v2)
# NC-v3+: VectorE and ScalarE "can access PSUM at full bandwidth in parallel, as long as
# their accesses do not collide on the same PSUM bank" (trainium2_arch): one port per
# bank, bits PSUM_BANK_SHIFT .. + 7, held by a VectorE / ScalarE instruction that reads or
# writes the bank
PSUM_BANK_SHIFT = 2
PORT_BITS = PSUM_BANK_SHIFT + 8


def _perf_mode(instr: Instr, target: Target) -> bool:
    a = instr.attrs
    op = instr.opcode
    if op in ("tensor_copy", "tensor_scalar"):
        return copy_speedup(instr, target) > 1.0
    if not a.get("fast") or a.get("psum_in"):
        return False
    if op in ("tensor_tensor", "scalar_tensor_tensor"):
        return target.vector_bf16_tt_speedup > 1.0 and a.get("op") in _FAST_TT_OPS
    return False


def port_mask(instr: Instr, target: Target) -> int:
    """Shared ports `instr` holds while it runs (bits PORT_SBUF_VG, PORT_PSUM_VS)."""
    eng = instr.engine
    mask = 0
    mode = target.vector_gpsimd_sbuf_port
    if eng == "gpsimd" and mode != "none":
        mask |= PORT_SBUF_VG
    elif eng == "vector" and (mode == "all" or (mode == "perf_mode" and _perf_mode(instr, target))):
        mask |= PORT_SBUF_VG
    if (
        target.vector_scalar_psum_port
        and eng in ("vector", "scalar")
        and instr.attrs.get("psum_in")
    ):
        mask |= PORT_PSUM_VS
    if not target.vector_scalar_psum_port and eng in ("vector", "scalar"):
        mask |= psum_bank_mask(instr, target)
    return mask


def psum_bank_mask(instr: Instr, target: Target) -> int:
    """Port bits of the PSUM banks `instr` reads or writes (0: none)."""
    mask = 0
    size = target.psum_bank_bytes
    for reg in (*instr.reads, *instr.writes):
        if reg[0] == PSUM and reg[5] > reg[4]:
            for bank in range(reg[4] // size, min((reg[5] - 1) // size, 7) + 1):
                mask |= 1 << (PSUM_BANK_SHIFT + bank)
    return mask


def compute_ns(instr: Instr, target: Target) -> float:
    """Busy time of a compute-engine instruction (TensorE at full clock)."""
    if instr.engine == "tensor":
        return tensor_cycles(instr, target) / target.tensor_ghz
    return elementwise_cycles(instr, target) / engine_ghz(target, instr.engine)


@dataclass(frozen=True)
class DmaPlan:
    """How one DMA instruction occupies the DMA engines.

    `engines` are the DMA engine indices it uses (those serving its SBUF partitions);
    each is busy `per_engine_ns`. `dge` is 'hw' (a hardware DGE block for `dge_ns`),
    'sw' (GpSimd generates descriptors for `dge_ns`) or '' (precomputed descriptors).
    """

    engines: range
    per_engine_ns: float
    descriptors: int
    dge: str
    dge_ns: float
    hbm_bytes: int


def descriptor_ns(nbytes: float, target: Target) -> float:
    """One descriptor: a smooth max(bytes / engine rate, floor) -- the DMA efficiency curve."""
    data = nbytes / target.dma_engine_bytes_per_ns
    floor = target.dma_descriptor_min_ns
    k = target.dma_descriptor_blend
    if k == math.inf:
        return max(data, floor)
    big = max(data, floor)
    return big * (1.0 + (min(data, floor) / big) ** k) ** (1.0 / k) if big else 0.0


def transpose_efficiency(instr: Instr, target: Target) -> float:
    """Throughput fraction of a DMA transpose on `target` (0: not a transpose, or a
    target without transposing DMA hardware, priced per element-granular descriptor)."""
    kind = instr.attrs.get("transpose")
    if not kind:
        return 0.0
    if kind == "sbuf2sbuf":
        return target.dma_transpose_sbuf_efficiency
    return target.dma_transpose_hbm_efficiency


def transpose_engine_ns(
    instr: Instr, rows: int, engine_rows: int, eff: float, target: Target
) -> float:
    """One DMA engine's share of a transpose onto `rows` destination partitions, of
    which the engine writes `engine_rows`: at `eff` of its copy rate, at least one
    descriptor's floor.

    The engines write the destination in [128, 16]-element blocks (trainium2_arch), so a
    row's inner dimension is padded to a multiple of 16 elements; a destination on fewer
    than 128 partitions uses fewer engines (the caller's engine range).
    """
    inner = int(instr.attrs.get("transpose_inner", TRANSPOSE_BLOCK)) or TRANSPOSE_BLOCK
    padded_inner = -(-inner // TRANSPOSE_BLOCK) * TRANSPOSE_BLOCK
    row_bytes = instr.nbytes / rows * padded_inner / inner
    data = engine_rows * row_bytes / (target.dma_engine_bytes_per_ns * eff)
    return max(data, target.dma_descriptor_min_ns)


def hbm_contiguous(instr: Instr) -> bool:
    """True when the DMA's HBM side is one contiguous byte extent of its size."""
    for reg in (*instr.reads, *instr.writes):
        if reg[0] == HBM:
            return reg[5] - reg[4] == instr.nbytes
    return False


def dma_plan(instr: Instr, chip_region: tuple[int, ...] | None, target: Target) -> DmaPlan:
    """Spread a DMA over the engines that serve its partitions and price each share.

    A transfer touching SBUF partitions [p0, p1) runs on engines p0 // 8 .. (p1 - 1) // 8
    (8 partitions per engine), each moving its rows' descriptors; a DRAM -> DRAM copy
    is cut into descriptors of at most `dma_max_descriptor_bytes` spread over all
    engines. Every descriptor costs `descriptor_ns` of its engine, and an engine's share
    of the HBM bytes takes at least share / (HBM bandwidth / 16).
    """
    a = instr.attrs
    nbytes = instr.nbytes
    desc = int(a.get("descriptors", 1)) or 1
    dbytes = float(a.get("descriptor_bytes", nbytes / desc if desc else nbytes))
    rows = chip_region[3] - chip_region[2] if chip_region is not None else 0
    eff = transpose_efficiency(instr, target) if rows else 0.0
    ppe = target.dma_partitions_per_engine
    if chip_region is not None:
        p0, p1 = chip_region[2], chip_region[3]
        first = min(p0 // ppe, target.dma_engines - 1)
        last = min((max(p1, p0 + 1) - 1) // ppe, target.dma_engines - 1)
        engines = range(first, last + 1)
    else:
        cap = target.dma_max_descriptor_bytes
        if dbytes > cap:
            desc = max(desc, -(-nbytes // cap))
            dbytes = nbytes / desc
        engines = range(0, min(target.dma_engines, desc))
    if eff > 0.0:
        desc = rows
        per_ns = transpose_engine_ns(instr, rows, -(-rows // len(engines)), eff, target)
    elif rows and desc == rows and hbm_contiguous(instr):
        # One run per partition row and the HBM side one contiguous extent: each engine's
        # rows are one contiguous piece of HBM and move as one transfer (the DMA overview
        # profiles a [128, 128] bf16 copy as one 2 KiB transfer per engine).
        merged = -(-rows // len(engines)) * dbytes
        pieces = -(-int(merged) // target.dma_max_descriptor_bytes)
        desc = pieces * len(engines)
        per_ns = pieces * descriptor_ns(merged / pieces, target)
    else:
        per_ns = -(-desc // len(engines)) * descriptor_ns(dbytes, target)
    hbm_bytes = instr.hbm_read + instr.hbm_write
    if hbm_bytes:
        # HBM bandwidth per core, shared evenly: no engine moves HBM bytes faster than
        # 1/16 of it, so the engines together never beat the HBM roofline.
        share = hbm_bytes / len(engines) * target.dma_engines / target.hbm_bytes_per_ns
        per_ns = max(per_ns, share)
    mode = str(a.get("dge", "unknown"))
    dge, dge_ns = "", 0.0
    if a.get("indirect") or mode == "swdge":
        dge, dge_ns = "sw", target.dma_swdge_gpsimd_ns
    elif mode == "hwdge" and target.dge_instances > 0:
        dge, dge_ns = "hw", target.dma_dge_ns
    return DmaPlan(engines, per_ns, desc, dge, dge_ns, hbm_bytes)


class Pricer:
    """Memoized instruction costs for one target (traces repeat a few shapes many times)."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self._table = _opcode_table(target)
        self._compute: dict[tuple, tuple[float, int]] = {}
        self._dma: dict[tuple, DmaPlan] = {}

    def compute_ns(self, instr: Instr) -> float:
        """`compute_ns` through a cache keyed by everything the cost reads."""
        return self.compute(instr)[0]

    def compute_key(self, instr: Instr) -> tuple:
        """Everything `compute_ns` and `port_mask` read of `instr` (its cache key)."""
        a = instr.attrs
        return (
            instr.engine,
            instr.opcode,
            instr.n,
            a.get("N"),
            a.get("fp32"),
            a.get("transpose"),
            a.get("psum_in"),
            a.get("fast"),
            a.get("op"),
            a.get("reduce"),
            a.get("half"),
            a.get("psum_any"),
            a.get("contig"),
            a.get("stride_bytes", 0) > STRIDE_FREE_BYTES,
            psum_bank_mask(instr, self.target) if instr.engine in ("vector", "scalar") else 0,
        )

    def compute(self, instr: Instr) -> tuple[float, int]:
        """(`compute_ns`, `port_mask`) through a cache keyed by everything they read."""
        key = self.compute_key(instr)
        hit = self._compute.get(key)
        if hit is None:
            t = self.target
            if instr.engine == "tensor":
                hit = (tensor_cycles(instr, t) / t.tensor_ghz, 0)
            else:
                cost = elementwise_cycles(instr, t, self._table) / engine_ghz(t, instr.engine)
                hit = (cost, port_mask(instr, t))
            self._compute[key] = hit
        return hit

    @staticmethod
    def dma_key(instr: Instr, chip_region: tuple[int, ...] | None) -> tuple:
        """Everything `dma_plan` reads of `instr` and its chip region (its cache key)."""
        a = instr.attrs
        return (
            a.get("descriptors"),
            a.get("descriptor_bytes"),
            chip_region[2] if chip_region else -1,
            chip_region[3] if chip_region else -1,
            a.get("dge"),
            a.get("indirect"),
            a.get("transpose"),
            a.get("transpose_inner"),
            instr.nbytes,
            instr.hbm_read + instr.hbm_write,
            hbm_contiguous(instr),
        )

    def dma_plan(self, instr: Instr, chip_region: tuple[int, ...] | None) -> DmaPlan:
        """`dma_plan` through a cache keyed by everything the plan reads."""
        key = self.dma_key(instr, chip_region)
        plan = self._dma.get(key)
        if plan is None:
            plan = self._dma[key] = dma_plan(instr, chip_region, self.target)
        return plan
