"""Cost model v3 rules, each priced through a traced kernel and quoting its source."""

from __future__ import annotations

import pytest

from nki_kernels.interp import TensorSpec
from nki_kernels.nki import nisa, nki, nl
from nki_kernels.perfmodel import trace_kernel
from nki_kernels.perfmodel.costs import compute_ns, port_mask
from nki_kernels.targets import TRN1, TRN2, TRN3


@nki.jit
def _copies(x, src_buf, dst_buf, step):
    """One VectorE tensor_copy of a [128, 512] tile from `src_buf` to `dst_buf`, reading
    every `step`-th element of a [128, 512 * step] source."""
    out = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.shared_hbm)
    big = nl.ndarray((128, 512 * step), dtype=x.dtype, buffer=src_buf)
    dst = nl.ndarray((128, 512), dtype=x.dtype, buffer=dst_buf)
    nisa.memset(dst=big, value=0.0)
    nisa.tensor_copy(dst=dst, src=big[:, 0 : 512 * step : step], engine=nisa.vector_engine)
    if dst_buf == nl.sbuf:
        nisa.dma_copy(dst=out, src=dst)
    return out


def _copy_ns(dtype: str, src_buf, dst_buf, step: int = 1, target=TRN2) -> float:
    tr = trace_kernel(
        _copies, TensorSpec((128, 512), dtype), src_buf, dst_buf, step, target=target.name
    )
    (ins,) = [i for i in tr.instrs if i.opcode == "tensor_copy"]
    return compute_ns(ins, target), ins


def test_vector_copy_bf16_sbuf_contiguous_is_4x():
    # "the following instructions could see a 4x throughput lift ... nisa.tensor_copy and
    # nisa.tensor_scalar when both input/output tensors: a. are in SBUF b. are in
    # BF16/FP16 ... c. have physically contiguous elements in the inner-most (most minor)
    # free dimension" (trainium2_arch, Vector Engine Performance Mode)
    ns, ins = _copy_ns("bfloat16", nl.sbuf, nl.sbuf)
    assert ns == pytest.approx(max(64, 512 / 4) / TRN2.vector_ghz)
    assert port_mask(ins, TRN2) & 1  # perf mode uses the bus shared with GpSimd


def test_vector_copy_bf16_psum_contiguous_is_2x():
    # "2x throughput lift ... nisa.tensor_copy and nisa.tensor_scalar: ... b. when both
    # input/output tensors satisfy 1b and 1c, but one of input and output tensors is in
    # PSUM" (trainium2_arch). v2 gave such a copy no perf mode (512 cycles).
    for src, dst in ((nl.psum, nl.sbuf), (nl.sbuf, nl.psum)):
        ns, ins = _copy_ns("bfloat16", src, dst)
        assert ns == pytest.approx(512 / 2 / TRN2.vector_ghz)
        assert port_mask(ins, TRN2) & 1
    # fp32 from PSUM (a matmul result) has no perf mode
    ns, _ = _copy_ns("float32", nl.psum, nl.sbuf)
    assert ns == pytest.approx(512 / TRN2.vector_ghz)
    # NC-v2 documents no perf mode at all
    ns, _ = _copy_ns("bfloat16", nl.psum, nl.sbuf, target=TRN1)
    assert ns == pytest.approx(512 / TRN1.vector_ghz)


def test_vector_copy_bf16_sbuf_strided_is_2x():
    # "a. when both input/output tensors satisfy 1a and 1b, but not 1c conditions above"
    # (trainium2_arch): SBUF, BF16, not contiguous -> 2x, not 4x. A 2-element (4-byte)
    # stride stays under the 16-byte stride rule (below).
    ns, ins = _copy_ns("bfloat16", nl.sbuf, nl.sbuf, step=2)
    assert ins.attrs["contig"] is False and ins.attrs["stride_bytes"] == 4
    assert ns == pytest.approx(512 / 2 / TRN2.vector_ghz)


def test_wide_minor_stride_halves_the_instruction_rate():
    # "If the most-minor F dimension stride exceeds 16 bytes, the achievable bandwidth of
    # each tensor read/write interface will be half of the peak bandwidth, which
    # translates to roughly 50% performance hit on the instructions"
    # (trainium_inferentia2_arch, Access pattern). fp32: 4 elements = 16 B is still fine.
    ns4, ins4 = _copy_ns("float32", nl.sbuf, nl.sbuf, step=4)
    assert ins4.attrs["stride_bytes"] == 16
    assert ns4 == pytest.approx(512 / TRN2.vector_ghz)
    ns8, ins8 = _copy_ns("float32", nl.sbuf, nl.sbuf, step=8)
    assert ins8.attrs["stride_bytes"] == 32
    assert ns8 == pytest.approx(2 * 512 / TRN2.vector_ghz)
    ns8, _ = _copy_ns("float32", nl.sbuf, nl.sbuf, step=8, target=TRN1)
    assert ns8 == pytest.approx(2 * 512 / TRN1.vector_ghz)


@nki.jit
def _scalar_copy(x, src_buf):
    out = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.shared_hbm)
    src = nl.ndarray((128, 512), dtype=x.dtype, buffer=src_buf)
    dst = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=src, value=0.0)
    nisa.tensor_copy(dst=dst, src=src, engine=nisa.scalar_engine)
    nisa.dma_copy(dst=out, src=dst)
    return out


def test_scalar_copy_on_trn3_has_vector_2x_mode_from_psum_too():
    # "The Trainium3 ScalarE now natively supports the tensor_scalar and tensor_copy
    # instructions ... and offers up to 2x performance uplift for BF16/FP16 datatypes,
    # which is the same as the 2x performance mode on VectorE introduced with Trainium2"
    # (trainium3_arch): that mode includes a contiguous copy with one side in PSUM.
    for buf in (nl.sbuf, nl.psum):
        tr = trace_kernel(_scalar_copy, TensorSpec((128, 512), "bfloat16"), buf, target="trn3")
        (ins,) = [i for i in tr.instrs if i.opcode == "tensor_copy"]
        assert compute_ns(ins, TRN3) == pytest.approx(512 / 2 / TRN3.scalar_ghz)


def test_vector_exponential_is_4x_scalar_exp_on_trn3():
    # "a new instruction to perform fast exponential evaluation (nisa.exponential), at 4x
    # the throughput compared to the nisa.activation (op=nl.exp) instruction on the Scalar
    # Engine" (trainium3_arch)
    from nki_kernels.interp.trace import Instr

    exp_v = Instr("vector", "exponential", 128, 4096, "float32", (), (), (), attrs={})
    exp_s = Instr("scalar", "activation", 128, 4096, "float32", (), (), (), attrs={})
    assert compute_ns(exp_s, TRN3) == pytest.approx(4 * compute_ns(exp_v, TRN3))


def test_gpsimd_rsqrt_is_4x_slower_than_scalar():
    # "the computation throughput of reverse square root on GpSIMD Engine is 4x lower than
    # Scalar Engine" (nki.api.shared, NKI engine selection)
    from nki_kernels.interp.trace import Instr

    def rsqrt(engine: str) -> Instr:
        return Instr(
            engine, "tensor_scalar", 128, 2048, "float32", (), (), (), attrs={"op": "rsqrt"}
        )

    act = Instr("scalar", "activation", 128, 2048, "float32", (), (), (), attrs={})
    gp = compute_ns(rsqrt("gpsimd"), TRN2) * TRN2.gpsimd_ghz - TRN2.gpsimd_startup_cycles
    assert gp == pytest.approx(4 * compute_ns(act, TRN2) * TRN2.scalar_ghz)


def test_trn3_background_transpose_halves_a_transpose():
    # "background transpose functionality, which allows it to run a transpose operation in
    # parallel to another matrix multiplication (or another transpose). It allows us to
    # achieve close to double performance on long chains of transposes" (trainium3_arch)
    from cost_fixtures import matmul, psum, sbuf

    t = matmul(128, (sbuf(0, 256),), (psum(0, 256),), transpose=True)
    assert compute_ns(t, TRN3) == pytest.approx(compute_ns(t, TRN2) / 2)
    m = matmul(512, (sbuf(0, 1024),), (psum(0, 2048),))
    assert compute_ns(m, TRN3) == pytest.approx(compute_ns(m, TRN2))


def test_vector_and_scalar_collide_only_on_the_same_psum_bank_on_trn2():
    # "Both VectorE and ScalarE can access PSUM at full bandwidth in parallel, as long as
    # their accesses do not collide on the same PSUM bank" (trainium2_arch)
    from cost_fixtures import make_trace, psum, sbuf, vector

    from nki_kernels.interp.trace import Instr
    from nki_kernels.perfmodel.timeline import schedule

    def act(b0: int) -> Instr:
        return Instr("scalar", "activation", 128, 512, "float32", (), (psum(b0, 1024),),
                     (sbuf(8192, 2048),), attrs={"psum_in": True})  # fmt: skip

    v = vector("tensor_copy", 512, (psum(0, 1024),), (sbuf(0, 2048),), psum_in=True)
    same = schedule(make_trace("trn2", v, act(1024)))  # bytes 1024.. of bank 0
    assert same.start[1] == pytest.approx(512 / TRN2.vector_ghz)
    other = schedule(make_trace("trn2", v, act(2048)))  # bank 1
    assert other.start[1] == 0.0


def test_a_psum_memset_that_a_starting_matmul_overwrites_is_dropped():
    # nc_matmul: "accumulate=None (default): The compiler automatically infers the correct
    # flag -- first write overwrites, subsequent writes accumulate"; "matmul accumulating
    # into a PSUM location that was value-initialized by a non-matmul instruction (e.g.,
    # memset) ... is not supported" (NC-v2/v3): the memset is a dead store.
    from cost_fixtures import make_trace, matmul, psum, sbuf, vector

    from nki_kernels.perfmodel.dead_stores import dead_psum_memsets
    from nki_kernels.perfmodel.timeline import schedule

    zero = vector("memset", 512, (), (psum(0, 2048),))
    mm = matmul(512, (sbuf(0, 1024),), (psum(0, 2048),))
    out = vector("tensor_copy", 512, (psum(0, 2048),), (sbuf(4096, 2048),), psum_in=True)
    assert dead_psum_memsets([zero, mm, out]) == {0}
    sched = schedule(make_trace("trn2", zero, mm, out))
    assert sched.end[0] == sched.start[0] == 0.0 and sched.start[1] == 0.0
    # read before the matmul (or accumulated onto explicitly): the memset is live
    assert dead_psum_memsets([zero, out, mm]) == set()
    acc = matmul(512, (sbuf(0, 1024),), (psum(0, 2048),))
    acc.attrs["accumulate"] = True
    assert dead_psum_memsets([zero, acc]) == set()
    # a matmul covering only half of the memset leaves it live
    half = matmul(256, (sbuf(0, 1024),), (psum(0, 1024),))
    assert dead_psum_memsets([zero, half]) == set()
