"""Measured rows beside the modeled bench figures (`bench.measured`, `bench --measured`).

The measured rows here come from a SIMULATED device: hwcheck's own path with the kernels
run in the interpreter and the cost model (times a hidden factor) as the clock. The
simulation exists only in this test; no row it writes is committed or shown to a user.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from nki_kernels import cli
from nki_kernels.bench import measured
from nki_kernels.bench.rows import BenchRow, write_rows
from nki_kernels.bench.table import comparison_table
from nki_kernels.commands import hwcheck
from nki_kernels.commands.hwcheck_cases import all_cases, cases_for
from nki_kernels.perfmodel import modeled_label
from nki_kernels.perfmodel.measurements import MeasuredRow, load_rows

pytestmark = pytest.mark.filterwarnings(
    "ignore::nki_kernels.runtime.config_store.ConfigFallbackWarning"
)

SIMULATED = hwcheck.DeviceInfo(
    device="simulated (interpreter + cost-model clock, test only)",
    torch_device="cpu",
    sdk_version="simulation",
    torch_neuronx_version=None,
)
CLOCK_FACTOR = 1.25
CASE = "[300, 256] bf16"


def simulated_timer(launch: Any, warmup: int, repeats: int) -> list[float]:
    """SIMULATION: samples from the cost model x CLOCK_FACTOR (+-1 %), not from a clock."""
    base = hwcheck.modeled_ns(launch)
    assert base is not None
    return [base * CLOCK_FACTOR * (1 + 0.01 * (i % 3 - 1)) for i in range(repeats)]


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """hwcheck's rows for rms_norm at a small shape, labelled as a bench row (SIMULATION)."""
    (case,) = cases_for(["rms_norm"], quick=True)
    labelled = dataclasses.replace(case, bench=("rms_norm fwd", "rms_norm bwd", CASE))
    out = tmp_path_factory.mktemp("simulated") / "measured_rows.jsonl"
    lines: list[str] = []
    code = hwcheck.run_all([labelled], SIMULATED, simulated_timer, out, warmup=0, repeats=3,
                           calibration={}, emit=lines.append)  # fmt: skip
    assert code == 0, lines
    return out


def _bench_rows(target: str, lnc: int) -> list[BenchRow]:
    label = modeled_label(target)
    return [
        BenchRow("norm", f"rms_norm {p}", CASE, target, "nki", 10.0, label, lnc=lnc)
        for p in ("fwd", "bwd")
    ]


def test_hwcheck_labels_rows_with_the_bench_rows(rows_file: Path) -> None:
    rows = load_rows(rows_file)
    assert {(r.op, r.case) for r in rows} == {("rms_norm fwd", CASE), ("rms_norm bwd", CASE)}
    assert {r.kernel for r in rows if r.op == "rms_norm fwd"} == {"rms_norm_fwd"}
    assert {r.kernel for r in rows if r.op == "rms_norm bwd"} == {"rms_norm_bwd"}
    assert all(r.launches >= 1 for r in rows)
    # every case the bench also has carries its texts (norms, causal attention)
    labelled = {c.bench for c in all_cases() if c.bench}
    assert ("rms_norm fwd", "rms_norm bwd", "[16384, 4096] bf16") in labelled
    assert ("flash_attention fwd causal", "flash_attention bwd causal",
            "B=1 H=32/8 S=2048 D=128 bf16") in labelled  # fmt: skip


def test_figures_sum_the_kernels_and_mark_changed_kernels_stale(rows_file: Path) -> None:
    rows = measured.load(rows_file)
    figs = measured.figures(rows)
    for (op, case, target, lnc), fig in figs.items():
        mine = [r for r in rows if (r.op, r.case, r.target, r.lnc) == (op, case, target, lnc)]
        want = sum(r.latency_ns["median"] * r.launches for r in mine) / 1e3
        assert fig.latency_us == pytest.approx(want, rel=1e-12)
        assert fig.min_us < fig.latency_us < fig.max_us
        assert fig.stale == () and fig.label == f"measured (hardware, {SIMULATED.device})"
    # a row measured with an older kernel source is stale, and says which kernel
    old = [dataclasses.replace(r, kernel_hash="0" * 16) if r.op == "rms_norm fwd" else r
           for r in rows]  # fmt: skip
    fwd = next(f for k, f in measured.figures(old).items() if k[0] == "rms_norm fwd")
    assert fwd.stale == ("rms_norm_fwd",) and fwd.cell().startswith("stale: ")
    bwd = next(f for k, f in measured.figures(old).items() if k[0] == "rms_norm bwd")
    assert bwd.stale == ()


def test_the_table_shows_measured_beside_modeled(rows_file: Path) -> None:
    figs = measured.figures(measured.load(rows_file))
    (target, lnc), *_ = {(k[2], k[3]) for k in figs}
    table = comparison_table(_bench_rows(target, lnc), figs)
    header, _, *lines = table.splitlines()
    cols = [c.strip() for c in header.strip("|").split("|")]
    at = cols.index("ours measured (hardware, us)")
    assert cols[at - 1] == "ours (us)"
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        fig = figs[(cells[0], cells[1], target, lnc)]
        assert cells[at] == fig.cell() and cells[at - 1] == "10.0"
    # without measured figures the table is unchanged
    assert "measured" not in comparison_table(_bench_rows(target, lnc))


def test_bench_command_reads_measured_rows(
    rows_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figs = measured.figures(measured.load(rows_file))
    (target, lnc), *_ = {(k[2], k[3]) for k in figs}
    data = tmp_path / "data"
    write_rows(data / "bench_rows.jsonl", _bench_rows(target, lnc))
    args = ["bench", "--data", str(data), "--no-check", "--suite", "norm", "--rows", "-"]
    args += ["--tables", "--out", str(tmp_path / "out")]
    assert cli.main([*args, "--measured", str(rows_file)]) == 0
    out = capsys.readouterr().out
    assert "ours measured (hardware, us)" in out
    assert "only the 'measured (hardware)' column holds hardware measurements" in out
    assert f"measured (hardware): 2 op figures from {len(load_rows(rows_file))}" in out
    # a stale row is shown as stale
    stale = tmp_path / "stale.jsonl"
    lines = rows_file.read_text().splitlines()
    first = json.loads(lines[0])
    first["kernel_hash"] = "0" * 16
    stale.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    assert cli.main([*args, "--measured", str(stale)]) == 0
    out = capsys.readouterr().out
    assert "| stale: " in out and "1 measured figures are stale" in out
    # a bad file is named
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "measured"}\n')
    assert cli.main([*args, "--measured", str(bad)]) == 2
    assert f"bench: --measured: {bad}:1: field" in capsys.readouterr().err


def test_without_measured_rows_the_notes_say_none_are_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no benchmarks/data/measured_rows.jsonl here
    figs, notes = measured.for_bench(None)
    assert figs == {}
    assert notes == [measured.NONE_COMMITTED.format(path=measured.DEFAULT_MEASURED)]
    assert "nothing here has run on a Neuron device" in notes[0]


def test_the_repository_ships_no_measured_rows() -> None:
    root = Path(__file__).resolve().parents[2]
    assert not (root / measured.DEFAULT_MEASURED).exists()


def test_labels_round_trip_and_older_rows_still_load(rows_file: Path, tmp_path: Path) -> None:
    (row, *_) = load_rows(rows_file)
    d = row.to_dict()
    assert MeasuredRow.from_dict(d) == row
    old = {k: v for k, v in d.items() if k not in ("op", "case", "launches")}
    assert MeasuredRow.from_dict(old).op is None
    with pytest.raises(ValueError, match="case: expected set together with op"):
        MeasuredRow.from_dict({**old, "op": "rms_norm fwd"})
    with pytest.raises(ValueError, match="launches: expected an integer >= 1"):
        MeasuredRow.from_dict({**d, "launches": 0})
