"""Interpreter state for one kernel launch: target, mode, trace, memory, engine registers.

Thread safety: each thread has its own stack of launches (`current()` is the innermost
launch of the calling thread), and everything a launch mutates lives on its `Launch` /
`Program` objects, so kernels launched from several threads at once never see each
other's state. The per-thread `settings()` of `launch.py` are captured into the launch
when it is made (its program threads under LNC 2 read them from there).
"""

from __future__ import annotations

import contextvars
import threading
import warnings
from collections.abc import Mapping
from types import MappingProxyType
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


# Defaults of `launch.settings()`; a `settings()` block changes them for its own thread
# (or asyncio task) only.
DEFAULT_SETTINGS: Mapping[str, Any] = MappingProxyType(
    {
        "target": None,
        "trace_only": False,
        "free_unused_tiles": True,
        "compiler_schedule": True,  # neuronx-cc's default flow (liveness.py)
        "mx_scale": "nki-0.6",
        "fresh_memory": "poison",
    }
)
SETTINGS: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "nki_interp_settings", default=DEFAULT_SETTINGS
)


def settings_now() -> Mapping[str, Any]:
    """The interpreter settings in force in the calling thread."""
    return SETTINGS.get()


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
        # `nl.no_reorder` blocks: nesting depth, and the id of the outermost one (0: none)
        self.no_reorder_depth = 0
        self.no_reorder_block = 0
        # constant ones rows of partition broadcasts, made once per core (nl_compute)
        self.ones_rows: dict[tuple[int, str], Any] = {}


class Launch:
    """One kernel launch: every program (LNC core) shares HBM and the trace."""

    def __init__(self, target: Target, lnc: int, trace_only: bool) -> None:
        opts = settings_now()
        self.target = target
        self.fresh_zero = opts["fresh_memory"] == "zero"
        self.mx_scale: str = opts["mx_scale"]
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


class _LaunchStack(threading.local):
    """The calling thread's launches, innermost last (a kernel called inside a running
    kernel is inlined, so the stack is one deep except while launches nest)."""

    def __init__(self) -> None:
        self.launches: list[Launch] = []


_local = _LaunchStack()


def current() -> Launch:
    """The calling thread's launch; NKI calls outside a kernel launch are an error."""
    launches = _local.launches
    if not launches:
        raise NkiValidationError(
            "LAUNCH", "an NKI language/ISA call ran outside a kernel launch (call the kernel)"
        )
    return launches[-1]


def push(launch: Launch) -> None:
    """Make `launch` the calling thread's current launch."""
    _local.launches.append(launch)


def pop() -> None:
    """End the calling thread's current launch."""
    _local.launches.pop()


def switch(launch: Launch) -> None:
    """Replace the calling thread's current launch (ranks of one collective launch)."""
    _local.launches[-1] = launch


def active() -> Launch | None:
    """The calling thread's current launch, or None outside a kernel."""
    launches = _local.launches
    return launches[-1] if launches else None
