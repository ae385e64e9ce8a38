"""Memory of the interpreter: the buffer tokens (`nl.sbuf`, `nl.psum`, `nl.hbm`,
`nl.shared_hbm`) and `Storage`, one allocation, placed in its program's SBUF or PSUM
(memory.py) while a view of it lives. Views of storages are `tensor.NkiTensor`.
"""

from __future__ import annotations

import math
import os
import sys
import types
from typing import Any

import numpy as np

from . import dtypes as dt
from .errors import fail
from .state import Launch
from .trace import HBM, PSUM, SBUF

_prod = math.prod


class Buffer:
    """A memory region token: `nl.sbuf`, `nl.psum`, `nl.hbm`/`nl.private_hbm`, `nl.shared_hbm`."""

    __slots__ = ("name", "on_chip", "space")

    def __init__(self, name: str, on_chip: bool, space: int) -> None:
        self.name = name
        self.on_chip = on_chip
        self.space = space

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", True, SBUF)
psum = Buffer("psum", True, PSUM)
private_hbm = Buffer("private_hbm", False, HBM)
hbm = private_hbm
shared_hbm = Buffer("shared_hbm", False, HBM)


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Element strides of a contiguous row-major layout."""
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return tuple(reversed(strides))


_INTERP_DIR = os.path.dirname(os.path.abspath(__file__))


def _kernel_line() -> str:
    """'file.py:LINE' of the innermost caller outside the interpreter: the kernel line
    that made an allocation."""
    f: types.FrameType | None = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith(_INTERP_DIR):
        f = f.f_back
    if f is None:
        return ""
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


class Storage:
    """One allocation. `data` is a flat array of `dtype` (None in trace-only mode).

    On-chip storages hold a place in their program's SBUF or PSUM (`addr`, `nbytes_pp`
    bytes per partition) until the last view of them dies. PSUM storages also keep
    `mm_mask`: which elements a matmul has written since allocation (accumulate=None).
    """

    __slots__ = (
        "__weakref__",
        "addr",
        "borrowed",
        "buffer",
        "data",
        "dirty",
        "dtype",
        "home",
        "is_input",
        "key",
        "memory",
        "mm_mask",
        "name",
        "nbytes_pp",
        "pending",
        "pinned",
        "pstride",
        "remaining",
        "shape",
        "sid",
        "site",
        "size",
    )

    def __init__(
        self,
        launch: Launch,
        shape: tuple[int, ...],
        dtype: dt.NkiDtype,
        buffer: Buffer,
        name: str = "",
        data: np.ndarray | None = None,
        address: int | None = None,
    ) -> None:
        self.sid = sid = launch.next_sid
        launch.next_sid = sid + 1
        self.shape = shape
        self.dtype = dtype
        self.buffer = buffer
        self.name = name or f"t{sid}"
        self.memory = None
        self.home = None
        self.pinned = False
        self.addr = 0
        self.nbytes_pp = 0
        self.mm_mask: np.ndarray | None = None
        self.pending: Any = None  # deferred matmuls into this PSUM storage (isa_tensor)
        self.dirty = False
        self.borrowed = False  # `data` is a read-only view of the caller's input array
        self.is_input = False
        self.size = size = _prod(shape)
        self.pstride = _prod(shape[1:])
        self.site = ""
        if buffer.on_chip:
            limit = launch.target.partitions
            if shape[0] > limit:
                raise fail(
                    "TC1",
                    f"partition dim {shape[0]} of {buffer.name} tensor '{self.name}' {shape} "
                    f"exceeds {limit}",
                )
            self.nbytes_pp = nb = self.pstride * dtype._size
            prog = launch.programs[launch.program_id]
            self.key: tuple[int, int] | None = (launch.program_id, prog.onchip_count)
            prog.onchip_count += 1
            live = launch.liveness
            self.pinned = address is not None
            if live is not None and not live.recording:
                self.site = _kernel_line()  # only a replayed plan can fail for good
            if live is not None and live.recording:
                live.allocated(self)
            else:
                mem = prog.memory
                self.home = mem
                if address is None and live is not None and live.allocated(self):
                    pass  # placed at its first slot (liveness.py: the compiler's schedule)
                elif buffer is psum:
                    self.addr = mem.place_psum(nb, self, address)
                    self.memory = mem
                else:
                    prefer = live.prefer(self) if live is not None and address is None else None
                    self.addr = mem.place_sbuf(nb, self, address, prefer)
                    self.memory = mem
                self.pinned = address is not None
                if live is not None:
                    # a tile no instruction touches keeps its Python lifetime (a dry run
                    # of a reduced problem then still counts every buffer it allocates)
                    self.remaining = live.uses(self.key)
                    if self.remaining == 0 and live.free_unused:
                        self.release()  # a dead allocation, dropped as the compiler does
        else:
            self.key = None
        if launch.trace_only:
            self.data = None
        elif data is not None:
            self.data = data
        else:
            self.data = np.full(size, dt.fresh_fill(dtype, launch.fresh_zero), dtype=dtype._np)
            if buffer is psum:
                self.mm_mask = np.zeros(size, dtype=np.bool_)

    @property
    def aid(self) -> int:
        """The allocation identity on-chip trace regions carry: the storage id, or 0 for
        an explicit placement (`address=`), which may alias other tiles on purpose."""
        return 0 if self.pinned else self.sid

    def own(self) -> None:
        """Before the first write into a borrowed input: take a private copy (the caller's
        array changes only at the launch's write-back, and a replayed attempt sees it
        unchanged)."""
        assert self.data is not None
        self.data = self.data.copy()
        self.borrowed = False

    def describe(self) -> str:
        """'name' shape dtype, for error messages."""
        return f"'{self.name}' {self.shape} {self.dtype}"

    def place(self, prefer: int | None = None) -> None:
        """Place a tile whose placement waited for its first slot (liveness.py; at
        `prefer`, a packed plan's address, if free)."""
        if self.memory is None and self.home is not None:
            if self.buffer is psum:
                self.addr = self.home.place_psum(self.nbytes_pp, self)
            else:
                self.addr = self.home.place_sbuf(self.nbytes_pp, self, None, prefer)
            self.memory = self.home

    def release(self) -> None:
        """Give the storage's on-chip place back (at most once)."""
        mem = self.memory
        if mem is not None:
            self.memory = None
            mem.release(self.buffer is psum, self.addr, self.nbytes_pp, self.pinned, self.sid)

    def __del__(self) -> None:
        self.release()
