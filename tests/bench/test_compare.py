"""The comparison behind `make bench`: rows, the table, the CLI and the native models."""

from __future__ import annotations

import json

import pytest

from nki_kernels import cli
from nki_kernels.baselines import native
from nki_kernels.bench.rows import BenchRow, append_rows, read_rows
from nki_kernels.bench.table import comparison_table

LABEL = "modeled (cost model v1, trn2)"


def _row(impl: str, latency: float, **kw) -> BenchRow:
    return BenchRow("norm", "rms_norm fwd", "[256, 512] bf16", "trn2", impl, latency, LABEL, **kw)


def test_table_pairs_nki_with_native_and_computes_the_speedup():
    table = comparison_table([_row("nki", 10.0, hbm_fraction=0.9), _row("native", 25.0)])
    line = table.splitlines()[2]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:6] == ["rms_norm fwd", "[256, 512] bf16", "trn2", "10.0", "25.0", "2.50x"]
    assert cells[7] == "90.0%" and cells[-1] == LABEL


def test_rows_append_and_read_back(tmp_path):
    path = tmp_path / "rows.jsonl"
    append_rows(path, [_row("nki", 1.0)])
    append_rows(path, [_row("native", 2.0)])
    rows = read_rows(path)
    assert [(r.impl, r.latency_us) for r in rows] == [("nki", 1.0), ("native", 2.0)]
    assert all(json.loads(line)["provenance"] == LABEL for line in path.read_text().splitlines())


def test_native_steps_run_at_small_shapes_and_price_positive():
    # every composition traces (trace-only) and each step costs something
    cases = [
        native.rms_norm_fwd(300, 1000, "bfloat16"),
        native.rms_norm_bwd(300, 1000, "bfloat16"),
        native.layer_norm_fwd(300, 1000, "bfloat16"),
        native.layer_norm_bwd(300, 1000, "bfloat16"),
        native.add_rms_norm_fwd(300, 1000, "bfloat16"),
        native.attention_fwd(1, 2, 256, 384, 64, "bfloat16"),
        native.attention_bwd(1, 2, 256, 384, 64, "bfloat16"),
        native.moe_fwd(256, 512, 384, 4, 2, "bfloat16"),
    ]
    for steps in cases:
        est = native.price(steps, "trn2")
        assert est.label == LABEL
        assert all(ns > 0 for _, ns in est.steps)
        assert est.latency_ns == pytest.approx(sum(ns for _, ns in est.steps))


def test_moe_native_capacity_follows_the_gshard_rule():
    # ceil(1.25 * 4096 tokens * 2 choices / 8 experts) = 1280
    assert native.moe_capacity(4096, 8, 2, 1.25) == 1280
    assert native.moe_capacity(1, 64, 6, 1.25) == 1


def test_bench_command_prints_a_labeled_table(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    assert cli.main(["bench", "--suite", "norm", "--rows", str(rows)]) == 0
    out = capsys.readouterr().out
    assert "no figure below is a hardware measurement" in out
    assert "| rms_norm fwd | [16384, 4096] bf16 | trn2 |" in out
    got = read_rows(rows)
    assert {r.impl for r in got} == {"nki", "native"}
    assert all(r.provenance.startswith("modeled (cost model") for r in got)
