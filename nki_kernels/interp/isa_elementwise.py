"""Element-wise instructions of VectorE / ScalarE / GpSimd.

`tensor_copy`, `memset`, `tensor_tensor`, `tensor_scalar`, `scalar_tensor_tensor`,
`tensor_reduce`, `reciprocal`. Engines compute in fp32 and round on store; bitvec
operators work on integer bit patterns.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from . import ops
from .engine import (
    alu_op,
    convert,
    emit,
    flag,
    instruction,
    is_bitvec,
    no_psum_on_gpsimd,
    not_both_psum,
    on_chip,
    op_token,
    pick_engine,
    psum_in,
    read,
    read_f32,
    reduce_axes,
    same_free,
    same_partitions,
    scalar_or_column,
    write,
)
from .enums import engine as engine_enum
from .errors import fail
from .state import current
from .tensor import NkiTensor
from .trace import Instr

_VSG = ("vector", "scalar", "gpsimd")
_VG = ("vector", "gpsimd")


_HALF = frozenset({dt.bfloat16, dt.float16})


def _all_bf16(*ts: NkiTensor) -> bool:
    for t in ts:
        if t.dtype not in _HALF:
            return False
    return True


@instruction
def tensor_copy(
    dst: NkiTensor,
    src: NkiTensor,
    engine: engine_enum = engine_enum.unknown,
    name: str | None = None,
) -> Instr | None:
    """Copy SBUF/PSUM -> SBUF/PSUM; bit-exact for equal dtypes, through fp32 otherwise."""
    instr = "tensor_copy"
    on_chip(src, "src", instr)
    on_chip(dst, "dst", instr)
    launch = current()
    eng = pick_engine(engine, "vector", _VSG, instr)
    if eng == "scalar" and launch.target.nc_version < 3:
        raise fail(
            "ENGINE", "tensor_copy cannot run on ScalarE on NC-v2; use activation(op=nl.copy)"
        )
    no_psum_on_gpsimd(eng, instr, dst=dst, src=src)
    p = same_partitions(instr, dst=dst, src=src)
    n = same_free(instr, dst=dst, src=src)
    ins = emit(
        eng,
        "tensor_copy",
        (dst,),
        (src,),
        p,
        n,
        attrs={
            "psum_in": psum_in(src),
            "psum_any": psum_in(src, dst),
            "half": _all_bf16(dst, src),
            "fast": _all_bf16(dst, src) and not psum_in(src, dst),
        },
        name=name,
    )
    if launch.trace_only:
        return ins
    write(dst, convert(read(src), src.dtype, dst.dtype).reshape(dst.shape))
    return ins


@instruction
def memset(
    dst: NkiTensor, value: Any, engine: engine_enum = engine_enum.unknown, name: str | None = None
) -> Instr | None:
    """Fill with a compile-time constant; integer tiles take an int literal or zero (NKI 0.3+)."""
    instr = "memset"
    on_chip(dst, "dst", instr)
    eng = pick_engine(engine, "vector", _VG, instr)
    no_psum_on_gpsimd(eng, instr, dst=dst)
    is_int_value = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    is_float_value = isinstance(value, (float, np.floating))
    if not (is_int_value or is_float_value):
        raise fail("MEMSET_KIND", f"memset: value must be an int or float literal; got {value!r}")
    # NKI 0.3.0 rejects a float value into an integer tile (its example: 2.0 into int32);
    # zero is accepted for every dtype (as for the x4 types), which nki-library relies on
    # (cross_partition_copy memsets 0.0 into uint32 tiles): see interpreter.md, "memset".
    if dt.is_int(dst.dtype) and not is_int_value and value != 0:
        raise fail(
            "MEMSET_KIND",
            f"memset: value {value!r} must be an int literal for {dst.dtype} dst "
            f"'{dst.name}' (write {int(value) if float(value).is_integer() else '...'})",
        )
    if dt.is_packed(dst.dtype) and value != 0:
        # nki.isa.memset: "For x4 packed types ... only value=0 is supported"
        raise fail(
            "MEMSET_X4", f"memset: {dst.dtype} dst '{dst.name}' takes only value=0; got {value!r}"
        )
    ins = emit(eng, "memset", (dst,), (), dst.shape[0], dst.free_size, name=name)
    if current().trace_only:
        return ins
    if is_int_value:  # an int literal beyond int64 saturates like any other int store
        value = min(max(int(value), -(2**63)), 2**63 - 1)
    write(dst, np.full(dst.shape, value, dtype=np.float32 if is_float_value else np.int64))
    return ins


def _binary(o: ops.Op, a: Any, b: Any, reverse: bool = False) -> np.ndarray:
    if reverse:
        a, b = b, a
    with np.errstate(all="ignore"):
        return np.asarray(o.fn(a, b))  # type: ignore[misc]


def _int_exact(*ts: NkiTensor) -> bool:
    return all(t.dtype in (dt.int32, dt.uint32) for t in ts)


def _need_int(o: ops.Op, instr: str, **operands: NkiTensor) -> None:
    for arg, t in operands.items():
        if not dt.is_int(t.dtype):
            raise fail(
                "DTYPE",
                f"{instr}: bitvec op nl.{o.name} needs integer dtypes; {arg} is {t.dtype}",
            )


@instruction
def tensor_tensor(
    dst: NkiTensor,
    data1: NkiTensor,
    data2: NkiTensor,
    op: Any,
    engine: engine_enum = engine_enum.unknown,
    name: str | None = None,
) -> Instr | None:
    """dst = data1 op data2, element-wise (no broadcasting; use stride-0 views)."""
    instr = "tensor_tensor"
    o = alu_op(op, "op", instr)
    for arg, t in (("dst", dst), ("data1", data1), ("data2", data2)):
        on_chip(t, arg, instr)
    not_both_psum(instr, data1=data1, data2=data2)
    exact = _int_exact(dst, data1, data2)
    psum_used = psum_in(dst, data1, data2)
    default = "gpsimd" if (o is ops.power or (exact and not psum_used)) else "vector"
    eng = pick_engine(engine, default, _VG, instr)
    if o is ops.power and eng != "gpsimd":
        raise fail("ENGINE", "tensor_tensor: nl.power runs on GpSimd only")
    no_psum_on_gpsimd(eng, instr, dst=dst, data1=data1, data2=data2)
    bitvec = is_bitvec(o)
    if bitvec:
        _need_int(o, instr, dst=dst, data1=data1, data2=data2)
    p = same_partitions(instr, dst=dst, data1=data1, data2=data2)
    n = same_free(instr, dst=dst, data1=data1, data2=data2)
    ins = emit(
        eng,
        "tensor_tensor",
        (dst,),
        (data1, data2),
        p,
        n,
        attrs={
            "op": o.name,
            "psum_in": psum_in(data1, data2),
            "fast": _all_bf16(dst, data1, data2),
        },
        name=name,
    )
    if current().trace_only:
        return ins
    if bitvec or (exact and eng == "gpsimd"):
        a, b = read(data1).astype(np.int64), read(data2).astype(np.int64)
    else:
        a, b = read_f32(data1), read_f32(data2)
    res = _binary(o, a.reshape(p, n), b.reshape(p, n))
    write(dst, _bits(res, dst.dtype) if bitvec else res.reshape(dst.shape))
    return ins


def _bits(res: np.ndarray, dtype: dt.NkiDtype) -> np.ndarray:
    """Bitvec results keep their low bits (wrap-around), they do not saturate."""
    if not dt.is_int(dtype) or dtype == dt.bool_:
        return res
    return np.asarray(res).astype(np.int64).astype(dtype._np)


def _scalar_operand(
    operand: Any, op: ops.Op | None, p: int, arg: str, instr: str
) -> np.ndarray | float | None:
    if op is None:
        if operand is not None:
            raise fail("ARG", f"{instr}: {arg} must be None when its op is None; got {operand!r}")
        return None
    if op.is_unary:
        if operand is not None and not (isinstance(operand, (int, float)) and operand == 0):
            raise fail(
                "ARG", f"{instr}: unary op nl.{op.name} needs {arg}=None or 0; got {operand!r}"
            )
        return None
    if operand is None:
        raise fail("ARG", f"{instr}: binary op nl.{op.name} needs {arg}")
    bitvec = is_bitvec(op)
    # tensor_scalar's docs require fp32 operand tiles; scalar_tensor_tensor's take "any
    # supported NKI data type" (cast to fp32 by VectorE)
    if (
        isinstance(operand, NkiTensor)
        and not bitvec
        and operand.dtype != dt.float32
        and instr != "scalar_tensor_tensor"
    ):
        raise fail("DTYPE", f"{instr}: arithmetic tile {arg} must be fp32; got {operand.dtype}")
    if bitvec:
        if isinstance(operand, NkiTensor):
            on_chip(operand, arg, instr)
            if operand.shape[0] != p or operand.free_size != 1:
                raise fail("FREE", f"{instr}: {arg} must be a scalar or a ({p}, 1) tile")
            if current().trace_only:
                return None
            return read(operand).astype(np.int64).reshape(p, 1)  # type: ignore[return-value]
        if not isinstance(operand, (int, np.integer)):
            raise fail("ARG", f"{instr}: bitvec {arg} must be an int; got {operand!r}")
        return np.int64(operand)  # type: ignore[return-value]
    return scalar_or_column(operand, p, arg, instr)


def _apply(op: ops.Op | None, x: np.ndarray, v: Any, reverse: bool) -> np.ndarray:
    if op is None or op is ops.bypass:
        return x
    if op.is_unary:
        with np.errstate(all="ignore"):
            return np.asarray(op.fn(x), dtype=np.float32)  # type: ignore[misc]
    return _binary(op, x, np.float32(v) if isinstance(v, float) else v, reverse)


# ScalarE on trn2 runs tensor_scalar only as multiply+add, multiply or add.
_TRN2_SCALAR_COMBOS = {("multiply", "add"), ("multiply", None), ("add", None)}


@instruction
def tensor_scalar(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: Any,
    reverse0: bool = False,
    op1: Any = None,
    operand1: Any = None,
    reverse1: bool = False,
    engine: engine_enum = engine_enum.unknown,
    name: str | None = None,
) -> Instr | None:
    """dst = (data op0 operand0) op1 operand1; operands are scalars or (P, 1) columns."""
    instr = "tensor_scalar"
    o0 = alu_op(op0, "op0", instr, unary=True)
    o1 = alu_op(op1, "op1", instr, unary=True) if op1 is not None else None
    rev0, rev1 = flag(reverse0, "reverse0", instr), flag(reverse1, "reverse1", instr)
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    bitvec = is_bitvec(o0)
    if o1 is not None and is_bitvec(o1) != bitvec:
        raise fail("OP", "tensor_scalar: op0 and op1 must both be bitvec or both arithmetic")
    launch = current()
    eng = pick_engine(engine, "vector", _VSG, instr)
    if bitvec and eng != "vector":
        raise fail("ENGINE", f"tensor_scalar with bitvec ops runs on VectorE only; got {eng}")
    no_psum_on_gpsimd(eng, instr, dst=dst, data=data)
    if eng == "scalar" and launch.target.nc_version == 3:
        combo = (o0.name, o1.name if o1 is not None else None)
        if combo not in _TRN2_SCALAR_COMBOS:
            raise fail(
                "ENGINE",
                "tensor_scalar on ScalarE (trn2) allows multiply+add, multiply or add; "
                f"got {combo}",
            )
    if bitvec:
        _need_int(o0, instr, dst=dst, data=data)
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    v0 = _scalar_operand(operand0, o0, p, "operand0", instr)
    v1 = _scalar_operand(operand1, o1, p, "operand1", instr)
    srcs = (data, *tuple(x for x in (operand0, operand1) if isinstance(x, NkiTensor)))
    ins = emit(
        eng,
        "tensor_scalar",
        (dst,),
        srcs,
        p,
        n,
        attrs={
            "op": o0.name,
            "psum_in": psum_in(data),
            "psum_any": psum_in(data, dst),
            "half": _all_bf16(dst, data),
            "fast": _all_bf16(dst, data) and not psum_in(data, dst),
        },
        name=name,
    )
    if launch.trace_only:
        return ins
    if bitvec:
        x = read(data).astype(np.int64).reshape(p, n)
    else:
        x = read_f32(data).reshape(p, n)
    y = _apply(o0, x, v0, rev0)
    y = _apply(o1, y, v1, rev1)
    write(dst, _bits(y, dst.dtype).reshape(dst.shape) if bitvec else y.reshape(dst.shape))
    return ins


@instruction
def scalar_tensor_tensor(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: Any,
    op1: Any,
    operand1: NkiTensor,
    reverse0: bool = False,
    reverse1: bool = False,
    name: str | None = None,
) -> Instr | None:
    """dst = (data op0 operand0) op1 operand1; operand0 scalar/(P,1), operand1 a full tile."""
    instr = "scalar_tensor_tensor"
    o0 = alu_op(op0, "op0", instr, bitvec=False)
    o1 = alu_op(op1, "op1", instr, bitvec=False)
    rev0, rev1 = flag(reverse0, "reverse0", instr), flag(reverse1, "reverse1", instr)
    for arg, t in (("dst", dst), ("data", data), ("operand1", operand1)):
        on_chip(t, arg, instr)
    not_both_psum(instr, data=data, operand1=operand1)
    p = same_partitions(instr, dst=dst, data=data, operand1=operand1)
    n = same_free(instr, dst=dst, data=data, operand1=operand1)
    v0 = _scalar_operand(operand0, o0, p, "operand0", instr)
    srcs = (data, operand1) + ((operand0,) if isinstance(operand0, NkiTensor) else ())
    ins = emit(
        "vector",
        instr,
        (dst,),
        srcs,
        p,
        n,
        attrs={"op": o1.name, "psum_in": psum_in(data, operand1), "fast": False},
        name=name,
    )
    if current().trace_only:
        return ins
    x = read_f32(data).reshape(p, n)
    y = _apply(o0, x, v0, rev0)
    y = _binary(o1, y, read_f32(operand1).reshape(p, n), rev1)
    write(dst, y.reshape(dst.shape))
    return ins


_REDUCE_FNS: dict[str, Any] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "max": np.maximum,
    "minimum": np.minimum,
    "min": np.minimum,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
}


def reduce_token(op: Any, arg: str, instr: str) -> ops.Op:
    """A legal reduction operator token (the "Legal Reduction op" column of the ISA)."""
    o = op_token(op, arg, instr)
    if o.name not in _REDUCE_FNS:
        raise fail("OP", f"{instr}: nl.{o.name} is not a legal reduce op")
    return o


def reduce_values(o: ops.Op, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """Reduce `x` over `axes` with the op's ufunc: fp32 for arithmetic, exact int64 for
    bitvec, 0/1 for logical ops."""
    fn = _REDUCE_FNS[o.name]
    if o.name.startswith("logical"):
        return fn.reduce(x != 0, axis=axes).astype(np.float32)  # type: ignore[no-any-return]
    if is_bitvec(o):
        return fn.reduce(x.astype(np.int64), axis=axes)  # type: ignore[no-any-return]
    return fn.reduce(x, axis=axes).astype(np.float32)  # type: ignore[no-any-return]


@instruction
def tensor_reduce(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    axis: Any,
    negate: bool = False,
    keepdims: bool = False,
    name: str | None = None,
) -> Instr | None:
    """Reduce over trailing free dims (VectorE); fp32 math; optional negation."""
    instr = "tensor_reduce"
    o = reduce_token(op, "op", instr)
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    axes = reduce_axes(axis, data.ndim, instr)
    negate = flag(negate, "negate", instr)
    flag(keepdims, "keepdims", instr)  # dst's shape already says where the results go
    bitvec = is_bitvec(o)
    if bitvec:
        _need_int(o, instr, dst=dst, data=data)
        if negate:
            raise fail("ARG", f"{instr}: negate applies to arithmetic ops only (op nl.{o.name})")
    p = same_partitions(instr, dst=dst, data=data)
    kept = int(np.prod(data.shape[1 : data.ndim - len(axes)]))
    if dst.free_size != kept:
        raise fail(
            "FREE", f"{instr}: dst holds {dst.free_size} elements per partition; expected {kept}"
        )
    ins = emit(
        "vector",
        instr,
        (dst,),
        (data,),
        p,
        data.free_size,
        attrs={"op": o.name, "psum_in": psum_in(data), "fast": _all_bf16(data)},
        name=name,
    )
    if current().trace_only:
        return ins
    x = read(data).astype(np.int64) if bitvec else read_f32(data)
    r = reduce_values(o, x, axes)
    if bitvec:
        r = _bits(r, dst.dtype)
    if negate:
        r = -r
    write(dst, r.reshape(dst.shape))
    return ins


@instruction
def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> Instr | None:
    """VectorE 1/x in fp32 (more precise than activation(op=nl.reciprocal))."""
    instr = "reciprocal"
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    ins = emit("vector", instr, (dst,), (data,), p, n, attrs={"op": "reciprocal"}, name=name)
    if current().trace_only:
        return ins
    with np.errstate(divide="ignore"):
        write(dst, (np.float32(1.0) / read_f32(data)).reshape(dst.shape))
    return ins
