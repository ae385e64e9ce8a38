"""A stand-in for AWS's `neuron_dtypes` package, which nki-library's test helpers and
torch references import (`static_cast`, `sizeinbytes`, `finfo`, `is_float_type`,
`bfloat16`) and which is published only on the Neuron pip repository.

Written here from how those call sites use it: `static_cast(array, dtype)` converts
with round-to-nearest-even (through `ml_dtypes` for bf16 / fp8) and, for integer
targets, rounds and saturates, as NKI's fp32 -> int conversion does. The packed MX x4
dtypes are names only (their casts name themselves as unsupported). The conformance
loader installs it as `neuron_dtypes` only when the real package is not importable.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from ..interp.errors import not_supported

bfloat16 = ml_dtypes.bfloat16
float8_e4m3 = ml_dtypes.float8_e4m3
float8_e4m3fn = ml_dtypes.float8_e4m3fn
float8_e5m2 = ml_dtypes.float8_e5m2
float8_e8m0fnu = ml_dtypes.float8_e8m0fnu
float8_e5m2_x4 = "float8_e5m2_x4"
float8_e4m3fn_x4 = "float8_e4m3fn_x4"
float4_e2m1fn_x4 = "float4_e2m1fn_x4"
_PACKED = {float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4}


def _np(dtype: Any) -> np.dtype:
    if isinstance(dtype, str) and dtype in _PACKED:
        raise not_supported(f"neuron_dtypes {dtype}", "packed MX dtypes are not modeled")
    return np.dtype(dtype)


def static_cast(values: Any, dtype: Any) -> np.ndarray:
    """`values` converted to `dtype`: floats round to nearest-even; integers round to
    nearest-even and saturate."""
    d = _np(dtype)
    a = np.asarray(values)
    if d.kind in "iu":
        info = np.iinfo(d)
        v = np.rint(a.astype(np.float64)) if a.dtype.kind not in "iub" else a.astype(np.int64)
        v = np.nan_to_num(v, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(v, info.min, info.max).astype(d)
    if a.dtype != np.float32 and a.dtype.kind != "f":
        a = a.astype(np.float32)
    return a.astype(d)


def sizeinbytes(dtype: Any) -> int:
    """Bytes per element of `dtype`."""
    return int(_np(dtype).itemsize)


def finfo(dtype: Any) -> Any:
    """`ml_dtypes.finfo` (NumPy's for the IEEE types)."""
    return ml_dtypes.finfo(_np(dtype))


def is_float_type(dtype: Any) -> bool:
    """Whether `dtype` is a floating-point type (bf16 and fp8 included)."""
    d = _np(dtype)
    return d.kind == "f" or d in (
        np.dtype(bfloat16),
        np.dtype(float8_e4m3),
        np.dtype(float8_e4m3fn),
        np.dtype(float8_e5m2),
        np.dtype(float8_e8m0fnu),
    )
