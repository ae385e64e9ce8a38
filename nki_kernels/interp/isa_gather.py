"""GpSimd data movement inside SBUF: `nc_n_gather`, `local_gather`, `sequence_bounds`.

Semantics from the NKI 0.6 stubs (aws-neuron-sdk @ 81ce03ae, `nki/api/nki/isa/`) and, for
`local_gather` and `sequence_bounds`, the NumPy equivalents of the SDK's tests
(`nki/test/test_nki_isa_local_gather.py`, `test_nki_isa_sequence_bounds.py`). GpSimd
cannot reach PSUM, so every operand lives in SBUF; gathers copy elements bit-exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import emit, instruction, int_arg, no_psum_on_gpsimd, on_chip, read, write
from .errors import fail
from .state import current
from .tensor import NkiTensor

GPSIMD_CORE_PARTITIONS = 16  # each of the 8 GpSimd cores serves 16 contiguous partitions
LOCAL_GATHER_ELEMS = (1, 2, 4, 8, 16, 32)  # num_elem_per_idx values local_gather accepts
LOCAL_GATHER_MAX_INDICES = 4096  # indices per GpSimd core
NC_N_GATHER_GROUP = 512  # one underlying instruction per 512 elements per partition


def _sbuf(t: Any, arg: str, instr: str) -> NkiTensor:
    no_psum_on_gpsimd("gpsimd", instr, **{arg: t})
    return on_chip(t, arg, instr, sbuf_only=True)


@instruction
def nc_n_gather(
    dst: NkiTensor, data: NkiTensor, indices: NkiTensor, name: str | None = None
) -> Any:
    """GpSimd: within each partition, dst[p, j] = data[p, :].flatten()[indices[p, j]].

    `indices` is uint32 in [0, elements per partition of data); dst has data's dtype and
    as many elements per partition as indices.
    """
    instr = "nc_n_gather"
    for arg, t in (("dst", dst), ("data", data), ("indices", indices)):
        _sbuf(t, arg, instr)
    p = data.shape[0]
    if dst.shape[0] != p or indices.shape[0] != p:
        raise fail(
            "PART",
            f"{instr}: dst, data and indices need one partition count; got {dst.shape[0]}, "
            f"{p}, {indices.shape[0]}",
        )
    if dst.dtype != data.dtype:
        raise fail("DTYPE", f"{instr}: dst must have data's dtype {data.dtype}; got {dst.dtype}")
    if indices.dtype != dt.uint32:
        raise fail("DTYPE", f"{instr}: indices must be uint32; got {indices.dtype}")
    n_out = indices.free_size
    if dst.free_size != n_out:
        raise fail(
            "FREE",
            f"{instr}: dst holds {dst.free_size} elements per partition, indices {n_out}",
        )
    groups = -(-n_out // NC_N_GATHER_GROUP)
    ins = emit(
        "gpsimd", instr, (dst,), (data, indices), p, n_out, attrs={"groups": groups}, name=name
    )
    if current().trace_only:
        return ins
    per = data.free_size
    idx = read(indices).reshape(p, n_out).astype(np.int64)
    bad = (idx < 0) | (idx >= per)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise fail(
            "IDX",
            f"{instr}: index {int(idx[row, col])} (partition {int(row)}) outside "
            f"[0, {per}) elements per partition of '{data.name}'",
        )
    src = read(data).reshape(p, per)
    write(dst, np.take_along_axis(src, idx, axis=1).reshape(dst.shape))
    return ins


@instruction
def local_gather(
    dst: NkiTensor,
    src_buffer: NkiTensor,
    index: NkiTensor,
    num_elem_per_idx: int = 1,
    num_valid_indices: int | None = None,
    name: str | None = None,
) -> Any:
    """GpSimd: each 16-partition group gathers with its own indices.

    The group's `index` slice is flattened partition-first (column by column); its first
    `num_valid_indices` values are element offsets into each partition's flattened
    `src_buffer`, and every partition p of the group writes, for each index i,
    `num_elem_per_idx` elements src_buffer[p].flatten()[i : i + num_elem_per_idx] to dst
    (the NumPy equivalent of the SDK's local_gather test). index is uint16.
    """
    instr = "local_gather"
    for arg, t in (("dst", dst), ("src_buffer", src_buffer), ("index", index)):
        _sbuf(t, arg, instr)
    p = src_buffer.shape[0]
    if index.shape[0] != p or p % GPSIMD_CORE_PARTITIONS:
        raise fail(
            "PART",
            f"{instr}: src_buffer and index need one partition count, a multiple of 16; got "
            f"{p} and {index.shape[0]}",
        )
    if dst.shape[0] != p:
        raise fail("PART", f"{instr}: dst has {dst.shape[0]} partitions, src_buffer {p}")
    if index.dtype != dt.uint16:
        raise fail("DTYPE", f"{instr}: index must be uint16; got {index.dtype}")
    if dst.dtype != src_buffer.dtype:
        raise fail(
            "DTYPE",
            f"{instr}: dst must keep src_buffer's dtype {src_buffer.dtype}; got {dst.dtype}",
        )
    k = int_arg(num_elem_per_idx, "num_elem_per_idx", instr)
    if k not in LOCAL_GATHER_ELEMS:
        raise fail("ARG", f"{instr}: num_elem_per_idx must be one of {LOCAL_GATHER_ELEMS}; got {k}")
    per_core = GPSIMD_CORE_PARTITIONS * index.free_size
    valid = (
        per_core
        if num_valid_indices is None
        else int_arg(num_valid_indices, "num_valid_indices", instr, 1)
    )
    if valid > per_core:
        raise fail(
            "ARG",
            f"{instr}: num_valid_indices {valid} exceeds the {per_core} indices of a "
            "16-partition index slice",
        )
    if valid > LOCAL_GATHER_MAX_INDICES:
        raise fail(
            "ARG", f"{instr}: at most {LOCAL_GATHER_MAX_INDICES} indices per core; got {valid}"
        )
    if dst.free_size != valid * k:
        raise fail(
            "FREE",
            f"{instr}: dst needs {valid} x {k} = {valid * k} elements per partition; got "
            f"{dst.free_size}",
        )
    ins = emit(
        "gpsimd",
        instr,
        (dst,),
        (src_buffer, index),
        p,
        valid * k,
        attrs={"num_elem_per_idx": k},
        name=name,
    )
    if current().trace_only:
        return ins
    per = src_buffer.free_size
    src = read(src_buffer).reshape(p, per)
    idx = read(index).reshape(p, index.free_size).astype(np.int64)
    out = np.empty((p, valid * k), dtype=src.dtype)
    for c in range(0, p, GPSIMD_CORE_PARTITIONS):
        flat = idx[c : c + GPSIMD_CORE_PARTITIONS].flatten(order="F")[:valid]
        cols = (flat[:, None] + np.arange(k)[None, :]).reshape(-1)
        if cols.size and (cols.min() < 0 or cols.max() >= per):
            # the docs: out-of-bound access is undefined on the chip
            raise fail("IDX", f"{instr}: an index of partitions {c}..{c + 15} reads past {per}")
        out[c : c + GPSIMD_CORE_PARTITIONS] = src[c : c + GPSIMD_CORE_PARTITIONS][:, cols]
    write(dst, out.reshape(dst.shape))
    return ins


@instruction
def sequence_bounds(dst: NkiTensor, segment_ids: NkiTensor, name: str | None = None) -> Any:
    """GpSimd: for each element of `segment_ids` (1, n), the [start, end) bounds of the run
    of equal ids it belongs to, as dst (1, 2, n); padding (id 0) gets start n, end -1."""
    instr = "sequence_bounds"
    _sbuf(dst, "dst", instr)
    _sbuf(segment_ids, "segment_ids", instr)
    if segment_ids.shape[0] != 1 or dst.shape[0] != 1:
        raise fail(
            "PART",
            f"{instr}: the partition dim must be 1; got segment_ids {segment_ids.shape}, "
            f"dst {dst.shape}",
        )
    for arg, t in (("dst", dst), ("segment_ids", segment_ids)):
        if t.dtype not in (dt.float32, dt.int32):
            raise fail("DTYPE", f"{instr}: {arg} must be float32 or int32; got {t.dtype}")
    n = segment_ids.free_size
    if dst.free_size != 2 * n:
        raise fail(
            "FREE", f"{instr}: dst needs 2 x {n} elements (shape (1, 2, {n})); got {dst.shape}"
        )
    ins = emit("gpsimd", instr, (dst,), (segment_ids,), 1, n, name=name)
    if current().trace_only:
        return ins
    ids = dt.to_f32(read(segment_ids)).reshape(n)
    if (ids < 0).any():
        raise fail("ARG", f"{instr}: segment ids must be non-negative; got {float(ids.min())}")
    start = np.empty(n, np.float64)
    end = np.empty(n, np.float64)
    for i in range(n):
        start[i] = n if ids[i] == 0 else (start[i - 1] if i and ids[i] == ids[i - 1] else i)
    for i in range(n - 1, -1, -1):
        last = i == n - 1
        end[i] = -1 if ids[i] == 0 else (end[i + 1] if not last and ids[i] == ids[i + 1] else i + 1)
    write(dst, np.stack([start, end]).astype(np.float32).reshape(dst.shape))
    return ins
