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

The packed MX dtypes (`float8_e5m2_x4`, `float8_e4m3fn_x4`, `float4_e2m1fn_x4`; NC-v4
`nc_matmul_mx` / `quantize_mx` operands) are one element per 4 values: the fp8 ones are
32 bits wide, `float4_e2m1fn_x4` 16 bits (nki.language docs; nki-library's allocator
sizes them 4 / 2 bytes). Value j of an element sits in bits [8j, 8j+8) (fp8) or
[4j, 4j+4) (fp4), as nki-library's `mx_torch_common` unpacks them. They are stored as
their raw words (an unsigned / signed integer NumPy dtype tagged with the NKI name in its
metadata); engines cannot convert values to or from them (rule DTYPE_X4) -- only copies,
reinterpreting views, `memset(0)` and the MX instructions touch their lanes (`pack_x4`,
`unpack_x4`).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .errors import DtypeError, NkiValidationError, fail


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


X4_META = "nki_dtype"  # metadata key naming a packed MX dtype on its NumPy storage dtype


def _x4_storage(name: str, base: Any) -> np.dtype:
    return np.dtype(base, metadata={X4_META: name})


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

# Packed MX dtypes. The two fp8 kinds use different integer bases so that even their bare
# NumPy storage dtypes compare unequal.
float8_e4m3fn_x4 = NkiDtype("float8_e4m3fn_x4", _x4_storage("float8_e4m3fn_x4", np.uint32))
float8_e5m2_x4 = NkiDtype("float8_e5m2_x4", _x4_storage("float8_e5m2_x4", np.int32))
float4_e2m1fn_x4 = NkiDtype("float4_e2m1fn_x4", _x4_storage("float4_e2m1fn_x4", np.uint16))
PACKED_MX_DTYPES: frozenset[NkiDtype] = frozenset(
    {float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4}
)
# Per packed dtype: the ml_dtypes type of one value, bits per value, largest finite value
X4_ELEMENT: dict[NkiDtype, tuple[Any, int, float]] = {
    float8_e4m3fn_x4: (ml_dtypes.float8_e4m3fn, 8, 448.0),
    float8_e5m2_x4: (ml_dtypes.float8_e5m2, 8, 57344.0),
    float4_e2m1fn_x4: (ml_dtypes.float4_e2m1fn, 4, 6.0),
}

FP8_DTYPES: frozenset[NkiDtype] = frozenset({float8_e4m3, float8_e5m2, float8_e4m3fn})
FLOAT_DTYPES: frozenset[NkiDtype] = (
    frozenset({float16, float32, bfloat16, float8_e8m0fnu}) | FP8_DTYPES
)
INT_DTYPES: frozenset[NkiDtype] = frozenset({int8, int16, int32, uint8, uint16, uint32, bool_})
ALL_DTYPES: frozenset[NkiDtype] = FLOAT_DTYPES | INT_DTYPES | PACKED_MX_DTYPES
# The same sets as NumPy dtypes, for arrays computed inside the engines.
_NP_FLOAT = frozenset({d._np for d in FLOAT_DTYPES})

# Integer sentinel the official simulator writes into fresh integer allocations.
INT_SENTINEL = 4

# (the packed dtypes' storage dtypes equal their integer bases: found by metadata instead)
_FROM_NP: dict[np.dtype, NkiDtype] = {d._np: d for d in FLOAT_DTYPES | INT_DTYPES}

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

_EXPECTED = "an NKI dtype (float32, bfloat16, float16, float8_*, (u)int8/16/32, bool, *_x4)"


def as_dtype(dtype: Any, arg: str = "dtype") -> NkiDtype:
    """Normalize a dtype given as an nl dtype, its name, a NumPy or a torch dtype.

    Anything else raises `DtypeError` (rule DTYPE, also a TypeError) naming `arg`.
    """
    if isinstance(dtype, str):
        d = _NAMES.get(dtype)
        if d is not None:
            return d
        raise DtypeError("DTYPE", f"{arg}: expected {_EXPECTED}; got {dtype!r}")
    if isinstance(dtype, np.dtype):
        n = dtype
        meta = n.metadata
        if meta is not None and X4_META in meta:
            return _NAMES[meta[X4_META]]
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
    """Whether `dtype` is a floating-point NKI dtype (fp8 included; packed MX excluded)."""
    return dtype in FLOAT_DTYPES


def is_int(dtype: NkiDtype) -> bool:
    """Whether `dtype` is an integer NKI dtype (bool included)."""
    return dtype in INT_DTYPES


def is_packed(dtype: NkiDtype) -> bool:
    """Whether `dtype` is a packed MX dtype (`*_x4`)."""
    return dtype in PACKED_MX_DTYPES


# Fresh packed words: NaN in every fp8 lane (0x7F); fp4 has no NaN, so its largest value.
_X4_FILL = {float8_e4m3fn_x4: 0x7F7F7F7F, float8_e5m2_x4: 0x7F7F7F7F, float4_e2m1fn_x4: 0x7777}


def fresh_fill(dtype: NkiDtype, zero: bool = False) -> Any:
    """The value fresh allocations start with: NaN for floats (and fp8 lanes), a sentinel
    for integers; zero for every dtype when `zero` (`settings(fresh_memory="zero")`: a
    diagnostic that tells whether an output depends on memory no instruction wrote)."""
    if zero:
        return 0
    if dtype in FLOAT_DTYPES:
        return np.nan
    fill = _X4_FILL.get(dtype)
    if fill is not None:
        return np.array(fill, dtype=np.uint32).astype(dtype._np)
    return INT_SENTINEL


def _x4_refused(dtype: NkiDtype, direction: str) -> NkiValidationError:
    return fail(
        "DTYPE_X4",
        f"values cannot be converted {direction} the packed dtype {dtype}: only copies, "
        "views, memset(value=0), nisa.quantize_mx (writes) and nisa.nc_matmul_mx (reads) "
        "handle its lanes",
    )


def cast(values: np.ndarray, dtype: NkiDtype) -> np.ndarray:
    """Convert engine results (fp32 or exact ints) to a stored dtype, as the hardware does."""
    nd = dtype._np
    vd = values.dtype
    if dtype in PACKED_MX_DTYPES:
        if vd == nd and vd.kind in "iu":  # raw words (a bit copy)
            return values.astype(nd, copy=False)
        if not np.any(values):  # zeros: all four lanes +0 (memset / nl.zeros)
            return np.zeros(values.shape, dtype=nd)
        raise _x4_refused(dtype, "to")
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
    meta = values.dtype.metadata
    if meta is not None and X4_META in meta:
        raise _x4_refused(_NAMES[meta[X4_META]], "from")
    if values.dtype == _BF16_NP:  # bf16 is fp32's upper half: bit-exact, ~2.7x ml_dtypes' cast
        return (values.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return values.astype(np.float32)


_BF16_NP = np.dtype(ml_dtypes.bfloat16)


def pack_x4(values: np.ndarray, dtype: NkiDtype) -> np.ndarray:
    """fp32 `values` [..., 4F] -> packed words [..., F] of `dtype`: each value rounded to
    nearest-even, finite values beyond the element type's range saturated to its largest
    value (OCP MX's saturating conversion), NaN kept (fp8) and packed four per word."""
    elem, bits, vmax = X4_ELEMENT[dtype]
    v = np.asarray(values, dtype=np.float32)
    if v.shape[-1] % 4:
        raise fail("DTYPE_X4", f"pack to {dtype}: last dim {v.shape[-1]} is not a multiple of 4")
    v = np.where(np.isnan(v), v, np.clip(v, -vmax, vmax))
    codes = v.astype(elem).view(np.uint8).astype(np.uint32).reshape(*v.shape[:-1], -1, 4)
    if bits == 4:
        codes &= 0xF
    word = codes[..., 0] | codes[..., 1] << bits | codes[..., 2] << 2 * bits
    word |= codes[..., 3] << 3 * bits
    return word.astype(dtype._np)


def unpack_x4(words: np.ndarray, dtype: NkiDtype) -> np.ndarray:
    """Packed words [..., F] of `dtype` -> their fp32 values [..., 4F] (lane 0 first)."""
    elem, bits, _ = X4_ELEMENT[dtype]
    w = np.asarray(words).view(np.uint16 if bits == 4 else np.uint32).astype(np.uint32)
    mask = (1 << bits) - 1
    lanes = np.stack([(w >> (j * bits)) & mask for j in range(4)], axis=-1).astype(np.uint8)
    vals = lanes.view(elem).astype(np.float32)
    return vals.reshape(*w.shape[:-1], w.shape[-1] * 4)


def host_float32(values: Any, like: Any = None) -> np.ndarray:
    """Host arrays as fp32 values; packed MX words unpacked ([..., F] -> [..., 4F]). With
    `like` a packed array, `values` are read as words of its dtype (a golden given as a
    raw view of the words, as AWS's validator unpacks both by the output's dtype)."""
    a = np.asarray(values)
    ref = None if like is None else np.asarray(like).dtype
    if ref is not None and ref.metadata is not None and X4_META in ref.metadata:
        if a.dtype.itemsize == ref.itemsize and a.dtype.metadata is None:
            a = a.view(ref)
    meta = a.dtype.metadata
    if meta is not None and X4_META in meta:
        return unpack_x4(a, _NAMES[meta[X4_META]])
    return a.astype(np.float32)
