"""The programs of a launch -- or of several ranks' launches -- run as cooperating threads.

On the chip the two NeuronCores of an LNC-2 launch run at once and meet only at
`nisa.core_barrier` and `nisa.sendrecv`; the ranks of a collective (separate launches of
one kernel, `ranks.run_ranks`) meet at the `nki.collectives` calls. Here each program's
kernel body runs in its own thread (a "slot"), but a baton lets exactly one run at a
time: slot 0 runs until it finishes or waits at a meeting point, then the lowest-numbered
slot that can run takes over. A kernel without meeting points therefore runs program 0
to the end, then program 1 -- the same order (and the same trace) as running them one
after the other. Slots are numbered rank-major: (rank 0, program 0), (rank 0, program
1), (rank 1, program 0), ...

A wait that can never be met -- every unfinished slot waits and no meeting is complete,
or a slot waits for one that already returned -- is an error (rule SYNC) that names each
slot's position (file:line of the kernel source, or "returned").
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import state
from .errors import NkiValidationError, fail
from .threads import is_quiet, quiet_stdout

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
    """One rendezvous: the members each arrive once, then all go on.

    `members` are the callers' own names for the members (program ids within a launch,
    rank ids for a collective) and key `arrived`; `slots` are the scheduler's threads.
    """

    def __init__(self, kind: str, key: Any, members: tuple[Any, ...], slots: tuple[int, ...]):
        self.kind = kind
        self.key = key
        self.members = members
        self.slots = slots
        self.arrived: dict[Any, Any] = {}  # member -> what it brought (e.g. its tiles)
        self.done = False
        self.delivered = False  # the data exchange of the meeting happened


class Scheduler:
    """Runs one kernel body per slot (a (launch, program id) pair) as cooperating threads."""

    def __init__(self, slots: Sequence[tuple[Any, int]], labels: Sequence[str], what: str):
        self.slots = list(slots)
        self.labels = list(labels)
        self.what = what  # "LNC programs" / "ranks": who can never meet, in the error
        self.n = len(self.slots)
        self.cond = threading.Condition()
        self.turn = 0
        self.finished: set[int] = set()
        self.waiting: dict[int, tuple[Meeting, str]] = {}  # slot -> (meeting, position)
        self.open: dict[tuple[Any, ...], Meeting] = {}
        self.error: BaseException | None = None
        self.results: dict[int, Any] = {}

    # ---- running ------------------------------------------------------------------------
    def run(self, bodies: Sequence[Callable[[], Any]]) -> list[Any]:
        """Run `bodies[slot]` in each slot; return each slot's result."""
        quiet = is_quiet()  # a replay's program threads print nothing either
        threads = [
            threading.Thread(target=self._slot, args=(s, bodies[s], quiet), name=f"nki-slot-{s}")
            for s in range(self.n)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for launch, _ in self.slots:
            launch.program_id = 0
        if self.error is not None:
            raise self.error
        return [self.results[s] for s in range(self.n)]

    def _enter(self, slot: int) -> None:
        """Make `slot`'s launch and program the current ones (it holds the baton)."""
        launch, pid = self.slots[slot]
        state.switch(launch)
        launch.program_id = pid

    def _slot(self, slot: int, body: Callable[[], Any], quiet: bool) -> None:
        # this thread's launch stack: the slot's launch (`_enter` keeps it current)
        state.push(self.slots[slot][0])
        try:
            with quiet_stdout() if quiet else contextlib.nullcontext():
                self._run_slot(slot, body)
        finally:
            state.pop()

    def _run_slot(self, slot: int, body: Callable[[], Any]) -> None:
        with self.cond:
            while self.turn != slot and self.error is None:
                self.cond.wait()
            if self.error is not None:
                return
            self._enter(slot)
        try:
            self.results[slot] = body()
        except _Abort:
            return
        except BaseException as e:
            with self.cond:
                if self.error is None:
                    self.error = e
                self.cond.notify_all()
            return
        with self.cond:
            self.finished.add(slot)
            self._hand_over()

    def _runnable(self) -> int | None:
        for s in range(self.n):
            if s not in self.finished and s not in self.waiting:
                return s
        return None

    def _hand_over(self) -> None:
        """Pass the baton on (the holder waits or finished); detect waits never met."""
        nxt = self._runnable()
        if nxt is None and self.waiting:
            self.error = self._deadlock()
        elif nxt is not None:
            self.turn = nxt
        self.cond.notify_all()

    def _deadlock(self) -> NkiValidationError:
        parts = []
        for s in range(self.n):
            if s in self.waiting:
                m, pos = self.waiting[s]
                parts.append(f"{self.labels[s]} waits in {m.kind} {_describe(m)} at {pos}")
            else:
                parts.append(f"{self.labels[s]} returned from the kernel")
        return fail("SYNC", f"{self.what} can never meet: " + "; ".join(parts))

    # ---- meeting points -----------------------------------------------------------------
    def meet(
        self,
        kind: str,
        key: Any,
        me: Any,
        members: tuple[Any, ...],
        slots: tuple[int, ...],
        payload: Any,
        namespace: Any = None,
    ) -> Meeting:
        """Arrive (as member `me`, running in the current slot) at a meeting of `members`
        (running in `slots`); return it once every member has arrived.

        The last to arrive completes the meeting (the caller acts on `arrived`); the
        others block until then. Meetings of one `namespace` (e.g. one rank's programs)
        never mix with another's.
        """
        slot = self.turn
        with self.cond:
            m = self.open.get((kind, namespace, key))
            if m is None or m.done:
                m = Meeting(kind, key, members, slots)
                self.open[(kind, namespace, key)] = m
            elif m.members != members:
                raise fail(
                    "SYNC",
                    f"{kind}: {self.labels[slot]} meets {members} at {kernel_position()} but "
                    f"an earlier arrival meets {m.members}",
                )
            m.arrived[me] = payload
            if len(m.arrived) == len(members):
                m.done = True
                del self.open[(kind, namespace, key)]
                return m
            self.waiting[slot] = (m, kernel_position())
            self._hand_over()
            while not (m.done and self.turn == slot) and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise _Abort()
            self._enter(slot)
            return m

    def release(self, m: Meeting) -> None:
        """After the completing slot acted on `m`: its waiters may run again (later)."""
        with self.cond:
            for s in m.slots:
                # a member may already wait at its next meeting: leave that wait alone
                if s in self.waiting and self.waiting[s][0] is m:
                    del self.waiting[s]

    def yield_to_waiters(self) -> None:
        """Let lower-numbered released slots run first, keeping program order."""
        slot = self.turn
        with self.cond:
            nxt = self._runnable()
            if nxt is None or nxt == slot:
                return
            self.turn = nxt
            self.cond.notify_all()
            while self.turn != slot and self.error is None:
                self.cond.wait()
            if self.error is not None:
                raise _Abort()
            self._enter(slot)

    def position(self, slot: int) -> str:
        """Where `slot` waits (or that it returned / still runs), for error messages."""
        if slot in self.waiting:
            m, pos = self.waiting[slot]
            return f"{self.labels[slot]} waits in {m.kind} {_describe(m)} at {pos}"
        if slot in self.finished:
            return f"{self.labels[slot]} returned from the kernel"
        return f"{self.labels[slot]} runs"


def _describe(m: Meeting) -> str:
    return f"(cores {m.members}, {m.key})" if m.kind == "core_barrier" else f"({m.key})"


class Programs:
    """The programs of one launch as the ISA's LNC meeting points see them: members are
    program ids of this launch. Standalone (one launch) or a view into a `Scheduler` of
    several ranks' launches (`base`: the launch's first slot)."""

    def __init__(self, launch: Any, scheduler: Scheduler | None = None, base: int = 0) -> None:
        self.launch = launch
        self.n = launch.lnc
        if scheduler is None:
            labels = [f"program {p}" for p in range(self.n)]
            scheduler = Scheduler([(launch, p) for p in range(self.n)], labels, "LNC programs")
        self.scheduler = scheduler
        self.base = base

    def run(self, body: Callable[[], Any]) -> list[Any]:
        """Run `body` once per program (standalone launches only); each program's result."""
        return self.scheduler.run([body] * self.n)

    def meet(self, kind: str, key: Any, members: tuple[int, ...], payload: Any) -> Meeting:
        """Arrive at a meeting of the programs `members` of this launch (see Scheduler.meet)."""
        slots = tuple(self.base + p for p in members)
        pid = self.launch.program_id
        return self.scheduler.meet(kind, key, pid, members, slots, payload, namespace=self.base)

    def release(self, m: Meeting) -> None:
        """See `Scheduler.release`."""
        self.scheduler.release(m)

    def yield_to_waiters(self) -> None:
        """See `Scheduler.yield_to_waiters`."""
        self.scheduler.yield_to_waiters()
