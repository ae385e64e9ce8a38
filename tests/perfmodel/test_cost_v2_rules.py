"""The rules cost model v2 added: shared ports, tensor_scalar_reduce + 64, throttle re-engage."""

from __future__ import annotations

import pytest
from cost_fixtures import make_trace, matmul, psum, sbuf, vector

from nki_kernels.interp.trace import Instr
from nki_kernels.perfmodel.costs import compute_ns
from nki_kernels.perfmodel.timeline import schedule, throttled_duration
from nki_kernels.targets import TRN1, TRN2


def gpsimd(n: int, reads: tuple, writes: tuple) -> Instr:
    return Instr("gpsimd", "tensor_tensor", 128, n, "float32", (), reads, writes, attrs={})


def test_tensor_scalar_reduce_costs_n_plus_64():
    ins = vector("tensor_scalar_reduce", 512, (), (), op="maximum")
    assert compute_ns(ins, TRN2) == pytest.approx((512 + 64) / 0.96)


def test_perf_mode_vector_and_gpsimd_share_the_sbuf_port_on_trn2():
    # bf16 copy in perf mode (2048 / 4 = 512 cycles on VectorE) and an independent GpSimd
    # tensor_tensor (2 x 256 + 150 cycles): they take turns on the shared bus.
    fast = vector("tensor_copy", 2048, (sbuf(0, 4096),), (sbuf(8192, 4096),), fast=True)
    gp = gpsimd(256, (sbuf(16384, 1024),), (sbuf(20480, 1024),))
    sched = schedule(make_trace("trn2", fast, gp))
    assert sched.start[1] == pytest.approx(512 / 0.96)
    # a plain (fp32) VectorE copy does not use the shared bus: both start at 0
    slow = vector("tensor_copy", 2048, (sbuf(0, 8192),), (sbuf(8192, 8192),))
    sched = schedule(make_trace("trn2", slow, gp))
    assert sched.start[1] == 0.0


def test_vector_and_gpsimd_never_overlap_on_trn1():
    slow = vector("tensor_copy", 2048, (sbuf(0, 8192),), (sbuf(8192, 8192),))
    gp = gpsimd(256, (sbuf(16384, 1024),), (sbuf(20480, 1024),))
    sched = schedule(make_trace("trn1", slow, gp))
    assert sched.start[1] == pytest.approx(2048 / TRN1.vector_ghz)


def test_vector_and_scalar_take_turns_on_psum_on_trn1_only():
    v = vector("tensor_copy", 512, (psum(0, 2048),), (sbuf(0, 2048),), psum_in=True)
    s = Instr("scalar", "activation", 128, 512, "float32", (), (psum(2048, 2048),),
              (sbuf(4096, 2048),), attrs={"psum_in": True})  # fmt: skip
    assert schedule(make_trace("trn1", v, s)).start[1] == pytest.approx(512 / 1.12)
    assert schedule(make_trace("trn2", v, s)).start[1] == 0.0


def test_throttle_re_engages_after_an_idle_gap_over_half_the_window():
    # 3 us of matmuls warm TensorE up; a 1 us gap keeps it warm, a 2 us gap (> 1.5 us:
    # utilization over the 3 us window < 50 %) starts the next burst at 50 % again.
    n_warm = 40  # 40 x 512 / 2.4 GHz = 8.5 us of work: past the ramp
    warm = [matmul(512, (), (psum(0, 2048),)) for _ in range(n_warm)]
    full = (512 + TRN2.matmul_extra_cycles) / 2.4
    cold = throttled_duration(full, 0.0, 0.5, 3000.0)
    for gap, expected in ((1000.0, full), (2000.0, cold)):
        # the late matmul reads an SBUF region a DMA-free stand-in writes at a fixed time:
        # a GpSimd instruction whose length sets the gap after the warm-up ends
        tr = make_trace("trn2", *warm)
        sched0 = schedule(tr)
        end = sched0.latency_ns
        busy = Instr("gpsimd", "memset", 128, 1, "float32", (), (), (sbuf(0, 64),), attrs={})
        k = int((end + gap - 50.0) * 1.2) - 150  # GpSimd: (150 + N) cycles at 1.2 GHz
        busy.n = k
        late = matmul(512, (sbuf(0, 64),), (psum(2048, 2048),))
        sched = schedule(make_trace("trn2", *warm, busy, late))
        assert sched.start[-1] - end == pytest.approx(gap, abs=2.0)
        assert sched.end[-1] - sched.start[-1] == pytest.approx(expected, rel=1e-6)
