"""MX (OCP microscaling) instructions of NeuronCore-v4: `quantize_mx` and `nc_matmul_mx`.

From the NKI 0.6 API reference (`nki.isa.quantize_mx`, `nki.isa.nc_matmul_mx`) and the
Trainium3 architecture guide (MX sections):

- A scaling group is 32 values: 8 partitions x the 4 values one packed `*_x4` element
  holds. Its scale is an E8M0 exponent code s (uint8 or float8_e8m0fnu), worth 2^(s-127).
- Scales live in the SBUF quadrant (32 partitions) of their group: group g of a tile
  (its partitions 8g..8g+7) has its scales on partition (g // 4) * 32 + g % 4 of the
  scale view, so 4 partitions per quadrant hold scales; a scale view may start at offset
  0, 4, 8 or 12 within its quadrant (packing up to four tiles' scales in one tile).
- `quantize_mx` (VectorE): X = 2^(floor(log2 amax) - (E_max - 1)) per group, E_max 8 for
  float8_e4m3fn and 15 for float8_e5m2 (twice the OCP sample algorithm's scale, NKI 0.5+);
  an all-zero group gets X = 2^-127. dst = src / X, rounded to nearest-even. It writes
  only its groups' scale slots. Throughput: 4 input elements per partition per cycle.
- `nc_matmul_mx` (TensorE): contraction over the partitions and the 4 lanes of each
  element (K = 4 x partitions, up to 512), dequantized by both scales, fp32 accumulation
  in PSUM; 4x the bf16 matmul's throughput, i.e. a bf16 matmul's cycles for N moving
  columns. Row tiling only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import emit, instruction, need_version, on_chip, read, write
from .errors import fail, not_supported
from .isa_tensor import _accumulate_psum
from .state import current
from .tensor import NkiTensor, psum
from .trace import Instr

_QUANT_SRC = frozenset({dt.float16, dt.bfloat16})
_QUANT_DST = frozenset({dt.float8_e4m3fn_x4, dt.float8_e5m2_x4})
_SCALE = frozenset({dt.uint8, dt.float8_e8m0fnu})
_MM_DST = frozenset({dt.float32, dt.bfloat16})
# E_max: the largest unbiased exponent of the element type (nki.isa.quantize_mx)
_E_MAX = {dt.float8_e4m3fn_x4: 8, dt.float8_e5m2_x4: 15}
QUADRANT = 32
GROUP_P = 8  # partitions per scaling group
SCALES_PER_QUADRANT = QUADRANT // GROUP_P
SCALE_OFFSETS = (0, 4, 8, 12)  # where a scale view may start within its quadrant


def _dtype_in(t: NkiTensor, allowed: frozenset[dt.NkiDtype], arg: str, instr: str) -> None:
    if t.dtype not in allowed:
        names = ", ".join(sorted(str(d) for d in allowed))
        raise fail("DTYPE", f"{instr}: {arg} dtype must be one of {names}; got {t.dtype}")


def _no_indirect(instr: str, **operands: NkiTensor) -> None:
    for arg, t in operands.items():
        if t.indirect is not None:
            raise not_supported(f"{instr} with an indirect {arg}", "MX tensor indirection")


def _mx_partitions(p: int, arg: str, instr: str) -> None:
    if p % QUADRANT or p > 128:
        raise fail(
            "MX_SHAPE",
            f"{instr}: the partition dim of {arg} must be a multiple of 32 and at most 128; "
            f"got {p}",
        )


def scale_rows(p: int) -> np.ndarray:
    """Partitions (relative to the scale view) holding the scales of a p-partition tile."""
    g = np.arange(p // GROUP_P)
    return (g // SCALES_PER_QUADRANT) * QUADRANT + g % SCALES_PER_QUADRANT


def _check_scale(scale: NkiTensor, data: NkiTensor, free: int, arg: str, instr: str) -> None:
    """The scale view holds every group's slot, inside the group's quadrant (MX_SCALE)."""
    p = data.shape[0]
    need = int(scale_rows(p)[-1]) + 1
    if scale.shape[0] < need or scale.free_size < free:
        raise fail(
            "MX_SCALE",
            f"{instr}: {arg} {scale.shape} must span >= {need} partitions and >= {free} "
            f"elements per partition for a {p}-partition tile",
        )
    s0, d0 = scale.region()[2], data.region()[2]
    if s0 % QUADRANT not in SCALE_OFFSETS:
        raise fail(
            "MX_SCALE",
            f"{instr}: {arg} starts at partition {s0}, offset {s0 % QUADRANT} in its quadrant; "
            f"scales start at offset {SCALE_OFFSETS} of a quadrant",
        )
    rows = s0 + scale_rows(p)
    groups = d0 + GROUP_P * np.arange(p // GROUP_P)
    bad = np.nonzero(rows // QUADRANT != groups // QUADRANT)[0]
    if bad.size:
        g = int(bad[0])
        raise fail(
            "MX_SCALE",
            f"{instr}: the scale of group {g} (partitions {groups[g]}..{groups[g] + 7}) would sit "
            f"on partition {rows[g]}, outside the group's SBUF quadrant",
        )


def _scale_codes(scale: NkiTensor, p: int, free: int) -> np.ndarray:
    """The E8M0 codes [p // 8, free] a p-partition tile uses, from its scale view."""
    codes = read(scale).view(np.uint8).reshape(scale.shape[0], -1)
    return codes[scale_rows(p), :free]


def _e8m0(codes: np.ndarray) -> np.ndarray:
    """2^(s - 127) per code; 0xFF is E8M0's NaN."""
    v = np.ldexp(np.float32(1.0), codes.astype(np.int32) - 127).astype(np.float32)
    return np.where(codes == 0xFF, np.float32(np.nan), v)


def _scale_shift() -> int:
    """1 for NKI 0.5+'s block scale (2x the OCP sample algorithm's), 0 for the OCP one
    (`settings(mx_scale="pre-0.5")`)."""
    return 0 if current().mx_scale == "pre-0.5" else 1


@instruction
def quantize_mx(
    dst: NkiTensor, src: NkiTensor, dst_scale: NkiTensor, name: str | None = None
) -> Instr | None:
    """Quantize fp16/bf16 `src` [P, 4F] to MXFP8 `dst` [P, F] (x4) and its E8M0 scales."""
    instr = "quantize_mx"
    need_version(4, "nisa.quantize_mx")
    for arg, t in (("dst", dst), ("src", src), ("dst_scale", dst_scale)):
        on_chip(t, arg, instr, sbuf_only=True)
    _no_indirect(instr, dst=dst, src=src, dst_scale=dst_scale)
    _dtype_in(src, _QUANT_SRC, "src", instr)
    _dtype_in(dst, _QUANT_DST, "dst", instr)
    _dtype_in(dst_scale, _SCALE, "dst_scale", instr)
    p, fs = src.shape[0], src.free_size
    _mx_partitions(p, "src", instr)
    if fs % 4:
        raise fail("MX_SHAPE", f"{instr}: src free size {fs} must be a multiple of 4")
    if dst.shape[0] != p or dst.free_size * 4 != fs:
        raise fail(
            "MX_SHAPE",
            f"{instr}: dst {dst.shape} must have {p} partitions and {fs // 4} (src free size / "
            f"4) elements per partition for src {src.shape}",
        )
    fd = fs // 4
    _check_scale(dst_scale, src, fd, "dst_scale", instr)
    ins = emit(
        "vector",
        "quantize_mx",
        (dst, dst_scale),
        (src,),
        p,
        fs,
        attrs={"mx": True},
        name=name,
    )
    if current().trace_only:
        return ins
    x = dt.to_f32(read(src)).reshape(p // GROUP_P, GROUP_P, fd, 4)
    with np.errstate(all="ignore"):
        amax = np.abs(x).max(axis=(1, 3))  # [groups, fd]
    exp = np.frexp(amax)[1].astype(np.int32) - 1  # floor(log2 amax) for amax > 0
    code = np.clip(exp - (_E_MAX[dst.dtype] - _scale_shift()) + 127, 0, 254)
    code = np.where(amax == 0, 0, code)
    code = np.where(np.isfinite(amax), code, 0xFF).astype(np.uint8)
    block_scale = _e8m0(code)  # X per group
    q = x / block_scale[:, None, :, None]
    write(dst, dt.pack_x4(q.reshape(p, fs), dst.dtype).reshape(dst.shape))
    su8 = dst_scale.view(dt.uint8)
    cur = read(su8).reshape(dst_scale.shape[0], -1).copy()
    cur[scale_rows(p), :fd] = code
    write(su8, cur.reshape(su8.shape))
    return ins


def _tiling(position: Any, size: Any, k: int) -> tuple[int, int, int, int] | None:
    """(start_row, 0, row_size, 128) of a row-tiled launch; None without tiling."""
    if not position and not size:
        return None
    if not position or not size:
        raise fail("ARG", "nc_matmul_mx: tile_position and tile_size must be given together")
    size, position = tuple(size), tuple(position)
    if len(size) != 2 or size[0] not in (32, 64, 128) or size[1] != 128:
        raise fail(
            "ARG", f"nc_matmul_mx: tile_size must be (32 | 64 | 128, 128) (row tiling); got {size}"
        )
    if (
        len(position) != 2
        or position[1] != 0
        or position[0] < 0
        or position[0] % size[0]
        or position[0] + size[0] > 128
    ):
        raise fail(
            "ARG",
            f"nc_matmul_mx: tile_position {position} must be (a multiple of {size[0]}, 0) "
            "inside the 128-row array",
        )
    if k > size[0]:
        raise fail("MM_K", f"nc_matmul_mx: stationary partitions {k} exceed the tile's {size[0]}")
    return int(position[0]), 0, int(size[0]), 128


def _dequantized(data: NkiTensor, scale: NkiTensor) -> np.ndarray:
    """fp32 [4K, F] values of an x4 tile times their group scales, rows ordered (k, lane)."""
    k, f = data.shape[0], data.free_size
    vals = dt.unpack_x4(read(data).reshape(k, f), data.dtype).reshape(k, f, 4)
    sc = _e8m0(_scale_codes(scale, k, f))  # [k // 8, f]
    vals = vals * np.repeat(sc, GROUP_P, axis=0)[:, :, None]
    return np.ascontiguousarray(vals.transpose(0, 2, 1)).reshape(4 * k, f)


@instruction
def nc_matmul_mx(
    dst: NkiTensor,
    stationary: NkiTensor,
    moving: NkiTensor,
    stationary_scale: NkiTensor,
    moving_scale: NkiTensor,
    tile_position: Any = None,
    tile_size: Any = None,
    accumulate: bool | None = None,
    name: str | None = None,
) -> Instr | None:
    """dst[M, N] (PSUM) (+)= dequant(stationary)[4K, M].T @ dequant(moving)[4K, N]."""
    instr = "nc_matmul_mx"
    need_version(4, "nisa.nc_matmul_mx")
    for arg, t in (
        ("stationary", stationary),
        ("moving", moving),
        ("stationary_scale", stationary_scale),
        ("moving_scale", moving_scale),
    ):
        on_chip(t, arg, instr, sbuf_only=True)
        _dtype_in(t, dt.PACKED_MX_DTYPES if "scale" not in arg else _SCALE, arg, instr)
    on_chip(dst, "dst", instr)
    if dst._st.buffer is not psum:
        raise fail("BUF", f"{instr}: dst must be in PSUM; got {dst.buffer!r} ('{dst.name}')")
    _no_indirect(
        instr, dst=dst, stationary=stationary, moving=moving,
        stationary_scale=stationary_scale, moving_scale=moving_scale,
    )  # fmt: skip
    _dtype_in(dst, _MM_DST, "dst", instr)
    if accumulate is not None and not isinstance(accumulate, (bool, np.bool_)):
        raise fail("ARG", f"{instr}: accumulate must be None, True or False; got {accumulate!r}")
    k = stationary.shape[0]
    if moving.shape[0] != k:
        raise fail(
            "PART",
            f"{instr}: stationary and moving use different partition counts ({k}, "
            f"{moving.shape[0]})",
        )
    _mx_partitions(k, "stationary", instr)
    tile = _tiling(tile_position, tile_size, k)
    m, n = stationary.free_size, moving.free_size
    if m % 2 or m > 128:
        raise fail("MM_M", f"{instr}: stationary free size M={m} must be even and at most 128")
    target = current().target
    n_max = target.matmul_n_max_bf16 if dst.dtype == dt.bfloat16 else target.matmul_n_max_fp32
    if n > n_max:
        raise fail("MM_N", f"{instr}: moving free size N={n} exceeds {n_max} for {dst.dtype} dst")
    if dst.shape[0] != m or dst.free_size != n:
        raise fail(
            "MM_SHAPE",
            f"{instr}: dst {dst.shape} must be [M={m}, N={n}] for stationary {stationary.shape} "
            f"and moving {moving.shape}",
        )
    _check_scale(stationary_scale, stationary, m, "stationary_scale", instr)
    _check_scale(moving_scale, moving, n, "moving_scale", instr)
    kk = 4 * k
    attrs = {"K": kk, "M": m, "N": n, "fp32": False, "mx": True, "accumulate": accumulate}
    if tile is not None and tile[2] < 128:
        attrs["pe_tile"] = tile  # the PE-array rows it occupies (perfmodel/pe_tiles.py)
    ins = emit(
        "tensor",
        "nc_matmul_mx",
        (dst,),
        (stationary, moving, stationary_scale, moving_scale),
        k,
        n,
        flops=2 * kk * m * n,
        attrs=attrs,
        name=name,
    )
    launch = current()
    if launch.trace_only:
        return ins
    s = _dequantized(stationary, stationary_scale)
    mv = _dequantized(moving, moving_scale)
    _accumulate_psum(dst, s, mv, accumulate, launch)
    return ins
