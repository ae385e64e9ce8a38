"""Synthetic traces: large, realistic instruction mixes for pricing-speed benchmarks.

`synthetic_trace(n)` builds a trace shaped like an attention inner loop without running
the interpreter: per step, two [128, 2 KiB] HBM loads into double-buffered SBUF tiles,
two matmuls into rotating PSUM banks, a ScalarE activation evacuating PSUM, a VectorE
tensor_tensor and reduce, a GpSimd iota every eighth step and a store every fourth.
Addresses rotate like the allocator's, so every dependency kind occurs.
"""

from __future__ import annotations

from ..interp.trace import HBM, PSUM, SBUF, Instr, Trace

_KIB = 1024


def _region(space: int, sid: int, b0: int, nbytes: int, p: int = 128) -> tuple:
    return (space, sid, 0, p, b0, b0 + nbytes)


def _dma(
    src: tuple, dst: tuple, n: int, row_bytes: int, dge: str, queue: str, to_sbuf: bool
) -> Instr:
    """A [128, row_bytes] bf16 transfer: HBM -> SBUF when `to_sbuf`, else SBUF -> HBM."""
    nbytes = 128 * row_bytes
    return Instr(
        "dma",
        "dma_copy",
        128,
        n,
        "bfloat16",
        ("bfloat16",),
        (src,),
        (dst,),
        hbm_read=nbytes if to_sbuf else 0,
        hbm_write=0 if to_sbuf else nbytes,
        nbytes=nbytes,
        attrs={
            "descriptors": 128,
            "descriptor_bytes": row_bytes,
            "partitions": 128,
            "dge": dge,
            "queue": queue,
            "dst_space": "sbuf" if to_sbuf else "hbm",
        },
    )


def synthetic_trace(n_instructions: int, target: str = "trn2") -> Trace:
    """A trace of exactly `n_instructions` records (see the module docstring)."""
    if n_instructions < 0:
        raise ValueError(f"n_instructions: expected >= 0; got {n_instructions}")
    trace = Trace(target, 1)
    step = 0
    q_in, k_in, out = 1, 2, 3
    while len(trace) < n_instructions:
        buf = step % 2
        k_tile = 8 * _KIB + buf * 2 * _KIB  # two SBUF slots for the loaded tile
        q_tile = 0
        s_tile = 16 * _KIB + buf * 4 * _KIB  # fp32 scores
        o_tile = 32 * _KIB + (step % 4) * 1 * _KIB
        stats = 40 * _KIB + (step % 8) * 64
        bank = (step % 4) * 2 * _KIB
        row = (step * 2 * _KIB) % (64 * 1024 * _KIB)
        recs = [
            _dma(
                _region(HBM, k_in, row * 128, 2 * _KIB * 128, 1),
                _region(SBUF, 0, k_tile, 2 * _KIB),
                1024,
                2 * _KIB,
                "unknown",
                "sync",
                to_sbuf=True,
            ),
            _dma(
                _region(HBM, q_in, row * 128, 2 * _KIB * 128, 1),
                _region(SBUF, 0, q_tile, 2 * _KIB),
                1024,
                2 * _KIB,
                "hwdge",
                "act",
                to_sbuf=True,
            ),
        ]
        for half in range(2):
            recs.append(
                Instr(
                    "tensor",
                    "nc_matmul",
                    128,
                    512,
                    "float32",
                    ("bfloat16", "bfloat16"),
                    (
                        _region(SBUF, 0, q_tile + half * 256, 256),
                        _region(SBUF, 0, k_tile + half * _KIB, _KIB),
                    ),
                    (_region(PSUM, 0, bank, 2 * _KIB),),
                    flops=2 * 128 * 128 * 512,
                    attrs={
                        "K": 128,
                        "M": 128,
                        "N": 512,
                        "fp32": False,
                        "double_row": False,
                        "transpose": False,
                    },
                )
            )
        recs += [
            Instr(
                "scalar",
                "activation",
                128,
                512,
                "float32",
                ("float32",),
                (_region(PSUM, 0, bank, 2 * _KIB),),
                (_region(SBUF, 0, s_tile, 2 * _KIB), _region(SBUF, 0, stats, 4)),
                attrs={"op": "exp", "reduce": True, "fast": False},
            ),
            Instr(
                "vector",
                "tensor_tensor",
                128,
                512,
                "bfloat16",
                ("float32", "bfloat16"),
                (_region(SBUF, 0, s_tile, 2 * _KIB), _region(SBUF, 0, k_tile, _KIB)),
                (_region(SBUF, 0, o_tile, _KIB),),
                attrs={"op": "multiply", "psum_in": False, "fast": False},
            ),
            Instr(
                "vector",
                "tensor_reduce",
                128,
                512,
                "float32",
                ("bfloat16",),
                (_region(SBUF, 0, o_tile, _KIB),),
                (_region(SBUF, 0, stats + 4, 4),),
                attrs={"op": "add", "psum_in": False, "fast": True},
            ),
        ]
        if step % 8 == 0:
            recs.append(
                Instr(
                    "gpsimd", "iota", 128, 64, "int32", (), (), (_region(SBUF, 0, 48 * _KIB, 256),)
                )
            )
        if step % 4 == 3:
            recs.append(
                _dma(
                    _region(SBUF, 0, o_tile, _KIB),
                    _region(HBM, out, row * 64, _KIB * 128, 1),
                    512,
                    _KIB,
                    "unknown",
                    "sync",
                    to_sbuf=False,
                )
            )
        for rec in recs:
            if len(trace) < n_instructions:
                trace.append(rec)
        step += 1
    return trace
