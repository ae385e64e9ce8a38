"""The experimental `nl` compute layer: `nl.add(x, y)`, `nl.exp(x)`, `nl.sum(x, axis)`, ...

Each wrapper allocates its result like `nl.ndarray` (an SBUF tile; a PSUM tile for
`nl.matmul` and `nl.transpose`) and issues the ISA instruction(s) that compute it, so
the work is traced exactly like hand-written ISA calls:

- binary ops: two tiles of one shape -> `tensor_tensor`; a tile and a number ->
  `tensor_scalar` (no broadcasting otherwise; `nl.divide` is unsupported, `nl.power`
  needs two tiles);
- unary activation functions -> ScalarE `activation`; `nl.negative`, `nl.invert`,
  `nl.logical_not` -> `tensor_scalar`;
- reductions over trailing free axes -> `tensor_reduce` (`nl.mean` then scales, `nl.var`
  and `nl.softmax` chain several instructions);
- `nl.matmul(x, y, transpose_x=True)` -> `nc_matmul`, `nl.transpose` -> `nc_transpose`,
  `nl.where` -> `tensor_scalar` + `tensor_copy` + `tensor_copy_predicated`.

The result dtype defaults to the (first) input tile's dtype; comparisons give 1 / 0.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from . import dtypes as dt
from . import ops, state
from .engine import reduce_axes
from .enums import reduce_cmd
from .errors import fail
from .isa_activation import activation
from .isa_elementwise import (
    memset,
    reciprocal,
    tensor_copy,
    tensor_reduce,
    tensor_scalar,
    tensor_tensor,
)
from .isa_tensor import nc_matmul, nc_transpose
from .isa_vector import tensor_copy_predicated
from .tensor import NkiTensor, allocate, psum, sbuf

_RESET_REDUCE = reduce_cmd.reset_reduce


def _new(shape: tuple[int, ...], dtype: Any, name: str, buffer: Any = sbuf) -> NkiTensor:
    return allocate(shape, dtype, buffer, name)


def _tile(x: Any, arg: str, fn: str) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise fail("NL_API", f"nl.{fn}: {arg} must be a tile; got {type(x).__name__}")
    return x


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


# ---- element-wise ---------------------------------------------------------------------
def _binary(o: ops.Op) -> Any:
    def call(x: Any, y: Any, dtype: Any = None) -> NkiTensor:
        fn = o.name
        if o is ops.divide:
            raise fail("NL_API", "nl.divide is not supported (NKI 0.6); multiply by a reciprocal")
        xt, yt = isinstance(x, NkiTensor), isinstance(y, NkiTensor)
        if xt and yt:
            if x.shape != y.shape:
                raise fail(
                    "NL_SHAPE",
                    f"nl.{fn}: x {x.shape} and y {y.shape} differ; the nl wrappers do not "
                    "broadcast (use a stride-0 view or a (P, 1) operand of nisa.tensor_scalar)",
                )
            out = _new(x.shape, dtype if dtype is not None else x.dtype, fn)
            tensor_tensor(out, x, y, o)
            return out
        if not (xt or yt):
            raise fail("NL_API", f"nl.{fn}: at least one of x, y must be a tile; got {x!r}, {y!r}")
        if o is ops.power:
            raise fail("NL_API", "nl.power needs two tiles (a scalar exponent is not supported)")
        tile, number = (x, y) if xt else (y, x)
        if not _is_number(number):
            raise fail("NL_API", f"nl.{fn}: the non-tile operand must be a number; got {number!r}")
        out = _new(tile.shape, dtype if dtype is not None else tile.dtype, fn)
        tensor_scalar(out, tile, o, number, reverse0=not xt)
        return out

    call.__name__ = o.name
    call.__doc__ = f"`nl.{o.name}(x, y, dtype=None)`: a new tile, element-wise."
    return call


def _unary(o: ops.Op) -> Any:
    def call(x: Any, dtype: Any = None) -> NkiTensor:
        t = _tile(x, "x", o.name)
        out = _new(t.shape, dtype if dtype is not None else t.dtype, o.name)
        if o is ops.negative:
            tensor_scalar(out, t, ops.multiply, -1.0)
        elif o is ops.invert:
            tensor_scalar(out, t, ops.bitwise_xor, _all_ones(t.dtype))
        elif o.activation:
            activation(out, o, t)
        else:
            raise fail(
                "NL_API",
                f"nl.{o.name}(x) is not implemented by the interpreter's nl layer "
                "(no ISA lowering is documented)",
            )
        return out

    call.__name__ = o.name
    call.__doc__ = f"`nl.{o.name}(x, dtype=None)`: a new tile, element-wise."
    return call


def _all_ones(dtype: dt.NkiDtype) -> int:
    if not dt.is_int(dtype) or dtype == dt.bool_:
        raise fail("DTYPE", f"nl.invert needs an integer tile; got {dtype}")
    info = np.iinfo(dtype._np)
    return -1 if info.min < 0 else int(info.max)


def logical_not(x: Any, dtype: Any = None) -> NkiTensor:
    """`nl.logical_not(x)`: 1 where x == 0, else 0 (a new tile)."""
    t = _tile(x, "x", "logical_not")
    out = _new(t.shape, dtype if dtype is not None else t.dtype, "logical_not")
    tensor_scalar(out, t, ops.equal, 0.0)
    return out


# ---- reductions ---------------------------------------------------------------------
def _axes(x: NkiTensor, axis: Any, fn: str) -> tuple[int, ...]:
    return reduce_axes(axis, x.ndim, f"nl.{fn}")


def _reduced_shape(x: NkiTensor, axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(x.shape))
    shape = x.shape[: x.ndim - len(axes)]
    return shape if len(shape) >= 2 else (*shape, 1)  # on-chip tiles stay 2-D


def _reduction(o: ops.Op, fn: str) -> Any:
    def call(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
        t = _tile(x, "x", fn)
        axes = _axes(t, axis, fn)
        out = _new(_reduced_shape(t, axes, keepdims), dtype if dtype is not None else t.dtype, fn)
        tensor_reduce(out, o, t, axes, keepdims=keepdims)
        return out

    call.__name__ = fn
    call.__doc__ = f"`nl.{fn}(x, axis, dtype=None, keepdims=False)` over trailing free axes."
    return call


sum_ = _reduction(ops.add, "sum")
prod = _reduction(ops.multiply, "prod")
_max_reduce = _reduction(ops.max_, "max")
_min_reduce = _reduction(ops.min_, "min")


def all_(x: Any, axis: Any, dtype: Any = None) -> NkiTensor:
    """`nl.all(x, axis)`: 1 where every element along the axes is nonzero, else 0."""
    t = _tile(x, "x", "all")
    axes = _axes(t, axis, "all")
    out = _new(_reduced_shape(t, axes, False), dtype if dtype is not None else t.dtype, "all")
    tensor_reduce(out, ops.logical_and, t, axes)
    return out


def mean(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """`nl.mean(x, axis)`: an fp32 sum scaled by 1/count."""
    t = _tile(x, "x", "mean")
    axes = _axes(t, axis, "mean")
    shape = _reduced_shape(t, axes, keepdims)
    total = _new(shape, dt.float32, "mean_sum")
    tensor_reduce(total, ops.add, t, axes, keepdims=keepdims)
    count = int(np.prod([t.shape[a] for a in axes]))
    out = _new(shape, dtype if dtype is not None else t.dtype, "mean")
    tensor_scalar(out, total, ops.multiply, 1.0 / count)
    return out


def _whole_rows(t: NkiTensor, axis: Any, fn: str) -> int:
    axes = _axes(t, axis, fn)
    if axes != tuple(range(1, t.ndim)):
        raise fail(
            "NL_API",
            f"nl.{fn}: the interpreter supports axis over all free dims of {t.shape} "
            f"(got {axis}); reshape or use ISA calls",
        )
    return t.free_size


def var(x: Any, axis: Any, dtype: Any = None, keepdims: bool = False) -> NkiTensor:
    """`nl.var(x, axis)`: population variance over all free dims, shape (P, 1)."""
    t = _tile(x, "x", "var")
    n = _whole_rows(t, axis, "var")
    p = t.shape[0]
    mu = mean(t, axis, dtype=dt.float32)
    diff = _new(t.shape, dt.float32, "var_diff")
    tensor_scalar(diff, t, ops.subtract, mu.reshape((p, 1)))
    sq = _new(t.shape, dt.float32, "var_sq")
    sumsq = _new((p, 1), dt.float32, "var_sumsq")
    activation(sq, ops.square, diff, reduce_op=ops.add, reduce_res=sumsq, reduce_cmd=_RESET_REDUCE)
    out = _new((p, 1), dtype if dtype is not None else t.dtype, "var")
    tensor_scalar(out, sumsq, ops.multiply, 1.0 / n)
    return out


def softmax(x: Any, axis: Any = -1, dtype: Any = None) -> NkiTensor:
    """`nl.softmax(x, axis)` over all free dims: exp(x - max) / sum, in fp32."""
    t = _tile(x, "x", "softmax")
    _whole_rows(t, axis, "softmax")
    p = t.shape[0]
    neg_max = _new((p, 1), dt.float32, "softmax_negmax")
    tensor_reduce(neg_max, ops.maximum, t, tuple(range(1, t.ndim)), negate=True)
    e = _new(t.shape, dt.float32, "softmax_exp")
    total = _new((p, 1), dt.float32, "softmax_sum")
    activation(
        e, ops.exp, t, bias=neg_max, reduce_op=ops.add, reduce_res=total, reduce_cmd=_RESET_REDUCE
    )
    inv = _new((p, 1), dt.float32, "softmax_inv")
    reciprocal(inv, total)
    out = _new(t.shape, dtype if dtype is not None else t.dtype, "softmax")
    tensor_scalar(out, e, ops.multiply, inv)
    return out


# ---- TensorE and selection ------------------------------------------------------------
def matmul(x: Any, y: Any, transpose_x: bool = False) -> NkiTensor:
    """`nl.matmul(x, y, transpose_x=True)`: x.T @ y as a new fp32 PSUM tile."""
    a, b = _tile(x, "x", "matmul"), _tile(y, "y", "matmul")
    if not transpose_x:
        raise fail(
            "NL_API",
            "nl.matmul(x, y) works only with transpose_x=True in NKI 0.6: lay x out as [K, M] "
            "(contraction on partitions) and call nl.matmul(x, y, transpose_x=True) for x.T @ y",
        )
    out = _new((a.free_size, b.free_size), dt.float32, "matmul", psum)
    nc_matmul(out, a, b)
    return out


def transpose(x: Any, dtype: Any = None) -> NkiTensor:
    """`nl.transpose(x)`: a 2-D tile with partition and free dims swapped, in PSUM."""
    t = _tile(x, "x", "transpose")
    if t.ndim != 2:
        raise fail("NL_API", f"nl.transpose takes a 2-D tile; got shape {t.shape}")
    out = _new((t.shape[1], t.shape[0]), t.dtype, "transpose", psum)
    nc_transpose(out, t)
    if dtype is None or dt.as_dtype(dtype) == t.dtype:
        return out
    cast = _new(out.shape, dtype, "transpose_cast", psum)
    tensor_copy(cast, out)
    return cast


def where(condition: Any, x: Any, y: Any, dtype: Any = None) -> NkiTensor:
    """`nl.where(cond, x, y)`: x where cond != 0, else y (tiles of one shape or numbers)."""
    cond = _tile(condition, "condition", "where")
    for arg, v in (("x", x), ("y", y)):
        if isinstance(v, NkiTensor):
            if v.shape != cond.shape:
                raise fail(
                    "NL_SHAPE", f"nl.where: {arg} {v.shape} differs from condition {cond.shape}"
                )
        elif not _is_number(v):
            raise fail("NL_API", f"nl.where: {arg} must be a tile or a number; got {v!r}")
    first = next((v for v in (x, y) if isinstance(v, NkiTensor)), cond)
    out = _new(cond.shape, dtype if dtype is not None else first.dtype, "where")
    pred = _new(cond.shape, dt.uint8, "where_pred")
    tensor_scalar(pred, cond, ops.not_equal, 0.0)
    if isinstance(y, NkiTensor):
        tensor_copy(out, y)
    else:
        memset(out, int(y) if dt.is_int(out.dtype) else float(y))
    if isinstance(x, NkiTensor) and x.dtype != out.dtype:
        converted = _new(cond.shape, out.dtype, "where_x")
        tensor_copy(converted, x)
        x = converted
    tensor_copy_predicated(out, x, pred)
    return out


def expand_dims(x: Any, axis: int) -> NkiTensor:
    """`nl.expand_dims(x, axis)`: a view of `x` with a size-1 axis at `axis` (not 0 on chip)."""
    t = _tile(x, "x", "expand_dims")
    return t.expand_dim(axis)


# The ones row of a partition broadcast is a constant: made once per program (core) and
# kept for the launch (`Program.ones_rows`), as a compiler materializes a constant once
# (assumed, L).


def _ones_row(m: int, dtype: Any) -> NkiTensor:
    cache = state.current().program.ones_rows
    key = (m, str(dtype))
    ones = cache.get(key)
    if ones is None:
        ones = cache[key] = _new((1, m), dtype, "broadcast_ones")
        memset(ones, 1.0)
    return ones


def broadcast_to(x: Any, shape: Any, dtype: Any = None) -> NkiTensor:
    """`nl.broadcast_to(x, shape)`: a new tile of `shape` (numpy rules, same rank).

    Free dims broadcast through a stride-0 read (`tensor_copy`). A partition dim of 1
    broadcasts through TensorE: a ones (1, P) stationary times the (1, F) row lands the
    row on every partition of PSUM (fp32, exact) -- "NKI invokes such matmul under the
    hood" (architecture guide, TensorE alternative use), "a separate instruction on
    TensorE" (fused Mamba tutorial). An fp32 result of at most one PSUM bank is that PSUM
    tile, read by its consumer directly (no VectorE copy); otherwise it is copied out to
    SBUF in <= 512 columns. A plain fp32 / bf16 row is the moving operand itself.
    """
    t = _tile(x, "x", "broadcast_to")
    if not t.buffer.on_chip:
        raise fail("NL_API", f"nl.broadcast_to: x must be in SBUF or PSUM; got {t.buffer!r}")
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else None
    if shape is None or len(shape) != t.ndim:
        raise fail(
            "NL_SHAPE", f"nl.broadcast_to: shape must have the rank of x {t.shape}; got {shape}"
        )
    for have, want in zip(t.shape, shape, strict=True):
        if have != want and have != 1:
            raise fail("NL_SHAPE", f"nl.broadcast_to: cannot broadcast {t.shape} to {shape}")
    out_dtype = t.dtype if dtype is None else dt.as_dtype(dtype)
    if shape == t.shape and out_dtype == t.dtype:
        return t
    view = t
    for d in range(1, t.ndim):
        if t.shape[d] != shape[d]:
            view = view.broadcast(d, shape[d])
    if shape[0] == t.shape[0]:
        out = _new(shape, out_dtype, "broadcast_to")
        tensor_copy(out, view)
        return out
    # partition broadcast 1 -> P through TensorE
    free = int(np.prod(shape[1:]))
    if view is t and t.buffer is sbuf and t.dtype in (dt.float32, dt.bfloat16) and t.ndim == 2:
        row = t
    else:
        row = _new((1, free), dt.float32, "broadcast_row")
        tensor_copy(row.reshape((1, *shape[1:])), view)
    ones = _ones_row(shape[0], row.dtype)
    if out_dtype == dt.float32 and free * 4 <= 2048 and len(shape) == 2:
        acc = _new(shape, dt.float32, "broadcast_psum", psum)
        nc_matmul(acc, ones, row)
        return acc
    out = _new(shape, out_dtype, "broadcast_to")
    flat_out = out.reshape((shape[0], free))
    for c0 in range(0, free, 512):
        n = min(512, free - c0)
        acc = _new((shape[0], n), dt.float32, "broadcast_psum", psum)
        nc_matmul(acc, ones, row[:, c0 : c0 + n])
        tensor_copy(flat_out[:, c0 : c0 + n], acc)
    return out


def install() -> None:
    """Make the op tokens callable (nl.add(x, y), nl.exp(x), nl.max(x, axis), ...)."""
    for o in ops.TOKENS.values():
        if o._call is not None or o in (ops.bypass, ops.average, ops.prelu):
            continue  # nl.copy is installed by language.py; average, prelu are tokens only
        if o.kind in ("binary", "bitvec") and o not in (ops.max_, ops.min_, ops.invert):
            o._call = _binary(o)
        elif o.is_unary or o is ops.invert:
            o._call = _unary(o)
    ops.max_._call = _max_reduce
    ops.min_._call = _min_reduce
    for o in ops.TOKENS.values():  # inspect.signature(nl.add) shows the call's parameters
        if o._call is not None:
            o.__signature__ = inspect.signature(o._call)  # type: ignore[attr-defined]


install()
