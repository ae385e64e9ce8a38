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
