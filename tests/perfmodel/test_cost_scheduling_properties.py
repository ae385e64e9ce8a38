"""Properties of the instruction-scheduling window on seeded random traces.

Each trace mixes TensorE / VectorE / ScalarE / GpSimd instructions and HBM loads and
stores over a few overlapping SBUF / PSUM buffers and two HBM tensors. At every window:
an instruction that touches a dependency block an earlier one touched, one of the two
writing it, starts no earlier than the earlier one ends (HBM: read-after-write and
write-after-read; the timeline does not order HBM writes against each other); an engine
runs one instruction at a time; DMAs are issued in program order. At window 1 every
engine runs in program order, and a window with every compute instruction in one
`nl.no_reorder` block prices exactly as window 1. The scheduler (its conflict index, its
early stop) gives the same floats as a plain reference of the same rules.
"""

from __future__ import annotations

import random
from itertools import pairwise

import pytest
from cost_fixtures import hbm, load, make_trace, matmul, psum, sbuf

from nki_kernels.interp.trace import HBM, Instr
from nki_kernels.perfmodel import costs, timeline
from nki_kernels.perfmodel.timeline import HBM_BLOCK_SHIFT, ONCHIP_BLOCK_SHIFT, schedule
from nki_kernels.targets import get_target

SEEDS = range(12)
WINDOWS = (1, 4, 8)
# buffers: disjoint ones, and a few overlapping them at the 64 B granule
SBUF_AT = (*range(0, 1 << 16, 4096), 1024, 2560, 4160)


def _store(sid: int, src: tuple, row_bytes: int) -> Instr:
    ins = load(sid, src, row_bytes)
    ins.reads, ins.writes = ins.writes, ins.reads
    ins.hbm_read, ins.hbm_write = 0, ins.nbytes
    ins.attrs.update(src_space="sbuf", dst_space="hbm")
    return ins


def _named(reg: tuple, rnd: random.Random, named: bool) -> tuple:
    """`reg` with an allocation id when `named`: one of two per place, so that two
    allocations share bytes (and with the overlapping places, partly share them)."""
    if not named:
        return reg
    return (reg[0], 1 + 2 * (reg[4] + (reg[0] << 20)) + rnd.randrange(2), *reg[2:])


def _random_trace(
    seed: int, target: str, gpsimd: bool = True, count: int = 40, named: bool = False
):
    rnd = random.Random(seed)

    def sb() -> tuple:
        return _named(sbuf(rnd.choice(SBUF_AT), rnd.choice((512, 1024, 2048))), rnd, named)

    def ps() -> tuple:
        return _named(psum(rnd.choice((0, 2048)), 2048), rnd, named)

    engines = ["tensor", "vector", "scalar", "dma", "dma"] + (["gpsimd"] if gpsimd else [])
    instrs = []
    for _ in range(count):
        eng = rnd.choice(engines)
        if eng == "tensor":
            ins = matmul(rnd.choice((128, 512)), (sb(), sb()), (ps(),))
        elif eng == "dma":
            sid, row = rnd.choice((1, 2)), rnd.choice((512, 2048))
            ins = load(sid, sb(), row) if rnd.random() < 0.6 else _store(sid, sb(), row)
            ins.reads = tuple(
                hbm(sid, rnd.choice((0, 1 << 16)), 1 << 16) if r[0] == HBM else r for r in ins.reads
            )
            ins.writes = tuple(
                hbm(sid, rnd.choice((0, 1 << 16)), 1 << 16) if r[0] == HBM else r
                for r in ins.writes
            )
            ins.attrs["queue"] = rnd.choice(("sync", "scalar"))
        else:
            src = ps() if rnd.random() < 0.3 else sb()
            opcode = rnd.choice(("tensor_tensor", "tensor_scalar"))
            reads = (src, sb()) if opcode == "tensor_tensor" else (src,)
            ins = Instr(eng, opcode, 128, rnd.choice((64, 256, 1024)), "float32", (), reads,
                        (sb(),), attrs={})  # fmt: skip
        instrs.append(ins)
    return make_trace(target, *instrs)


def _blocks(reg: tuple, rename: bool = False) -> tuple[int, int, int, int]:
    """(space, HBM tensor or, renaming, on-chip allocation, first block, end block)."""
    sh = HBM_BLOCK_SHIFT if reg[0] == HBM else ONCHIP_BLOCK_SHIFT
    owner = reg[1] if reg[0] == HBM or rename else 0
    return reg[0], owner, reg[4] >> sh, ((reg[5] - 1) >> sh) + 1


def _ordered(a: Instr, b: Instr, rename: bool = False) -> bool:
    """True when the timeline orders `b` (later) after `a`: a common block, one writing
    (renaming: on chip, of the same allocation)."""
    pairs = [(x, y) for x in a.writes for y in b.reads]  # read-after-write
    pairs += [(x, y) for x in a.reads for y in b.writes]  # write-after-read
    pairs += [(x, y) for x in a.writes for y in b.writes if x[0] != HBM]  # on chip only
    for x, y in pairs:
        bx, by = _blocks(x, rename), _blocks(y, rename)
        if bx[:2] == by[:2] and bx[2] < by[3] and by[2] < bx[3]:
            return True
    return False


@pytest.mark.parametrize("named", (False, True))
@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("seed", SEEDS)
def test_dependencies_engines_and_dma_order_hold(
    seed: int, window: int, named: bool, monkeypatch
) -> None:
    # named: every on-chip region names its allocation, so at window > 1 only accesses
    # of one allocation are ordered (renaming); window 1 keeps the physical order
    target = "trn2" if seed % 2 else "trn1"
    tr = _random_trace(seed, target, named=named)
    rename = named and window > 1
    issued: list[int] = []
    plan = costs.Pricer.dma_plan

    def logged(self, instr, region):  # type: ignore[no-untyped-def]
        issued.append(instr.index)
        return plan(self, instr, region)

    monkeypatch.setattr(costs.Pricer, "dma_plan", logged)
    tgt = get_target(target).replace(scheduling_window=window)
    # the issue log needs the reference loop (the compiled window-1 path plans each
    # distinct DMA once); the compiled path gives its floats
    s = schedule(tr, tgt, compiled=False)
    monkeypatch.setattr(costs.Pricer, "dma_plan", plan)
    fast = schedule(tr, tgt)
    assert (fast.start, fast.end, fast.latency_ns) == (s.start, s.end, s.latency_ns)
    ins = tr.instrs
    for j in range(len(ins)):
        for i in range(j):
            if _ordered(ins[i], ins[j], rename):
                assert s.start[j] >= s.end[i], (seed, window, i, j)
    assert issued == sorted(issued) == [i.index for i in ins if i.engine == "dma"]
    for eng in ("tensor", "vector", "scalar", "gpsimd"):
        mine = [k for k in range(len(ins)) if ins[k].engine == eng]
        spans = sorted((s.start[k], s.end[k]) for k in mine)
        assert all(a[1] <= b[0] for a, b in pairwise(spans)), (seed, window, eng)
        if window == 1:  # program order
            assert all(s.end[a] <= s.start[b] for a, b in pairwise(mine))


@pytest.mark.parametrize("seed", SEEDS)
def test_window_one_is_the_in_order_schedule(seed: int) -> None:
    tr = _random_trace(seed, "trn2")
    tgt = get_target("trn2")
    one = schedule(tr, tgt.replace(scheduling_window=1))
    off = schedule(tr, tgt.replace(scheduling_window=8), scheduling=False)
    assert (one.start, one.end, one.busy_ns) == (off.start, off.end, off.busy_ns)


@pytest.mark.parametrize("window", (4, 8))
@pytest.mark.parametrize("seed", SEEDS)
def test_one_no_reorder_block_prices_as_program_order(seed: int, window: int) -> None:
    # no GpSimd: it shares a port with VectorE, and the issue order across engines (which
    # a block does not fix: DMAs issue on arrival) would then decide who holds it first
    tr = _random_trace(seed, "trn2", gpsimd=False)
    tgt = get_target("trn2")
    one = schedule(tr, tgt.replace(scheduling_window=1))
    for ins in tr.instrs:
        if ins.engine != "dma":
            ins.no_reorder = 1
    kept = schedule(tr, tgt.replace(scheduling_window=window))
    assert (kept.start, kept.end, kept.busy_ns) == (one.start, one.end, one.busy_ns)


def test_the_window_reorders_many_random_traces() -> None:
    # the properties above are not vacuous: the window changes these schedules
    tgt = get_target("trn2")
    changed = 0
    for seed in SEEDS:
        tr = _random_trace(seed, "trn2")
        one = schedule(tr, tgt.replace(scheduling_window=1))
        eight = schedule(tr, tgt.replace(scheduling_window=8))
        changed += one.start != eight.start
    assert changed >= len(SEEDS) // 3


def _reference_window(
    instrs, window, engine_index, shifts, rename, core_of, ready_time, compute_start, price, place
):  # type: ignore[no-untyped-def]
    """The window rules of perfmodel/scheduling.py written plainly: conflicts by testing
    every pending instruction, ready times recomputed when an instruction's waits clear,
    every candidate priced (the scheduler's index and early stop must not change a float)."""

    def conflicts(a: Instr, b: Instr) -> bool:
        return _ordered(a, b, rename) or any(
            _blocks(x, rename)[:2] == _blocks(y, rename)[:2]
            and _blocks(x)[2] < _blocks(y)[3]
            and _blocks(y)[2] < _blocks(x)[3]
            for x in a.writes
            for y in b.writes
        )

    pending: dict = {}
    blockers: dict = {}
    dep_at: dict = {}
    bypassed: dict = {}
    last_in_block: dict = {}

    def eng(i: int) -> int:
        return engine_index[instrs[i].engine]

    def issue(idx: int) -> None:
        while blockers[idx]:
            force(min(blockers[idx]))
        ins = instrs[idx]
        lst = pending[(ins.program, eng(idx))]
        pos = lst.index(idx)
        for other in lst[:pos]:
            bypassed[other] += 1
        del lst[pos], blockers[idx], bypassed[idx]
        dep = dep_at.pop(idx, None)
        if dep is None or rename:
            dep = ready_time(ins, core_of(ins.program))
        place(idx, dep, None)
        for other, bl in blockers.items():
            if idx in bl:
                bl.discard(idx)
                if not bl:
                    dep_at[other] = ready_time(instrs[other], core_of(instrs[other].program))

    def force(idx: int) -> None:
        lst = pending[(instrs[idx].program, eng(idx))]
        while idx in blockers:
            issue(lst[0])

    def advance(key: tuple) -> None:
        lst = pending[key]
        for i in list(lst):
            while blockers.get(i) and all(eng(b) != key[1] for b in blockers[i]):
                force(min(blockers[i]))
        oldest = lst[0]
        if bypassed[oldest] >= len(lst) or (blockers[oldest] and all(blockers[i] for i in lst)):
            issue(oldest)
            return
        core = core_of(key[0])
        best, best_t = -1, float("inf")
        for i in lst:
            if not blockers[i]:
                if rename or i not in dep_at:
                    dep_at[i] = ready_time(instrs[i], core)
                t = compute_start(instrs[i], core, key[1], dep_at[i], price(instrs[i])[1])
                if t < best_t:
                    best, best_t = i, t
        issue(best)

    for idx, ins in enumerate(instrs):
        if ins.engine not in engine_index:
            for i in sorted(blockers):
                if i in blockers and (ins.engine != "dma" or conflicts(ins, instrs[i])):
                    (force if ins.engine == "dma" else issue)(i)
            place(idx, ready_time(ins, core_of(ins.program)), None)
            continue
        blockers[idx] = {i for i in blockers if conflicts(ins, instrs[i])}
        if ins.no_reorder:
            prev = last_in_block.get(ins.no_reorder)
            if prev in blockers:
                blockers[idx].add(prev)
            last_in_block[ins.no_reorder] = idx
        bypassed[idx] = 0
        lst = pending.setdefault((ins.program, eng(idx)), [])
        lst.append(idx)
        if len(lst) >= window:
            advance((ins.program, eng(idx)))
    while blockers:
        first = min(blockers)
        advance((instrs[first].program, eng(first)))


@pytest.mark.parametrize("named", (False, True))
@pytest.mark.parametrize("window", (2, 4, 8))
@pytest.mark.parametrize("seed", SEEDS)
def test_scheduler_equals_the_plain_reference(
    seed: int, window: int, named: bool, monkeypatch
) -> None:
    tr = _random_trace(seed, "trn2" if seed % 2 else "trn1", count=60, named=named)
    for k, ins in enumerate(tr.instrs):  # two blocks: the first and last quarter
        if ins.engine != "dma" and (k < 15 or k >= 45):
            ins.no_reorder = 1 if k < 15 else 2
    tgt = get_target(tr.target).replace(scheduling_window=window)
    fast = schedule(tr, tgt)
    monkeypatch.setattr(timeline, "schedule_window", _reference_window)
    plain = schedule(tr, tgt)
    assert (fast.start, fast.end, fast.busy_ns) == (plain.start, plain.end, plain.busy_ns)
