"""The measured-row format: round trip, atomic append, named errors on malformed files."""

from __future__ import annotations

import json

import pytest

from nki_kernels.perfmodel.measurements import (
    MeasuredRow,
    MeasurementError,
    MeasurementFileError,
    append_row,
    latency_stats,
    load_rows,
)


def _row(**changes: object) -> dict:
    base = {
        "kind": "measured",
        "device": "trn2.48xlarge",
        "sdk_version": "2.33.0",
        "torch_neuronx_version": None,
        "lnc": 1,
        "target": "trn2",
        "estimable": "matmul_fully_blocked",
        "kernel": "matmul_fully_blocked",
        "kernel_hash": "abc123",
        "shape": {"M": 2048, "K": 2048, "N": 2048},
        "dtype": "bfloat16",
        "config": {},
        "latency_ns": {"median": 250_000.0, "min": 249_000.0, "max": 260_000.0, "repeats": 20},
        "modeled_ns": 243_000.0,
        "timestamp": "2026-12-01T20:15:00+00:00",
    }
    base.update(changes)
    return base


def test_append_then_load_round_trips(tmp_path):
    path = tmp_path / "m.jsonl"
    first = MeasuredRow.from_dict(_row())
    second = MeasuredRow.from_dict(_row(lnc=2, latency_ns=latency_stats([3.0, 1.0, 2.0])))
    append_row(path, first)
    append_row(path, second)
    rows = load_rows(path)
    assert rows == [first, second]
    assert rows[1].latency_ns == {"median": 2.0, "min": 1.0, "max": 3.0, "repeats": 3}
    assert len(path.read_text().splitlines()) == 2
    assert not [p for p in tmp_path.iterdir() if p.name != "m.jsonl"]  # no temp file left


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"kind": "modeled"}, "kind"),
        ({"lnc": 4}, "lnc"),
        ({"target": "trn9"}, "target"),
        ({"shape": {"M": -1}}, "shape.M"),
        ({"latency_ns": {"median": 1.0, "min": 1.0, "max": 1.0}}, "latency_ns.repeats"),
        ({"latency_ns": {"median": 1.0, "min": 2.0, "max": 3.0, "repeats": 1}}, "latency_ns"),
        ({"modeled_ns": "fast"}, "modeled_ns"),
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"timestamp": "2026-12-01T20:15:00"}, "timestamp"),
        ({"extra": 1}, "extra"),
    ],
)
def test_malformed_line_is_refused_naming_file_line_and_field(tmp_path, changes, field):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(_row()) + "\n\n" + json.dumps(_row(**changes)) + "\n")
    with pytest.raises(MeasurementFileError) as info:
        load_rows(path)
    assert info.value.line == 3 and info.value.field == field
    assert str(info.value).startswith(f"{path}:3: field {field!r}")


def test_missing_field_and_bad_json_are_named(tmp_path):
    row = _row()
    del row["dtype"]
    path = tmp_path / "m.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(MeasurementFileError, match=r"m.jsonl:1: field 'dtype': missing"):
        load_rows(path)
    path.write_text("{not json\n")
    with pytest.raises(MeasurementFileError, match=r"m.jsonl:1: field '\(json\)'"):
        load_rows(path)
    path.write_text("\n")
    with pytest.raises(MeasurementFileError, match="at least one measured row"):
        load_rows(path)


def test_row_constructor_validates():
    with pytest.raises(MeasurementError, match="lnc: expected 1 or 2; got 3"):
        MeasuredRow.from_dict(_row(lnc=3))
    with pytest.raises(TypeError, match="row: expected a MeasuredRow"):
        append_row("x.jsonl", _row())  # type: ignore[arg-type]
