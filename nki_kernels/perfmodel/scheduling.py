"""The compiler's instruction scheduling, as a window of pending instructions per engine.

`neuronx-cc` reorders independent instructions ("automatic instruction scheduling", on
unless `--enable-instruction-scheduling=false`; `nl.no_reorder` constrains it). The
timeline models it as a window: instructions arrive in program order; a compute
instruction joins the pending list of its (program, compute engine); once that list
holds `window` instructions, the one that can start first is issued (ties: program
order). Rules, all on the timeline's dependency granule (64 B on chip, 64 KiB in HBM):

- An instruction is issued only after every earlier pending instruction that touches a
  block it touches, one of the two writing it (read-after-write, write-after-read,
  write-after-write), so the dependency tables hold exactly its producers' times when
  it is placed. On-chip blocks are matched by address across programs (a false
  dependency between two cores' same-address buffers only constrains issue order).
- Renaming (`rename`: every on-chip region of the trace names its allocation): two
  pending instructions whose on-chip accesses share bytes only through *different*
  allocations (a tile the interpreter placed where a dead one was) are not ordered --
  the compiler, which "allocates a physical address to each tile" after analyzing the
  memory dependencies, can give the later one other bytes. Hazards within one
  allocation are kept, and so is every hazard against an instruction already placed
  (the timeline checks write-after-read / write-after-write on physical bytes, and
  read-after-write per allocation): a rename reaches at most the pending instructions,
  so the extra SBUF it implies is bounded by the window. An explicit `address=`
  placement (allocation 0) may alias on purpose: a trace with one is not renamed.
- Issuing an instruction first issues those earlier pending instructions; one of another
  engine is issued together with its own engine's older pending instructions (a wait
  forced from another engine keeps that engine's order: no priority inversion). A
  pending instruction that waits only on other engines' pending instructions gets them
  issued before its engine picks.
- An instruction bypassed `window` times (its list's length) is issued next.
- A DMA (or an instruction of an engine the model does not schedule) is issued on
  arrival: a DMA after the pending instructions it conflicts with, any other after all
  pending instructions.
- `nl.no_reorder` ("operations inside the block execute in program order"): the compute
  instructions of one block (`Instr.no_reorder`, the block's id) are issued in program
  order across all engines -- each waits, like a dependency, for the block's previous
  compute instruction to be issued. Only the issue order is constrained: engines still
  run side by side as in program order (window 1), so a block changes nothing at window
  1. DMAs are issued in program order in any case.

A cached ready time is dropped when an instruction sharing bytes with it through another
allocation is placed (it may have moved the physical table entries the write reads).

Cost: each arriving instruction is matched against the pending instructions through an
index keyed by (space, tensor, 2 KiB chunk) (HBM: per tensor), and an engine picks by
scanning its list only up to the first instruction that can start when the engine is
free (nothing can start earlier), so pricing stays linear in the trace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..interp.trace import HBM, Instr

_CHUNK_SHIFT = 5  # on-chip index chunk: 32 blocks of 64 B = 2 KiB (a PSUM bank)


def schedule_window(
    instrs: list[Instr],
    window: int,
    engine_index: dict[str, int],
    shifts: tuple[int, int],
    rename: bool,
    core_of: Callable[[int], Any],
    ready_time: Callable[[Instr, Any], float],
    compute_start: Callable[[Instr, Any, int, float, int], float],
    price_compute: Callable[[Instr], tuple[float, int]],
    place: Callable[[int, float, tuple[float, int] | None], None],
) -> None:
    """Issue every instruction of `instrs` through the window (see the module docstring).

    `place(idx, ready, price)` runs instruction `idx` on the timeline given its
    dependency-table ready time `ready_time(instr, core)` (and its `price_compute`);
    `compute_start(instr, core, engine, ready, ports)` is when it would start on its
    engine now. Both read the timeline's state, so the issue order decides the schedule.
    """
    sh, hsh = shifts
    pending: dict[tuple[int, int], list[int]] = {}  # (program, engine) -> idx, in order
    # pending idx -> [0 (program, engine), 1 earlier pending idx it waits for, 2 times
    # bypassed, 3 price_compute, 4 ready time or None, 5 its index entries, 6 how many
    # of those it waits for run on its engine (index), 7 pending idx waiting for it,
    # 8 pending idx sharing bytes with it through another allocation (renaming)].
    # The ready time of an instruction with nothing to wait for is computed once and
    # dropped when an instruction that shares bytes with it (renaming) is placed: no
    # other instruction placed before it changes the table entries it reads.
    state: dict[int, list[Any]] = {}
    # pending accesses, {(idx, first block, end block, writes, allocation)}: on chip per
    # space and chunk, in HBM per tensor; allocation -1 unless renaming (on chip)
    Entry = tuple[int, int, int, bool, int]
    chip: list[list[dict[Entry, None]]] = [[], []]
    hbm: dict[int, dict[Entry, None]] = {}
    # pending instructions per (program, engine) that wait only on other engines' ones
    cross: dict[tuple[int, int], int] = {}
    block_last: dict[int, int] = {}  # no_reorder block -> its latest compute instruction

    def conflicting(ins: Instr, idx: int) -> tuple[set[int], set[int]]:
        """Pending instructions that touch a block `ins` touches, one of the two writing
        it: (those of the same allocation, those of another one: renaming only); `idx` >=
        0 also enters `ins` into the index as pending `idx`."""
        found: set[int] = set()
        shared: set[int] = set()
        add = found.add
        entered: list[tuple[dict, Entry]] = []
        cells: Sequence[dict[Entry, None]]
        for regs, w in ((ins.writes, True), (ins.reads, False)):
            for reg in regs:
                space = reg[0]
                aid = -1
                if space == HBM:
                    b, e = reg[4] >> hsh, ((reg[5] - 1) >> hsh) + 1
                    cell = hbm.get(reg[1])
                    if cell is None:
                        if idx < 0:
                            continue
                        cell = hbm[reg[1]] = {}
                    cells = (cell,)
                else:
                    if rename:
                        aid = reg[1]
                    b, e = reg[4] >> sh, ((reg[5] - 1) >> sh) + 1
                    c0 = b >> _CHUNK_SHIFT
                    # an empty block range still overlaps a range strictly around it
                    c1 = (e - 1 >> _CHUNK_SHIFT) if e > b else c0
                    space_cells = chip[space]
                    if c1 >= len(space_cells):
                        space_cells.extend({} for _ in range(c1 + 1 - len(space_cells)))
                    cells = (space_cells[c0],) if c0 == c1 else space_cells[c0 : c1 + 1]
                for cell in cells:
                    if w:
                        for j, b2, e2, _, a2 in cell:
                            if b < e2 and b2 < e:
                                if a2 == aid:
                                    add(j)
                                else:
                                    shared.add(j)
                    else:
                        for j, b2, e2, w2, a2 in cell:
                            if w2 and b < e2 and b2 < e:
                                if a2 == aid:
                                    add(j)
                                else:
                                    shared.add(j)
                    if idx >= 0:
                        entered.append((cell, (idx, b, e, w, aid)))
        if idx >= 0:  # after the look-ups: an instruction does not wait for itself
            for cell, entry in entered:
                cell[entry] = None
            state[idx][5] = entered
        shared -= found
        return found, shared

    def issue(idx: int) -> None:
        """Issue pending `idx` (after the pending instructions it depends on)."""
        st = state[idx]
        bl = st[1]
        while bl:
            force(min(bl))
        lst = pending[st[0]]
        pos = lst.index(idx)
        for k in range(pos):
            state[lst[k]][2] += 1
        del lst[pos], state[idx]
        for table, entry in st[5]:
            table.pop(entry, None)
        dep = st[4]
        if dep is None:
            ins = instrs[idx]
            dep = ready_time(ins, core_of(ins.program))
        place(idx, dep, st[3])
        for other in st[8]:
            o = state.get(other)
            if o is not None:
                o[4] = None
        ek = st[0][1]
        for other in st[7]:
            o = state[other]
            obl = o[1]
            obl.discard(idx)
            if o[0][1] == ek:
                o[6] -= 1
                if obl and not o[6]:  # now waits only on other engines
                    cross[o[0]] += 1
            elif not obl and not o[6]:  # waited only on other engines, now on nothing
                cross[o[0]] -= 1

    def force(idx: int) -> None:
        """Issue pending `idx` and, first, its engine's older pending instructions."""
        lst = pending[state[idx][0]]
        while idx in state:
            issue(lst[0])

    def advance(key: tuple[int, int]) -> None:
        """Issue the pending instruction of engine `key` that can start first."""
        lst = pending[key]
        ek = key[1]
        if cross[key]:
            for i in list(lst):
                st = state.get(i)
                while st is not None and st[1] and not st[6]:
                    force(min(st[1]))
                    st = state.get(i)
        oldest = lst[0]
        st = state[oldest]
        if st[2] >= len(lst) or (st[1] and all(state[i][1] for i in lst)):
            issue(oldest)
            return
        core = core_of(key[0])
        free = core.free[ek]
        best, best_t = -1, math.inf
        for i in lst:
            st = state[i]
            if st[1]:
                continue
            ins = instrs[i]
            dep = st[4]
            if dep is None:
                dep = st[4] = ready_time(ins, core)
            t = compute_start(ins, core, ek, dep, st[3][1])
            if t < best_t:
                best, best_t = i, t
                if t <= free:  # no instruction starts before its engine is free
                    break
        issue(best)

    for idx, ins in enumerate(instrs):
        ei = engine_index.get(ins.engine)
        if ei is None:
            shared: set[int] = set()
            if ins.engine == "dma":
                found, shared = conflicting(ins, -1) if state else (None, shared)
                if found:
                    for i in sorted(found):
                        if i in state:
                            force(i)
            else:
                for i in sorted(state):
                    if i in state:
                        issue(i)
            place(idx, ready_time(ins, core_of(ins.program)), None)
            for i in shared:
                o = state.get(i)
                if o is not None:
                    o[4] = None
            continue
        key = (ins.program, ei)
        lst = pending.get(key)
        if lst is None:
            lst = pending[key] = []
            cross[key] = 0
        st = state[idx] = [key, None, 0, price_compute(ins), None, (), 0, [], []]
        bl, shared = conflicting(ins, idx)
        st[1] = bl
        if shared:
            st[8] = list(shared)
            for j in shared:
                state[j][8].append(idx)
        block = ins.no_reorder
        if block:
            prev = block_last.get(block)
            if prev is not None and prev in state:
                bl.add(prev)
            block_last[block] = idx
        if bl:
            same = 0
            for j in bl:
                sj = state[j]
                sj[7].append(idx)
                if sj[0][1] == ei:
                    same += 1
            st[6] = same
            if not same:
                cross[key] += 1
        lst.append(idx)
        if len(lst) >= window:
            advance(key)
    while state:
        advance(state[min(state)][0])
