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


@dataclass(frozen=True)
class Target:
    """A NeuronCore generation: limits for the interpreter, figures for the cost model."""

    name: str
    nc_version: int  # gen2 = trn1/inf2 (NC-v2), gen3 = trn2 (NC-v3), gen4 = trn3 (NC-v4). H

    # --- on-chip memory ---------------------------------------------------------------
    partitions: int  # 128 on every generation. H
    sbuf_bytes_per_partition: int  # physical SBUF per partition. H
    sbuf_reserved_bytes: int  # compiler DMA scratch; nki-library budgets 16 KiB + 264 B. M
    psum_banks: int  # 8 banks per partition. H
    psum_bank_bytes: int  # 2 KiB per bank = 512 fp32. H

    # --- TensorE limits -----------------------------------------------------------------
    matmul_k_max: int  # contraction (partition) rows. H
    matmul_m_max: int  # stationary free size = output partitions. H
    matmul_n_max_fp32: int  # moving free size with an fp32 PSUM dst. H
    matmul_n_max_bf16: int  # moving free size with a bf16 PSUM dst (NC-v4 only). H

    # --- clocks (GHz = cycles per ns) ---------------------------------------------------
    tensor_ghz: float  # H
    vector_ghz: float  # H
    scalar_ghz: float  # H
    gpsimd_ghz: float  # H

    # --- engine throughput modifiers --------------------------------------------------
    vector_bf16_copy_speedup: float  # VectorE perf mode for bf16/fp16 copy/tensor_scalar. M
    vector_bf16_tt_speedup: float  # VectorE all-bf16 tensor_tensor. M
    scalar_bf16_speedup: float  # ScalarE 2x for bf16 copy/tensor_scalar (NC-v4). M
    fp8_matmul_speedup: float  # double_row doubles the contraction per pass (NC-v3+). H
    fp32_matmul_slowdown: float  # fp32 operands run at 1/4 rate. H
    fp32_transpose_slowdown: float  # fp32 PE transpose: 4x on v2, 2x on v3+. H
    throttle_start_fraction: float  # TensorE starts at ~50% under power throttling (trn2+). M
    throttle_ramp_ns: float  # ...and reaches full rate over ~3 us of sustained use. M

    # --- instruction overheads (engine cycles) -------------------------------------
    min_instr_cycles: int  # MIN_II floor of a Vector/Scalar/GpSimd instruction. H (NC-v2)
    dependent_instr_cycles: int  # extra when it depends on the previous one on its engine. M
    sbuf_access_cycles: int  # fixed cost of starting an SBUF/PSUM access. M
    gpsimd_startup_cycles: int  # GpSimd instruction start-up. M
    matmul_min_cycles: int  # MultiplyMoving floor: max(N, 64). H
    semaphore_ns: float  # cross-engine semaphore signal latency. L

    # --- DMA and HBM --------------------------------------------------------------------
    dma_engines: int  # 16 queues per core. H
    dma_engine_bytes_per_ns: float  # achieved per-engine rate. M
    dma_fixed_ns: float  # trigger-to-start of a DMA (~1.3 us). M
    dma_dge_ns: float  # per hardware-DGE instruction (trn2+, ~600 ns). M
    dma_descriptor_min_ns: float  # each descriptor costs at least ~100 ns. L
    hbm_bytes_per_ns: float  # HBM bandwidth per core (chip / cores). M

    @property
    def sbuf_usable_bytes(self) -> int:
        """SBUF bytes per partition a kernel may allocate."""
        return self.sbuf_bytes_per_partition - self.sbuf_reserved_bytes

    @property
    def psum_bytes_per_partition(self) -> int:
        return self.psum_banks * self.psum_bank_bytes

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
    partitions=128,
    sbuf_bytes_per_partition=192 * KIB,  # 24 MiB total. H
    sbuf_reserved_bytes=16 * KIB + 264,  # same scratch as nki-library's trn2 budget. L
    psum_banks=8,
    psum_bank_bytes=2 * KIB,
    matmul_k_max=128,
    matmul_m_max=128,
    matmul_n_max_fp32=512,
    matmul_n_max_bf16=0,  # bf16 PSUM dst not supported before NC-v4. H
    tensor_ghz=2.8,  # 91.75 TFLOP/s bf16. H
    vector_ghz=1.12,
    scalar_ghz=1.4,
    gpsimd_ghz=1.4,
    vector_bf16_copy_speedup=1.0,  # no perf modes documented for NC-v2. M
    vector_bf16_tt_speedup=1.0,
    scalar_bf16_speedup=1.0,
    fp8_matmul_speedup=1.0,  # fp8 runs at the bf16 rate on NC-v2. H
    fp32_matmul_slowdown=4.0,
    fp32_transpose_slowdown=4.0,
    throttle_start_fraction=1.0,  # no throttling ramp documented for trn1. M
    throttle_ramp_ns=0.0,
    min_instr_cycles=64,
    dependent_instr_cycles=100,
    sbuf_access_cycles=60,
    gpsimd_startup_cycles=150,
    matmul_min_cycles=64,
    semaphore_ns=50.0,
    dma_engines=16,
    dma_engine_bytes_per_ns=17.0,
    dma_fixed_ns=1300.0,
    dma_dge_ns=0.0,  # hardware DGE arrived with trn2. M
    dma_descriptor_min_ns=100.0,
    hbm_bytes_per_ns=410.0,  # ~820 GB/s per chip / 2 cores. M
)

TRN2 = Target(
    name="trn2",
    nc_version=3,
    partitions=128,
    sbuf_bytes_per_partition=224 * KIB,  # 28 MiB total. H
    sbuf_reserved_bytes=16 * KIB + 264,  # nki-library's trn2 budget. M
    psum_banks=8,
    psum_bank_bytes=2 * KIB,
    matmul_k_max=128,
    matmul_m_max=128,
    matmul_n_max_fp32=512,
    matmul_n_max_bf16=0,
    tensor_ghz=2.4,  # 78.6 TFLOP/s bf16. H
    vector_ghz=0.96,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    vector_bf16_copy_speedup=4.0,  # "up to 4x" for bf16/fp16 contiguous copy/tensor_scalar. M
    vector_bf16_tt_speedup=2.0,  # 2x tensor_tensor all-bf16. M
    scalar_bf16_speedup=1.0,
    fp8_matmul_speedup=2.0,  # double_row (K = 256). H
    fp32_matmul_slowdown=4.0,
    fp32_transpose_slowdown=2.0,
    throttle_start_fraction=0.5,
    throttle_ramp_ns=3000.0,
    min_instr_cycles=64,
    dependent_instr_cycles=100,
    sbuf_access_cycles=60,
    gpsimd_startup_cycles=150,
    matmul_min_cycles=64,
    semaphore_ns=50.0,
    dma_engines=16,
    dma_engine_bytes_per_ns=23.0,  # measured: 32 KiB in 1,416 ns. M
    dma_fixed_ns=1300.0,
    dma_dge_ns=600.0,
    dma_descriptor_min_ns=100.0,
    hbm_bytes_per_ns=363.0,  # 2.9 TB/s / 8 cores. M
)

TRN3 = Target(
    name="trn3",
    nc_version=4,
    partitions=128,
    sbuf_bytes_per_partition=256 * KIB,  # 32 MiB total. H
    sbuf_reserved_bytes=16 * KIB + 264,  # assumed equal to trn2's. L
    psum_banks=8,
    psum_bank_bytes=2 * KIB,
    matmul_k_max=128,
    matmul_m_max=128,
    matmul_n_max_fp32=4096,
    matmul_n_max_bf16=8192,
    tensor_ghz=2.4,
    vector_ghz=1.2,
    scalar_ghz=1.2,
    gpsimd_ghz=1.2,
    vector_bf16_copy_speedup=4.0,  # bf16/fp16/fp8 2-4x. M
    vector_bf16_tt_speedup=2.0,
    scalar_bf16_speedup=2.0,  # 2x for bf16 copy/tensor_scalar. H
    fp8_matmul_speedup=2.0,  # double_row; MXFP8 (4x) is a separate instruction. H
    fp32_matmul_slowdown=4.0,
    fp32_transpose_slowdown=2.0,
    throttle_start_fraction=0.5,
    throttle_ramp_ns=3000.0,
    min_instr_cycles=64,
    dependent_instr_cycles=100,
    sbuf_access_cycles=60,
    gpsimd_startup_cycles=150,
    matmul_min_cycles=64,
    semaphore_ns=50.0,
    dma_engines=16,
    dma_engine_bytes_per_ns=33.0,
    dma_fixed_ns=1300.0,
    dma_dge_ns=600.0,
    dma_descriptor_min_ns=100.0,
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
    key = _ALIASES.get(target.lower(), target.lower())
    if key not in TARGETS:
        choices = ", ".join(sorted(TARGETS) + sorted(_ALIASES))
        raise ValueError(f"target: expected one of {choices}; got {target!r}")
    return TARGETS[key]
