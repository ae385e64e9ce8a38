"""Tile liveness by last use, as the compiler allocates on-chip memory.

The NKI compiler frees an SBUF / PSUM tile after the last instruction that reads or
writes it; the interpreter's allocator frees a tile when Python drops its last
reference, which is never earlier and can be much later (a tile kept in a list, a
dict or a loop variable until the function returns). Both agree for every kernel that
fits under the Python lifetimes, so the interpreter places tiles that way first and
keeps its addresses (and traces) for those kernels. When that plan overflows, the launch
is replayed twice:

1. a recording pass, without placement, counts the instructions that touch each on-chip
   tile (keyed by program and allocation order: the meta-program is deterministic, the
   LNC programs take turns, so the keys repeat);
2. the placing pass frees each tile right after its last counted use. A tile no
   instruction touches keeps its Python lifetime by default: the project's dry runs of
   a reduced problem (one head, a few blocks) allocate every buffer of the full plan
   but use some only at full size, so they must still count. The compiler drops such a
   dead allocation; `settings(free_unused_tiles=True)` does too (the conformance loader
   sets it for AWS's kernels, whose small test shapes leave some buffers unused).

A plan that still does not fit is a true overflow and fails with the numbers. Loops are
unrolled Python (`range` and its aliases), so "last use" is the last use in the
unrolled program: a tile written before a loop and read in every iteration lives until
the last iteration's read, as on the chip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tensor import NkiTensor, Storage

Key = tuple[int, int]  # (program id, on-chip allocation number within the program)


class Liveness:
    """Per-launch use counting (`plan is None`: recording) or freeing at the last use."""

    def __init__(self, plan: dict[Key, int] | None = None, free_unused: bool = False) -> None:
        self.recording = plan is None
        self.free_unused = free_unused
        self.plan: dict[Key, int] = {} if plan is None else plan
        self.counts: dict[Key, int] = {}

    def uses(self, key: Key) -> int:
        """Instructions that touch the tile `key` in the recorded run."""
        return self.plan.get(key, 0)

    def touched(self, dsts: tuple[NkiTensor, ...], srcs: tuple[NkiTensor, ...]) -> None:
        """One instruction read `srcs` and wrote `dsts` (their indirect indexes included)."""
        seen: list[Storage] = []
        for t in (*dsts, *srcs):
            _add(seen, t._st)
            ind = t.indirect
            if ind is not None and hasattr(ind.index, "_st"):
                _add(seen, ind.index._st)
        if self.recording:
            counts = self.counts
            for st in seen:
                key = st.key
                assert key is not None
                counts[key] = counts.get(key, 0) + 1
            return
        for st in seen:
            st.remaining -= 1
            if st.remaining == 0:
                st.release()


def _add(seen: list[Any], st: Any) -> None:
    if st.key is not None and st not in seen:
        seen.append(st)
