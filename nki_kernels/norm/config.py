"""Tunable schedules of the norm kernels: frozen `KernelConfig`s with a heuristic default,
a search space and a validity check (including whether the tile plan fits SBUF).

Field names are the kernels' keyword parameters (`runtime.launch` passes them through):

- `rows_per_partition`: rows per partition per row tile (a tile holds 128 x this rows;
  each partition's share is one contiguous HBM run, so small H still gets big DMAs);
- `chunk`: columns per compute / DMA step (= hidden for whole rows);
- `resident`: keep the row tile in SBUF between the statistics pass and the output pass
  (x read once); False streams it twice (for rows too wide for SBUF);
- `bufs`: rotating buffers per streamed tile (2 = double buffering);
- `scale_mode` / `gpsimd_eighths` / `stats`: which engines do the full-width work
  (`gpsimd_eighths`: eighths of each tensor_tensor's columns run on GpSimd).

The SBUF estimate mirrors the kernels' allocations (bytes per partition, 64 B granules,
each loop-allocated temporary counted twice for its rotation); tests check it against
the interpreter's own accounting.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from ..kernel_config import InvalidConfig, KernelConfig
from ..targets import Target
from .backward import bwd_defer, bwd_inline, bwd_stages, stats_cols
from .layernorm import (
    BN_FMAX,
    LN_MODES,
    LN_SCALAR,
    LN_VECTOR,
    STATS_BN,
    STATS_MIXED,
    STATS_MODES,
    STATS_SCALAR,
)
from .rmsnorm import GPSIMD_EIGHTHS_MAX, NSTAGES, SCALE_MODES, SCALE_VECTOR
from .tiling import COLSUM_MAX_H, SEG_COLS, P

GRANULE = 64  # SBUF allocation granule per partition (interp.memory.SBUF_ALIGN)
# Fraction of usable SBUF a plan may fill: the first-fit allocator can fragment.
SBUF_HEADROOM = 0.95
# DMA efficiency is ~99% from 8 KiB per partition up (HARDWARE.md); the heuristic groups
# rows until a partition's share of one tile reaches 16 KiB, which also spreads each
# tile's fixed per-row statistics instructions over more rows.
TARGET_DMA_BYTES = 16384
# Forward: a bigger row tile costs more pipeline fill and drain (the first load and the
# last tile's stages run alone), a smaller one more per-tile fixed costs; the modeled best
# tile share per partition grows like sqrt(the problem's bytes per partition x this)
# (cost model v3, trn2, bf16, H 128..2048, 64..16384 rows, LNC 1 and 2).
FILL_BALANCE_BYTES = 512
# Forward: with at most this many rows (one or two row tiles) nothing overlaps a tile's
# load but its own column chunks, so rows of >= SPLIT_MIN_H columns go in chunks of about
# a quarter row (modeled, cost model v3: [64, 1536] 7.5 -> 6.9 us, [64, 7168] 31.5 -> 23.3)
FEW_ROWS = 2 * 128
SPLIT_MIN_H = 1024
CHUNK_CANDIDATES = (512, 1024, 2048, 4096, 8192)
ROWS_PER_PARTITION = (1, 2, 4, 8)
# eighths of the split products on GpSimd; the best modeled shares sit between 2 and 6
GPSIMD_SHARES = (0, 2, 3, 4, 5, 6)
BUFS = (2, 3, 4)
# backward: a resident tile is held through up to 5 stages (S, A, Q, R, D), plus one loading
BWD_BUFS = (2, 3, 4, 5, 6)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
AFFINES = ("none", "w", "b", "wb")


@dataclass(frozen=True)
class NormProblem:
    """A bucketed norm call: rows (after bucketing), hidden size, dtype, affine terms.

    `affine` is 'wb' (weight and bias), 'w', 'b' or 'none'.
    """

    rows: int
    hidden: int
    dtype: str
    affine: str = "w"

    def __post_init__(self) -> None:
        if self.rows < 1 or self.hidden < 1:
            raise ValueError(f"rows, hidden: expected >= 1; got {self.rows}, {self.hidden}")
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype: expected one of {sorted(DTYPE_BYTES)}; got {self.dtype!r}")
        if self.affine not in AFFINES:
            raise ValueError(f"affine: expected one of {AFFINES}; got {self.affine!r}")

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def has_weight(self) -> bool:
        return "w" in self.affine

    @property
    def has_bias(self) -> bool:
        return "b" in self.affine


def _r(nbytes: int) -> int:
    return max(GRANULE, -(-nbytes // GRANULE) * GRANULE)


def _chunks(hidden: int) -> tuple[int, ...]:
    return (*(c for c in CHUNK_CANDIDATES if c < hidden), hidden)


def _small(problem: NormProblem, kk: int, nch: int, per_tile: int, stages: int = NSTAGES) -> int:
    """Per-row statistics and accumulators: `per_tile` [P, kk]-sized tiles (plus the
    [P, kk, nch] partial sums) for each of the pipeline's tiles in flight, two statistics
    buffers for each of two segments, slack for a few more granules."""
    tiles = (stages + 1) * (per_tile * _r(kk * 4) + 2 * _r(kk * nch * 4))
    seg_cols = min(max(1, problem.rows // P), SEG_COLS)
    return tiles + 4 * _r(seg_cols * 4) + 8 * GRANULE


def _kks(rows: int) -> tuple[int, ...]:
    return tuple(k for k in ROWS_PER_PARTITION if k == 1 or P * k <= rows)


def _fwd_grouping(problem: NormProblem) -> int:
    """Rows per partition per forward row tile: the largest grouping whose share of a tile
    per partition stays within sqrt(bytes per partition of all rows x FILL_BALANCE_BYTES)
    and the DMA target (16 KiB); one row when even that exceeds it."""
    row_bytes = problem.hidden * problem.itemsize
    per_partition = -(-problem.rows // P) * row_bytes
    want = min(TARGET_DMA_BYTES, math.isqrt(per_partition * FILL_BALANCE_BYTES))
    return max(k for k in _kks(problem.rows) if k == 1 or k * row_bytes <= want)


@dataclass(frozen=True)
class _NormConfig(KernelConfig):
    """Fields shared by every norm kernel (forward and backward)."""

    rows_per_partition: int = 1
    chunk: int = 512
    resident: bool = True
    bufs: int = 4
    gpsimd_eighths: int = 0

    backward: ClassVar[bool] = False
    bufs_options: ClassVar[tuple[int, ...]] = BUFS

    # --- SBUF plan -------------------------------------------------------------------
    def stages(self, problem: NormProblem) -> int:
        """Pipeline stages of the kernel under this plan (a resident tile is held through
        all of them)."""
        return NSTAGES

    def sbuf_bytes(self, problem: NormProblem) -> int:
        """Peak SBUF bytes per partition of this plan (an upper bound of the kernel's)."""
        raise NotImplementedError

    def _common_checks(self, problem: NormProblem, target: Target) -> None:
        if self.rows_per_partition < 1:
            raise InvalidConfig(f"rows_per_partition: expected >= 1; got {self.rows_per_partition}")
        if not 1 <= self.chunk <= problem.hidden:
            raise InvalidConfig(f"chunk: expected 1..{problem.hidden} (hidden); got {self.chunk}")
        stages = self.stages(problem)
        if self.bufs not in self.bufs_options or (self.resident and self.bufs < stages):
            raise InvalidConfig(
                f"bufs: expected one of {self.bufs_options}, >= {stages} when resident (a tile "
                f"is held through the {stages} pipeline stages); got {self.bufs} "
                f"(resident={self.resident})"
            )
        if not 0 <= self.gpsimd_eighths <= GPSIMD_EIGHTHS_MAX:
            raise InvalidConfig(f"gpsimd_eighths: expected 0..8; got {self.gpsimd_eighths}")
        if self.backward:
            if self.chunk != problem.hidden and self.chunk % P:
                raise InvalidConfig(
                    f"chunk: backward column blocks start at multiples of {P}; got {self.chunk} "
                    f"(hidden {problem.hidden})"
                )
            if problem.hidden > COLSUM_MAX_H:
                raise InvalidConfig(
                    f"hidden: backward weight gradients need hidden <= {COLSUM_MAX_H}; "
                    f"got {problem.hidden}"
                )
        need = self.sbuf_bytes(problem)
        budget = int(target.sbuf_usable_bytes * SBUF_HEADROOM)
        if need > budget:
            raise InvalidConfig(
                f"SBUF: plan needs {need} B per partition on {target.name}; budget {budget} B "
                f"({SBUF_HEADROOM:.0%} of {target.sbuf_usable_bytes} usable)"
            )

    def validate(self, problem: NormProblem, target: Target) -> None:
        self._common_checks(problem, target)

    # --- heuristic -------------------------------------------------------------------
    @classmethod
    def _pick(cls, problem: NormProblem, target: Target, **fixed: Any) -> Any:
        """The first valid plan in order of preference: whole row tiles in SBUF with one
        tile loading ahead (the largest chunk that allows it; with few rows, quarter-row
        chunks first), else without, else streamed chunks loading ahead; within each, the
        row grouping of `_fwd_grouping`, else one row per partition. Loading ahead comes
        before a larger chunk: without it the DMA of the next tile waits for the last
        stage of the current one (on trn2, 47 % slower for add_rms_norm at [32768, 8192],
        modeled)."""
        kk = _fwd_grouping(problem)
        chunks = sorted(_chunks(problem.hidden), reverse=True)
        if problem.rows <= FEW_ROWS and problem.hidden >= SPLIT_MIN_H:
            quarter = max(c for c in chunks if c <= max(CHUNK_CANDIDATES[0], problem.hidden // 4))
            chunks = [quarter, *(c for c in chunks if c != quarter)]
        plans = [(True, c, b) for b in (NSTAGES + 1, NSTAGES) for c in chunks]
        plans += [(False, c, b) for b in (3, 2) for c in chunks]
        for resident, chunk, bufs in plans:
            for k in sorted({kk, 1}, reverse=True):
                cfg = cls(rows_per_partition=k, chunk=chunk, resident=resident, bufs=bufs, **fixed)
                if cfg.is_valid(problem, target):
                    return cfg
        raise InvalidConfig(f"no valid {cls.__name__} for {problem} on {target.name}")


@dataclass(frozen=True)
class RMSNormConfig(_NormConfig):
    """Schedule of `rms_norm_fwd` (op `rms_norm`)."""

    op_name: ClassVar[str] = "rms_norm"
    scale_mode: str = SCALE_VECTOR
    has_residual: ClassVar[bool] = False

    def sbuf_bytes(self, problem: NormProblem) -> int:
        h, c, kk, d = problem.hidden, self.chunk, self.rows_per_partition, self.bufs
        isz = problem.itemsize
        total = _r(h * isz) if problem.has_weight else 0  # weight row on every partition
        total += _r(c * isz)  # discarded output of the square-and-sum
        width = h if self.resident else c
        total += d * _r(kk * width * isz)  # x tiles (ring of `bufs`)
        if self.has_residual:
            total += d * _r(kk * width * isz)  # residual tiles
        if problem.has_weight:
            total += 2 * _r(kk * c * isz)  # y chunks (ring of 2, until their store)
        return total + _small(problem, kk, -(-h // c), 4)

    def validate(self, problem: NormProblem, target: Target) -> None:
        if self.scale_mode not in SCALE_MODES:
            raise InvalidConfig(f"scale_mode: expected one of {SCALE_MODES}; got {self.scale_mode}")
        self._common_checks(problem, target)

    @classmethod
    def heuristic(cls, problem: NormProblem, target: Target) -> RMSNormConfig:
        # bf16 / fp16: no GpSimd share: a GpSimd instruction cannot overlap VectorE's
        # perf-mode ones (the shared SBUF port), so VectorE alone models faster at every
        # size (cost model v3, trn2: [4096, 1536] LNC 2 48.4 -> 46.5 us, [16384, 7168]
        # 775 -> 668 us); fp32 has no perf mode and half of the products on GpSimd stays
        # faster
        share = 4 if problem.dtype == "float32" else 0
        return cls._pick(problem, target, scale_mode=SCALE_VECTOR, gpsimd_eighths=share)

    @classmethod
    def search_space(cls, problem: NormProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        return {
            "rows_per_partition": _kks(problem.rows),
            "chunk": _chunks(problem.hidden),
            "resident": (True, False),
            "bufs": BUFS,
            "scale_mode": SCALE_MODES,
            "gpsimd_eighths": GPSIMD_SHARES,
        }


@dataclass(frozen=True)
class AddRMSNormConfig(RMSNormConfig):
    """Schedule of `add_rms_norm_fwd` (op `add_rms_norm`)."""

    op_name: ClassVar[str] = "add_rms_norm"
    has_residual: ClassVar[bool] = True


@dataclass(frozen=True)
class RMSNormBwdConfig(_NormConfig):
    """Schedule of `rms_norm_bwd` (op `rms_norm_bwd`)."""

    op_name: ClassVar[str] = "rms_norm_bwd"
    backward: ClassVar[bool] = True
    bufs_options: ClassVar[tuple[int, ...]] = BWD_BUFS

    def stages(self, problem: NormProblem) -> int:
        return bwd_stages(False, *self._bwd_key(problem))

    def _bwd_key(self, problem: NormProblem) -> tuple[bool, bool, int, int]:
        return self.resident, problem.has_weight, self.rows_per_partition, problem.hidden

    def deferred(self, problem: NormProblem) -> bool:
        """Whether the kernel keeps whole-tile row-sum operands (`backward.bwd_defer`)."""
        return bwd_defer(self.resident, self.rows_per_partition, problem.hidden)

    def inline_stats(self) -> bool:
        """Whether the kernel computes the row statistics itself (the op then launches no
        statistics kernel; `backward.bwd_inline`)."""
        return bwd_inline(self.resident)

    def _inline_bytes(self, problem: NormProblem, stat_bytes: int) -> int:
        """The in-kernel statistics: their discarded [P, chunk] output and per-tile sums."""
        if not self.inline_stats():
            return 0
        cols = stats_cols(self.chunk, stat_bytes)
        kk, nch = self.rows_per_partition, -(-problem.hidden // cols)
        return _r(cols * stat_bytes) + (self.stages(problem) + 1) * 8 * _r(kk * nch * 4)

    # fp32 [P, chunk] rings of 2 (deferred row sums, not): not: g (stage D), p, p * w;
    # deferred: none (stage D recomputes g over the tile's row-sum operands)
    temporaries: ClassVar[tuple[int, int]] = (0, 3)
    # [P, kk, H] fp32 row-sum operands held from stage A to R (deferred; with a weight,
    # p * w has its own stage Q, the tile is held one more step and one more is in flight)
    held: ClassVar[tuple[int, int]] = (2, 4)

    def sbuf_bytes(self, problem: NormProblem) -> int:
        h, c, kk, d = problem.hidden, self.chunk, self.rows_per_partition, self.bufs
        isz = problem.itemsize
        total = _r(h * isz) if problem.has_weight else 0
        # x and dy tiles (in-kernel statistics: dy's ring is one buffer shorter)
        total += (2 * d - self.inline_stats()) * _r(kk * (h if self.resident else c) * isz)
        total += 2 * _r(kk * c * isz)  # dx chunks (ring of 2)
        temps = self.temporaries[0 if self.deferred(problem) else 1]
        total += 2 * temps * _r(c * 4)
        if self.deferred(problem):  # row-sum operands of the tiles in flight, A to R
            total += self.held[problem.has_weight] * _r(kk * h * 4)
        total += 2 * _r(P * isz)  # identity (and the ones it is selected from)
        total += _r(4) + _r(-(-h // P) * 4) + _r(P * 4)  # ones; final column-sum copies
        total += self._inline_bytes(problem, isz)
        return total + _small(problem, kk, -(-h // c), 6, self.stages(problem))

    @classmethod
    def _pick(cls, problem: NormProblem, target: Target, **fixed: Any) -> Any:
        """As `_NormConfig._pick` with the backward's stage counts: resident plans (largest
        chunk; bufs = stages, else one tile loading ahead), else streamed chunks; the
        largest row grouping up to the DMA target first."""
        row_bytes = problem.hidden * problem.itemsize
        kks = [k for k in _kks(problem.rows) if k * row_bytes <= TARGET_DMA_BYTES or k == 1]
        chunks = sorted(_chunks(problem.hidden), reverse=True)
        chunks = [c for c in chunks if c == problem.hidden or c % P == 0]
        # a resident tile held through every stage, no tile loading ahead, models best
        # (cost model v1: the loads hide behind the deeper pipeline) and leaves SBUF free
        plans = [(True, c, ahead) for c in chunks for ahead in (0, 1)]
        plans += [(False, c, b) for b in (3, 2) for c in chunks]
        for resident, chunk, b in plans:
            for k in sorted({max(kks), 1}, reverse=True):
                cfg = cls(rows_per_partition=k, chunk=chunk, resident=resident, bufs=2, **fixed)
                bufs = cfg.stages(problem) + b if resident else b
                cfg = dataclasses.replace(cfg, bufs=bufs)
                if cfg.is_valid(problem, target):
                    return cfg
        raise InvalidConfig(f"no valid {cls.__name__} for {problem} on {target.name}")

    @classmethod
    def heuristic(cls, problem: NormProblem, target: Target) -> RMSNormBwdConfig:
        # VectorE's share of the dy products reads dy from PSUM (1 cycle / element) and
        # GpSimd also takes 6/8 of p * w: 4/8 of the dy products balance the two where
        # VectorE is the slower clock (trn2), 3/8 where they match (trn3) (modeled, cost
        # model v1)
        cfg = cls._pick(problem, target, gpsimd_eighths=_gpsimd_share(target, 4, 3))
        if not cfg.deferred(problem):  # p * w split like the dy products: GpSimd takes half
            cfg = dataclasses.replace(cfg, gpsimd_eighths=4)
        return cfg

    @classmethod
    def search_space(cls, problem: NormProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        chunks = tuple(c for c in _chunks(problem.hidden) if c == problem.hidden or c % P == 0)
        return {
            "rows_per_partition": _kks(problem.rows),
            "chunk": chunks,
            "resident": (True, False),
            "bufs": BWD_BUFS,
            "gpsimd_eighths": GPSIMD_SHARES,
        }


def stats_in_kernel(config: KernelConfig) -> bool:
    """Whether `config` is a norm backward config whose kernel computes the row statistics
    itself, so the op launches no statistics kernel and passes None for them."""
    return isinstance(config, RMSNormBwdConfig) and config.inline_stats()


@dataclass(frozen=True)
class AddRMSNormBwdConfig(RMSNormBwdConfig):
    """Schedule of `rms_norm_bwd` with the h gradient (op `add_rms_norm_bwd`)."""

    op_name: ClassVar[str] = "add_rms_norm_bwd"

    @classmethod
    def heuristic(cls, problem: NormProblem, target: Target) -> AddRMSNormBwdConfig:
        # VectorE also adds dh: GpSimd takes more of the dy products (modeled, cost model v1)
        cfg = super().heuristic(problem, target)
        if cfg.deferred(problem):
            cfg = dataclasses.replace(cfg, gpsimd_eighths=_gpsimd_share(target, 5, 4))
        return cast(AddRMSNormBwdConfig, cfg)

    def sbuf_bytes(self, problem: NormProblem) -> int:
        width = problem.hidden if self.resident else self.chunk
        dh = (self.bufs - self.inline_stats()) * _r(
            self.rows_per_partition * width * problem.itemsize
        )
        return super().sbuf_bytes(problem) + dh


@dataclass(frozen=True)
class LayerNormConfig(_NormConfig):
    """Schedule of `layer_norm_fwd` (op `layer_norm`)."""

    op_name: ClassVar[str] = "layer_norm"
    scale_mode: str = LN_VECTOR
    stats: str = STATS_MIXED

    def sbuf_bytes(self, problem: NormProblem) -> int:
        h, c, kk, d = problem.hidden, self.chunk, self.rows_per_partition, self.bufs
        isz = problem.itemsize
        total = (_r(h * isz) if problem.has_weight else 0) + (
            _r(h * isz) if problem.has_bias else 0
        )
        total += _r(c * 4)  # discarded output of the sums
        total += d * _r(kk * (h if self.resident else c) * isz)  # x tiles
        if problem.has_weight or problem.has_bias:
            total += 2 * _r(kk * c * isz)  # y chunks (ring of 2)
        nch = -(-h // c)
        nsub = nch * -(-c // BN_FMAX)
        return total + _small(problem, kk, nch, 12) + (NSTAGES + 1) * _r(kk * nsub * 24)

    def validate(self, problem: NormProblem, target: Target) -> None:
        if self.scale_mode not in LN_MODES:
            raise InvalidConfig(f"scale_mode: expected one of {LN_MODES}; got {self.scale_mode}")
        if self.stats not in STATS_MODES:
            raise InvalidConfig(f"stats: expected one of {STATS_MODES}; got {self.stats}")
        if self.stats == STATS_MIXED and problem.dtype == "float32":
            raise InvalidConfig(
                "stats: 'mixed' sums x unshifted, which costs fp32 outputs accuracy when "
                "|mean| >> std; use 'scalar' or 'bn' for float32"
            )
        if self.stats == STATS_BN and not bn_stats_available():
            raise InvalidConfig("stats: 'bn' needs nisa.bn_stats / bn_aggr, absent from this nki")
        self._common_checks(problem, target)

    @classmethod
    def heuristic(cls, problem: NormProblem, target: Target) -> LayerNormConfig:
        # Modeled best under cost model v2 at [16384, 4096 / 8192] bf16, trn2 and trn3: the
        # statistics as two ScalarE passes (the mixed mode's VectorE sum competes with
        # the affine tensor_tensors, VectorE being the busier engine); no GpSimd share
        # (a GpSimd instruction cannot overlap VectorE's perf-mode ones on the shared
        # SBUF port, trainium2_arch, and GpSimd takes 2N cycles where VectorE takes N);
        # xn on ScalarE where VectorE's clock is the slower (trn2), else on VectorE.
        # v1 had picked mixed statistics and half of the affine columns on GpSimd.
        mode = LN_SCALAR if target.vector_ghz < target.scalar_ghz else LN_VECTOR
        stats = STATS_SCALAR
        if problem.rows <= FEW_ROWS and problem.dtype != "float32":
            # one or two row tiles: no other tile's work hides a stage, so the shortest
            # chain wins: one ScalarE pass (the mixed statistics) and xn on VectorE
            # (modeled, cost model v3, trn2 LNC 2: [64, 512] 6.3 -> 5.6 us, [64, 1536]
            # 12.3 -> 10.7 us)
            mode, stats = LN_VECTOR, STATS_MIXED
        return cls._pick(problem, target, scale_mode=mode, gpsimd_eighths=0, stats=stats)

    @classmethod
    def search_space(cls, problem: NormProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        # 'mixed' is refused for fp32
        modes = (STATS_SCALAR,) if problem.dtype == "float32" else (STATS_SCALAR, STATS_MIXED)
        stats = tuple(s for s in (*modes, STATS_BN) if s != STATS_BN or bn_stats_available())
        return {
            "rows_per_partition": _kks(problem.rows),
            "chunk": _chunks(problem.hidden),
            "resident": (True, False),
            "bufs": BUFS,
            "scale_mode": LN_MODES,
            "gpsimd_eighths": GPSIMD_SHARES,
            "stats": stats,
        }


@dataclass(frozen=True)
class LayerNormBwdConfig(RMSNormBwdConfig):
    """Schedule of `layer_norm_bwd` (op `layer_norm_bwd`)."""

    op_name: ClassVar[str] = "layer_norm_bwd"

    def stages(self, problem: NormProblem) -> int:
        return bwd_stages(True, *self._bwd_key(problem))

    # deferred: none (p and p * w in the kept row-sum operands, g kept); not: p, p * w, g twice
    temporaries: ClassVar[tuple[int, int]] = (0, 4)
    held: ClassVar[tuple[int, int]] = (2, 2)

    def sbuf_bytes(self, problem: NormProblem) -> int:
        extra = _r(4) + _r(-(-problem.hidden // P) * 4) + _r(P * 4)  # the bias sums' copies
        extra += _r(self.chunk * problem.itemsize)  # discarded copy (sum of dy, no weight)
        extra += self._inline_bytes(problem, 4) - self._inline_bytes(problem, problem.itemsize)
        if self.deferred(problem) and problem.has_weight:  # g of the tiles in flight, A to D
            extra += NSTAGES * _r(self.rows_per_partition * problem.hidden * 4)
        return super().sbuf_bytes(problem) + extra + _small(problem, self.rows_per_partition, 1, 10)

    @classmethod
    def heuristic(cls, problem: NormProblem, target: Target) -> LayerNormBwdConfig:
        # VectorE also runs every (x - mean) * dy (scalar_tensor_tensor): GpSimd takes most
        # of g = dy * w (modeled, cost model v1)
        cfg = cls._pick(problem, target, gpsimd_eighths=_gpsimd_share(target, 6, 4))
        if not cfg.deferred(problem):  # g is recomputed for dx: VectorE takes more of it
            cfg = dataclasses.replace(cfg, gpsimd_eighths=_gpsimd_share(target, 5, 4))
        return cfg


def _gpsimd_share(target: Target, slow_vector: int, fast_vector: int) -> int:
    """GpSimd's share of the split products (eighths): `slow_vector` where VectorE's clock
    is below GpSimd's (trn2), `fast_vector` where it is not (trn3), as modeled best
    (cost model v1, [16384, 4096 / 8192] bf16)."""
    return slow_vector if target.vector_ghz < target.gpsimd_ghz else fast_vector


def bn_stats_available() -> bool:
    """Whether the `nki` in use provides bn_stats / bn_aggr."""
    from ..nki import nisa

    return hasattr(nisa, "bn_stats") and hasattr(nisa, "bn_aggr")


CONFIGS: dict[str, type[_NormConfig]] = {
    cls.op_name: cls
    for cls in (
        RMSNormConfig,
        AddRMSNormConfig,
        RMSNormBwdConfig,
        AddRMSNormBwdConfig,
        LayerNormConfig,
        LayerNormBwdConfig,
    )
}


def replace(config: KernelConfig, **changes: Any) -> KernelConfig:
    """A copy of `config` with some fields changed."""
    return dataclasses.replace(config, **changes)
