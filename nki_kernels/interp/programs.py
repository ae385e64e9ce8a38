"""The programs of one LNC launch, run as cooperating threads (one runs at a time).

On the chip the two NeuronCores of an LNC-2 launch run at once and meet only at
`nisa.core_barrier` and `nisa.sendrecv`. Here each program's kernel body runs in its own
thread, but a baton lets exactly one run at a time: program 0 runs until it finishes or
waits at a meeting point, then the lowest-numbered program that can run takes over. A
kernel without meeting points therefore runs program 0 to the end, then program 1 --
the same order (and the same trace) as running them one after the other.

A wait that can never be met -- every unfinished program waits and no meeting is
complete, or a program waits for one that already returned -- is an error (rule SYNC)
that names each program's position (file:line of the kernel source, or "returned").
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import NkiValidationError, fail

_INTERP_DIR = str(Path(__file__).resolve().parent)


class _Abort(BaseException):
    """Unwinds a program thread after another program failed (never escapes a launch)."""


def kernel_position() -> str:
    """file:line (function) of the innermost kernel-source frame of the calling thread."""
    for frame in reversed(traceback.extract_stack()):
        if not str(Path(frame.filename).resolve()).startswith(_INTERP_DIR):
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "<unknown>"


class Meeting:
    """One rendezvous: the programs in `members` each arrive once, then all go on."""

    def __init__(self, kind: str, key: Any, members: tuple[int, ...]) -> None:
        self.kind = kind
        self.key = key
        self.members = members
        self.arrived: dict[int, Any] = {}  # program -> what it brought (e.g. its tiles)
        self.done = False


class Programs:
    """Runs `lnc` program bodies as cooperating threads over one shared launch."""

    def __init__(self, launch: Any) -> None:
        self.launch = launch
        self.n = launch.lnc
        self.cond = threading.Condition()
        self.turn = 0
        self.finished: set[int] = set()
        self.waiting: dict[int, tuple[Meeting, str]] = {}  # program -> (meeting, position)
        self.open: dict[tuple[str, Any], Meeting] = {}
        self.error: BaseException | None = None
        self.results: dict[int, Any] = {}

    # ---- running ------------------------------------------------------------------------
    def run(self, body: Callable[[], Any]) -> list[Any]:
        """Run `body` once per program; return each program's result."""
        threads = [
            threading.Thread(target=self._program, args=(pid, body), name=f"nki-program-{pid}")
            for pid in range(self.n)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.launch.program_id = 0
        if self.error is not None:
            raise self.error
        return [self.results[pid] for pid in range(self.n)]

    def _program(self, pid: int, body: Callable[[], Any]) -> None:
        with self.cond:
            while self.turn != pid and self.error is None:
                self.cond.wait()
            if self.error is not None:
                return
            self.launch.program_id = pid
        try:
            self.results[pid] = body()
        except _Abort:
            return
        except BaseException as e:
            with self.cond:
                if self.error is None:
                    self.error = e
                self.cond.notify_all()
            return
        with self.cond:
            self.finished.add(pid)
            self._hand_over(pid)

    def _runnable(self) -> int | None:
        for p in range(self.n):
            if p not in self.finished and p not in self.waiting:
                return p
        return None

    def _hand_over(self, pid: int) -> None:
        """Pass the baton from `pid` (waiting or finished); detect waits never met."""
        nxt = self._runnable()
        if nxt is None and self.waiting:
            self.error = self._deadlock()
        elif nxt is not None:
            self.turn = nxt
        self.cond.notify_all()

    def _deadlock(self) -> NkiValidationError:
        parts = []
        for p in range(self.n):
            if p in self.waiting:
                m, pos = self.waiting[p]
                parts.append(f"program {p} waits in {m.kind} {self._describe(m)} at {pos}")
            else:
                parts.append(f"program {p} returned from the kernel")
        return fail("SYNC", "LNC programs can never meet: " + "; ".join(parts))

    @staticmethod
    def _describe(m: Meeting) -> str:
        return f"(cores {m.members}, {m.key})" if m.kind == "core_barrier" else f"({m.key})"

    # ---- meeting points -----------------------------------------------------------------
    def meet(self, kind: str, key: Any, members: tuple[int, ...], payload: Any) -> Meeting:
        """Arrive at a meeting of `members`; return it once every member has arrived.

        The last to arrive completes the meeting (the caller acts on `arrived`); the
        others block until then. Called by the program holding the baton.
        """
        pid = self.launch.program_id
        with self.cond:
            m = self.open.get((kind, key))
            if m is None or m.done:
                m = Meeting(kind, key, members)
                self.open[(kind, key)] = m
            elif m.members != members:
                raise fail(
                    "SYNC",
                    f"{kind}: program {pid} meets {members} at {kernel_position()} but an "
                    f"earlier program meets {m.members}",
                )
            m.arrived[pid] = payload
            if len(m.arrived) == len(members):
                m.done = True
                del self.open[(kind, key)]
                return m
            self.waiting[pid] = (m, kernel_position())
            self._hand_over(pid)
            while not (m.done and self.turn == pid) and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise _Abort()
            self.launch.program_id = pid
            return m

    def release(self, m: Meeting) -> None:
        """After the completing program acted on `m`: its waiters may run again (later)."""
        with self.cond:
            for p in m.members:
                self.waiting.pop(p, None)

    def yield_to_waiters(self) -> None:
        """Let lower-numbered released programs run first, keeping program order."""
        pid = self.launch.program_id
        with self.cond:
            nxt = self._runnable()
            if nxt is None or nxt == pid:
                return
            self.turn = nxt
            self.cond.notify_all()
            while self.turn != pid and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise _Abort()
            self.launch.program_id = pid
