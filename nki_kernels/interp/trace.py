"""The instruction trace: one record per ISA instruction, the cost model's input.

Storage regions are physical: on-chip operands are (space, allocation, p0, p1, b0, b1)
boxes in the target's SBUF or PSUM address space (partitions [p0, p1), bytes [b0, b1)
within a partition, as placed by the interpreter's allocator), so a buffer the allocator
hands out again after its tile died carries a write-after-read dependency exactly as on
the chip. `allocation` is the storage id of the tile (0: an explicit `address=`
placement, or a hand-built trace): two tiles that only share bytes have different ids,
which is what lets the cost model's scheduler rename them (`perfmodel/scheduling.py`).
HBM operands are (HBM, storage_id, 0, 1, b0, b1) byte ranges within one HBM tensor.
"""

from __future__ import annotations

from typing import Any

SBUF = 0
PSUM = 1
HBM = 2

Region = tuple[int, int, int, int, int, int]


class Instr:
    """One executed ISA instruction.

    `p` is the number of partitions the instruction uses and `n` the number of elements
    per partition it processes (for matmul: the moving free size N). `attrs` carries the
    opcode-specific details the cost model prices (matmul K/M/N, DMA descriptors, ...).
    `no_reorder` is the id of the `nl.no_reorder` block it was traced in (0: none); the
    cost model's instruction scheduling keeps a block's instructions in program order.
    """

    __slots__ = (
        "attrs",
        "dtype",
        "engine",
        "flops",
        "hbm_read",
        "hbm_write",
        "in_dtypes",
        "index",
        "n",
        "name",
        "nbytes",
        "no_reorder",
        "opcode",
        "p",
        "program",
        "reads",
        "writes",
    )

    def __init__(
        self,
        engine: str,
        opcode: str,
        p: int,
        n: int,
        dtype: str,
        in_dtypes: tuple[str, ...],
        reads: tuple[Region, ...],
        writes: tuple[Region, ...],
        flops: int = 0,
        hbm_read: int = 0,
        hbm_write: int = 0,
        nbytes: int = 0,
        attrs: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> None:
        self.index = -1
        self.program = 0
        self.no_reorder = 0
        self.engine = engine
        self.opcode = opcode
        self.p = p
        self.n = n
        self.dtype = dtype
        self.in_dtypes = in_dtypes
        self.reads = reads
        self.writes = writes
        self.flops = flops
        self.hbm_read = hbm_read
        self.hbm_write = hbm_write
        self.nbytes = nbytes
        self.attrs = attrs or {}
        self.name = name

    def depends_on(self, *producers: Any) -> Instr:
        """Scheduling edges (`NkiInstruction.depends_on`): recorded in attrs["depends_on"]."""
        deps = self.attrs.setdefault("depends_on", [])
        for prod in producers:
            if isinstance(prod, Instr):
                deps.append(prod.index)
        return self

    def __repr__(self) -> str:
        return (
            f"Instr(#{self.index} core{self.program} {self.engine}.{self.opcode} "
            f"p={self.p} n={self.n} dtype={self.dtype} flops={self.flops} "
            f"bytes={self.nbytes} attrs={self.attrs})"
        )


class Trace:
    """The instructions one kernel launch executed, per program (LNC core)."""

    def __init__(self, target: str, lnc: int) -> None:
        self.target = target
        self.lnc = lnc
        self.instrs: list[Instr] = []
        self.peak_sbuf_bytes: list[int] = [0] * lnc
        self.peak_psum_banks: list[int] = [0] * lnc

    def append(self, instr: Instr) -> None:
        """Add `instr` and give it the next index."""
        instr.index = len(self.instrs)
        self.instrs.append(instr)

    def __len__(self) -> int:
        return len(self.instrs)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.instrs)

    def count(self, engine: str | None = None, opcode: str | None = None) -> int:
        """Number of instructions, optionally only of one engine and/or opcode."""
        return sum(
            1
            for i in self.instrs
            if (engine is None or i.engine == engine) and (opcode is None or i.opcode == opcode)
        )

    @property
    def flops(self) -> int:
        """Total matmul FLOPs."""
        return sum(i.flops for i in self.instrs)

    @property
    def hbm_read_bytes(self) -> int:
        """Total bytes read from HBM."""
        return sum(i.hbm_read for i in self.instrs)

    @property
    def hbm_write_bytes(self) -> int:
        """Total bytes written to HBM."""
        return sum(i.hbm_write for i in self.instrs)
