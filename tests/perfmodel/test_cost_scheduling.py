"""The compiler's instruction scheduling as a per-engine window (perfmodel/scheduling.py)."""

from __future__ import annotations

import pytest
from cost_fixtures import make_trace, sbuf, vector

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
