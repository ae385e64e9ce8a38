"""An interpreter of the NKI 0.6 dialect: runs NKI kernels on CPU under the chip's rules.

`nki`, `nl` and `nisa` here mirror `import nki`, `import nki.language as nl` and
`import nki.isa as nisa`. `run()` launches a kernel and returns its outputs together with
the instruction trace (optionally in trace-only mode, which skips the arithmetic);
`run_ranks()` launches it once per rank of a collective job (`nki.collectives`).
"""

from __future__ import annotations

from . import isa as nisa
from . import language as nl
from .errors import RULES, MemoryPlanError, NkiValidationError
from .launch import Kernel, RunResult, TensorSpec, jit, run, settings, simulate
from .package import nki
from .ranks import run_ranks
from .state import InterpreterWarning
from .trace import Instr, Trace

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
    "run_ranks",
    "settings",
    "simulate",
]
