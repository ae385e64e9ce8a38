"""Tunables of the MoE expert kernels: frozen configs with heuristic, search space, validity.

`MoEProblem` is what a config is chosen for (bucketed token count, layer shape, dtype).
`MoEMLPConfig` drives the forward kernel (`blockwise_mlp.moe_mlp_fwd`; its field names are
that kernel's parameter names), `MoEMLPBwdConfig` the backward kernel.

`validate()` checks the on-chip fit per target with the kernel's own allocation plan
(bytes per SBUF partition, PSUM banks); the estimate is an upper bound of what the
interpreter's allocator reports for the same kernel, which tests check on real shapes.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from ..kernel_config import InvalidConfig, KernelConfig
from ..targets import Target

P = 128
GRANULE = 64  # SBUF allocation granule (bytes per partition) of the interpreter's allocator
BLOCK_SIZES = (128, 256, 512, 1024)
TILE_I = (128, 256, 512, 1024, 2048)
LOOP_ORDERS = ("h_outer", "i_outer")
DOWN_N = (256, 512)
W_BUFS = (2, 3, 4)
DMA_H = (1, 2, 4, 8)
DTYPES = ("bfloat16", "float32")
TRANSPOSE_PSUM_BANKS = 2  # transpose groups in flight (one bank each)
COMBINE_COLS = 2048
DRY_RUN_TOKENS = 256  # token count of the one-block dry run (only the combine sees it)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _tile(nbytes: int) -> int:
    return max(GRANULE, _cdiv(nbytes, GRANULE) * GRANULE)


def _banks(nbytes: int, target: Target) -> int:
    return _cdiv(nbytes, target.psum_bank_bytes)


@functools.lru_cache(maxsize=4096)
def dry_run(config: KernelConfig, problem: MoEProblem, target: Target) -> str | None:
    """Interpret one block of the config's kernel in trace-only mode on `target`.

    Returns the interpreter's error (SBUF / PSUM placement or any other rule) or None.
    This is what makes `validate` exact: the allocator that checks the plan is the one
    the kernel runs under, fragmentation included.
    """
    from ..interp import TensorSpec, run
    from ..interp.errors import NkiValidationError

    t, h, i, e, k = (
        min(problem.tokens, DRY_RUN_TOKENS),
        problem.hidden,
        problem.intermediate,
        problem.experts,
        problem.top_k,
    )
    dt = problem.dtype
    b = config.block_size  # type: ignore[attr-defined]
    meta = (
        TensorSpec((1, P, b // P), "int32"),
        TensorSpec((1, 1), "int32"),
        TensorSpec((1, 1), "int32"),
        TensorSpec((t, k), "int32"),
    )
    weights = (TensorSpec((e, h, 2 * i), dt), TensorSpec((e, i, h), dt))
    try:
        if isinstance(config, MoEMLPConfig):
            from .blockwise_mlp import moe_mlp_fwd

            kinds = TensorSpec((1, b // P + 1), "int32")  # one block of the largest size
            fmeta = (meta[0], meta[1], kinds, meta[3])
            fwd = (TensorSpec((t, h), dt), *weights, *fmeta, TensorSpec((t, k), "float32"))
            one = (1,) + (0,) * (b // P - 1)
            # the training forward (gate / up saved: its superset of tiles), one hole
            save = (TensorSpec((1, 1), "int32"), TensorSpec((3 * b // P + 1, 1), "int32"))
            values = config.to_dict().values()
            kw = {**_trace_kwargs(target), "static_holes": (1, b)}
            run(moe_mlp_fwd, *fwd, *save, one, False, *values, **kw)
        else:
            from .blockwise_mlp_bwd import moe_mlp_bwd

            slot_w = TensorSpec((1, P, b // P), "float32")
            keep = TensorSpec((1, 1), "float32")
            grads = (TensorSpec((e, h, 2 * i), dt), TensorSpec((e, i, h), dt))
            tok = (TensorSpec((t, h), dt), *weights, TensorSpec((t, h), dt), meta[0], slot_w)
            args = (*tok, meta[1], keep, *meta[2:], *grads)
            # both modes: gate / up saved by the forward (moe_mlp) and recomputed
            for saved in (TensorSpec((2 * i, 3 * b), dt), None):
                values = config.to_dict().values()
                run(moe_mlp_bwd, *args, saved, 1, False, *values, **_trace_kwargs(target))
    except NkiValidationError as err:
        return str(err)
    return None


def _trace_kwargs(target: Target) -> dict[str, Any]:
    return {"target": target, "trace_only": True}


@dataclass(frozen=True)
class MoEProblem:
    """One MoE layer shape: bucketed token count T, hidden H, intermediate I, experts E."""

    tokens: int
    hidden: int
    intermediate: int
    experts: int
    top_k: int
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        for name in ("tokens", "hidden", "intermediate", "experts", "top_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected a positive int; got {v!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {DTYPES}; got {self.dtype!r}")

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "bfloat16" else 4

    @property
    def assignments(self) -> int:
        return self.tokens * self.top_k


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _useful(values: tuple[int, ...], limit: int) -> tuple[int, ...]:
    """Candidates below `limit`, plus the smallest one at or above it (larger ones act alike)."""
    below = tuple(v for v in values if v < limit)
    above = tuple(v for v in values if v >= limit)
    return below + above[:1]


def expected_blocks(problem: MoEProblem, block: int) -> float:
    """Expected blocks of `block` slots when each of the T*k assignments picks an expert
    uniformly at random: E * E[ceil(N / B)], N ~ Binomial(T*k, 1/E) (normal
    approximation with continuity correction; exact ceil for balanced counts N = T*k/E)."""
    n, e = problem.assignments, problem.experts
    mean = n / e
    sd = math.sqrt(n * (1 / e) * (1 - 1 / e))
    if sd == 0.0:
        return float(e * _cdiv(n // e, block))
    # E[ceil(N / B)] = sum over m >= 0 of P(N > m * B)
    total, m = 0.0, 0
    while m * block <= mean + 8 * sd:
        z = (m * block + 0.5 - mean) / sd
        total += 0.5 * math.erfc(z / math.sqrt(2))
        m += 1
    return e * total


def block_order(problem: MoEProblem, target: Target) -> list[int]:
    """Block sizes (128..512), best first, from a roofline estimate of the expert phase.

    A block streams its expert's weights once (gate/up rows of 1024-column chunks, the
    last one ragged, and down rows of H columns, each DMA descriptor priced by the cost
    model, capped by the HBM bandwidth) and computes 2 * B * 3 * H * I FLOPs. Preferred:
    the largest B that is compute-bound with an expected padding of at most a quarter of
    the assignments; otherwise the B minimizing `expected_blocks(B)` * max(compute,
    weights).
    """
    from ..perfmodel.costs import descriptor_ns

    h, i, dsz = problem.hidden, problem.intermediate, problem.itemsize
    peak = target.tensor_peak_flops_per_ns / (1 if dsz == 2 else 4)

    def rate(row_bytes: int) -> float:
        per_engine = row_bytes / descriptor_ns(row_bytes, target)
        return min(target.hbm_bytes_per_ns, target.dma_engines * per_engine)

    gate_up = sum(
        2 * h * min(1024, i - i0) * dsz / rate(min(1024, i - i0) * dsz) for i0 in range(0, i, 1024)
    )
    weights = gate_up + h * i * dsz / rate(h * dsz)

    def compute(b: int) -> float:
        return 2 * b * 3 * h * i / peak

    def cost(b: int) -> float:
        return expected_blocks(problem, b) * max(compute(b), weights)

    def padding(b: int) -> float:
        return expected_blocks(problem, b) * b - problem.assignments

    sizes = (512, 256, 128)
    good = [b for b in sizes if compute(b) >= weights and padding(b) <= problem.assignments / 4]
    rest = sorted((b for b in sizes if b not in good), key=lambda b: (round(cost(b), 6), -b))
    return good + rest


@dataclass(frozen=True)
class MoEMLPConfig(KernelConfig):
    """Forward blockwise expert MLP tunables (see blockwise_mlp.py for the loop nest).

    block_size: token slots per block (one expert per block); larger blocks reuse each
      streamed weight byte on more tokens but pad each expert's last block more.
    tile_i: intermediate columns per gate/up pass; also the row width of the gate/up
      weight DMAs (tile_i * itemsize bytes per partition row).
    loop_order: "h_outer" (weights streamed by H tiles, 2*tile_i/128 PSUM accumulators)
      or "i_outer" ([H, tile_i] strips resident, 2 accumulators).
    down_n: hidden columns per down-projection PSUM tile (matmul N).
    w_bufs: gate/up weight loads in flight (prefetch depth w_bufs - 1).
    dma_h: 128-row H tiles per gate/up weight DMA (h_outer).
    """

    op_name: ClassVar[str] = "moe_mlp"

    block_size: int = 512
    tile_i: int = 512
    loop_order: str = "h_outer"
    down_n: int = 512
    w_bufs: int = 3
    dma_h: int = 8

    @classmethod
    def search_space(cls, problem: MoEProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        ht = _cdiv(problem.hidden, P)
        return {
            "block_size": _useful(BLOCK_SIZES, _pow2_at_least(problem.assignments)),
            "tile_i": _useful(TILE_I, problem.intermediate),
            "loop_order": LOOP_ORDERS,
            "down_n": _useful(DOWN_N, problem.hidden),
            "w_bufs": W_BUFS,
            "dma_h": _useful(DMA_H, ht),
        }

    @classmethod
    def heuristic(cls, problem: MoEProblem, target: Target) -> MoEMLPConfig:
        """Block size by a roofline estimate (`block_order`); then the widest gate/up weight
        rows that fit: i_outer strips of 1024 columns, else h_outer passes of up to 2048
        columns (PSUM-packed for small blocks) with deep prefetch; first valid one wins."""
        space = cls.search_space(problem, target)
        ti_max, dh_max = max(space["tile_i"]), max(space["dma_h"])
        prefs = []
        for b in block_order(problem, target):
            prefs.append(cls(b, min(1024, ti_max), "i_outer", 512, 2, 1))
            for ti in (2048, 1024, 512, 256, 128):
                for dh, wb in ((8, 3), (4, 4), (4, 3), (4, 2), (2, 2), (1, 2)):
                    prefs.append(cls(b, min(ti, ti_max), "h_outer", 512, wb, min(dh, dh_max)))
        for cand in prefs:
            if cand.is_valid(problem, target):
                return cand
        raise InvalidConfig(f"no forward MoE config fits {problem} on {target.name}")

    def usage(self, problem: MoEProblem, target: Target) -> tuple[int, int]:
        """(peak SBUF bytes per partition, peak PSUM banks) of the kernel's tile plan."""
        dsz, h, b, k = problem.itemsize, problem.hidden, self.block_size, problem.top_k
        ht, ns = _cdiv(h, P), b // P
        icw = min(self.tile_i, problem.intermediate)
        nic, nit = _cdiv(problem.intermediate, self.tile_i), _cdiv(icw, P)
        unit_h = ht if self.loop_order == "i_outer" else min(self.dma_h, ht)
        head_unit = 2 * _tile(unit_h * self.tile_i * dsz)
        # head buffers (next block's tokens, expert, rows, first unit) + this block's
        head = 2 * GRANULE + _tile(ns * h * dsz) + head_unit
        xt = _tile(ht * b * dsz)
        block = head + 2 * GRANULE + xt
        y = ns * _tile(h * (dsz if nic == 1 else 4))
        units = self._stream_peak(problem)
        main = block + y + units + _tile(nit * h * dsz) + _tile(nit * b * dsz) + _tile(b * 4)
        cols = min(h, max(512, 4096 // dsz))
        combine = 3 * GRANULE + _tile(P * 4) + 2 * k * 2 * _tile(P * dsz)
        combine += 2 * k * _tile(cols * dsz) + 2 * _tile(cols * dsz)
        sbuf = max(block, main, combine)
        n_acc = 2 * (nit if self.loop_order == "h_outer" else 2)  # i_outer: 2 live pairs
        if b >= 512:
            gate_up = n_acc * _banks(b * 4, target)
        else:  # packed 512 // B accumulators per bank (blockwise_mlp.psum_accumulators)
            per = 512 // b
            pairs = 1 if self.loop_order == "h_outer" else 2
            gate_up = pairs * _cdiv(n_acc // pairs, per)
        psum = max(TRANSPOSE_PSUM_BANKS, gate_up, 2 * _banks(self.down_n * 4, target))
        return sbuf, psum

    def _stream_peak(self, problem: MoEProblem) -> int:
        """Most bytes the non-head gate/up weight units in flight hold at once (units are
        sized to their chunk; `w_bufs` of them are live once the head is consumed)."""
        dsz, i, ti = problem.itemsize, problem.intermediate, self.tile_i
        ht = _cdiv(problem.hidden, P)
        sizes = []
        for i0 in range(0, i, ti):
            icw = min(ti, i - i0)
            hs = (
                [ht]
                if self.loop_order == "i_outer"
                else [min(self.dma_h, ht - h0) for h0 in range(0, ht, self.dma_h)]
            )
            sizes += [2 * _tile(nh * icw * dsz) for nh in hs]
        regular = sizes[1:]
        w = self.w_bufs
        return max((sum(regular[j : j + w]) for j in range(len(regular))), default=0)

    def validate(self, problem: MoEProblem, target: Target) -> None:
        if self.block_size not in BLOCK_SIZES:
            raise InvalidConfig(f"block_size: expected one of {BLOCK_SIZES}; got {self.block_size}")
        if self.tile_i not in TILE_I:
            raise InvalidConfig(f"tile_i: expected one of {TILE_I}; got {self.tile_i}")
        if self.loop_order not in LOOP_ORDERS:
            raise InvalidConfig(f"loop_order: expected one of {LOOP_ORDERS}; got {self.loop_order}")
        if self.down_n not in DOWN_N:
            raise InvalidConfig(f"down_n: expected one of {DOWN_N}; got {self.down_n}")
        if self.w_bufs not in W_BUFS:
            raise InvalidConfig(f"w_bufs: expected one of {W_BUFS}; got {self.w_bufs}")
        if self.dma_h not in DMA_H:
            raise InvalidConfig(f"dma_h: expected one of {DMA_H}; got {self.dma_h}")
        sbuf, psum = self.usage(problem, target)
        if sbuf > target.sbuf_usable_bytes:
            raise InvalidConfig(
                f"SBUF: the tile plan needs {sbuf} B per partition; {target.name} has "
                f"{target.sbuf_usable_bytes}"
            )
        if psum > target.psum_banks:
            raise InvalidConfig(
                f"PSUM: the tile plan needs {psum} banks; {target.name} has {target.psum_banks}"
            )
        err = dry_run(self, problem, target)
        if err is not None:
            raise InvalidConfig(f"dry run of one block on {target.name}: {err}")


BWD_BLOCK_SIZES = (128, 256, 512, 1024)
SUB_BLOCKS = (128, 256, 512)
BWD_TILE_I = (128, 256, 512, 1024)
WGRAD_TILES = (4, 8, 16)
WGRAD_COLS = (512, 1024, 2048)
STRIP_BUFS = (2, 3)
STORE_RUN_BYTES = 2048  # blockwise_mlp_bwd's act / dg / du store runs (bytes per row)
# heuristic phase-A plans, best first: (sub_block, tile_i, strip_bufs, prefetch_rows, w_bufs).
# Two strip sets, not three, with 8-tile DMAs: modeled (cost model v3, trn2, full traces,
# 2,048 tokens) the 64-expert shape's backward 13.9 -> 12.6 ms, Qwen3-MoE-like 16.9 -> 15.1;
# 128-token units prefetching their rows where that fits: GPT-OSS-like (bench_moe_bwd_native,
# uniform) 57.5 -> 54.0 ms
BWD_PHASE_A_PLANS = (
    (512, 256, 2, 1, 4),
    (256, 256, 2, 1, 4),
    (256, 512, 2, 1, 4),
    (256, 256, 2, 1, 3),
    (256, 256, 2, 0, 3),
    (128, 256, 2, 1, 4),
    (128, 1024, 2, 0, 3),
    (128, 512, 2, 0, 3),
    (128, 256, 2, 0, 3),
    (128, 128, 2, 0, 3),
)
PHASE_A_PSUM_BANKS = 6  # gate/up/ga accumulators; two more hold the Wg / Wu H-tile transposes


@dataclass(frozen=True)
class MoEMLPBwdConfig(KernelConfig):
    """Backward blockwise expert MLP tunables (see blockwise_mlp_bwd.py and wgrad.py).

    block_size: token slots per block (the backward plans its own blocks); the weight
      gradients are stored once per block, so larger blocks store less.
    sub_block: tokens per phase-A pass (the weights stream once per pass).
    tile_i: intermediate columns per phase-A chunk: 3 * tile_i/128 fp32 accumulators of
      [128, sub_block] stay in PSUM while H is contracted.
    dma_h: 128-row H tiles per Wd unit and per Wg / Wu strip piece (DMA size).
    w_bufs: Wd units in flight (prefetch depth w_bufs - 1).
    wgrad_tiles, wgrad_cols: weight-gradient panel, (128 * wgrad_tiles) rows x wgrad_cols
      columns of fp32 accumulators in SBUF; the token rows are re-read once per panel.
    strip_bufs: I-major Wg / Wu strip sets in the chunk pipeline (3 loads the next chunk's
      strips one chunk earlier; 2 needs less SBUF).
    prefetch_rows: 1 gathers the next sub-block's token rows (and the next block's
      metadata) while the current one computes (rows_bwd.py); 0 at its start.
    """

    op_name: ClassVar[str] = "moe_mlp_bwd"

    block_size: int = 512
    sub_block: int = 256
    tile_i: int = 512
    dma_h: int = 4
    w_bufs: int = 3
    wgrad_tiles: int = 16
    wgrad_cols: int = 2048
    strip_bufs: int = 3
    prefetch_rows: int = 1

    @classmethod
    def search_space(cls, problem: MoEProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        ht = _cdiv(problem.hidden, P)
        rows = _cdiv(max(problem.hidden, problem.intermediate), P)
        return {
            "block_size": _useful(BWD_BLOCK_SIZES, _pow2_at_least(problem.assignments)),
            "sub_block": SUB_BLOCKS,
            "tile_i": _useful(BWD_TILE_I, problem.intermediate),
            "dma_h": _useful(DMA_H, ht),
            "w_bufs": W_BUFS,
            "wgrad_tiles": _useful(WGRAD_TILES, rows),
            "wgrad_cols": _useful(WGRAD_COLS, max(problem.hidden, 2 * problem.intermediate)),
            "strip_bufs": STRIP_BUFS,
            "prefetch_rows": (0, 1),
        }

    @classmethod
    def heuristic(cls, problem: MoEProblem, target: Target) -> MoEMLPBwdConfig:
        """Block size by a roofline estimate (`bwd_block_order`); then the phase-A plans of
        `BWD_PHASE_A_PLANS` in order (long sub-blocks first: the weights and their
        transposes are paid once per sub-block), then the largest weight-gradient panel
        that fits, then 8-tile DMAs before 4-tile ones (fewer, larger weight loads: the
        phase is DMA-bound); first valid one wins."""
        space = cls.search_space(problem, target)
        ti_max = max(space["tile_i"])
        panels = ((16, 2048), (16, 1024), (8, 2048), (8, 1024), (4, 1024), (4, 512))
        dmas = [v for v in (8, 4) if v in space["dma_h"]] or [4]
        prefs = []
        for b in bwd_block_order(problem, target):
            for sb, ti, strips, pf, wb in BWD_PHASE_A_PLANS:
                if sb > b:
                    continue
                for tiles, cols in panels:
                    for dh in dmas:
                        prefs.append(cls(b, sb, min(ti, ti_max), dh, wb, tiles, cols, strips, pf))
        for cand in prefs:
            if cand.is_valid(problem, target):
                return cand
        raise InvalidConfig(f"no backward MoE config fits {problem} on {target.name}")

    def usage(
        self, problem: MoEProblem, target: Target, saved: bool | None = None
    ) -> tuple[int, int]:
        """(peak SBUF bytes per partition, peak PSUM banks) of the kernel's tile plan with
        gate / up read from the forward's save (`saved`), recomputed, or (None) the larger
        of the two (a config serves both: `moe_mlp` saves, `moe_experts` recomputes)."""
        if saved is None:
            both = [self.usage(problem, target, m) for m in (True, False)]
            return max(u[0] for u in both), max(u[1] for u in both)
        dsz, h, i = problem.itemsize, problem.hidden, problem.intermediate
        b, sb, ti = self.block_size, self.sub_block, min(self.tile_i, problem.intermediate)
        ht, ns, nsa, nti = _cdiv(h, P), b // P, sb // P, _cdiv(ti, P)
        block = 5 * GRANULE
        rows_t = (1 if saved else 2) * _tile(ht * sb * dsz)  # doT (and xT: the recompute)
        rows = 2 * _tile(nsa * h * dsz)  # gathered x, do
        strips = 2 * _tile(h * nti * dsz)  # one Wg / Wu strip set
        if saved:  # + the chunk's gT / uT of one unit
            strips += 2 * _tile(nti * sb * dsz)
        depth = min(max(1, self.w_bufs - 1), _cdiv(i, ti) * _cdiv(ht, self.dma_h))
        unit = _tile(self.dma_h * ti * dsz)  # one Wd unit
        # two metadata sets; with prefetching, also the rows, xT / doT and the head
        # buffers (first chunk's strips, first Wd units) live through phase A
        sets = 2 * (2 * _tile(ns * 4) + GRANULE)
        if dsz == 2:  # per set the column loads' row indexes (tiles.expert_row_index), + ramp
            kd, kg = _cdiv(ti, P), min(ht, self.dma_h)
            sets += 2 * (GRANULE + _tile(kd * 4) + _tile(kg * 4)) + _tile(max(kd, kg) * 4)
            sets += GRANULE  # the index's fp32 base
        if self.prefetch_rows:
            sets += rows + rows_t + strips + depth * unit
            prologue = sets + block + 2 * _tile(h * dsz)
            resident = sets + block
        else:
            prologue = sets + block + rows_t + rows + 2 * _tile(h * dsz)
            resident = sets + block + rows_t
        resident += nsa * _tile(h * 4) + _tile(sb * 4) + self.strip_bufs * strips
        fp32_tmp = 0 if dsz == 2 else _tile(self.dma_h * ti * 4)  # column loads via PE
        # Wd units, two chunks' act / dg / du (the pipeline's current and previous one),
        # one chunk's act * ga, the store group's token-major tiles; then the larger of
        # the scaled-row / dx-store rows and the pointwise temporaries + Wg / Wu H tiles
        group = max(1, min(_cdiv(i, ti), STORE_RUN_BYTES // (ti * dsz)))
        live_units = self.w_bufs - 1 if self.prefetch_rows else self.w_bufs  # + the head
        chunk = live_units * unit + 6 * _tile(nti * sb * dsz) + _tile(nti * sb * 4)
        chunk += 3 * _tile(nsa * group * ti * dsz) + fp32_tmp
        temps = 3 * _tile(sb * 4) + (0 if saved else 4 * _tile(ti * dsz))
        chunk += max(2 * _tile(h * dsz), temps) if self.prefetch_rows else temps
        phase_a = max(prologue, resident + chunk)
        lt = _tile(ns * min(self.wgrad_tiles * P, max(h, i)) * dsz)
        rt = _tile(ns * min(self.wgrad_cols, max(h, 2 * i)) * dsz)
        acc_rows = min(self.wgrad_tiles, _cdiv(max(h, i), P))
        # 512-column slots: one per PSUM tile of the panel, plus two zero slots
        slots = 2 + acc_rows * _cdiv(min(self.wgrad_cols, max(h, 2 * i)), 512)
        acc = _tile(slots * 512 * 4)
        # per buffer set (two alternate, a third takes the next panel's first block):
        # rows, expert, keep, the adds' slot indexes; + the slot ramp
        phase_b = 3 * (lt + rt + 2 * GRANULE + _tile(65 * 4)) + acc + _tile(64 * 4)
        if dsz == 2:  # two row tiles of the panel rounded for their store
            phase_b += 2 * _tile(min(self.wgrad_cols, max(h, 2 * i)) * dsz)
        combine = 2 * GRANULE + 2 * _tile(COMBINE_COLS * 4) + 3 * _tile(COMBINE_COLS * dsz)
        sbuf = max(phase_a, phase_b, combine)
        per = 1 if saved else 3  # accumulators per I tile: gaT (and gT, uT: the recompute)
        if sb >= 512:
            acc_banks = per * nti
        else:
            acc_banks = _cdiv(per * nti, 512 // sb)
        # recompute: + the Wg / Wu H-tile transposes (one tile); after the accumulators
        # die: the dgrad's two accumulators and two transpose groups
        psum = max(acc_banks + (0 if saved else _banks(2 * ti * dsz, target)), 4)
        return sbuf, max(psum, TRANSPOSE_PSUM_BANKS)

    def validate(self, problem: MoEProblem, target: Target) -> None:
        for name, allowed in (
            ("block_size", BWD_BLOCK_SIZES),
            ("sub_block", SUB_BLOCKS),
            ("tile_i", BWD_TILE_I),
            ("dma_h", DMA_H),
            ("w_bufs", W_BUFS),
            ("wgrad_tiles", WGRAD_TILES),
            ("wgrad_cols", WGRAD_COLS),
            ("strip_bufs", STRIP_BUFS),
            ("prefetch_rows", (0, 1)),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise InvalidConfig(f"{name}: expected one of {allowed}; got {value}")
        if self.sub_block > self.block_size:
            raise InvalidConfig(
                f"sub_block: expected <= block_size ({self.block_size}); got {self.sub_block}"
            )
        sbuf, psum = self.usage(problem, target)
        if sbuf > target.sbuf_usable_bytes:
            raise InvalidConfig(
                f"SBUF: the tile plan needs {sbuf} B per partition; {target.name} has "
                f"{target.sbuf_usable_bytes}"
            )
        if psum > target.psum_banks:
            raise InvalidConfig(
                f"PSUM: the tile plan needs {psum} banks; {target.name} has {target.psum_banks}"
            )
        err = dry_run(self, problem, target)
        if err is not None:
            raise InvalidConfig(f"dry run of one block on {target.name}: {err}")


def bwd_block_order(problem: MoEProblem, target: Target) -> list[int]:
    """Backward block sizes (128..512), best first, by a roofline estimate per block.

    Phase A (per sub-block of <= 256 tokens): TensorE does 5 matmul passes of SB x H x I
    plus the Wg / Wu H-tile transposes, the DMA moves the weights once (DMA transposes).
    Phase B (per block): TensorE does 3 passes of B x H x I, VectorE one fp32 update per
    128 x 512 gradient tile (each waits for its tile's matmuls, so it is added), the DMA
    stores the expert's gradient. Phase A costs its busiest resource. Blocks n(B) =
    `expected_blocks(B)` (random routing): per-block costs that do not shrink with B, the
    weight-gradient updates and stores, make fewer, larger blocks pay once an expert's
    tokens fill them.
    """
    h, i, dsz = problem.hidden, problem.intermediate, problem.itemsize
    hi = h * i
    pe_rate = P * P * target.tensor_ghz / (1 if dsz == 2 else 4)  # MACs per ns
    bw = target.hbm_bytes_per_ns
    eff = max(target.dma_transpose_hbm_efficiency, 0.05)

    def block_ns(b: int) -> float:
        sb = min(b, 256)
        subs = b // sb
        phase_a = max((5 * sb * hi + 2 * hi * P) / pe_rate, 3 * hi * dsz / (eff * bw)) * subs
        dve = 3 * hi / (P * target.vector_ghz)
        phase_b = max(3 * b * hi / pe_rate, 3 * hi * dsz / bw) + dve
        return phase_a + phase_b

    def cost(b: int) -> float:
        return expected_blocks(problem, b) * block_ns(b)

    return sorted((512, 256, 128), key=lambda b: (round(cost(b), 6), -b))
