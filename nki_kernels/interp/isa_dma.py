"""DMA instructions: `dma_copy` (direct and indirect) and `dma_transpose`."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import addresses, emit, instruction, need_version, read, tensor_arg, write
from .enums import dge_mode as dge_mode_enum
from .enums import dma_engine as dma_engine_enum
from .enums import engine as engine_enum
from .enums import oob_mode as oob_mode_enum
from .errors import fail
from .state import current
from .tensor import NkiTensor, psum


def contiguous_run(t: NkiTensor) -> int:
    """Elements in the longest trailing row-major-contiguous run of a view.

    On-chip views never run across the partition dim: each partition row is at least
    one DMA descriptor.
    """
    dims = list(zip(t.shape, t.strides))
    if t.on_chip:
        dims = dims[1:]
    run = 1
    for n, s in reversed(dims):
        if n == 1:
            continue
        if s == run:
            run *= n
        else:
            break
    return max(run, 1)


def _dma_attrs(dst: NkiTensor, src: NkiTensor, nelem: int, dge: Any, queue: str) -> dict[str, Any]:
    run = min(contiguous_run(dst), contiguous_run(src))
    # indirect rows are contiguous only within the gathered row
    if src.indirect is not None or dst.indirect is not None:
        run = min(run, max(1, dst.shape[-1] if dst.ndim else 1))
    isz = max(dst.dtype.itemsize, src.dtype.itemsize)
    chip = dst if dst.on_chip else src if src.on_chip else None
    return {
        "descriptors": max(1, -(-nelem // run)),
        "descriptor_bytes": run * isz,
        "partitions": chip.shape[0] if chip is not None else 0,
        "src_space": src.buffer.name,
        "dst_space": dst.buffer.name,
        "indirect": src.indirect is not None or dst.indirect is not None,
        "dge": dge.name,
        "queue": queue,
    }


@instruction
def dma_copy(
    dst: NkiTensor,
    src: NkiTensor,
    priority: Any = None,
    oob_mode: oob_mode_enum = oob_mode_enum.error,
    dge_mode: dge_mode_enum = dge_mode_enum.unknown,
    engine: engine_enum = engine_enum.unknown,
    name: str | None = None,
) -> Any:
    """Copy between HBM and SBUF (any direction); values go src -> fp32 -> dst."""
    tensor_arg(dst, "dst", "dma_copy")
    tensor_arg(src, "src", "dma_copy")
    for arg, t in (("dst", dst), ("src", src)):
        if t.buffer is psum:
            raise fail("DMA_PSUM", f"dma_copy: {arg} '{t.name}' is in PSUM; DMA cannot access PSUM")
        if t.on_chip and t.shape[0] > current().target.partitions:
            raise fail("TC1", f"dma_copy: partition dim {t.shape[0]} of {arg} exceeds 128")
    if not isinstance(oob_mode, oob_mode_enum):
        raise fail("ARG", f"dma_copy: oob_mode must be an nisa.oob_mode member; got {oob_mode!r}")
    if not isinstance(dge_mode, dge_mode_enum):
        raise fail("ARG", f"dma_copy: dge_mode must be an nisa.dge_mode member; got {dge_mode!r}")
    if not isinstance(engine, (engine_enum, dma_engine_enum)):
        raise fail("ARG", f"dma_copy: engine must be an nisa.engine member; got {engine!r}")
    if dst.size != src.size:
        raise fail(
            "DMA_COUNT",
            f"dma_copy: dst {dst.shape} holds {dst.size} elements but src {src.shape} holds "
            f"{src.size}",
        )
    if dge_mode is dge_mode_enum.hwdge:
        need_version(3, "hardware DGE (dge_mode.hwdge)")
        if dst.dtype != src.dtype:
            raise fail(
                "DTYPE",
                f"dma_copy with dge_mode.hwdge needs equal dtypes; got dst {dst.dtype.name}, "
                f"src {src.dtype.name} (use .view())",
            )
    launch = current()
    queue = "gpsimd" if engine is dma_engine_enum.gpsimd_dma or engine is engine_enum.gpsimd else "sync"
    chip = dst if dst.on_chip else src if src.on_chip else dst
    emit(
        "dma",
        "dma_copy",
        (dst,),
        (src,),
        chip.shape[0] if chip.on_chip else 1,
        chip.free_size if chip.on_chip else dst.size,
        nbytes=dst.size * dst.dtype.itemsize,
        attrs=_dma_attrs(dst, src, dst.size, dge_mode, queue),
        name=name,
    )
    if launch.trace_only or dst.size == 0:
        return None
    skip = oob_mode is oob_mode_enum.skip
    vals = read(src, oob_skip=skip)
    if src.dtype != dst.dtype and dt.is_float(src.dtype):
        vals = dt.to_f32(vals)  # DMA casts go src -> fp32 -> dst
    mask = None
    if src.indirect is not None and skip:
        mask = addresses(src)[1].reshape(dst.shape)
    if dst.indirect is not None and not skip and not addresses(dst)[1].all():
        raise fail("DMA_OOB", f"dma_copy: indirect write to '{dst.name}' out of range")
    write(dst, vals.reshape(dst.shape), mask=mask)
    return None


_TRANSPOSE_AXES = {(1, 0), (2, 1, 0), (3, 1, 2, 0)}


@instruction
def dma_transpose(
    dst: NkiTensor,
    src: NkiTensor,
    axes: tuple[int, ...] | None = None,
    dge_mode: dge_mode_enum = dge_mode_enum.unknown,
    name: str | None = None,
) -> Any:
    """Transpose through the DMA engines; 2-byte elements only."""
    tensor_arg(dst, "dst", "dma_transpose")
    tensor_arg(src, "src", "dma_transpose")
    for arg, t in (("dst", dst), ("src", src)):
        if t.buffer is psum:
            raise fail("DMA_PSUM", f"dma_transpose: {arg} is in PSUM; DMA cannot access PSUM")
    axes = tuple(axes) if axes is not None else tuple(reversed(range(src.ndim)))
    if axes not in _TRANSPOSE_AXES:
        raise fail(
            "TRANSPOSE",
            f"dma_transpose: axes {axes} not supported (supported: (1,0), (2,1,0), (3,1,2,0))",
        )
    if len(axes) != src.ndim or dst.ndim != src.ndim:
        raise fail("TRANSPOSE", f"dma_transpose: axes {axes} do not match src rank {src.ndim}")
    want = tuple(src.shape[a] for a in axes)
    if dst.shape != want:
        raise fail("TRANSPOSE", f"dma_transpose: dst shape {dst.shape} must be {want}")
    if src.dtype.itemsize != 2 or dst.dtype != src.dtype:
        raise fail(
            "DTYPE",
            f"dma_transpose needs matching 2-byte dtypes; got src {src.dtype.name}, "
            f"dst {dst.dtype.name}",
        )
    chip = dst if dst.on_chip else src
    attrs = _dma_attrs(dst, src, dst.size, dge_mode, "sync")
    attrs["descriptors"] = dst.size  # element-granular: every element is its own access
    attrs["descriptor_bytes"] = 2
    attrs["transpose"] = True
    emit(
        "dma",
        "dma_transpose",
        (dst,),
        (src,),
        chip.shape[0],
        chip.free_size,
        nbytes=dst.size * 2,
        attrs=attrs,
        name=name,
    )
    if current().trace_only:
        return None
    write(dst, np.transpose(read(src), axes))
    return None
