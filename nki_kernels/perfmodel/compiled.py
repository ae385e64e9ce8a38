"""The program-order timeline (window 1) on a trace compiled once, rescheduled many times.

`timeline.schedule` places each instruction by reading its regions, its engine and its
cost. Everything but the cost parameters is a property of the trace alone: which
dependency blocks an instruction reads and writes, which engine and core it runs on,
whether its engine must drain the previous instruction's writes first (a read of what
the previous instruction of the same engine wrote), which PSUM memsets are dead stores,
which instructions share a cost (the `Pricer`'s keys). `compile_trace` works all of that
out once; `schedule_compiled` then runs the same placement rules as `timeline.schedule`
at `scheduling_window` 1, in the same order and with the same float operations, so it
gives the same start / end / busy floats (tests/perfmodel/test_cost_compiled.py checks
them against the reference loop). A band schedules one trace under about ten parameter
sets; each set prices only the trace's distinct instruction shapes.

A compiled trace describes the trace as it was when compiled: a trace changed afterwards
needs a new one. `reuse_compiled()` keeps the compiled form of each trace scheduled
inside the block (traces that are not changed meanwhile, as a replayed benchmark's).
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..interp.trace import PSUM, Trace
from ..targets import Target
from .costs import Pricer
from .dead_stores import dead_psum_memsets
from .pe_tiles import FULL, has_tiles, pe_mask, psum_quadrants, run_tiled, tiled_start

DMA, OTHER, DEAD = 4, 5, 6  # instruction kinds beyond the compute engines 0-3
_ENGINES = {"tensor": 0, "vector": 1, "scalar": 2, "gpsimd": 3, "dma": DMA}


@dataclass(frozen=True)
class CompiledTrace:
    """The parameter-free part of a trace's schedule (see the module docstring).

    `ops[i]` = (kind, program, chip reads, HBM reads, chip writes, HBM writes, cost,
    aux, tile): chip regions as (space, first block, end block), HBM ones as (tensor,
    first block, end block), empty ranges left out (they wait for nothing and publish
    nothing); `cost` indexes `compute_reps` (compute kinds) or `dma_reps` (DMA); `aux` is
    the drain flag of a compute instruction and the trigger queue of a DMA; `tile` is
    None unless the trace has tiled matmuls (`pe_tiles.py`), then (PE cell mask, PSUM
    quadrants read, PSUM quadrants written, chip writes a tiled matmul waits for
    partition-blind).
    """

    ops: tuple[tuple, ...]
    cores: int
    compute_reps: tuple[int, ...]  # first priced instruction of each compute cost key
    dma_reps: tuple[tuple[int, tuple | None], ...]  # (instruction, chip region) per plan
    psum_bank_bytes: int  # the bank size the cost keys were made with
    tiled: bool = False  # whether any instruction is a tiled matmul (rule 46)


def compile_trace(trace: Trace, target: Target) -> CompiledTrace:
    """The parameter-free schedule data of `trace` (cost keys made on `target`'s PSUM
    banks, the one target limit they read)."""
    from .timeline import ONCHIP_BLOCK_SHIFT, _chip_region, _overlaps, block_ranges, dma_queue

    instrs = trace.instrs
    dead = dead_psum_memsets(instrs)
    tiled = has_tiles(instrs)
    keyer = Pricer(target)
    compute_ids: dict[tuple, int] = {}
    compute_reps: list[int] = []
    dma_ids: dict[tuple, int] = {}
    dma_reps: list[tuple[int, tuple | None]] = []
    last_writes: dict[tuple[int, int], tuple] = {}
    ops = []
    cores = 0
    # regions repeat (a loop's tiles): their block ranges are worked out once
    blocks: dict[tuple, tuple[tuple, tuple]] = {}

    def split(regs: tuple) -> tuple[tuple, tuple]:
        got = blocks[regs] = block_ranges(regs)
        return got

    for idx, ins in enumerate(instrs):
        prog = ins.program
        if prog >= cores:
            cores = prog + 1
        rd, wr = ins.reads, ins.writes
        rchip, rhbm = blocks.get(rd) or split(rd)
        wchip, whbm = blocks.get(wr) or split(wr)
        kind = _ENGINES.get(ins.engine, OTHER)
        cost, aux = -1, None
        if idx in dead:
            kind = DEAD
        elif kind == DMA:
            region = _chip_region(ins)
            key = keyer.dma_key(ins, region)
            cost = dma_ids.get(key, -1)
            if cost < 0:
                cost = dma_ids[key] = len(dma_reps)
                dma_reps.append((idx, region))
            aux = dma_queue(ins)
        elif kind != OTHER:
            key = keyer.compute_key(ins)
            cost = compute_ids.get(key, -1)
            if cost < 0:
                cost = compute_ids[key] = len(compute_reps)
                compute_reps.append(idx)
            prev = last_writes.get((prog, kind))
            aux = bool(kind and prev and _overlaps(ins.reads, prev, False))
            last_writes[(prog, kind)] = ins.writes
        tile = None
        if tiled:
            mask = pe_mask(ins) if kind == 0 else FULL
            own = tuple(r for r in wchip if r[0] != PSUM) if mask != FULL else wchip
            quads = psum_quadrants(rd, ONCHIP_BLOCK_SHIFT), psum_quadrants(wr, ONCHIP_BLOCK_SHIFT)
            tile = (mask, *quads, own)
        ops.append((kind, prog, rchip, rhbm, wchip, whbm, cost, aux, tile))
    return CompiledTrace(
        tuple(ops), cores, tuple(compute_reps), tuple(dma_reps), target.psum_bank_bytes, tiled
    )


_LOCAL = threading.local()  # each thread its own stack of open reuse blocks


def _reuse_stack() -> list[weakref.WeakKeyDictionary]:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


@contextlib.contextmanager
def reuse_compiled() -> Iterator[None]:
    """Within the block, each trace is compiled once (it must not change meanwhile).
    The cache belongs to the calling thread."""
    stack = _reuse_stack()
    stack.append(weakref.WeakKeyDictionary())
    try:
        yield
    finally:
        stack.pop()


def cached(trace: Trace, key: Hashable, make: Callable[[], Any]) -> Any:
    """`make()`, kept per trace under `key` while a `reuse_compiled` block is open (and
    made again when the trace has grown)."""
    stack = _reuse_stack()
    if not stack:
        return make()
    per_trace = stack[-1].setdefault(trace, {})
    n = len(trace.instrs)
    hit = per_trace.get(key)
    if hit is None or hit[0] != n:
        hit = per_trace[key] = (n, make())
    return hit[1]


def compiled_for(trace: Trace, target: Target) -> CompiledTrace:
    """`compile_trace(trace, target)`, from the `reuse_compiled` cache when one is open."""
    return cached(trace, ("compiled", target.psum_bank_bytes), lambda: compile_trace(trace, target))


def schedule_compiled(
    comp: CompiledTrace, trace: Trace, tgt: Target
) -> tuple[list[float], list[float], float, float, list]:
    """Run the window-1 timeline of `trace` (compiled as `comp`) on `tgt`: (starts, ends,
    latency, DGE busy, cores), as `timeline.schedule` computes them."""
    from .timeline import (
        _Core,
        drain_ns,
        publish_at,
        ready_at,
        run_compute,
        run_dma,
        start_compute,
        throttle_of,
    )

    if comp.psum_bank_bytes != tgt.psum_bank_bytes:
        raise ValueError(
            f"target: compiled for {comp.psum_bank_bytes}-byte PSUM banks; got "
            f"{tgt.psum_bank_bytes}"
        )
    instrs = trace.instrs
    ops = comp.ops
    count = len(ops)
    starts = [0.0] * count
    ends = [0.0] * count
    # the overlap off (the band's slow corner): tiled matmuls hold the whole engine
    tiled = comp.tiled and tgt.tensor_tile_overlap > 0
    cores = [_Core(tgt, tiled) for _ in range(comp.cores)]
    hbm_w: dict[int, list[float]] = {}
    hbm_r: dict[int, list[float]] = {}
    sem = tgt.semaphore_ns
    fixed = tgt.dma_fixed_ns
    throttle = throttle_of(tgt)
    dep_ns = drain_ns(tgt)
    pricer = Pricer(tgt)
    ccost = [pricer.compute(instrs[i]) for i in comp.compute_reps]
    plans = [pricer.dma_plan(instrs[i], region) for i, region in comp.dma_reps]
    latency = dge_busy = 0.0

    for idx in range(count):
        kind, prog, rchip, rhbm, wchip, whbm, cost, aux, tile = ops[idx]
        if not tiled:
            tile = None
        core = cores[prog]
        mask = FULL if tile is None else tile[0]
        if mask == FULL:
            dep = ready_at(core, hbm_w, hbm_r, rchip, rhbm, wchip, whbm)
        else:  # a tiled matmul: its PSUM writes wait per partition quadrant
            dep = ready_at(core, hbm_w, hbm_r, rchip, rhbm, tile[3], whbm)
            q = core.tiles.quad_ready(tile[2])
            if q > dep:
                dep = q
        if kind >= OTHER:  # a dead store, or an engine the model does not know
            starts[idx] = ends[idx] = dep
            continue
        if kind == DMA:
            start, end, dge = run_dma(core, plans[cost], aux, dep, fixed)
            dge_busy += dge
        elif mask != FULL:
            work, ports = ccost[cost]
            start = tiled_start(core.tiles, mask, dep, sem)
            end = run_tiled(core, core.tiles, mask, start, work, throttle)
        else:
            work, ports = ccost[cost]
            start = start_compute(core, kind, dep, sem, dep_ns[kind] if aux else 0.0, ports)
            end = run_compute(core, kind, start, work, ports, throttle)
            if kind == 0 and tile is not None:
                core.tiles.occupy(FULL, start, end)

        starts[idx] = start
        ends[idx] = end
        if end > latency:
            latency = end
        publish_at(core, hbm_w, hbm_r, rchip, rhbm, wchip, whbm, end, mask != FULL)
        if tile is not None:
            core.tiles.quad_publish(tile[1], end)
            core.tiles.quad_publish(tile[2], end)
    return starts, ends, latency, dge_busy, cores


def schedule_sets(trace: Trace, targets: Sequence[Target]) -> list[float]:
    """Latency in ns of `trace` under each of `targets` (one compile, one schedule each)."""
    from .timeline import schedule

    with reuse_compiled():
        return [schedule(trace, t).latency_ns for t in targets]
