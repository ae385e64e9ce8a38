"""Every example of the autotuning README section runs as written.

The shell blocks of `docs/readme/autotune.md` are run line by line through the
`nki-kernels` dispatcher in a scratch directory (with the repository's `benchmarks/`
visible), `export` lines set the environment, and the Python block is executed. The
scale-out example's `NKI_KERNELS_STORAGE` (a host that does not exist here) is replaced
by `NKI_KERNELS_TEST_PG_URL` when set, else by a local SQLite file.
"""

from __future__ import annotations

import os
import re
import shlex
import warnings
from pathlib import Path

import pytest

from nki_kernels.cli import main
from nki_kernels.runtime import buckets
from nki_kernels.runtime import config_store as cs
from nki_kernels.runtime.lnc import LNC_ENV_VAR, set_runtime_lnc

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "readme" / "autotune.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(), flags=re.S)


def _commands() -> list[str]:
    lines = []
    for block in _blocks("bash"):
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_the_section_has_examples() -> None:
    cmds = _commands()
    assert any(c.startswith("nki-kernels tune") for c in cmds)
    assert any(c.startswith("nki-kernels configs which") for c in cmds)
    assert any(c.startswith("nki-kernels buckets") for c in cmds)
    assert _blocks("python")


def test_every_example_runs_as_written(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")
    for var in ("NKI_KERNELS_STORAGE", "NKI_KERNELS_CONFIG_DIR", "NKI_KERNELS_BUCKET_POLICY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cs, "_default", None)
    buckets.reset_bucket_policies()
    # the first tune's default storage would be ~/.cache: keep it in the scratch directory
    monkeypatch.setenv("HOME", str(tmp_path))
    try:
        for line in _commands():
            words = shlex.split(line)
            if words[0] == "export":
                name, _, value = words[1].partition("=")
                if name == "NKI_KERNELS_STORAGE":
                    value = os.environ.get("NKI_KERNELS_TEST_PG_URL") or str(tmp_path / "s.db")
                monkeypatch.setenv(name, value)
                continue
            assert words[0] == "nki-kernels", line
            if "--reset" not in words and words[1] == "tune" and "--workers" in words:
                # a rerun against a shared database continues the study: start it fresh
                assert main([*words[1:], "--reset"]) == 0
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                assert main(words[1:]) == 0, line
        (code,) = _blocks("python")
        monkeypatch.setattr(cs, "_default", None)
        buckets.reset_bucket_policies()
        monkeypatch.delenv(LNC_ENV_VAR, raising=False)  # restored at teardown
        set_runtime_lnc(None)  # the block's NEURON_LOGICAL_NC_CONFIG is read afresh
        capsys.readouterr()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exec(compile(code, str(DOC), "exec"), {})
        # the call the example explains uses the entry the example tuned, at its bucket
        out = capsys.readouterr().out
        assert "rows=1408" in out and "tuned entry" in out, out
    finally:
        for var in ("NKI_KERNELS_CONFIG_DIR", "NKI_KERNELS_BUCKET_POLICY", LNC_ENV_VAR):
            os.environ.pop(var, None)
        set_runtime_lnc(None)
        monkeypatch.setattr(cs, "_default", None)
        buckets.reset_bucket_policies()
    assert (tmp_path / "my-configs" / "trn2" / "rms_norm.json").exists()
    assert (tmp_path / "buckets.json").exists()


@pytest.mark.parametrize("line", [c for c in _commands() if c.startswith("nki-kernels")])
def test_examples_parse(line: str) -> None:
    from nki_kernels.cli import build_parser

    build_parser().parse_args(shlex.split(line)[1:])
