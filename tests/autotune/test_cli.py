"""The autotuner's commands through the `nki-kernels` dispatcher."""

from __future__ import annotations

import json

import pytest

from nki_kernels.cli import main


def test_tune_exports_and_configs_show_lists_it(tmp_path, capsys):
    cfg = tmp_path / "configs"
    # nothing is shipped at hidden 2048: the best config is exported
    argv = [
        "tune", "rms_norm", "--target", "trn2", "--buckets", "256", "--shape", "hidden=2048",
        "--trials", "6", "--storage", str(tmp_path / "s.db"), "--config-dir", str(cfg),
        "--no-progress", "--lnc", "1",
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "best" in out and "modeled (cost model v3, trn2, LNC 1)" in out
    data = json.loads((cfg / "trn2" / "rms_norm.json").read_text())
    (key,) = data["entries"]
    assert key == "affine=w,dtype=bfloat16,hidden=2048,rows=256"
    assert data["entries"][key]["provenance"]["trials"] == 6

    # resuming the same study with a larger budget continues it (6 -> 9 configs)
    assert main([*argv[:8], "--trials", "9", *argv[10:]]) == 0
    data = json.loads((cfg / "trn2" / "rms_norm.json").read_text())
    assert data["entries"][key]["provenance"]["trials"] == 9

    assert main(["configs", "show", "--config-dir", str(cfg)]) == 0
    shown = capsys.readouterr().out
    assert key in shown and "STALE" not in shown and "x " in shown


def test_tune_exports_nothing_slower_than_the_shipped_config(tmp_path, capsys):
    # a user directory takes precedence over the shipped configs: a config that does not
    # beat the shipped entry for the problem is not exported (and that is not an error);
    # at 512 rows of hidden 8192 the nearest shipped bucket's config beats two trials
    cfg = tmp_path / "configs"
    argv = [
        "tune", "rms_norm", "--target", "trn2", "--buckets", "512", "--shape", "llama3-70b",
        "--trials", "2", "--storage", str(tmp_path / "s.db"), "--config-dir", str(cfg),
        "--no-progress", "--lnc", "1",
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "not exported" in out and "the shipped " in out and "calls keep using it" in out
    assert not (cfg / "trn2" / "rms_norm.json").exists()


def test_configs_diff_reports_changed_entries(tmp_path, capsys):
    entry = {
        "config": {"chunk": 512, "bufs": 2},
        "provenance": {"latency_ns": 2000.0, "kernel_hash": "a" * 16},
    }
    for name, chunk, lat in (("a", 512, 2000.0), ("b", 1024, 1500.0)):
        d = tmp_path / name / "trn2"
        d.mkdir(parents=True)
        e = json.loads(json.dumps(entry))
        e["config"]["chunk"], e["provenance"]["latency_ns"] = chunk, lat
        entries = {"rows=256": e}
        if name == "b":
            entries["rows=512"] = e
        (d / "rms_norm.json").write_text(json.dumps({"format": 1, "entries": entries}))
    assert main(["configs", "diff", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "rows=256: chunk: 512 -> 1024; latency 2.00 -> 1.50 us" in out
    assert "rows=512: only in B" in out
    assert "2 difference(s)" in out


def test_configs_summary_puts_targets_side_by_side(tmp_path, capsys):
    for target, lat in (("trn2", 1500.0), ("trn3", 1000.0)):
        d = tmp_path / target
        d.mkdir()
        entry = {
            "config": {"chunk": 512},
            "provenance": {
                "latency_ns": lat,
                "default_latency_ns": 2000.0,
                "measurer": f"modeled (cost model v1, {target}; one of 2 identical units, x2)",
            },
        }
        entries = {"affine=w,dtype=bfloat16,hidden=64,rows=256": entry}
        (d / "toy_op.json").write_text(json.dumps({"format": 1, "entries": entries}))
    assert main(["configs", "summary", "--config-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    head = "| op | bucketed problem | trn2: default → tuned, speedup | trn3: default → tuned, "
    assert head in out
    assert (
        "| toy_op | hidden=64, rows=256 | 2.00 us → 1.50 us, x1.33 | 2.00 us → 1.00 us, x2.00 |"
        in out
    )
    assert "cost model v1, LNC 1: 2 entries; speedup geomean x1.633, max x2.00, min x1.33" in out
    # every latency says how it was obtained
    assert "Latencies: modeled (cost model v1, trn2); modeled (cost model v1, trn3)." in out
    assert "2 entries have no band" in out and "Bands:" not in out


def test_configs_summary_prints_every_modeled_figure_with_its_band(tmp_path, capsys):
    """Banded entries: '1.23 ms (1.20–1.26)' for both latencies and the speedup, the
    band's meaning once; entries of another cost model are labelled and never pooled."""
    d = tmp_path / "trn2"
    d.mkdir()
    v2 = {
        "config": {"chunk": 512},
        "provenance": {
            "latency_ns": 1.23e6,
            "default_latency_ns": 1.5e6,
            "lnc": 2,
            "rank": "pessimistic",
            "latency_band_ns": [1.20e6, 1.26e6],
            "default_latency_band_ns": [1.45e6, 1.6e6],
            "speedup_band": [1.19, 1.27],
            "measurer": "modeled (cost model v2, trn2, LNC 2)",
        },
    }
    v1 = {"config": {"chunk": 512},
          "provenance": {"latency_ns": 1500.0, "default_latency_ns": 2000.0,
                         "measurer": "modeled (cost model v1, trn2)"}}  # fmt: skip
    entries = {"hidden=64,lnc=2,rows=256": v2, "hidden=64,rows=256": v1}
    (d / "toy_op.json").write_text(json.dumps({"format": 1, "entries": entries}))
    assert main(["configs", "summary", "--config-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "| toy_op | hidden=64, lnc=2, rows=256 | 1.50 ms (1.45–1.60) → 1.23 ms (1.20–1.26), "
        "x1.22 (1.19–1.27) [cost model v2, pessimistic] |"
    ) in out
    assert "| toy_op | hidden=64, rows=256 | 2.00 us → 1.50 us, x1.33 [cost model v1] |" in out
    assert out.count("Bands: (low–high) = the range of the modeled figure") == 1
    assert "cost model v2, LNC 2: 1 entries; speedup geomean x1.220 (1.190–1.270" in out
    assert "cost model v1, LNC 1: 1 entries; speedup geomean x1.333," in out
    assert main(["configs", "summary", "--config-dir", str(tmp_path), "--lnc", "2"]) == 0
    only2 = capsys.readouterr().out
    assert "lnc=2" in only2 and "cost model v1" not in only2


def test_shipped_configs_match_the_current_kernels(capsys):
    # a kernel change without re-running scripts/tune_shipped_configs.py makes lookup
    # refuse the shipped entries; this keeps the packaged files in step with the kernels
    assert main(["configs", "summary"]) == 0
    out = capsys.readouterr().out
    assert "entries; speedup geomean" in out
    assert "STALE" not in out, [line for line in out.splitlines() if "STALE" in line]


def test_buckets_command_compares_with_the_defaults(tmp_path, capsys):
    f = tmp_path / "lengths.txt"
    f.write_text("\n".join(f"{n} {c}" for n, c in [(100, 50), (700, 30), (3000, 5), (9000, 1)]))
    assert main(["buckets", "--lengths", str(f), "--max-buckets", "3", "--align", "128"]) == 0
    out = capsys.readouterr().out
    assert "optimal boundaries: 128,768,9088" in out
    assert "default pow2[128..4096]+1024k" in out

    assert main(["buckets", "--lengths", str(f), "--max-buckets", "2", "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans[0]["boundaries"] == [700, 9000]  # align 1: boundaries at observed lengths
    # 80 calls padded to 700, 6 to 9000, t(b) = b: (80 * 700 + 6 * 9000) / 86
    assert plans[0]["expected_time"] == pytest.approx((80 * 700 + 6 * 9000) / 86)


def test_tune_rejects_bad_arguments(tmp_path, capsys):
    assert main(["tune", "rms_norm", "--shape", "gpt-5", "--no-export", "--storage", "memory"]) == 2
    assert "--shape: expected one model name of" in capsys.readouterr().err
    assert main(["tune", "rms_norm", "--buckets", "256", "--shape", "llama3-8b", "--workers", "2",
                 "--storage", "memory", "--no-export"]) == 2  # fmt: skip
    assert "needs a shared --storage" in capsys.readouterr().err
