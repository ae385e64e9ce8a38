"""A kernel launched over several ranks, as a collective job runs it: `run_ranks`.

A rank is one launch of the kernel (one logical NeuronCore: `lnc` programs) with its own
inputs, HBM, trace and memory plan. All ranks' programs run as cooperating threads of one
`programs.Scheduler` (one runs at a time), so the `nki.collectives` calls meet across
ranks (collectives.py) and `core_barrier` / `sendrecv` still meet within each rank. A
collective that some ranks never reach is an error (rule SYNC) naming every rank's
position.

Under LNC 2, program p of each rank meets program p of the others at a collective (an
interpreter decision: each physical core issues its own collective; nki-library's
`allgather_sb2sb_tiled` gives each program its own tiles to gather).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..targets import Target, get_target
from . import state
from .errors import fail
from .launch import (
    Kernel,
    RunResult,
    _Arg,
    _classify,
    _Launcher,
    _result,
    _wrap,
    _write_back,
)
from .programs import Programs, Scheduler
from .tensor import hbm, shared_hbm
from .threads import one_blas_thread

MAX_RANKS = 128  # one thread per (rank, program): beyond this a CPU run is impractical


class World:
    """The ranks of one collective launch: their launches and the scheduler of their slots."""

    def __init__(self, launches: Sequence[state.Launch], lnc: int) -> None:
        self.launches = list(launches)
        self.n_ranks = len(self.launches)
        self.lnc = lnc
        slots = [(launch, p) for launch in self.launches for p in range(lnc)]
        labels = [
            f"rank {r}" + (f" program {p}" if lnc > 1 else "")
            for r in range(self.n_ranks)
            for p in range(lnc)
        ]
        self.scheduler = Scheduler(slots, labels, "ranks")
        self.calls: dict[int, int] = {}  # slot -> collectives it issued so far

    def slot(self, rank: int, program: int) -> int:
        """The scheduler slot running `program` of `rank`."""
        return rank * self.lnc + program

    def next_call(self, slot: int) -> int:
        """The sequence number of the collective `slot` issues now (0, 1, ...)."""
        n = self.calls.get(slot, 0)
        self.calls[slot] = n + 1
        return n


def run_ranks(
    kernel: Callable[..., Any] | Kernel | _Launcher,
    inputs: Sequence[Mapping[str, Any]],
    *,
    lnc: int = 1,
    target: str | Target | None = None,
    trace_only: bool | None = None,
) -> list[RunResult]:
    """Launch `kernel` once per rank, rank r with keyword arguments `inputs[r]`, the ranks
    running cooperatively (their collectives meet); each rank's outputs and trace.

    `kernel[2]` or `lnc=2` runs two programs per rank. `target` and `trace_only` are as
    for `launch.run`. Inputs the kernel wrote are written back per rank.
    """
    if isinstance(kernel, _Launcher):
        lnc, kernel = kernel.lnc, kernel.kernel
    if isinstance(kernel, Kernel):
        kernel.check_language()
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    if type(lnc) is not int or not 1 <= lnc <= 2:
        raise fail("LAUNCH", f"lnc: expected 1 or 2; got {lnc!r}")
    if isinstance(inputs, Mapping) or not isinstance(inputs, Sequence):
        raise fail(
            "LAUNCH", f"inputs: expected a sequence of per-rank dicts; got {type(inputs).__name__}"
        )
    if not 1 <= len(inputs) <= MAX_RANKS:
        raise fail("LAUNCH", f"inputs: expected 1..{MAX_RANKS} ranks; got {len(inputs)}")
    for r, inp in enumerate(inputs):
        if not isinstance(inp, Mapping):
            raise fail("LAUNCH", f"inputs[{r}]: expected a dict of keyword arguments; got {inp!r}")
    tgt = get_target(target if target is not None else state.settings_now()["target"])
    t_only = bool(state.settings_now()["trace_only"] if trace_only is None else trace_only)
    args: list[dict[str, _Arg]] = [
        {k: _classify(f"rank {r} argument {k!r}", v, t_only) for k, v in inp.items()}
        for r, inp in enumerate(inputs)
    ]
    as_torch = any(a.kind == "torch" for kw in args for a in kw.values())
    launches = []
    for r in range(len(inputs)):
        launch = state.Launch(tgt, lnc, t_only)
        launch.grid = lnc > 1
        launch.rank = r
        launches.append(launch)
    world = World(launches, lnc)
    buffer = shared_hbm if lnc > 1 else hbm
    results: list[RunResult] = []
    state.push(launches[0])
    try:
        calls = []
        for r, launch in enumerate(launches):
            state.switch(launch)
            launch.world = world
            if lnc > 1:
                launch.concurrent = Programs(launch, world.scheduler, base=world.slot(r, 0))
            for a in args[r].values():
                if a.kind != "value":
                    a.tensor = _wrap(a, buffer, launch)
            calls.append(
                {k: a.tensor if a.tensor is not None else a.value for k, a in args[r].items()}
            )
        bodies = [_body(fn, calls[r]) for r in range(len(launches)) for _ in range(lnc)]
        with one_blas_thread():
            outs = world.scheduler.run(bodies)
        for r, launch in enumerate(launches):
            state.switch(launch)
            launch.program_id = 0
            launch.finish()
            results.append(
                RunResult(_result(outs[world.slot(r, 0)], t_only, as_torch), launch.trace)
            )
    finally:
        state.pop()
    if not t_only:
        for kw in args:
            _write_back(list(kw.values()))
    return results


def _body(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Callable[[], Any]:
    return lambda: fn(**kwargs)


__all__ = ["MAX_RANKS", "World", "run_ranks"]
