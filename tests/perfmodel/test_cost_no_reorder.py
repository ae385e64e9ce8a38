"""`nl.no_reorder` in the cost model: a block's compute instructions issue in program
order across engines under the instruction-scheduling window; at window 1 (program
order) a block changes nothing."""

from __future__ import annotations

from cost_fixtures import make_trace, matmul, psum, sbuf, vector

from nki_kernels.interp import TensorSpec, nisa, nki, nl
from nki_kernels.perfmodel import trace_kernel
from nki_kernels.perfmodel.timeline import schedule
from nki_kernels.targets import TRN1

SHAPE = (128, 512)


def _chains(a, b, c, d, e):
    # b = a * a, c = b * b (reads what the previous instruction wrote), e = d * d
    # (independent, last in program order): scheduled, e runs between the two
    nisa.tensor_tensor(dst=b, data1=a, data2=a, op=nl.multiply)
    nisa.tensor_tensor(dst=c, data1=b, data2=b, op=nl.multiply)
    nisa.tensor_tensor(dst=e, data1=d, data2=d, op=nl.multiply)


def _kernel(x, ordered):
    # no DMA: VectorE's work is the whole latency
    a = nl.ndarray(SHAPE, dtype=x.dtype, buffer=nl.sbuf)
    b = nl.ndarray(SHAPE, dtype=x.dtype, buffer=nl.sbuf)
    c = nl.ndarray(SHAPE, dtype=x.dtype, buffer=nl.sbuf)
    d = nl.ndarray(SHAPE, dtype=x.dtype, buffer=nl.sbuf)
    e = nl.ndarray(SHAPE, dtype=x.dtype, buffer=nl.sbuf)
    nisa.memset(dst=a, value=1.0)
    nisa.memset(dst=d, value=2.0)
    if ordered:
        with nl.no_reorder():
            _chains(a, b, c, d, e)
    else:
        _chains(a, b, c, d, e)


@nki.jit
def chains_free(x):
    return _kernel(x, False)


@nki.jit
def chains_in_order(x):
    return _kernel(x, True)


def _latency(kernel, window: int) -> tuple[float, list[float]]:
    trace = trace_kernel(kernel, TensorSpec(SHAPE, "float32"), target="trn1")
    s = schedule(trace, TRN1.replace(scheduling_window=window))
    return s.latency_ns, s.start


def test_no_reorder_block_is_recorded_on_its_instructions() -> None:
    trace = trace_kernel(chains_in_order, TensorSpec(SHAPE, "float32"), target="trn1")
    blocks = [i.no_reorder for i in trace.instrs if i.opcode == "tensor_tensor"]
    assert len(blocks) == 3 and blocks[0] > 0 and len(set(blocks)) == 1
    assert [i.no_reorder for i in trace.instrs if i.opcode == "memset"] == [0, 0]


def test_window_one_prices_a_block_exactly_as_without_it() -> None:
    assert _latency(chains_in_order, 1) == _latency(chains_free, 1)


def test_block_keeps_program_order_where_the_scheduler_would_reorder() -> None:
    in_order = _latency(chains_free, 1)[0]
    free = _latency(chains_free, 8)[0]
    kept = _latency(chains_in_order, 8)[0]
    overhead = (TRN1.dependent_instr_cycles + TRN1.sbuf_access_cycles) / TRN1.vector_ghz
    # without the block the independent multiply hides the dependent-instruction overhead
    assert free < in_order and in_order - free >= 0.9 * overhead
    # with it the three multiplies run in program order: the in-order price
    assert kept == in_order


def _cross_engine_trace(block: bool):
    # v0: a long VectorE op writing s_a; t0 (TensorE) reads s_a; t1 (TensorE) and x
    # (VectorE) are independent of everything. Scheduled, t1 runs before t0 (t0 waits
    # for v0). With [t1, x] in one block, x may issue only after t1, and issuing t1
    # from VectorE's side keeps TensorE's own order (t0 first): t1 follows t0.
    v0 = vector("tensor_scalar", 8192, (sbuf(0, 2048),), (sbuf(2048, 2048),))
    t0 = matmul(512, (sbuf(2048, 256), sbuf(4096, 1024)), (psum(0, 2048),))
    t1 = matmul(512, (sbuf(8192, 256), sbuf(10240, 1024)), (psum(2048, 2048),))
    x = vector("tensor_scalar", 512, (sbuf(12288, 2048),), (sbuf(16384, 2048),))
    if block:
        t1.no_reorder = x.no_reorder = 7
    return make_trace("trn1", v0, t0, t1, x)


def test_block_orders_its_instructions_across_engines() -> None:
    tgt = TRN1.replace(scheduling_window=4)
    free = schedule(_cross_engine_trace(False), tgt)
    kept = schedule(_cross_engine_trace(True), tgt)
    assert free.start[2] < free.start[1]  # t1 ahead of t0
    assert kept.start[2] >= kept.end[1]  # t1 after t0: TensorE in program order
    one = TRN1.replace(scheduling_window=1)
    assert schedule(_cross_engine_trace(True), one).start == (
        schedule(_cross_engine_trace(False), one).start
    )
