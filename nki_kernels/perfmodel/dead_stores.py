"""PSUM memsets that a matmul overwrites before anything reads them (dead stores).

`nki.isa.nc_matmul`: with `accumulate=None` (the default) "the compiler automatically
infers the correct flag -- first write overwrites, subsequent writes accumulate", and
`accumulate=False` "overwrites the PSUM destination"; on NeuronCore-v2/v3 a matmul
accumulating onto PSUM "value-initialized by a non-matmul instruction (e.g., memset) ...
is not supported". So a `memset` of a PSUM tile followed, before any instruction reads
it, by a matmul that starts the accumulation group on all of it stores values nothing
reads: the compiler drops it, and the matmul does not wait for it. Measured: nki-autotune's
2048^3 matmuls (memset, 8 accumulating matmuls, PSUM read-out per output tile) reach
90.92 % / 89.26 % MFU on trn2, which a VectorE memset in every tile's chain would cap near
half of that (cost model v3 anchors). The interpreter runs the same semantics (the
first matmul write of an element overwrites it).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..interp.trace import PSUM, Instr


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[2] < b[3] and b[2] < a[3] and a[4] < b[5] and b[4] < a[5]


def _covers(w: tuple, r: tuple) -> bool:
    return w[0] == r[0] and w[2] <= r[2] and r[3] <= w[3] and w[4] <= r[4] and r[5] <= w[5]


def dead_psum_memsets(instrs: Sequence[Instr]) -> set[int]:
    """Indices of the PSUM memsets a starting matmul overwrites before any read."""
    pending: dict[int, tuple] = {}  # memset index -> its PSUM region
    dead: set[int] = set()
    for idx, ins in enumerate(instrs):
        if pending:
            starts = (
                ins.engine == "tensor"
                and ins.opcode == "nc_matmul"
                and ins.attrs.get("accumulate") is not True
            )
            for m in list(pending):
                reg = pending[m]
                if instrs[m].program != ins.program:
                    continue
                if starts and any(_covers(w, reg) for w in ins.writes):
                    dead.add(m)
                    del pending[m]
                elif any(_overlap(r, reg) for r in ins.reads) or any(
                    _overlap(w, reg) for w in ins.writes
                ):
                    del pending[m]  # read, or partly rewritten: the memset is live
        if ins.opcode == "memset" and len(ins.writes) == 1 and ins.writes[0][0] == PSUM:
            pending[idx] = ins.writes[0]
    return dead
