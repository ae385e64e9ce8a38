"""`nki-kernels bench`: its one-screen summary (geometric means with bands, the losing
cases), the full tables in an output folder, no tracked file changed, any directory."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from nki_kernels import cli
from nki_kernels.bench import summary
from nki_kernels.bench.rows import BenchRow

ROOT = Path(__file__).resolve().parents[2]
LABEL = "modeled (cost model v9, trn2)"


def _row(impl: str, op: str, case: str, lat: float, samples: list[float]) -> BenchRow:
    return BenchRow(
        "norm", op, case, "trn2", impl, lat, LABEL, bound_by="vector", lnc=2,
        extra={"samples_us": samples},
    )  # fmt: skip


def test_summary_is_per_phase_with_geometric_means_bands_and_losses() -> None:
    rows = [
        _row("nki", "rms_norm fwd", "a", 10.0, [10.0, 12.0]),
        _row("native", "rms_norm fwd", "a", 40.0, [40.0, 36.0]),
        _row("nki", "rms_norm fwd", "b", 10.0, [10.0, 10.0]),
        _row("native", "rms_norm fwd", "b", 10.0 * 0.25, [2.5, 5.0]),
        _row("nki", "rms_norm bwd", "a", 10.0, [10.0, 10.0]),
        _row("native", "rms_norm bwd", "a", 20.0, [20.0, 20.0]),
    ]
    lines = summary.summarize(rows, 2, "v9")
    assert [(x.phase, x.target) for x in lines] == [("fwd", "trn2"), ("bwd", "trn2")]
    fwd = lines[0].stats["native"]
    assert fwd is not None and fwd.geo == pytest.approx(1.0)  # sqrt(4 * 0.25)
    # the band: the geometric mean per parameter set, min and max over the sets
    assert fwd.band == pytest.approx((1.0, (3.0 * 0.5) ** 0.5))
    assert lines[0].stats["aws"] is None
    assert [(x.case, round(x.speedup, 2)) for x in lines[0].losses] == [("b", 0.25)]
    assert "vector-bound" in lines[0].losses[0].why
    text = summary.text(lines, 2)
    assert "where ours is slower" in text and "no figure" in text
    assert "| norms | bwd | trn2 | no figure | 2.00x" in summary.markdown(lines, 2)
    # rows of another cost model are never summarized; without any, the summary says so
    assert summary.summarize(rows, 2, "v10") == []
    assert "bench --reprice" in summary.text([], 2)


def test_summary_labels_ceilings_and_names_the_band_parameter_sets() -> None:
    # a losing case's efficiency above the best published measurement of its kind reads
    # "ceiling"; under the table, each target's band names its parameter sets
    def row(impl: str, lat: float, mfu: float) -> BenchRow:
        return BenchRow(
            "attention", "flash_attention fwd", "a", "trn2", impl, lat, LABEL,
            bound_by="tensor", lnc=2, mfu=mfu, extra={"samples_us": [lat, lat]},
        )  # fmt: skip

    lines = summary.summarize([row("nki", 20.0, 0.60), row("native", 10.0, 0.40)], 2, "v9")
    why = lines[0].losses[0].why
    assert "ours tensor-bound, MFU 60 % ceiling" in why  # attention's reference: 46 %
    assert "native path tensor-bound, MFU 40 %" in why and "40 % ceiling" not in why
    md = summary.markdown(lines, 2)
    assert "- Band, trn2: the shipped trn2 parameters; 6 leave-one-out fits" in md
    assert "nki_autotune.attention_cte_causal_16k" in md and "semaphore_ns" in md
    assert "cross-validated error 15.0 % (21.1 % for a ratio" in md
    assert "Band, trn2:" in summary.text(lines, 2)


def _tracked_changes() -> str:
    proc = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return proc.stdout


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout"
)
def test_bench_summarizes_first_writes_tables_aside_and_changes_nothing_tracked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _tracked_changes()
    monkeypatch.chdir(tmp_path)  # any directory: the rows are found from the package
    assert cli.main(["bench", "--no-check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) <= 40, "the summary fits one screen"
    assert any("geometric mean" in line for line in out[:5])
    assert any(line.startswith("attention bwd trn2") for line in out)
    tables = ROOT / "build" / "bench" / "tables.md"
    assert f"full tables: {tables}" in "\n".join(out)
    assert "| flash_attention bwd causal |" in tables.read_text()
    assert _tracked_changes() == before, "bench changed files git sees"
    assert not list(tmp_path.iterdir())


def test_rows_without_parameter_sets_carry_the_structural_band_labelled() -> None:
    # rows priced with the shipped parameters alone (no samples) on the current model
    # still show the model's cross-validated error around their mean, and say so
    from nki_kernels.perfmodel import COST_MODEL_VERSION
    from nki_kernels.perfmodel.band import widen

    label = f"modeled (cost model {COST_MODEL_VERSION}, trn2)"
    rows = [
        BenchRow("moe", "moe_mlp fwd", "a", "trn2", "nki", 10.0, label, lnc=2),
        BenchRow("moe", "moe_mlp fwd", "a", "trn2", "native", 15.0, label, lnc=2),
    ]
    (line,) = summary.summarize(rows, 2, COST_MODEL_VERSION)
    stat = line.stats["native"]
    assert stat is not None and stat.structural_only
    assert stat.band == pytest.approx(widen(1.5, 1.5, "trn2", terms=2))
    assert stat.band[0] < 1.5 < stat.band[1]
    md = summary.markdown([line], 2)
    assert "structural error only" in md and "parameter sets were not run" in md
