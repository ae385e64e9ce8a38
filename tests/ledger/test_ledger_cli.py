"""`nki-kernels ledger` and `nki-kernels bench --model`: labelled output from committed
rows (no pricing at run time), price overrides, payback, and one clean line per user error."""

from __future__ import annotations

import pytest

from nki_kernels.cli import main

TRAIN = ["ledger", "--model", "llama3-8b", "--phase", "train", "--seq", "8192", "--cache", "-"]
DECODE = ["ledger", "--model", "llama3-8b", "--phase", "decode", "--batch", "64"]
DECODE += ["--context", "32768", "--cache", "-"]


@pytest.fixture(autouse=True)
def no_user_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def test_training_ledger_is_labelled(capsys):
    # its speed (under a minute from the committed rows) is a benchmark's business
    assert main(TRAIN) == 0
    out = capsys.readouterr().out
    assert "modeled (cost model" in out  # every Trainium column
    assert "NVIDIA H200 (measured rows)" in out
    assert "derived from measured rows" in out or "the rest derived" in out
    assert "Left out: collectives" in out and "compile time" in out
    assert "USD: needs --price" in out  # no confirmed price: no dollar figure
    assert "step total" in out and "tokens/s" in out


def test_moe_training_ledger_comes_from_committed_rows(capsys):
    from nki_kernels.bench.rows import read_rows
    from nki_kernels.ledger.store import COMMITTED_CACHE, current_version, version_of

    versions = {version_of(r.provenance) for r in read_rows(COMMITTED_CACHE)}
    if versions != {current_version()}:
        pytest.skip(f"committed ledger rows are {versions}, the cost model {current_version()}")
    argv = ["ledger", "--model", "mixtral-8x7b", "--phase", "train", "--seq", "4096"]
    assert main([*argv, "--cache", "-"]) == 0
    out = capsys.readouterr().out
    assert "one MoE layer (x 32 in the model)" in out and "MoE layer (router + experts)" in out
    assert "priced now" not in out  # every component came from committed rows


def test_global_batch_gives_the_optimizer_step_on_one_instance(capsys):
    assert main([*TRAIN, "--global-batch", "128"]) == 0
    out = capsys.readouterr().out
    # 128 sequences over 64 logical cores x 1 sequence each: two steps per core
    line = next(ln for ln in out.splitlines() if "optimizer step of 128 sequences" in ln)
    step = next(ln for ln in out.splitlines() if ln.startswith("step total"))
    ours_step_s = float(step.split()[2])  # "step total  3.11 s (...)"
    assert "trn2.48xlarge, ours (modeled)" in line
    assert float(line.rsplit(":", 1)[1].split()[0]) == pytest.approx(2 * ours_step_s, rel=0.01)


def test_trn3_is_priced_per_chip(capsys):
    assert main([*TRAIN, "--target", "trn3"]) == 0
    out = capsys.readouterr().out
    assert "trn3, LNC 2" in out.splitlines()[0]
    assert "modeled (cost model" in out and ", trn3)" in out
    assert "trn3-chip (4 logical cores)" in out  # 8 NeuronCore-v4 per chip / LNC 2


def test_serving_ledger_with_prices_and_payback(capsys):
    argv = [*DECODE, "--price", "trn2.48xlarge=40:capacity-block", "--price", "p5en.48xlarge=60"]
    argv += ["--port-weeks", "4", "--engineer-cost", "5000", "--monthly-spend", "100000"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trn2.48xlarge at $40.00/h, Capacity Block (given with --price)" in out
    assert "p5en.48xlarge at $60.00/h, kind not stated (given with --price)" in out
    # the kind beside every per-dollar figure
    money = [ln for ln in out.splitlines() if "per M tokens at $" in ln]
    assert len(money) == 3 and all(
        ("Capacity Block" in ln) != ("kind not stated" in ln) for ln in money
    )
    assert "Payback" in out and ("break-even after" in out or "never pays back" in out)


def test_bench_model_prints_ours_native_aws(capsys):
    argv = ["bench", "--model", "llama3-8b", "--seq", "4096", "--cache", "-"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "AWS kernel" in out and "ours vs native" in out
    assert "attention fwd (causal)" in out and "layer total" in out
    # AWS's attention at S = 4096 is carried from its committed rows at 2K / 8K
    assert "Carried from rows at another shape" in out and "interpolated to S=4096" in out


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["ledger", "--model", "gpt-17"], "--model"),
        (["ledger", "--model", "llama3-8b", "--price", "trn2.48xlarge"], "--price"),
        (["ledger", "--model", "llama3-8b", "--price", "p9=3"], "--price"),
        (["ledger", "--model", "llama3-8b", "--phase", "decode", "--seq", "4"], "--seq"),
        (["ledger", "--model", "llama3-8b", "--context", "4"], "--context"),
        (["ledger", "--model", "llama3-8b", "--batch", "0"], "--batch"),
        (["ledger", "--model", "llama3-8b", "--port-weeks", "3"], "--port-weeks"),
        (["ledger", "--model", "llama3-8b", "--instance", "p5.48xlarge"], "--instance"),
        (["ledger", "--model", "llama3-8b", "--gpu-instance", "trn2.3xlarge"], "--gpu-instance"),
        (["bench", "--model", "gpt-17"], "--model"),
        (["bench", "--seq", "4096"], "--model"),
        (
            ["ledger", "--model", "llama3-8b", "--target", "trn3", "--instance", "trn2.48xlarge"],
            "--instance",
        ),
    ],
)
def test_user_errors_are_one_line_naming_the_option(capsys, argv, option):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert option in err and len(err.splitlines()) == 1, err


def test_payback_without_prices_names_price(capsys):
    argv = [*TRAIN, "--port-weeks", "4", "--engineer-cost", "5000", "--monthly-spend", "1e5"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "--price" in err and len(err.splitlines()) == 1


def test_the_manual_page_shows_what_the_cli_prints():
    from nki_kernels.ledger import docs

    page = docs.PAGE.read_text()
    for name in docs.LEDGERS:
        assert docs.documented(page, name) == docs.block(name, docs.render(name)), (
            f"docs/readme/ledger.md's {name} ledger is not what the CLI prints: run "
            "`python -m nki_kernels.ledger.docs --refresh-stale` (re-prices the rows whose "
            "kernels changed, then rewrites the page) and `python scripts/build_readme.py`"
        )


def test_plot_keeps_the_decode_batch_to_decode(capsys, tmp_path):
    # --batch 64 with --phase decode: the chart's train and prefill bars stay at one
    # sequence per core (committed rows: nothing priced), not 64 x 8192 tokens
    pytest.importorskip("matplotlib")
    png = tmp_path / "chart.png"
    assert main([*DECODE, "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert png.exists() and "chart written to" in out
    assert "priced now" not in out
