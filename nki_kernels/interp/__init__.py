"""An interpreter of the NKI 0.6 dialect: runs NKI kernels on CPU under the chip's rules.

`nki`, `nl` and `nisa` here mirror `import nki`, `import nki.language as nl` and
`import nki.isa as nisa`. `run()` launches a kernel and returns its outputs together with
the instruction trace (optionally in trace-only mode, which skips the arithmetic).
"""

from __future__ import annotations

import types

from . import isa as nisa
from . import language as nl
from .errors import RULES, MemoryPlanError, NkiValidationError
from .launch import Kernel, RunResult, TensorSpec, jit, run, settings, simulate
from .state import InterpreterWarning
from .trace import Instr, Trace

nki = types.ModuleType("nki", "The interpreter's stand-in for the `nki` package.")
nki.jit = jit  # type: ignore[attr-defined]
nki.simulate = simulate  # type: ignore[attr-defined]
nki.language = nl  # type: ignore[attr-defined]
nki.isa = nisa  # type: ignore[attr-defined]
nki.Kernel = Kernel  # type: ignore[attr-defined]

__all__ = [
    "RULES",
    "Instr",
    "InterpreterWarning",
    "Kernel",
    "MemoryPlanError",
    "NkiValidationError",
    "RunResult",
    "TensorSpec",
    "Trace",
    "jit",
    "nisa",
    "nki",
    "nl",
    "run",
    "settings",
    "simulate",
]
