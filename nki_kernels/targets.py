"""Trainium target parameter sets: the one place every chip number lives.

The interpreter takes its limits (partitions, SBUF/PSUM sizes, matmul limits, NC version)
and the cost model takes its clocks, instruction costs and DMA figures from the frozen
`Target` objects below, so calibration on hardware changes this file only.

Each value carries its source and a confidence tag in the comment next to it:
H = an official page states it; M = official for one generation only, or pages disagree;
L = derived or assumed. Sources are the public Neuron architecture guides
(trainium_inferentia2_arch, trainium2_arch, trainium3_arch), the NKI performance and DMA
bandwidth guides and the legacy `nki.isa` pages ("estimated instruction cost").
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True, kw_only=True)
class Target:
    """A NeuronCore generation: limits for the interpreter, figures for the cost model.

    Fields with a default hold the same value on every generation; each target below
    lists only what is its own.
    """

    name: str
    nc_version: int  # gen2 = trn1/inf2 (NC-v2), gen3 = trn2 (NC-v3), gen4 = trn3 (NC-v4). H

    # --- on-chip memory ---------------------------------------------------------------
    partitions: int = 128  # on every generation. H
    sbuf_bytes_per_partition: int  # physical SBUF per partition. H
    # compiler DMA scratch: nki-library budgets 16 KiB + 264 B on trn2 (M); assumed the
    # same on trn1 and trn3 (L)
    sbuf_reserved_bytes: int = 16 * KIB + 264
    psum_banks: int = 8  # banks per partition. H
    psum_bank_bytes: int = 2 * KIB  # per bank = 512 fp32. H

    # --- TensorE limits -----------------------------------------------------------------
    matmul_k_max: int = 128  # contraction (partition) rows. H
    matmul_m_max: int = 128  # stationary free size = output partitions. H
    matmul_n_max_fp32: int = 512  # moving free size with an fp32 PSUM dst. H
    matmul_n_max_bf16: int = 0  # ... with a bf16 PSUM dst (0: not before NC-v4). H

    # --- clocks (GHz = cycles per ns) ---------------------------------------------------
    tensor_ghz: float  # H
    vector_ghz: float  # H
    scalar_ghz: float  # H
    gpsimd_ghz: float  # H

    # --- engine throughput modifiers --------------------------------------------------
    vector_bf16_copy_speedup: float  # VectorE perf mode for bf16/fp16 copy/tensor_scalar. M
    vector_bf16_tt_speedup: float  # VectorE all-bf16 tensor_tensor. M
    scalar_bf16_speedup: float = 1.0  # ScalarE 2x for bf16 copy/tensor_scalar (NC-v4). M
    fp8_matmul_speedup: float  # double_row doubles the contraction per pass (NC-v3+). H
    fp32_matmul_slowdown: float = 4.0  # fp32 operands run at 1/4 rate. H
    fp32_transpose_slowdown: float  # fp32 PE transpose: 4x on v2, 2x on v3+. H
    throttle_start_fraction: float  # TensorE starts at ~50% under power throttling (trn2+). M
    throttle_ramp_ns: float  # ...and reaches full rate over ~3 us of sustained use. M

    # --- instruction overheads (engine cycles) -------------------------------------
    min_instr_cycles: int = 64  # MIN_II floor of a Vector/Scalar/GpSimd instruction. H (NC-v2)
    dependent_instr_cycles: int = 100  # extra when it depends on its engine's previous one. M
    sbuf_access_cycles: int = 60  # fixed cost of starting an SBUF/PSUM access. M
    gpsimd_startup_cycles: int = 150  # GpSimd instruction start-up. M
    matmul_min_cycles: int = 64  # MultiplyMoving floor: max(N, 64). H
    semaphore_ns: float = 50.0  # cross-engine semaphore signal latency (assumed). L

    # --- DMA and HBM --------------------------------------------------------------------
    dma_engines: int = 16  # queues per core. H
    dma_engine_bytes_per_ns: float  # achieved per-engine rate. M
    dma_fixed_ns: float = 1300.0  # trigger-to-start of a DMA (~1.3 us). M
    dma_dge_ns: float  # per hardware-DGE instruction (trn2+, ~600 ns). M
    # Each descriptor (contiguous piece) costs max(bytes / engine rate, this floor); with
    # ~100 ns the trn2 efficiency-vs-size curve is reproduced within a few points. L
    dma_descriptor_min_ns: float = 100.0
    hbm_bytes_per_ns: float  # HBM bandwidth per core (chip / cores). M

    # --- cost-model details -----------------------------------------------------------
    # Each DMA engine serves 8 SBUF partitions (engine e <-> partitions 8e..8e+7), so a
    # transfer over fewer partitions uses fewer engines (nki-dma-overview). H
    dma_partitions_per_engine: int = 8
    # Largest contiguous piece one descriptor moves when a DRAM->DRAM copy is split over
    # the engines (assumed). L
    dma_max_descriptor_bytes: int = 64 * KIB
    # Hardware descriptor-generation blocks per core; each hwdge DMA occupies one for
    # dma_dge_ns (nki-dge: "Each TRN2 NeuronCore has two DGE instances"). H on trn2, L trn3
    dge_instances: int = 2
    # Software DGE: GpSimd generates the descriptors of an indirect/swdge DMA; assumed to
    # cost about what the hardware block does. L
    dma_swdge_gpsimd_ns: float = 600.0
    # A descriptor's fixed cost and its data time overlap partly: the model combines them
    # as a smooth maximum (floor^k + (bytes/rate)^k)^(1/k). k = 4 follows the knee of the
    # published trn2 curve (81 % at 2 KiB, 97 % at 4 KiB); k -> inf is the plain max. L
    dma_descriptor_blend: float = 4.0
    # Per-opcode element-wise costs (HARDWARE.md "Instruction costs", NC-v2 statements
    # assumed to carry over): (opcode, cycles per element, extra cycles). Opcodes absent
    # here cost 1 cycle per element. H/M for the named ones, L for the rest.
    elementwise_cycles: tuple[tuple[str, float, float], ...] = (
        ("tensor_tensor", 2.0, 0.0),  # 2N; N with a PSUM input. H
        ("scalar_tensor_tensor", 2.0, 0.0),  # two tensor inputs like tensor_tensor. L
        ("tensor_tensor_scan", 2.0, 0.0),  # two tensor inputs. L
        ("tensor_copy_predicated", 2.0, 0.0),  # data + predicate streams. L
        ("range_select", 2.0, 0.0),  # L
        ("select_reduce", 2.0, 0.0),  # L
        ("reciprocal", 8.0, 0.0),  # VectorE reciprocal 8N. H
        ("bn_aggr", 13.0 / 3.0, 0.0),  # ~13N/3. H
        ("iota", 1.0, 150.0),  # GpSimd ~150 + N. H
        ("affine_select", 1.0, 150.0),  # GpSimd ~150 + N. H
    )
    activation_reduce_cycles: int = 64  # activation with a reduction adds ~64. H (NC-v2)
    # DMA transpose throughput as a fraction of the DMA engines' copy rate, for
    # hardware-friendly shapes (destination partitions a multiple of 128, inner free dim a
    # multiple of 16; 2- and 4-byte dtypes): "up to 90 %" HBM -> SBUF and "up to 50 %"
    # SBUF -> SBUF (trainium2_arch, "DMA Transpose"). H on trn2; trn3's guide has no DMA
    # transpose section, assumed equal (L). 0 = no transpose hardware: every element is
    # its own descriptor (trn1's guide documents none; the perf guide says its
    # load_transpose2d DMA transposes "degrade DMA bandwidth significantly"). M
    dma_transpose_hbm_efficiency: float = 0.9
    dma_transpose_sbuf_efficiency: float = 0.5

    @property
    def sbuf_usable_bytes(self) -> int:
        """SBUF bytes per partition a kernel may allocate."""
        return self.sbuf_bytes_per_partition - self.sbuf_reserved_bytes

    @property
    def tensor_peak_flops_per_ns(self) -> float:
        """bf16 dense peak: 128 x 128 MACs per cycle, 2 FLOPs each."""
        return 2.0 * self.partitions * self.matmul_m_max * self.tensor_ghz

    def replace(self, **changes: object) -> Target:
        """A copy with some parameters changed (for what-if studies and tests)."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


TRN1 = Target(
    name="trn1",
    nc_version=2,
    sbuf_bytes_per_partition=192 * KIB,  # 24 MiB total. H
    tensor_ghz=2.8,  # 91.75 TFLOP/s bf16. H
    vector_ghz=1.12,
    scalar_ghz=1.4,
    gpsimd_ghz=1.4,
    vector_bf16_copy_speedup=1.0,  # no perf modes documented for NC-v2. M
    vector_bf16_tt_speedup=1.0,
    fp8_matmul_speedup=1.0,  # fp8 runs at the bf16 rate on NC-v2. H
    fp32_transpose_slowdown=4.0,
    throttle_start_fraction=1.0,  # no throttling ramp documented for trn1. M
    throttle_ramp_ns=0.0,
    dma_engine_bytes_per_ns=17.0,
    dma_dge_ns=0.0,  # hardware DGE arrived with trn2. M
    dge_instances=0,
    dma_transpose_hbm_efficiency=0.0,
    dma_transpose_sbuf_efficiency=0.0,
    hbm_bytes_per_ns=410.0,  # ~820 GB/s per chip / 2 cores. M
)

TRN2 = Target(
    name="trn2",
    nc_version=3,
    sbuf_bytes_per_partition=224 * KIB,  # 28 MiB total. H
    tensor_ghz=2.4,  # 78.6 TFLOP/s bf16. H
    vector_ghz=0.96,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    vector_bf16_copy_speedup=4.0,  # "up to 4x" for bf16/fp16 contiguous copy/tensor_scalar. M
    vector_bf16_tt_speedup=2.0,  # 2x tensor_tensor all-bf16. M
    fp8_matmul_speedup=2.0,  # double_row (K = 256). H
    fp32_transpose_slowdown=2.0,
    throttle_start_fraction=0.5,
    throttle_ramp_ns=3000.0,
    dma_engine_bytes_per_ns=23.0,  # measured: 32 KiB in 1,416 ns. M
    dma_dge_ns=600.0,  # "approximately 600 ns" per hwdge DMA instruction (nki-dge). H
    hbm_bytes_per_ns=363.0,  # 2.9 TB/s / 8 cores. M
)

# trn3: trn2's engines and clocks except where noted.
TRN3 = TRN2.replace(
    name="trn3",
    nc_version=4,
    sbuf_bytes_per_partition=256 * KIB,  # 32 MiB total. H
    matmul_n_max_fp32=4096,  # H
    matmul_n_max_bf16=8192,  # H
    vector_ghz=1.2,
    scalar_bf16_speedup=2.0,  # 2x for bf16 copy/tensor_scalar. H
    dma_engine_bytes_per_ns=33.0,
    hbm_bytes_per_ns=600.0,  # ~4.8 TB/s / 8 cores. M
)

TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2, TRN3)}

# Names accepted by NEURON_PLATFORM_TARGET_OVERRIDE and by every `target=` argument.
_ALIASES = {"gen2": "trn1", "inf2": "trn1", "gen3": "trn2", "gen4": "trn3"}

DEFAULT_TARGET_NAME = "trn2"
TARGET_ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"


def get_target(target: str | Target | None = None) -> Target:
    """Resolve a target name ('trn1', 'trn2', 'trn3' or gen2/gen3/gen4/inf2).

    None means the platform override from the environment, else the project default
    (trn2: the current generation with the strictest matmul limits).
    """
    if isinstance(target, Target):
        return target
    if target is None:
        target = os.environ.get(TARGET_ENV_VAR) or DEFAULT_TARGET_NAME
    if not isinstance(target, str):
        raise TypeError(f"target: expected a name such as 'trn2' or a Target; got {target!r}")
    key = _ALIASES.get(target.lower(), target.lower())
    if key not in TARGETS:
        choices = ", ".join(sorted(TARGETS) + sorted(_ALIASES))
        raise ValueError(f"target: expected one of {choices}; got {target!r}")
    return TARGETS[key]
