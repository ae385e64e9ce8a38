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
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KIB = 1024
SHIPPED_PARAMETERS = "shipped"
OVERRIDE_KIND = "target_override"
OVERRIDE_DIR_ENV = "NKI_KERNELS_TARGETS_DIR"


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
    # what the compiler keeps for itself: nki-library (d2ad3a57,
    # core/mlp/mlp_cte/mlp_cte_constants.py) budgets "Total available SBUF -
    # DynamicDMAScratchLoc - EvalAccelReservedLoc - identity tensor size for transpose"
    # = 224 KiB - 16384 - 8 - 256 on trn2 (bwmm_bwd_dropless.py: - 8 - 520, its identity
    # fp32): the identity tile is the kernel's own allocation (counted when it allocates
    # it), the compiler's are 16 KiB + 8 B. The NKI front end's
    # `nl.tile_size.total_available_sbuf_size` agrees: 212,984 B for gen3 (trn2) and
    # 245,752 B for gen4 (trn3), 180,224 B (16 KiB reserved) for gen2 (trn1)
    # (leanprover/KLR @ 7ccd18c, KLR/Trace.lean). M
    sbuf_reserved_bytes: int = 16 * KIB + 8
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
    # VectorE's 2x mode for tensor_copy / tensor_scalar: BF16/FP16 in SBUF but not
    # contiguous in the most-minor free dimension, or contiguous with one tensor in PSUM
    # (trainium2_arch, "Vector Engine Performance Mode"). H
    vector_bf16_2x_speedup: float = 1.0
    # TensorE tiling mode: matmuls on disjoint PE tiles "run in parallel" (nc_matmul ISA
    # page; rule 46, perfmodel/pe_tiles.py). 1 = they overlap, 0 = each holds the whole
    # engine (the band's slow corner: the overlap's cost is not documented). M
    tensor_tile_overlap: float = 1.0
    # A most-minor free-dimension stride above 16 bytes halves SBUF / PSUM bandwidth:
    # "roughly 50% performance hit on the instructions" (trainium_inferentia2_arch,
    # "Access pattern"; NC-v2's statement, assumed to carry over to NC-v3/v4). H / L
    strided_access_slowdown: float = 2.0
    fp8_matmul_speedup: float  # double_row doubles the contraction per pass (NC-v3+). H
    fp32_matmul_slowdown: float = 4.0  # fp32 operands run at 1/4 rate. H
    fp32_transpose_slowdown: float  # fp32 PE transpose: 4x on v2, 2x on v3+. H
    throttle_start_fraction: float  # TensorE starts at ~50% (dI/dt throttling, trn2+). H
    throttle_ramp_ns: float  # ...and reaches full rate over ~3 us of sustained use. H
    # "If utilization drops below 50% over any ~3 microsecond window ... the limit
    # re-engages" (neuron-explorer overview-summary-page, Understanding throttling). H
    throttle_reengage_utilization: float = 0.5

    # --- instruction overheads (engine cycles) -------------------------------------
    min_instr_cycles: int = 64  # MIN_II floor of a Vector/Scalar/GpSimd instruction. H (NC-v2)
    # extra when an instruction depends on its engine's previous one: "in the order of ~100
    # cycles" (perf guide); fitted to its 264-cycle dependent activations (v2). M
    dependent_instr_cycles: float = 100
    sbuf_access_cycles: int = 60  # fixed cost of starting an SBUF/PSUM access. M
    # The compiler's instruction scheduling ("automatic instruction scheduling", which
    # "could execute in any order" instructions without a dependency; nl.no_reorder and
    # with_schedule constrain it: NKI scheduling-APIs guide; on unless
    # --enable-instruction-scheduling=false): each compute engine may issue a later
    # independent instruction of its own ahead of an earlier one within this many
    # pending instructions (perfmodel/scheduling.py; at a window > 1 it renames tiles that
    # share bytes with a pending instruction only through another allocation, as the
    # compiler allocates with the dependencies in view). The docs give no window: 1 =
    # every engine in program order (trn2 / trn3, where no anchor measures it); trn1's
    # is chosen by the fit (perfmodel/fit.py SCHEDULING_WINDOWS). L
    scheduling_window: int = 1
    gpsimd_startup_cycles: int = 150  # GpSimd instruction start-up. M
    matmul_min_cycles: int = 64  # MultiplyMoving floor: max(N, 64). H
    # TensorE cycles per instruction beyond the guide's "roughly max(N, MM_INIT_LATENCY)"
    # initiation interval (trainium arch guide): not documented; v3 fits it on trn2 to
    # nki-autotune's attention_cte at S = 2048 and 16384 (range 0-32, prior 0). L
    matmul_extra_cycles: float = 0.0
    # NC-v4 background transpose: a PE transpose runs "in parallel to another matrix
    # multiplication (or another transpose)", "close to double performance on long chains
    # of transposes" (trainium3_arch): a transpose's cycles times this factor (1: none). M
    tensor_transpose_factor: float = 1.0
    semaphore_ns: float = 50.0  # cross-engine semaphore signal latency (assumed). L

    # --- DMA and HBM --------------------------------------------------------------------
    dma_engines: int = 16  # queues per core. H
    dma_engine_bytes_per_ns: float  # achieved per-engine rate. M
    # From the trigger (its dependencies met) to the first byte on the DMA engines. The
    # docs give "semaphore-to-start latency (~1300 ns cross-engine)" (nki-dma-bandwidth-
    # guide); v2 fits it per target (range 0-1950 ns), and the measured kernels put it far
    # below 1300 ns as the model charges it. M
    dma_fixed_ns: float = 1300.0
    dma_dge_ns: float  # per hardware-DGE instruction (trn2+, ~600 ns). M
    # Each descriptor (contiguous piece) costs a smooth max(bytes / engine rate, this
    # floor). v2: fitted per target to the published anchors (anchors.json); the DMA
    # overview's 2 KiB transfer in 97 ns on trn2 allows at most ~78 ns. Contiguous
    # partition rows (HBM side contiguous) merge into one descriptor per engine. L
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
        ("tensor_copy_predicated", 2.0, 0.0),  # data + predicate streams. L
        ("range_select", 2.0, 0.0),  # L
        ("select_reduce", 2.0, 0.0),  # L
        ("reciprocal", 8.0, 0.0),  # VectorE reciprocal 8N. H
        ("bn_aggr", 13.0 / 3.0, 0.0),  # ~13N/3. H
        ("tensor_scalar_reduce", 1.0, 64.0),  # "N + 64" (nki.isa cost table). H
        ("iota", 1.0, 150.0),  # GpSimd ~150 + N. H
        ("affine_select", 1.0, 150.0),  # GpSimd ~150 + N. H
        # QuantizeMX: "four input elements per partition, per cycle" (trainium3_arch). H
        ("quantize_mx", 0.25, 0.0),
        # VectorE exponential (NC-v4): "at 4x the throughput compared to the
        # nisa.activation (op=nl.exp) instruction on the Scalar Engine" (trainium3_arch),
        # ScalarE's N cycles at the same 1.2 GHz. H
        ("exponential", 0.25, 0.0),
    )
    # tensor_tensor_scan cycles per element: its ISA page gives no cost. The two-input rule
    # of thumb (2N, trainium arch guide) is the upper end, one element per cycle the lower;
    # cost model v2 fits it on trn1 to the fused-Mamba tutorial's profiles (perfmodel/fit.py)
    # and carries it to trn2/trn3 (same VectorE instruction; unanchored there). L
    scan_cycles_per_element: float = 2.0
    activation_reduce_cycles: int = 64  # activation with a reduction adds ~64. H (NC-v2)
    # DMA transpose throughput as a fraction of the DMA engines' copy rate, for
    # hardware-friendly shapes (destination partitions a multiple of 128, inner free dim a
    # multiple of 16; 2- and 4-byte dtypes): "up to 90 %" HBM -> SBUF and "up to 50 %"
    # SBUF -> SBUF (trainium2_arch, "DMA Transpose"). H on trn2; trn3's guide has no DMA
    # transpose section, assumed equal (L). 0 = no transpose hardware: every element is
    # its own descriptor (trn1's guide documents none; the perf guide says its
    # load_transpose2d DMA transposes "degrade DMA bandwidth significantly"). M
    # "up to 90 %" (an upper bound); v2 fits it on trn2 (range 0.37-0.9, perfmodel/fit.py).
    dma_transpose_hbm_efficiency: float = 0.9
    dma_transpose_sbuf_efficiency: float = 0.5
    # SBUF port shared by VectorE and GpSimd (trainium2_arch, "two restrictions in engine
    # parallel accesses ... are lifted" on NC-v3): on NC-v2 they never access SBUF at the
    # same time ("all"); on NC-v3+ VectorE's perf mode "leverages a shared memory bus
    # between the VectorE and GpsimdE engines" and the hardware arbitrates, so a
    # perf-mode VectorE instruction and a GpSimd instruction do not overlap
    # ("perf_mode"). H
    vector_gpsimd_sbuf_port: str = "perf_mode"
    # NC-v2: VectorE and ScalarE cannot access PSUM in parallel (same page). H
    vector_scalar_psum_port: bool = False
    # Where the parameter values come from; shown in every modeled figure's label when
    # it is not the shipped set (a `calibrate` override names its measurement file).
    parameters: str = SHIPPED_PARAMETERS
    # A calibration override's band sets (JSON: {"loo_sets": [...], "unanchored": {...}});
    # empty for the shipped targets, whose sets live in perfmodel/fit_v3.json.
    band_sets_json: str = ""

    @property
    def band_sets(self) -> dict[str, Any] | None:
        """The override's band sets, or None for a shipped target."""
        return json.loads(self.band_sets_json) if self.band_sets_json else None

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
    sbuf_reserved_bytes=16 * KIB,  # 180,224 B usable (KLR/Trace.lean, gen2). M
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
    # --- v2 fit to the trn1 anchors (kept in v3, perfmodel/fit_v3.json): the matmul tutorial's four
    # kernels, the perf guide's dependent activations and the fused-Mamba tutorial's v2
    # and v3 (S <= 4096). The documented 17 B/ns is a peak; the tutorial's DMA-bound
    # kernels imply far less per engine, and no per-DMA start latency beyond the
    # descriptor costs once the compiler's scheduling window (8, chosen from a grid)
    # overlaps the loads with compute. The scan runs at one element per cycle (the
    # lower end of its range).
    dma_engine_bytes_per_ns=6.677,
    dma_descriptor_min_ns=32.88,
    dma_fixed_ns=0.0,
    dependent_instr_cycles=140.2,
    scheduling_window=8,
    scan_cycles_per_element=1.0,
    dma_dge_ns=0.0,  # hardware DGE arrived with trn2. M
    dge_instances=0,
    dma_transpose_hbm_efficiency=0.0,
    dma_transpose_sbuf_efficiency=0.0,
    hbm_bytes_per_ns=410.0,  # ~820 GB/s per chip / 2 cores. M
    vector_gpsimd_sbuf_port="all",
    vector_scalar_psum_port=True,
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
    vector_bf16_2x_speedup=2.0,  # strided SBUF or contiguous PSUM bf16 copy. H
    fp8_matmul_speedup=2.0,  # double_row (K = 256). H
    fp32_transpose_slowdown=2.0,
    throttle_start_fraction=0.5,
    throttle_ramp_ns=3000.0,
    # --- v3 fit to the trn2 anchors (perfmodel/fit_v3.json: the DMA overview's profile,
    # 32 KiB on one engine in 1,416 ns and a 2 KiB transfer in 97 ns; nki-library's
    # attention_cte at 30 % MFU at S = 2048 and 46 % at S = 16384; nki-autotune's 2048^3
    # matmuls at 90.92 % and 89.26 % MFU). The start latency and the HBM transpose
    # efficiency sit at the fast bound of their range; SBUF -> SBUF transposes run at 0.41
    # of the copy rate ("up to 50 %"); TensorE takes 18.75 cycles per instruction beyond
    # max(N, 64) (3.7 % at N = 512).
    dma_engine_bytes_per_ns=22.703125,
    dma_descriptor_min_ns=67.61375,
    dma_fixed_ns=0.0,
    dma_transpose_hbm_efficiency=0.9,
    dma_transpose_sbuf_efficiency=0.412109375,
    matmul_extra_cycles=18.75,
    # carried over from the trn1 fit (the perf guide's and the Mamba tutorial's figures
    # are NC-v2's): 140.5 from the fit before the Mamba anchors joined it. The refit's
    # 140.2 is 0.2 % lower (0.2 ns of the 189 ns chain that pins it); it is not carried
    # over, because the committed rows and configs were priced with 140.5; at 140.2 the
    # bench's 40 live trn2 / trn3 rows move by at most 0.018 % (modeled, measured once). L
    dependent_instr_cycles=140.5,
    scan_cycles_per_element=1.0,
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
    tensor_transpose_factor=0.5,  # background transpose. M
    dma_engine_bytes_per_ns=33.0,
    hbm_bytes_per_ns=600.0,  # ~4.8 TB/s / 8 cores. M
)

SHIPPED_TARGETS: dict[str, Target] = {t.name: t for t in (TRN1, TRN2, TRN3)}
# The targets in use: the shipped ones, replaced by a calibration override where one is
# loaded (`use_override`).
TARGETS: dict[str, Target] = dict(SHIPPED_TARGETS)

# Names accepted by NEURON_PLATFORM_TARGET_OVERRIDE and by every `target=` argument.
_ALIASES = {"gen2": "trn1", "inf2": "trn1", "gen3": "trn2", "gen4": "trn3"}

DEFAULT_TARGET_NAME = "trn2"
TARGET_ENV_VAR = "NEURON_PLATFORM_TARGET_OVERRIDE"


_overrides_loaded = False
_overrides_lock = threading.Lock()


def use_override(path: str | os.PathLike[str]) -> Target:
    """Load a `calibrate` override file; from now on `get_target` returns it for its target.

    The file names its target, fitted parameters, provenance and band sets; an error
    names the file and what is wrong with it.
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"target override {p}: cannot read: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != OVERRIDE_KIND:
        raise ValueError(f"target override {p}: expected kind {OVERRIDE_KIND!r}; got {data!r:.80}")
    name = data.get("target")
    if name not in SHIPPED_TARGETS:
        raise ValueError(
            f"target override {p}: target: expected one of {sorted(SHIPPED_TARGETS)}; got {name!r}"
        )
    params = data.get("parameters")
    fields = set(Target.__dataclass_fields__)
    if not isinstance(params, dict) or not set(params) <= fields:
        raise ValueError(
            f"target override {p}: parameters: expected Target fields; got {params!r:.120}"
        )
    bands = {"loo_sets": data.get("loo_sets", []), "unanchored": data.get("unanchored", {})}
    tgt = SHIPPED_TARGETS[name].replace(
        **params,
        parameters=f"{data.get('provenance', 'calibrated')}: {p.name}",
        band_sets_json=json.dumps(bands),
    )
    TARGETS[name] = tgt
    return tgt


def clear_overrides() -> None:
    """Back to the shipped parameter sets."""
    # every key of TARGETS is a shipped name (use_override refuses others): replacing the
    # values in place never leaves a name missing for a concurrent `get_target`
    TARGETS.update(SHIPPED_TARGETS)


def _load_override_dir() -> None:
    """Load NKI_KERNELS_TARGETS_DIR once. Marked loaded only when every file is in: a
    thread that finds it loaded sees the overrides, and a bad file fails every call."""
    global _overrides_loaded
    with _overrides_lock:
        if _overrides_loaded:
            return
        directory = os.environ.get(OVERRIDE_DIR_ENV)
        if directory:
            for f in sorted(Path(directory).glob("*.json")):
                use_override(f)
        _overrides_loaded = True


def get_target(target: str | Target | None = None) -> Target:
    """Resolve a target name ('trn1', 'trn2', 'trn3' or gen2/gen3/gen4/inf2).

    None means the platform override from the environment, else the project default
    (trn2: the current generation with the strictest matmul limits). A calibration
    override loaded with `use_override` (or found in the directory named by
    NKI_KERNELS_TARGETS_DIR, read once on the first call) replaces the shipped set.
    """
    if isinstance(target, Target):
        return target
    if target is None:
        target = os.environ.get(TARGET_ENV_VAR) or DEFAULT_TARGET_NAME
    if not isinstance(target, str):
        raise TypeError(f"target: expected a name such as 'trn2' or a Target; got {target!r}")
    if not _overrides_loaded:
        _load_override_dir()
    key = _ALIASES.get(target.lower(), target.lower())
    if key not in TARGETS:
        choices = ", ".join(sorted(TARGETS) + sorted(_ALIASES))
        raise ValueError(f"target: expected one of {choices}; got {target!r}")
    return TARGETS[key]
