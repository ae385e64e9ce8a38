"""VectorE instructions that use the engine's accumulator registers: `range_select`,
`select_reduce` and `tensor_scalar_reduce`.

VectorE keeps one fp32 accumulator per lane (`state.Program.vector_acc`), shared by
these instructions; `reduce_cmd` decides whether an instruction resets, loads or keeps
it before folding in the per-partition reduction of its result. An instruction uses the
lanes of its input operand's physical partitions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from . import ops
from .engine import (
    acc_lanes,
    alu_op,
    emit,
    flag,
    instruction,
    int_arg,
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
from .enums import reduce_cmd as reduce_cmd_enum
from .errors import fail
from .state import current
from .tensor import NkiTensor

FP32_MIN = float(np.finfo(np.float32).min)

_RC = reduce_cmd_enum
_COMBINE = {
    "add": (np.add, 0.0),
    "multiply": (np.multiply, 1.0),
    "maximum": (np.maximum, -np.inf),
    "max": (np.maximum, -np.inf),
    "minimum": (np.minimum, np.inf),
    "min": (np.minimum, np.inf),
}
_RANGE_CMP = (ops.equal, ops.less, ops.less_equal, ops.greater, ops.greater_equal)


def check_cmd(cmd: Any, allowed: tuple[reduce_cmd_enum, ...], instr: str) -> reduce_cmd_enum:
    """`cmd` when it is one of the `allowed` reduce_cmd members (ARG / ACC_CMD otherwise)."""
    if not isinstance(cmd, reduce_cmd_enum):
        raise fail("ARG", f"{instr}: reduce_cmd must be an nisa.reduce_cmd member; got {cmd!r}")
    if cmd not in allowed:
        names = ", ".join(c.name for c in allowed)
        raise fail("ACC_CMD", f"{instr}: reduce_cmd.{cmd.name} is not supported (use {names})")
    return cmd


def accumulate(
    lanes: slice,
    cmd: reduce_cmd_enum,
    op_name: str,
    values: np.ndarray,
    init: np.ndarray | float | None = None,
) -> np.ndarray:
    """Apply `cmd` to the VectorE registers with the row reduction of `values` (P, n);
    return the registers of `lanes` afterwards."""
    acc = current().program.vector_acc
    fn, identity = _COMBINE[op_name]
    if cmd in (_RC.reset, _RC.reset_reduce):
        acc[lanes] = identity
    elif cmd is _RC.load_reduce:
        acc[lanes] = np.asarray(init, dtype=np.float32).reshape(-1)
    if cmd in (_RC.reduce, _RC.reset_reduce, _RC.load_reduce):
        with np.errstate(all="ignore"):
            row = fn.reduce(values, axis=1).astype(np.float32)
            acc[lanes] = fn(acc[lanes], row).astype(np.float32)
    return acc[lanes].copy()


def _reduce_res(t: NkiTensor | None, p: int, instr: str) -> None:
    if t is None:
        return
    on_chip(t, "reduce_res", instr)
    if t.shape[0] != p or t.free_size != 1:
        raise fail("FREE", f"{instr}: reduce_res must be a ({p}, 1) tile; got {t.shape}")
    if not dt.is_float(t.dtype):
        raise fail("DTYPE", f"{instr}: reduce_res must have a float dtype; got {t.dtype}")


def _max_only(reduce_op: Any, instr: str) -> None:
    o = op_token(reduce_op, "reduce_op", instr)
    if o not in (ops.maximum, ops.max_):
        raise fail("OP", f"{instr}: reduce_op must be nl.maximum; got nl.{o.name}")


@instruction
def range_select(
    dst: NkiTensor,
    on_true_tile: NkiTensor,
    comp_op0: Any,
    comp_op1: Any,
    bound0: NkiTensor,
    bound1: NkiTensor,
    reduce_cmd: reduce_cmd_enum = reduce_cmd_enum.reset_reduce,
    reduce_res: NkiTensor | None = None,
    reduce_op: Any = ops.maximum,
    range_start: int = 0,
    on_false_value: Any = FP32_MIN,
    name: str | None = None,
) -> Any:
    """VectorE (NC-v3+): keep element j where comp_op0(range_start + j, bound0) and
    comp_op1(range_start + j, bound1) hold, else FP32_MIN; max-reduce into the registers."""
    instr = "range_select"
    if current().target.nc_version < 3:
        raise fail("VERSION", f"{instr} needs NC-v3+; target {current().target.name} is NC-v2")
    c0, c1 = op_token(comp_op0, "comp_op0", instr), op_token(comp_op1, "comp_op1", instr)
    for arg, c in (("comp_op0", c0), ("comp_op1", c1)):
        if c not in _RANGE_CMP:
            raise fail(
                "OP",
                f"{instr}: {arg} must be nl.equal, less, less_equal, greater or "
                f"greater_equal; got nl.{c.name}",
            )
    _max_only(reduce_op, instr)
    cmd = check_cmd(reduce_cmd, (_RC.idle, _RC.reset, _RC.reduce, _RC.reset_reduce), instr)
    on_chip(dst, "dst", instr)
    on_chip(on_true_tile, "on_true_tile", instr)
    if not dt.is_float(on_true_tile.dtype):
        raise fail(
            "DTYPE", f"{instr}: on_true_tile must be a float dtype; got {on_true_tile.dtype}"
        )
    on_chip(bound0, "bound0", instr)
    on_chip(bound1, "bound1", instr)
    p = same_partitions(instr, dst=dst, on_true_tile=on_true_tile, bound0=bound0, bound1=bound1)
    n = same_free(instr, dst=dst, on_true_tile=on_true_tile)
    for arg, b in (("bound0", bound0), ("bound1", bound1)):
        if b.free_size != 1:
            raise fail("FREE", f"{instr}: {arg} must be a ({p}, 1) tile; got {b.shape}")
        if b.dtype != dt.float32:
            raise fail("DTYPE", f"{instr}: {arg} must be fp32; got {b.dtype}")
    _reduce_res(reduce_res, p, instr)
    if isinstance(on_false_value, NkiTensor) or np.float32(on_false_value) != np.float32(FP32_MIN):
        raise fail(
            "RANGE_FILL",
            f"{instr}: on_false_value must be FP32_MIN (-3.4028235e38); got {on_false_value!r}",
        )
    start = int_arg(range_start, "range_start", instr)
    if not (-(2**24) <= start and start + n <= 2**24):
        raise fail("ARG", f"{instr}: range_start {start} + {n} indexes exceed the fp32-exact 2^24")
    dsts = (dst,) + ((reduce_res,) if reduce_res is not None else ())
    ins = emit(
        "vector",
        instr,
        dsts,
        (on_true_tile, bound0, bound1),
        p,
        n,
        attrs={"reduce": cmd is not _RC.idle, "psum_in": psum_in(on_true_tile)},
        name=name,
    )
    if current().trace_only:
        return ins
    idx = (start + np.arange(n, dtype=np.int64)).astype(np.float32).reshape(1, n)
    b0 = read_f32(bound0).reshape(p, 1)
    b1 = read_f32(bound1).reshape(p, 1)
    keep = (c0.fn(idx, b0) != 0) & (c1.fn(idx, b1) != 0)  # type: ignore[misc]
    out = np.where(keep, read_f32(on_true_tile).reshape(p, n), np.float32(FP32_MIN))
    regs = accumulate(acc_lanes(on_true_tile), cmd, "maximum", out)
    write(dst, out.reshape(dst.shape))
    if reduce_res is not None:
        write(reduce_res, regs.reshape(reduce_res.shape))
    return ins


_SELECT_PRED = (dt.int8, dt.uint8, dt.int16, dt.uint16)


@instruction
def select_reduce(
    dst: NkiTensor,
    predicate: NkiTensor,
    on_true: NkiTensor,
    on_false: Any,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd_enum = reduce_cmd_enum.idle,
    reduce_op: Any = ops.maximum,
    reverse_pred: bool = False,
    name: str | None = None,
) -> Any:
    """VectorE: dst = on_true where predicate != 0 else on_false (a number or (P, 1)
    tile), with an optional max-reduction into the registers."""
    instr = "select_reduce"
    _max_only(reduce_op, instr)
    cmd = check_cmd(reduce_cmd, (_RC.idle, _RC.reset, _RC.reduce, _RC.reset_reduce), instr)
    for arg, t in (("dst", dst), ("predicate", predicate), ("on_true", on_true)):
        on_chip(t, arg, instr)
    not_both_psum(instr, predicate=predicate, on_true=on_true)
    reverse_pred = flag(reverse_pred, "reverse_pred", instr)
    if predicate.dtype not in _SELECT_PRED:
        raise fail(
            "DTYPE",
            f"{instr}: predicate must be int8, uint8, int16 or uint16; got {predicate.dtype}",
        )
    if on_true.dtype in (dt.int32, dt.uint32):
        raise fail("DTYPE", f"{instr}: on_true cannot be {on_true.dtype}")
    p = same_partitions(instr, dst=dst, predicate=predicate, on_true=on_true)
    n = same_free(instr, dst=dst, predicate=predicate, on_true=on_true)
    fill = scalar_or_column(on_false, p, "on_false", instr)
    _reduce_res(reduce_res, p, instr)
    if reduce_res is not None and cmd is _RC.idle:
        current().warn(
            "select_reduce_idle",
            "select_reduce: reduce_res with reduce_cmd=idle receives the registers as they "
            "were (no reduction ran); pass reduce_cmd=nisa.reduce_cmd.reset_reduce",
        )
    srcs = (predicate, on_true) + ((on_false,) if isinstance(on_false, NkiTensor) else ())
    dsts = (dst,) + ((reduce_res,) if reduce_res is not None else ())
    ins = emit(
        "vector",
        instr,
        dsts,
        srcs,
        p,
        n,
        attrs={"reduce": cmd is not _RC.idle, "psum_in": psum_in(predicate, on_true)},
        name=name,
    )
    if current().trace_only:
        return ins
    take = read(predicate).reshape(p, n) != 0
    if reverse_pred:
        take = ~take
    assert fill is not None
    alt = np.float32(fill) if isinstance(fill, float) else fill
    out = np.where(take, read_f32(on_true).reshape(p, n), alt).astype(np.float32)
    regs = accumulate(acc_lanes(on_true), cmd, "maximum", out)
    write(dst, out.reshape(dst.shape))
    if reduce_res is not None:
        write(reduce_res, regs.reshape(reduce_res.shape))
    return ins


@instruction
def tensor_scalar_reduce(
    dst: NkiTensor,
    data: NkiTensor,
    op0: Any,
    operand0: Any,
    reduce_op: Any,
    reduce_res: NkiTensor | None = None,
    reverse0: bool = False,
    reduce_cmd: reduce_cmd_enum = reduce_cmd_enum.reset_reduce,
    reduce_init: Any = None,
    reduce_res_negate: bool = False,
    name: str | None = None,
) -> Any:
    """VectorE: dst = data op0 operand0, reduced over all free dims into the registers
    with reduce_op (add, multiply, maximum, minimum); reduce_res gets the registers."""
    instr = "tensor_scalar_reduce"
    o = alu_op(op0, "op0", instr, unary=True, bitvec=False)
    r = op_token(reduce_op, "reduce_op", instr)
    if r.name not in _COMBINE:
        raise fail(
            "OP",
            f"{instr}: reduce_op must be nl.add, multiply, maximum or minimum; got nl.{r.name}",
        )
    if flag(reverse0, "reverse0", instr):
        raise fail("ARG", f"{instr}: reverse0=True is not supported yet (NKI 0.6)")
    reduce_res_negate = flag(reduce_res_negate, "reduce_res_negate", instr)
    cmd = check_cmd(reduce_cmd, (_RC.reset_reduce, _RC.reduce, _RC.load_reduce), instr)
    if (cmd is _RC.load_reduce) != (reduce_init is not None):
        raise fail(
            "ACC_CMD",
            f"{instr}: reduce_init is given exactly when reduce_cmd is load_reduce "
            f"(reduce_cmd.{cmd.name}, reduce_init={reduce_init!r})",
        )
    on_chip(dst, "dst", instr)
    on_chip(data, "data", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    if o.is_unary:
        if operand0 not in (None, 0, 0.0):
            raise fail("ARG", f"{instr}: unary op0 nl.{o.name} needs operand0=None or 0")
        v0 = None
    else:
        if isinstance(operand0, NkiTensor) and operand0.dtype != dt.float32:
            raise fail("DTYPE", f"{instr}: a tile operand0 must be fp32; got {operand0.dtype}")
        v0 = scalar_or_column(operand0, p, "operand0", instr)
    if isinstance(reduce_init, NkiTensor) and reduce_init.dtype != dt.float32:
        raise fail("DTYPE", f"{instr}: reduce_init tile must be fp32; got {reduce_init.dtype}")
    init = scalar_or_column(reduce_init, p, "reduce_init", instr)
    _reduce_res(reduce_res, p, instr)
    srcs = (data, *[x for x in (operand0, reduce_init) if isinstance(x, NkiTensor)])
    dsts = (dst,) + ((reduce_res,) if reduce_res is not None else ())
    ins = emit(
        "vector",
        instr,
        dsts,
        srcs,
        p,
        n,
        attrs={"op": o.name, "reduce_op": r.name, "psum_in": psum_in(data)},
        name=name,
    )
    if current().trace_only:
        return ins
    x = read_f32(data).reshape(p, n)
    fn = o.fn
    assert fn is not None
    with np.errstate(all="ignore"):
        if o.is_unary:
            y = np.asarray(fn(x), dtype=np.float32)
        else:
            y = np.asarray(fn(x, np.float32(v0) if isinstance(v0, float) else v0), dtype=np.float32)
    regs = accumulate(acc_lanes(data), cmd, r.name, y, init)
    write(dst, y.reshape(dst.shape))
    if reduce_res is not None:
        write(reduce_res, (-regs if reduce_res_negate else regs).reshape(reduce_res.shape))
    return ins
