"""TensorE instructions: `nc_matmul` (with PSUM accumulation) and `nc_transpose`."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import (
    emit,
    flag,
    instruction,
    mm_view,
    need_version,
    on_chip,
    pick_engine,
    read,
    read_f32,
    same_partitions,
    write,
)
from .enums import engine as engine_enum
from .enums import matmul_perf_mode
from .errors import fail
from .state import current
from .tensor import NkiTensor, psum
from .trace import Instr

_MM_IN = frozenset({dt.float8_e4m3, dt.float8_e5m2, dt.bfloat16, dt.float16, dt.float32})
_MM_IN_V4 = _MM_IN | {dt.float8_e4m3fn}
_MM_DST = frozenset({dt.float32})
_MM_DST_V4 = frozenset({dt.float32, dt.bfloat16})


def _check_dtypes(
    stationary: NkiTensor, moving: NkiTensor, dst: NkiTensor, transpose: bool, nc_version: int
) -> None:
    sd, md = stationary.dtype, moving.dtype
    allowed = _MM_IN_V4 if nc_version >= 4 else _MM_IN
    if sd not in allowed or md not in allowed:
        arg, t = ("stationary", sd) if sd not in allowed else ("moving", md)
        raise fail("DTYPE", f"nc_matmul: {arg} dtype {t} is not a matmul input dtype")
    if (sd == dt.float32) != (md == dt.float32):
        raise fail(
            "DTYPE",
            f"nc_matmul: fp32 on one side needs fp32 on the other (stationary {sd}, moving {md})",
        )
    if sd != md and {sd, md} == {dt.float8_e4m3fn, dt.float8_e4m3}:
        raise fail("DTYPE", "nc_matmul: float8_e4m3fn cannot be mixed with float8_e4m3")
    if transpose:
        if dst.dtype != sd:
            raise fail(
                "DTYPE",
                f"nc_matmul(is_transpose=True): dst dtype {dst.dtype} must equal the "
                f"input dtype {sd}",
            )
        return
    ok = _MM_DST_V4 if nc_version >= 4 else _MM_DST
    if dst.dtype not in ok:
        names = "/".join(sorted([str(d) for d in ok]))
        raise fail(
            "DTYPE",
            f"nc_matmul: dst dtype must be {names} on NC-v{nc_version}; got {dst.dtype}",
        )


@instruction
def nc_matmul(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    accumulate: bool | None = None,
    tile_position: tuple[int, ...] = (),
    tile_size: tuple[int, ...] = (),
    perf_mode: matmul_perf_mode = matmul_perf_mode.none,
    name: str | None = None,
) -> Instr | None:
    """dst[M, N] (PSUM) (+)= stationary[K, M].T @ moving[K, N]; fp32 accumulation.

    accumulate=False overwrites, True adds, None (default) overwrites the PSUM elements
    no matmul has written since allocation and adds onto the others. is_transpose=True
    (NC-v3+) is the bit-exact PE transpose: dst = stationary.T when moving is an identity.
    """
    instr = "nc_matmul"
    on_chip(stationary, "stationary", instr, sbuf_only=True)
    on_chip(moving, "moving", instr, sbuf_only=True)
    on_chip(dst, "dst", instr)
    if dst._st.buffer is not psum:
        raise fail("BUF", f"nc_matmul: dst must be in PSUM; got {dst.buffer!r} ('{dst.name}')")
    launch = current()
    target = launch.target
    if perf_mode is not matmul_perf_mode.none and perf_mode is not matmul_perf_mode.double_row:
        raise fail(
            "ARG", f"nc_matmul: perf_mode must be an nisa.matmul_perf_mode; got {perf_mode!r}"
        )
    if accumulate is not None and not isinstance(accumulate, (bool, np.bool_)):
        raise fail("ARG", f"nc_matmul: accumulate must be None, True or False; got {accumulate!r}")
    double_row = perf_mode is matmul_perf_mode.double_row
    transpose = flag(is_transpose, "is_transpose", instr)
    # the one/zero hints let the compiler pick a faster data path; results are the same
    flag(is_stationary_onezero, "is_stationary_onezero", instr)
    flag(is_moving_onezero, "is_moving_onezero", instr)
    if bool(tile_position) != bool(tile_size):
        raise fail("ARG", "nc_matmul: tile_position and tile_size must be given together")
    tile = None
    if tile_size:
        tile = _check_tiling(tuple(tile_position), tuple(tile_size), target.nc_version)
    if double_row:
        need_version(3, "nc_matmul(perf_mode=double_row)")
        if transpose:
            raise fail("ARG", "nc_matmul: double_row cannot combine with transpose")
        # "double_row performance mode cannot be combined with Tensor Engine column
        # tiling mode" (nc_matmul ISA page; trainium2_arch): row tiling is allowed
        if tile is not None and tile[3] < 128:
            raise fail(
                "ARG",
                f"nc_matmul: double_row cannot combine with column tiling; got tile_size "
                f"{tuple(tile_size)} (column_size must be 128)",
            )
        for arg, t in (("stationary", stationary), ("moving", moving)):
            if t.dtype not in dt.FP8_DTYPES:
                raise fail("DTYPE", f"nc_matmul(double_row): {arg} must be fp8; got {t.dtype}")
            if t.ndim != 3 or t.shape[1] != 2:
                raise fail(
                    "MM_SHAPE", f"nc_matmul(double_row): {arg} must be [K, 2, X]; got {t.shape}"
                )
    exact_transpose = transpose and target.nc_version >= 3
    _check_dtypes(stationary, moving, dst, exact_transpose, target.nc_version)
    k = stationary.shape[0]
    if moving.shape[0] != k:
        same_partitions(instr, stationary=stationary, moving=moving)
    m = stationary.free_size // (2 if double_row else 1)
    n = moving.free_size // (2 if double_row else 1)
    # "The stationary tile size must not exceed the chosen tile_size" (ISA page)
    k_max = tile[2] if tile else target.matmul_k_max
    if k > k_max:
        where = f" (tile_size row_size {k_max})" if tile else ""
        raise fail("MM_K", f"nc_matmul: contraction size K={k} exceeds {k_max}{where}")
    m_max = tile[3] if tile else target.matmul_m_max
    if m > m_max:
        where = f" (tile_size column_size {m_max})" if tile else ""
        raise fail("MM_M", f"nc_matmul: stationary free size M={m} exceeds {m_max}{where}")
    bf16_dst = dst.dtype == dt.bfloat16 and not exact_transpose
    n_max = target.matmul_n_max_bf16 if bf16_dst else target.matmul_n_max_fp32
    if n > n_max:
        raise fail("MM_N", f"nc_matmul: moving free size N={n} exceeds {n_max} on {target.name}")
    if dst.shape[0] != m or dst.free_size != n:
        raise fail(
            "MM_SHAPE",
            f"nc_matmul: dst {dst.shape} must be [M={m}, N={n}] for stationary {stationary.shape} "
            f"and moving {moving.shape}",
        )
    region = dst.region()
    bank = target.psum_bank_bytes
    if target.nc_version < 4 and region[4] // bank != (region[5] - 1) // bank:
        raise fail(
            "MM_BANK",
            f"nc_matmul: dst '{dst.name}' spans PSUM bytes {region[4]}..{region[5]}, crossing a "
            f"{bank} B bank boundary",
        )
    kk = k * (2 if double_row else 1)
    attrs = {
        "K": kk,
        "M": m,
        "N": n,
        "fp32": stationary.dtype == dt.float32,
        "double_row": double_row,
        "transpose": transpose,
        "accumulate": accumulate,
    }
    if tile is not None and tile != FULL_ARRAY:
        attrs["pe_tile"] = tile  # the PE-array tile it occupies (perfmodel/pe_tiles.py)
    ins = emit(
        "tensor",
        "nc_matmul",
        (dst,),
        (stationary, moving),
        k,
        n,
        flops=0 if transpose else 2 * kk * m * n,
        attrs=attrs,
        name=name,
    )
    if launch.trace_only:
        return ins
    if exact_transpose:
        write(dst, _pe_transpose(read(stationary).reshape(k, m), read_f32(moving).reshape(k, n)))
        return ins
    # fp32 operands come back as views of SBUF; other dtypes as fresh fp32 copies
    s = read_f32(stationary).reshape(kk, m)
    mv = read_f32(moving).reshape(kk, n)
    if stationary.dtype == dt.float32:
        s = s.copy()
    if moving.dtype == dt.float32:
        mv = mv.copy()
    _accumulate_psum(dst, s, mv, accumulate, launch)
    return ins


FULL_ARRAY = (0, 0, 128, 128)  # no tiling: "equivalent to tile_position=(0, 0) and (128, 128)"


def _check_tiling(
    position: tuple[int, ...], size: tuple[int, ...], nc_version: int
) -> tuple[int, int, int, int]:
    """(start_row, start_column, row_size, column_size) of a tiling-mode matmul.

    nc_matmul ISA page: row tiling "slices the 128 PE rows into 2x 64 row tiles
    (NeuronCore-v2 or newer), or 4x 32 row tiles (NeuronCore-v3 or newer)", column tiling
    "in the same fashion"; start_row / start_column "must be a multiple of" the size
    "and must not exceed 128" (read as: the tile lies inside the array).
    """
    sizes = (32, 64, 128) if nc_version >= 3 else (64, 128)
    if len(size) != 2 or any(
        not isinstance(x, (int, np.integer)) or isinstance(x, bool) or x not in sizes for x in size
    ):
        raise fail(
            "ARG",
            f"nc_matmul: tile_size must be (row_size, column_size) with entries in {sizes} "
            f"on NC-v{nc_version}; got {size}",
        )
    if len(position) != 2 or any(
        not isinstance(p, (int, np.integer)) or isinstance(p, bool) or p < 0 or p % s or p + s > 128
        for p, s in zip(position, size)
    ):
        raise fail(
            "ARG",
            f"nc_matmul: tile_position must be (start_row, start_column), multiples of "
            f"tile_size {size} inside the 128 x 128 array; got {position}",
        )
    return int(position[0]), int(position[1]), int(size[0]), int(size[1])


def _pe_transpose(data: np.ndarray, moving: np.ndarray) -> np.ndarray:
    """dst[m, n] = data[k, m] where moving[k, n] == 1: bit-exact, NaN/Inf pass through.

    A moving operand that is not a 0/1 selection matrix (one 1 per column) is multiplied
    out in fp32 instead.
    """
    onehot = (moving == 1.0) | (moving == 0.0)
    ones = (moving == 1.0).sum(axis=0)
    if onehot.all() and (ones <= 1).all():
        rows = np.argmax(moving == 1.0, axis=0)
        out = data.T[:, rows].copy()
        out[:, ones == 0] = 0
        return out
    with np.errstate(all="ignore"):
        return dt.to_f32(data).T @ moving


class PendingMatmuls:
    """A chain of matmuls accumulating into one PSUM view that nothing has read yet.

    Their products are summed in one fp32 GEMM over the concatenated contraction dims
    when the PSUM storage is next touched (`NkiTensor.array()` flushes), instead of one
    small GEMM per instruction: the same fp32 accumulation, far fewer BLAS calls.
    """

    __slots__ = ("dst", "key", "lhs", "overwrite", "rhs")

    def __init__(self, dst: NkiTensor, overwrite: bool, s: np.ndarray, mv: np.ndarray) -> None:
        self.dst = dst
        self.key = (dst.offset, dst.shape, dst.strides)
        self.overwrite = overwrite
        self.lhs = [s]
        self.rhs = [mv]

    def flush(self) -> None:
        """Apply the chain to PSUM (the storage no longer points at this object)."""
        dst = self.dst
        dst._st.pending = None
        s = self.lhs[0] if len(self.lhs) == 1 else np.concatenate(self.lhs)
        mv = self.rhs[0] if len(self.rhs) == 1 else np.concatenate(self.rhs)
        with np.errstate(all="ignore"):
            prod = (s.T @ mv).reshape(dst.shape)
        arr = dst.array()
        if self.overwrite:
            arr[...] = prod
        else:
            arr += prod


def _accumulate_psum(
    dst: NkiTensor, s: np.ndarray, mv: np.ndarray, accumulate: bool | None, launch: Any
) -> None:
    """dst (+)= s.T @ mv with the accumulate semantics; fp32 chains are deferred.

    `s` and `mv` must be arrays the caller owns (not views of SBUF that may be rewritten
    before a deferred chain is flushed).
    """
    st = dst._st
    st.dirty = True
    mm = mm_view(dst)
    add = None
    if accumulate is None:
        add = mm.copy() if mm is not None else np.zeros(dst.shape, dtype=np.bool_)
        if add.all():
            accumulate = True
        elif not add.any():
            accumulate = False
    elif accumulate and mm is not None and not mm.all():
        # NC-v4 may accumulate onto PSUM that another instruction initialized; never
        # written PSUM still holds the NaN fill
        v4 = launch.target.nc_version >= 4
        if not v4 or np.isnan(dt.to_f32(dst.array())[~mm]).any():
            what = "that was never written" if v4 else "that no matmul wrote (NC-v2/v3)"
            launch.warn(
                f"acc-uninit-{st.sid}",
                f"nc_matmul(accumulate=True) into PSUM '{st.name}' {what}: undefined on hardware",
            )
    pending: PendingMatmuls | None = st.pending
    if accumulate is not None and dst.dtype == dt.float32 and mm is not None:
        if (
            pending is not None
            and accumulate
            and pending.key == (dst.offset, dst.shape, dst.strides)
        ):
            pending.lhs.append(s)
            pending.rhs.append(mv)
            return
        if pending is not None:
            pending.flush()
        # operands may be views of SBUF tiles that are rewritten before the flush
        st.pending = PendingMatmuls(
            dst,
            not accumulate,
            s if s.base is None else s.copy(),
            mv if mv.base is None else mv.copy(),
        )
        mm[...] = True
        return
    with np.errstate(all="ignore"):
        prod = (s.T @ mv).reshape(dst.shape)
    arr = dst.array()  # flushes a pending chain first
    if accumulate is None:
        assert add is not None
        acc = np.where(add, dt.to_f32(arr), np.float32(0.0)) + prod
        arr[...] = dt.cast(acc, dst.dtype)
    elif accumulate:
        if arr.dtype == dt.float32:
            arr += prod
        else:
            arr[...] = dt.cast(dt.to_f32(arr) + prod, dst.dtype)
    else:
        arr[...] = prod if arr.dtype == np.float32 else dt.cast(prod, dst.dtype)
    if mm is not None:
        mm[...] = True


@instruction
def nc_transpose(
    dst: NkiTensor,
    data: NkiTensor,
    engine: engine_enum = engine_enum.unknown,
    name: str | None = None,
) -> Instr | None:
    """Swap the partition dim with the (flattened) free dims on TensorE or VectorE."""
    instr = "nc_transpose"
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    default = "tensor" if dst._st.buffer is psum and data._st.buffer is not psum else "vector"
    eng = pick_engine(engine, default, ("tensor", "vector"), instr)
    p, f = data.shape[0], data.free_size
    limit = 128 if eng == "tensor" else 32
    if p > limit or f > limit:
        raise fail(
            "TRANSPOSE",
            f"nc_transpose on the {eng} engine supports up to [{limit}, {limit}]; got [{p}, {f}]",
        )
    if eng == "tensor" and (data.buffer is psum or dst.buffer is not psum):
        raise fail("BUF", "nc_transpose on the tensor engine reads SBUF and writes PSUM")
    if dst.dtype != data.dtype:
        raise fail(
            "DTYPE",
            f"nc_transpose: dst dtype {dst.dtype} must equal data dtype {data.dtype}",
        )
    if dst.shape[0] != f or dst.free_size != p:
        raise fail(
            "TRANSPOSE", f"nc_transpose: dst {dst.shape} must be [{f}, {p}] for data {data.shape}"
        )
    ins = emit(
        eng,
        "nc_transpose",
        (dst,),
        (data,),
        p,
        f,
        attrs={"fp32": data.dtype == dt.float32, "transpose": True, "K": p, "M": f, "N": p},
        name=name,
    )
    if current().trace_only:
        return ins
    write(dst, read(data).reshape(p, f).T.reshape(dst.shape))
    return ins
