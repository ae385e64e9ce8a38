"""The compiler's instruction scheduling as a per-engine window (perfmodel/scheduling.py)."""

from __future__ import annotations

import pytest
from cost_fixtures import make_trace, sbuf, vector

from nki_kernels.perfmodel import timeline
from nki_kernels.perfmodel.timeline import schedule
from nki_kernels.targets import TRN1


def _two_chains() -> list:
    # chain A: a0 -> a1 (a1 reads what a0 wrote); b0 independent of both, after a1 in
    # program order. In order, a1 pays the dependent-instruction overhead; scheduled,
    # b0 runs between them and the overhead disappears.
    a0 = vector("tensor_scalar", 512, (sbuf(0, 2048),), (sbuf(2048, 2048),))
    a1 = vector("tensor_scalar", 512, (sbuf(2048, 2048),), (sbuf(4096, 2048),))
    b0 = vector("tensor_scalar", 512, (sbuf(6144, 2048),), (sbuf(8192, 2048),))
    return [a0, a1, b0]


def test_window_one_is_program_order() -> None:
    tr = make_trace("trn1", *_two_chains())
    tgt = TRN1.replace(scheduling_window=1)
    off = schedule(tr, tgt, scheduling=False)
    on1 = schedule(tr, tgt)
    assert on1.start == off.start and on1.end == off.end
    assert off.start[0] < off.start[1] < off.start[2]


def test_scheduler_fills_the_dependent_overhead_with_an_independent_instruction() -> None:
    tr = make_trace("trn1", *_two_chains())
    tgt = TRN1.replace(scheduling_window=4)
    off = schedule(tr, tgt, scheduling=False)
    on = schedule(tr, tgt)
    work = 512 / TRN1.vector_ghz
    overhead = (TRN1.dependent_instr_cycles + TRN1.sbuf_access_cycles) / TRN1.vector_ghz
    assert off.latency_ns == pytest.approx(3 * work + overhead)
    # b0 issued between a0 and a1: no overhead, same work
    assert on.start[2] == pytest.approx(work)
    assert on.start[1] == pytest.approx(2 * work)
    assert on.latency_ns == pytest.approx(3 * work)
    assert on.busy_ns["vector"] == pytest.approx(off.busy_ns["vector"])


def test_scheduler_keeps_write_after_read() -> None:
    # b0 overwrites what a1 reads: it must not move ahead of a1
    a0, a1, _ = _two_chains()
    b0 = vector("tensor_scalar", 512, (sbuf(6144, 2048),), (sbuf(2048, 2048),))
    tr = make_trace("trn1", a0, a1, b0)
    on = schedule(tr, TRN1.replace(scheduling_window=4))
    assert on.start[2] >= on.end[1]


def _shared_bytes(b0_writes: tuple, b0_alloc: int) -> list:
    # _two_chains with every region named by its allocation (1 .. 4); b0 writes
    # `b0_writes` as allocation `b0_alloc`, b1 then reads what b0 wrote
    a0 = vector("tensor_scalar", 512, (sbuf(0, 2048, alloc=1),), (sbuf(2048, 2048, alloc=2),))
    a1 = vector("tensor_scalar", 512, (sbuf(2048, 2048, alloc=2),), (sbuf(4096, 2048, alloc=3),))
    out = sbuf(b0_writes[0], b0_writes[1], alloc=b0_alloc)
    b0 = vector("tensor_scalar", 512, (sbuf(6144, 2048, alloc=4),), (out,))
    b1 = vector("tensor_scalar", 512, (out,), (sbuf(8192, 2048, alloc=6),))
    return [a0, a1, b0, b1]


@pytest.mark.parametrize(
    "b0_writes", [(2048, 2048), (4096, 2048)], ids=["write_after_read", "write_after_write"]
)
def test_scheduler_renames_allocations_that_only_share_bytes(b0_writes: tuple) -> None:
    # b0 writes allocation 5 over the bytes a1 reads (allocation 2) or writes (3): the
    # compiler gives it other bytes, so at window > 1 it runs between a0 and a1 as in
    # test_scheduler_fills_the_dependent_overhead...; b1's read of b0's output stays after b0
    tr = make_trace("trn1", *_shared_bytes(b0_writes, 5))
    work = 512 / TRN1.vector_ghz
    on = schedule(tr, TRN1.replace(scheduling_window=4))
    assert on.start[2] == pytest.approx(work)
    assert on.start[1] == pytest.approx(2 * work)
    assert on.start[3] >= on.end[2]
    # window 1 (trn2 / trn3 ship it): physical bytes, b0 waits for a1
    one = schedule(tr, TRN1.replace(scheduling_window=1))
    assert one.start[2] >= one.end[1]
    assert one.start == schedule(tr, TRN1, scheduling=False).start


@pytest.mark.parametrize("b0_writes", [(2048, 2048), (4096, 2048)])
def test_scheduler_keeps_hazards_within_one_allocation(b0_writes: tuple) -> None:
    # b0 overwrites a1's own allocation (2 or 3): a true dependency, kept at any window
    alloc = 2 if b0_writes[0] == 2048 else 3
    tr = make_trace("trn1", *_shared_bytes(b0_writes, alloc))
    on = schedule(tr, TRN1.replace(scheduling_window=4))
    assert on.start[2] >= on.end[1]


def test_an_unnamed_region_turns_renaming_off_for_the_trace() -> None:
    # one explicit placement (allocation 0) may alias any tile: nothing is renamed
    instrs = _shared_bytes((2048, 2048), 5)
    instrs.append(vector("tensor_scalar", 64, (sbuf(12288, 256),), (sbuf(12544, 256),)))
    tr = make_trace("trn1", *instrs)
    assert not timeline.renames(tr)
    on = schedule(tr, TRN1.replace(scheduling_window=4))
    assert on.start[2] >= on.end[1]
