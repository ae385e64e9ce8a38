"""The compiled program-order schedule (perfmodel/compiled.py) against the reference loop.

Pricing speed must not move a single figure: a handful of small traces -- our flash
attention forward and backward (causal, LNC 1 and 2), a blocked matmul, LNC-split
copies, a hand-built trace with hardware / software DGE DMAs, a dead PSUM memset and an
engine the model does not know -- are scheduled under every parameter set of each
target's band (the shipped set included) by the reference loop (`compiled=False`, the
code every figure before the compiled path was priced with) and by the compiled path;
every start, end, busy time and the latency must be the same floats.
"""

from __future__ import annotations

import pytest
from cost_fixtures import hbm, load, make_trace, matmul, psum, sbuf, split_rows_copy, vector

from nki_kernels.attention import bench as attn
from nki_kernels.attention.config import AttentionProblem, FlashBwdConfig, FlashFwdConfig
from nki_kernels.interp import TensorSpec
from nki_kernels.interp.trace import Instr
from nki_kernels.model_shapes import AttentionShape
from nki_kernels.perfmodel import compiled as compiled_mod
from nki_kernels.perfmodel import trace_kernel
from nki_kernels.perfmodel.band import band, interpreter_target, parameter_sets
from nki_kernels.perfmodel.calibration import matmul_fully_blocked
from nki_kernels.perfmodel.compiled import reuse_compiled, schedule_sets
from nki_kernels.perfmodel.timeline import schedule
from nki_kernels.targets import get_target

SHAPE = AttentionShape("test", num_heads=4, num_kv_heads=2, head_dim=128)


def _attention(op: str, causal: bool, lnc: int, target: str):
    tgt = get_target(target)
    problem = AttentionProblem(1024, 1024, 128, 4, 2, 1, "bfloat16", "causal" if causal else "none")
    cls = FlashFwdConfig if op == "fwd" else FlashBwdConfig
    cfg = cls.heuristic(problem, tgt)
    kernel, args = attn._specs(op, 1024, SHAPE, 1, 2 * lnc, lnc, "bfloat16", causal, cfg)
    return trace_kernel(kernel, *args, target=tgt, lnc=lnc)


def _hand_built(target: str):
    """DGE DMAs (hardware and software), a dead PSUM memset, an unknown engine."""
    hw = load(1, sbuf(0, 2048), 2048, dge="hwdge", contiguous=True)
    sw = load(2, sbuf(4096, 1024), 1024, dge="swdge")
    dead = Instr("vector", "memset", 128, 512, "float32", (), (), (psum(0, 2048),), attrs={})
    mm = matmul(512, (sbuf(0, 2048), sbuf(4096, 1024)), (psum(0, 2048),))
    evac = vector("tensor_copy", 512, (psum(0, 2048),), (sbuf(8192, 2048),), psum_in=True)
    sync = Instr("sync", "barrier", 1, 1, "float32", (), (), (), attrs={})
    act = Instr("scalar", "activation", 128, 512, "float32", (), (sbuf(8192, 2048),),
                (sbuf(8192, 2048),), attrs={})  # fmt: skip
    store = load(1, sbuf(8192, 2048), 2048, dge="hwdge")
    store.reads, store.writes = store.writes, (hbm(3, 0, 1 << 18),)
    store.hbm_read, store.hbm_write = 0, store.nbytes
    return make_trace(target, hw, sw, dead, mm, evac, sync, act, store, hw, mm, evac)


def _traces(target: str):
    if target != "trn1":  # our attention kernels need NC-v3+ engines
        yield "attention fwd causal LNC 2", _attention("fwd", True, 2, target)
        yield "attention bwd LNC 1", _attention("bwd", False, 1, target)
        yield "attention bwd causal LNC 2", _attention("bwd", True, 2, target)
    specs = (TensorSpec((1024, 2048), "bfloat16"), TensorSpec((1024, 1024), "bfloat16"))
    yield "matmul_fully_blocked", trace_kernel(matmul_fully_blocked, *specs, target=target)
    x = TensorSpec((1024, 512), "bfloat16")
    yield "split rows LNC 2", trace_kernel(split_rows_copy, x, target=target, lnc=2)
    yield "hand-built", _hand_built(target)


def _same(a, b) -> None:
    assert a.latency_ns == b.latency_ns
    assert a.start == b.start and a.end == b.end
    assert a.busy_ns == b.busy_ns and a.dge_busy_ns == b.dge_busy_ns
    assert a.dma_queue_busy_ns == b.dma_queue_busy_ns and a.lnc == b.lnc


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
def test_compiled_schedule_is_the_reference_schedule_under_every_parameter_set(target):
    sets = [t.replace(scheduling_window=1) for t in parameter_sets(target)]
    for name, trace in _traces(target):
        with reuse_compiled():
            fast = [schedule(trace, t) for t in sets]
        for t, got in zip(sets, fast, strict=True):
            ref = schedule(trace, t, compiled=False)
            assert ref.latency_ns > 0, name
            _same(got, ref)
        assert schedule_sets(trace, sets) == [s.latency_ns for s in fast]


def test_the_hand_built_trace_exercises_dge_dead_stores_and_unknown_engines():
    s = schedule(_hand_built("trn2"), "trn2", compiled=False)
    assert s.dge_busy_ns > 0 and s.busy_ns["gpsimd"] > 0  # hardware and software DGE
    assert s.start[2] == s.end[2]  # the dead PSUM memset takes no time
    assert s.start[5] == s.end[5]  # the barrier: no engine the model knows


def test_scheduling_off_and_window_1_take_the_compiled_path_and_window_8_does_not(monkeypatch):
    specs = (TensorSpec((1024, 2048), "bfloat16"), TensorSpec((1024, 1024), "bfloat16"))
    trace = trace_kernel(matmul_fully_blocked, *specs, target="trn1")
    calls = []
    real = compiled_mod.compiled_for
    monkeypatch.setattr(compiled_mod, "compiled_for", lambda tr, t: calls.append(1) or real(tr, t))
    tgt = get_target("trn1")
    assert tgt.scheduling_window > 1
    off = schedule(trace, tgt, scheduling=False)
    assert calls == [1]
    _same(off, schedule(trace, tgt, scheduling=False, compiled=False))
    schedule(trace, tgt)  # window 8: the reference loop (reordering)
    schedule(trace, tgt.replace(scheduling_window=1), record=True)  # Chrome-trace segments
    assert calls == [1]


def test_reuse_compiles_each_trace_once_and_recompiles_a_grown_trace(monkeypatch):
    trace = _hand_built("trn2")
    made = []
    real = compiled_mod.compile_trace
    monkeypatch.setattr(compiled_mod, "compile_trace", lambda tr, t: made.append(1) or real(tr, t))
    with reuse_compiled():
        lo_hi = band(trace, "trn2")
        assert made == [1]
        trace.append(matmul(128, (sbuf(0, 256),), (psum(2048, 512),)))
        grown = schedule(trace, "trn2")
        assert made == [1, 1]
    _same(grown, schedule(trace, "trn2", compiled=False))
    assert lo_hi[0] < lo_hi[1]


def test_reuse_blocks_belong_to_their_thread():
    """A block opened in one thread neither serves nor closes another thread's cache."""
    import threading

    inside, release, errors, seen = threading.Event(), threading.Event(), [], []

    def other() -> None:
        try:
            with reuse_compiled():
                compiled_mod.cached(trace, "k", lambda: "other")
                inside.set()
                release.wait(10)
                seen.append(compiled_mod.cached(trace, "k", lambda: "again"))
        except Exception as e:
            errors.append(e)

    trace = _hand_built("trn2")
    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    assert compiled_mod.cached(trace, "k", lambda: "main") == "main"  # no block open here
    with reuse_compiled():
        assert compiled_mod.cached(trace, "k", lambda: "mine") == "mine"
    release.set()
    t.join(10)
    assert not errors and seen == ["other"]


@pytest.mark.parametrize("target", ["trn2", "trn3"])
def test_a_band_shares_dry_runs_because_cost_parameters_never_reach_the_interpreter(target):
    sets = parameter_sets(target)
    base = interpreter_target(sets[0])
    assert all(interpreter_target(t) == base for t in sets)
    # and the traces really are the same under every set
    t0 = trace_kernel(split_rows_copy, TensorSpec((512, 256), "bfloat16"), target=sets[0])
    t1 = trace_kernel(split_rows_copy, TensorSpec((512, 256), "bfloat16"), target=sets[-1])
    key = [(i.engine, i.opcode, i.reads, i.writes, i.attrs) for i in t0.instrs]
    assert key == [(i.engine, i.opcode, i.reads, i.writes, i.attrs) for i in t1.instrs]
