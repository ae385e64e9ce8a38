"""The comparison behind `make bench`: rows, the three-way table, peer rows, the CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nki_kernels import cli
from nki_kernels.bench import compare, peer
from nki_kernels.bench.bands import widen_ratio
from nki_kernels.bench.rows import BenchRow, append_rows, read_rows, write_rows
from nki_kernels.bench.table import comparison_table, dropping_table, group
from nki_kernels.perfmodel import COST_MODEL_VERSION

LABEL = f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
NKILIB = Path("/work/ext/aws-neuron+nki-library")


def _row(impl: str, latency: float, op: str = "rms_norm fwd", lnc: int = 1, **kw) -> BenchRow:
    return BenchRow("norm", op, "[256, 512] bf16", "trn2", impl, latency, LABEL, lnc=lnc, **kw)


def _cells(table: str, line: int = 2) -> list[str]:
    return [c.strip() for c in table.splitlines()[line].strip("|").split("|")]


def test_table_pairs_ours_with_aws_and_native_and_computes_both_speedups():
    table = comparison_table(
        [
            _row("nki", 10.0, hbm_fraction=0.9),
            _row("aws", 15.0),
            _row("native", 25.0, extra={"path": "one fused pass"}),
        ]
    )
    c = _cells(table)
    assert c[:8] == [
        "rms_norm fwd",
        "[256, 512] bf16",
        "trn2",
        "1",
        "10.0",
        "15.0",
        "25.0",
        "one fused pass",
    ]
    # 90 % of HBM bandwidth is above the best published DMA utilization (~70 %): ceiling
    assert c[8:11] == ["1.50x", "2.50x", "90.0% HBM ceiling"]
    assert c[-1] == LABEL


def test_the_marked_baseline_is_the_native_figure_and_lnc_rows_stay_apart():
    rows = [
        _row("nki", 10.0),
        _row("native", 30.0, extra={"path": "a", "baseline": False}),
        _row("native", 20.0, extra={"path": "b", "baseline": True}),
        _row("nki", 5.0, lnc=2),
    ]
    g = group(rows)
    assert g[("norm", "rms_norm fwd", "[256, 512] bf16", "trn2", 1)]["native"].extra["path"] == "b"
    assert "native" not in g[("norm", "rms_norm fwd", "[256, 512] bf16", "trn2", 2)]


def test_a_failed_peer_shows_as_failing_without_a_speedup():
    table = comparison_table([_row("nki", 10.0), _row("aws", math.nan)])
    c = _cells(table)
    assert c[5] == "fails (notes)" and c[8] == ""


def test_speedup_band_from_per_parameter_set_samples():
    ours = _row("nki", 10.0, extra={"samples_us": [8.0, 10.0, 12.0]})
    aws = _row("aws", 15.0, extra={"samples_us": [14.0, 15.0, 16.0]})
    # ratios per parameter set: 14/8 = 1.75, 15/10 = 1.5, 16/12 = 1.33, widened by the
    # structural error of two modeled figures (cost model v3)
    lo, hi = widen_ratio(16 / 12, 14 / 8, "trn2")
    assert lo < 16 / 12 and hi > 14 / 8
    assert _cells(comparison_table([ours, aws]))[8] == f"1.50x ({lo:.2f}–{hi:.2f})"


def test_mfu_above_the_best_published_measurement_is_labelled_ceiling():
    # matmul-like work: the best published Trainium MFU is 90.92 %; attention: 46 %
    assert _cells(comparison_table([_row("nki", 10.0, mfu=0.95)]))[10] == "95.0% ceiling"
    assert _cells(comparison_table([_row("nki", 10.0, mfu=0.85)]))[10] == "85.0%"
    fwd = _row("nki", 10.0, op="flash_attention fwd", mfu=0.5)
    assert _cells(comparison_table([fwd]))[10] == "50.0% ceiling"
    bwd = _row("nki", 10.0, op="flash_attention bwd", mfu=0.5)
    assert _cells(comparison_table([bwd]))[10] == "50.0% ceiling"
    fwd = _row("nki", 10.0, op="flash_attention fwd causal", mfu=0.4)
    assert _cells(comparison_table([fwd]))[10] == "40.0%"


def test_dropping_table_lists_only_capacity_factor_rows():
    rows = [_row("nki", 10.0), _row("native_cf", 12.0, extra={"path": "drops 5 of 10"})]
    assert "drops 5 of 10" in dropping_table(rows)
    assert dropping_table([_row("nki", 10.0)]) == ""


def test_rows_append_write_and_read_back(tmp_path):
    path = tmp_path / "rows.jsonl"
    append_rows(path, [_row("nki", 1.0)])
    append_rows(path, [_row("native", 2.0, lnc=2, band_us=(1.5, 2.5))])
    rows = read_rows(path)
    assert [(r.impl, r.latency_us, r.lnc) for r in rows] == [("nki", 1.0, 1), ("native", 2.0, 2)]
    assert rows[1].band_us == (1.5, 2.5)
    write_rows(path, rows[:1])
    assert len(read_rows(path)) == 1


def test_rows_written_before_the_lnc_field_read_as_lnc_1(tmp_path):
    d = json.loads(_row("nki", 1.0).to_json())
    del d["lnc"], d["band_us"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(d) + "\n")
    assert read_rows(path)[0].lnc == 1
    path.write_text('{"not": "a row"}\n')
    with pytest.raises(ValueError, match=r"old\.jsonl:1: not a benchmark row"):
        read_rows(path)


def test_merge_peer_makes_the_aws_flash_kernel_the_native_attention_row():
    case = "B=1 H=32/8 S=2048 D=128 bf16"
    ours = BenchRow("attention", "flash_attention fwd", case, "trn2", "nki", 10.0, LABEL)
    aws = BenchRow(
        "attention",
        "flash_attention fwd",
        case,
        "trn2",
        "aws",
        20.0,
        LABEL,
        extra={"kernels": ["attention_cte"]},
    )
    other = BenchRow("attention", "flash_attention fwd", "other", "trn2", "aws", 1.0, LABEL)
    merged = compare.merge_peer([ours], [aws, other])
    nat = [r for r in merged if r.impl == "native"]
    assert len(merged) == 3 and len(nat) == 1
    assert nat[0].latency_us == 20.0 and "attention_cte" in nat[0].extra["path"]


def test_peer_rows_refuse_a_directory_that_is_not_nki_library(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkout: expected an aws-neuron/nki-library"):
        peer.peer_rows(tmp_path)


def test_peer_calls_follow_the_documented_layouts():
    (fwd,), groups = peer.attention_calls("fwd", 2048, True, lnc=1)
    assert groups == 8 and fwd.attr == "attention_cte"
    assert [a.shape for a in fwd.args] == [(4, 2048, 128), (1, 128, 2048), (1, 2048, 128)]
    # LNC 2: one kv head per program, launched as kernel[2], times the other kv groups
    (bwd,), groups2 = peer.attention_calls("bwd", 2048, False, lnc=2)
    assert groups2 == 4 and bwd.lnc == 2
    assert bwd.args[1].shape == (1, 2, 128, 2048) and bwd.args[5].shape == (1, 8, 128, 16)
    (fwd2,), _ = peer.attention_calls("fwd", 2048, False, lnc=2)
    assert [a.shape for a in fwd2.args] == [(8, 2048, 128), (2, 128, 2048), (2, 2048, 128)]
    (norm2,) = peer.rms_norm_calls(16384, 4096, lnc=2)
    assert norm2.lnc == 2 and norm2.args[0].shape == (1, 16384, 4096)
    moe, _router = peer.moe_calls(compare.MIXTRAL_8X7B_MOE, 4096)
    # NxD's N = ceil((4096 * 2 - 7) / 512) + 7 = 23 blocks; at LNC 2 rounded up to 24
    assert moe.args[5].shape == (23,) and moe.args[4].shape == (23 * 512,) and moe.lnc == 1
    moe2, router2 = peer.moe_calls(compare.MIXTRAL_8X7B_MOE, 4096, lnc=2)
    assert moe2.args[6].shape == (24,) and moe2.lnc == 2 and router2.kwargs["shard_on_tokens"]


@pytest.mark.skipif(not NKILIB.is_dir(), reason="needs a local nki-library checkout")
def test_peer_rows_from_a_checkout_carry_its_commit_and_the_cost_model_label():
    rows = peer.peer_rows(
        NKILIB, targets=("trn2",), lncs=(1,), families=("norm",), norm_shapes=((256, 512),)
    )
    assert len(rows) == 1 and rows[0].impl == "aws"
    assert rows[0].extra["nki_library_commit"] == peer.checkout_commit(NKILIB)
    assert rows[0].provenance == LABEL
    assert rows[0].extra.get("error") or rows[0].latency_us > 0


def test_bench_command_prints_the_committed_table_and_checks_it_live(tmp_path, capsys):
    data = tmp_path / "data"
    out_dir = tmp_path / "out"
    argv = ["bench", "--suite", "norm", "--data", str(data), "--rows", "-", "--out", str(out_dir)]
    assert cli.main([*argv, "--reprice", "--tables"]) == 0
    out = capsys.readouterr().out
    assert "nothing here is measured" in out and "norm fwd trn2" in out
    assert "| rms_norm fwd | [16384, 4096] bf16 | trn2 | 2 |" in out
    assert "| rms_norm fwd | [16384, 4096] bf16 | trn2 | 2 |" in (out_dir / "tables.md").read_text()
    got = read_rows(data / "bench_rows.jsonl")
    assert {r.impl for r in got} == {"nki", "native"} and {r.lnc for r in got} == {1, 2}
    assert all(r.provenance.startswith("modeled (cost model") for r in got)
    assert cli.main(argv) == 0
    assert "the committed rows match" in capsys.readouterr().out


def test_headline_states_geometric_means_goal_and_losing_cases():
    from nki_kernels.bench.readme import headline

    def r(impl: str, lat: float, case: str) -> BenchRow:
        return BenchRow("norm", "rms_norm fwd", case, "trn2", impl, lat, LABEL, lnc=2)

    rows = [r("nki", 10.0, "a"), r("aws", 20.0, "a"), r("nki", 10.0, "b"), r("aws", 5.0, "b")]
    rows += [r("native", 40.0, "a"), r("native", 10.0, "b")]
    line = headline(rows, ["trn2"], 2, goals=True)[0]
    assert "goal" not in headline(rows, ["trn2"], 2)[0]  # not in the user-facing headline
    # vs AWS: sqrt(2.0 * 0.5) = 1.00x, one loss; vs native: sqrt(4 * 1) = 2.00x
    assert (
        "vs AWS's kernel: 1.00x geometric mean; 0.50–2.00x over 2 cases, ours slower in 1" in line
    )
    assert (
        "goal 1.1x with band low end >= 1.0x: missed (geometric mean 1.00x is 0.10x short" in line
    )
    assert "vs TorchNeuron's path: 2.00x geometric mean; 1.00–4.00x over 2 cases" in line


def test_markdown_puts_lnc2_in_the_headline_page_and_lnc1_in_the_details():
    from nki_kernels.bench.readme import markdown

    rows = [_row("nki", 10.0, lnc=2), _row("native", 20.0, lnc=2), _row("nki", 19.0, lnc=1)]
    rows.append(_row("aws", math.nan, lnc=2, extra={"error": "TypeError: boom"}))
    head, details = markdown(rows, "v9", ["abc"])
    assert "| rms_norm fwd | [256, 512] bf16 | trn2 | 2 |" in head and "| 1 |" not in head
    assert "| rms_norm fwd | [256, 512] bf16 | trn2 | 1 |" in details
    assert "- norm: TypeError: boom" in head and "nki-library abc" in head


def test_rows_of_different_cost_models_are_not_compared():
    other = BenchRow("norm", "rms_norm fwd", "[256, 512] bf16", "trn2", "aws", 20.0, "modeled (x)")
    assert _cells(comparison_table([_row("nki", 10.0), other]))[8] == "mixed"


def test_lnc2_rows_are_traced_as_kernel_2_launches(monkeypatch):
    # every LNC 2 row of ours comes from traces of kernel[2] launches (both programs), not
    # from halving an LNC 1 figure: record the lnc of each trace the pricing asks for
    from nki_kernels.perfmodel import api

    seen: list[int] = []
    real = api.run

    def run(kernel, *args, lnc=1, **kwargs):
        if "nki_kernels.norm" in getattr(kernel, "fn", kernel).__module__:  # ours, not native
            seen.append(lnc)
        return real(kernel, *args, lnc=lnc, **kwargs)

    monkeypatch.setattr(api, "run", run)
    rows = compare.norm_rows((640,), (512,), ["trn2"], (2,))
    ours = [r for r in rows if r.impl == "nki"]
    assert ours and set(seen) == {2}
    seen.clear()
    one = compare.norm_rows((640,), (512,), ["trn2"], (1,))
    assert seen and set(seen) == {1}
    by_op = {r.op: r.latency_us for r in one if r.impl == "nki"}
    for r in ours:  # two cores on 320 rows each: faster than one core on 640, not > 2x
        assert by_op[r.op] / 2 <= r.latency_us < by_op[r.op], r.op


def test_goal_needs_the_mean_and_the_band_low_end():
    from nki_kernels.bench.readme import goal_text

    assert goal_text("attention", 1.5, (1.1, 1.8)).endswith(": met")
    assert "band low end 0.95x" in goal_text("attention", 1.5, (0.95, 1.8))
    assert "0.20x short" in goal_text("moe", 1.1, (1.05, 1.2))
    assert goal_text("norm", 1.2, None).endswith("missed (no band)")
    partial = goal_text("moe", 3.4, (2.9, 3.8), (2, 4))
    assert "judged on the 2 of 4 cases that have an AWS figure" in partial
    assert partial.endswith(": met")
    assert "judged on" not in goal_text("moe", 3.4, (2.9, 3.8), (4, 4))


def test_attention_lnc2_prices_one_kv_head_per_program():
    from nki_kernels.attention import bench as attn

    one = attn.price("fwd", 512, "trn2", False, force="pair")
    two = attn.price("fwd", 512, "trn2", False, force="pair", lnc=2)
    assert one.pricing == "1 of 8 pairs x 8"
    assert two.pricing == "2 of 8 pairs x 4, kernel[2]"
    # two cores, one kv head each per launch: at most the LNC 1 latency, at least half
    assert one.latency_us / 2 <= two.latency_us <= one.latency_us


@pytest.mark.parametrize("lnc", [1, 2])
def test_norm_rows_use_the_config_entry_of_the_lnc_they_launch_at(lnc: int) -> None:
    """A row priced as kernel[2] uses the config a default trn2 (LNC 2) looks up, not
    the LNC 1 entry: the shipped rms_norm entries exist at both LNCs."""
    from nki_kernels.norm import bench as nb
    from nki_kernels.runtime.config_store import recording_decisions

    with recording_decisions() as seen:
        nb.op_parts("rms_norm", "fwd", 16384, 4096, "trn2", lnc)
    assert seen and all(d.lnc == lnc for d in seen)
    assert all(d.entry_key is not None for d in seen), [d.describe() for d in seen]
    assert all(("lnc=2" in str(d.entry_key)) == (lnc == 2) for d in seen)


def test_rows_of_an_older_cost_model_keep_their_own_ratio_band():
    old = "modeled (cost model v2, trn2)"
    ours = BenchRow("norm", "rms_norm fwd", "[256, 512] bf16", "trn2", "nki", 10.0, old,
                    extra={"samples_us": [8.0, 10.0, 12.0]})  # fmt: skip
    aws = BenchRow("norm", "rms_norm fwd", "[256, 512] bf16", "trn2", "aws", 15.0, old,
                   extra={"samples_us": [14.0, 15.0, 16.0]})  # fmt: skip
    assert _cells(comparison_table([ours, aws]))[8] == "1.50x (1.33–1.75)"
