"""`nki.language` (nl) as the interpreter implements it.

Buffers, dtypes, allocation, `nl.ds`, program ids, loops, `nl.tile_size`, the op tokens,
`nl.load` / `nl.store` / `nl.copy` and the experimental `nl` compute wrappers (which
allocate a new SBUF tile and issue the matching ISA instruction).
"""

from __future__ import annotations

import builtins
import os
from typing import Any

import numpy as np

from . import dtypes as _dt
from . import ops as _ops
from .errors import fail as _fail
from .errors import unsupported_getattr as _unsupported_getattr
from .ops import (  # noqa: F401 - re-exported op tokens
    abs,
    abs_max,
    abs_min,
    add,
    arctan,
    average,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    bypass,
    ceil,
    copy,
    cos,
    divide,
    equal,
    erf,
    erf_dx,
    exp,
    floor,
    gelu,
    gelu_apprx_sigmoid,
    gelu_apprx_sigmoid_dx,
    gelu_apprx_tanh,
    gelu_dx,
    greater,
    greater_equal,
    identity,
    invert,
    left_shift,
    less,
    less_equal,
    log,
    logical_and,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    mish,
    multiply,
    negative,
    not_equal,
    power,
    prelu,
    reciprocal,
    relu,
    right_shift,
    rsqrt,
    sigmoid,
    sign,
    silu,
    silu_dx,
    sin,
    softplus,
    sqrt,
    square,
    subtract,
    tanh,
)
from .ops import max_ as max  # noqa: F401 - nl.max token and reduction
from .ops import min_ as min  # noqa: F401 - nl.min token and reduction
from .state import current as _current
from .tensor import (  # noqa: F401 - re-exported
    Buffer,
    NkiTensor,
    hbm,
    private_hbm,
    psum,
    sbuf,
    shared_hbm,
)
from .tensor import allocate as _allocate

ndarray_type = NkiTensor

# ---- dtypes ---------------------------------------------------------------------------
bool_ = _dt.bool_
int8, int16, int32 = _dt.int8, _dt.int16, _dt.int32
uint8, uint16, uint32 = _dt.uint8, _dt.uint16, _dt.uint32
float16, bfloat16, float32, tfloat32 = _dt.float16, _dt.bfloat16, _dt.float32, _dt.tfloat32
float8_e4m3, float8_e5m2 = _dt.float8_e4m3, _dt.float8_e5m2
float8_e4m3fn, float8_e8m0fnu = _dt.float8_e4m3fn, _dt.float8_e8m0fnu

# Most negative fp32: the masked value of attention kernels and range_select.
fp32_min = float(np.finfo(np.float32).min)


# ---- buffers -------------------------------------------------------------------------
def is_sbuf(buffer: Any) -> bool:
    """Whether `buffer` is nl.sbuf."""
    return buffer is sbuf


def is_psum(buffer: Any) -> bool:
    """Whether `buffer` is nl.psum."""
    return buffer is psum


def is_hbm(buffer: Any) -> bool:
    """Whether `buffer` is an HBM buffer (nl.hbm / private_hbm or nl.shared_hbm)."""
    return buffer is hbm or buffer is shared_hbm


def is_on_chip(buffer: Any) -> bool:
    """Whether `buffer` is SBUF or PSUM."""
    return isinstance(buffer, Buffer) and buffer.on_chip


# ---- allocation -----------------------------------------------------------------------
def ndarray(
    shape: Any, dtype: Any, buffer: Buffer = sbuf, name: str = "", address: Any = None
) -> NkiTensor:
    """Allocate an uninitialized tensor (the interpreter fills it with NaN / a sentinel).

    `address=(partition_offset, byte_offset)` places an SBUF / PSUM tile there (offset
    0 partitions only); such placements may overlap, and must fit."""
    return _allocate(shape, dtype, buffer, name, address=address)


def _filled(shape: Any, value: Any, dtype: Any, buffer: Buffer, name: str) -> NkiTensor:
    from . import isa_elementwise

    if isinstance(value, (bool, np.bool_)) or not isinstance(
        value, (int, float, np.integer, np.floating)
    ):
        raise _fail("ARG", f"fill value: expected a number; got {value!r}")
    t = _allocate(shape, dtype, buffer, name)
    if buffer.on_chip:
        v = int(value) if _dt.is_int(t.dtype) else float(value)
        isa_elementwise.memset(t, v)
    elif not _current().trace_only:
        data = t.storage.data
        assert data is not None
        data[...] = _dt.cast(np.full(data.shape, value, dtype=np.float64), t.dtype)
    return t


def zeros(shape: Any, dtype: Any, buffer: Buffer = sbuf, name: str = "") -> NkiTensor:
    """A new tensor filled with 0 (on chip: a memset instruction)."""
    return _filled(shape, 0, dtype, buffer, name)


def ones(shape: Any, dtype: Any, buffer: Buffer = sbuf, name: str = "") -> NkiTensor:
    """A new tensor filled with 1 (on chip: a memset instruction)."""
    return _filled(shape, 1, dtype, buffer, name)


def full(
    shape: Any, fill_value: Any, dtype: Any, buffer: Buffer = sbuf, name: str = ""
) -> NkiTensor:
    """A new tensor filled with `fill_value` (on chip: a memset instruction)."""
    return _filled(shape, fill_value, dtype, buffer, name)


def zeros_like(
    x: NkiTensor, dtype: Any = None, buffer: Buffer | None = None, name: str = ""
) -> NkiTensor:
    """`nl.zeros` with `x`'s shape, and its dtype / buffer unless given."""
    return zeros(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def ones_like(
    a: NkiTensor, dtype: Any = None, buffer: Buffer | None = None, name: str = ""
) -> NkiTensor:
    """`nl.ones` with `a`'s shape, and its dtype / buffer unless given."""
    return ones(a.shape, dtype or a.dtype, buffer or a.buffer, name)


def empty_like(
    x: NkiTensor, dtype: Any = None, buffer: Buffer | None = None, name: str = ""
) -> NkiTensor:
    """`nl.ndarray` with `x`'s shape, and its dtype / buffer unless given."""
    return ndarray(x.shape, dtype or x.dtype, buffer or x.buffer, name)


def shared_constant(constant: Any) -> NkiTensor:
    """A constant array placed in shared HBM: a NumPy array or the path of a `.npy` file."""
    if isinstance(constant, (str, os.PathLike)):
        path = os.fspath(constant)
        if not path.endswith(".npy") or not os.path.isfile(path):
            raise _fail(
                "ARG",
                f"shared_constant: expected an array or the path of a .npy file; got {path!r}",
            )
        arr = np.load(path, allow_pickle=False)
    else:
        arr = np.asarray(constant)
    d = _dt.as_dtype(arr.dtype, "shared_constant dtype")
    t = _allocate(arr.shape or (1,), d, shared_hbm, "const", data=None)
    if not _current().trace_only:
        data = t.storage.data
        assert data is not None
        data[...] = arr.reshape(-1)
    return t


def shared_identity_matrix(n: int, dtype: Any = uint8, dst: NkiTensor | None = None) -> NkiTensor:
    """An n x n identity matrix in SBUF (for PE transposes), written into `dst` if given.

    `dst` must be an (n, n) SBUF view; its dtype is used and `dtype` is then ignored.
    """
    from .engine import write

    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise _fail("ARG", f"shared_identity_matrix: n must be a positive int; got {n!r}")
    if dst is None:
        t = _allocate((int(n), int(n)), dtype, sbuf, "identity")
    elif not isinstance(dst, NkiTensor) or dst.buffer is not sbuf or dst.indirect is not None:
        raise _fail("BUF", f"shared_identity_matrix: dst must be a direct SBUF view; got {dst!r}")
    elif dst.shape != (n, n):
        raise _fail(
            "ARG", f"shared_identity_matrix: dst must have shape ({n}, {n}); got {dst.shape}"
        )
    else:
        t = dst
    if not _current().trace_only:
        write(t, np.eye(int(n), dtype=np.float32))
    return t


def ds(start: int, size: int) -> slice:
    """`nl.ds(start, size)`: the slice start:start+size."""
    if not isinstance(start, (int, np.integer)) or not isinstance(size, (int, np.integer)):
        raise _fail("IDX", f"nl.ds(start, size) takes ints; got ({start!r}, {size!r})")
    return slice(int(start), int(start) + int(size))


# ---- launch grid ----------------------------------------------------------------------
def program_id(axis: int = 0) -> int:
    """This program's index on launch axis 0 (0 or 1 under LNC2)."""
    if axis != 0:
        raise _fail("LAUNCH", f"program_id: only axis 0 exists; got {axis}")
    return _current().program_id


def num_programs(axes: int = 0) -> int:
    """Number of programs on launch axis 0 (the LNC size)."""
    if axes != 0:
        raise _fail("LAUNCH", f"num_programs: only axis 0 exists; got {axes}")
    return _current().lnc


def program_ndim() -> int:
    """1 for a `kernel[lnc](...)` launch, 0 for a plain call."""
    return 1 if _current().grid else 0


# ---- loops (all unrolled at specialization) -------------------------------------------
def affine_range(start: int, stop: int | None = None, step: int = 1) -> builtins.range:
    """Deprecated alias of `range`."""
    r = builtins.range
    return r(start, stop, step) if stop is not None else r(start)


# Loop aliases of earlier NKI releases that nki-library still calls (all plain ranges).
sequential_range = affine_range
static_range = affine_range  # `nl.range` too: set at the end of the module


def device_print(print_prefix: str, tensor: Any) -> None:
    """Print `print_prefix` and the tensor's values (numeric mode) or `tensor` itself."""
    from .engine import read

    if isinstance(tensor, NkiTensor) and not _current().trace_only:
        print(print_prefix, read(tensor))
    else:
        print(print_prefix, tensor)


# ---- tile sizes ---------------------------------------------------------------------
class _TileSize:
    """`nl.tile_size`: hardware tile limits of the current target."""

    pmax = 128
    psum_bank_fmax = 512
    psum_fmax = 512  # deprecated name
    psum_bank_fmax_bytes = 2048
    psum_num_banks = 8
    gemm_stationary_fmax = 128
    gemm_moving_fmax = 512
    bn_stats_fmax = 512
    # the NKI front end's values (leanprover/KLR @ 7ccd18c, KLR/Trace.lean); the
    # interpreter's allocator places tiles more coarsely (interp/memory.py)
    psum_min_align = 4
    sbuf_min_align = 1

    @staticmethod
    def _target() -> Any:
        from ..targets import get_target
        from .state import active

        launch = active()
        return launch.target if launch is not None else get_target()

    @property
    def sbuf_size_bytes(self) -> int:
        t = self._target()
        return int(t.sbuf_bytes_per_partition * t.partitions)

    @property
    def sbuf_fmax_bytes(self) -> int:
        return int(self._target().sbuf_usable_bytes)

    @property
    def sbuf_fmax(self) -> int:
        return int(self._target().sbuf_usable_bytes)

    @property
    def total_available_sbuf_size(self) -> int:
        return int(self._target().sbuf_usable_bytes)


tile_size = _TileSize()


# ---- load / store / copy ---------------------------------------------------------------
def load(src: NkiTensor, dtype: Any = None) -> NkiTensor:
    """A new SBUF tile holding `src` (dim 0 becomes the partition dim)."""
    from .engine import tensor_arg
    from .isa_dma import dma_copy

    tensor_arg(src, "src", "nl.load")
    shape = src.shape if src.ndim >= 2 else (1, *src.shape) if src.ndim == 1 else (1, 1)
    t = _allocate(shape, dtype if dtype is not None else src.dtype, sbuf, "load")
    dma_copy(t, src)
    return t


def store(dst: NkiTensor, value: NkiTensor) -> None:
    """Write an SBUF tile to HBM (a PSUM value is not allowed)."""
    from .engine import tensor_arg
    from .isa_dma import dma_copy

    tensor_arg(dst, "dst", "nl.store")
    tensor_arg(value, "value", "nl.store")
    if value.buffer is psum:
        raise _fail("DMA_PSUM", "nl.store: value is in PSUM; copy it to SBUF first")
    dma_copy(dst, value)


def _copy_call(x: NkiTensor, dtype: Any = None) -> NkiTensor:
    """`nl.copy(x)`: a new SBUF tile (VectorE tensor_copy), from SBUF or PSUM."""
    from .engine import tensor_arg
    from .isa_elementwise import tensor_copy

    tensor_arg(x, "x", "nl.copy")
    t = _allocate(x.shape, dtype if dtype is not None else x.dtype, sbuf, "copy")
    tensor_copy(t, x)
    return t


_ops.copy._call = _copy_call


# ---- device loops (loops.py) ------------------------------------------------------------
from .loops import dynamic_range, fori_loop, no_reorder, while_loop  # noqa: E402, F401

# ---- NKIObject, packed MX dtypes ---------------------------------------------------------
from .nkiobject import NKIObject  # noqa: E402, F401

# ---- the experimental nl compute layer (nl_compute.py; makes the op tokens callable) -----
from .nl_compute import all_ as all  # noqa: E402, F401
from .nl_compute import (  # noqa: E402, F401
    broadcast_to,
    expand_dims,
    logical_not,
    matmul,
    mean,
    prod,
    softmax,
    transpose,
    var,
    where,
)
from .nl_compute import sum_ as sum  # noqa: E402, F401
from .nl_data import MemoryRegion, gather_flattened, load_transpose2d, rms_norm  # noqa: E402, F401

DType = str  # NKI 0.6 `DType = str`: every nl dtype is an NkiDtype (a str subclass)
# Packed MX dtypes (4 values per element; NC-v4 quantize_mx / nc_matmul_mx operands)
float8_e5m2_x4 = _dt.float8_e5m2_x4
float8_e4m3fn_x4 = _dt.float8_e4m3fn_x4
float4_e2m1fn_x4 = _dt.float4_e2m1fn_x4

# tan / trunc / fmod / mod: the nl layer lowers each call to ISA instructions so that it is
# traced and priced; these four have no documented instruction to lower to
_NO_LOWERING = (
    "no ISA lowering is documented: it is neither an activation function nor an ALU operator"
)
NOT_SUPPORTED: dict[str, str] = {
    "tan": _NO_LOWERING,
    "trunc": _NO_LOWERING,
    "fmod": _NO_LOWERING,
    "mod": _NO_LOWERING,
    "dropout": "random numbers are not modeled",
    "random_seed": "random numbers are not modeled",
    "rand": "random numbers are not modeled",
}

__getattr__ = _unsupported_getattr("nki.language", NOT_SUPPORTED)

# `nl.range` (legacy loop alias nki-library's mxfp_load_utils calls), bound last: code
# in this module that runs later must use builtins.range.
range = affine_range
