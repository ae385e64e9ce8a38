"""NKI dtypes: strings compared by value, as in NKI 0.6, stored as NumPy dtypes inside.

The NKI 0.6 API declares `DType = str`: `nl.float32` is a dtype string and a tensor's
`.dtype` is "NKI dtype string (e.g. nl.float32)" (aws-neuron-sdk `nki/api/nki/language`),
and nki-library sizes dtypes by comparing their strings. Here every dtype is an
`NkiDtype`: a `str` subclass equal to (and hashing as) its name, which also carries the
NumPy dtype that stores its values. NumPy dtype attributes (`.itemsize`, `.name`,
`.kind`, ...) raise `DtypeAttributeError`, as they would on the compiler, where the
dtype is a plain string.

Engines compute in fp32 and round on every store: floats round to nearest-even through
`ml_dtypes`, and fp32 -> integer casts round to nearest-even and saturate (NKI 0.6).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import DtypeError, NkiValidationError, not_supported


class DtypeAttributeError(NkiValidationError, AttributeError):
    """A NumPy dtype attribute read on an NKI dtype, which is a string (rule DTYPE_STR)."""


class NkiDtype(str):
    """An NKI dtype: the string `name`, equal to and hashing as that string.

    `_np` is the NumPy dtype the interpreter stores the values in and `_size` its bytes;
    both are interpreter internals (kernels size dtypes by comparing them by value).
    """

    __slots__ = ("_np", "_size")
    _np: np.dtype
    _size: int

    def __new__(cls, name: str, np_dtype: Any) -> NkiDtype:
        self = super().__new__(cls, name)
        self._np = np.dtype(np_dtype)
        self._size = self._np.itemsize
        return self

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_by_name, (str(self),))

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise DtypeAttributeError(
            "DTYPE_STR",
            f"dtype {str(self)!r} has no attribute {attr!r}: NKI dtypes are strings "
            f"(NKI 0.6 DType = str), not NumPy dtypes; compare dtypes by value, e.g. "
            f"dtype == nl.float32",
        )


def _by_name(name: str) -> NkiDtype:
    return _NAMES[name]


bool_ = NkiDtype("bool_", np.bool_)
int8 = NkiDtype("int8", np.int8)
int16 = NkiDtype("int16", np.int16)
int32 = NkiDtype("int32", np.int32)
uint8 = NkiDtype("uint8", np.uint8)
uint16 = NkiDtype("uint16", np.uint16)
uint32 = NkiDtype("uint32", np.uint32)
float16 = NkiDtype("float16", np.float16)
float32 = NkiDtype("float32", np.float32)
# tf32 is stored as fp32 here: the interpreter does not truncate tf32 mantissas, and a
# tensor allocated as tfloat32 reports float32.
tfloat32 = NkiDtype("tfloat32", np.float32)
bfloat16 = NkiDtype("bfloat16", ml_dtypes.bfloat16)
float8_e4m3 = NkiDtype("float8_e4m3", ml_dtypes.float8_e4m3)  # Trainium FP8 e4m3: max 240, has inf
float8_e5m2 = NkiDtype("float8_e5m2", ml_dtypes.float8_e5m2)
float8_e4m3fn = NkiDtype("float8_e4m3fn", ml_dtypes.float8_e4m3fn)  # OCP e4m3 (max 448), NC-v4
float8_e8m0fnu = NkiDtype("float8_e8m0fnu", ml_dtypes.float8_e8m0fnu)

FP8_DTYPES: frozenset[NkiDtype] = frozenset({float8_e4m3, float8_e5m2, float8_e4m3fn})
FLOAT_DTYPES: frozenset[NkiDtype] = (
    frozenset({float16, float32, bfloat16, float8_e8m0fnu}) | FP8_DTYPES
)
INT_DTYPES: frozenset[NkiDtype] = frozenset({int8, int16, int32, uint8, uint16, uint32, bool_})
ALL_DTYPES: frozenset[NkiDtype] = FLOAT_DTYPES | INT_DTYPES
# The same sets as NumPy dtypes, for arrays computed inside the engines.
_NP_FLOAT = frozenset({d._np for d in FLOAT_DTYPES})

# Integer sentinel the official simulator writes into fresh integer allocations.
INT_SENTINEL = 4

_FROM_NP: dict[np.dtype, NkiDtype] = {d._np: d for d in ALL_DTYPES}

_TORCH_NAMES = {
    "torch.float32": float32,
    "torch.float16": float16,
    "torch.bfloat16": bfloat16,
    "torch.int8": int8,
    "torch.int16": int16,
    "torch.int32": int32,
    "torch.uint8": uint8,
    "torch.uint16": uint16,
    "torch.uint32": uint32,
    "torch.bool": bool_,
    "torch.float8_e4m3fn": float8_e4m3fn,
    "torch.float8_e5m2": float8_e5m2,
    "torch.float8_e8m0fnu": float8_e8m0fnu,
}

# Names -> the dtype a tensor of that name holds (tfloat32 is held as float32).
_NAMES: dict[str, NkiDtype] = {str(d): d for d in ALL_DTYPES} | {
    "fp32": float32,
    "tfloat32": float32,
    "fp16": float16,
    "bf16": bfloat16,
    "fp8_e4m3": float8_e4m3,
    "bool": bool_,
}


# NC-v4 packed MX dtypes (4 values per 32 bits): known by name, not modeled.
PACKED_MX_DTYPES = frozenset({"float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4"})

_EXPECTED = "an NKI dtype (float32, bfloat16, float16, float8_*, (u)int8/16/32, bool)"


def as_dtype(dtype: Any, arg: str = "dtype") -> NkiDtype:
    """Normalize a dtype given as an nl dtype, its name, a NumPy or a torch dtype.

    Anything else raises `DtypeError` (rule DTYPE, also a TypeError) naming `arg`.
    """
    if isinstance(dtype, str):
        d = _NAMES.get(dtype)
        if d is not None:
            return d
        if dtype in PACKED_MX_DTYPES:
            raise not_supported(f"dtype {dtype}", "packed MX dtypes are not modeled")
        raise DtypeError("DTYPE", f"{arg}: expected {_EXPECTED}; got {dtype!r}")
    if isinstance(dtype, np.dtype):
        n = dtype
    elif str(dtype) in _TORCH_NAMES:
        return _TORCH_NAMES[str(dtype)]
    else:
        try:
            n = np.dtype(dtype)
        except TypeError:
            raise DtypeError("DTYPE", f"{arg}: expected {_EXPECTED}; got {dtype!r}") from None
    d = _FROM_NP.get(n)
    if d is None:
        raise DtypeError("DTYPE", f"{arg}: expected {_EXPECTED}; got {n.name}")
    return d


def np_dtype(dtype: Any) -> np.dtype:
    """The NumPy dtype that holds values of an NKI dtype (host code, tests)."""
    return as_dtype(dtype)._np


def itemsize(dtype: Any) -> int:
    """Bytes per element of an NKI dtype (host code: kernels compare dtypes by value)."""
    return as_dtype(dtype)._size


def is_float(dtype: NkiDtype) -> bool:
    """Whether `dtype` is a floating-point NKI dtype (fp8 included)."""
    return dtype in FLOAT_DTYPES


def is_int(dtype: NkiDtype) -> bool:
    """Whether `dtype` is an integer NKI dtype (bool included)."""
    return dtype in INT_DTYPES


def fresh_fill(dtype: NkiDtype) -> Any:
    """The value fresh allocations start with: NaN for floats, a sentinel for integers."""
    return np.nan if dtype in FLOAT_DTYPES else INT_SENTINEL


def cast(values: np.ndarray, dtype: NkiDtype) -> np.ndarray:
    """Convert engine results (fp32 or exact ints) to a stored dtype, as the hardware does."""
    nd = dtype._np
    vd = values.dtype
    if vd == nd:
        return values
    if dtype in FLOAT_DTYPES:
        if vd != np.float32:
            values = values.astype(np.float32)
        return values.astype(nd)
    if dtype == bool_:
        return values != 0
    if vd.kind == "f" or vd in _NP_FLOAT:
        info = np.iinfo(nd)
        v = np.rint(values.astype(np.float64))
        v = np.nan_to_num(v, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(v, info.min, info.max).astype(nd)
    info = np.iinfo(nd)
    return np.clip(values.astype(np.int64), info.min, info.max).astype(nd)


def to_f32(values: np.ndarray) -> np.ndarray:
    """Engine input conversion: every float operand is computed in fp32."""
    if values.dtype == np.float32:
        return values
    return values.astype(np.float32)
