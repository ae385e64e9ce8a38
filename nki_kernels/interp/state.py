"""Interpreter state for one kernel launch: target, mode, trace, memory, engine registers."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from ..targets import Target
from .errors import NkiValidationError
from .memory import OnChipMemory
from .trace import Trace

if TYPE_CHECKING:
    from .storage import Storage


class InterpreterWarning(UserWarning):
    """Something the hardware would do differently or leave undefined."""


class Program:
    """Per-core state: on-chip memory placement and the engines' accumulator registers."""

    def __init__(self, target: Target) -> None:
        self.memory = OnChipMemory(
            target.name, target.sbuf_usable_bytes, target.psum_banks, target.psum_bank_bytes
        )
        # ScalarE and VectorE each keep one fp32 accumulator per lane (partition); they
        # persist across instructions under reduce_cmd control.
        self.scalar_acc = np.zeros(target.partitions, dtype=np.float32)
        self.vector_acc = np.zeros(target.partitions, dtype=np.float32)
        self.shared_hbm_count = 0
        self.onchip_count = 0  # on-chip allocations so far: the liveness key of the next


class Launch:
    """One kernel launch: every program (LNC core) shares HBM and the trace."""

    def __init__(self, target: Target, lnc: int, trace_only: bool) -> None:
        self.target = target
        self.lnc = lnc
        self.trace_only = trace_only
        self.trace = Trace(target.name, lnc)
        self.programs = [Program(target) for _ in range(lnc)]
        self.program_id = 0
        self.grid = lnc > 1
        self.shared_hbm: list[Storage] = []
        self.next_sid = 1
        self.warned: set[str] = set()
        self.concurrent: Any = None  # programs.Programs under LNC > 1
        self.liveness: Any = None  # liveness.Liveness when replaying with last-use frees
        self.rank = 0  # this launch's rank among the ranks of a collective launch
        self.world: Any = None  # ranks.World when launched over several ranks
        # set once a `.ap()` view reaches outside its storage: from then on every
        # instruction checks its operands' bounds (rule IDX at the use, not the view)
        self.check_operand_bounds = False

    @property
    def program(self) -> Program:
        """The program (LNC core) whose kernel body is running."""
        return self.programs[self.program_id]

    def warn(self, key: str, message: str) -> None:
        """Warn once per launch about `key`."""
        if key not in self.warned:
            self.warned.add(key)
            warnings.warn(message, InterpreterWarning, stacklevel=4)

    def finish(self) -> None:
        """Record the memory high-water marks of every program in the trace."""
        for i, prog in enumerate(self.programs):
            self.trace.peak_sbuf_bytes[i] = prog.memory.peak_sbuf_bytes
            self.trace.peak_psum_banks[i] = prog.memory.peak_psum_banks


_active: list[Launch] = []


def current() -> Launch:
    """The launch being interpreted; NKI calls outside a kernel launch are an error."""
    if not _active:
        raise NkiValidationError(
            "LAUNCH", "an NKI language/ISA call ran outside a kernel launch (call the kernel)"
        )
    return _active[-1]


def push(launch: Launch) -> None:
    """Make `launch` the current launch."""
    _active.append(launch)


def pop() -> None:
    """End the current launch."""
    _active.pop()


def active() -> Launch | None:
    """The current launch, or None outside a kernel."""
    return _active[-1] if _active else None
