"""Cross-partition instructions nki-library uses: `nc_stream_shuffle` (VectorE, within
32-partition quadrants) and `nonzero_with_count` (GpSimd, one partition per core)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import emit, instruction, int_arg, need_version, on_chip, read, write
from .errors import fail
from .state import current
from .tensor import NkiTensor, sbuf

QUADRANT = 32
KEEP = 255  # shuffle_mask value: leave that destination partition unmodified
GPSIMD_CORE_PARTITIONS = 16  # each GpSimd core reaches 16 partitions; it uses the 0-th


def _start_ok(start: int, active: int) -> bool:
    allowed = {128: (0,), 96: (0,), 64: (0, 64), 32: (0, 32, 64, 96)}[active]
    return start in allowed


@instruction
def nc_stream_shuffle(
    dst: NkiTensor, src: NkiTensor, shuffle_mask: Any, name: str | None = None
) -> Any:
    """dst partition i of each quadrant <- src partition shuffle_mask[i] (255: unmodified)."""
    instr = "nc_stream_shuffle"
    on_chip(dst, "dst", instr)
    on_chip(src, "src", instr)
    if dst.dtype != src.dtype:
        raise fail("DTYPE", f"{instr}: dst and src need one dtype; got {dst.dtype}, {src.dtype}")
    if dst.free_size != src.free_size:
        raise fail(
            "FREE",
            f"{instr}: dst and src hold different elements per partition "
            f"({dst.free_size}, {src.free_size})",
        )
    mask = list(shuffle_mask) if isinstance(shuffle_mask, (list, tuple)) else None
    if mask is None or len(mask) != QUADRANT:
        raise fail("ARG", f"{instr}: shuffle_mask must be a list of 32 ints; got {shuffle_mask!r}")
    mask = [int_arg(m, "shuffle_mask element", instr, 0, 255) for m in mask]
    if any(m >= QUADRANT and m != KEEP for m in mask):
        raise fail("ARG", f"{instr}: shuffle_mask elements are 0..31 or 255; got {mask}")
    p_src, p_dst = src.shape[0], dst.shape[0]
    active = -(-max(p_src, p_dst) // QUADRANT) * QUADRANT
    s0, d0 = src.region()[2], dst.region()[2]
    for arg, start in (("src", s0), ("dst", d0)):
        if not _start_ok(start, active):
            raise fail(
                "PART",
                f"{instr}: {arg} starts at partition {start}, not allowed with {active} "
                "active partitions (128/96: 0; 64: 0 or 64; 32: 0, 32, 64 or 96)",
            )
    ins = emit("vector", instr, (dst,), (src,), max(p_src, p_dst), dst.free_size, name=name)
    if current().trace_only:
        return ins
    values = read(src).reshape(p_src, -1)
    out = read(dst).reshape(p_dst, -1).copy()
    for i in range(p_dst):
        m = mask[i % QUADRANT]
        if m == KEEP:
            continue
        j = i - i % QUADRANT + m
        if j >= p_src:
            raise fail(
                "PART",
                f"{instr}: dst partition {i} copies src partition {j}, but src has {p_src}",
            )
        out[i] = values[j]
    write(dst, out.reshape(dst.shape))
    return ins


@instruction
def nonzero_with_count(
    dst: NkiTensor,
    src: NkiTensor,
    index_offset: int = 0,
    padding_val: int = -1,
    name: str | None = None,
) -> Any:
    """On partitions 0, 16, ..., 112: the indices (+ index_offset) of src's nonzero
    elements, then padding_val, then their count; other partitions are untouched."""
    instr = "nonzero_with_count"
    need_version(3, f"nisa.{instr}")
    on_chip(dst, "dst", instr, sbuf_only=True)
    on_chip(src, "src", instr, sbuf_only=True)
    assert dst.buffer is sbuf
    if src.dtype not in (dt.float32, dt.int32):
        raise fail("DTYPE", f"{instr}: src must be float32 or int32; got {src.dtype}")
    if dst.dtype != dt.int32:
        raise fail("DTYPE", f"{instr}: dst must be int32; got {dst.dtype}")
    if dst.shape[0] != src.shape[0]:
        raise fail(
            "PART", f"{instr}: dst and src partitions differ ({dst.shape[0]}, {src.shape[0]})"
        )
    n = src.free_size
    if dst.free_size != n + 1:
        raise fail(
            "FREE",
            f"{instr}: dst must hold one more element per partition than src ({n} + 1); "
            f"got {dst.free_size}",
        )
    off = int_arg(index_offset, "index_offset", instr)
    pad = int_arg(padding_val, "padding_val", instr)
    p = src.shape[0]
    ins = emit("gpsimd", instr, (dst,), (src,), p, n, name=name)
    if current().trace_only:
        return ins
    # the GpSimd core c serves physical partitions [16c, 16c + 16) and uses the first
    p0 = src.region()[2]
    values = read(src).reshape(p, n)
    out = read(dst).reshape(p, n + 1).copy()
    for i in range(p):
        if (p0 + i) % GPSIMD_CORE_PARTITIONS:
            continue
        idx = np.flatnonzero(values[i] != 0)
        row = np.full(n + 1, pad, dtype=np.int64)
        row[: idx.size] = idx + off
        row[n] = idx.size
        out[i] = row
    write(dst, out.reshape(dst.shape))
    return ins
