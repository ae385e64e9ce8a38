"""Bytes per element of an NKI dtype, by value.

On the compiler an NKI dtype is a string (NKI 0.6 `DType = str`) with no `.itemsize`;
the interpreter's dtypes are strings too (holding the NumPy dtype they are stored in). So the size
is found by comparing the dtype with the `nl` dtypes (`==`), which works for both and for
a plain dtype name. Kernels and host code use this one helper; it imports only the
`nki` seam, so any module may import it without a cycle.
"""

from __future__ import annotations

from typing import Any

from .nki import nl

# (bytes, names of `nki.language` dtypes); a name the backend lacks is skipped
# (float8_e4m3fn exists only for NeuronCore-v4 targets)
_SIZES = (
    (4, ("float32", "tfloat32", "int32", "uint32")),
    (2, ("bfloat16", "float16", "int16", "uint16")),
    (1, ("float8_e4m3", "float8_e5m2", "float8_e4m3fn", "float8_e8m0fnu", "int8", "uint8")),
    (1, ("bool_",)),
)
_KNOWN = "float32, tfloat32, int32, uint32, bfloat16, float16, int16, uint16, float8_e4m3, "
_KNOWN += "float8_e5m2, float8_e4m3fn, float8_e8m0fnu, int8, uint8, bool_"


def dtype_bytes(dtype: Any) -> int:
    """Bytes per element of `dtype` (an `nl` dtype or its name), compared by value.

    Raises ValueError naming the dtype when it is none of the NKI dtypes."""
    for nbytes, names in _SIZES:
        for name in names:
            if dtype == name or (hasattr(nl, name) and dtype == getattr(nl, name)):
                return nbytes
    raise ValueError(f"dtype: expected one of {_KNOWN}; got {dtype!r}")
