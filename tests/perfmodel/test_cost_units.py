"""Exact costs of single instructions and tiny hand-built traces (arithmetic in comments)."""

from __future__ import annotations

import math

import pytest
from cost_fixtures import hbm, load, make_trace, matmul, psum, sbuf, vector

from nki_kernels.interp.trace import Instr
from nki_kernels.perfmodel import estimate_trace
from nki_kernels.perfmodel.costs import (
    Pricer,
    compute_ns,
    descriptor_ns,
    dma_plan,
    tensor_ideal_ns,
)
from nki_kernels.perfmodel.timeline import schedule, throttled_duration
from nki_kernels.targets import TRN1, TRN2, TRN3, get_target


def test_one_matmul_costs_its_moving_columns():
    # trn1: max(N=512, 64) cycles / 2.8 GHz = 182.857 ns; no throttling on trn1
    tr = make_trace("trn1", matmul(512, (sbuf(0, 256), sbuf(256, 1024)), (psum(0, 2048),)))
    assert estimate_trace(tr).latency_ns == pytest.approx(512 / 2.8)


@pytest.mark.parametrize(
    ("n", "fp32", "transpose", "target", "factor"),
    [
        (32, False, False, TRN1, 1),  # below the 64-cycle MultiplyMoving floor
        (512, True, False, TRN1, 4),  # fp32 operands: 4x
        (128, True, True, TRN1, 4),  # fp32 PE transpose: 4x on NC-v2
        (128, True, True, TRN2, 2),  # ... 2x on NC-v3+
        (128, False, True, TRN2, 1),  # bf16 transpose: max(P, 64)
        (128, False, True, TRN3, 1 / 2),  # ... halved by NC-v4's background transpose
    ],
)
def test_tensor_engine_cycle_rules(n, fp32, transpose, target, factor):
    # max(N, 64) plus the fitted cycles per instruction (v3: 18.75 on trn2 / trn3, 0 on
    # trn1), times the dtype / transpose factor
    ins = matmul(n, (), (), fp32=fp32, transpose=transpose)
    cycles = (max(n, 64) + target.matmul_extra_cycles) * factor
    assert compute_ns(ins, target) == pytest.approx(cycles / target.tensor_ghz)


def test_back_to_back_matmuls_serialize_in_order():
    # two independent matmuls on one TensorE: 2 x 512 / 2.8 ns
    mm = [matmul(512, (sbuf(0, 256), sbuf(256, 1024)), (psum(i * 2048, 2048),)) for i in (0, 1)]
    assert estimate_trace(make_trace("trn1", *mm)).latency_ns == pytest.approx(2 * 512 / 2.8)


def test_cross_engine_dependency_pays_the_semaphore():
    # matmul (182.857 ns) -> VectorE copy of its PSUM bank: waits for the matmul plus the
    # 50 ns semaphore, then N = 512 elements at 1 / cycle, 1.12 GHz = 457.143 ns
    mm = matmul(512, (sbuf(0, 256), sbuf(256, 1024)), (psum(0, 2048),))
    cp = vector("tensor_copy", 512, (psum(0, 2048),), (sbuf(4096, 2048),), psum_in=True)
    sched = schedule(make_trace("trn1", mm, cp))
    assert sched.start[1] == pytest.approx(512 / 2.8 + 50)
    assert sched.latency_ns == pytest.approx(512 / 2.8 + 50 + 512 / 1.12)


def test_dependent_instruction_on_the_same_engine_pays_the_drain():
    # copy A -> B (512 cycles), then tensor_tensor reading B (2N = 1024 cycles): the second
    # waits the dependent overhead (trn1's fitted cycles, v2: the perf guide's 264-cycle
    # chain) plus a fresh SBUF access (60 cycles)
    v1 = vector("tensor_copy", 512, (sbuf(0, 2048),), (sbuf(2048, 2048),))
    dep = vector(
        "tensor_tensor", 512, (sbuf(2048, 2048), sbuf(0, 2048)), (sbuf(8192, 2048),), op="add"
    )
    indep = vector(
        "tensor_tensor", 512, (sbuf(0, 2048), sbuf(0, 2048)), (sbuf(8192, 2048),), op="add"
    )
    assert estimate_trace(make_trace("trn1", v1, dep)).latency_ns == pytest.approx(
        (512 + get_target("trn1").dependent_instr_cycles + 60 + 1024) / 1.12
    )
    assert estimate_trace(make_trace("trn1", v1, indep)).latency_ns == pytest.approx(
        (512 + 1024) / 1.12
    )


def test_isolated_dma_on_trn2():
    # [128, 2 KiB] HBM -> SBUF with strided HBM rows: 16 engines x 8 rows; a 2 KiB
    # descriptor costs the smooth max of 2048 / r (r the fitted engine rate, 22.7 B/ns in
    # v3) and the fitted floor f: ((2048 / r)^4 + f^4)^(1/4) (~96 ns, the DMA overview's
    # 2 KiB transfer). Latency = trigger-to-start (fit: 0 ns on trn2) + 8 descriptors
    # (HBM needs 262144 / 363 = 722 ns).
    f, r = TRN2.dma_descriptor_min_ns, TRN2.dma_engine_bytes_per_ns
    desc = ((2048 / r) ** 4 + f**4) ** 0.25
    tr = make_trace("trn2", load(1, sbuf(0, 2048), 2048))
    fixed = TRN2.dma_fixed_ns
    assert estimate_trace(tr).latency_ns == pytest.approx(fixed + 8 * desc)
    # a hardware-DGE DMA first spends ~600 ns in a descriptor generator
    tr = make_trace("trn2", load(1, sbuf(0, 2048), 2048, dge="hwdge"))
    assert estimate_trace(tr).latency_ns == pytest.approx(600 + fixed + 8 * desc)


def test_contiguous_rows_merge_into_one_descriptor_per_engine():
    # [128, 256 B] with the HBM side contiguous: each engine's 8 rows are one 2 KiB piece
    # of HBM and move as one transfer (DMA overview: "a single 2KiB read"), not 8 floors.
    merged = dma_plan(load(1, sbuf(0, 256), 256, contiguous=True), sbuf(0, 256), TRN2)
    strided = dma_plan(load(1, sbuf(0, 256), 256), sbuf(0, 256), TRN2)
    assert merged.descriptors == 16 and strided.descriptors == 128
    assert merged.per_engine_ns == pytest.approx(descriptor_ns(2048, TRN2))
    assert strided.per_engine_ns == pytest.approx(8 * descriptor_ns(256, TRN2))
    # one engine, 4 rows of 8 KiB: one 32 KiB transfer, bound by the engine's share of
    # HBM (32768 / (363 / 16) = 1444 ns; the profile shows 1,416 ns)
    one = load(1, sbuf(0, 8192, p=4), 8192, contiguous=True)
    ns = dma_plan(one, sbuf(0, 8192, p=4), TRN2).per_engine_ns
    assert ns == pytest.approx(max(32768 * 16 / 363, descriptor_ns(32768, TRN2)))
    assert ns == pytest.approx(32768 * 16 / 363, rel=1e-5)


def test_dma_engines_follow_the_partitions():
    # 8 partitions per engine: partitions [0, 4) -> engine 0; [8, 24) -> engines 1 and 2
    assert dma_plan(load(1, sbuf(0, 512, p=4), 512), sbuf(0, 512, p=4), TRN2).engines == range(1)
    ins = load(1, (0, 0, 8, 24, 0, 512), 512)
    plan = dma_plan(ins, (0, 0, 8, 24, 0, 512), TRN2)
    assert plan.engines == range(1, 3)
    assert plan.per_engine_ns == pytest.approx(8 * descriptor_ns(512, TRN2))  # 16 rows / 2


def test_dram_to_dram_copy_is_cut_into_64k_descriptors():
    # 1 MiB contiguous: 16 descriptors of 64 KiB, one per engine (65536 / rate ns each);
    # but each engine's 64 KiB cross HBM twice (read + write) at 363 / 16 B/ns:
    # 2 * 65536 * 16 / 363 = 5777 ns per engine
    ins = Instr(
        "dma", "dma_copy", 1, 1 << 19, "bfloat16", ("bfloat16",),
        (hbm(1, 0, 1 << 20),), (hbm(2, 0, 1 << 20),),
        hbm_read=1 << 20, hbm_write=1 << 20, nbytes=1 << 20,
        attrs={"descriptors": 1, "descriptor_bytes": 1 << 20, "dge": "unknown"},
    )  # fmt: skip
    plan = dma_plan(ins, None, TRN2)
    assert (plan.descriptors, len(plan.engines)) == (16, 16)
    assert descriptor_ns(65536, TRN2) == pytest.approx(65536 / TRN2.dma_engine_bytes_per_ns)
    assert plan.per_engine_ns == pytest.approx(2 * 65536 * 16 / 363)
    assert plan.hbm_bytes == 2 << 20  # read + write both cross HBM


def test_indirect_dma_uses_software_dge_on_gpsimd():
    ins = load(1, sbuf(0, 512), 512)
    ins.attrs["indirect"] = True
    tr = make_trace("trn2", ins)
    sched = schedule(tr)
    assert sched.busy_ns["gpsimd"] == pytest.approx(TRN2.dma_swdge_gpsimd_ns)


@pytest.mark.parametrize(
    ("opcode", "attrs", "target", "cycles"),
    [
        ("tensor_copy", {"fast": True}, TRN2, 2048 / 4),  # bf16 perf mode up to 4x on trn2
        ("tensor_copy", {"fast": True}, TRN1, 2048),  # no perf modes on NC-v2
        # contiguous bf16 with PSUM on one side: the 2x mode (trainium2_arch; v2 gave none)
        ("tensor_copy", {"fast": True, "psum_in": True}, TRN2, 2048 / 2),
        ("tensor_tensor", {"op": "add"}, TRN2, 2 * 2048),  # two inputs: 2N
        ("tensor_tensor", {"op": "add", "psum_in": True}, TRN2, 2048),  # a PSUM input: N
        ("tensor_tensor", {"op": "add", "fast": True}, TRN2, 2048),  # all-bf16: 2x
        ("tensor_reduce", {"op": "add", "fast": True}, TRN2, 1024),  # bf16 add: N/2
        ("reciprocal", {}, TRN2, 8 * 2048),  # 8N
        ("bn_aggr", {}, TRN2, 13 * 2048 / 3),  # 13N/3
    ],
)
def test_vector_engine_perf_modes(opcode, attrs, target, cycles):
    ins = vector(opcode, 2048, (), (), **attrs)
    assert compute_ns(ins, target) == pytest.approx(cycles / target.vector_ghz)


def test_floors_and_start_up_costs():
    # 8 elements still cost the 64-cycle MIN_II floor
    assert compute_ns(vector("tensor_copy", 8, (), ()), TRN2) == pytest.approx(64 / 0.96)
    # ScalarE activation with a reduction: max(64, N) + 64
    act = Instr("scalar", "activation", 128, 512, "float32", (), (), (), attrs={"reduce": True})
    assert compute_ns(act, TRN2) == pytest.approx((512 + 64) / 1.2)
    # GpSimd iota: ~150 start-up + N
    iota = Instr("gpsimd", "iota", 128, 512, "int32", (), (), ())
    assert compute_ns(iota, TRN2) == pytest.approx((150 + 512) / 1.2)


def test_pricer_cache_agrees_with_direct_costs():
    pricer = Pricer(TRN2)
    for ins in (
        matmul(512, (), ()),
        vector("tensor_tensor", 300, (), (), op="add", psum_in=True),
        Instr("scalar", "activation", 64, 100, "bfloat16", (), (), (), attrs={"reduce": False}),
    ):
        assert pricer.compute_ns(ins) == compute_ns(ins, TRN2)
        assert pricer.compute_ns(ins) == compute_ns(ins, TRN2)  # second call: cached


def test_throttle_ramp_math():
    s0, ramp = 0.5, 3000.0
    # warm engine: full speed
    assert throttled_duration(200.0, ramp, s0, ramp) == 200.0
    # cold engine: the first 200 ns of work take b with 0.5 b + (0.5 / 3000) b^2 / 2 = 200
    k = (1 - s0) / ramp
    b = (-s0 + math.sqrt(s0 * s0 + 2 * k * 200.0)) / k
    assert throttled_duration(200.0, 0.0, s0, ramp) == pytest.approx(b)
    assert 200.0 < b < 400.0
    # work spanning the whole ramp: ramp work = 0.75 * 3000 = 2250 ns, the rest at full speed
    assert throttled_duration(5000.0, 0.0, s0, ramp) == pytest.approx(3000.0 + 2750.0)


def test_trn2_tensor_engine_warms_up():
    # 40 back-to-back matmuls (40 x ~221 ns of work > the 3 us ramp): the first is slowed
    # to ~half speed, the last runs at full clock (512 + the fitted extra) / 2.4
    full = (512 + TRN2.matmul_extra_cycles) / 2.4
    mms = [matmul(512, (sbuf(0, 256), sbuf(256, 1024)), (psum(0, 2048),)) for _ in range(40)]
    sched = schedule(make_trace("trn2", *mms))
    first = sched.end[0] - sched.start[0]
    last = sched.end[-1] - sched.start[-1]
    assert last == pytest.approx(full)
    assert first > 1.8 * full
    ramp_loss = 3000.0 * (1 - 0.75)  # the ramp does 0.75 x 3000 ns of work in 3000 ns
    assert sched.latency_ns == pytest.approx(40 * full + ramp_loss)


def test_fp8_double_row_doubles_flops_per_cycle():
    # double_row contracts 2K = 256 rows in the cycles of one pass: max(512, 64) cycles
    # (plus the fitted extra per instruction),
    # 2 * 256 * 128 * 512 FLOPs; its roofline term uses the 2x fp8 peak, so the ideal
    # time equals the cycle cost exactly (and MFU against the bf16 peak can reach 2)
    ins = matmul(512, (sbuf(0, 512), sbuf(512, 1024)), (psum(0, 2048),))
    ins.attrs.update(K=256, double_row=True)
    ins.flops = 2 * 256 * 128 * 512
    assert compute_ns(ins, TRN2) == pytest.approx((512 + TRN2.matmul_extra_cycles) / 2.4)
    assert tensor_ideal_ns(ins, TRN2) == pytest.approx(512 / 2.4)
    est = estimate_trace(make_trace("trn3", ins))
    assert est.latency_ns >= est.roofline_ns == pytest.approx(512 / 2.4)
