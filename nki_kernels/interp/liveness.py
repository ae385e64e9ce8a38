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

**The compiler's schedule** (`settings(compiler_schedule=...)`, on by default, for every
kernel): by default neuronx-cc, not the kernel's program order,
decides the addresses and the instruction order after NKI traces the kernel (NKI
compile-configuration deep dive: "By default, neuronx-cc makes both decisions after NKI
traces the kernel"; `Allocation.COLORING`: graph coloring after the trace). In this mode
the replay models two things it documents or needs:

- a tile lives from its first access, not from its `nl.ndarray` (`Allocation.LINEAR`:
  "assigns an address to a tile at its first write and releases the address after its
  last read");
- an instruction that reads PSUM and writes only SBUF (an accumulator's read-out)
  counts as if it ran right after the last instruction it depends on: the last write
  of each of its sources, the last access of each of its destinations, the allocation
  of each operand. A kernel may keep more PSUM accumulators than the 8 banks in a list
  and read them out in a later loop, relying on the compiler to evict each once its
  accumulation group is done: nki-library's `shard_on_i` MoE kernel keeps I_TP / 128
  per core and is documented for I_TP up to 16384. An instruction that touches HBM is
  never moved.

The interpreter still executes the instructions in program order (their values do not
depend on the order); only the accounting follows the schedule, and the trace's region
of a moved read-out may share an address with a later tile (a false dependency in the
trace, never a wrong value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tensor import NkiTensor, Storage

Key = tuple[int, int]  # (program id, on-chip allocation number within the program)


class Liveness:
    """Per-launch use counting (`plan is None`: recording) or freeing at the last use.

    With `reorder` (the compiler's schedule, see above) the recording pass also gives
    every on-chip tile a lifetime in slots of its program's schedule (slot 2s:
    instruction s where the kernel issues it; slot 2h + 1: a PSUM read-out moved to
    right after instruction h), and the placing pass places each tile at its first slot
    and frees it after its last.
    """

    def __init__(
        self,
        plan: dict[Key, int] | None = None,
        free_unused: bool = False,
        reorder: bool = False,
        spans: dict[Key, tuple[int, int]] | None = None,
    ) -> None:
        self.recording = plan is None
        self.free_unused = free_unused
        self.reorder = reorder
        self.plan: dict[Key, int] = {} if plan is None else plan
        self.counts: dict[Key, int] = {}
        self.seq: dict[int, int] = {}  # instructions issued so far, per program
        # recording, with `reorder`: per tile, its allocation (instructions before it),
        # last write and last access (instruction numbers), and PSUM lifetimes (slots)
        self.alloc_at: dict[Key, int] = {}
        self.last_write: dict[Key, int] = {}
        self.last_access: dict[Key, int] = {}
        self.spans: dict[Key, tuple[int, int]] = {} if spans is None else spans
        # placing, with `reorder`: tiles to place / free at a slot, per program
        self.starts: dict[tuple[int, int], list[Storage]] = {}
        self.ends: dict[tuple[int, int], list[Storage]] = {}

    def uses(self, key: Key) -> int:
        """Instructions that touch the tile `key` in the recorded run."""
        return self.plan.get(key, 0)

    def allocated(self, st: Storage) -> bool:
        """A new on-chip tile; True if its placement waits for its first slot (under
        `reorder`, in the placing pass)."""
        key = st.key
        assert key is not None
        if self.recording:
            if self.reorder:
                self.alloc_at[key] = self.seq.get(key[0], 0)
            return False
        span = self.spans.get(key) if self.reorder else None
        if span is None:
            return False
        prog = key[0]
        self.ends.setdefault((prog, span[1]), []).append(st)
        if span[0] <= 2 * self.seq.get(prog, 0):  # its first slot is now
            return False
        self.starts.setdefault((prog, span[0]), []).append(st)
        return True

    def before(self, program: int) -> None:
        """Instruction number seq[program] is about to be issued: place the tiles whose
        first slot it is."""
        if self.starts:
            for st in self.starts.pop((program, 2 * self.seq.get(program, 0)), ()):
                st.place()

    def touched(
        self, dsts: tuple[NkiTensor, ...], srcs: tuple[NkiTensor, ...], program: int = 0
    ) -> None:
        """One instruction read `srcs` and wrote `dsts` (their indirect indexes included)."""
        seen: list[Storage] = []
        for t in (*dsts, *srcs):
            _add(seen, t._st)
            ind = t.indirect
            if ind is not None and hasattr(ind.index, "_st"):
                _add(seen, ind.index._st)
        s = self.seq.get(program, 0)
        self.seq[program] = s + 1
        if self.recording:
            counts = self.counts
            for st in seen:
                key = st.key
                assert key is not None
                counts[key] = counts.get(key, 0) + 1
            if self.reorder:
                self._schedule(s, dsts, srcs, seen)
            return
        for st in seen:
            st.remaining -= 1
            if st.remaining == 0:
                st.release()
        if self.ends or self.starts:
            for slot in (2 * s, 2 * s + 1):
                for st in self.starts.pop((program, slot), ()):
                    st.place()
                for st in self.ends.pop((program, slot), ()):
                    st.release()

    def _schedule(
        self, s: int, dsts: tuple[NkiTensor, ...], srcs: tuple[NkiTensor, ...], seen: list[Any]
    ) -> None:
        """Recording: the slot of instruction `s` (moved up if it is a PSUM read-out) and
        the lifetimes it extends."""
        from .language import psum

        written = [t._st.key for t in dsts if t._st.key is not None]
        read = [st.key for st in seen if st.key not in written]
        keyed = all(t._st.key is not None for t in (*dsts, *srcs)) and all(
            t.indirect is None or hasattr(t.indirect.index, "_st") for t in (*dsts, *srcs)
        )
        slot = 2 * s
        reads_psum = any(st.buffer is psum and st.key in read for st in seen)
        writes_psum = any(t._st.buffer is psum for t in dsts)
        if keyed and reads_psum and not writes_psum and written:
            lw, la, at = self.last_write, self.last_access, self.alloc_at
            h = max(
                [lw.get(k, -1) for k in read]
                + [la.get(k, -1) for k in written]
                + [at.get(k, 0) for k in (*read, *written)]
            )
            slot = min(slot, 2 * h + 1)
        spans = self.spans
        for st in seen:
            key = st.key
            span = spans.get(key)
            spans[key] = (slot, slot) if span is None else (min(span[0], slot), max(span[1], slot))
        for k in written:
            self.last_write[k] = s
        for st in seen:
            self.last_access[st.key] = s


def _add(seen: list[Any], st: Any) -> None:
    if st.key is not None and st not in seen:
        seen.append(st)
