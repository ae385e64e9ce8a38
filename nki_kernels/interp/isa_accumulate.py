"""Instructions that scan or reduce into the engines' accumulator registers, as the NKI 0.6
stubs specify them (aws-neuron-sdk @ 81ce03ae, `nki/api/nki/isa/`):

- `tensor_scalar_cumulative` (VectorE): per partition, reg = op1(op0(x_i, imm0), reg),
  dst_i = reg, over the flattened free dims; the register starts at op1's identity
  (reset_reduce), `imm1` (load_reduce) or where the last VectorE accumulation left it
  (reduce), and keeps the last value afterwards;
- `exponential` (VectorE, NC-v4+): dst = exp(src - max_value), its row sum accumulated;
- `activate2` (ScalarE, NC-v4+): dst = op((data op0 imm0) op1 imm1), optionally reduced
  into the ScalarE registers with `reduce_op`.

Math is fp32; the registers are `state.Program.vector_acc` / `scalar_acc`, one fp32 value
per lane, shared with the other accumulating instructions of the engine.
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
    need_version,
    on_chip,
    op_token,
    read_f32,
    same_free,
    same_partitions,
    scalar_or_column,
    write,
)
from .enums import reduce_cmd as reduce_cmd_enum
from .errors import fail
from .isa_vector_acc import _COMBINE, _reduce_res, accumulate, check_cmd
from .state import current
from .tensor import NkiTensor

_RC = reduce_cmd_enum
# tensor_scalar_cumulative: "INT32/UINT32 are not supported as input/output dtypes"
CUMULATIVE_DTYPES = frozenset(
    {
        dt.bfloat16,
        dt.float16,
        dt.float32,
        dt.float8_e4m3,
        dt.float8_e5m2,
        dt.float8_e4m3fn,
        dt.uint8,
        dt.uint16,
        dt.int8,
        dt.int16,
    }
)
EXP_SRC_DTYPES = frozenset(
    {
        dt.float8_e4m3,
        dt.float8_e5m2,
        dt.float16,
        dt.bfloat16,
        dt.float32,
        dt.int8,
        dt.int16,
        dt.int32,
        dt.uint8,
        dt.uint16,
        dt.uint32,
    }
)
EXP_DST_DTYPES = (EXP_SRC_DTYPES - {dt.uint32}) | {dt.tfloat32}
ACTIVATE2_PAIRS = (
    ("multiply", "add"),
    ("multiply", "subtract"),
    ("multiply", "bypass"),
    ("add", "bypass"),
    ("subtract", "bypass"),
    ("bypass", "bypass"),
)
_REDUCE2: dict[str, tuple[Any, float]] = {
    "add": (np.add, 0.0),
    "maximum": (np.maximum, -np.inf),
    "minimum": (np.minimum, np.inf),
    "abs_max": (lambda a, b: np.maximum(np.abs(a), np.abs(b)), 0.0),
    "abs_min": (lambda a, b: np.minimum(np.abs(a), np.abs(b)), np.inf),
}


def _imm(x: Any, p: int, arg: str, instr: str) -> Any:
    if isinstance(x, NkiTensor) and x.dtype != dt.float32:
        raise fail("DTYPE", f"{instr}: a tile {arg} must be fp32; got {x.dtype}")
    v = scalar_or_column(x, p, arg, instr)
    return np.float32(v) if isinstance(v, float) else v


def _tiles(*xs: Any) -> tuple[NkiTensor, ...]:
    return tuple(x for x in xs if isinstance(x, NkiTensor))


@instruction
def tensor_scalar_cumulative(
    dst: NkiTensor,
    src: NkiTensor,
    op0: Any,
    op1: Any,
    imm0: Any,
    imm1: Any = None,
    reduce_cmd: reduce_cmd_enum = reduce_cmd_enum.reset_reduce,
    name: str | None = None,
) -> Any:
    """VectorE: the running op1-scan of op0(src, imm0) along each partition's free dims."""
    instr = "tensor_scalar_cumulative"
    o0 = alu_op(op0, "op0", instr, bitvec=False)
    o1 = op_token(op1, "op1", instr)
    if o1.name not in ("subtract", *_COMBINE):
        raise fail(
            "OP", f"{instr}: op1 must be add, subtract, multiply, max or min; got nl.{o1.name}"
        )
    cmd = check_cmd(reduce_cmd, (_RC.reset_reduce, _RC.reduce, _RC.load_reduce), instr)
    if cmd is _RC.load_reduce and imm1 is None:
        raise fail("ACC_CMD", f"{instr}: reduce_cmd.load_reduce loads imm1; imm1 is None")
    on_chip(dst, "dst", instr)
    on_chip(src, "src", instr)
    for arg, t in (("dst", dst), ("src", src)):
        if t.dtype not in CUMULATIVE_DTYPES:
            raise fail(
                "DTYPE", f"{instr}: {arg} dtype {t.dtype} is not supported (no int32/uint32)"
            )
    p = same_partitions(instr, dst=dst, src=src)
    n = same_free(instr, dst=dst, src=src)
    v0 = _imm(imm0, p, "imm0", instr)
    v1 = _imm(imm1, p, "imm1", instr)
    ins = emit(
        "vector",
        instr,
        (dst,),
        (src, *_tiles(imm0, imm1)),
        p,
        n,
        attrs={"op0": o0.name, "op1": o1.name},
        name=name,
    )
    if current().trace_only:
        return ins
    acc = current().program.vector_acc
    lanes = acc_lanes(src)
    with np.errstate(all="ignore"):
        v = np.asarray(o0.fn(read_f32(src).reshape(p, n), v0), dtype=np.float32)  # type: ignore[misc]
        if cmd is _RC.reset_reduce:
            reg = np.full(p, 0.0 if o1.name == "subtract" else _COMBINE[o1.name][1], np.float32)
        elif cmd is _RC.load_reduce:
            reg = np.broadcast_to(np.asarray(v1, np.float32).reshape(-1), (p,)).astype(np.float32)
        else:
            reg = acc[lanes].astype(np.float32)
        out = np.empty((p, n), np.float32)
        if o1.name == "subtract":  # reg = v_i - reg: no ufunc accumulate does this
            for i in range(n):
                reg = (v[:, i] - reg).astype(np.float32)
                out[:, i] = reg
        else:
            fn = _COMBINE[o1.name][0]
            out = fn.accumulate(np.concatenate([reg[:, None], v], axis=1), axis=1)[:, 1:]
            out = out.astype(np.float32)
    acc[lanes] = out[:, -1]
    write(dst, out.reshape(dst.shape))
    return ins


@instruction
def exponential(
    dst: NkiTensor,
    src: NkiTensor,
    max_value: Any = 0.0,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd_enum = reduce_cmd_enum.idle,
    reduce_init: Any = 0.0,
    name: str | None = None,
) -> Any:
    """VectorE (NC-v4+): dst = exp(src - max_value); the row sums accumulate per reduce_cmd."""
    instr = "exponential"
    need_version(4, f"nisa.{instr}")
    cmd = check_cmd(reduce_cmd, (_RC.idle, _RC.reset_reduce, _RC.reduce, _RC.load_reduce), instr)
    if cmd is not _RC.load_reduce and not (
        isinstance(reduce_init, (int, float)) and float(reduce_init) == 0.0
    ):
        raise fail(
            "ACC_CMD",
            f"{instr}: reduce_init must be 0.0 unless reduce_cmd is load_reduce; got "
            f"{reduce_init!r} with reduce_cmd.{cmd.name}",
        )
    on_chip(dst, "dst", instr)
    on_chip(src, "src", instr)
    if src.dtype not in EXP_SRC_DTYPES:
        names = ", ".join(sorted(str(d) for d in EXP_SRC_DTYPES))
        raise fail("DTYPE", f"{instr}: src dtype must be one of {names}; got {src.dtype}")
    if dst.dtype not in EXP_DST_DTYPES:
        names = ", ".join(sorted(str(d) for d in EXP_DST_DTYPES))
        raise fail("DTYPE", f"{instr}: dst dtype must be one of {names}; got {dst.dtype}")
    for arg, t in (("dst", dst), ("src", src)):
        if t.ndim > 4:
            raise fail("ARG", f"{instr}: {arg} may be up to 4-D; got {t.shape}")
    p = same_partitions(instr, dst=dst, src=src)
    n = same_free(instr, dst=dst, src=src)
    mv = _imm(max_value, p, "max_value", instr)
    init = _imm(reduce_init, p, "reduce_init", instr)
    _reduce_res(reduce_res, p, instr)
    dsts = (dst,) + ((reduce_res,) if reduce_res is not None else ())
    ins = emit(
        "vector",
        instr,
        dsts,
        (src, *_tiles(max_value, reduce_init)),
        p,
        n,
        attrs={"reduce": cmd is not _RC.idle},
        name=name,
    )
    if current().trace_only:
        return ins
    with np.errstate(all="ignore"):
        y = np.exp(read_f32(src).reshape(p, n) - mv).astype(np.float32)
    if cmd is _RC.idle:
        regs = current().program.vector_acc[acc_lanes(src)].copy()
    else:
        regs = accumulate(acc_lanes(src), cmd, "add", y, init)
    write(dst, y.reshape(dst.shape))
    if reduce_res is not None:
        write(reduce_res, regs.reshape(reduce_res.shape))
    return ins


@instruction
def activate2(
    dst: NkiTensor,
    op: Any,
    data: NkiTensor,
    imm0: Any,
    imm1: Any,
    op0: Any,
    op1: Any,
    relu_param: Any = 0.0,
    reverse0: bool = False,
    reverse1: bool = False,
    reduce_op: Any = None,
    reduce_res: NkiTensor | None = None,
    reduce_cmd: reduce_cmd_enum = reduce_cmd_enum.idle,
    name: str | None = None,
) -> Any:
    """ScalarE (NC-v4+): dst = op((data op0 imm0) op1 imm1) in fp32, with optional
    reduction of the result into the ScalarE registers."""
    instr = "activate2"
    need_version(4, f"nisa.{instr}")
    o = op_token(op, "op", instr)
    if not o.activation:
        raise fail("OP", f"{instr}: op nl.{o.name} is not an activation function")
    t0, t1 = op_token(op0, "op0", instr), op_token(op1, "op1", instr)
    if (t0.name, t1.name) not in ACTIVATE2_PAIRS:
        raise fail(
            "OP",
            f"{instr}: (op0, op1) = (nl.{t0.name}, nl.{t1.name}) is not one of "
            f"the six documented pairs {ACTIVATE2_PAIRS}",
        )
    rev0, rev1 = flag(reverse0, "reverse0", instr), flag(reverse1, "reverse1", instr)
    if (rev0 and t0 is ops.bypass) or (rev1 and t1 is ops.bypass):
        raise fail("ARG", f"{instr}: reverse0 needs op0 and reverse1 needs op1 to be set")
    if not isinstance(reduce_cmd, reduce_cmd_enum) or reduce_cmd is _RC.load_reduce:
        raise fail(
            "ACC_CMD",
            f"{instr}: reduce_cmd must be idle, reset, reset_reduce or reduce; got {reduce_cmd!r}",
        )
    r = None if reduce_op is None else op_token(reduce_op, "reduce_op", instr)
    if r is not None and r.name not in _REDUCE2:
        raise fail("OP", f"{instr}: reduce_op must be one of {sorted(_REDUCE2)}; got nl.{r.name}")
    if r is None and reduce_cmd is not _RC.idle:
        raise fail("ACC_CMD", f"{instr}: reduce_cmd.{reduce_cmd.name} needs a reduce_op")
    on_chip(dst, "dst", instr)
    on_chip(data, "data", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    if isinstance(imm0, NkiTensor) and isinstance(imm1, NkiTensor) and imm0.dtype != imm1.dtype:
        raise fail("DTYPE", f"{instr}: imm0 ({imm0.dtype}) and imm1 ({imm1.dtype}) differ")
    vals = [
        scalar_or_column(x, p, a, instr)
        for x, a in ((imm0, "imm0"), (imm1, "imm1"), (relu_param, "relu_param"))
    ]
    v0, v1, slope = (np.float32(v) if isinstance(v, float) else v for v in vals)
    if reduce_res is not None:
        on_chip(reduce_res, "reduce_res", instr)
        if reduce_res.shape[0] != p or reduce_res.free_size != 1:
            raise fail("FREE", f"{instr}: reduce_res must be ({p}, 1); got {reduce_res.shape}")
    dsts = (dst,) + ((reduce_res,) if reduce_res is not None else ())
    ins = emit(
        "scalar",
        instr,
        dsts,
        (data, *_tiles(imm0, imm1, relu_param)),
        p,
        n,
        attrs={"op": o.name, "reduce": reduce_cmd is not _RC.idle},
        name=name,
    )
    if current().trace_only:
        return ins
    x = read_f32(data).reshape(p, n)
    with np.errstate(all="ignore"):
        for t, v, rev in ((t0, v0, rev0), (t1, v1, rev1)):
            if t is not ops.bypass:
                x = np.asarray(t.fn(v, x) if rev else t.fn(x, v), dtype=np.float32)  # type: ignore[misc]
        if o is ops.prelu:
            y = np.where(x > 0, x, slope * x).astype(np.float32)
        else:
            y = np.asarray(o.fn(x), dtype=np.float32)  # type: ignore[misc]
    acc = current().program.scalar_acc
    lanes = acc_lanes(data)
    if r is not None and reduce_cmd in (_RC.reset, _RC.reset_reduce):
        acc[lanes] = _REDUCE2[r.name][1]
    if r is not None and reduce_cmd in (_RC.reduce, _RC.reset_reduce):
        fn = _REDUCE2[r.name][0]
        row = y[:, 0]
        for i in range(1, n):
            row = fn(row, y[:, i])
        acc[lanes] = fn(acc[lanes], row).astype(np.float32)
    write(dst, y.reshape(dst.shape))
    if reduce_res is not None:
        write(reduce_res, acc[lanes].reshape(reduce_res.shape))
    return ins
