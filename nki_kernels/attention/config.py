"""Tunables of the flash-attention kernels: frozen configs with heuristic, space, validity.

`AttentionProblem` is what a config is chosen for (bucketed lengths, heads, head dim,
dtype, mask kind). `FlashFwdConfig` drives `flash_fwd.flash_attention_fwd` and
`FlashBwdConfig` drives `flash_bwd.flash_attention_bwd`; their field names are those
kernels' parameter names (the runtime passes a config as keyword arguments).

`validate()` checks the rules the kernels rely on (fp32 P^T needs 2 PSUM banks per 1024
keys, DMA transposes need 2-byte data) and then the on-chip fit per target with a
trace-only dry run of the kernel itself on a reduced problem (one head, few query tiles,
the real key length): the interpreter's allocator is the one the kernel runs under, so
an SBUF or PSUM overflow it reports is exactly what the full problem would hit.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from ..kernel_config import InvalidConfig, KernelConfig
from ..perfmodel.band import interpreter_target
from ..targets import Target

P = 128
DTYPES = ("bfloat16", "float16", "float32")
MASKS = ("none", "causal", "window", "data")
KV_TILES = (512, 1024)
Q_TILES = (1, 2)
DMA_QUARTERS = (0, 2, 3, 4)
KV_BUFFERS = (1, 2)
FWD_SCALAR_EVAC = (3, 4, 5, 6)
BWD_SECTIONS = (16, 32, 64)
# heuristic fallbacks below the searched sections: fp32 at head_dim 256 keeps 20 KiB of
# operands per 4-tile unit resident (twice, the next section's loading), which overflows
# trn2's SBUF at 16 items
BWD_SMALL_SECTIONS = (8, 4)
BWD_SCALAR_EVAC = (4, 6, 8)
DRY_RUN_Q_TILES = 2  # query tiles in a forward dry run (SBUF use does not grow with Sq)
# keys per query row x DMA bytes/ns from which the forward heuristic DMA-transposes 3 of
# every 4 P^T sub-tiles (trn2: 4 K keys; trn3: 2 K)
_DQ3_KEY_BYTES = 2048 * 33


HEAD_DIM_MAX = 256  # Q^T / K^T in 128-row chunks: two contraction passes at most


@dataclass(frozen=True)
class AttentionProblem:
    """One attention shape: bucketed lengths, heads, head dim, dtype, mask kind."""

    seq_q: int
    seq_k: int
    head_dim: int
    q_heads: int = 1
    kv_heads: int = 1
    batch: int = 1
    dtype: str = "bfloat16"
    mask: str = "none"

    def __post_init__(self) -> None:
        for name in ("seq_q", "seq_k", "head_dim", "q_heads", "kv_heads", "batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int; got {v!r}")
        if self.head_dim > HEAD_DIM_MAX:
            raise ValueError(f"head_dim: expected <= {HEAD_DIM_MAX}; got {self.head_dim}")
        if self.q_heads % self.kv_heads:
            raise ValueError(
                f"q_heads: expected a multiple of kv_heads ({self.kv_heads}); got {self.q_heads}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}; got {self.dtype!r}")
        if self.mask not in MASKS:
            raise ValueError(f"mask: expected one of {MASKS}; got {self.mask!r}")

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 2


def _limits(target: Target) -> Target:
    """The target a dry run needs: its cost parameters do not change a trace, so every
    parameter set of a band shares one cached dry run (`perfmodel.band.interpreter_target`)."""
    return interpreter_target(target)


def _dry_run_error(
    kernel: Any, args: tuple[Any, ...], target: Target, extra_sbuf: int = 0
) -> str | None:
    """The interpreter's complaint about a trace-only run of `kernel`, or None.

    `extra_sbuf` (bytes per partition) accounts for buffers the reduced run sizes
    smaller than the real problem (the forward's per-query bounds tile).
    """
    from ..interp import run, settings
    from ..interp.errors import NkiValidationError

    try:
        # strict: a buffer the reduced run leaves untouched is used at full size
        with settings(free_unused_tiles=False):
            res = run(kernel, *args, target=target, trace_only=True)
    except NkiValidationError as err:
        return str(err)
    if res.peak_sbuf_bytes + extra_sbuf > target.sbuf_usable_bytes:
        return (
            f"SBUF overflow on {target.name}: peak {res.peak_sbuf_bytes} B + {extra_sbuf} B of "
            f"query bounds per partition exceeds {target.sbuf_usable_bytes} B"
        )
    return None


@functools.lru_cache(maxsize=1024)
def _fwd_dry_run(config: FlashFwdConfig, problem: AttentionProblem, target: Target) -> str | None:
    from ..interp import TensorSpec
    from .flash_fwd import flash_attention_fwd

    sq = min(problem.seq_q, DRY_RUN_Q_TILES * P * config.q_tiles)
    q = TensorSpec((1, 1, sq, problem.head_dim), problem.dtype)
    kv = TensorSpec((1, 1, problem.seq_k, problem.head_dim), problem.dtype)
    masked = problem.mask != "none"
    bounds = TensorSpec((1, P, 2, -(-sq // P)), "float32") if masked else None
    plan = _dense_plan(sq, problem.seq_k) if masked else ()
    # tiles that grow with the real query length and group size, beyond the dry run's:
    # bounds (2 fp32 per query tile) and the group's lse statistics (1 fp32 per head and
    # query tile)
    nq_real, nq_dry = -(-problem.seq_q // P), -(-sq // P)
    group = problem.q_heads // problem.kv_heads
    per_set = (8 * (nq_real - nq_dry) if masked else 0) + 4 * (group * nq_real - nq_dry)
    extra = per_set * config.kv_buffers
    cfg = config.to_dict()
    args = (q, kv, kv, bounds, 0.125, plan, *(cfg[k] for k in FWD_ARGS))
    return _dry_run_error(flash_attention_fwd, args, target, extra_sbuf=extra)


@functools.lru_cache(maxsize=1024)
def _bwd_dry_run(config: FlashBwdConfig, problem: AttentionProblem, target: Target) -> str | None:
    from ..interp import TensorSpec
    from .flash_bwd import flash_attention_bwd

    # enough work items for two sections when the real problem has more than one (the
    # next section's operands are loaded while the current one runs)
    real = -(-problem.seq_q // P) * (problem.q_heads // problem.kv_heads)
    items = config.section + 1 if real > config.section else real
    sq = min(problem.seq_q, 2 * P)
    heads = max(1, -(-items // -(-sq // P)))
    q = TensorSpec((1, heads, sq, problem.head_dim), problem.dtype)
    kv = TensorSpec((1, 1, min(problem.seq_k, 2 * 512), problem.head_dim), problem.dtype)
    lse = TensorSpec((1, heads, P, -(-sq // P)), "float32")
    cfg = config.to_dict()
    args = (q, kv, kv, q, q, lse, None, None, 0.125, (), *(cfg[k] for k in BWD_ARGS))
    return _dry_run_error(flash_attention_bwd, args, target)


def _dense_plan(sq: int, sk: int) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """A plan with every tile PARTIAL: the dry run then allocates the mask operands too."""
    nq, nk = -(-sq // P), -(-sk // P)
    return (tuple(tuple(1 for _ in range(nk)) for _ in range(nq)),)


FWD_ARGS = ("kv_tile", "q_tiles", "dma_quarters", "scalar_evac", "kv_buffers")
BWD_ARGS = ("section", "dma_quarters", "scalar_evac")


@dataclass(frozen=True)
class FlashFwdConfig(KernelConfig):
    """Forward kernel tunables (see flash_fwd.py for the loop nest and pipeline).

    kv_tile: keys per online-softmax step (512 or 1024): larger steps amortize the
      per-step statistics and the O rescale; PSUM holds two steps of scores.
    q_tiles: 128-row query tiles whose steps are interleaved (1 or 2): more independent
      work between a tile's dependent steps.
    dma_quarters: of every 4 P^T sub-tiles, how many the DMA engines transpose
      SBUF -> SBUF (0 = all on TensorE + PSUM evacuation); 2-byte dtypes (an fp32
      forward is TensorE-bound: fp32 matmuls run at 1/4 rate).
    scalar_evac: eighths of the PE-transposed sub-tiles that ScalarE copies out of PSUM
      (the rest VectorE); balances the two engines around the max / exp passes.
    kv_buffers: K/V buffer sets (1 or 2); with 2 a program's (batch, kv-head) groups
      run as one pipeline, the next group's K/V staged while the current one finishes
      (twice the resident K/V in SBUF). Neither searched nor set by the heuristic: the
      autotuner prices one group (where it changes nothing) and scales by the groups;
      the op applies `with_kv_overlap` to whichever config it runs.
    """

    op_name: ClassVar[str] = "flash_attention"

    kv_tile: int = 1024
    q_tiles: int = 2
    dma_quarters: int = 3
    scalar_evac: int = 6
    kv_buffers: int = 1

    @classmethod
    def heuristic(cls, problem: AttentionProblem, target: Target) -> FlashFwdConfig:
        kv = 1024 if problem.itemsize == 2 and problem.seq_k > 512 else 512
        qt = 2 if problem.seq_q > P or problem.q_heads > problem.kv_heads else 1
        # Of every 4 P^T sub-tiles the DMA engines take 3 when each query tile's fixed
        # DMA work (its Q^T load and 256-byte-row output store) is spread over enough
        # keys -- about 4 K keys per row at trn2's DMA rate (masks: half the keys) --
        # else 2 (the modeled optimum on trn2 / trn3 at 2 K and 8 K keys).
        dq = 0
        if problem.itemsize == 2:
            keys = problem.seq_k if problem.mask == "none" else problem.seq_k // 2
            dq = 3 if keys * target.dma_engine_bytes_per_ns >= _DQ3_KEY_BYTES else 2
        # trn2's VectorE (0.96 GHz) is the busier engine: ScalarE takes most
        # evacuations; trn3's VectorE runs at 1.2 GHz and takes half
        evac = 6 if target.vector_ghz < target.scalar_ghz else 4
        cfg = cls(kv_tile=kv, q_tiles=qt, dma_quarters=dq, scalar_evac=evac)
        if not cfg.is_valid(problem, target):
            cfg = cls(kv_tile=512, q_tiles=1, dma_quarters=dq, scalar_evac=evac)
        return cfg

    @classmethod
    def search_space(cls, problem: AttentionProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        return {
            "kv_tile": KV_TILES,
            "q_tiles": Q_TILES,
            "dma_quarters": DMA_QUARTERS if problem.itemsize == 2 else (0,),
            "scalar_evac": FWD_SCALAR_EVAC,
        }

    def validate(self, problem: AttentionProblem, target: Target) -> None:
        if self.kv_buffers not in KV_BUFFERS:
            raise InvalidConfig(f"kv_buffers: expected one of {KV_BUFFERS}; got {self.kv_buffers}")
        if self.kv_tile not in KV_TILES:
            raise InvalidConfig(f"kv_tile: expected one of {KV_TILES}; got {self.kv_tile}")
        if self.q_tiles not in Q_TILES:
            raise InvalidConfig(f"q_tiles: expected one of {Q_TILES}; got {self.q_tiles}")
        if not 0 <= self.dma_quarters <= 4:
            raise InvalidConfig(f"dma_quarters: expected 0..4; got {self.dma_quarters}")
        if not 0 <= self.scalar_evac <= 8:
            raise InvalidConfig(f"scalar_evac: expected 0..8; got {self.scalar_evac}")
        if problem.itemsize == 4 and self.kv_tile > 512:
            raise InvalidConfig(
                "kv_tile: fp32 P^T of a 1024-key step takes 4 of the 8 PSUM banks (two "
                "jobs' worth), leaving fewer than two steps of score banks; only 512 fits"
            )
        if problem.itemsize == 4 and self.dma_quarters:
            raise InvalidConfig(
                "dma_quarters: the forward DMA-transposes P for 2-byte dtypes only "
                "(an fp32 forward is TensorE-bound); got float32"
            )
        err = _fwd_dry_run(self, problem, _limits(target))
        if err is not None:
            raise InvalidConfig(f"does not fit on {target.name}: {err}")


@dataclass(frozen=True)
class FlashBwdConfig(KernelConfig):
    """Backward kernel tunables (see flash_bwd.py).

    section: (head, query tile) work items whose Q, dO, transposes and fp32 dQ stay in
      SBUF while every key block streams past them; more items amortize the K/V
      staging and the dK/dV write-back per block (and fewer partial-sum round trips).
    dma_quarters: of every 4 dS^T sub-tiles, how many the DMA engines transpose.
    scalar_evac: eighths of the PE-transposed dS^T sub-tiles ScalarE evacuates.
    """

    op_name: ClassVar[str] = "flash_attention_bwd"

    section: int = 64
    dma_quarters: int = 0
    scalar_evac: int = 8

    @classmethod
    def heuristic(cls, problem: AttentionProblem, target: Target) -> FlashBwdConfig:
        # 2-byte dtypes: the DMA engines transpose every dS^T slot, which takes 1/6 of
        # TensorE's work off the busiest engine (modeled best on trn2 / trn3 at 2 K and
        # 8 K keys, causal or not; fp32 has no DMA transposes here)
        dq = 4 if problem.itemsize == 2 else 0
        for section in sorted(BWD_SECTIONS, reverse=True) + list(BWD_SMALL_SECTIONS):
            cfg = cls(section=section, dma_quarters=dq, scalar_evac=8)
            if cfg.is_valid(problem, target):
                return cfg
        return cls(section=min(BWD_SMALL_SECTIONS), dma_quarters=dq, scalar_evac=8)

    @classmethod
    def search_space(cls, problem: AttentionProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        return {
            "section": BWD_SECTIONS,
            "dma_quarters": DMA_QUARTERS if problem.itemsize == 2 else (0,),
            "scalar_evac": BWD_SCALAR_EVAC,
        }

    def validate(self, problem: AttentionProblem, target: Target) -> None:
        if isinstance(self.section, bool) or not isinstance(self.section, int) or self.section < 1:
            raise InvalidConfig(f"section: expected a positive int; got {self.section!r}")
        if not 0 <= self.dma_quarters <= 4:
            raise InvalidConfig(f"dma_quarters: expected 0..4; got {self.dma_quarters}")
        if not 0 <= self.scalar_evac <= 8:
            raise InvalidConfig(f"scalar_evac: expected 0..8; got {self.scalar_evac}")
        if problem.itemsize == 4 and self.dma_quarters:
            raise InvalidConfig("dma_quarters: DMA transposes need a 2-byte dtype; got float32")
        err = _bwd_dry_run(self, problem, _limits(target))
        if err is not None:
            raise InvalidConfig(f"does not fit on {target.name}: {err}")


def with_kv_overlap(
    config: FlashFwdConfig, problem: AttentionProblem, target: Target
) -> FlashFwdConfig:
    """`config` with a second K/V buffer set when `problem` has more than one (batch,
    kv-head) group to overlap and the second set fits in SBUF; else `config` unchanged.

    The op applies it to the config it looked up (tuned or heuristic) before launching.
    """
    if config.kv_buffers != 1 or problem.batch * problem.kv_heads < 2:
        return config
    two = replace(config, kv_buffers=2)
    return two if two.is_valid(problem, target) else config


def max_resident_keys(config: FlashFwdConfig, problem: AttentionProblem, target: Target) -> int:
    """Longest key length (a multiple of 1024) the forward keeps resident for `problem`.

    The op splits longer key ranges into chunks of this length and merges them by
    log-sum-exp. Found by bisection over dry runs (cached per config and shape).
    """
    return _max_keys(config, problem, target)


@functools.lru_cache(maxsize=256)
def _max_keys(config: FlashFwdConfig, problem: AttentionProblem, target: Target) -> int:
    lo, hi = 1, 256  # in units of 1024 keys
    while lo < hi:
        mid = (lo + hi + 1) // 2
        trial = AttentionProblem(
            seq_q=problem.seq_q,
            seq_k=mid * 1024,
            head_dim=problem.head_dim,
            q_heads=problem.q_heads,
            kv_heads=problem.kv_heads,
            dtype=problem.dtype,
            mask=problem.mask,
        )
        if _fwd_dry_run(config, trial, _limits(target)) is None:
            lo = mid
        else:
            hi = mid - 1
    return lo * 1024


__all__ = [
    "AttentionProblem",
    "FlashBwdConfig",
    "FlashFwdConfig",
    "max_resident_keys",
    "with_kv_overlap",
]
