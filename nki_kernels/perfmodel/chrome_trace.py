"""Export a modeled schedule as Chrome trace-event JSON (Perfetto, chrome://tracing).

One process per LNC core; one thread (row) per compute engine and per DMA engine
queue. Instructions are complete ("X") events with their opcode, shapes and bytes in
`args`; times are microseconds as the format requires. The file says it is modeled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..interp.trace import Trace
from .estimate import COST_MODEL_VERSION, modeled_label
from .timeline import COMPUTE_ENGINES, Schedule

_DMA_ROW0 = len(COMPUTE_ENGINES)


def row_names(dma_engines: int) -> list[str]:
    """Thread names in display order: the compute engines, then dma.q00 ... dma.q15."""
    return [*COMPUTE_ENGINES, *(f"dma.q{q:02d}" for q in range(dma_engines))]


def chrome_trace(trace: Trace, sched: Schedule, name: str = "kernel") -> dict[str, Any]:
    """The trace-event document for `sched` (made with `schedule(..., record=True)`)."""
    tgt = sched.target
    label = modeled_label(tgt.name)
    events: list[dict[str, Any]] = []
    names = row_names(tgt.dma_engines)
    cores = max(1, sched.lnc)
    for pid in range(cores):
        events.append(
            {
                "name": "process_name",
                "ph": "M",
                "pid": pid,
                "tid": 0,
                "args": {"name": f"{name} core {pid} - {label}"},
            }
        )
        for tid, row in enumerate(names):
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": row}}
            )
            events.append(
                {
                    "name": "thread_sort_index",
                    "ph": "M",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
    row_of = {eng: i for i, eng in enumerate(COMPUTE_ENGINES)}
    for idx, ins in enumerate(trace.instrs):
        if ins.engine == "dma" or ins.engine not in row_of:
            continue
        events.append(
            _event(ins, idx, ins.program, row_of[ins.engine], sched.start[idx], sched.end[idx])
        )
    for seg in sched.dma_segments:
        ins = trace.instrs[seg.index]
        events.append(
            _event(ins, seg.index, seg.program, _DMA_ROW0 + seg.queue, seg.start, seg.end)
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "label": label,
            "cost_model_version": COST_MODEL_VERSION,
            "target": tgt.name,
            "kernel": name,
            "latency_ns": sched.latency_ns,
        },
    }


def _event(ins: Any, idx: int, pid: int, tid: int, start: float, end: float) -> dict[str, Any]:
    args: dict[str, Any] = {"index": idx, "p": ins.p, "n": ins.n, "dtype": ins.dtype}
    if ins.flops:
        args["flops"] = ins.flops
    if ins.nbytes:
        args["bytes"] = ins.nbytes
    if ins.name:
        args["name"] = ins.name
    return {
        "name": ins.opcode,
        "cat": ins.engine,
        "ph": "X",
        "pid": pid,
        "tid": tid,
        "ts": start / 1e3,
        "dur": max(end - start, 0.0) / 1e3,
        "args": args,
    }


def write_chrome_trace(
    path: str | Path, trace: Trace, sched: Schedule, name: str = "kernel"
) -> Path:
    """Write the JSON document to `path` and return the path."""
    out = Path(path)
    out.write_text(json.dumps(chrome_trace(trace, sched, name)))
    return out
