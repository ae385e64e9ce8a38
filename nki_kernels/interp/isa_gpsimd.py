"""GpSimd instructions: `iota` (index generation), `affine_select` (masks from an affine
index) and `tensor_partition_reduce` (reduction across partitions).

GpSimd cannot reach PSUM, so every operand here lives in SBUF.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from . import ops
from .engine import (
    emit,
    float_arg,
    instruction,
    int_arg,
    no_psum_on_gpsimd,
    on_chip,
    op_token,
    read,
    read_f32,
    same_free,
    same_partitions,
    tensor_arg,
    write,
)
from .errors import fail
from .state import current
from .tensor import NkiTensor

COMPARE_OPS = (
    ops.equal,
    ops.not_equal,
    ops.greater,
    ops.greater_equal,
    ops.less,
    ops.less_equal,
)


def affine_pattern(pattern: Any, free_size: int, instr: str) -> list[tuple[int, int]]:
    """Validate an iota-style pattern [[step, num], ...] (1 to 4 pairs) against a tile."""
    try:
        pairs = [(step, num) for step, num in pattern]
    except (TypeError, ValueError):
        raise fail(
            "ARG", f"{instr}: pattern must be a list of [step, num] pairs; got {pattern!r}"
        ) from None
    if not 1 <= len(pairs) <= 4:
        raise fail("ARG", f"{instr}: pattern needs 1 to 4 [step, num] pairs; got {len(pairs)}")
    out = [
        (int_arg(s, "pattern step", instr), int_arg(n, "pattern num", instr, 1, 2**31 - 1))
        for s, n in pairs
    ]
    count = int(np.prod([n for _, n in out]))
    if count != free_size:
        raise fail(
            "FREE",
            f"{instr}: pattern covers {count} elements per partition but the tiles hold "
            f"{free_size}",
        )
    return out


def affine_values(pairs: list[tuple[int, int]], offset: int, multiplier: int, p: int) -> np.ndarray:
    """offset + partition * multiplier + sum(idx_d * step_d), int64, shaped (p, free)."""
    val = np.zeros([n for _, n in pairs], dtype=np.int64) + offset
    for d, (s, n) in enumerate(pairs):
        shape = [1] * len(pairs)
        shape[d] = n
        val = val + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    chan = np.arange(p, dtype=np.int64) * multiplier
    return val.reshape(1, -1) + chan.reshape(p, 1)


@instruction
def iota(
    dst: NkiTensor,
    pattern: Any,
    offset: int = 0,
    channel_multiplier: int = 0,
    name: str | None = None,
) -> Any:
    """GpSimd index generation: offset + p*channel_multiplier + sum(idx*step), int32 math."""
    instr = "iota"
    on_chip(dst, "dst", instr, sbuf_only=True)
    pairs = affine_pattern(pattern, dst.free_size, instr)
    off = int_arg(offset, "offset", instr)
    mult = int_arg(channel_multiplier, "channel_multiplier", instr)
    ins = emit("gpsimd", "iota", (dst,), (), dst.shape[0], dst.free_size, name=name)
    if current().trace_only:
        return ins
    vals = affine_values(pairs, off, mult, dst.shape[0])
    # int32 arithmetic wraps; the result is then converted to dst.dtype
    write(dst, vals.astype(np.int32).reshape(dst.shape))
    return ins


@instruction
def affine_select(
    dst: NkiTensor,
    pattern: Any,
    channel_multiplier: int,
    on_true_tile: NkiTensor,
    on_false_value: Any,
    cmp_op: Any = ops.equal,
    offset: int = 0,
    name: str | None = None,
) -> Any:
    """GpSimd: dst = on_true_tile where cmp_op(affine index, 0) else on_false_value.

    The affine index is iota's `offset + p * channel_multiplier + sum(idx_d * step_d)`.
    Equal dtypes copy bit-exactly; otherwise the value goes through fp32.
    """
    instr = "affine_select"
    o = op_token(cmp_op, "cmp_op", instr)
    if o not in COMPARE_OPS:
        raise fail(
            "OP", f"{instr}: cmp_op must be a comparison (nl.equal, nl.less, ...); got nl.{o.name}"
        )
    tensor_arg(dst, "dst", instr)
    tensor_arg(on_true_tile, "on_true_tile", instr)
    no_psum_on_gpsimd("gpsimd", instr, dst=dst, on_true_tile=on_true_tile)
    on_chip(dst, "dst", instr, sbuf_only=True)
    on_chip(on_true_tile, "on_true_tile", instr, sbuf_only=True)
    p = same_partitions(instr, dst=dst, on_true_tile=on_true_tile)
    n = same_free(instr, dst=dst, on_true_tile=on_true_tile)
    pairs = affine_pattern(pattern, n, instr)
    off = int_arg(offset, "offset", instr)
    mult = int_arg(channel_multiplier, "channel_multiplier", instr)
    fill = float_arg(on_false_value, "on_false_value", instr)
    ins = emit(
        "gpsimd",
        instr,
        (dst,),
        (on_true_tile,),
        p,
        n,
        attrs={"cmp_op": o.name, "pattern_dims": len(pairs)},
        name=name,
    )
    if current().trace_only:
        return ins
    idx = affine_values(pairs, off, mult, p)
    keep = o.fn(idx, np.int64(0)) != 0  # type: ignore[misc]
    if on_true_tile.dtype == dst.dtype:
        src = read(on_true_tile).reshape(p, n)
        out = np.where(keep, src, dt.cast(np.array(fill, dtype=np.float32), dst.dtype))
    else:
        out = np.where(keep, read_f32(on_true_tile).reshape(p, n), np.float32(fill))
    write(dst, out.reshape(dst.shape))
    return ins


_PARTITION_REDUCE = {
    "add": np.add,
    "average": np.add,
    "maximum": np.maximum,
    "max": np.maximum,
    "bitwise_or": np.bitwise_or,
    "bitwise_and": np.bitwise_and,
}


@instruction
def tensor_partition_reduce(
    dst: NkiTensor, op: Any, data: NkiTensor, name: str | None = None
) -> Any:
    """GpSimd: reduce `data` (P, ...) across its partitions into `dst` (1, ...).

    Ops: nl.add, nl.average, nl.maximum (nl.max), nl.bitwise_or, nl.bitwise_and. Floats
    are reduced in fp32; integer tiles exactly.
    """
    instr = "tensor_partition_reduce"
    o = op_token(op, "op", instr)
    if o.name not in _PARTITION_REDUCE:
        raise fail(
            "OP",
            f"{instr}: op must be nl.add, nl.average, nl.maximum, nl.bitwise_or or "
            f"nl.bitwise_and; got nl.{o.name}",
        )
    tensor_arg(dst, "dst", instr)
    tensor_arg(data, "data", instr)
    no_psum_on_gpsimd("gpsimd", instr, dst=dst, data=data)
    on_chip(dst, "dst", instr, sbuf_only=True)
    on_chip(data, "data", instr, sbuf_only=True)
    if dst.shape[0] != 1:
        raise fail("PART", f"{instr}: dst must have 1 partition; got {dst.shape[0]} ({dst.shape})")
    n = same_free(instr, dst=dst, data=data)
    is_int = dt.is_int(data.dtype)
    if o.is_bitvec and not (is_int and dt.is_int(dst.dtype)):
        raise fail(
            "DTYPE",
            f"{instr}: nl.{o.name} needs integer tiles; got data {data.dtype}, dst {dst.dtype}",
        )
    p = data.shape[0]
    ins = emit(
        "gpsimd", instr, (dst,), (data,), p, n, attrs={"op": o.name, "partitions": p}, name=name
    )
    if current().trace_only:
        return ins
    fn = _PARTITION_REDUCE[o.name]
    if is_int:
        res: np.ndarray = fn.reduce(read(data).astype(np.int64).reshape(p, n), axis=0)
        if o.name == "average":
            res = (res.astype(np.float32) / np.float32(p)).astype(np.float32)
    else:
        res = fn.reduce(read_f32(data).reshape(p, n), axis=0).astype(np.float32)
        if o.name == "average":
            res = (res / np.float32(p)).astype(np.float32)
    write(dst, res.reshape(dst.shape))
    return ins
