"""A stand-in for AWS's `neuron_dtypes` package, which nki-library's test helpers and
torch references import (`static_cast`, `sizeinbytes`, `finfo`, `is_float_type`,
`bfloat16`, the packed MX dtypes) and which is published only on the Neuron pip
repository.

Written here from how those call sites use it: `static_cast(array, dtype)` converts
with round-to-nearest-even (through `ml_dtypes` for bf16 / fp8) and, for integer
targets, rounds and saturates, as NKI's fp32 -> int conversion does. The packed MX
dtypes are NumPy dtypes of their raw words (the interpreter's, `interp.dtypes`):
`static_cast(values [..., 4F], float8_e4m3fn_x4)` packs to [..., F] (nearest-even,
saturating) and `static_cast(words, np.float32)` unpacks to [..., 4F]; AWS's code then
uses them as NumPy dtypes by name (`np.zeros(shape, dtype="float8_e4m3fn_x4")`,
`"x4" in str(a.dtype)`, `a.view(np.uint32)`), which `installed()` makes work for the
block it guards: it registers the names with NumPy and gives the tagged dtypes their
names in `str` / `repr` / `.name`, and keeps them through `np.concatenate` / `np.stack`
(which drop NumPy dtype metadata; `np.where` still does). Importing the module changes
nothing in NumPy. Unlike AWS's dtypes, `astype(np.float32)` of such
an array yields the raw words as numbers; unpack with `static_cast` (or `as_float32`) instead. The
conformance loader installs this module as `neuron_dtypes`, inside `installed()`, only
while it runs checkout code and only when the real package is not importable.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

try:
    import numpy._core._dtype as _np_dtype_text
except ImportError:  # NumPy 1.x (pyproject allows >= 1.26) keeps it under numpy.core
    import numpy.core._dtype as _np_dtype_text  # type: ignore[no-redef]

from ..interp import dtypes as _dt

bfloat16 = ml_dtypes.bfloat16
float8_e4m3 = ml_dtypes.float8_e4m3
float8_e4m3fn = ml_dtypes.float8_e4m3fn
float8_e5m2 = ml_dtypes.float8_e5m2
float8_e8m0fnu = ml_dtypes.float8_e8m0fnu
float8_e5m2_x4 = _dt.np_dtype(_dt.float8_e5m2_x4)
float8_e4m3fn_x4 = _dt.np_dtype(_dt.float8_e4m3fn_x4)
float4_e2m1fn_x4 = _dt.np_dtype(_dt.float4_e2m1fn_x4)
_ABSENT = object()


def _x4_name(d: np.dtype) -> str | None:
    meta = d.metadata
    return None if meta is None else meta.get(_dt.X4_META)


def _named(original: Any, spell: Any) -> Any:
    def text(d: np.dtype) -> Any:
        name = _x4_name(d)
        return original(d) if name is None else spell(name)

    return text


def _keeps_x4(join: Any) -> Any:
    """`np.concatenate` / `np.stack` that keep a packed dtype all their inputs share (NumPy
    drops dtype metadata there; AWS's dtypes are real NumPy dtypes and survive)."""

    def joined(arrays: Any, *args: Any, **kwargs: Any) -> Any:
        arrays = list(arrays)
        out = join(arrays, *args, **kwargs)
        dtypes = [getattr(a, "dtype", None) for a in arrays]
        names = {None if d is None else _x4_name(d) for d in dtypes}
        if len(names) == 1 and None not in names and _x4_name(out.dtype) is None:
            return out.view(dtypes[0])
        return out

    return joined


_SCOPE_LOCK = threading.Lock()
_scope: dict[str, Any] = {"depth": 0, "undo": []}


def _install() -> list[tuple[Any, str, Any]]:
    """Make the packed dtypes known to NumPy: `np.dtype("float8_e4m3fn_x4")`, their names
    in str / repr / .name, kept by concatenate / stack. Returns (namespace, name, value
    before) of everything it changed, `_ABSENT` for what did not exist."""
    undo: list[tuple[Any, str, Any]] = []
    types: dict[str, Any] = np.sctypeDict
    for d in (float8_e5m2_x4, float8_e4m3fn_x4, float4_e2m1fn_x4):
        name = str(_x4_name(d))
        undo.append((types, name, types.get(name, _ABSENT)))
        types[name] = d
    m = _np_dtype_text
    patches = [
        (m, "__str__", _named(m.__str__, lambda n: n)),
        (m, "__repr__", _named(m.__repr__, lambda n: f"dtype('{n}')")),
        (m, "_name_get", _named(m._name_get, lambda n: n)),
        (np, "concatenate", _keeps_x4(np.concatenate)),
        (np, "stack", _keeps_x4(np.stack)),
    ]
    for space, name, value in patches:
        undo.append((space, name, getattr(space, name)))
        setattr(space, name, value)
    return undo


def _restore(undo: list[tuple[Any, str, Any]]) -> None:
    for space, name, before in reversed(undo):
        if space is np.sctypeDict:
            if before is _ABSENT:
                np.sctypeDict.pop(name, None)
            else:
                np.sctypeDict[name] = before
        else:
            setattr(space, name, before)


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Within the block, NumPy knows the packed dtypes by name (see the module docstring);
    on leaving the outermost block every NumPy attribute and `np.sctypeDict` entry it
    changed is put back, so NumPy outside the block is the process's own. Nested blocks
    (threads included) share one installation."""
    with _SCOPE_LOCK:
        if _scope["depth"] == 0:
            _scope["undo"] = _install()
        _scope["depth"] += 1
    try:
        yield
    finally:
        with _SCOPE_LOCK:
            _scope["depth"] -= 1
            if _scope["depth"] == 0:
                _restore(_scope["undo"])
                _scope["undo"] = []


def _resolve(dtype: Any) -> tuple[np.dtype, _dt.NkiDtype | None]:
    """The NumPy dtype of `dtype` and, for a packed MX dtype, its NKI dtype."""
    if isinstance(dtype, str) and dtype in _dt.PACKED_MX_DTYPES:
        x4 = _dt.as_dtype(dtype)
        return x4._np, x4
    d = np.dtype(dtype)
    name = _x4_name(d)
    return d, None if name is None else _dt.as_dtype(name)


as_float32 = _dt.host_float32


def static_cast(values: Any, dtype: Any) -> np.ndarray:
    """`values` converted to `dtype`: floats round to nearest-even; integers round to
    nearest-even and saturate; packed MX dtypes pack / unpack their last dim by 4."""
    d, x4 = _resolve(dtype)
    a = np.asarray(values)
    src_x4 = _x4_name(a.dtype)
    if x4 is not None:
        if src_x4 == x4:
            return a.copy()
        return _dt.pack_x4(as_float32(a), x4)
    if src_x4 is not None:
        a = as_float32(a)
    if d.kind in "iu":
        info = np.iinfo(d)
        v = np.rint(a.astype(np.float64)) if a.dtype.kind not in "iub" else a.astype(np.int64)
        v = np.nan_to_num(v, nan=0.0, posinf=info.max, neginf=info.min)
        return np.clip(v, info.min, info.max).astype(d)
    if a.dtype != np.float32 and a.dtype.kind != "f":
        a = a.astype(np.float32)
    return a.astype(d)


def sizeinbytes(dtype: Any) -> int:
    """Bytes per element of `dtype` (a packed MX element: 4, float4_e2m1fn_x4: 2)."""
    return int(_resolve(dtype)[0].itemsize)


def finfo(dtype: Any) -> Any:
    """`ml_dtypes.finfo` (NumPy's for the IEEE types; a packed dtype's element type's)."""
    d, x4 = _resolve(dtype)
    return ml_dtypes.finfo(_dt.X4_ELEMENT[x4][0] if x4 is not None else d)


def is_float_type(dtype: Any) -> bool:
    """Whether `dtype` is a floating-point type (bf16 and fp8 included; not the packed MX
    dtypes, whose arrays hold words, not values)."""
    d, x4 = _resolve(dtype)
    return (x4 is None and d.kind == "f") or d in (
        np.dtype(bfloat16),
        np.dtype(float8_e4m3),
        np.dtype(float8_e4m3fn),
        np.dtype(float8_e5m2),
        np.dtype(float8_e8m0fnu),
    )
