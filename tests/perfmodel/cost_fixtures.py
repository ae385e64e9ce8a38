"""Small kernels and hand-built traces shared by the cost-model tests."""

from __future__ import annotations

from nki_kernels.interp.trace import HBM, PSUM, SBUF, Instr, Trace
from nki_kernels.nki import nisa, nki, nl


@nki.jit
def stream_exp(x, bufs):
    """out = exp(x), row tile by row tile, with `bufs` rotating SBUF buffers per stage."""
    rows, f = x.shape
    out = nl.ndarray((rows, f), dtype=x.dtype, buffer=nl.shared_hbm)
    ins = [nl.ndarray((128, f), dtype=x.dtype, buffer=nl.sbuf) for _ in range(bufs)]
    outs = [nl.ndarray((128, f), dtype=x.dtype, buffer=nl.sbuf) for _ in range(bufs)]
    for i in range(rows // 128):
        t, o = ins[i % bufs], outs[i % bufs]
        nisa.dma_copy(dst=t, src=x[i * 128 : (i + 1) * 128, :])
        nisa.activation(dst=o, op=nl.exp, data=t)
        nisa.dma_copy(dst=out[i * 128 : (i + 1) * 128, :], src=o)
    return out


@nki.jit
def split_rows_copy(x):
    """Each LNC program copies its half of the rows through SBUF (work split by program)."""
    rows, f = x.shape
    out = nl.ndarray((rows, f), dtype=x.dtype, buffer=nl.shared_hbm)
    n_prog = nl.num_programs(0) if nl.program_ndim() != 0 else 1
    pid = nl.program_id(0) if nl.program_ndim() != 0 else 0
    per = rows // n_prog
    for r0 in range(pid * per, (pid + 1) * per, 128):
        t = nl.ndarray((128, f), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=x[r0 : r0 + 128, :])
        nisa.dma_copy(dst=out[r0 : r0 + 128, :], src=t)
    return out


def sbuf(b0: int, nbytes: int, p: int = 128, alloc: int = 0) -> tuple:
    """An SBUF region; `alloc` names its allocation (0: unnamed, the scheduler does not
    rename)."""
    return (SBUF, alloc, 0, p, b0, b0 + nbytes)


def psum(b0: int, nbytes: int, p: int = 128) -> tuple:
    return (PSUM, 0, 0, p, b0, b0 + nbytes)


def hbm(sid: int, b0: int, nbytes: int) -> tuple:
    return (HBM, sid, 0, 1, b0, b0 + nbytes)


def matmul(
    n: int, reads: tuple, writes: tuple, fp32: bool = False, transpose: bool = False
) -> Instr:
    return Instr(
        "tensor",
        "nc_matmul",
        128,
        n,
        "float32",
        ("bfloat16", "bfloat16"),
        reads,
        writes,
        flops=0 if transpose else 2 * 128 * 128 * n,
        attrs={
            "K": 128,
            "M": 128,
            "N": n,
            "fp32": fp32,
            "double_row": False,
            "transpose": transpose,
        },
    )


def vector(opcode: str, n: int, reads: tuple, writes: tuple, **attrs: object) -> Instr:
    return Instr(
        "vector", opcode, 128, n, "float32", ("float32",), reads, writes, attrs=dict(attrs)
    )


def load(
    sid: int, dst: tuple, row_bytes: int, dge: str = "unknown", contiguous: bool = False
) -> Instr:
    """HBM -> SBUF over dst's partitions, one descriptor of `row_bytes` per partition.

    The HBM rows are strided (a column slice: extent twice the bytes) unless
    `contiguous`, when each engine's rows merge into one descriptor.
    """
    p = dst[3] - dst[2]
    extent = p * row_bytes * (1 if contiguous else 2)
    return Instr(
        "dma",
        "dma_copy",
        p,
        row_bytes // 2,
        "bfloat16",
        ("bfloat16",),
        (hbm(sid, 0, extent),),
        (dst,),
        hbm_read=p * row_bytes,
        nbytes=p * row_bytes,
        attrs={
            "descriptors": p,
            "descriptor_bytes": row_bytes,
            "partitions": p,
            "src_space": "hbm",
            "dst_space": "sbuf",
            "indirect": False,
            "dge": dge,
            "queue": "sync",
        },
    )


def make_trace(target: str, *instrs: Instr) -> Trace:
    tr = Trace(target, 1)
    for ins in instrs:
        tr.append(ins)
    return tr
