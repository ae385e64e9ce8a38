"""TensorE instructions: `nc_matmul` (with PSUM accumulation) and `nc_transpose`."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import (
    emit,
    instruction,
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

_MM_IN = frozenset({dt.float8_e4m3, dt.float8_e5m2, dt.bfloat16, dt.float16, dt.float32})
_TILE_SIZES = (32, 64, 128)


def _flat2(t: NkiTensor) -> np.ndarray:
    return read_f32(t).reshape(t.shape[0], -1)


def _check_dtypes(stationary: NkiTensor, moving: NkiTensor, dst: NkiTensor, transpose: bool) -> None:
    target = current().target
    allowed = set(_MM_IN)
    if target.nc_version >= 4:
        allowed.add(dt.float8_e4m3fn)
    for arg, t in (("stationary", stationary), ("moving", moving)):
        if t.dtype not in allowed:
            raise fail("DTYPE", f"nc_matmul: {arg} dtype {t.dtype.name} is not a matmul input dtype")
    s32, m32 = stationary.dtype == dt.float32, moving.dtype == dt.float32
    if s32 != m32:
        raise fail(
            "DTYPE",
            f"nc_matmul: fp32 on one side needs fp32 on the other (stationary "
            f"{stationary.dtype.name}, moving {moving.dtype.name})",
        )
    e4 = {stationary.dtype, moving.dtype}
    if dt.float8_e4m3fn in e4 and dt.float8_e4m3 in e4:
        raise fail("DTYPE", "nc_matmul: float8_e4m3fn cannot be mixed with float8_e4m3")
    if transpose:
        if dst.dtype != stationary.dtype:
            raise fail(
                "DTYPE",
                f"nc_matmul(is_transpose=True): dst dtype {dst.dtype.name} must equal the "
                f"input dtype {stationary.dtype.name}",
            )
        return
    ok = {dt.float32} | ({dt.bfloat16} if target.nc_version >= 4 else set())
    if dst.dtype not in ok:
        names = "/".join(sorted(d.name for d in ok))
        raise fail("DTYPE", f"nc_matmul: dst dtype must be {names} on {target.name}; got {dst.dtype.name}")


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
) -> Any:
    """dst[M, N] (PSUM) (+)= stationary[K, M].T @ moving[K, N]; fp32 accumulation."""
    instr = "nc_matmul"
    on_chip(stationary, "stationary", instr, sbuf_only=True)
    on_chip(moving, "moving", instr, sbuf_only=True)
    on_chip(dst, "dst", instr)
    if dst.buffer is not psum:
        raise fail("BUF", f"nc_matmul: dst must be in PSUM; got {dst.buffer!r} ('{dst.name}')")
    target = current().target
    if not isinstance(perf_mode, matmul_perf_mode):
        raise fail("ARG", f"nc_matmul: perf_mode must be an nisa.matmul_perf_mode; got {perf_mode!r}")
    double_row = perf_mode is matmul_perf_mode.double_row
    if is_transpose:
        need_version(3, "nc_matmul(is_transpose=True)")
    if double_row:
        need_version(3, "nc_matmul(perf_mode=double_row)")
        if is_transpose or tile_position:
            raise fail("ARG", "nc_matmul: double_row cannot combine with transpose or tiling")
        for arg, t in (("stationary", stationary), ("moving", moving)):
            if t.dtype not in dt.FP8_DTYPES:
                raise fail("DTYPE", f"nc_matmul(double_row): {arg} must be fp8; got {t.dtype.name}")
            if t.ndim != 3 or t.shape[1] != 2:
                raise fail("MM_SHAPE", f"nc_matmul(double_row): {arg} must be [K, 2, X]; got {t.shape}")
    if bool(tile_position) != bool(tile_size):
        raise fail("ARG", "nc_matmul: tile_position and tile_size must be given together")
    if tile_size:
        if len(tile_size) != 2 or any(s not in _TILE_SIZES for s in tile_size):
            raise fail("ARG", f"nc_matmul: tile_size {tile_size} entries must be 32, 64 or 128")
        if len(tile_position) != 2 or any(p % s for p, s in zip(tile_position, tile_size)):
            raise fail("ARG", f"nc_matmul: tile_position {tile_position} not a multiple of {tile_size}")
    k = same_partitions(instr, stationary=stationary, moving=moving)
    m = stationary.free_size // (2 if double_row else 1)
    n = moving.free_size // (2 if double_row else 1)
    k_max = tile_size[0] if tile_size else target.matmul_k_max
    if k > k_max:
        raise fail("MM_K", f"nc_matmul: contraction size K={k} exceeds {k_max}")
    m_max = tile_size[1] if tile_size else target.matmul_m_max
    if m > m_max:
        raise fail("MM_M", f"nc_matmul: stationary free size M={m} exceeds {m_max}")
    n_max = target.matmul_n_max_bf16 if dst.dtype == dt.bfloat16 else target.matmul_n_max_fp32
    if n > n_max:
        raise fail("MM_N", f"nc_matmul: moving free size N={n} exceeds {n_max} on {target.name}")
    if dst.shape[0] != m or dst.free_size != n:
        raise fail(
            "MM_SHAPE",
            f"nc_matmul: dst {dst.shape} must be [M={m}, N={n}] for stationary {stationary.shape} "
            f"and moving {moving.shape}",
        )
    _check_dtypes(stationary, moving, dst, is_transpose)
    region = dst.region()
    bank = target.psum_bank_bytes
    if region[4] // bank != (region[5] - 1) // bank:
        raise fail(
            "MM_BANK",
            f"nc_matmul: dst '{dst.name}' spans PSUM bytes {region[4]}..{region[5]}, crossing a "
            f"{bank} B bank boundary",
        )
    if accumulate is not None and not isinstance(accumulate, (bool, np.bool_)):
        raise fail("ARG", f"nc_matmul: accumulate must be None, True or False; got {accumulate!r}")
    kk = k * (2 if double_row else 1)
    emit(
        "tensor",
        "nc_matmul",
        (dst,),
        (stationary, moving),
        k,
        n,
        flops=0 if is_transpose else 2 * kk * m * n,
        attrs={
            "K": kk,
            "M": m,
            "N": n,
            "fp32": stationary.dtype == dt.float32,
            "double_row": double_row,
            "transpose": bool(is_transpose),
            "accumulate": accumulate,
        },
        name=name,
    )
    if current().trace_only:
        return None
    if double_row:
        s = read_f32(stationary).transpose(0, 1, 2).reshape(k * 2, m)
        mv = read_f32(moving).reshape(k * 2, n)
    else:
        s = _flat2(stationary)
        mv = _flat2(moving)
    if is_transpose:
        # bit-exact PE transpose: pass values through unrounded
        res = (read(stationary).reshape(k, m).T.astype(np.float32) @ mv).reshape(dst.shape)
        write(dst, res.astype(dst.dtype) if dst.dtype.kind == "f" else res)
        return None
    prod = (s.T @ mv).astype(np.float32).reshape(dst.shape)
    _accumulate_psum(dst, prod, accumulate)
    return None


def _accumulate_psum(dst: NkiTensor, prod: np.ndarray, accumulate: bool | None) -> None:
    st = dst.storage
    assert st.mm_mask is not None
    mm = np.ndarray(dst.shape, np.bool_, buffer=st.mm_mask, offset=dst.offset, strides=dst.strides)
    arr = dst.array()
    if accumulate is None:
        add = mm.copy()
    elif accumulate:
        if not mm.all():
            current().warn(
                f"acc-uninit-{st.sid}",
                f"nc_matmul(accumulate=True) into PSUM '{st.name}' that no matmul wrote: "
                "undefined on hardware",
            )
        add = np.ones(dst.shape, dtype=np.bool_)
    else:
        add = np.zeros(dst.shape, dtype=np.bool_)
    acc = np.where(add, dt.to_f32(arr), np.float32(0.0)) + prod
    arr[...] = dt.cast(acc, dst.dtype)
    mm[...] = True
    st.dirty = True


@instruction
def nc_transpose(
    dst: NkiTensor, data: NkiTensor, engine: engine_enum = engine_enum.unknown, name: str | None = None
) -> Any:
    """Swap the partition dim with the (flattened) free dims on TensorE or VectorE."""
    instr = "nc_transpose"
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    default = "tensor" if dst.buffer is psum and data.buffer is not psum else "vector"
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
            "DTYPE", f"nc_transpose: dst dtype {dst.dtype.name} must equal data dtype {data.dtype.name}"
        )
    if dst.shape[0] != f or dst.free_size != p:
        raise fail("TRANSPOSE", f"nc_transpose: dst {dst.shape} must be [{f}, {p}] for data {data.shape}")
    emit(
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
        return None
    write(dst, read(data).reshape(p, f).T.reshape(dst.shape))
    return None
