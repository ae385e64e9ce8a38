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
W_BUFS = (2, 3)
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

            fwd = (TensorSpec((t, h), dt), *weights, *meta, TensorSpec((t, k), "float32"))
            run(moe_mlp_fwd, *fwd, 1, False, *config.to_dict().values(), **_trace_kwargs(target))
        else:
            from .blockwise_mlp_bwd import moe_mlp_bwd

            slot_w = (TensorSpec((1, P, b // P), "float32"), TensorSpec((1, b), "float32"))
            grads = (TensorSpec((e, h, 2 * i), "float32"), TensorSpec((e, i, h), "float32"))
            tok = (TensorSpec((t, h), dt), *weights, TensorSpec((t, h), dt), meta[0], *slot_w)
            args = (*tok, *meta[1:], *grads)
            run(moe_mlp_bwd, *args, 1, False, *config.to_dict().values(), **_trace_kwargs(target))
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


def block_order(problem: MoEProblem, target: Target) -> list[int]:
    """Block sizes (128..512), best first, from a roofline estimate of the expert phase.

    A block streams its expert's weights once (gate/up rows of min(I, 1024) columns and
    down rows of H columns, each DMA descriptor priced by the cost model, capped by the HBM
    bandwidth) and computes 2 * B * 3 * H * I FLOPs. Preferred: the largest B that is
    compute-bound with an expected padding (E * B / 2 slots) of at most a quarter of the
    assignments; otherwise the B minimizing n(B) * max(compute, weights) with expected
    blocks n(B) = T*k / B + E / 2.
    """
    from ..perfmodel.costs import descriptor_ns

    h, i, dsz = problem.hidden, problem.intermediate, problem.itemsize
    peak = target.tensor_peak_flops_per_ns / (1 if dsz == 2 else 4)

    def rate(row_bytes: int) -> float:
        per_engine = row_bytes / descriptor_ns(row_bytes, target)
        return min(target.hbm_bytes_per_ns, target.dma_engines * per_engine)

    weights = 2 * h * i * dsz / rate(min(i, 1024) * dsz) + h * i * dsz / rate(h * dsz)

    def compute(b: int) -> float:
        return 2 * b * 3 * h * i / peak

    def cost(b: int) -> float:
        n = problem.assignments / b + problem.experts / 2
        return n * max(compute(b), weights)

    sizes = (512, 256, 128)
    good = [
        b
        for b in sizes
        if compute(b) >= weights and problem.experts * b / 2 <= problem.assignments / 4
    ]
    rest = sorted((b for b in sizes if b not in good), key=cost)
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
                for dh, wb in ((8, 3), (4, 3), (4, 2), (2, 2), (1, 2)):
                    prefs.append(cls(b, min(ti, ti_max), "h_outer", 512, wb, min(dh, dh_max)))
        for cand in prefs:
            if cand.is_valid(problem, target):
                return cand
        raise InvalidConfig(f"no forward MoE config fits {problem} on {target.name}")

    def usage(self, problem: MoEProblem, target: Target) -> tuple[int, int]:
        """(peak SBUF bytes per partition, peak PSUM banks) of the kernel's tile plan."""
        dsz, h, b = problem.itemsize, problem.hidden, self.block_size
        ht, ns = _cdiv(h, P), b // P
        icw = min(self.tile_i, problem.intermediate)
        nic, nit = _cdiv(problem.intermediate, self.tile_i), _cdiv(icw, P)
        meta = 3 * GRANULE
        xt = _tile(ht * b * dsz)
        prologue = meta + xt + ns * _tile(h * dsz)
        y = ns * _tile(h * (dsz if nic == 1 else 4))
        unit_h = ht if self.loop_order == "i_outer" else min(self.dma_h, ht)
        units = self.w_bufs * 2 * _tile(unit_h * self.tile_i * dsz)
        main = meta + xt + y + _tile(nit * h * dsz) + _tile(nit * b * dsz) + 2 * _tile(b * 4)
        combine = 2 * GRANULE + _tile(COMBINE_COLS * 4) + 3 * _tile(COMBINE_COLS * dsz)
        sbuf = max(prologue, main + units, combine)
        n_acc = 2 * (nit if self.loop_order == "h_outer" else 2)  # i_outer: 2 live pairs
        if b >= 512:
            gate_up = n_acc * _banks(b * 4, target)
        else:  # packed 512 // B accumulators per bank (blockwise_mlp.psum_accumulators)
            per = 512 // b
            pairs = 1 if self.loop_order == "h_outer" else 2
            gate_up = pairs * _cdiv(n_acc // pairs, per)
        psum = max(TRANSPOSE_PSUM_BANKS, gate_up, 2 * _banks(self.down_n * 4, target))
        return sbuf, psum

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


BWD_BLOCK_SIZES = (128, 256, 512)
BWD_TILE_I = (128, 256)
RMW_COLS = 2048  # blockwise_mlp_bwd.RMW_COLS
WGRAD_H = 4  # blockwise_mlp_bwd.WGRAD_H


@dataclass(frozen=True)
class MoEMLPBwdConfig(KernelConfig):
    """Backward blockwise expert MLP tunables (see blockwise_mlp_bwd.py).

    block_size: token slots per block (the backward plans its own blocks).
    tile_i: intermediate columns per chunk; each chunk holds its Wg / Wu / Wd slices and
      their PE transposes on chip.
    """

    op_name: ClassVar[str] = "moe_mlp_bwd"

    block_size: int = 256
    tile_i: int = 128

    @classmethod
    def search_space(cls, problem: MoEProblem, target: Target) -> dict[str, tuple[Any, ...]]:
        return {
            "block_size": _useful(BWD_BLOCK_SIZES, _pow2_at_least(problem.assignments)),
            "tile_i": _useful(BWD_TILE_I, problem.intermediate),
        }

    @classmethod
    def heuristic(cls, problem: MoEProblem, target: Target) -> MoEMLPBwdConfig:
        """Largest block with little expected padding, then the widest chunk that fits."""
        blocks = [b for b in (512, 256) if problem.experts * b / 2 <= problem.assignments / 4]
        for b in [*blocks, 128]:
            for ti in (256, 128):
                cand = cls(b, ti)
                if cand.is_valid(problem, target):
                    return cand
        raise InvalidConfig(f"no backward MoE config fits {problem} on {target.name}")

    def usage(self, problem: MoEProblem, target: Target) -> tuple[int, int]:
        """(peak SBUF bytes per partition, peak PSUM banks) of the kernel's tile plan."""
        dsz, h, b, ti = problem.itemsize, problem.hidden, self.block_size, self.tile_i
        ht, ns = _cdiv(h, P), b // P
        nit = _cdiv(min(ti, problem.intermediate), P)
        small = 6 * GRANULE + _tile(b * 4)
        rows, cols_t = _tile(h * dsz), _tile(ht * b * dsz)
        prologue = small + 3 * ns * rows + 2 * cols_t
        block = small + 2 * ns * rows + 2 * cols_t + ns * _tile(h * 4)
        w_h, w_i = _tile(ht * ti * dsz), _tile(nit * h * dsz)
        act_i = _tile(nit * b * dsz)
        pointwise = 3 * w_h + 3 * act_i + 4 * _tile(b * 4)
        transposes = max(w_h + w_i, w_h + w_i + w_h) + 3 * act_i  # WdT | Wg, Wu -> WgT, WuT
        pointwise = max(pointwise, transposes, 2 * w_i + w_h + 2 * act_i)
        wgrad = 2 * w_i + 2 * act_i + 3 * _tile(ns * ti * dsz)
        wgrad += 2 * max(_tile(RMW_COLS * 4), _tile(WGRAD_H * ti * 4))
        sbuf = max(prologue, block + max(pointwise, wgrad))
        dws = _banks(b * 4, target)
        psum = dws + max(TRANSPOSE_PSUM_BANKS, 3 * _banks(b * 4, target))
        return sbuf, psum

    def validate(self, problem: MoEProblem, target: Target) -> None:
        if self.block_size not in BWD_BLOCK_SIZES:
            raise InvalidConfig(
                f"block_size: expected one of {BWD_BLOCK_SIZES}; got {self.block_size}"
            )
        if self.tile_i not in BWD_TILE_I:
            raise InvalidConfig(f"tile_i: expected one of {BWD_TILE_I}; got {self.tile_i}")
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
