"""The experimental `nl` helpers the interpreter lowers to documented ISA instructions:
`nl.gather_flattened` (GpSimd `nc_n_gather`), `nl.load_transpose2d` (one DMA whose
access pattern reads the HBM tensor transposed), `nl.rms_norm` (ScalarE square with a
sum into the registers, VectorE scale and rsqrt, then the products), and the
`nl.MemoryRegion` constants (the nl buffer tokens are its values).

Semantics from the NKI 0.6 stubs (aws-neuron-sdk @ 81ce03ae, `nki/api/nki/language/`) and
the SDK's `nki/test/test_nki_nl_gather_flattened.py` (NumPy take_along_axis on the last
axis).
"""

from __future__ import annotations

from typing import Any

from . import dtypes as dt
from . import ops
from .enums import reduce_cmd
from .errors import fail
from .isa_activation import activation
from .isa_dma import dma_copy
from .isa_elementwise import tensor_scalar, tensor_tensor
from .isa_gather import nc_n_gather
from .tensor import Buffer, NkiTensor, allocate, private_hbm, psum, sbuf, shared_hbm


class _RegionMeta(type):
    def __instancecheck__(cls, x: Any) -> bool:
        return isinstance(x, Buffer)

    def __iter__(cls) -> Any:
        return iter((sbuf, psum, private_hbm, shared_hbm))


class MemoryRegion(metaclass=_RegionMeta):
    """`nl.MemoryRegion`: the memory region constants; `nl.sbuf`, `nl.psum`,
    `nl.private_hbm` (`nl.hbm`) and `nl.shared_hbm` are its values."""

    sbuf = sbuf
    psum = psum
    private_hbm = private_hbm
    shared_hbm = shared_hbm


def _tile(x: Any, arg: str, fn: str) -> NkiTensor:
    if not isinstance(x, NkiTensor):
        raise fail("NL_API", f"nl.{fn}: {arg} must be a tile; got {type(x).__name__}")
    return x


def gather_flattened(
    data: NkiTensor, indices: NkiTensor, axis: int = 0, dtype: Any = None
) -> NkiTensor:
    """A new SBUF tile: out[p, j] = data[p].flatten()[indices[p, j]] (nisa.nc_n_gather;
    uint32 indices). Only the documented form, axis=0, is supported."""
    fn = "gather_flattened"
    _tile(data, "data", fn)
    _tile(indices, "indices", fn)
    if axis != 0:
        raise fail(
            "NL_API", f"nl.{fn}: only axis=0 (the documented form) is supported; got {axis!r}"
        )
    out_dtype = data.dtype if dtype is None else dt.as_dtype(dtype, "dtype")
    out = allocate(indices.shape, data.dtype, sbuf, fn)
    nc_n_gather(dst=out, data=data, indices=indices)
    if out_dtype == data.dtype:
        return out
    cast = allocate(indices.shape, out_dtype, sbuf, fn)
    tensor_scalar(cast, out, ops.multiply, 1.0)
    return cast


def load_transpose2d(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """A new SBUF tile holding the 2-D HBM tensor `src` transposed: one DMA reading src
    with a transposed access pattern."""
    fn = "load_transpose2d"
    _tile(src, "src", fn)
    if src.buffer.on_chip:
        raise fail("BUF", f"nl.{fn}: src must be an HBM tensor; got {src.buffer!r}")
    if src.ndim != 2:
        raise fail("NL_API", f"nl.{fn}: src must be 2-D; got {src.shape}")
    rows, cols = src.shape
    out = allocate((cols, rows), src.dtype if dtype is None else dtype, sbuf, fn)
    s_row, s_col = src.strides
    dma_copy(out, src.ap(pattern=[[s_col, cols], [s_row, rows]], offset=0))
    return out


def rms_norm(
    x: NkiTensor,
    w: NkiTensor,
    axis: Any,
    n: int,
    epsilon: float = 1e-06,
    dtype: Any = None,
    compute_dtype: Any = None,
) -> NkiTensor:
    """A new SBUF tile: x / sqrt(sum(x^2 along the free axis) / n + epsilon) * w.

    `x` and `w` are 2-D tiles of one shape (the nl layer does not broadcast) and `axis`
    is the free axis (1 or -1); intermediates are `compute_dtype` (default fp32)."""
    fn = "rms_norm"
    _tile(x, "x", fn)
    _tile(w, "w", fn)
    if x.ndim != 2 or axis not in (1, -1):
        raise fail(
            "NL_API",
            f"nl.{fn}: x must be a 2-D tile and axis its free axis 1; got "
            f"x {x.shape}, axis={axis!r}",
        )
    if w.shape != x.shape:
        raise fail("NL_SHAPE", f"nl.{fn}: w {w.shape} and x {x.shape} differ (no broadcasting)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise fail("NL_API", f"nl.{fn}: n must be a positive int; got {n!r}")
    p, f = x.shape
    cdt = dt.float32 if compute_dtype is None else dt.as_dtype(compute_dtype, "compute_dtype")
    sq = allocate((p, f), cdt, sbuf, fn)
    total = allocate((p, 1), dt.float32, sbuf, fn)
    activation(
        sq, ops.square, x, reduce_op=ops.add, reduce_res=total, reduce_cmd=reduce_cmd.reset_reduce
    )
    inv = allocate((p, 1), dt.float32, sbuf, fn)
    tensor_scalar(inv, total, ops.multiply, 1.0 / n, op1=ops.add, operand1=float(epsilon))
    tensor_scalar(inv, inv, ops.rsqrt, None)
    scaled = allocate((p, f), cdt, sbuf, fn)
    tensor_scalar(scaled, x, ops.multiply, inv)
    out = allocate((p, f), x.dtype if dtype is None else dtype, sbuf, fn)
    tensor_tensor(out, scaled, w, ops.multiply)
    return out


__all__ = ["MemoryRegion", "gather_flattened", "load_transpose2d", "rms_norm"]
