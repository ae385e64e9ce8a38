"""Invariants: latency >= roofline, more work never costs less, determinism, overlap."""

from __future__ import annotations

import dataclasses

import pytest
from cost_fixtures import load, make_trace, matmul, psum, sbuf, split_rows_copy, stream_exp, vector
from hypothesis import given, settings
from hypothesis import strategies as st

from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import COST_MODEL_VERSION, estimate, estimate_trace, schedule
from nki_kernels.perfmodel.calibration import MATMULS
from nki_kernels.perfmodel.estimate import build_estimate
from nki_kernels.perfmodel.synthetic import synthetic_trace

SMALL = {"M": 256, "K": 256, "N": 1024}
BLOCKED = {"tiles_m": 2, "tiles_n": 2, "tiles_k": 2}


def _mm(name: str, target: str, k: int = SMALL["K"]):
    kw = BLOCKED if name == "matmul_fully_blocked" else {}
    specs = (TensorSpec((k, SMALL["M"]), "bfloat16"), TensorSpec((k, SMALL["N"]), "bfloat16"))
    return estimate(MATMULS[name], *specs, target=target, **kw)


@pytest.mark.parametrize("target", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("name", sorted(MATMULS))
def test_latency_never_beats_the_roofline(name, target):
    est = _mm(name, target)
    assert est.latency_ns >= est.roofline_ns > 0
    assert est.roofline_ns == max(est.compute_bound_ns, est.memory_bound_ns)
    assert 0 < est.mfu <= 1 and 0 < est.mbu <= 1


@pytest.mark.parametrize("name", sorted(MATMULS))
def test_a_longer_contraction_never_costs_less(name):
    assert _mm(name, "trn2", k=512).latency_ns > _mm(name, "trn2", k=256).latency_ns


def test_estimates_are_deterministic():
    tr = synthetic_trace(2000)
    a, b = estimate_trace(tr), estimate_trace(tr)
    assert a == b
    assert schedule(tr).end == schedule(tr).end


def test_double_buffering_beats_single_buffering():
    x = TensorSpec((1024, 2048), "bfloat16")  # 8 row tiles of 4 KiB per partition
    single, double, triple = (estimate(stream_exp, x, b, target="trn2") for b in (1, 2, 3))
    assert double.latency_ns < 0.8 * single.latency_ns
    assert triple.latency_ns <= double.latency_ns
    # same work either way
    assert single.hbm_bytes == double.hbm_bytes and single.counts == double.counts


def test_two_cores_split_the_work():
    x = TensorSpec((2048, 1024), "bfloat16")
    one = estimate(split_rows_copy, x, target="trn2", lnc=1)
    two = estimate(split_rows_copy, x, target="trn2", lnc=2)
    assert two.lnc == 2 and two.hbm_bytes == one.hbm_bytes
    assert two.latency_ns < 0.7 * one.latency_ns
    assert two.memory_bound_ns == pytest.approx(one.memory_bound_ns / 2)
    assert two.latency_ns >= two.roofline_ns


def test_estimate_is_frozen_and_labeled():
    est = estimate_trace(synthetic_trace(100))
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.latency_ns = 0.0  # type: ignore[misc]
    assert est.label == f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
    assert est.to_dict()["label"] == est.label


# ---- random traces -----------------------------------------------------------------------
def _instr(kind: int, slot: int, n: int):
    a, b = sbuf(slot * 4096, 2048), sbuf(((slot + 1) % 4) * 4096, 2048)
    bank = psum((slot % 4) * 2048, 2048)
    if kind == 0:
        return load(1 + slot % 2, a, 2048, dge="hwdge" if slot == 3 else "unknown")
    if kind == 1:
        return matmul(n, (sbuf(slot * 4096, 256), b), (bank,), fp32=slot == 2)
    if kind == 2:
        return vector("tensor_tensor", n, (bank, a), (b,), op="add", psum_in=True)
    if kind == 3:
        return vector("tensor_copy", n, (a,), (b,), fast=True)
    ins = load(3, b, 1024)  # a store: SBUF -> HBM
    ins.reads, ins.writes = ins.writes, ins.reads
    ins.hbm_read, ins.hbm_write = 0, ins.nbytes
    return ins


_ops = st.lists(
    st.tuples(st.integers(0, 4), st.integers(0, 3), st.sampled_from([16, 128, 512])),
    min_size=1,
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=_ops, target=st.sampled_from(["trn1", "trn2", "trn3"]))
def test_random_traces_respect_the_roofline_and_grow_with_work(ops, target):
    instrs = [_instr(*op) for op in ops]
    full = estimate_trace(make_trace(target, *instrs))
    assert full.latency_ns >= full.roofline_ns
    prefix = estimate_trace(make_trace(target, *instrs[: len(instrs) // 2]))
    assert prefix.latency_ns <= full.latency_ns
    extra = estimate_trace(make_trace(target, *[_instr(*op) for op in ops], _instr(*ops[0])))
    assert extra.latency_ns >= full.latency_ns


def test_a_schedule_faster_than_its_roofline_is_refused():
    tr = synthetic_trace(200)
    sched = schedule(tr)
    est = estimate_trace(tr)
    broken = dataclasses.replace(sched, latency_ns=0.5 * est.roofline_ns)
    with pytest.raises(AssertionError, match=r"cost model invariant broken: latency .* < roofline"):
        build_estimate(tr, broken)
