"""ScalarE `activation` / `activation_reduce` and the ScalarE accumulator registers."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from . import ops
from .engine import (
    acc_lanes,
    emit,
    instruction,
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
from .state import current
from .tensor import NkiTensor
from .trace import Instr

_HALF = frozenset({dt.bfloat16, dt.float16})


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
) -> Instr | None:
    """ScalarE: dst = op(data * scale + bias) in fp32.

    The 128 per-lane accumulator registers persist across calls: `reduce_cmd` resets
    them and/or adds the free-axis sum of the result; `reduce_res` (P, 1) receives them.
    """
    instr = "activation"
    o = op_token(op, "op", instr)
    if not o.activation:
        raise fail("OP", f"activation: op nl.{o.name} is not an activation function")
    on_chip(data, "data", instr)
    on_chip(dst, "dst", instr)
    p = same_partitions(instr, dst=dst, data=data)
    n = same_free(instr, dst=dst, data=data)
    if not isinstance(reduce_cmd, reduce_cmd_enum):
        raise fail(
            "ARG", f"activation: reduce_cmd must be an nisa.reduce_cmd member; got {reduce_cmd!r}"
        )
    if reduce_cmd is reduce_cmd_enum.load_reduce:
        raise fail("ARG", "activation: reduce_cmd.load_reduce has no value to load here")
    if reduce_op is not None and op_token(reduce_op, "reduce_op", instr) is not ops.add:
        raise fail("OP", f"activation: reduce_op must be nl.add; got {reduce_op!r}")
    launch = current()
    if bias is not None and not isinstance(bias, NkiTensor) and launch.target.nc_version < 3:
        raise fail("VERSION", "activation: a scalar bias needs NC-v3+; pass a (P, 1) tile")
    bias_v = scalar_or_column(bias, p, "bias", instr)
    scale_v = scalar_or_column(scale, p, "scale", instr)
    if isinstance(scale, NkiTensor) and scale.dtype != dt.float32:
        raise fail("DTYPE", f"activation: a scale tile must be fp32; got {scale.dtype}")
    if reduce_res is not None:
        on_chip(reduce_res, "reduce_res", instr)
        if reduce_res.shape[0] != p or reduce_res.free_size != 1:
            raise fail("FREE", f"activation: reduce_res must be ({p}, 1); got {reduce_res.shape}")
    srcs = (data, *tuple(x for x in (bias, scale) if isinstance(x, NkiTensor)))
    dsts = (dst,) + ((reduce_res,) if reduce_res is not None else ())
    ins = emit(
        "scalar",
        "activation",
        dsts,
        srcs,
        p,
        n,
        attrs={
            "op": o.name,
            "reduce": reduce_cmd is not reduce_cmd_enum.idle,
            "fast": dst.dtype in _HALF and data.dtype in _HALF,
        },
        name=name,
    )
    if launch.trace_only:
        return ins
    x = read_f32(data).reshape(p, n)
    with np.errstate(all="ignore"):
        if scale_v is not None and not (isinstance(scale_v, float) and scale_v == 1.0):
            x = x * (np.float32(scale_v) if isinstance(scale_v, float) else scale_v)
        if bias_v is not None:
            x = x + (np.float32(bias_v) if isinstance(bias_v, float) else bias_v)
        y = np.asarray(o.fn(x.astype(np.float32, copy=False)), dtype=np.float32)  # type: ignore[misc]
        # y may be a view of data (nl.copy): sum before the store can overwrite it
        summing = reduce_cmd is reduce_cmd_enum.reduce or reduce_cmd is reduce_cmd_enum.reset_reduce
        row = y.sum(axis=1, dtype=np.float32) if summing else None
    acc = launch.program.scalar_acc
    lanes = acc_lanes(data)
    write(dst, y.reshape(dst.shape))
    if reduce_cmd is reduce_cmd_enum.reset or reduce_cmd is reduce_cmd_enum.reset_reduce:
        acc[lanes] = 0.0
    if row is not None:
        acc[lanes] = (acc[lanes] + row).astype(np.float32)
    if reduce_res is not None:
        write(reduce_res, acc[lanes].reshape(reduce_res.shape))
    return ins


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
) -> Instr | None:
    """`activation` with reduce_cmd=reset_reduce (kept for backward compatibility)."""
    return activation(  # type: ignore[no-any-return]
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
