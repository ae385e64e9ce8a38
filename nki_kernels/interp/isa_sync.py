"""Instructions between the programs of an LNC launch: `core_barrier` and `sendrecv`.

Both are NC-v3+ and meet the other program(s) of the launch (`programs.Programs`): a
program that reaches one waits until its partner does. Under LNC 1 a barrier over
any `cores` (nki-library calls `(0, 1)` unconditionally) and a sendrecv to and from
rank 0 have no partner and complete at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .engine import emit, instruction, need_version, read, tensor_arg, write
from .enums import dma_engine as dma_engine_enum
from .enums import engine as engine_enum
from .errors import fail
from .state import current
from .tensor import NkiTensor, psum, sbuf
from .trace import Instr


def _cores(cores: Any, instr: str) -> tuple[int, ...]:
    if not isinstance(cores, (tuple, list)) or not cores:
        raise fail("ARG", f"{instr}: cores must be a tuple of core indices; got {cores!r}")
    got = tuple(cores)
    if any(type(c) is not int for c in got) or sorted(got) != list(range(len(got))):
        raise fail("ARG", f"{instr}: cores must be (0,) or (0, 1); got {cores!r}")
    return got


@instruction
def core_barrier(
    data: NkiTensor, cores: Any, engine: engine_enum = engine_enum.gpsimd, name: str | None = None
) -> Instr:
    """Wait until every core in `cores` reached this barrier (`data`: the tensor the cores
    synchronize on)."""
    instr = "core_barrier"
    launch = current()
    need_version(3, f"nisa.{instr}")
    # The docs name shared HBM data, but nki-library's moe_cte shard_on_I (its fast
    # tests) also barriers on an SBUF block counter, so SBUF is accepted too; PSUM is
    # neither documented nor used.
    tensor_arg(data, "data", instr)
    if data.buffer is psum:
        raise fail(
            "BUF",
            f"{instr}: data must be in HBM (or SBUF); got {data.buffer!r} ('{data.name}')",
        )
    if not isinstance(engine, engine_enum):
        raise fail("ARG", f"{instr}: engine must be an nisa.engine member; got {engine!r}")
    members = _cores(cores, instr)
    progs = launch.concurrent
    # Under LNC 1 there is no partner: nki-library's router_topk calls
    # core_barrier(..., (0, 1)) unconditionally, so the barrier completes at once.
    if progs is not None and len(members) > 1:
        m = progs.meet(instr, members, members, None)
        progs.release(m)
        progs.yield_to_waiters()
    # Recorded once the meeting is complete, so in the trace every member's barrier
    # follows what all members issued before theirs: the cost model then makes it wait
    # for the other cores' writes to `data`, and never makes those writes wait for it
    # (recorded on arrival, an early core's barrier would be a reader of `data` that the
    # later core's pre-barrier writes must not overtake).
    return emit(
        "gpsimd" if engine is engine_enum.unknown else engine.name,
        instr,
        (),
        (data,),
        1,
        0,
        attrs={"cores": members},
        name=name,
    )


@instruction
def sendrecv(
    src: NkiTensor,
    dst: NkiTensor,
    send_to_rank: int,
    recv_from_rank: int,
    pipe_id: int,
    dma_engine: dma_engine_enum = dma_engine_enum.dma,
    name: str | None = None,
) -> Instr:
    """Send `src` to `dst` of program `send_to_rank`; receive into `dst` from `recv_from_rank`."""
    instr = "sendrecv"
    launch = current()
    need_version(3, f"nisa.{instr}")
    for arg, t in (("src", src), ("dst", dst)):
        tensor_arg(t, arg, instr)
        if t.buffer is not sbuf:
            raise fail("BUF", f"{instr}: {arg} must be in SBUF; got {t.buffer!r} ('{t.name}')")
    if src.dtype != dst.dtype:
        raise fail("DTYPE", f"{instr}: src and dst need one dtype; got {src.dtype}, {dst.dtype}")
    if src.shape != dst.shape:
        raise fail("FREE", f"{instr}: src and dst need one shape; got {src.shape}, {dst.shape}")
    if not isinstance(dma_engine, dma_engine_enum):
        raise fail("ARG", f"{instr}: dma_engine must be an nisa.dma_engine; got {dma_engine!r}")
    if dma_engine is dma_engine_enum.gpsimd_dma:
        per_part = src.free_size * src.dtype._size
        limit = {4: 1024, 2: 512, 1: 256}.get(src.dtype._size, 1024)
        if per_part > limit:
            raise fail(
                "ARG",
                f"{instr}: gpsimd_dma moves at most {limit} B per partition of "
                f"{src.dtype}; got {per_part}",
            )
    for arg, r in (("send_to_rank", send_to_rank), ("recv_from_rank", recv_from_rank)):
        if type(r) is not int or not 0 <= r < launch.lnc:
            raise fail(
                "SYNC",
                f"{instr}: {arg} must be a program of this launch (0..{launch.lnc - 1}); got {r!r}",
            )
    pid = launch.program_id
    rec = emit(
        "dma",
        instr,
        (dst,),
        (src,),
        src.shape[0],
        src.free_size,
        nbytes=src.size * src.dtype._size,
        attrs={"send_to": send_to_rank, "recv_from": recv_from_rank, "pipe_id": pipe_id},
        name=name,
    )
    trace_only = launch.trace_only
    if send_to_rank == pid and recv_from_rank == pid:
        if not trace_only:
            write(dst, read(src))
        return rec
    progs = launch.concurrent
    assert progs is not None  # lnc > 1 whenever a partner rank exists
    members = tuple(range(launch.lnc))
    payload = (src, dst, send_to_rank, recv_from_rank, None if trace_only else read(src).copy())
    m = progs.meet(instr, pipe_id, members, payload)
    if len(m.arrived) == len(members) and m.arrived[pid] is payload and not _delivered(m):
        _deliver(m, trace_only)
    progs.release(m)
    progs.yield_to_waiters()
    return rec


def _delivered(m: Any) -> bool:
    return getattr(m, "delivered", False)  # type: ignore[no-any-return]


def _deliver(m: Any, trace_only: bool) -> None:
    """Write each sender's data into its receiver's dst (by the program completing `m`)."""
    m.delivered = True
    launch = current()
    here = launch.program_id
    for p, (_, _, to, _, data) in sorted(m.arrived.items()):
        recv_from = m.arrived[to][3]
        if recv_from != p:
            raise fail(
                "SYNC",
                f"sendrecv pipe {m.key}: program {p} sends to {to}, but program {to} receives "
                f"from {recv_from}",
            )
        if not trace_only:
            dst = m.arrived[to][1]
            launch.program_id = to  # the receiver's memory
            try:
                write(dst, np.asarray(data))
            finally:
                launch.program_id = here
