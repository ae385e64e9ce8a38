"""The seam: kernels import `nki`, `nl` and `nisa` from here, never directly.

The real Neuron `nki` package is used only when it is genuinely present -- importable
with `nki.jit`, `nki.language.ndarray` and `nki.isa.nc_matmul` (the empty PyPI placeholder
named `nki` has none of them) -- and the interpreter is not forced. Otherwise the
project's interpreter provides all three. `NKI_KERNELS_BACKEND=interpreter` forces the
interpreter; this module is the one place that reads it.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

BACKEND_ENV_VAR = "NKI_KERNELS_BACKEND"


def _real_nki() -> tuple[ModuleType, Any, Any] | None:
    try:
        mod = importlib.import_module("nki")
        lang = importlib.import_module("nki.language")
        isa_mod = importlib.import_module("nki.isa")
    except Exception:
        return None
    if not (
        callable(getattr(mod, "jit", None))
        and hasattr(lang, "ndarray")
        and callable(getattr(isa_mod, "nc_matmul", None))
    ):
        return None
    return mod, lang, isa_mod


def _select() -> tuple[str, Any, Any, Any]:
    forced = os.environ.get(BACKEND_ENV_VAR, "").strip().lower()
    if forced not in ("", "auto", "interpreter", "neuron"):
        raise ValueError(
            f"{BACKEND_ENV_VAR}: expected 'auto', 'interpreter' or 'neuron'; got {forced!r}"
        )
    real = None if forced == "interpreter" else _real_nki()
    if forced == "neuron" and real is None:
        raise ImportError(
            f"{BACKEND_ENV_VAR}=neuron but the Neuron `nki` package is not importable "
            "(the PyPI placeholder named `nki` does not count)"
        )
    if real is not None:
        return ("neuron", *real)
    from .interp import nisa as _nisa
    from .interp import nki as _nki
    from .interp import nl as _nl

    return "interpreter", _nki, _nl, _nisa


BACKEND, nki, nl, nisa = _select()

__all__ = ["BACKEND", "nisa", "nki", "nl"]
