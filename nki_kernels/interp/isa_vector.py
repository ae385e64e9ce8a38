"""VectorE instructions: statistics (`bn_stats`, `bn_aggr`), the top-k family (`max8`,
`nc_find_index8`, `nc_match_replace8`), `tensor_tensor_scan` and
`tensor_copy_predicated`.

Values are compared and computed in fp32 and rounded to the destination dtype on store.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from . import ops
from .engine import (
    emit,
    flag,
    float_arg,
    instruction,
    not_both_psum,
    on_chip,
    op_token,
    psum_in,
    read,
    read_f32,
    same_free,
    same_partitions,
    scalar_or_column,
    write,
)
from .errors import fail
from .state import current
from .tensor import NkiTensor

BN_STATS_FMAX = 512  # nl.tile_size.bn_stats_fmax on every NeuronCore version
TOPK_MIN, TOPK_MAX = 8, 16384
_INDEX_DTYPES = (dt.uint16, dt.uint32)


# ---- statistics ---------------------------------------------------------------------
def _moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-row count, mean and sum of squared deviations (M2) of a (P, k) fp32 array."""
    p, k = x.shape
    count = np.full(p, k, dtype=np.float32)
    if k == 0:
        zero = np.zeros(p, dtype=np.float32)
        return count, zero, zero
    mean = x.mean(axis=1, dtype=np.float32)
    m2 = np.square(x - mean[:, None]).sum(axis=1, dtype=np.float32)
    return count, mean, m2


@instruction
def bn_stats(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> Any:
    """Per partition: (count, mean, var*count) of the even-indexed then the odd-indexed
    elements of `data` (at most 512 per partition): 6 values in `dst`."""
    instr = "bn_stats"
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = data.free_size
    if n > BN_STATS_FMAX:
        raise fail(
            "BN_SIZE",
            f"{instr}: data holds {n} elements per partition; the limit is {BN_STATS_FMAX} "
            "(nl.tile_size.bn_stats_fmax): chunk the free dim and aggregate with bn_aggr",
        )
    if dst.free_size != 6:
        raise fail(
            "BN_SIZE", f"{instr}: dst must hold 6 elements per partition; got {dst.free_size}"
        )
    ins = emit("vector", instr, (dst,), (data,), p, n, attrs={"psum_in": psum_in(data)}, name=name)
    if current().trace_only:
        return ins
    x = read_f32(data).reshape(p, n)
    out = np.stack(_moments(x[:, 0::2]) + _moments(x[:, 1::2]), axis=1)
    write(dst, out.reshape(dst.shape))
    return ins


@instruction
def bn_aggr(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> Any:
    """Combine (count, mean, var*count) triples per partition into (mean, variance)."""
    instr = "bn_aggr"
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = data.free_size
    if n % 3:
        raise fail(
            "BN_SIZE",
            f"{instr}: data holds {n} elements per partition; expected a multiple of 3 "
            "(concatenated bn_stats outputs)",
        )
    if dst.free_size != 2:
        raise fail(
            "BN_SIZE", f"{instr}: dst must hold 2 elements per partition; got {dst.free_size}"
        )
    ins = emit("vector", instr, (dst,), (data,), p, n, attrs={"psum_in": psum_in(data)}, name=name)
    if current().trace_only:
        return ins
    s = read_f32(data).reshape(p, n // 3, 3)
    count, mean, m2 = s[..., 0], s[..., 1], s[..., 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        total = count.sum(axis=1, dtype=np.float32)
        mu = (count * mean).sum(axis=1, dtype=np.float32) / total
        dev = (count * np.square(mean - mu[:, None])).sum(axis=1, dtype=np.float32)
        var = (m2.sum(axis=1, dtype=np.float32) + dev) / total
    write(dst, np.stack([mu, var], axis=1).astype(np.float32).reshape(dst.shape))
    return ins


# ---- top-k family -----------------------------------------------------------------
def _topk_source(t: NkiTensor, arg: str, instr: str) -> int:
    on_chip(t, arg, instr)
    if t.ndim > 3:
        raise fail("ARG", f"{instr}: {arg} may have up to 3 dims; got shape {t.shape}")
    n = t.free_size
    if not TOPK_MIN <= n <= TOPK_MAX:
        raise fail(
            "TOPK_SIZE",
            f"{instr}: {arg} holds {n} elements per partition; must be {TOPK_MIN}..{TOPK_MAX}",
        )
    return n


def _eight(t: NkiTensor, arg: str, instr: str) -> None:
    on_chip(t, arg, instr)
    if t.free_size != 8:
        raise fail("TOPK_SIZE", f"{instr}: {arg} must hold 8 elements per partition; got {t.shape}")


@instruction
def max8(dst: NkiTensor, src: NkiTensor, name: str | None = None) -> Any:
    """The 8 largest values of each partition of `src`, in descending order."""
    instr = "max8"
    n = _topk_source(src, "src", instr)
    _eight(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, src=src)
    ins = emit("vector", instr, (dst,), (src,), p, n, attrs={"psum_in": psum_in(src)}, name=name)
    if current().trace_only:
        return ins
    x = read_f32(src).reshape(p, n)
    top = -np.sort(-x, axis=1)[:, :8]
    write(dst, top.reshape(dst.shape))
    return ins


def _match(x: np.ndarray, vals: np.ndarray, order: range) -> tuple[np.ndarray, np.ndarray]:
    """Pair each of the 8 values with an unclaimed position holding it, visiting the
    values in `order`: (positions (P, 8), -1 where not found; claimed mask (P, n))."""
    p = x.shape[0]
    rows = np.arange(p)
    claimed = np.zeros(x.shape, dtype=bool)
    pos = np.full((p, 8), -1, dtype=np.int64)
    for i in order:
        hit = (x == vals[:, i : i + 1]) & ~claimed
        found = hit.any(axis=1)
        first = hit.argmax(axis=1)
        pos[found, i] = first[found]
        claimed[rows[found], first[found]] = True
    return pos, claimed


def _index_dtype(t: NkiTensor, arg: str, instr: str) -> None:
    if t.dtype not in _INDEX_DTYPES:
        raise fail("DTYPE", f"{instr}: {arg} must be uint16 or uint32; got {t.dtype}")


def _indices(pos: np.ndarray, dtype: dt.NkiDtype) -> np.ndarray:
    sentinel = np.iinfo(dtype._np).max  # all-ones: value not found
    return np.where(pos < 0, sentinel, pos).astype(dtype._np)


@instruction
def nc_find_index8(
    dst: NkiTensor, data: NkiTensor, vals: NkiTensor, name: str | None = None
) -> Any:
    """Index of the first occurrence of each of the 8 `vals` in each partition of `data`.

    Duplicated values take successive occurrences (ascending); a value that is absent
    gives the all-ones sentinel of dst's dtype (uint16 or uint32).
    """
    instr = "nc_find_index8"
    n = _topk_source(data, "data", instr)
    _eight(vals, "vals", instr)
    _eight(dst, "dst", instr)
    _index_dtype(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, data=data, vals=vals)
    ins = emit(
        "vector", instr, (dst,), (data, vals), p, n, attrs={"psum_in": psum_in(data)}, name=name
    )
    if current().trace_only:
        return ins
    pos, _ = _match(read_f32(data).reshape(p, n), read_f32(vals).reshape(p, 8), range(8))
    write(dst, _indices(pos, dst.dtype).reshape(dst.shape))
    return ins


@instruction
def nc_match_replace8(
    dst: NkiTensor,
    data: NkiTensor,
    vals: NkiTensor,
    imm: float,
    dst_idx: NkiTensor | None = None,
    name: str | None = None,
) -> Any:
    """dst = data with the first occurrence of each of the 8 `vals` replaced by `imm`.

    Values are visited in reverse order (7 .. 0), so duplicated values pair with
    successive occurrences in descending slot order; `dst_idx` receives the positions
    (all-ones where a value is absent).
    """
    instr = "nc_match_replace8"
    n = _topk_source(data, "data", instr)
    on_chip(dst, "dst", instr)
    _eight(vals, "vals", instr)
    fill = float_arg(imm, "imm", instr)
    p = same_partitions(instr, dst=dst, data=data, vals=vals)
    same_free(instr, dst=dst, data=data)
    dsts: tuple[NkiTensor, ...] = (dst,)
    if dst_idx is not None:
        _eight(dst_idx, "dst_idx", instr)
        _index_dtype(dst_idx, "dst_idx", instr)
        same_partitions(instr, dst=dst, dst_idx=dst_idx)
        dsts = (dst, dst_idx)
    ins = emit(
        "vector", instr, dsts, (data, vals), p, n, attrs={"psum_in": psum_in(data)}, name=name
    )
    if current().trace_only:
        return ins
    x = read_f32(data).reshape(p, n)
    pos, claimed = _match(x, read_f32(vals).reshape(p, 8), range(7, -1, -1))
    write(dst, np.where(claimed, np.float32(fill), x).reshape(dst.shape))
    if dst_idx is not None:
        write(dst_idx, _indices(pos, dst_idx.dtype).reshape(dst_idx.shape))
    return ins


# ---- scan and predicated copy -------------------------------------------------------
def _arith(op: Any, arg: str, instr: str) -> ops.Op:
    o = op_token(op, arg, instr)
    if o.kind != "binary":
        raise fail("OP", f"{instr}: {arg} must be a binary arithmetic op; got nl.{o.name}")
    if o.version > current().target.nc_version:
        raise fail("VERSION", f"{instr}: nl.{o.name} needs NC-v{o.version}+")
    return o


@instruction
def tensor_tensor_scan(
    dst: NkiTensor,
    data0: NkiTensor,
    data1: NkiTensor,
    initial: Any,
    op0: Any,
    op1: Any,
    reverse0: bool = False,
    reverse1: bool = False,
    name: str | None = None,
) -> Any:
    """Scan along the free elements: r[i] = op1(op0(data0[i], r[i-1]), data1[i]).

    `reverse0` swaps op0's operands (r[i-1] on the left), `reverse1` swaps op1's
    (data1 on the left); r[-1] is `initial` (a number or a (P, 1) tile). The running
    value is kept in fp32.
    """
    instr = "tensor_tensor_scan"
    o0, o1 = _arith(op0, "op0", instr), _arith(op1, "op1", instr)
    reverse0, reverse1 = flag(reverse0, "reverse0", instr), flag(reverse1, "reverse1", instr)
    for arg, t in (("dst", dst), ("data0", data0), ("data1", data1)):
        on_chip(t, arg, instr)
    not_both_psum(instr, data0=data0, data1=data1)
    p = same_partitions(instr, dst=dst, data0=data0, data1=data1)
    n = same_free(instr, dst=dst, data0=data0, data1=data1)
    init = scalar_or_column(initial, p, "initial", instr)
    srcs = (data0, data1) + ((initial,) if isinstance(initial, NkiTensor) else ())
    ins = emit(
        "vector",
        instr,
        (dst,),
        srcs,
        p,
        n,
        attrs={"op0": o0.name, "op1": o1.name, "psum_in": psum_in(data0, data1)},
        name=name,
    )
    if current().trace_only:
        return ins
    a = read_f32(data0).reshape(p, n)
    b = read_f32(data1).reshape(p, n)
    r = np.broadcast_to(np.asarray(init, dtype=np.float32).reshape(-1), (p,)).copy()
    out = np.empty((p, n), dtype=np.float32)
    f0, f1 = o0.fn, o1.fn
    assert f0 is not None and f1 is not None
    with np.errstate(all="ignore"):
        for i in range(n):
            v = f0(r, a[:, i]) if reverse0 else f0(a[:, i], r)
            r = np.asarray(f1(b[:, i], v) if reverse1 else f1(v, b[:, i]), dtype=np.float32)
            out[:, i] = r
    write(dst, out.reshape(dst.shape))
    return ins


_PREDICATE_DTYPES = (dt.uint8, dt.uint16, dt.uint32)


@instruction
def tensor_copy_predicated(
    dst: NkiTensor,
    src: Any,
    predicate: NkiTensor,
    reverse_pred: bool = False,
    name: str | None = None,
) -> Any:
    """VectorE: dst = src where predicate != 0 (== 0 with reverse_pred); elsewhere dst
    keeps its contents. `src` is a tile of dst's dtype or a number."""
    instr = "tensor_copy_predicated"
    reverse_pred = flag(reverse_pred, "reverse_pred", instr)
    on_chip(dst, "dst", instr)
    on_chip(predicate, "predicate", instr)
    if predicate.dtype not in _PREDICATE_DTYPES:
        raise fail(
            "DTYPE",
            f"{instr}: predicate must be uint8, uint16 or uint32; got {predicate.dtype}",
        )
    srcs: tuple[NkiTensor, ...] = (predicate,)
    if isinstance(src, NkiTensor):
        on_chip(src, "src", instr)
        not_both_psum(instr, src=src, predicate=predicate)
        if src.dtype != dst.dtype:
            raise fail(
                "DTYPE",
                f"{instr}: src dtype {src.dtype} must equal dst dtype {dst.dtype}",
            )
        p = same_partitions(instr, dst=dst, src=src, predicate=predicate)
        n = same_free(instr, dst=dst, src=src, predicate=predicate)
        srcs = (src, predicate)
    else:
        value = float_arg(src, "src", instr)
        p = same_partitions(instr, dst=dst, predicate=predicate)
        n = same_free(instr, dst=dst, predicate=predicate)
    ins = emit(
        "vector",
        instr,
        (dst,),
        srcs,
        p,
        n,
        attrs={"psum_in": psum_in(*srcs), "scalar_src": not isinstance(src, NkiTensor)},
        name=name,
    )
    if current().trace_only:
        return ins
    take = read(predicate).reshape(dst.shape) != 0
    if reverse_pred:
        take = ~take
    if isinstance(src, NkiTensor):
        vals = read(src).reshape(dst.shape)
    elif dt.is_int(dst.dtype) and isinstance(src, (int, np.integer)):
        vals = np.full(dst.shape, int(src), dtype=np.int64)
    else:
        vals = np.full(dst.shape, value, dtype=np.float32)
    write(dst, vals, mask=take)
    return ins
