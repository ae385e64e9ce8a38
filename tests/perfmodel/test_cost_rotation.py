"""Buffer rotation and the partition broadcast, as the cost model sees them.

Rotation (interp/memory.py): tiles of a loop body get fresh SBUF while it is free, so the
next iteration's load overlaps this iteration's compute; a real dependency across
iterations (one tile written every iteration) still serializes them. `nl.broadcast_to`
of a partition row is one TensorE matmul whose PSUM result the consumer reads.
"""

from __future__ import annotations

from nki_kernels.interp import TensorSpec, nisa, nki, nl
from nki_kernels.interp.memory import AddressAllocator
from nki_kernels.perfmodel import trace_kernel
from nki_kernels.perfmodel.timeline import schedule

ITERS = 4
MULS = 3


@nki.jit
def independent_iterations(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(ITERS):
        t = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i])
        r = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.exp, data=t)
        for _ in range(MULS):  # compute outweighs the DMA: VectorE bound
            nisa.tensor_tensor(dst=r, data1=r, data2=t, op=nl.multiply)
        nisa.dma_copy(dst=out[i], src=r)
    return out


@nki.jit
def carried_buffer(x):
    # the same tile is loaded every iteration: iteration i + 1's load must wait until
    # iteration i's compute has read it (a real write-after-read dependency)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
    for i in nl.affine_range(ITERS):
        nisa.dma_copy(dst=t, src=x[i])
        r = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.activation(dst=r, op=nl.exp, data=t)
        for _ in range(MULS):  # compute outweighs the DMA: VectorE bound
            nisa.tensor_tensor(dst=r, data1=r, data2=t, op=nl.multiply)
        nisa.dma_copy(dst=out[i], src=r)
    return out


def _loads_and_last_readers(kernel):
    spec = TensorSpec((ITERS, 128, 512), "float32")
    trace = trace_kernel(kernel, spec, target="trn2")
    sched = schedule(trace)
    loads = [
        i for i, ins in enumerate(trace.instrs) if ins.engine == "dma" and ins.writes[0][0] == 0
    ]
    muls = [i for i, ins in enumerate(trace.instrs) if ins.opcode == "tensor_tensor"]
    return sched, loads, muls[MULS - 1 :: MULS]  # each iteration's last multiply


def test_independent_iterations_overlap_the_next_load_with_this_compute():
    sched, loads, muls = _loads_and_last_readers(independent_iterations)
    assert len(loads) == len(muls) == ITERS
    for it in range(ITERS - 2):
        # later iterations' loads run ahead of this iteration's compute: lowest-address
        # first-fit would hand load it + 2 the buffer store it still reads
        assert sched.start[loads[it + 1]] < sched.start[loads[it + 2]] < sched.end[muls[it]]


def test_a_real_cross_iteration_dependency_still_serializes():
    sched, loads, muls = _loads_and_last_readers(carried_buffer)
    for it in range(ITERS - 1):
        assert sched.start[loads[it + 1]] >= sched.end[muls[it]]
    free, _, _ = _loads_and_last_readers(independent_iterations)
    assert sched.latency_ns > free.latency_ns


def test_next_fit_hands_out_the_longest_free_bytes_first_fit_the_lowest():
    for rotate, want in ((True, 2048), (False, 0)):
        a = AddressAllocator(8192, 64, rotate=rotate)
        first = a.alloc(1024)
        second = a.alloc(1024)
        a.release(first, 1024)
        assert (first, second) == (0, 1024)
        assert a.alloc(1024) == want
    a = AddressAllocator(2048, 64)
    x, y = a.alloc(1024), a.alloc(1024)
    a.release(x, 1024)
    assert a.alloc(1024) == x  # full: the freed place wraps around
    assert y == 1024 and a.alloc(64) is None


@nki.jit
def row_times_broadcast(x, row):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(ITERS):
        t = nl.ndarray((128, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[i])
        r = nl.ndarray((1, 512), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=r, src=row[i])
        b = nl.broadcast_to(r, (128, 512))
        nisa.tensor_tensor(dst=t, data1=t, data2=b, op=nl.multiply)
        nisa.dma_copy(dst=out[i], src=t)
    return out


def test_partition_broadcast_is_one_matmul_read_from_psum():
    specs = TensorSpec((ITERS, 128, 512), "float32"), TensorSpec((ITERS, 1, 512), "float32")
    trace = trace_kernel(row_times_broadcast, *specs, target="trn1")
    ops = [(ins.engine, ins.opcode) for ins in trace.instrs]
    assert ops.count(("tensor", "nc_matmul")) == ITERS
    # no VectorE copy out of PSUM; the ones row is a constant set once
    assert ops.count(("vector", "tensor_copy")) == 0
    assert ops.count(("vector", "memset")) == 1
    muls = [ins for ins in trace.instrs if ins.opcode == "tensor_tensor"]
    assert all(ins.attrs.get("psum_in") for ins in muls)
    assert all(any(r[0] == 1 for r in ins.reads) for ins in muls)  # a PSUM operand
