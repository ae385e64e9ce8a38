"""Element-wise instructions of VectorE / ScalarE / GpSimd.

`tensor_copy`, `memset`, `iota`, `activation` (with the ScalarE accumulator registers),
`tensor_tensor`, `tensor_scalar`, `scalar_tensor_tensor`, `tensor_reduce`, `reciprocal`.
Engines compute in fp32 and round on store.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from . import ops
from .engine import (
    emit,
    instruction,
    no_psum_on_gpsimd,
    on_chip,
    pick_engine,
    read,
    read_f32,
    same_free,
    same_partitions,
    scalar_or_column,
    write,
)
from .enums import engine as engine_enum
from .enums import reduce_cmd as reduce_cmd_enum
from .errors import fail
from .state import current
from .tensor import NkiTensor, psum

_VSG = ("vector", "scalar", "gpsimd")
_VG = ("vector", "gpsimd")


def _all_bf16(*ts: NkiTensor) -> bool:
    return all(t.dtype in (dt.bfloat16, dt.float16) for t in ts)


def _psum_in(*ts: NkiTensor) -> bool:
    return any(t.buffer is psum for t in ts)


def _lanes(t: NkiTensor) -> slice:
    """Accumulator lanes an on-chip operand uses: its physical partitions."""
    region = t.region()
    return slice(region[2], region[2] + t.shape[0])


@instruction
def tensor_copy(
    dst: NkiTensor, src: NkiTensor, engine: engine_enum = engine_enum.unknown, name: str | None = None
) -> Any:
    """Copy SBUF/PSUM -> SBUF/PSUM; bit-exact for equal dtypes, through fp32 otherwise."""
    instr = "tensor_copy"
    on_chip(src, "src", instr)
    on_chip(dst, "dst", instr)
    eng = pick_engine(engine, "vector", _VSG, instr)
    no_psum_on_gpsimd(eng, instr, dst=dst, src=src)
    p = same_partitions(instr, dst=dst, src=src)
    n = same_free(instr, dst=dst, src=src)
    emit(
        eng,
        "tensor_copy",
        (dst,),
        (src,),
        p,
        n,
        attrs={"psum_in": _psum_in(src), "fast": _all_bf16(dst, src) and not _psum_in(src, dst)},
        name=name,
    )
    if current().trace_only:
        return None
    vals = read(src)
    if src.dtype != dst.dtype and dt.is_float(src.dtype):
        vals = dt.to_f32(vals)
    write(dst, vals.reshape(dst.shape))
    return None


@instruction
def memset(
    dst: NkiTensor, value: Any, engine: engine_enum = engine_enum.unknown, name: str | None = None
) -> Any:
    """Fill with a compile-time constant whose kind matches the dtype (int for int tiles)."""
    instr = "memset"
    on_chip(dst, "dst", instr)
    eng = pick_engine(engine, "vector", _VSG, instr)
    no_psum_on_gpsimd(eng, instr, dst=dst)
    is_int_value = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    is_float_value = isinstance(value, (float, np.floating))
    if dt.is_int(dst.dtype) and not is_int_value:
        raise fail(
            "MEMSET_KIND",
            f"memset: value {value!r} must be an int literal for {dst.dtype.name} dst '{dst.name}'",
        )
    if dt.is_float(dst.dtype) and not is_float_value:
        raise fail(
            "MEMSET_KIND",
            f"memset: value {value!r} must be a float literal for {dst.dtype.name} dst "
            f"'{dst.name}' (write {float(value) if is_int_value else value!r})",
        )
    emit(eng, "memset", (dst,), (), dst.shape[0], dst.free_size, name=name)
    if current().trace_only:
        return None
    write(dst, np.full(dst.shape, value, dtype=np.float64 if is_float_value else np.int64))
    return None


def _affine(pattern: Any, offset: int, channel_multiplier: int, t: NkiTensor, instr: str) -> np.ndarray:
    """offset + p * channel_multiplier + sum(idx_d * step_d), int64, shaped like `t`."""
    pairs = [(int(s), int(n)) for s, n in pattern]
    if not 1 <= len(pairs) <= 4:
        raise fail("ARG", f"{instr}: pattern needs 1 to 4 [step, num] pairs; got {len(pairs)}")
    count = int(np.prod([n for _, n in pairs]))
    if count != t.free_size:
        raise fail(
            "FREE",
            f"{instr}: pattern covers {count} elements per partition but dst holds {t.free_size}",
        )
    val = np.zeros([n for _, n in pairs], dtype=np.int64) + offset
    for d, (s, n) in enumerate(pairs):
        shape = [1] * len(pairs)
        shape[d] = n
        val = val + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    p = t.shape[0]
    out = val.reshape(1, -1) + (np.arange(p, dtype=np.int64) * channel_multiplier).reshape(p, 1)
    return out.reshape(t.shape)


@instruction
def iota(
    dst: NkiTensor,
    pattern: Any,
    offset: int = 0,
    channel_multiplier: int = 0,
    name: str | None = None,
) -> Any:
    """Affine index generation on GpSimd: offset + p*channel_multiplier + sum(idx*step)."""
    instr = "iota"
    on_chip(dst, "dst", instr, sbuf_only=True)
    if current().trace_only:
        count = int(np.prod([int(n) for _, n in pattern]))
        if count != dst.free_size:
            raise fail("FREE", f"{instr}: pattern covers {count} elements but dst holds {dst.free_size}")
        emit("gpsimd", "iota", (dst,), (), dst.shape[0], dst.free_size, name=name)
        return None
    vals = _affine(pattern, int(offset), int(channel_multiplier), dst, instr)
    emit("gpsimd", "iota", (dst,), (), dst.shape[0], dst.free_size, name=name)
    write(dst, vals.astype(np.int32))
    return None


def _update_acc(acc: np.ndarray, lanes: slice, cmd: reduce_cmd_enum, row: np.ndarray | None) -> None:
    if cmd in (reduce_cmd_enum.reset, reduce_cmd_enum.reset_reduce):
        acc[lanes] = 0.0
    if cmd in (reduce_cmd_enum.reduce, reduce_cmd_enum.reset_reduce) and row is not None:
        acc[lanes] = (acc[lanes] + row).astype(np.float32)


@instruction
def activation(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    bias: Any = None,
    scale: Any = 1.0,
    reduce_op: Any = None,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd_enum = reduce_cmd_enum.idle,
    name: str | None = None,
) -> Any:
    """ScalarE: dst = op(data * scale + bias), optional add-reduction into the registers."""
    instr = "activation"
    o = ops.resolve(op, "op")
    if not o.activation:
        raise fail("OP", f"activation: op nl.{o.name} is not an activation function")
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    if not isinstance(reduce_cmd, reduce_cmd_enum):
        raise fail("ARG", f"activation: reduce_cmd must be an nisa.reduce_cmd member; got {reduce_cmd!r}")
    if reduce_op is not None and ops.resolve(reduce_op, "reduce_op") is not ops.add:
        raise fail("OP", f"activation: reduce_op must be nl.add; got {reduce_op!r}")
    if isinstance(bias, (int, float)) and current().target.nc_version < 3:
        raise fail("VERSION", "activation: a scalar bias needs NC-v3+; pass a (P, 1) tile")
    bias_v = scalar_or_column(bias, p, "bias", instr)
    scale_v = scalar_or_column(scale, p, "scale", instr)
    if isinstance(scale, NkiTensor) and scale.dtype != dt.float32:
        raise fail("DTYPE", f"activation: a scale tile must be fp32; got {scale.dtype.name}")
    if reduce_res is not None:
        on_chip(reduce_res, "reduce_res", instr)
        if reduce_res.shape[0] != p or reduce_res.free_size != 1:
            raise fail("FREE", f"activation: reduce_res must be ({p}, 1); got {reduce_res.shape}")
    srcs = (data,) + tuple(x for x in (bias, scale) if isinstance(x, NkiTensor))
    dsts = (dst,) + ((reduce_res,) if reduce_res is not None else ())
    emit(
        "scalar",
        "activation",
        dsts,
        srcs,
        p,
        n,
        attrs={"op": o.name, "reduce": reduce_cmd is not reduce_cmd_enum.idle, "fast": _all_bf16(dst, data)},
        name=name,
    )
    launch = current()
    if launch.trace_only:
        return None
    x = read_f32(data).reshape(p, n)
    if scale_v is not None:
        x = x * np.float32(scale_v) if isinstance(scale_v, float) else x * scale_v
    if bias_v is not None:
        x = x + np.float32(bias_v) if isinstance(bias_v, float) else x + bias_v
    with np.errstate(all="ignore"):
        y = o.fn(x.astype(np.float32)).astype(np.float32)  # type: ignore[misc]
    write(dst, y.reshape(dst.shape))
    acc = launch.program.scalar_acc
    lanes = _lanes(data)
    _update_acc(acc, lanes, reduce_cmd, y.sum(axis=1, dtype=np.float32))
    if reduce_res is not None:
        write(reduce_res, acc[lanes].reshape(reduce_res.shape))
    return None


@instruction
def activation_reduce(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    reduce_op: Any,
    reduce_res: NkiTensor,
    bias: Any = None,
    scale: Any = 1.0,
    name: str | None = None,
) -> Any:
    """`activation` with reduce_cmd=reset_reduce (kept for backward compatibility)."""
    return activation(
        dst,
        op,
        data,
        bias=bias,
        scale=scale,
        reduce_op=reduce_op,
        reduce_res=reduce_res,
        reduce_cmd=reduce_cmd_enum.reset_reduce,
        name=name,
    )


def _binary(o: ops.Op, a: np.ndarray, b: Any, reverse: bool = False) -> np.ndarray:
    if reverse:
        a, b = b, a
    with np.errstate(all="ignore"):
        return np.asarray(o.fn(a, b))  # type: ignore[misc]


def _int_exact(*ts: NkiTensor) -> bool:
    return all(t.dtype in (dt.int32, dt.uint32) for t in ts)


@instruction
def tensor_tensor(
    dst: NkiTensor,
    data1: NkiTensor,
    data2: NkiTensor,
    op: Any,
    engine: engine_enum = engine_enum.unknown,
    name: str | None = None,
) -> Any:
    """dst = data1 op data2, element-wise (no broadcasting; use stride-0 views)."""
    instr = "tensor_tensor"
    o = ops.resolve(op, "op")
    if o.kind not in ("binary", "bitvec"):
        raise fail("OP", f"tensor_tensor: op nl.{o.name} is not a binary ALU op")
    if o.version > current().target.nc_version:
        raise fail("VERSION", f"tensor_tensor: nl.{o.name} needs NC-v{o.version}+")
    for arg, t in (("dst", dst), ("data1", data1), ("data2", data2)):
        on_chip(t, arg, instr)
    if data1.buffer is psum and data2.buffer is psum:
        raise fail("BUF", "tensor_tensor: data1 and data2 cannot both be in PSUM")
    exact = _int_exact(dst, data1, data2)
    default = "gpsimd" if (o is ops.power or (exact and not _psum_in(dst, data1, data2))) else "vector"
    eng = pick_engine(engine, default, _VSG, instr)
    if o is ops.power and eng != "gpsimd":
        raise fail("ENGINE", "tensor_tensor: nl.power runs on GpSimd only")
    no_psum_on_gpsimd(eng, instr, dst=dst, data1=data1, data2=data2)
    if o.is_bitvec and not all(dt.is_int(t.dtype) for t in (dst, data1, data2)):
        raise fail("DTYPE", f"tensor_tensor: bitvec op nl.{o.name} needs integer dtypes")
    p = same_partitions(instr, dst=dst, data1=data1, data2=data2)
    n = same_free(instr, dst=dst, data1=data1, data2=data2)
    emit(
        eng,
        "tensor_tensor",
        (dst,),
        (data1, data2),
        p,
        n,
        attrs={"op": o.name, "psum_in": _psum_in(data1, data2), "fast": _all_bf16(dst, data1, data2)},
        name=name,
    )
    if current().trace_only:
        return None
    if o.is_bitvec or exact:
        a, b = read(data1).astype(np.int64), read(data2).astype(np.int64)
    else:
        a, b = read_f32(data1), read_f32(data2)
    res = _binary(o, a.reshape(p, n), b.reshape(p, n))
    write(dst, res.reshape(dst.shape))
    return None


_SCALAR_ENGINE_OPS = {ops.multiply.name, ops.add.name}


def _scalar_operand(
    operand: Any, op: ops.Op | None, p: int, arg: str, instr: str
) -> np.ndarray | float | None:
    if op is None:
        return None
    if op.is_unary:
        if operand not in (None, 0, 0.0):
            raise fail("ARG", f"{instr}: unary op nl.{op.name} needs {arg}=None or 0; got {operand!r}")
        return None
    if isinstance(operand, NkiTensor) and not op.is_bitvec and operand.dtype != dt.float32:
        raise fail("DTYPE", f"{instr}: arithmetic tile {arg} must be fp32; got {operand.dtype.name}")
    return scalar_or_column(operand, p, arg, instr)


def _apply(op: ops.Op | None, x: np.ndarray, v: Any, reverse: bool) -> np.ndarray:
    if op is None or op is ops.bypass:
        return x
    if op.is_unary:
        with np.errstate(all="ignore"):
            return np.asarray(op.fn(x), dtype=np.float32)  # type: ignore[misc]
    return _binary(op, x, np.float32(v) if isinstance(v, float) else v, reverse)


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
) -> Any:
    """dst = (data op0 operand0) op1 operand1; operands are scalars or (P, 1) columns."""
    instr = "tensor_scalar"
    o0 = ops.resolve(op0, "op0")
    o1 = ops.resolve(op1, "op1") if op1 is not None else None
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    if o1 is not None and not o1.is_unary and o1 is not ops.bypass and o0.is_bitvec != o1.is_bitvec:
        raise fail("OP", "tensor_scalar: op0 and op1 must both be bitvec or both arithmetic")
    eng = pick_engine(engine, "vector", _VSG, instr)
    no_psum_on_gpsimd(eng, instr, dst=dst, data=data)
    if eng == "scalar" and current().target.nc_version == 3:
        names = {o0.name} | ({o1.name} if o1 is not None else set())
        if not names <= _SCALAR_ENGINE_OPS:
            raise fail("ENGINE", f"tensor_scalar on ScalarE (trn2) allows add/multiply only; got {names}")
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    v0 = _scalar_operand(operand0, o0, p, "operand0", instr)
    v1 = _scalar_operand(operand1, o1, p, "operand1", instr)
    srcs = (data,) + tuple(x for x in (operand0, operand1) if isinstance(x, NkiTensor))
    emit(
        eng,
        "tensor_scalar",
        (dst,),
        srcs,
        p,
        n,
        attrs={"op": o0.name, "psum_in": _psum_in(data), "fast": _all_bf16(dst, data)},
        name=name,
    )
    if current().trace_only:
        return None
    if o0.is_bitvec:
        x = read(data).astype(np.int64).reshape(p, n)
        v0 = np.int64(v0) if isinstance(v0, float) else v0
        v1 = np.int64(v1) if isinstance(v1, float) else v1
    else:
        x = read_f32(data).reshape(p, n)
    y = _apply(o0, x, v0, bool(reverse0))
    y = _apply(o1, y, v1, bool(reverse1))
    write(dst, y.reshape(dst.shape))
    return None


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
) -> Any:
    """dst = (data op0 operand0) op1 operand1; operand0 scalar/(P,1), operand1 a full tile."""
    instr = "scalar_tensor_tensor"
    o0, o1 = ops.resolve(op0, "op0"), ops.resolve(op1, "op1")
    for o in (o0, o1):
        if o.kind != "binary":
            raise fail("OP", f"{instr}: nl.{o.name} is not an arithmetic binary op")
    for arg, t in (("dst", dst), ("data", data), ("operand1", operand1)):
        on_chip(t, arg, instr)
    if data.buffer is psum and operand1.buffer is psum:
        raise fail("BUF", f"{instr}: data and operand1 cannot both be in PSUM")
    p = same_partitions(instr, dst=dst, data=data, operand1=operand1)
    n = same_free(instr, dst=dst, data=data, operand1=operand1)
    v0 = _scalar_operand(operand0, o0, p, "operand0", instr)
    srcs = (data, operand1) + ((operand0,) if isinstance(operand0, NkiTensor) else ())
    emit(
        "vector",
        instr,
        (dst,),
        srcs,
        p,
        n,
        attrs={"op": o1.name, "psum_in": _psum_in(data, operand1), "fast": False},
        name=name,
    )
    if current().trace_only:
        return None
    x = read_f32(data).reshape(p, n)
    y = _apply(o0, x, v0, bool(reverse0))
    y = _binary(o1, y, read_f32(operand1).reshape(p, n), bool(reverse1))
    write(dst, y.reshape(dst.shape))
    return None


def _reduce_fn(o: ops.Op) -> Any:
    table = {
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
    if not o.reduce or o.name not in table:
        raise fail("OP", f"nl.{o.name} is not a legal reduce op")
    return table[o.name]


def reduce_values(o: ops.Op, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    fn = _reduce_fn(o)
    if o.name.startswith("logical"):
        return fn.reduce(x != 0, axis=axes).astype(np.float32)
    if o.is_bitvec:
        return fn.reduce(x.astype(np.int64), axis=axes)
    return fn.reduce(x, axis=axes).astype(np.float32)


@instruction
def tensor_reduce(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    axis: Any,
    negate: bool = False,
    keepdims: bool = False,
    name: str | None = None,
) -> Any:
    """Reduce over trailing free dims (VectorE); fp32 math; optional negation."""
    instr = "tensor_reduce"
    o = ops.resolve(op, "op")
    _reduce_fn(o)
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(int(a) + data.ndim if int(a) < 0 else int(a) for a in axes))
    trailing = tuple(range(data.ndim - len(axes), data.ndim))
    if not axes or 0 in axes or axes != trailing:
        raise fail(
            "REDUCE_AXIS",
            f"{instr}: axis {axis} must name trailing free dims of a {data.ndim}-D tile "
            f"(e.g. {tuple(range(1, data.ndim))[-1:]}); dim 0 cannot be reduced",
        )
    p = same_partitions(instr, dst=dst, data=data)
    kept = int(np.prod(data.shape[1 : data.ndim - len(axes)]))
    if dst.free_size != kept:
        raise fail("FREE", f"{instr}: dst holds {dst.free_size} elements per partition; expected {kept}")
    emit(
        "vector",
        instr,
        (dst,),
        (data,),
        p,
        data.free_size,
        attrs={"op": o.name, "psum_in": _psum_in(data), "fast": _all_bf16(data)},
        name=name,
    )
    if current().trace_only:
        return None
    x = read(data).astype(np.int64) if o.is_bitvec else read_f32(data)
    r = reduce_values(o, x, axes)
    if negate:
        r = -r
    write(dst, r.reshape(dst.shape))
    return None


@instruction
def reciprocal(dst: NkiTensor, data: NkiTensor, name: str | None = None) -> Any:
    """VectorE 1/x (more precise than activation(op=nl.reciprocal))."""
    instr = "reciprocal"
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    emit("vector", instr, (dst,), (data,), p, n, attrs={"op": "reciprocal"}, name=name)
    if current().trace_only:
        return None
    with np.errstate(divide="ignore"):
        write(dst, (np.float32(1.0) / read_f32(data)).reshape(dst.shape))
    return None
