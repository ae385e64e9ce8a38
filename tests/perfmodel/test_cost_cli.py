"""The `estimate` command: listing, summaries, JSON, timelines and input errors."""

from __future__ import annotations

import json

import pytest

from nki_kernels.cli import main as cli_main
from nki_kernels.perfmodel import registry
from nki_kernels.perfmodel.summary import summary


def main(argv: list[str]) -> int:
    return cli_main(["estimate", *argv])


SMALL = ["--shape", "2048,1024,1024"]  # M, K, N: one block of the fully blocked kernel


def test_list_names_the_calibration_kernels(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for name in ("matmul_tiled", "matmul_hoisted", "matmul_block_free", "matmul_fully_blocked"):
        assert name in out


def test_summary_uses_profiler_metric_names(capsys):
    assert main(["matmul_fully_blocked", *SMALL, "--target", "trn1"]) == 0
    out = capsys.readouterr().out
    assert "modeled (cost model v3, trn1)" in out
    for metric in (
        "mfu_estimated_percent",
        "hfu_estimated_percent",
        "mbu_estimated_percent",
        "tensor_engine_active_time_percent",
        "dma_active_time_percent",
        "hbm_read_bytes",
        "mm_arithmetic_intensity",
    ):
        assert metric in out


def test_json_and_timeline(tmp_path, capsys):
    out_file = tmp_path / "timeline.json"
    code = main(
        ["matmul_tiled", "--shape", "M=128,K=256,N=512", "--json", "--timeline", str(out_file)]
    )
    assert code == 0
    est = json.loads(capsys.readouterr().out)
    assert est["kernel"] == "matmul_tiled" and est["shape"] == {"M": 128, "K": 256, "N": 512}
    assert est["label"] == "modeled (cost model v3, trn2)"
    assert est["flops"] == 2 * 128 * 256 * 512
    assert est["latency_ns"] >= est["roofline_ns"]
    assert json.loads(out_file.read_text())["traceEvents"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_such_kernel"], "expected one of"),
        (["matmul_tiled", "--shape", "128,256"], "expected 3 sizes"),
        (["matmul_tiled", "--shape", "M=128,Q=1"], "unknown dimension"),
        (["matmul_tiled", "--target", "trn9"], "target"),
        (["matmul_fully_blocked", "--shape", "1024,2048,2048"], "multiple of 2048"),
        (["matmul_tiled", "--shape", "0,128,512"], "shape: expected a tuple of positive ints"),
        (["matmul_tiled", "--dtype", "float64"], "dtype: expected an NKI dtype"),
        (["matmul_tiled", "--lnc", "3"], "lnc: expected 1 or 2; got 3"),
    ],
)
def test_bad_input_is_a_clear_error(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_registry_round_trip():
    entry = registry.get("matmul_hoisted")
    assert registry.parse_shape("4x8x16", entry.dims) == {"M": 4, "K": 8, "N": 16}
    (lhsT, rhs), kw = entry.args({"M": 128, "K": 256, "N": 512})
    assert lhsT.shape == (256, 128) and rhs.shape == (256, 512) and kw == {}


def test_summary_is_labeled():
    from nki_kernels.perfmodel import estimate_trace
    from nki_kernels.perfmodel.synthetic import synthetic_trace

    text = summary(estimate_trace(synthetic_trace(50)), "synthetic")
    assert text.startswith("synthetic: modeled (cost model v3, trn2)")


def test_other_targets_are_labeled_with_their_name(capsys):
    assert main(["matmul_tiled", "--shape", "128,128,512", "--target", "trn3"]) == 0
    assert "modeled (cost model v3, trn3)" in capsys.readouterr().out


def test_no_kernel_lists_them_and_fails(capsys):
    assert main([]) == 2
    assert "matmul_tiled" in capsys.readouterr().out


def test_estimate_prints_the_band(capsys):
    assert main(["matmul_tiled", "--shape", "256,512,512", "--target", "trn2"]) == 0
    assert "band (parameter sets the anchors allow): latency" in capsys.readouterr().out
    assert main(["matmul_tiled", "--shape", "256,512,512", "--target", "trn2", "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    lo, hi = est["latency_band_ns"]
    assert lo <= est["latency_ns"] <= hi
    assert est["mfu_band"][0] <= est["mfu"] <= est["mfu_band"][1]
