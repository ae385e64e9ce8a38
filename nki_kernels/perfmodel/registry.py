"""Kernels the `estimate` command can price by name.

A kernel family registers itself with `register(...)`, naming the dimensions `--shape`
gives and a function that turns those dimensions and a dtype into the kernel's
arguments (`TensorSpec`s and specialization-time values). Modules that register are
listed in `PROVIDERS`; they are imported on first lookup.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..interp import TensorSpec

ArgsFn = Callable[[Mapping[str, int], str], tuple[tuple[Any, ...], dict[str, Any]]]

# Modules whose import registers estimable kernels (add yours here).
PROVIDERS: list[str] = ["nki_kernels.perfmodel.registry"]


@dataclass(frozen=True)
class Estimable:
    """A kernel with named shape dimensions and a way to build its arguments."""

    name: str
    kernel: Callable[..., Any]
    dims: tuple[str, ...]
    make_args: ArgsFn
    default_shape: tuple[int, ...]
    dtype: str = "bfloat16"
    description: str = ""

    def args(self, shape: Mapping[str, int], dtype: str | None = None) -> tuple[tuple, dict]:
        """Positional and keyword arguments for `shape` (all of `dims`) and `dtype`."""
        missing = [d for d in self.dims if d not in shape]
        if missing:
            raise ValueError(f"shape: kernel {self.name} needs {self.dims}; missing {missing}")
        return self.make_args(shape, dtype or self.dtype)


_REGISTRY: dict[str, Estimable] = {}
_loaded = False


def register(
    name: str,
    kernel: Callable[..., Any],
    dims: tuple[str, ...],
    make_args: ArgsFn,
    default_shape: tuple[int, ...],
    dtype: str = "bfloat16",
    description: str = "",
) -> Estimable:
    """Make `kernel` estimable as `name` (re-registering a name replaces it)."""
    if len(default_shape) != len(dims):
        raise ValueError(
            f"default_shape: expected {len(dims)} sizes for {dims}; got {default_shape}"
        )
    entry = Estimable(
        name, kernel, tuple(dims), make_args, tuple(default_shape), dtype, description
    )
    _REGISTRY[name] = entry
    return entry


def _load() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in PROVIDERS:
            importlib.import_module(mod)


def names() -> list[str]:
    """Registered kernel names, sorted."""
    _load()
    return sorted(_REGISTRY)


def get(name: str) -> Estimable:
    """The entry for `name`; a clear error lists the known names."""
    _load()
    if name not in _REGISTRY:
        raise KeyError(f"kernel: expected one of {', '.join(sorted(_REGISTRY))}; got {name!r}")
    return _REGISTRY[name]


def parse_shape(text: str, dims: tuple[str, ...]) -> dict[str, int]:
    """'4096,8192,8192', '4096x8192x8192' or 'M=4096,K=8192,N=8192' -> {dim: size}."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    if parts and all("=" in p for p in parts):
        out = {}
        for p in parts:
            key, _, val = p.partition("=")
            out[key.strip()] = int(val)
        unknown = set(out) - set(dims)
        if unknown:
            raise ValueError(f"shape: unknown dimension(s) {sorted(unknown)}; expected {dims}")
        return out
    if len(parts) != len(dims):
        raise ValueError(f"shape: expected {len(dims)} sizes for {dims}; got {text!r}")
    try:
        return {d: int(p) for d, p in zip(dims, parts)}
    except ValueError:
        raise ValueError(f"shape: expected integers for {dims}; got {text!r}") from None


# ---- the calibration matmuls ---------------------------------------------------------------
def _matmul_args(shape: Mapping[str, int], dtype: str) -> tuple[tuple, dict]:
    m, k, n = shape["M"], shape["K"], shape["N"]
    return (TensorSpec((k, m), dtype), TensorSpec((k, n), dtype)), {}


def _register_calibration() -> None:
    from .calibration import MATMULS, PUBLISHED_K, PUBLISHED_M, PUBLISHED_N

    for kname, kern in MATMULS.items():
        register(
            kname,
            kern,
            ("M", "K", "N"),
            _matmul_args,
            (PUBLISHED_M, PUBLISHED_K, PUBLISHED_N),
            description=f"{(kern.__doc__ or '').strip().splitlines()[0]} (lhsT [K, M], rhs [K, N])",
        )


_register_calibration()
