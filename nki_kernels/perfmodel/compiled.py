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
import math
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..interp.trace import HBM, Instr, Trace
from ..targets import Target
from .costs import Pricer
from .dead_stores import dead_psum_memsets

DMA, OTHER, DEAD = 4, 5, 6  # instruction kinds beyond the compute engines 0-3
_ENGINES = {"tensor": 0, "vector": 1, "scalar": 2, "gpsimd": 3, "dma": DMA}


@dataclass(frozen=True)
class CompiledTrace:
    """The parameter-free part of a trace's schedule (see the module docstring).

    `ops[i]` = (kind, program, chip reads, HBM reads, chip writes, HBM writes, cost,
    aux): chip regions as (space, first block, end block), HBM ones as (tensor, first
    block, end block), empty ranges left out (they wait for nothing and publish nothing);
    `cost` indexes `compute_reps` (compute kinds) or `dma_reps` (DMA); `aux` is the
    drain flag of a compute instruction and the trigger queue of a DMA.
    """

    ops: tuple[tuple, ...]
    cores: int
    compute_reps: tuple[int, ...]  # first priced instruction of each compute cost key
    dma_reps: tuple[tuple[int, tuple | None], ...]  # (instruction, chip region) per plan
    psum_bank_bytes: int  # the bank size the cost keys were made with


def _overlaps(reads: tuple, writes: tuple) -> bool:
    # timeline._overlaps without renaming (window 1)
    for r in reads:
        for w in writes:
            if r[0] == w[0] and r[4] < w[5] and w[4] < r[5] and (r[1] == w[1] or r[0] != HBM):
                return True
    return False


def _chip_region(instr: Instr) -> tuple | None:
    for reg in instr.writes:
        if reg[0] != HBM:
            return reg
    for reg in instr.reads:
        if reg[0] != HBM:
            return reg
    return None


def compile_trace(trace: Trace, target: Target) -> CompiledTrace:
    """The parameter-free schedule data of `trace` (cost keys made on `target`'s PSUM
    banks, the one target limit they read)."""
    from .timeline import HBM_BLOCK_SHIFT, ONCHIP_BLOCK_SHIFT

    sh, hsh = ONCHIP_BLOCK_SHIFT, HBM_BLOCK_SHIFT
    instrs = trace.instrs
    dead = dead_psum_memsets(instrs)
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
        chip, hbm = [], []
        for reg in regs:
            if reg[0] == HBM:
                b, e = reg[4] >> hsh, ((reg[5] - 1) >> hsh) + 1
                if e > b:
                    hbm.append((reg[1], b, e))
            else:
                b, e = reg[4] >> sh, ((reg[5] - 1) >> sh) + 1
                if e > b:
                    chip.append((reg[0], b, e))
        got = blocks[regs] = (tuple(chip), tuple(hbm))
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
            aux = (ins.attrs.get("queue", "sync"), ins.writes[0][0] if ins.writes else HBM)
        elif kind != OTHER:
            key = keyer.compute_key(ins)
            cost = compute_ids.get(key, -1)
            if cost < 0:
                cost = compute_ids[key] = len(compute_reps)
                compute_reps.append(idx)
            prev = last_writes.get((prog, kind))
            aux = bool(kind and prev and _overlaps(ins.reads, prev))
            last_writes[(prog, kind)] = ins.writes
        ops.append((kind, prog, rchip, rhbm, wchip, whbm, cost, aux))
    return CompiledTrace(
        tuple(ops), cores, tuple(compute_reps), tuple(dma_reps), target.psum_bank_bytes
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
    from .timeline import COMPUTE_ENGINES, _Core, throttled_duration

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
    cores = [_Core(tgt) for _ in range(comp.cores)]
    hbm_w: dict[int, list[float]] = {}
    hbm_r: dict[int, list[float]] = {}
    sem = tgt.semaphore_ns
    fixed = tgt.dma_fixed_ns
    s0, ramp = tgt.throttle_start_fraction, tgt.throttle_ramp_ns
    throttled = s0 < 1.0
    reengage = ramp * tgt.throttle_reengage_utilization
    dep_ns = [
        (tgt.dependent_instr_cycles + tgt.sbuf_access_cycles) / ghz
        for ghz in (tgt.tensor_ghz, tgt.vector_ghz, tgt.scalar_ghz, tgt.gpsimd_ghz)
    ]
    pricer = Pricer(tgt)
    ccost = [pricer.compute(instrs[i]) for i in comp.compute_reps]
    plans = [pricer.dma_plan(instrs[i], region) for i, region in comp.dma_reps]
    latency = dge_busy = 0.0
    gpsimd = COMPUTE_ENGINES.index("gpsimd")
    inf = math.inf

    for idx in range(count):
        kind, prog, rchip, rhbm, wchip, whbm, cost, aux = ops[idx]
        core = cores[prog]
        cw, cr = core.w, core.r
        # ready: inputs written, outputs' earlier readers and writers done
        dep = 0.0
        for space, b, e in rchip:
            wl = cw[space]
            if e - b == 1:
                t = wl[b] if b < len(wl) else 0.0
            else:
                part = wl[b:e]
                t = max(part) if part else 0.0
            if t > dep:
                dep = t
        for tid, b, e in rhbm:
            wl = hbm_w.get(tid)
            if wl is None:
                continue
            if e - b == 1:
                t = wl[b] if b < len(wl) else 0.0
            else:
                part = wl[b:e]
                t = max(part) if part else 0.0
            if t > dep:
                dep = t
        for space, b, e in wchip:
            t = max(cr[space][b:e])
            if t > dep:
                dep = t
        for tid, b, e in whbm:
            rl = hbm_r.get(tid)
            if rl is None:
                continue
            part = rl[b:e]
            t = max(part) if part else 0.0
            if t > dep:
                dep = t

        if kind >= OTHER:  # a dead store, or an engine the model does not know
            starts[idx] = ends[idx] = dep
            continue
        if kind == DMA:
            plan = plans[cost]
            trigger = core.trigger
            trig = trigger.get(aux, 0.0)
            if dep > trig:
                trig = dep
            trigger[aux] = trig
            ready = trig
            if plan.dge == "hw":
                slots = core.dge_free
                i = min(range(len(slots)), key=slots.__getitem__)
                s = slots[i] if slots[i] > ready else ready
                slots[i] = s + plan.dge_ns
                dge_busy += plan.dge_ns
                ready = s + plan.dge_ns
            elif plan.dge == "sw":
                s = core.free[gpsimd] if core.free[gpsimd] > ready else ready
                core.free[gpsimd] = s + plan.dge_ns
                core.busy[gpsimd] += plan.dge_ns
                ready = s + plan.dge_ns
            t0 = ready + fixed
            per = plan.per_engine_ns
            first = inf
            end = t0
            rng = plan.engines
            for _lo, _hi, s in core.dma.transfer(rng.start, rng.stop, t0, per):
                f = s + per
                if s < first:
                    first = s
                if f > end:
                    end = f
            start = first if first < inf else t0
        else:
            ei = kind
            free = core.free[ei]
            work, ports = ccost[cost]
            start = dep + sem if dep > free else free
            if aux:
                drained = free + dep_ns[ei]
                if drained > start:
                    start = drained
            if ports:
                port = core.port
                bit, rest = 0, ports
                while rest:
                    if rest & 1 and port[bit] > start:
                        start = port[bit]
                    rest >>= 1
                    bit += 1
            if ei == 0 and throttled:
                warm = 0.0 if start - free > reengage else core.warm
                dur = throttled_duration(work, warm, s0, ramp)
                warm += dur
                core.warm = warm if warm < ramp else ramp
            else:
                dur = work
            end = start + dur
            core.free[ei] = end
            core.busy[ei] += dur
            if ports:
                port = core.port
                bit, rest = 0, ports
                while rest:
                    if rest & 1:
                        port[bit] = end
                    rest >>= 1
                    bit += 1

        starts[idx] = start
        ends[idx] = end
        if end > latency:
            latency = end
        # publish: the latest reader / writer of what it touched
        for space, b, e in rchip:
            rl = cr[space]
            if e - b == 1 and b < len(rl):
                if rl[b] <= end:
                    rl[b] = end
                continue
            part = rl[b:e]
            if part and max(part) <= end:
                rl[b:e] = [end] * (e - b)
            else:
                rl[b:e] = [x if x > end else end for x in part]
        for tid, b, e in rhbm:
            rl = hbm_r.get(tid)
            if rl is None:
                rl = hbm_r[tid] = []
            if len(rl) < e:
                rl.extend([0.0] * (e - len(rl)))
            part = rl[b:e]
            if max(part) <= end:
                rl[b:e] = [end] * (e - b)
            else:
                rl[b:e] = [x if x > end else end for x in part]
        for tid, b, e in whbm:
            wl = hbm_w.get(tid)
            if wl is None:
                wl = hbm_w[tid] = []
            if len(wl) < e:
                wl.extend([0.0] * (e - len(wl)))
            wl[b:e] = [x if x > end else end for x in wl[b:e]]
        for space, b, e in wchip:
            cw[space][b:e] = cr[space][b:e] = [end] * (e - b)
    return starts, ends, latency, dge_busy, cores


def schedule_sets(trace: Trace, targets: Sequence[Target]) -> list[float]:
    """Latency in ns of `trace` under each of `targets` (one compile, one schedule each)."""
    from .timeline import schedule

    with reuse_compiled():
        return [schedule(trace, t).latency_ns for t in targets]
