"""The README: the quick start shows the two commands, every Python snippet runs as
written, every shell snippet is a command the CLI (or the Makefile) accepts, the parity
table is the one the committed reports give, and the manual holds every page."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
sys.path.insert(0, str(ROOT / "scripts"))
import build_readme  # noqa: E402

from nki_kernels.cli import build_parser  # noqa: E402

BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)
PYTHON = [code for lang, code in BLOCKS if lang == "python"]
SHELL = [
    line.split("#")[0].strip()
    for lang, code in BLOCKS
    if lang in ("", "bash", "sh", "console")
    for line in code.splitlines()
    if line.strip()
]


def test_quick_start_shows_the_two_commands():
    quick = README[README.index("## Quick start") :][:600]
    assert "make bench" in quick and "make test" in quick


def test_readme_is_one_page_with_the_model_author_sections():
    for heading in (
        "## Quick start",
        "## Use it in a model",
        "### `patch`",
        "### `parity`",
        "### `probe`",
        "## Headline numbers",
        "## The manual",
    ):
        assert heading in README, heading
    assert len(README.splitlines()) < 500


@pytest.mark.parametrize("index", range(len(PYTHON)))
def test_python_snippet_runs_as_written(index: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PYTHON[index]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_shell_snippets_are_commands_that_exist() -> None:
    assert SHELL
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    parser = build_parser()
    for line in SHELL:
        argv = shlex.split(line)
        if argv[0] == "make":
            assert argv[1] in targets, line
        else:
            assert argv[0] == "nki-kernels", line
            try:
                parser.parse_args(argv[1:])
            except SystemExit as exc:  # --help exits 0; a bad command exits 2
                assert exc.code == 0, line


def test_probe_snippet_runs() -> None:
    probes = [line for line in SHELL if line.startswith("nki-kernels probe")]
    assert probes
    for line in probes:
        cmd = [sys.executable, "-m", "nki_kernels.cli", *shlex.split(line)[1:]]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and "| yes |" in proc.stdout, proc.stderr[-2000:]


def test_parity_table_is_the_committed_reports() -> None:
    table = build_readme.parity_table()
    assert table.count("\n") >= 3, "no parity reports in benchmarks/results/parity"
    assert table in README
    dist = build_readme.parity_dist_table()
    assert "FSDP2 (fully_shard)" in dist and "DistributedDataParallel" in dist
    assert dist in README


def test_manual_holds_every_page() -> None:
    manual = build_readme.build_manual()
    for name in build_readme.manual_pages():
        title = build_readme._title(build_readme._page(name))
        assert title in manual, name
