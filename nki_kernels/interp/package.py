"""The interpreter as an importable `nki` package: `nki`, `nki.language`, `nki.isa`, ...

`MODULES` maps the module names an NKI kernel imports to the interpreter's modules, so
code that does `import nki.language as nl` can run here unmodified once the map is in
`sys.modules` (`nki_kernels.conformance.loader.mapped_nki()` installs it for a block).

Besides `nki.language` and `nki.isa` it provides `nki.isa.constants` (the enums, where
nki-library imports them from), `nki.typing` (`nt.tensor[shape]`,
`nt.mutable_tensor`: annotations only), `nki.collectives` (collectives.py: between the
ranks of a `ranks.run_ranks` launch) and `nki.dtype` (the dtype names, as the
CPU simulator's `nki.dtype` module has them; nki-library's qkv tests do
`import nki.dtype as nt; nt.float8_e4m3`; also usable as an annotation). The legacy
`neuronxcc.nki.typing` path, which one nki-library kernel still imports, maps to the same
`nki.typing`; nothing else of `neuronxcc` is provided.
"""

from __future__ import annotations

import types
from typing import Any

from . import collectives as _collectives
from . import collectives_v as _collectives_v
from . import enums
from . import isa as nisa
from . import language as nl
from .errors import unsupported_getattr
from .launch import Kernel, jit, simulate


def _module(name: str, doc: str) -> types.ModuleType:
    mod = types.ModuleType(name, doc)
    mod.__package__ = name
    mod.__path__ = []  # type: ignore[attr-defined]  # a package: submodules may be imported
    return mod


class _TensorAnnotation:
    """`nt.tensor` / `nt.mutable_tensor`: `nt.tensor[128, 512]` is an annotation only."""

    def __init__(self, name: str, shape: tuple[Any, ...] | None = None) -> None:
        self.name = name
        self.shape = shape

    def __getitem__(self, shape: Any) -> _TensorAnnotation:
        return _TensorAnnotation(self.name, shape if isinstance(shape, tuple) else (shape,))

    def __repr__(self) -> str:
        return f"nt.{self.name}" + (f"[{', '.join(map(str, self.shape))}]" if self.shape else "")


typing_mod = _module("nki.typing", "Kernel parameter annotations (no run-time effect).")
typing_mod.tensor = _TensorAnnotation("tensor")  # type: ignore[attr-defined]
typing_mod.mutable_tensor = _TensorAnnotation("mutable_tensor")  # type: ignore[attr-defined]

constants = _module("nki.isa.constants", "The nki.isa enums, as nki-library imports them.")
for _name in ("dge_mode", "oob_mode", "engine", "reduce_cmd", "matmul_perf_mode", "nc_version"):
    setattr(constants, _name, getattr(enums, _name))
constants.dma_engine = enums.dma_engine  # type: ignore[attr-defined]


collectives = _module("nki.collectives", "Collective communication between ranks.")
for _mod in (_collectives, _collectives_v):
    for _name in _mod.__all__:
        setattr(collectives, _name, getattr(_mod, _name))
collectives.__getattr__ = unsupported_getattr(  # type: ignore[method-assign]
    "nki.collectives", _collectives.NOT_SUPPORTED
)

nki = _module("nki", "The interpreter's stand-in for the `nki` package.")
nki.jit = jit  # type: ignore[attr-defined]
nki.simulate = simulate  # type: ignore[attr-defined]
nki.Kernel = Kernel  # type: ignore[attr-defined]
nki.language = nl  # type: ignore[attr-defined]
nki.isa = nisa  # type: ignore[attr-defined]
nki.typing = typing_mod  # type: ignore[attr-defined]
nki.collectives = collectives  # type: ignore[attr-defined]


def _dtype_by_name(name: str) -> Any:
    value = getattr(nl, name, None) if not name.startswith("_") else None
    if isinstance(value, str):  # nki.language's dtypes (NKI 0.6: DType = str)
        return value
    raise AttributeError(f"module 'nki.dtype' has no attribute {name!r}")


dtype_mod = _module("nki.dtype", "The NKI dtypes by name (the same values as nki.language's).")
dtype_mod.__getattr__ = _dtype_by_name  # type: ignore[method-assign]
nki.dtype = dtype_mod  # type: ignore[attr-defined]
nisa.constants = constants  # type: ignore[attr-defined]

_legacy = _module("neuronxcc", "Only `neuronxcc.nki.typing` is mapped (to nki.typing).")
_legacy_nki = _module("neuronxcc.nki", "Only `neuronxcc.nki.typing` is mapped.")
_legacy.nki = _legacy_nki  # type: ignore[attr-defined]
_legacy_nki.typing = typing_mod  # type: ignore[attr-defined]

MODULES: dict[str, types.ModuleType] = {
    "nki": nki,
    "nki.language": nl,
    "nki.isa": nisa,
    "nki.isa.constants": constants,
    "nki.typing": typing_mod,
    "nki.collectives": collectives,
    "nki.dtype": dtype_mod,
    "neuronxcc": _legacy,
    "neuronxcc.nki": _legacy_nki,
    "neuronxcc.nki.typing": typing_mod,
}
