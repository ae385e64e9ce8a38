"""`nki.collectives`: collective communication between the ranks of a `ranks.run_ranks`
launch (aws-neuron-sdk @ 81ce03ae, `nki/api/nki/collectives/__init__.py`).

Each call meets the same call of the other ranks of its replica sub-group (their k-th
collective; under LNC 2, program p meets program p of each rank), then the last rank to
arrive moves the data for all of them. A launch of one rank (`kernel(...)`) is a world of
rank 0. Semantics, per the stubs:

- `all_reduce`: every dst = op over the group's srcs (nl.add / minimum / maximum, in
  fp32, then rounded to the dst dtype), tensor by tensor for coalesced lists.
- `all_gather`: every dst = the group's srcs concatenated along `collective_dim` in
  rank-list order; `reduce_scatter`: op over the srcs, then the k-th rank of the list
  gets the k-th chunk along dim 0; `all_to_all`: the k-th rank's dst chunk j is the j-th
  rank's src chunk k (dim 0).
- `all_gather_v` / `all_to_all_v`: flat element buffers with a uint32 metadata tensor
  (rows send counts, send displacements, receive counts (written back unless
  `recv_counts_known`), receive displacements).
- `collective_permute`: dst of each target = src of its source; the `_implicit` forms
  send along the rank-list ring to the successor (`_reduce`: op(src0, src1) is sent).
- `rank_id()` and `collective_permute_implicit_current_processing_rank_id` return
  registers (the global rank).

The documented restrictions are rule COLLECTIVE. Cost: each call is one DMA record per
rank moving the bytes that rank receives; inter-core and inter-device links, ring
steps and their latency are not modeled beyond that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes as dt
from .engine import emit, need_version, op_token, read, write
from .errors import fail
from .loops import VirtualRegister
from .nkiobject import NKIObject
from .state import current
from .tensor import NkiTensor, psum, shared_hbm
from .trace import Instr

REDUCE_OPS = ("add", "minimum", "maximum")
MAX_CHANNELS_WHOLE_WORLD = 4  # "4 for replica groups containing all devices inside a node"
MAX_CHANNELS = 2  # "... and 2 for other supported replica groups"
RANKS_PER_DEVICE_LNC2 = 4  # a device's ranks under LNC 2 (all_gather_v: "4 ranks (intra-chip)")


class ReplicaGroup(NKIObject):
    """`nki.collectives.ReplicaGroup`: the ranks taking part in a collective, as a list of
    non-overlapping sub-groups (lists of ranks)."""

    replica_groups: Any = None


# ---- argument checks ----------------------------------------------------------------------
def _rule(fn: str, message: str) -> Exception:
    return fail("COLLECTIVE", f"ncc.{fn}: {message}")


def _tensors(x: Any, arg: str, fn: str, exactly_one: bool = False) -> list[NkiTensor]:
    if not isinstance(x, (list, tuple)) or not x:
        raise fail("ARG", f"ncc.{fn}: {arg} must be a non-empty list of tensors; got {x!r}")
    for t in x:
        if not isinstance(t, NkiTensor):
            raise fail("ARG", f"ncc.{fn}: {arg} must hold NKI tensors; got {type(t).__name__}")
    if exactly_one and len(x) != 1:
        raise _rule(fn, f"{arg} must hold exactly one tensor (no coalescing); got {len(x)}")
    return list(x)


def _space(fn: str, tensors: list[NkiTensor], sbuf_ok: bool) -> str:
    """'hbm' or 'sbuf': the one memory space of every operand."""
    spaces: dict[str, str] = {}  # space -> the first operand found there
    for t in tensors:
        if t.buffer is psum:
            raise fail("BUF", f"ncc.{fn}: '{t.name}' is in PSUM; collectives use HBM or SBUF")
        if t.buffer.on_chip:
            spaces.setdefault("sbuf", t.name)
            continue
        spaces.setdefault("hbm", t.name)
        if t.storage.is_input:
            # nki-library's tests: "Collective instruction cannot read/write IO tensors"
            raise _rule(
                fn,
                f"'{t.name}' is a kernel argument; collectives cannot read or write the "
                "kernel's IO tensors (copy it into an nl.shared_hbm tensor first)",
            )
        if t.buffer is not shared_hbm:
            raise _rule(fn, f"HBM operand '{t.name}' must be nl.shared_hbm; got {t.buffer!r}")
    if len(spaces) > 1:
        raise _rule(
            fn,
            f"mixing HBM and SBUF operands is not supported; got '{spaces['hbm']}' on HBM "
            f"and '{spaces['sbuf']}' on SBUF",
        )
    space, first = next(iter(spaces.items()))
    if space == "sbuf" and not sbuf_ok:
        raise _rule(
            fn,
            f"operands must be on HBM (SBUF is not supported for this collective); got "
            f"'{first}' on SBUF",
        )
    return space


def _pairs(fn: str, srcs: list[NkiTensor], dsts: list[NkiTensor], space: str) -> None:
    if len(srcs) != len(dsts):
        raise fail("ARG", f"ncc.{fn}: {len(srcs)} srcs but {len(dsts)} dsts")
    if len(srcs) > 1 and space == "sbuf":
        raise _rule(fn, f"coalesced operands ({len(srcs)} tensors) are only supported on HBM")
    for s, d in zip(srcs, dsts):
        if s.dtype != d.dtype:
            raise fail("DTYPE", f"ncc.{fn}: src '{s.name}' is {s.dtype}, dst '{d.name}' {d.dtype}")


def _priority(fn: str, priority: Any) -> None:
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 3:
        raise fail("ARG", f"ncc.{fn}: priority must be None or 0..3; got {priority!r}")
    need_version(4, f"ncc.{fn}(priority=...)")


def _reduce_op(fn: str, op: Any) -> Any:
    o = op_token(op, "op", f"ncc.{fn}")
    if o.name not in REDUCE_OPS:
        raise fail("OP", f"ncc.{fn}: op must be nl.add, nl.minimum or nl.maximum; got nl.{o.name}")
    return o


def _groups(fn: str, replica_group: Any) -> list[tuple[int, ...]]:
    if not isinstance(replica_group, ReplicaGroup):
        raise fail("ARG", f"ncc.{fn}: replica_group must be a ReplicaGroup; got {replica_group!r}")
    raw = replica_group.replica_groups
    if not isinstance(raw, (list, tuple)) or not raw:
        raise fail("ARG", f"ncc.{fn}: ReplicaGroup needs a list of rank lists; got {raw!r}")
    groups: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for g in raw:
        if not isinstance(g, (list, tuple)) or not g:
            raise fail("ARG", f"ncc.{fn}: each sub-group must be a non-empty list; got {g!r}")
        if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in g):
            raise fail("ARG", f"ncc.{fn}: ranks must be non-negative ints; got {g!r}")
        if seen & set(g) or len(set(g)) != len(g):
            raise _rule(fn, f"replica sub-groups must not overlap; rank list {list(g)} repeats")
        seen |= set(g)
        groups.append(tuple(g))
    return groups


def _world_size() -> int:
    world = current().world
    return 1 if world is None else int(world.n_ranks)


def _my_group(fn: str, groups: list[tuple[int, ...]]) -> tuple[int, ...]:
    rank, n = current().rank, _world_size()
    for g in groups:
        if max(g) >= n:
            raise _rule(fn, f"rank {max(g)} of {list(g)} is not launched ({n} rank(s))")
    for g in groups:
        if rank in g:
            return g
    raise _rule(fn, f"rank {rank} is in none of the replica sub-groups {[list(g) for g in groups]}")


# ---- meeting the other ranks ----------------------------------------------------------
def _exchange(
    fn: str,
    group: tuple[int, ...],
    payload: dict[str, Any],
    deliver: Callable[[dict[int, Any]], None],
) -> None:
    """Meet the group's ranks; the last to arrive calls `deliver(payloads by rank)` (before
    any other rank runs on)."""
    launch = current()
    world = launch.world
    if world is None:
        deliver({0: payload})
        return
    pid = launch.program_id
    sched = world.scheduler
    slot = world.slot(launch.rank, pid)
    seq = world.next_call(slot)
    where = f" of program {pid}" if world.lnc > 1 else ""
    key = f"collective #{seq}{where} over ranks {list(group)}"
    slots = tuple(world.slot(r, pid) for r in group)
    m = sched.meet(fn, key, launch.rank, group, slots, payload, namespace="collective")
    if not m.delivered:
        m.delivered = True
        deliver(dict(m.arrived))
    sched.release(m)
    sched.yield_to_waiters()


def _agreed(fn: str, arrived: dict[int, Any], *fields: str) -> bool:
    """Check that the ranks agree on `fields`; True when the data is to be moved (numeric mode)."""
    for field in fields:
        values = {r: p[field] for r, p in arrived.items()}
        first = next(iter(values.values()))
        if any(v != first for v in values.values()):
            detail = "; ".join(f"rank {r}: {v}" for r, v in sorted(values.items()))
            raise _rule(fn, f"the ranks disagree on {field} ({detail})")
    return not current().trace_only


def _record(
    fn: str, srcs: list[NkiTensor], dsts: list[NkiTensor], nbytes: int, **attrs: Any
) -> Instr:
    d = dsts[0]
    return emit(
        "dma",
        fn,
        tuple(dsts),
        tuple(srcs),
        d.shape[0],
        d.size // d.shape[0],
        nbytes=nbytes,
        attrs=attrs,
    )


def _list_operands(
    fn: str, srcs: Any, dsts: Any, priority: Any, sbuf_ok: bool
) -> tuple[list[NkiTensor], list[NkiTensor], str]:
    """The checked (srcs, dsts, memory space) of a collective over paired tensor lists."""
    srcs, dsts = _tensors(srcs, "srcs", fn), _tensors(dsts, "dsts", fn)
    space = _space(fn, srcs + dsts, sbuf_ok=sbuf_ok)
    _pairs(fn, srcs, dsts, space)
    _priority(fn, priority)
    return srcs, dsts, space


def _nbytes(ts: list[NkiTensor]) -> int:
    return sum(t.size * t.dtype._size for t in ts)


def _shape_sig(srcs: list[NkiTensor], dsts: list[NkiTensor]) -> tuple[Any, ...]:
    return (
        tuple((s.shape, str(s.dtype)) for s in srcs),
        tuple((d.shape, str(d.dtype)) for d in dsts),
    )


# ---- the collectives -----------------------------------------------------------------
def all_reduce(
    srcs: list[NkiTensor],
    dsts: list[NkiTensor],
    replica_group: ReplicaGroup,
    op: Any,
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """Every dst of the group = `op` over the group's srcs (tensor by tensor)."""
    fn = "all_reduce"
    srcs, dsts, _ = _list_operands(fn, srcs, dsts, priority, sbuf_ok=True)
    o = _reduce_op(fn, op)
    for s, d in zip(srcs, dsts):
        if s.shape != d.shape:
            raise fail("FREE", f"ncc.{fn}: src {s.shape} and dst {d.shape} differ in shape")
    group = _my_group(fn, _groups(fn, replica_group))
    _record(fn, srcs, dsts, (len(group) - 1) * _nbytes(dsts), ranks=group, op=o.name)

    def deliver(got: dict[int, Any]) -> None:
        if _agreed(fn, got, "op", "shapes"):
            for i in range(len(srcs)):
                total = _reduce([got[r]["srcs"][i] for r in group], o)
                for r in group:
                    write(got[r]["dsts"][i], total)

    _exchange(
        fn,
        group,
        {"srcs": srcs, "dsts": dsts, "op": o.name, "shapes": _shape_sig(srcs, dsts)},
        deliver,
    )


def _reduce(ts: list[NkiTensor], o: Any) -> np.ndarray:
    acc = dt.to_f32(read(ts[0])).astype(np.float32)
    for t in ts[1:]:
        acc = np.asarray(o.fn(acc, dt.to_f32(read(t))), dtype=np.float32)
    return acc


def _dim(fn: str, collective_dim: Any, allowed: tuple[int, ...], space: str) -> int:
    if isinstance(collective_dim, bool) or collective_dim not in allowed:
        raise _rule(
            fn,
            f"collective_dim must be one of {allowed} for {space.upper()} tensors; "
            f"got {collective_dim!r}",
        )
    return int(collective_dim)


def all_gather(
    srcs: list[NkiTensor],
    dsts: list[NkiTensor],
    replica_group: ReplicaGroup,
    collective_dim: int,
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """Every dst of the group = the group's srcs concatenated along `collective_dim`."""
    fn = "all_gather"
    srcs, dsts, space = _list_operands(fn, srcs, dsts, priority, sbuf_ok=True)
    dim = _dim(fn, collective_dim, (0, 1) if space == "sbuf" else (0,), space)
    if space == "sbuf":
        for t in srcs + dsts:
            if len(t.shape) != 2:
                raise _rule(
                    fn, f"SBUF operands must be 2-D (one free dim); '{t.name}' is {t.shape}"
                )
    group = _my_group(fn, _groups(fn, replica_group))
    n = len(group)
    for s, d in zip(srcs, dsts):
        want = (*s.shape[:dim], s.shape[dim] * n, *s.shape[dim + 1 :])
        if d.shape != want:
            raise fail(
                "FREE",
                f"ncc.{fn}: dst '{d.name}' is {d.shape}; {n} ranks of src "
                f"{s.shape} along dim {dim} make {want}",
            )
    _record(fn, srcs, dsts, _nbytes(dsts) * (n - 1) // n, ranks=group, collective_dim=dim)

    def deliver(got: dict[int, Any]) -> None:
        if _agreed(fn, got, "dim", "shapes"):
            for i in range(len(srcs)):
                whole = np.concatenate([read(got[r]["srcs"][i]) for r in group], axis=dim)
                for r in group:
                    write(got[r]["dsts"][i], whole)

    _exchange(
        fn,
        group,
        {"srcs": srcs, "dsts": dsts, "dim": dim, "shapes": _shape_sig(srcs, dsts)},
        deliver,
    )


def reduce_scatter(
    srcs: list[NkiTensor],
    dsts: list[NkiTensor],
    replica_group: ReplicaGroup,
    collective_dim: int,
    op: Any,
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """`op` over the group's srcs, split along dim 0: the k-th rank of the list gets chunk k."""
    fn = "reduce_scatter"
    srcs, dsts, space = _list_operands(fn, srcs, dsts, priority, sbuf_ok=True)
    o = _reduce_op(fn, op)
    _dim(fn, collective_dim, (0,), space)
    group = _my_group(fn, _groups(fn, replica_group))
    n = len(group)
    for s, d in zip(srcs, dsts):
        if s.shape[0] % n or d.shape != (s.shape[0] // n, *s.shape[1:]):
            raise fail(
                "FREE",
                f"ncc.{fn}: src {s.shape} splits into {n} chunks along dim 0; "
                f"dst '{d.name}' is {d.shape}",
            )
    _record(fn, srcs, dsts, (n - 1) * _nbytes(dsts), ranks=group, op=o.name)

    def deliver(got: dict[int, Any]) -> None:
        if _agreed(fn, got, "op", "shapes"):
            for i in range(len(srcs)):
                total = _reduce([got[r]["srcs"][i] for r in group], o)
                for k, chunk in enumerate(np.split(total, n, axis=0)):
                    write(got[group[k]]["dsts"][i], chunk)

    _exchange(
        fn,
        group,
        {"srcs": srcs, "dsts": dsts, "op": o.name, "shapes": _shape_sig(srcs, dsts)},
        deliver,
    )


def all_to_all(
    srcs: list[NkiTensor],
    dsts: list[NkiTensor],
    replica_group: ReplicaGroup,
    collective_dim: int,
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """Chunk j (along dim 0) of the k-th rank's src becomes chunk k of the j-th rank's dst."""
    fn = "all_to_all"
    srcs, dsts, space = _list_operands(fn, srcs, dsts, priority, sbuf_ok=False)
    _dim(fn, collective_dim, (0,), space)
    group = _my_group(fn, _groups(fn, replica_group))
    n = len(group)
    for s, d in zip(srcs, dsts):
        if s.shape != d.shape or s.shape[0] % n:
            raise fail(
                "FREE",
                f"ncc.{fn}: src {s.shape} and dst {d.shape} must agree, dim 0 "
                f"divisible by {n} ranks",
            )
    _record(fn, srcs, dsts, _nbytes(dsts) * (n - 1) // n, ranks=group)

    def deliver(got: dict[int, Any]) -> None:
        if _agreed(fn, got, "shapes"):
            for i in range(len(srcs)):
                parts = {r: np.split(read(got[r]["srcs"][i]), n, axis=0) for r in group}
                for j, r in enumerate(group):
                    whole = np.concatenate([parts[q][j] for q in group], axis=0)
                    write(got[r]["dsts"][i], whole)

    _exchange(fn, group, {"srcs": srcs, "dsts": dsts, "shapes": _shape_sig(srcs, dsts)}, deliver)


# ---- registers ----------------------------------------------------------------------
def rank_id(name: str | None = None) -> VirtualRegister:
    """A register holding this launch's rank (0 in a launch of one rank)."""
    emit("sync", "rank_id", (), (), 1, 1)
    return VirtualRegister(current().rank)


NOT_SUPPORTED: dict[str, str] = {}  # every documented collective is implemented

__all__ = ["ReplicaGroup", "all_gather", "all_reduce", "all_to_all", "rank_id", "reduce_scatter"]
