"""DMA instructions: `dma_copy` (direct and indirect) and `dma_transpose`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .engine import addresses, emit, instruction, need_version, read, tensor_arg, write
from .enums import dge_mode as dge_mode_enum
from .enums import engine as engine_enum
from .enums import oob_mode as oob_mode_enum
from .errors import fail
from .state import current
from .tensor import NkiTensor, psum, sbuf
from .trace import Instr

_DGE_NAMES = {m: m.name for m in dge_mode_enum}
_prod = math.prod


def contiguous_run(t: NkiTensor) -> int:
    """Elements in the longest trailing row-major-contiguous run of a view.

    On-chip views never run across the partition dim: each partition row is at least
    one DMA descriptor.
    """
    shape, strides = t.shape, t.strides
    first = 1 if t._st.buffer.on_chip else 0
    run = 1
    for i in range(len(shape) - 1, first - 1, -1):
        n = shape[i]
        if n == 1:
            continue
        if strides[i] == run:
            run *= n
        else:
            break
    return run


def _dma_attrs(dst: NkiTensor, src: NkiTensor, nelem: int, dge: Any, queue: str) -> dict[str, Any]:
    run = min(contiguous_run(dst), contiguous_run(src))
    indirect = src.indirect is not None or dst.indirect is not None
    if indirect:  # indirect rows are contiguous only within the gathered row
        run = min(run, max(1, dst.shape[-1]))
    isz = max(dst.dtype._size, src.dtype._size)
    dbuf, sbuf_ = dst._st.buffer, src._st.buffer
    chip = dst if dbuf.on_chip else src if sbuf_.on_chip else None
    return {
        "descriptors": max(1, -(-nelem // run)),
        "descriptor_bytes": run * isz,
        "partitions": chip.shape[0] if chip is not None else 0,
        "src_space": sbuf_.name,
        "dst_space": dbuf.name,
        "indirect": indirect,
        "dge": _DGE_NAMES[dge],
        "queue": queue,
    }


def _no_psum(instr: str, **operands: NkiTensor) -> None:
    for arg, t in operands.items():
        if t._st.buffer is psum:
            raise fail("DMA_PSUM", f"{instr}: {arg} '{t.name}' is in PSUM; DMA cannot access PSUM")
        if t._st.buffer.on_chip and t.shape[0] > current().target.partitions:
            raise fail("TC1", f"{instr}: partition dim {t.shape[0]} of {arg} exceeds 128")


def _dge(dge_mode: Any, instr: str) -> dge_mode_enum:
    """The dge_mode member; its raw value (0..3) is accepted too, as nki-library passes
    `dge_mode=3` (none) in many places and the compiler takes it."""
    if not isinstance(dge_mode, dge_mode_enum):
        values = {m.value: m for m in dge_mode_enum}
        if type(dge_mode) is not int or dge_mode not in values:
            raise fail(
                "ARG",
                f"{instr}: dge_mode must be an nisa.dge_mode member or its value 0..3; "
                f"got {dge_mode!r}",
            )
        dge_mode = values[dge_mode]
    if dge_mode is dge_mode_enum.hwdge:
        need_version(3, f"{instr}(dge_mode=hwdge)")
    return dge_mode


@instruction
def dma_copy(
    dst: NkiTensor,
    src: NkiTensor,
    priority: Any = None,
    oob_mode: oob_mode_enum = oob_mode_enum.error,
    dge_mode: dge_mode_enum = dge_mode_enum.unknown,
    engine: engine_enum = engine_enum.unknown,
    name: str | None = None,
) -> Instr | None:
    """Copy between HBM and SBUF (any direction); values go src -> fp32 -> dst.

    Indirect views (`.ap(vector_offset=...)` / `.ap(scalar_offset=...)`) gather or
    scatter rows; `oob_mode.skip` leaves the destination of out-of-bounds rows untouched.
    """
    if type(dst) is not NkiTensor or type(src) is not NkiTensor:
        tensor_arg(dst, "dst", "dma_copy")
        tensor_arg(src, "src", "dma_copy")
    dbuf, sbuf_ = dst._st.buffer, src._st.buffer
    if dbuf.on_chip or sbuf_.on_chip:
        _no_psum("dma_copy", dst=dst, src=src)
    if oob_mode is not oob_mode_enum.error and oob_mode is not oob_mode_enum.skip:
        raise fail("ARG", f"dma_copy: oob_mode must be an nisa.oob_mode member; got {oob_mode!r}")
    if dge_mode is not dge_mode_enum.unknown:
        dge_mode = _dge(dge_mode, "dma_copy")
    if engine is not engine_enum.unknown:
        if engine is not engine_enum.sync and engine is not engine_enum.scalar:
            raise fail(
                "ENGINE",
                f"dma_copy: engine {engine!r} cannot issue DMAs (engine.sync or engine.scalar)",
            )
        if dge_mode is not dge_mode_enum.hwdge:
            raise fail("ARG", "dma_copy: engine= is only valid with dge_mode=nisa.dge_mode.hwdge")
    if priority is not None:
        need_version(4, "dma_copy(priority=...)")
        if priority not in (0, 1, 2, 3):
            raise fail("ARG", f"dma_copy: priority must be 0..3; got {priority!r}")
    dsize, ssize = _prod(dst.shape), _prod(src.shape)
    if dsize != ssize:
        raise fail(
            "DMA_COUNT",
            f"dma_copy: dst {dst.shape} holds {dsize} elements but src {src.shape} holds {ssize}",
        )
    if dge_mode is dge_mode_enum.hwdge and dst.dtype != src.dtype:
        raise fail(
            "DTYPE",
            f"dma_copy with dge_mode.hwdge needs equal dtypes; got dst {dst.dtype}, "
            f"src {src.dtype} (use .view())",
        )
    launch = current()
    # software DGE generates descriptors on GpSimd; hardware DGE on the issuing engine
    queue = (
        "gpsimd"
        if dge_mode is dge_mode_enum.swdge
        else "scalar"
        if engine is engine_enum.scalar
        else "sync"
    )
    chip = dst if dbuf.on_chip else src if sbuf_.on_chip else None
    ins = emit(
        "dma",
        "dma_copy",
        (dst,),
        (src,),
        chip.shape[0] if chip is not None else 1,
        chip.free_size if chip is not None else dsize,
        nbytes=dsize * dst.dtype._size,
        attrs=_dma_attrs(dst, src, dsize, dge_mode, queue),
        name=name,
    )
    if launch.trace_only or dsize == 0:
        return ins
    skip = oob_mode is oob_mode_enum.skip
    vals = read(src, oob_skip=skip)
    if src.dtype != dst.dtype:
        vals = vals.astype(np.float32)  # DMA casts go src -> fp32 -> dst
    mask = None
    if src.indirect is not None and skip:
        mask = addresses(src)[1].reshape(dst.shape)
    if dst.indirect is not None and not skip:
        valid = addresses(dst)[1]
        if not valid.all():
            raise fail(
                "DMA_OOB",
                f"dma_copy: indirect write to '{dst.name}' out of bounds; pass "
                "oob_mode=nisa.oob_mode.skip to skip it",
            )
    write(dst, vals.reshape(dst.shape), mask=mask)
    return ins


_TRANSPOSE_AXES = {(1, 0), (2, 1, 0), (3, 1, 2, 0)}


@instruction
def dma_transpose(
    dst: NkiTensor,
    src: NkiTensor,
    axes: tuple[int, ...] | None = None,
    priority: Any = None,
    dge_mode: dge_mode_enum = dge_mode_enum.unknown,
    oob_mode: oob_mode_enum = oob_mode_enum.error,
    name: str | None = None,
) -> Instr | None:
    """Transpose through the DMA engines into SBUF (HBM -> SBUF or SBUF -> SBUF).

    Elements are 2 bytes, or 4 bytes on NC-v3+ for direct transposes without hwdge.

    The permutation is (1,0) for 2-D, (2,1,0) for 3-D and (3,1,2,0) for 4-D sources. An
    indirect source (`.ap(vector_offset=...)` on HBM) gathers its rows first.
    """
    instr = "dma_transpose"
    tensor_arg(dst, "dst", instr)
    tensor_arg(src, "src", instr)
    _no_psum(instr, dst=dst, src=src)
    if dst._st.buffer is not sbuf:
        raise fail("BUF", f"{instr}: dst must be in SBUF; got {dst.buffer!r} ('{dst.name}')")
    dge_mode = _dge(dge_mode, instr)
    indirect = src.indirect is not None
    if dge_mode is dge_mode_enum.swdge and not indirect:
        raise fail("ARG", f"{instr}: dge_mode.swdge is for indirect sources only")
    # dge_mode.none (static descriptors, no DGE) is among the documented values of the
    # parameter and nki-library's mlp_tkg passes it (raw 3); an indirect source is gathered
    # by a DGE, so it needs unknown or swdge
    if dge_mode in (dge_mode_enum.hwdge, dge_mode_enum.none) and indirect:
        raise fail("ARG", f"{instr}: an indirect source needs dge_mode unknown or swdge")
    if not isinstance(oob_mode, oob_mode_enum):
        raise fail("ARG", f"{instr}: oob_mode must be an nisa.oob_mode member; got {oob_mode!r}")
    if oob_mode is oob_mode_enum.skip and not indirect:
        raise fail("ARG", f"{instr}: oob_mode.skip is only valid with an indirect source")
    if priority is not None:
        need_version(4, f"{instr}(priority=...)")
    default_axes = {2: (1, 0), 3: (2, 1, 0), 4: (3, 1, 2, 0)}.get(src.ndim)
    if axes is not None and not isinstance(axes, (tuple, list)):
        raise fail("ARG", f"{instr}: axes must be a tuple of ints such as (1, 0); got {axes!r}")
    axes = tuple(axes) if axes is not None else default_axes
    if axes not in _TRANSPOSE_AXES or len(axes) != src.ndim:
        raise fail(
            "TRANSPOSE",
            f"{instr}: axes {axes} not supported for a {src.ndim}-D source (supported: (1,0), "
            "(2,1,0), (3,1,2,0) for 2-D, 3-D, 4-D)",
        )
    assert axes is not None
    want = tuple(src.shape[a] for a in axes)
    if dst.shape != want:
        raise fail(
            "TRANSPOSE", f"{instr}: dst shape {dst.shape} must be {want} for src {src.shape}"
        )
    # 4-byte elements: trn2's DMA transposes them too (trainium2_arch), but not the hardware
    # DGE or indirect (gather) forms, and NC-v2 documents 2-byte transposes only
    wide = current().target.nc_version >= 3 and not indirect and dge_mode is not dge_mode_enum.hwdge
    if src.dtype._size not in ((2, 4) if wide else (2,)) or dst.dtype != src.dtype:
        sizes = "2- or 4-byte" if wide else "2-byte"
        raise fail(
            "DTYPE",
            f"{instr} needs matching {sizes} dtypes; got src {src.dtype}, dst {dst.dtype}",
        )
    if src.shape[-1] > 128 and (indirect or dge_mode is dge_mode_enum.hwdge):
        raise fail("TRANSPOSE", f"{instr}: src.shape[-1] {src.shape[-1]} exceeds 128")
    if dge_mode is dge_mode_enum.hwdge:
        s0 = src.shape[0]
        ok = (
            s0 == 16 if src.ndim == 2 else s0 in (1, 2, 4, 8, 16) and (s0 * src.shape[-2]) % 16 == 0
        )
        if not ok:
            raise fail("TRANSPOSE", f"{instr}(hwdge): src shape {src.shape} not supported")
    if indirect:
        need_version(3, f"indirect {instr}")
        _indirect_transpose_rules(instr, src)
    isz = src.dtype._size
    attrs = _dma_attrs(dst, src, dst.size, dge_mode, "sync")
    # the access pattern is element-granular; transposing hardware moves it in blocks of
    # the destination (the cost model prices from the shape: partitions, inner size, kind)
    attrs["descriptors"] = dst.size
    attrs["descriptor_bytes"] = isz
    attrs["transpose"] = "sbuf2sbuf" if src._st.buffer is sbuf else "hbm2sbuf"
    attrs["transpose_inner"] = dst.shape[-1]
    attrs["itemsize"] = isz
    ins = emit(
        "dma",
        instr,
        (dst,),
        (src,),
        dst.shape[0],
        dst.free_size,
        nbytes=dst.size * isz,
        attrs=attrs,
        name=name,
    )
    if current().trace_only:
        return ins
    vals = np.transpose(read(src, oob_skip=oob_mode is oob_mode_enum.skip), axes)
    mask = None
    if indirect and oob_mode is oob_mode_enum.skip:
        mask = np.transpose(addresses(src)[1], axes)
    write(dst, vals, mask=mask)
    return ins


def _indirect_transpose_rules(instr: str, src: NkiTensor) -> None:
    """The documented limits of an indirect (software-DGE gather) transpose
    (nki.isa.dma_transpose, "DMA Indirect Transpose Constraints")."""

    def bad(rule: str) -> Exception:
        return fail("TRANSPOSE", f"indirect {instr}: {rule} (src '{src.name}' {src.shape})")

    ind = src.indirect
    assert ind is not None
    s = src.shape
    if src._st.buffer is sbuf:
        raise bad("the src tensor must be on HBM; got SBUF")
    if src.ndim == 4 and s[1] != 1 and s[2] != 1:
        raise bad(f"a 4-D src needs dim 1 or dim 2 of size 1; got {s[1]} and {s[2]}")
    if s[0] % 16:
        raise bad(f"src.shape[0] must be divisible by 16; got {s[0]}")
    if ind.kind != "vector" or not isinstance(ind.index, NkiTensor):
        raise bad("needs a vector_offset index tensor")
    ix = ind.index
    if ix.ndim != 2:
        raise bad(f"indices must be 2-d; got shape {ix.shape}")
    if ix._st.buffer is not sbuf:
        raise bad(f"the indices tensor must be on SBUF; got {ix.buffer!r}")
    if ix.dtype != "uint32":
        raise bad(f"indices.dtype must be uint32; got {ix.dtype}")
    n, k = ix.shape
    if not (16 <= n <= 128 and n % 16 == 0):
        raise bad(f"indices.shape[0] must be in [16, 128] and divisible by 16; got {n}")
    if k > 1 and n != 128:
        raise bad(f"indices.shape[0] must be 128 when indices.shape[1] > 1; got {n} x {k}")
    if n * k < s[0]:
        raise bad(f"indices.shape[0] * indices.shape[1] must be >= src.shape[0]; got {n * k}")


@instruction
def dma_compute(
    dst: NkiTensor,
    srcs: Any,
    reduce_op: Any,
    scales: Any = None,
    unique_indices: bool = True,
    oob_mode: oob_mode_enum = oob_mode_enum.error,
    name: str | None = None,
) -> Instr | None:
    """dst = srcs[0] + srcs[1] + ... in fp32 inside the DMA engines (HBM or SBUF).

    As documented: `reduce_op` is `nl.add` only, every scale is 1.0, at most 16 sources
    of dst's element count. An indirect (`vector_offset`) source or dst makes it a
    read-modify-write gather / scatter (exactly two sources, unique indices).
    """
    from .ops import add

    instr = "dma_compute"
    tensor_arg(dst, "dst", instr)
    if not isinstance(srcs, (list, tuple)) or not 1 <= len(srcs) <= 16:
        raise fail("ARG", f"{instr}: srcs must be a list of 1..16 tensors; got {srcs!r}")
    for i, s in enumerate(srcs):
        tensor_arg(s, f"srcs[{i}]", instr)
    _no_psum(instr, dst=dst, **{f"srcs[{i}]": s for i, s in enumerate(srcs)})
    if reduce_op is not add:
        raise fail("OP", f"{instr}: reduce_op must be nl.add (the only one supported)")
    if scales is not None:
        if not isinstance(scales, (list, tuple)) or len(scales) != len(srcs):
            raise fail("ARG", f"{instr}: scales must be None or one 1.0 per source; got {scales}")
        if any(float(c) != 1.0 for c in scales):
            raise fail("ARG", f"{instr}: every scale must be 1.0; got {list(scales)}")
    if oob_mode is not oob_mode_enum.error and oob_mode is not oob_mode_enum.skip:
        raise fail("ARG", f"{instr}: oob_mode must be an nisa.oob_mode member; got {oob_mode!r}")
    indirect = dst.indirect is not None or any(s.indirect is not None for s in srcs)
    if indirect and (len(srcs) != 2 or unique_indices is not True):
        raise fail(
            "ARG",
            f"{instr}: a read-modify-write with vector_offset takes exactly 2 sources and "
            "unique_indices=True",
        )
    n = _prod(dst.shape)
    for i, s in enumerate(srcs):
        if _prod(s.shape) != n:
            raise fail(
                "DMA_COUNT",
                f"{instr}: srcs[{i}] {s.shape} holds {_prod(s.shape)} elements, dst {dst.shape} "
                f"holds {n}",
            )
    chip = dst if dst._st.buffer.on_chip else None
    ins = emit(
        "dma",
        instr,
        (dst,),
        tuple(srcs),
        chip.shape[0] if chip is not None else 1,
        chip.free_size if chip is not None else n,
        nbytes=n * dst.dtype._size * (len(srcs) + 1),
        attrs=_dma_attrs(dst, srcs[0], n, dge_mode_enum.unknown, "sync"),
        name=name,
    )
    if current().trace_only:
        return ins
    skip = oob_mode is oob_mode_enum.skip
    total = np.zeros(dst.shape, dtype=np.float32)
    for s in srcs:
        total += read(s, oob_skip=skip).astype(np.float32).reshape(dst.shape)
    write(dst, total)
    return ins
