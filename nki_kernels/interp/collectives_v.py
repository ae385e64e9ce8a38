"""`nki.collectives`, continued: the variable-length collectives (`all_gather_v`,
`all_to_all_v`: flat element buffers sized by a uint32 metadata tensor at run time) and
the point-to-point ones (`collective_permute` with explicit pairs, the ring forms
`collective_permute_implicit` / `_reduce` and the ring's
`collective_permute_implicit_current_processing_rank_id`). Semantics and restrictions as
the stubs state them (aws-neuron-sdk @ 81ce03ae, `nki/api/nki/collectives/__init__.py`);
meeting, pricing and the common checks are collectives.py's.

Metadata rows: 0 send counts, 1 send displacements (`all_gather_v` reads column 0 of
both), 2 receive counts (written back unless `recv_counts_known`), 3 receive
displacements (read when `has_rdispls`); without them sender j's chunk lands at
`j * dst elements / ranks`. The variable collectives are priced at the dst buffer's
bytes (the counts are run-time values).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes as dt
from .collectives import (
    MAX_CHANNELS,
    MAX_CHANNELS_WHOLE_WORLD,
    RANKS_PER_DEVICE_LNC2,
    ReplicaGroup,
    _agreed,
    _exchange,
    _groups,
    _my_group,
    _nbytes,
    _priority,
    _record,
    _reduce_op,
    _rule,
    _space,
    _tensors,
    _world_size,
)
from .engine import emit, read, write
from .errors import fail
from .loops import VirtualRegister
from .state import current
from .tensor import NkiTensor, psum


def _metadata(fn: str, meta: Any, n: int, has_rdispls: bool) -> NkiTensor:
    if not isinstance(meta, NkiTensor):
        raise fail("ARG", f"ncc.{fn}: metadata_tensor must be an NKI tensor; got {meta!r}")
    if meta.buffer is psum:
        raise fail("BUF", f"ncc.{fn}: metadata_tensor must be on HBM or SBUF; got PSUM")
    if meta.dtype != dt.uint32:
        raise fail("DTYPE", f"ncc.{fn}: metadata_tensor must be uint32; got {meta.dtype}")
    rows = (4,) if has_rdispls else (3, 4)
    shapes = [(r, n) for r in rows] if not meta.buffer.on_chip else [(1, r, n) for r in rows]
    if meta.shape not in shapes:
        where = "SBUF" if meta.buffer.on_chip else "HBM"
        raise _rule(fn, f"metadata_tensor on {where} must be one of {shapes}; got {meta.shape}")
    return meta


def _rows(meta: NkiTensor) -> np.ndarray:
    return read(meta).reshape(meta.shape[-2], meta.shape[-1]).astype(np.int64)


def _set_recv_counts(meta: NkiTensor, counts: list[int]) -> None:
    rows = read(meta).reshape(meta.shape[-2], meta.shape[-1]).copy()
    rows[2, :] = counts
    write(meta, rows.reshape(meta.shape))


def _one(fn: str, srcs: Any, dsts: Any) -> tuple[NkiTensor, NkiTensor]:
    src = _tensors(srcs, "srcs", fn, exactly_one=True)[0]
    dst = _tensors(dsts, "dsts", fn, exactly_one=True)[0]
    _space(fn, [src, dst], sbuf_ok=False)
    if src.dtype != dst.dtype:
        raise fail("DTYPE", f"ncc.{fn}: src is {src.dtype}, dst {dst.dtype}")
    return src, dst


def _chunk(fn: str, t: NkiTensor, start: int, count: int, what: str) -> None:
    if start < 0 or count < 0 or start + count > t.size:
        raise _rule(
            fn,
            f"{what}: elements [{start}, {start + count}) outside '{t.name}' ({t.size} elements)",
        )


def all_gather_v(
    srcs: list[NkiTensor],
    dsts: list[NkiTensor],
    replica_group: ReplicaGroup,
    metadata_tensor: NkiTensor,
    recv_counts_known: bool = False,
    has_rdispls: bool = False,
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """Each rank broadcasts src[send_displ : send_displ + send_count] into slot j (its
    rank-list position) of every rank's dst."""
    fn = "all_gather_v"
    src, dst = _one(fn, srcs, dsts)
    _priority(fn, priority)
    if has_rdispls:
        raise _rule(fn, "has_rdispls=True is not supported (documented limitation)")
    if current().lnc != 2:
        raise _rule(fn, f"only LNC=2 is supported; this launch is LNC {current().lnc}")
    group = _my_group(fn, _groups(fn, replica_group))
    n = len(group)
    if n != RANKS_PER_DEVICE_LNC2:
        raise _rule(fn, f"each rank-list must have exactly 4 ranks (intra-chip); got {list(group)}")
    meta = _metadata(fn, metadata_tensor, n, has_rdispls)
    if dst.size % n:
        raise _rule(fn, f"dst's {dst.size} elements do not split into {n} equal slots")
    _record(fn, [src], [dst], _nbytes([dst]), ranks=group)
    payload = {"src": src, "dst": dst, "meta": meta, "known": bool(recv_counts_known)}

    def deliver(got: dict[int, Any]) -> None:
        if not _agreed(fn, got, "known"):
            return
        slot = dst.size // n
        chunks = []
        for r in group:
            rows = _rows(got[r]["meta"])
            count, displ = int(rows[0, 0]), int(rows[1, 0])
            _chunk(fn, got[r]["src"], displ, count, f"rank {r}'s send chunk")
            if count > slot:
                raise _rule(fn, f"rank {r} sends {count} elements; a dst slot holds {slot}")
            chunks.append(read(got[r]["src"]).reshape(-1)[displ : displ + count])
        for r in group:
            flat = read(got[r]["dst"]).reshape(-1).copy()
            for j, c in enumerate(chunks):
                flat[j * slot : j * slot + c.size] = c
            write(got[r]["dst"], flat.reshape(got[r]["dst"].shape))
            if not got[r]["known"]:
                _set_recv_counts(got[r]["meta"], [c.size for c in chunks])

    _exchange(fn, group, payload, deliver)


def _a2av_restrictions(fn: str, group: tuple[int, ...], has_rdispls: bool) -> None:
    launch = current()
    if launch.target.nc_version < 4:
        # "On other instances, all_to_all_v currently supports only inter-node replica
        # groups"; the ranks of one run_ranks launch are one node.
        raise _rule(
            fn,
            f"on {launch.target.name} only inter-node replica groups are supported (ranks of "
            "different nodes); the ranks of one launch are one node",
        )
    if launch.lnc != 2:
        raise _rule(fn, f"NeuronSwitch instances need LNC=2; this launch is LNC {launch.lnc}")
    sequential = list(group) == list(range(group[0], group[0] + len(group)))
    if not sequential or len(group) % RANKS_PER_DEVICE_LNC2 or len(group) < 8:
        raise _rule(
            fn,
            "each rank-list must be sequential ranks covering whole devices (4 ranks each "
            f"under LNC 2) of more than one device; got {list(group)}",
        )


def all_to_all_v(
    srcs: list[NkiTensor],
    dsts: list[NkiTensor],
    replica_group: ReplicaGroup,
    metadata_tensor: NkiTensor,
    recv_counts_known: bool = False,
    has_rdispls: bool = False,
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """Rank j sends src[send_displs[k] : + send_counts[k]] to the k-th rank of the list,
    which writes it at recv_displs[j] (or slot j)."""
    fn = "all_to_all_v"
    src, dst = _one(fn, srcs, dsts)
    _priority(fn, priority)
    group = _my_group(fn, _groups(fn, replica_group))
    n = len(group)
    _a2av_restrictions(fn, group, bool(has_rdispls))
    meta = _metadata(fn, metadata_tensor, n, bool(has_rdispls))
    if not has_rdispls and dst.size % n:
        raise _rule(fn, f"dst's {dst.size} elements do not split into {n} equal slots")
    _record(fn, [src], [dst], _nbytes([dst]), ranks=group)
    payload = {
        "src": src,
        "dst": dst,
        "meta": meta,
        "known": bool(recv_counts_known),
        "rdispls": bool(has_rdispls),
    }

    def deliver(got: dict[int, Any]) -> None:
        if not _agreed(fn, got, "known", "rdispls"):
            return
        rows = {r: _rows(got[r]["meta"]) for r in group}
        slot = dst.size // n
        for k, rk in enumerate(group):
            dst_k = got[rk]["dst"]
            flat = read(dst_k).reshape(-1).copy()
            counts = []
            for j, rj in enumerate(group):
                count, displ = int(rows[rj][0, k]), int(rows[rj][1, k])
                _chunk(fn, got[rj]["src"], displ, count, f"rank {rj}'s chunk for rank {rk}")
                at = int(rows[rk][3, j]) if has_rdispls else j * slot
                if not has_rdispls and count > slot:
                    raise _rule(fn, f"rank {rj} sends {count} elements; a dst slot holds {slot}")
                _chunk(fn, dst_k, at, count, f"rank {rk}'s receive of rank {rj}'s chunk")
                flat[at : at + count] = read(got[rj]["src"]).reshape(-1)[displ : displ + count]
                counts.append(count)
            write(dst_k, flat.reshape(dst_k.shape))
            if not got[rk]["known"]:
                _set_recv_counts(got[rk]["meta"], counts)

    _exchange(fn, group, payload, deliver)


def collective_permute(
    srcs: list[NkiTensor],
    dsts: list[NkiTensor],
    source_target_pairs: list[tuple[int, int]],
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """For each (source, target) pair, the target's dst = the source's src."""
    fn = "collective_permute"
    src, dst = _one(fn, srcs, dsts)
    _priority(fn, priority)
    try:
        pairs = tuple((int(s), int(t)) for s, t in source_target_pairs)
    except (TypeError, ValueError):
        raise fail(
            "ARG",
            f"ncc.{fn}: source_target_pairs must be (source, target) int pairs; got "
            f"{source_target_pairs!r}",
        ) from None
    targets = [t for _, t in pairs]
    if len(set(targets)) != len(targets):
        raise _rule(fn, f"a rank is the target of two pairs in {list(pairs)}")
    ranks = tuple(sorted({r for p in pairs for r in p}))
    n = _world_size()
    if not ranks or ranks[0] < 0 or ranks[-1] >= n:
        raise _rule(fn, f"pairs {list(pairs)} name ranks outside the {n} launched")
    me = current().rank
    if me not in ranks:
        raise _rule(fn, f"rank {me} is in none of the source_target_pairs {list(pairs)}")
    if src.shape != dst.shape:
        raise fail("FREE", f"ncc.{fn}: src {src.shape} and dst {dst.shape} differ")
    _record(fn, [src], [dst], _nbytes([dst]) if me in targets else 0, pairs=pairs)
    payload = {"src": src, "dst": dst, "pairs": pairs, "shape": (src.shape, str(src.dtype))}

    def deliver(got: dict[int, Any]) -> None:
        if _agreed(fn, got, "pairs", "shape"):
            data = {s: read(got[s]["src"]).copy() for s, _ in pairs}
            for s, t in pairs:
                write(got[t]["dst"], data[s])

    _exchange(fn, ranks, payload, deliver)


def _channels(fn: str, by_channel: Any, arg: str) -> list[NkiTensor]:
    if not isinstance(by_channel, (list, tuple)) or not by_channel:
        raise fail("ARG", f"ncc.{fn}: {arg} must be a non-empty list of per-channel lists")
    return [_tensors(c, f"{arg}[{i}]", fn, exactly_one=True)[0] for i, c in enumerate(by_channel)]


def _ring_setup(
    fn: str, replica_group: Any, channel_ids: Any, n_channels: int
) -> tuple[tuple[int, ...], int]:
    group = _my_group(fn, _groups(fn, replica_group))
    ids = list(channel_ids) if isinstance(channel_ids, (list, tuple)) else None
    if ids is None or ids != list(range(n_channels)):
        raise _rule(
            fn,
            f"channel_ids must be consecutive from 0, one per channel ({n_channels}); "
            f"got {channel_ids!r}",
        )
    limit = MAX_CHANNELS_WHOLE_WORLD if len(group) == _world_size() else MAX_CHANNELS
    if n_channels > limit:
        raise _rule(fn, f"at most {limit} channels for rank-list {list(group)}; got {n_channels}")
    return group, group.index(current().rank)


def collective_permute_implicit(
    srcs_by_channel: list[list[NkiTensor]],
    dsts_by_channel: list[list[NkiTensor]],
    replica_group: ReplicaGroup,
    channel_ids: list[int] = [0],  # noqa: B006 - the documented default
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """Ring: each rank's dst (per channel) = its predecessor's src in the rank-list."""
    _ring(
        "collective_permute_implicit",
        [srcs_by_channel],
        dsts_by_channel,
        replica_group,
        None,
        channel_ids,
        priority,
    )


def collective_permute_implicit_reduce(
    srcs0_by_channel: list[list[NkiTensor]],
    srcs1_by_channel: list[list[NkiTensor]],
    dsts_by_channel: list[list[NkiTensor]],
    replica_group: ReplicaGroup,
    op: Any,
    channel_ids: list[int] = [0],  # noqa: B006 - the documented default
    priority: int | None = None,
    name: str | None = None,
) -> None:
    """Ring: each rank's dst = op(src0, src1) of its predecessor (fp32, rounded to dst)."""
    fn = "collective_permute_implicit_reduce"
    o = _reduce_op(fn, op)
    _ring(
        fn,
        [srcs0_by_channel, srcs1_by_channel],
        dsts_by_channel,
        replica_group,
        o,
        channel_ids,
        priority,
    )


def _ring(
    fn: str,
    src_lists: list[Any],
    dsts_by_channel: Any,
    replica_group: Any,
    o: Any,
    channel_ids: Any,
    priority: Any,
) -> None:
    srcs = [_channels(fn, s, "srcs_by_channel") for s in src_lists]
    dsts = _channels(fn, dsts_by_channel, "dsts_by_channel")
    if any(len(s) != len(dsts) for s in srcs):
        raise fail("ARG", f"ncc.{fn}: one src and one dst list per channel")
    _space(fn, [t for s in srcs for t in s] + dsts, sbuf_ok=True)
    _priority(fn, priority)
    for s in srcs:
        for a, d in zip(s, dsts):
            if a.shape != d.shape or a.dtype != d.dtype:
                raise fail(
                    "FREE",
                    f"ncc.{fn}: src '{a.name}' {a.shape} {a.dtype} and dst "
                    f"'{d.name}' {d.shape} {d.dtype} differ",
                )
    group, _ = _ring_setup(fn, replica_group, channel_ids, len(dsts))
    _record(fn, [t for s in srcs for t in s], dsts, _nbytes(dsts), ranks=group)
    payload = {
        "srcs": srcs,
        "dsts": dsts,
        "channels": len(dsts),
        "op": None if o is None else o.name,
    }

    def deliver(got: dict[int, Any]) -> None:
        if not _agreed(fn, got, "channels", "op"):
            return
        sent = {}
        for r in group:
            for c in range(len(dsts)):
                parts = [got[r]["srcs"][i][c] for i in range(len(src_lists))]
                if o is None:
                    sent[r, c] = read(parts[0]).copy()
                else:
                    a, b = (dt.to_f32(read(p)) for p in parts)
                    sent[r, c] = np.asarray(o.fn(a, b), dtype=np.float32)
        for k, r in enumerate(group):
            pred = group[k - 1]
            for c in range(len(dsts)):
                write(got[r]["dsts"][c], sent[pred, c])

    _exchange(fn, group, payload, deliver)


def collective_permute_implicit_current_processing_rank_id(
    iteration_id: int, replica_group: ReplicaGroup, channel_id: int = 0, name: str | None = None
) -> VirtualRegister:
    """A register: the rank whose data this rank holds after `iteration_id` ring steps
    (its own rank at 0, then its predecessors around the ring)."""
    fn = "collective_permute_implicit_current_processing_rank_id"
    group = _my_group(fn, _groups(fn, replica_group))
    if isinstance(channel_id, bool) or not isinstance(channel_id, int) or not 0 <= channel_id < 4:
        raise fail("ARG", f"ncc.{fn}: channel_id must be 0..3; got {channel_id!r}")
    if isinstance(iteration_id, VirtualRegister):
        it = iteration_id.value
    elif isinstance(iteration_id, int) and not isinstance(iteration_id, bool):
        it = iteration_id
    else:
        raise fail(
            "ARG", f"ncc.{fn}: iteration_id must be an int or a register; got {iteration_id!r}"
        )
    emit("sync", "current_processing_rank_id", (), (), 1, 1)
    if it is None:  # a register loaded from memory in trace-only mode
        return VirtualRegister(None)
    pos = group.index(current().rank)
    return VirtualRegister(group[(pos - it) % len(group)])


__all__ = [
    "all_gather_v",
    "all_to_all_v",
    "collective_permute",
    "collective_permute_implicit",
    "collective_permute_implicit_current_processing_rank_id",
    "collective_permute_implicit_reduce",
]
