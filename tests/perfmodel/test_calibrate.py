"""`calibrate`: recovery of a synthetic perturbation, and refusal of malformed files."""

from __future__ import annotations

import json

import pytest

from nki_kernels.cli import main as cli_main
from nki_kernels.perfmodel.calibrate import calibrate, trace_row
from nki_kernels.perfmodel.estimate import modeled_label
from nki_kernels.perfmodel.measurements import MeasuredRow, append_row, latency_stats
from nki_kernels.perfmodel.timeline import schedule
from nki_kernels.targets import SHIPPED_TARGETS, clear_overrides, get_target, use_override

# Small launches whose DMA costs differ in kind: 256 B / 1 KiB rows (descriptor floor),
# 2-4 KiB rows (engine rate), and one tile (mostly the DMA start latency, also fitted on
# trn2: with rotating buffers the larger launches overlap most of it), so the fitted
# trn2 parameters are identifiable.
LAUNCHES = [
    ("matmul_tiled", {"M": 128, "K": 128, "N": 512}),
    ("matmul_tiled", {"M": 256, "K": 512, "N": 512}),
    ("matmul_hoisted", {"M": 256, "K": 512, "N": 1024}),
    ("matmul_fully_blocked", {"M": 2048, "K": 1024, "N": 1024}),
]
PERTURBED = {"dma_engine_bytes_per_ns": 18.5, "dma_descriptor_min_ns": 40.0}


def _rows(target, launches=LAUNCHES) -> list[MeasuredRow]:
    rows = []
    for name, shape in launches:
        row = MeasuredRow(
            device="synthetic",
            sdk_version="none",
            torch_neuronx_version=None,
            lnc=1,
            target="trn2",
            estimable=name,
            kernel=name,
            kernel_hash="0",
            shape=shape,
            dtype="bfloat16",
            config={},
            latency_ns={"median": 1.0, "min": 1.0, "max": 1.0, "repeats": 1},
            modeled_ns=None,
            timestamp="2026-12-01T00:00:00+00:00",
        )
        ns = schedule(trace_row(row, target), target).latency_ns
        rows.append(MeasuredRow(**{**row.__dict__, "latency_ns": latency_stats([ns])}))
    return rows


def test_fit_recovers_a_synthetic_perturbation():
    truth = SHIPPED_TARGETS["trn2"].replace(**PERTURBED)
    result = calibrate(_rows(truth), "trn2", with_loo=False)
    for name, value in PERTURBED.items():
        assert result.parameters[name] == pytest.approx(value, rel=0.03), name
    assert all(abs(r.after_ns / r.measured_ns - 1) < 0.01 for r in result.rows)
    assert max(abs(r.before_ns / r.measured_ns - 1) for r in result.rows) > 0.05  # was off


def test_cli_writes_an_override_the_cost_model_loads(tmp_path, capsys):
    truth = SHIPPED_TARGETS["trn2"].replace(**PERTURBED)
    meas = tmp_path / "rows.jsonl"
    for row in _rows(truth, LAUNCHES[:2]):
        append_row(meas, row)
    out = tmp_path / "trn2.json"
    assert cli_main(["calibrate", "--measurements", str(meas), "--out", str(out)]) == 0
    assert "override written" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["kind"] == "target_override" and len(data["loo_sets"]) == 2
    try:
        tgt = use_override(out)
        assert get_target("trn2") is tgt
        assert tgt.dma_descriptor_min_ns == data["parameters"]["dma_descriptor_min_ns"]
        assert "calibrated to rows.jsonl" in modeled_label("trn2")
    finally:
        clear_overrides()
    assert modeled_label("trn2") == "modeled (cost model v3, trn2)"


def test_cli_refuses_a_malformed_file_naming_line_and_field(tmp_path, capsys):
    meas = tmp_path / "rows.jsonl"
    good = _rows(SHIPPED_TARGETS["trn2"], LAUNCHES[:1])[0].to_dict()
    bad = {**good, "latency_ns": {"median": -3.0, "min": 1.0, "max": 2.0, "repeats": 2}}
    meas.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    assert cli_main(["calibrate", "--measurements", str(meas)]) == 2
    err = capsys.readouterr().err
    assert f"{meas}:2: field 'latency_ns.median'" in err


def test_rows_of_another_target_cannot_calibrate(tmp_path, capsys):
    meas = tmp_path / "rows.jsonl"
    append_row(meas, _rows(SHIPPED_TARGETS["trn2"], LAUNCHES[:1])[0])
    assert cli_main(["calibrate", "--measurements", str(meas), "--target", "trn1"]) == 2
    assert "no usable row measured on trn1" in capsys.readouterr().err


def test_a_bad_override_file_is_refused(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"kind": "target_override", "target": "trn9"}))
    with pytest.raises(ValueError, match="target: expected one of"):
        use_override(p)
