"""The timeline model: schedule a trace on one NeuronCore's engines.

Each LNC program (physical core) has a TensorE, VectorE, ScalarE and GpSimd, 16 DMA
engines, its DGE blocks and its share of HBM bandwidth. Every engine runs its
instructions in issue order: program order, or with the target's `scheduling_window` > 1
the order the compiler's instruction scheduling picks (`scheduling.py`: each compute
engine may issue an independent later instruction first). An instruction starts when

- its engine is free (in-order),
- its inputs are written (read-after-write) and, for its outputs, earlier readers and
  writers of the same bytes are done (write-after-read / write-after-write): on-chip
  regions are physical addresses from the interpreter's allocator, so a reused buffer
  carries the dependency that makes double buffering pay off (with the scheduler's
  renaming, `scheduling.py`, read-after-write is tracked per allocation instead: a
  read waits only for writes of its own tile);
- a wait on another engine adds the semaphore latency; on VectorE / ScalarE / GpSimd a
  read of what the previous instruction of the same engine wrote adds the
  dependent-instruction overhead (pipeline drain plus a fresh SBUF access).

A DMA is triggered in order on its queue once its dependencies are met (loads into
SBUF and stores out of it use separate trigger queues, as the compiler spreads DMA
triggers over several engines' queues), optionally waits for a descriptor generator
(hardware DGE block, or GpSimd for software DGE), and then, `dma_fixed_ns` after the
trigger, each DMA engine serving its partitions moves its share in the earliest idle gap
of that engine (queues on one engine are served round robin, so a ready load need not
wait behind a store that is still waiting for its data). Each engine moves HBM bytes at
no more than 1/16 of the core's HBM bandwidth, so the modeled time never beats the
bandwidth bound.

A tiling-mode matmul (`tile_position` / `tile_size`, rule 46, `pe_tiles.py`) waits for
the PE-array cells of its tile instead of the whole TensorE, so matmuls on disjoint tiles
overlap; its PSUM writes are ordered per 32-partition quadrant. A trace without one is
scheduled exactly as before.

VectorE and GpSimd (and on NC-v2 VectorE and ScalarE for PSUM) share access ports; an
instruction holding a port (`costs.port_mask`) starts only after the previous holder
ended (trainium2_arch).

TensorE on trn2/trn3 is throttled (dI/dt current limit, neuron-explorer "Understanding
throttling"): a cold engine runs at `throttle_start_fraction` of its clock and warms
linearly to full speed over `throttle_ramp_ns` of busy time; an idle gap long enough to
drop its utilization over the ~3 us window below 50 % (a gap > half the window, counting
only the latest gap) re-engages the limit. Thermal (TDP) limits are not modeled: the
docs give no figures for them.

Dependency tracking is per 64 B block of each partition's SBUF / PSUM (the allocation
granule; partitions are not distinguished) and per 64 KiB block of each HBM tensor (HBM
regions are view extents, so only read-after-write and write-after-read are enforced
there; writes to HBM are not ordered against each other). Each instruction costs
O(blocks it touches), so pricing is linear in the trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..interp.trace import HBM, PSUM, SBUF, Instr, Trace
from ..targets import Target, get_target
from . import costs
from .costs import DmaPlan, Pricer
from .dead_stores import dead_psum_memsets
from .dma_engines import DmaEngines
from .pe_tiles import FULL, TileState, has_tiles, pe_mask, psum_quadrants, run_tiled, tiled_start
from .scheduling import schedule_window

COMPUTE_ENGINES = ("tensor", "vector", "scalar", "gpsimd")
_ENGINE_INDEX = {name: i for i, name in enumerate(COMPUTE_ENGINES)}
_GPSIMD = _ENGINE_INDEX["gpsimd"]
ONCHIP_BLOCK_SHIFT = 6  # 64 B: the SBUF allocation granule
HBM_BLOCK_SHIFT = 16  # 64 KiB


@dataclass
class DmaSegment:
    """One DMA engine's share of one DMA instruction (recorded for the timeline picture)."""

    program: int
    queue: int
    start: float
    end: float
    index: int


@dataclass
class Schedule:
    """When every instruction ran, and how busy each resource was (all in ns)."""

    target: Target
    lnc: int
    start: list[float]
    end: list[float]
    latency_ns: float
    busy_ns: dict[str, float]
    dma_queue_busy_ns: list[list[float]]
    dge_busy_ns: float
    dma_segments: list[DmaSegment] = field(default_factory=list)


class _Core:
    """Engine clocks and dependency tables of one physical core."""

    __slots__ = (
        "busy",
        "dge_free",
        "dma",
        "free",
        "last_writes",
        "port",
        "r",
        "tiles",
        "trigger",
        "w",
        "warm",
    )

    def __init__(self, target: Target, tiles: bool = False) -> None:
        self.free = [0.0, 0.0, 0.0, 0.0]
        # free time of the shared ports, by mask bit (costs.port_mask: the VectorE/GpSimd
        # SBUF bus, NC-v2's VectorE/ScalarE PSUM port, NC-v3+'s eight PSUM banks)
        self.port = [0.0] * costs.PORT_BITS
        self.last_writes: list[tuple] = [(), (), (), ()]
        self.busy = [0.0, 0.0, 0.0, 0.0]
        self.trigger: dict[tuple, float] = {}
        self.dge_free = [0.0] * max(1, target.dge_instances)
        self.dma = DmaEngines(target.dma_engines)
        self.warm = target.throttle_ramp_ns if target.throttle_start_fraction >= 1.0 else 0.0
        sbuf = (target.sbuf_bytes_per_partition >> ONCHIP_BLOCK_SHIFT) + 1
        psum = (target.psum_banks * target.psum_bank_bytes >> ONCHIP_BLOCK_SHIFT) + 1
        # indexed by trace space: SBUF = 0, PSUM = 1
        self.w = [[0.0] * sbuf, [0.0] * psum]
        # last access of any kind (read or write): what a writer must wait for
        self.r = [[0.0] * sbuf, [0.0] * psum]
        # PE cells and PSUM quadrants, kept only for a trace with tiled matmuls (rule 46)
        self.tiles = TileState(psum) if tiles else None


def throttled_duration(work_ns: float, warm: float, start_frac: float, ramp_ns: float) -> float:
    """Wall time to do `work_ns` of full-speed TensorE work starting `warm` ns into the ramp.

    The speed grows linearly from `start_frac` at warm = 0 to 1 at warm = `ramp_ns`.
    """
    if start_frac >= 1.0 or warm >= ramp_ns:
        return work_ns
    k = (1.0 - start_frac) / ramp_ns
    a = warm
    ramp_work = start_frac * (ramp_ns - a) + 0.5 * k * (ramp_ns * ramp_ns - a * a)
    if work_ns >= ramp_work:
        return (ramp_ns - a) + (work_ns - ramp_work)
    c = start_frac * a + 0.5 * k * a * a + work_ns
    b = (-start_frac + math.sqrt(start_frac * start_frac + 2.0 * k * c)) / k
    return b - a


def start_compute(
    core: _Core, ei: int, dep: float, sem: float, drain_ns: float, ports: int
) -> float:
    """When a compute instruction ready at `dep` would start on engine `ei` of `core`:
    after the engine is free, the semaphore latency `sem` when it waits on another
    engine, `drain_ns` after the previous instruction (0: no drain, see the module
    docstring) and once every port of the mask `ports` is released."""
    free = core.free[ei]
    start = dep + sem if dep > free else free
    if drain_ns:
        drained = free + drain_ns
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
    return start


def run_compute(
    core: _Core, ei: int, start: float, work: float, ports: int, throttle: tuple | None
) -> float:
    """Run `work` ns of engine `ei` from `start`: its end (TensorE slowed by the throttle
    ramp, `throttle` = (start fraction, ramp ns, re-engage gap ns), or None when the
    target has none); the engine and the ports it holds are busy until then."""
    if ei == 0 and throttle is not None:
        s0, ramp, reengage = throttle
        # "If utilization drops below 50% over any ~3 microsecond window ... the limit
        # re-engages": an idle gap longer than half the ramp window resets it.
        warm = 0.0 if start - core.free[0] > reengage else core.warm
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
    return end


def run_dma(
    core: _Core,
    plan: DmaPlan,
    queue: tuple,
    dep: float,
    fixed: float,
    segment: Callable[[int, int, float, float], None] | None = None,
) -> tuple[float, float, float]:
    """Trigger a DMA ready at `dep` on `queue` (in order), wait for its descriptor
    generator and move its bytes on its DMA engines `fixed` ns after: (start, end,
    hardware-DGE ns it used). `segment(lo, hi, start, end)` sees each engine range's
    transfer."""
    trig = core.trigger.get(queue, 0.0)
    if dep > trig:
        trig = dep
    core.trigger[queue] = trig
    ready = trig
    dge = 0.0
    if plan.dge == "hw":
        slots = core.dge_free
        i = min(range(len(slots)), key=slots.__getitem__)
        s = slots[i] if slots[i] > ready else ready
        slots[i] = s + plan.dge_ns
        dge = plan.dge_ns
        ready = s + plan.dge_ns
    elif plan.dge == "sw":  # descriptors written by GpSimd
        s = core.free[_GPSIMD] if core.free[_GPSIMD] > ready else ready
        core.free[_GPSIMD] = s + plan.dge_ns
        core.busy[_GPSIMD] += plan.dge_ns
        ready = s + plan.dge_ns
    t0 = ready + fixed
    per = plan.per_engine_ns
    first = math.inf
    end = t0
    rng = plan.engines
    for lo, hi, s in core.dma.transfer(rng.start, rng.stop, t0, per):
        f = s + per
        if s < first:
            first = s
        if f > end:
            end = f
        if segment is not None:
            segment(lo, hi, s, f)
    return (first if first < math.inf else t0), end, dge


def block_ranges(regs: tuple) -> tuple[tuple, tuple]:
    """A region list as dependency-table ranges: on chip (space, first block, end block)
    per 64 B block, HBM (tensor, first block, end block) per 64 KiB block; empty ranges
    left out (they wait for nothing and publish nothing)."""
    chip, hbm = [], []
    for reg in regs:
        if reg[0] == HBM:
            b, e = reg[4] >> HBM_BLOCK_SHIFT, ((reg[5] - 1) >> HBM_BLOCK_SHIFT) + 1
            if e > b:
                hbm.append((reg[1], b, e))
        else:
            b, e = reg[4] >> ONCHIP_BLOCK_SHIFT, ((reg[5] - 1) >> ONCHIP_BLOCK_SHIFT) + 1
            if e > b:
                chip.append((reg[0], b, e))
    return tuple(chip), tuple(hbm)


def ready_at(
    core: _Core, hbm_w: dict, hbm_r: dict, rchip: tuple, rhbm: tuple, wchip: tuple, whbm: tuple
) -> float:
    """When what an instruction reads is written and what it writes is no longer read
    or written by an earlier one (`block_ranges` of its reads and writes)."""
    cw, cr = core.w, core.r
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
    return dep


def publish_at(
    core: _Core,
    hbm_w: dict,
    hbm_r: dict,
    rchip: tuple,
    rhbm: tuple,
    wchip: tuple,
    whbm: tuple,
    end: float,
    keep_later: bool = False,
) -> None:
    """Record an instruction ending at `end` as the latest reader / writer of its ranges.

    `keep_later`: a write keeps a later time already recorded (a tiled matmul, which may
    end before an earlier one on another PE tile that wrote other partitions of the
    same blocks); any other write ends after every earlier access of its blocks."""
    cw, cr = core.w, core.r
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
        _raise_to(hbm_r, tid, b, e, end)
    for tid, b, e in whbm:
        _raise_to(hbm_w, tid, b, e, end)
    for space, b, e in wchip:
        if keep_later:
            for table in (cw[space], cr[space]):
                table[b:e] = [x if x > end else end for x in table[b:e]]
        else:
            cw[space][b:e] = cr[space][b:e] = [end] * (e - b)


def dma_queue(instr: Instr) -> tuple:
    """The trigger queue of a DMA: its queue name and whether it writes on chip."""
    return (instr.attrs.get("queue", "sync"), instr.writes[0][0] if instr.writes else HBM)


def throttle_of(tgt: Target) -> tuple | None:
    """`run_compute`'s throttle argument for `tgt` (None: TensorE runs at full speed)."""
    if tgt.throttle_start_fraction >= 1.0:
        return None
    ramp = tgt.throttle_ramp_ns
    return tgt.throttle_start_fraction, ramp, ramp * tgt.throttle_reengage_utilization


def drain_ns(tgt: Target) -> list[float]:
    """The dependent-instruction overhead of each compute engine in ns."""
    return [
        (tgt.dependent_instr_cycles + tgt.sbuf_access_cycles) / ghz
        for ghz in (tgt.tensor_ghz, tgt.vector_ghz, tgt.scalar_ghz, tgt.gpsimd_ghz)
    ]


def _overlaps(reads: tuple, writes: tuple, by_allocation: bool = False) -> bool:
    """Whether a read overlaps a write: same HBM tensor, or on chip the same bytes (and,
    `by_allocation`, the same allocation)."""
    for r in reads:
        for w in writes:
            if (
                r[0] == w[0]
                and r[4] < w[5]
                and w[4] < r[5]
                and (r[1] == w[1] or (r[0] != HBM and not by_allocation))
            ):
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


def renames(trace: Trace) -> bool:
    """Whether every on-chip region of `trace` names its allocation (none is 0: an
    explicit `address=` placement or a hand-built region), so the scheduler may rename."""
    for ins in trace.instrs:
        for regs in (ins.reads, ins.writes):
            for reg in regs:
                if reg[0] != HBM and not reg[1]:
                    return False
    return True


class _AllocTables:
    """Per-allocation write times (renaming): allocation id -> [first block, last write
    time per block], the list covering the blocks seen so far."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t: dict[int, list] = {}

    def span(self, aid: int, b: int, e: int) -> tuple[list[float], int]:
        """(write times, offset) of allocation `aid`, covering blocks [b, e)."""
        ent = self.t.get(aid)
        if ent is None:
            ent = self.t[aid] = [b, [0.0] * (e - b if e > b else 1)]
        off, wl = ent
        if b < off:
            wl[:0] = [0.0] * (off - b)
            ent[0] = off = b
        if e - off > len(wl):
            wl.extend([0.0] * (e - off - len(wl)))
        return wl, off


def schedule(
    trace: Trace,
    target: Target | str | None = None,
    record: bool = False,
    scheduling: bool = True,
    compiled: bool = True,
) -> Schedule:
    """Place every instruction of `trace` on its engine; see the module docstring.

    `record=True` also keeps each DMA engine's share of each DMA (for the Chrome trace).
    `scheduling=False` prices the trace as compiled with the compiler's instruction
    scheduling off (`--enable-instruction-scheduling=false`): every engine in program
    order. With it on (the compiler default) each compute engine may issue a later
    independent instruction ahead of an earlier one, within `scheduling_window`
    (`scheduling.schedule_window`); window 1 is program order. Program order without
    `record` runs on the compiled trace (`compiled.py`: the same rules and floats, the
    trace's parameter-free work done once); `compiled=False` forces the reference loop
    below (what the compiled path is tested against).
    """
    tgt = get_target(target if target is not None else trace.target)
    window = max(1, int(tgt.scheduling_window)) if scheduling else 1
    if compiled and window == 1 and not record:
        from .compiled import compiled_for, schedule_compiled

        comp = compiled_for(trace, tgt)
        starts_c, ends_c, latency, dge_busy, cores_c = schedule_compiled(comp, trace, tgt)
        return _result(tgt, trace, cores_c, starts_c, ends_c, latency, dge_busy, [])
    instrs = trace.instrs
    count = len(instrs)
    starts = [0.0] * count
    ends = [0.0] * count
    cores: list[_Core] = []
    hbm_w: dict[int, list[float]] = {}
    hbm_r: dict[int, list[float]] = {}
    segments: list[DmaSegment] = []
    sem = tgt.semaphore_ns
    fixed = tgt.dma_fixed_ns
    throttle = throttle_of(tgt)
    dep_ns = drain_ns(tgt)
    # the compiler renames buffers that merely share bytes (scheduling.py), at window > 1
    rename = window > 1 and renames(trace)
    span = _AllocTables().span
    sh, hsh = ONCHIP_BLOCK_SHIFT, HBM_BLOCK_SHIFT
    totals = [0.0, 0.0]  # latency, DGE busy
    pricer = Pricer(tgt)
    price_dma, price_compute = pricer.dma_plan, pricer.compute
    assert SBUF == 0 and PSUM == 1
    # PSUM memsets a starting matmul overwrites unread: dropped (dead_stores.py)
    dead = dead_psum_memsets(instrs)
    # tiled matmuls (rule 46, pe_tiles.py): without any (or with the overlap off, the
    # band's slow corner), none of the tile code runs
    tiled = tgt.tensor_tile_overlap > 0 and has_tiles(instrs)

    def core_of(prog: int) -> _Core:
        while prog >= len(cores):
            cores.append(_Core(tgt, tiled))
        return cores[prog]

    ranges: dict[tuple, tuple[tuple, tuple]] = {}  # regions repeat (a loop's tiles)

    def ranges_of(regs: tuple) -> tuple[tuple, tuple]:
        got = ranges.get(regs)
        if got is None:
            got = ranges[regs] = block_ranges(regs)
        return got

    quads: dict[tuple, tuple] = {}  # PSUM quadrant ranges of a region list (tiled traces)

    def quads_of(regs: tuple) -> tuple:
        got = quads.get(regs)
        if got is None:
            got = quads[regs] = psum_quadrants(regs, sh)
        return got

    def tile_of(ins: Instr) -> int:
        """The PE cells `ins` occupies (FULL unless a tiled matmul in a tiled trace)."""
        return pe_mask(ins) if tiled and ins.engine == "tensor" else FULL

    def ready_time(ins: Instr, core: _Core) -> float:
        """When the instruction's inputs are written and its outputs free (tables)."""
        rchip, rhbm = ranges_of(ins.reads)
        wchip, whbm = ranges_of(ins.writes)
        extra = 0.0
        if tiled and tile_of(ins) != FULL:  # its PSUM writes: per partition quadrant
            wchip = tuple(r for r in wchip if r[0] != PSUM)
            extra = core.tiles.quad_ready(quads_of(ins.writes))  # type: ignore[union-attr]
        if not rename:
            dep = ready_at(core, hbm_w, hbm_r, rchip, rhbm, wchip, whbm)
            return dep if dep > extra else extra
        # renamed: a read waits only for the writes of its own allocation
        dep = ready_at(core, hbm_w, hbm_r, (), rhbm, wchip, whbm)
        if extra > dep:
            dep = extra
        for reg in ins.reads:
            if reg[0] == HBM:
                continue
            b, e = reg[4] >> sh, ((reg[5] - 1) >> sh) + 1
            if e <= b:
                continue
            wl, off = span(reg[1], b, e)
            b, e = b - off, e - off
            if e - b == 1:
                t = wl[b] if b < len(wl) else 0.0
            else:
                part = wl[b:e]
                t = max(part) if part else 0.0
            if t > dep:
                dep = t
        return dep

    def compute_start(ins: Instr, core: _Core, ei: int, dep: float, ports: int) -> float:
        """When `ins` (ready at `dep`, holding `ports`) would start on engine `ei` now."""
        if ei == 0 and tiled:
            mask = tile_of(ins)
            if mask != FULL:
                return tiled_start(core.tiles, mask, dep, sem)  # type: ignore[arg-type]
        drain = ei and core.last_writes[ei] and _overlaps(ins.reads, core.last_writes[ei], rename)
        return start_compute(core, ei, dep, sem, dep_ns[ei] if drain else 0.0, ports)

    def place(idx: int, dep: float, price: tuple[float, int] | None = None) -> None:
        """Run instruction `idx` now that everything it depends on is placed (a compute
        instruction's `price_compute` may be given)."""
        ins = instrs[idx]
        if dead and idx in dead:
            starts[idx] = ends[idx] = dep
            return
        core = core_of(ins.program)
        eng = ins.engine
        if eng == "dma":
            plan: DmaPlan = price_dma(ins, _chip_region(ins))

            def segment(lo: int, hi: int, s: float, f: float) -> None:
                for q in range(lo, hi):
                    segments.append(DmaSegment(ins.program, q, s, f, idx))

            start, end, dge = run_dma(
                core, plan, dma_queue(ins), dep, fixed, segment if record else None
            )
            totals[1] += dge
        else:
            ei = _ENGINE_INDEX.get(eng)
            if ei is None:  # an engine the model does not know (e.g. a sync barrier)
                starts[idx] = ends[idx] = dep
                return
            work, ports = price_compute(ins) if price is None else price
            start = compute_start(ins, core, ei, dep, ports)
            mask = tile_of(ins) if ei == 0 else FULL
            if mask != FULL:
                end = run_tiled(core, core.tiles, mask, start, work, throttle)  # type: ignore[arg-type]
            else:
                end = run_compute(core, ei, start, work, ports, throttle)
                if ei == 0 and tiled:
                    core.tiles.occupy(FULL, start, end)  # type: ignore[union-attr]
            core.last_writes[ei] = ins.writes

        starts[idx] = start
        ends[idx] = end
        if end > totals[0]:
            totals[0] = end
        publish(ins, core, end)

    def publish(ins: Instr, core: _Core, end: float) -> None:
        """Record `ins` as the latest reader / writer of what it touches."""
        rchip, rhbm = ranges_of(ins.reads)
        wchip, whbm = ranges_of(ins.writes)
        keep = tiled and tile_of(ins) != FULL
        publish_at(core, hbm_w, hbm_r, rchip, rhbm, wchip, whbm, end, keep)
        if tiled:
            tiles = core.tiles
            assert tiles is not None
            tiles.quad_publish(quads_of(ins.reads), end)
            tiles.quad_publish(quads_of(ins.writes), end)
        if rename:  # and per allocation
            for reg in ins.writes:
                if reg[0] == HBM:
                    continue
                b, e = reg[4] >> sh, ((reg[5] - 1) >> sh) + 1
                if e > b:
                    wl, off = span(reg[1], b, e)
                    if keep:
                        part = wl[b - off : e - off]
                        wl[b - off : e - off] = [x if x > end else end for x in part]
                    else:
                        wl[b - off : e - off] = [end] * (e - b)

    if window == 1:
        for idx in range(count):
            ins = instrs[idx]
            place(idx, ready_time(ins, core_of(ins.program)))
    else:
        schedule_window(
            instrs,
            window,
            _ENGINE_INDEX,
            (sh, hsh),
            rename,
            core_of,
            ready_time,  # type: ignore[arg-type]
            compute_start,  # type: ignore[arg-type]
            price_compute,
            place,
        )

    return _result(tgt, trace, cores, starts, ends, totals[0], totals[1], segments)


def _result(
    tgt: Target,
    trace: Trace,
    cores: list[_Core],
    starts: list[float],
    ends: list[float],
    latency: float,
    dge_busy: float,
    segments: list[DmaSegment],
) -> Schedule:
    busy = {name: sum(c.busy[i] for c in cores) for i, name in enumerate(COMPUTE_ENGINES)}
    dma_busy = [c.dma.busy() for c in cores]
    busy["dma"] = sum(sum(b) for b in dma_busy) / tgt.dma_engines
    return Schedule(
        target=tgt,
        lnc=max(trace.lnc, len(cores)),
        start=starts,
        end=ends,
        latency_ns=latency,
        busy_ns=busy,
        dma_queue_busy_ns=dma_busy,
        dge_busy_ns=dge_busy,
        dma_segments=segments,
    )


def _raise_to(table: dict, tid: object, b: int, e: int, end: float) -> None:
    """Raise the times of blocks [b, e) of tensor `tid` in `table` to at least `end`."""
    row = table.get(tid)
    if row is None:
        row = table[tid] = []
    if len(row) < e:
        row.extend([0.0] * (e - len(row)))
    part = row[b:e]
    if max(part) <= end:
        row[b:e] = [end] * (e - b)
    else:
        row[b:e] = [x if x > end else end for x in part]
