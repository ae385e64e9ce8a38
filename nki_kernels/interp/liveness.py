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
   instruction touches is dropped at once, as the compiler drops a dead allocation
   (default; AWS's small test shapes and nki-autotune's 2048^3 matmul, which allocates
   4 x 4 rotating groups and uses 2 x 2, leave such buffers). The project's dry runs of
   a reduced problem (one head, a few blocks) allocate every buffer of the full plan but
   use some only at full size: they run with `settings(free_unused_tiles=False)`, under
   which such a tile keeps its Python lifetime.

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

**Live ranges** (same mode, SBUF tiles without an explicit address): a tile whose every
element is written again before it is next read holds no live value between its last
read and that rewrite, so its bytes are free there. The replay frees the tile after the
last read and places it again (anywhere) at the first write of the next live range. The
default flow allocates "with graph coloring after it traces the kernel" (NKI
`nki.compiler.Allocation.COLORING`) on a per-tensor liveness analysis (compiler release
notes 2.30: "a per-tensor backward traversal that only visits blocks where each tensor
is actually live"); liveness ends at a full overwrite. nki-library's MoE kernel reloads
its hidden-state tiles in every block and fits on the chip only so (`shard_on_block`,
whose AWS test cases ran on hardware). Splitting is assumed (M): the docs give no
allocator example; a partial rewrite, an indirect write, a write of another dtype and a
PSUM tile (matmul accumulation reads its destination) never end a live range.

**Deferred fills and loads** (same mode; only for a plan that still overflows with the
above at 64- and 4-byte alignment, launch.py): an SBUF tile whose first accesses are
fills (`memset`, `iota`) or loads from HBM (`dma_copy`, `dma_transpose`, `dma_compute`
with no on-chip source but an indirect index) holds nothing the kernel needs until its
first other access, usually its first read; the replay places it right there, as if
those instructions ran just before that access. The NKI language guide: "The compiler
may reorder operations that have no data dependencies"; `nl.no_reorder`: "Without this
directive, the compiler scheduler is free to reorder independent operations"; and by
default neuronx-cc decides the instruction order and the addresses after tracing (the
compile-configuration deep dive). That the default flow uses this freedom when the
program order does not fit is assumed (M: no document shows the scheduler sinking a
load). A move never crosses what the instruction depends on: a fill or load stops at a
write of the index tile it reads, a load also at any write to HBM, any register
instruction (its address may read a register) and any cross-program synchronisation
(barrier, send / receive, collective) of its program; neither moves past a device
loop's branch (nothing moves into or out of a run-time loop); an instruction in a
`no_reorder` block or named by a `depends_on` edge stays where it is;
the index tile of a moved load lives until the load's new slot. nki-library's `moe_cte`
`shard_on_block` zero-fills (first block) or loads (later blocks) the block's previous
output at the block's start and reads it only after the whole gate / up / down
projection: its chunked path fits on the chip only so.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Any

from .storage import sbuf as _sbuf

if TYPE_CHECKING:
    from .tensor import NkiTensor, Storage

Key = tuple[int, int]  # (program id, on-chip allocation number within the program)

# instructions that only fill or load their destination (see "Deferred fills and loads")
_FILLS = frozenset({"memset", "iota"})
_LOADS = frozenset({"dma_copy", "dma_transpose", "dma_compute"})
# attributes that mark a cross-program synchronisation (core_barrier, sendrecv, collectives)
_SYNC_ATTRS = ("cores", "ranks", "pairs", "send_to")


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
        ranges: dict[Key, list[tuple[int, int]]] | None = None,
        sizes: dict[Key, int] | None = None,
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
        # live ranges (slots) of the tiles that have more than one (recording: the
        # closed ones, the open one through its last read, the writes since that read)
        self.ranges: dict[Key, list[tuple[int, int]]] = {} if ranges is None else ranges
        self._open: dict[Key, list[int]] = {}
        self._rewrite: dict[Key, list[Any]] = {}  # [first slot, last slot, cover]
        # placing, with `reorder`: tiles to place / free at a slot, per program
        self.starts: dict[tuple[int, int], list[Storage]] = {}
        self.ends: dict[tuple[int, int], list[Storage]] = {}
        # recording, with `reorder`: fills and loads that could move to their tile's first
        # other access (per tile: first slot, writer instructions, index tiles read, whether
        # a load, last writer's slot), and the moves found (tile, first slot, new slot,
        # writers, index tiles, last writer's slot)
        self._pending: dict[Key, list[Any]] = {}
        self._settled: set[Key] = set()
        self._by_index: dict[Key, set[Key]] = {}
        self.deferrals: list[tuple[Key, int, int, tuple[int, ...], tuple[Key, ...], int]] = []
        # placing: instructions that wrote a tile before its (deferred) placement, whose
        # trace regions move with it
        self._early: dict[int, list[Any]] = {}
        self.named: set[int] = set()
        # SBUF bytes per partition of each tile (recording); given to a placing pass, the
        # plan is packed with every live range known (packing.py): addresses per program
        # and granule, and how many times each tile has been placed
        self.sizes: dict[Key, int] = {} if sizes is None else sizes
        self.packed = sizes is not None and not self.recording
        self._packs: dict[tuple[int, int], dict[Any, int]] = {}
        self._placements: dict[int, int] = {}

    def reset(self) -> None:
        """Forget a placing pass's progress before the pass runs again (a placement retry)."""
        if not self.recording:
            self.seq = {}
            self.starts = {}
            self.ends = {}
            self._early = {}
            self._placements = {}

    def live_ranges(self) -> dict[Key, list[tuple[int, int]]]:
        """Recording, at its end: each split tile's live ranges (slots), in order; ranges
        that the schedule makes overlap are merged."""
        out: dict[Key, list[tuple[int, int]]] = {}
        for key, closed in self.ranges.items():
            lo, hi = self._open[key]
            tail = self._rewrite.get(key)
            if tail is not None:
                lo, hi = min(lo, tail[0]), max(hi, tail[1])
            merged: list[list[int]] = []
            for a, b in [*closed, (lo, hi)]:
                if merged and a <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], b)
                    merged[-1][0] = min(merged[-1][0], a)
                else:
                    merged.append([a, b])
            if len(merged) > 1:
                out[key] = [(a, b) for a, b in merged]
        return out

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
            if not st.pinned and st.buffer is _sbuf:
                self.sizes[key] = st.nbytes_pp
            return False
        span = self.spans.get(key) if self.reorder else None
        if span is None:
            return False
        prog = key[0]
        ranges = self.ranges.get(key)
        if ranges is not None:
            for (_, hi), (lo, _) in pairwise(ranges):
                self.ends.setdefault((prog, hi), []).append(st)
                self.starts.setdefault((prog, lo), []).append(st)
        self.ends.setdefault((prog, span[1]), []).append(st)
        if span[0] <= 2 * self.seq.get(prog, 0):  # its first slot is now
            return False
        self.starts.setdefault((prog, span[0]), []).append(st)
        self._early[st.sid] = []
        return True

    def before(self, program: int) -> None:
        """Instruction number seq[program] is about to be issued: place the tiles whose
        first slot it is."""
        if self.starts:
            for st in self.starts.pop((program, 2 * self.seq.get(program, 0)), ()):
                self._place(st)

    def prefer(self, st: Storage) -> int | None:
        """A packed plan's address for the SBUF tile `st` now being placed (None when
        the plan is not packed or the tile has none)."""
        if not self.packed or st.key is None or st.pinned:
            return None
        n = self._placements.get(st.sid, 0)
        self._placements[st.sid] = n + 1
        space = st.home.sbuf
        prog = st.key[0]
        table = self._packs.get((prog, space.granule))
        if table is None:
            table = self._packs[(prog, space.granule)] = self._pack(prog, space)
        return table.get((st.key, n))

    def _pack(self, prog: int, space: Any) -> dict[Any, int]:
        """Addresses of program `prog`'s SBUF tiles (per live range) in `space`."""
        from .packing import pack

        items = []
        for key, nbytes in self.sizes.items():
            if key[0] != prog or key not in self.spans:
                continue
            for i, (lo, hi) in enumerate(self.ranges.get(key) or [self.spans[key]]):
                items.append(((key, i), nbytes, lo, hi))
        return pack(items, space.capacity, space.granule) or {}

    def _place(self, st: Storage) -> None:
        """Place a tile at its first slot; a deferred fill or load that already wrote it
        gets the tile's address in its trace regions (they were recorded at offset 0)."""
        st.place(self.prefer(st) if st.buffer is _sbuf else None)
        early = self._early.pop(st.sid, None)
        if early and st.memory is not None:
            space, aid, shift = st.buffer.space, st.aid, st.addr
            for instr in early:
                instr.reads = _shifted(instr.reads, space, aid, shift)
                instr.writes = _shifted(instr.writes, space, aid, shift)

    def touched(
        self,
        dsts: tuple[NkiTensor, ...],
        srcs: tuple[NkiTensor, ...],
        program: int = 0,
        instr: Any = None,
    ) -> None:
        """One instruction (`instr`, the trace's record) read `srcs` and wrote `dsts`
        (their indirect indexes included)."""
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
                self._schedule(s, dsts, srcs, seen, program, instr)
            return
        early = self._early
        for st in seen:
            if early and instr is not None:
                waiting = early.get(st.sid)
                if waiting is not None and st.memory is None:
                    waiting.append(instr)
            st.remaining -= 1
            if st.remaining == 0:
                st.release()
        if self.ends or self.starts:
            for slot in (2 * s, 2 * s + 1):
                for st in self.starts.pop((program, slot), ()):
                    self._place(st)
                for st in self.ends.pop((program, slot), ()):
                    st.release()

    def _schedule(
        self,
        s: int,
        dsts: tuple[NkiTensor, ...],
        srcs: tuple[NkiTensor, ...],
        seen: list[Any],
        program: int = 0,
        instr: Any = None,
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
        self._live_range(slot, dsts, srcs, seen)
        self._defer(slot, program, dsts, srcs, seen, instr)
        for k in written:
            self.last_write[k] = s
        for st in seen:
            self.last_access[st.key] = s

    def _live_range(
        self, slot: int, dsts: tuple[NkiTensor, ...], srcs: tuple[NkiTensor, ...], seen: list[Any]
    ) -> None:
        """Recording: extend or end the live ranges of the SBUF tiles `seen` at `slot`."""
        from .language import sbuf

        read = {t._st.key for t in srcs}
        for t in (*dsts, *srcs):
            ind = t.indirect
            if ind is not None and hasattr(ind.index, "_st"):
                read.add(ind.index._st.key)
        for st in seen:
            if st.buffer is not sbuf or st.pinned:
                continue
            key = st.key
            if key in read:
                tail = self._rewrite.pop(key, None)
                cur = self._open.get(key)
                if cur is None:
                    lo = slot if tail is None else min(slot, tail[0])
                    self._open[key] = [lo, slot]
                elif tail is not None and tail[2] is True:  # rewritten whole: a new range
                    self.ranges.setdefault(key, []).append((cur[0], cur[1]))
                    self._open[key] = [min(slot, tail[0]), max(slot, tail[1])]
                else:
                    los = (cur[0], slot) if tail is None else (cur[0], slot, tail[0])
                    his = (cur[1], slot) if tail is None else (cur[1], slot, tail[1])
                    cur[0], cur[1] = min(los), max(his)
                continue
            tail = self._rewrite.get(key)
            if tail is None:
                tail = self._rewrite[key] = [slot, slot, None]
            tail[0], tail[1] = min(tail[0], slot), max(tail[1], slot)
            if tail[2] is not True:
                tail[2] = _cover(st, [t for t in dsts if t._st is st], tail[2])

    def _defer(
        self,
        slot: int,
        program: int,
        dsts: tuple[NkiTensor, ...],
        srcs: tuple[NkiTensor, ...],
        seen: list[Any],
        instr: Any,
    ) -> None:
        """Recording: the fills and loads of SBUF tiles not yet otherwise accessed, and
        where each could move (see "Deferred fills and loads")."""
        from .language import sbuf

        pending = self._pending
        if pending:
            attrs = instr.attrs if instr is not None else {}
            seq = instr is not None and instr.engine == "sync"
            if seq and instr.opcode == "loop_branch":  # nothing moves into or out of a
                for key in [k for k in pending if k[0] == program]:  # device loop
                    self._settle(key, slot)
            elif (
                seq
                or any(k in attrs for k in _SYNC_ATTRS)
                or any(not t._st.buffer.on_chip for t in dsts)
            ):  # a load never moves past a synchronisation, a write to HBM or a register
                # write (its address may read the register: `.ap(scalar_offset=reg)`)
                for key in [k for k, e in pending.items() if k[0] == program and e[3]]:
                    self._settle(key, slot)
            by_index = self._by_index
            for t in dsts:  # nor a fill or load past a write of its index tile
                tiles = by_index.pop(t._st.key, None) if t._st.key is not None else None
                for key in tiles or ():
                    if key in pending:
                        self._settle(key, slot)
        target = _fill_target(dsts, srcs, instr)
        for st in seen:
            key = st.key
            if key in self._settled or st.buffer is not sbuf or st.pinned:
                continue
            if key == target:
                entry = pending.get(key)
                if entry is None:
                    entry = pending[key] = [slot, [], set(), False, slot]
                entry[1].append(instr.index)
                entry[3] = entry[3] or any(not t._st.buffer.on_chip for t in srcs)
                entry[4] = slot
                for t in (*dsts, *srcs):
                    ind = t.indirect
                    if ind is not None and hasattr(ind.index, "_st"):
                        idx = ind.index._st.key
                        entry[2].add(idx)
                        self._by_index.setdefault(idx, set()).add(key)
            elif key in pending:
                self._settle(key, slot)
            else:
                self._settled.add(key)

    def _settle(self, key: Key, slot: int) -> None:
        """Recording: the fills and loads of `key` can move up to `slot`, the first
        access they cannot pass."""
        first, writers, index, _, last = self._pending.pop(key)
        self._settled.add(key)
        if slot > first:
            self.deferrals.append((key, first, slot, tuple(writers), tuple(index), last))

    def deferred_plan(
        self,
    ) -> tuple[dict[Key, int], dict[Key, tuple[int, int]], dict[Key, list[tuple[int, int]]]] | None:
        """Recording, at its end: the use counts, spans and live ranges with the fills and
        loads deferred (None when there is nothing to move). The instructions a
        `depends_on` edge names (`named`, set by the launcher) keep their place."""
        moves = [d for d in self.deferrals if not self.named.intersection(d[3])]
        if not moves:
            return None
        counts = dict(self.counts)
        spans = dict(self.spans)
        ranges = self.live_ranges()
        grown: dict[Key, list[tuple[int, int]]] = {}
        for key, _first, start, _, index, last in moves:
            lo, hi = spans[key]
            if start > hi:
                continue
            spans[key] = (start, hi)
            split = ranges.get(key)
            if split is not None:
                if start > split[0][1]:
                    spans[key] = (lo, hi)
                    continue
                ranges[key] = [(start, split[0][1]), *split[1:]]
            for idx in index:
                grown.setdefault(idx, []).append((last, start))
        for idx, ext in grown.items():
            lo, hi = spans[idx]
            spans[idx] = (lo, max(hi, *(b for _, b in ext)))
            counts[idx] = counts.get(idx, 0) + 1  # freed at its span's end, not its last use
            split = ranges.get(idx)
            if split is not None:
                out = [list(r) for r in split]
                for at, b in ext:
                    for r in out:
                        if r[0] <= at <= r[1]:
                            r[1] = max(r[1], b)
                merged: list[list[int]] = []
                for a, b in out:
                    if merged and a <= merged[-1][1]:
                        merged[-1][1] = max(merged[-1][1], b)
                    else:
                        merged.append([a, b])
                ranges[idx] = [(a, b) for a, b in merged]
                if len(merged) == 1:
                    del ranges[idx]
        return counts, spans, ranges


def _fill_target(dsts: tuple[NkiTensor, ...], srcs: tuple[NkiTensor, ...], instr: Any) -> Any:
    """The tile a fill or load writes, if the instruction may move (one SBUF destination,
    no on-chip source, outside `no_reorder`, no synchronisation); else None."""
    from .language import sbuf

    if instr is None or len(dsts) != 1 or instr.no_reorder:
        return None
    op = instr.opcode
    if op not in _FILLS and op not in _LOADS:
        return None
    if any(k in instr.attrs for k in _SYNC_ATTRS):
        return None
    st = dsts[0]._st
    if st.buffer is not sbuf or st.pinned or st.key is None:
        return None
    if any(t._st.buffer.on_chip for t in srcs):
        return None
    return st.key


def _shifted(regions: tuple[Any, ...], space: int, aid: int, shift: int) -> tuple[Any, ...]:
    """`regions` with those of allocation `aid` in `space` moved by `shift` bytes."""
    if not shift:
        return regions
    return tuple(
        (r[0], r[1], r[2], r[3], r[4] + shift, r[5] + shift) if r[0] == space and r[1] == aid else r
        for r in regions
    )


def _cover(st: Storage, views: list[NkiTensor], mask: Any) -> Any:
    """The elements of `st` a rewrite has written so far: True when all of them, a
    boolean mask when some, False when a write's elements cannot be told (an indirect
    view, another dtype): that rewrite never ends a live range."""
    import numpy as np

    from .engine import _affine

    for t in views:
        if mask is False or t.indirect is not None or t.dtype != st.dtype:
            return False
        if int(np.prod(t.shape)) == st.size and _dense(t):
            return True
        if mask is None:
            mask = np.zeros(st.size, dtype=np.bool_)
        addr = _affine(t.shape, t.strides) + t.offset
        mask[addr[(addr >= 0) & (addr < st.size)]] = True
    if isinstance(mask, np.ndarray) and bool(mask.all()):
        return True
    return mask


def _dense(t: NkiTensor) -> bool:
    """Whether the view's elements are distinct storage elements filling [offset, offset +
    size): sorted by stride, each dimension's stride is the product of the smaller ones."""
    dims = sorted((d, s) for s, d in zip(t.shape, t.strides) if s > 1)
    step = 1
    for d, s in dims:
        if d != step:
            return False
        step *= s
    return t.offset == 0


def _add(seen: list[Any], st: Any) -> None:
    if st.key is not None and st not in seen:
        seen.append(st)
