"""The timeline export is valid Chrome trace-event JSON (checked against a schema)."""

from __future__ import annotations

import json

from nki_kernels.interp import TensorSpec
from nki_kernels.perfmodel import COST_MODEL_VERSION, schedule_kernel
from nki_kernels.perfmodel.calibration import matmul_fully_blocked
from nki_kernels.perfmodel.chrome_trace import chrome_trace, row_names, write_chrome_trace

# The subset of the trace-event format this exporter uses ("JSON Object Format").
NUMBER = (int, float)
SCHEMA = {
    "document": {"traceEvents": list, "displayTimeUnit": str, "otherData": dict},
    "X": {"name": str, "cat": str, "ph": str, "pid": int, "tid": int, "ts": NUMBER,
          "dur": NUMBER, "args": dict},
    "M": {"name": str, "ph": str, "pid": int, "tid": int, "args": dict},
}  # fmt: skip
METADATA_NAMES = {"process_name", "thread_name", "thread_sort_index"}


def _check(obj: dict, schema: dict, where: str) -> None:
    for key, typ in schema.items():
        assert key in obj, f"{where}: missing {key!r}"
        assert isinstance(obj[key], typ), f"{where}: {key!r} is {type(obj[key]).__name__}"
        assert not isinstance(obj[key], bool), f"{where}: {key!r} is a bool"
    extra = set(obj) - set(schema)
    assert not extra, f"{where}: unexpected keys {extra}"


def validate(doc: dict) -> None:
    _check(doc, SCHEMA["document"], "document")
    assert doc["displayTimeUnit"] in ("ms", "ns")
    for i, ev in enumerate(doc["traceEvents"]):
        assert ev.get("ph") in ("X", "M"), f"event {i}: phase {ev.get('ph')!r}"
        _check(ev, SCHEMA[ev["ph"]], f"event {i}")
        if ev["ph"] == "M":
            assert ev["name"] in METADATA_NAMES
        else:
            assert ev["ts"] >= 0 and ev["dur"] >= 0


def _schedule():
    specs = (TensorSpec((256, 256), "bfloat16"), TensorSpec((256, 1024), "bfloat16"))
    return schedule_kernel(
        matmul_fully_blocked, *specs, target="trn2", tiles_m=2, tiles_n=2, tiles_k=2
    )


def test_export_is_schema_valid_json(tmp_path):
    trace, sched, est = _schedule()
    path = write_chrome_trace(tmp_path / "t.json", trace, sched, name="mm")
    doc = json.loads(path.read_text())
    validate(doc)
    assert doc["otherData"]["label"] == f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
    assert doc["otherData"]["latency_ns"] == est.latency_ns


def test_one_row_per_engine_and_dma_queue():
    trace, sched, _ = _schedule()
    doc = chrome_trace(trace, sched)
    rows = {
        ev["tid"]: ev["args"]["name"] for ev in doc["traceEvents"] if ev["name"] == "thread_name"
    }
    assert [rows[t] for t in sorted(rows)] == row_names(16)
    assert rows[0] == "tensor" and rows[4] == "dma.q00" and rows[19] == "dma.q15"


def test_every_instruction_appears_where_it_ran():
    trace, sched, _ = _schedule()
    events = [ev for ev in chrome_trace(trace, sched)["traceEvents"] if ev["ph"] == "X"]
    compute = [i for i in trace.instrs if i.engine != "dma"]
    dma = [ev for ev in events if ev["cat"] == "dma"]
    assert len(events) - len(dma) == len(compute)
    # each [128, ...] DMA runs on all 16 engines: one event per engine share
    assert len(dma) == 16 * sum(1 for i in trace.instrs if i.engine == "dma")
    end_us = max(ev["ts"] + ev["dur"] for ev in events)
    assert abs(end_us * 1e3 - sched.latency_ns) < 1e-6 * sched.latency_ns
    for ev in events:
        idx = ev["args"]["index"]
        assert ev["name"] == trace.instrs[idx].opcode


def test_lnc2_has_one_process_per_core_and_each_core_its_own_work():
    from cost_fixtures import split_rows_copy

    x = TensorSpec((512, 256), "bfloat16")
    trace, sched, est = schedule_kernel(split_rows_copy, x, target="trn2", lnc=2)
    doc = chrome_trace(trace, sched, name="copy")
    validate(doc)
    names = {
        ev["pid"]: ev["args"]["name"] for ev in doc["traceEvents"] if ev["name"] == "process_name"
    }
    assert sorted(names) == [0, 1] and names[1].startswith("copy core 1 - modeled")
    per_core = {pid: 0 for pid in (0, 1)}
    for ev in doc["traceEvents"]:
        if ev["ph"] == "X":
            per_core[ev["pid"]] += 1
    # each core: 2 row tiles x (load + store), each DMA split over 16 engine queues
    assert per_core == {0: 2 * 2 * 16, 1: 2 * 2 * 16}
    assert est.lnc == 2
