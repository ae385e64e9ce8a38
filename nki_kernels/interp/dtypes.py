"""NKI dtypes as NumPy dtypes (bf16 and fp8 through ml_dtypes) and the casting rules.

Engines compute in fp32 and round on every store: floats round to nearest-even through
`ml_dtypes`, and fp32 -> integer casts round to nearest-even and saturate (NKI 0.6).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import DtypeError, not_supported

bool_ = np.dtype(np.bool_)
int8 = np.dtype(np.int8)
int16 = np.dtype(np.int16)
int32 = np.dtype(np.int32)
uint8 = np.dtype(np.uint8)
uint16 = np.dtype(np.uint16)
uint32 = np.dtype(np.uint32)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)
# tf32 is stored as fp32 here: the interpreter does not truncate tf32 mantissas.
tfloat32 = float32
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)  # Trainium FP8 e4m3: max 240, has inf
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)  # OCP e4m3 (max 448), NC-v4 only
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)

FP8_DTYPES: frozenset[np.dtype] = frozenset({float8_e4m3, float8_e5m2, float8_e4m3fn})
FLOAT_DTYPES: frozenset[np.dtype] = (
    frozenset({float16, float32, bfloat16, float8_e8m0fnu}) | FP8_DTYPES
)
INT_DTYPES: frozenset[np.dtype] = frozenset({int8, int16, int32, uint8, uint16, uint32, bool_})
ALL_DTYPES: frozenset[np.dtype] = FLOAT_DTYPES | INT_DTYPES

# Integer sentinel the official simulator writes into fresh integer allocations.
INT_SENTINEL = 4

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

_NAMES = {
    "float32": float32,
    "fp32": float32,
    "tfloat32": float32,
    "float16": float16,
    "fp16": float16,
    "bfloat16": bfloat16,
    "bf16": bfloat16,
    "float8_e4m3": float8_e4m3,
    "fp8_e4m3": float8_e4m3,
    "float8_e5m2": float8_e5m2,
    "float8_e4m3fn": float8_e4m3fn,
    "float8_e8m0fnu": float8_e8m0fnu,
    "int8": int8,
    "int16": int16,
    "int32": int32,
    "uint8": uint8,
    "uint16": uint16,
    "uint32": uint32,
    "bool": bool_,
    "bool_": bool_,
}


# NC-v4 packed MX dtypes (4 values per 32 bits): known by name, not modeled.
PACKED_MX_DTYPES = frozenset({"float8_e5m2_x4", "float8_e4m3fn_x4", "float4_e2m1fn_x4"})

_EXPECTED = "an NKI dtype (float32, bfloat16, float16, float8_*, (u)int8/16/32, bool)"


def as_dtype(dtype: Any, arg: str = "dtype") -> np.dtype:
    """Normalize a dtype given as an nl dtype, NumPy dtype, torch dtype or name.

    Anything else raises `DtypeError` (rule DTYPE, also a TypeError) naming `arg`.
    """
    if isinstance(dtype, np.dtype):
        d = dtype
    elif isinstance(dtype, str):
        if dtype in PACKED_MX_DTYPES:
            raise not_supported(f"dtype {dtype}", "packed MX dtypes are not modeled")
        if dtype not in _NAMES:
            raise DtypeError("DTYPE", f"{arg}: expected {_EXPECTED}; got {dtype!r}")
        d = _NAMES[dtype]
    elif str(dtype) in _TORCH_NAMES:
        d = _TORCH_NAMES[str(dtype)]
    else:
        try:
            d = np.dtype(dtype)
        except TypeError:
            raise DtypeError("DTYPE", f"{arg}: expected {_EXPECTED}; got {dtype!r}") from None
    if d not in ALL_DTYPES:
        raise DtypeError("DTYPE", f"{arg}: expected {_EXPECTED}; got {d.name}")
    return d


def is_float(dtype: np.dtype) -> bool:
    """Whether `dtype` is a floating-point NKI dtype (fp8 included)."""
    return dtype in FLOAT_DTYPES


def is_int(dtype: np.dtype) -> bool:
    """Whether `dtype` is an integer NKI dtype (bool included)."""
    return dtype in INT_DTYPES


def fresh_fill(dtype: np.dtype) -> Any:
    """The value fresh allocations start with: NaN for floats, a sentinel for integers."""
    return np.nan if is_float(dtype) else INT_SENTINEL


def cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Convert engine results (fp32 or exact ints) to a stored dtype, as the hardware does."""
    if values.dtype == dtype:
        return values
    if is_float(dtype):
        if values.dtype != float32:
            values = values.astype(np.float32)
        return values.astype(dtype)
    if dtype == bool_:
        return values != 0
    if values.dtype.kind == "f" or values.dtype in FLOAT_DTYPES:
        info = np.iinfo(dtype)
        v = np.rint(values.astype(np.float64))
        v = np.nan_to_num(v, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(v, info.min, info.max).astype(dtype)
    info = np.iinfo(dtype)
    return np.clip(values.astype(np.int64), info.min, info.max).astype(dtype)


def to_f32(values: np.ndarray) -> np.ndarray:
    """Engine input conversion: every float operand is computed in fp32."""
    if values.dtype == float32:
        return values
    return values.astype(np.float32)
