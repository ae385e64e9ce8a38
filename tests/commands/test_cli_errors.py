"""Every CLI verb answers a user's bad input with one line on stderr naming the option
(exit 2, no traceback); `estimate module:function` prices the user's own kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from nki_kernels import cli


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    try:
        rc = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code if isinstance(exc.code, int) else 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return rc, err


@pytest.mark.parametrize("verb", sorted(cli.discover()))
def test_every_verb_rejects_an_unknown_option_in_one_line(
    verb: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = _run([verb, "--no-such-option"], capsys)
    assert rc == 2 and len(err) == 1, err
    # the unknown option, or first the required ones it lacks
    assert "--no-such-option" in err[0] or "arguments are required: " in err[0], err[0]


BAD = [
    (["estimate", "matmul_tiled", "--shape", "x"], "--shape"),
    (["estimate", "matmul_tiled", "--lnc", "3"], "--lnc"),
    (["estimate", "matmul_tiled", "--target", "trn9"], "--target"),
    (["estimate", "no_such_module_xyz:fn"], "kernel"),
    (["estimate", "nki_kernels.perfmodel.calibration:matmul_tiled", "--arg", "lhsT"], "--arg"),
    (["tune", "rms_norm", "--trials", "0"], "--trials"),
    (["tune", "rms_norm", "--target", "trn9"], "target"),
    (["configs", "which", "rms_norm"], "--shape"),
    (["bench", "--no-check", "--data", "/no/such/dir"], "--data"),
    (["bench", "--no-check", "--measured", "/no/such/file.jsonl"], "--measured"),
    (["bench", "--no-check", "--full"], "--full: expected together with --reprice or --peer"),
    (["bench", "--no-check", "--bands"], "--bands: expected together with --reprice"),
    (["parity", "--steps", "0"], "--steps"),
    (["parity", "--dtype", "int3"], "--dtype"),
    (["parity", "--nproc", "0"], "--nproc"),
    (["configs", "diff", "/no/such/dir", "shipped"], "a: expected a config directory"),
    (["configs", "show", "--config-dir", "/no/such/dir"], "--config-dir: expected"),
    (["configs", "validate", "--config-dir", "/no/such/dir"], "--config-dir: expected"),
    # a mistyped filter is an error, not "0 entries checked" (exit 0) or "no stored configs"
    (["configs", "validate", "--op", "rms_norn"], "--op: expected one of"),
    (["configs", "show", "--op", "rms_norn"], "--op: expected one of"),
    (["configs", "summary", "--op", "rms_norn"], "--op: expected one of"),
    (["configs", "diff", "shipped", "shipped", "--op", "rms_norn"], "--op: expected one of"),
    (["configs", "show", "--target", "trn9"], "--target: expected one of"),
    (["configs", "validate", "--target", "trn9"], "--target: expected one of"),
    (
        [
            "configs",
            "which",
            "rms_norm",
            "--shape",
            "llama3-8b",
            "--size",
            "128",
            "--config-dir",
            "/no/such/dir",
        ],
        "--config-dir: expected",
    ),
    (["probe", "no_such_module_xyz:fn"], "no_such_module_xyz"),
    (["doctor", "--require", "bogus"], "--require"),
    (["hwcheck", "--quick", "--ops", "nope"], "--ops"),
    (["conformance", "/no/such/checkout"], "/no/such/checkout"),
]


@pytest.mark.parametrize(("argv", "names"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_values_are_one_line_naming_the_option(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = _run(argv, capsys)
    assert rc == 2 and len(err) == 1, err
    assert names in err[0] and "Traceback" not in err[0], err[0]


@pytest.mark.parametrize(
    "extra", [["--target", "trn3"], ["--cost", "quadratic", "--dtype", "float16"], ["--shape", "x"]]
)
def test_buckets_refuses_cost_model_options_the_time_model_ignores(
    extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("100\n300 2\n")
    rc, err = _run(["buckets", "--lengths", str(lengths), "--max-buckets", "2", *extra], capsys)
    opt = next(a for a in extra if a != "--cost" and a.startswith("--"))
    assert rc == 2 and len(err) == 1, err
    assert f"{opt}: expected only with --cost model" in err[0] and f"got {extra[-1]!r}" in err[0]


def test_estimate_prices_a_users_own_kernel(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mykernels.py").write_text(
        "from nki_kernels.perfmodel.calibration import matmul_tiled as my_matmul\n"
    )
    spec = f"{tmp_path / 'mykernels.py'}:my_matmul"
    argv = ["estimate", spec, "--arg", "lhsT=256x128", "--arg", "rhs=256x512", "--no-band"]
    assert cli.main([*argv, "--lnc", "1"]) == 0
    out = capsys.readouterr().out
    assert "my_matmul (LNC 1) lhsT=256x128 rhs=256x512: modeled (cost model" in out
    assert "total_time" in out


def test_a_missing_optional_dependency_names_its_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    rc, err = _run(["probe", "llama"], capsys)
    assert rc == 2 and err == [
        "nki-kernels probe: error: needs transformers: pip install 'nki-kernels[hf]'"
    ]
