"""The README and the manual: generated from their pages and the committed data (so no
table, chart or stated duration can disagree with it), every Python block runs as
written (blocks marked `<!-- excerpt -->` are skipped), every shell line naming the CLI
or the Makefile is a command they accept, every term the README uses is in its glossary,
and every op is in its support matrix."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MANUAL = (ROOT / "docs" / "MANUAL.md").read_text()
sys.path.insert(0, str(ROOT / "scripts"))
import build_readme  # noqa: E402
import durations  # noqa: E402

from nki_kernels.cli import build_parser  # noqa: E402

EXCERPT = "<!-- excerpt -->"
_BLOCK = re.compile(r"(<!-- excerpt -->\n)?```(\w*)\n(.*?)```", flags=re.S)


def _blocks(text: str) -> list[tuple[str, str, bool]]:
    """(language, code, marked as an excerpt) of every fenced block."""
    return [(lang, code, bool(mark)) for mark, lang, code in _BLOCK.findall(text)]


# pages whose blocks another test runs in their context (autotune: with the configs its
# shell examples tune first); they are not run twice
RUN_ELSEWHERE = (ROOT / "docs" / "readme" / "autotune.md").read_text()
PYTHON = [
    pytest.param(code, id=f"{doc}-{i}")
    for doc, text in (("readme", README), ("manual", MANUAL))
    for i, (lang, code, excerpt) in enumerate(_blocks(text))
    if lang == "python" and not excerpt and code not in RUN_ELSEWHERE
]
SHELL = [
    line.split("#")[0].strip()
    for text in (README, MANUAL)
    for lang, code, excerpt in _blocks(text)
    if lang in ("", "bash", "sh", "console") and not excerpt
    for line in code.replace("\\\n", " ").splitlines()
    if line.strip().startswith(("nki-kernels ", "make "))
]


def test_readme_and_manual_are_generated_from_the_pages_and_the_data() -> None:
    # the benchmark summary and tables, the parity tables and the stated durations are
    # generated from the committed data: a stale page, row file or durations file fails here
    assert README == build_readme.build(), "run `python scripts/build_readme.py`"
    assert MANUAL == build_readme.build_manual(), "run `python scripts/build_readme.py`"


def test_readme_first_screen_sections() -> None:
    for heading in (
        "## What works today",
        "## Quick start",
        "## Use it in a model",
        "## Headline numbers (modeled)",
        "## Glossary",
        "## The manual",
        "## Development",
    ):
        assert README.count(heading + "\n") == 1, heading
    quick = README[README.index("## Quick start") :][:800]
    assert "make bench" in quick and "make test" in quick
    # the README carries the overview, the summary, one training and one serving ledger
    # (the ledger's README page), the glossary and the contents; the rest is the manual's
    assert len(README.splitlines()) < 380
    # maintainers' goals are not user-facing headline material
    assert "goal" not in README[: README.index("## Glossary")].lower()


def test_manual_holds_the_model_author_sections_and_the_readme_links_them() -> None:
    for heading in ("### `patch`", "### `parity`", "### `probe`"):
        assert heading in MANUAL and heading not in README, heading
    assert "(docs/MANUAL.md#use-it-in-a-model)" in README
    for name in ("serving.md", "ledger.md"):
        page = ROOT / "docs" / "readme" / name
        if page.exists():
            title = build_readme._title(build_readme._page(name))
            # a page the README carries itself is linked in place, the others in the manual
            where = "" if name in build_readme.README_ONLY else "docs/MANUAL.md"
            assert f"({where}#{build_readme.anchor(title)})" in README, name


def _data_rows(text: str) -> list[str]:
    return [
        ln
        for ln in text.splitlines()
        if ln.startswith("| ") and "|---" not in ln and not ln.startswith(("| op |", "| model |"))
    ]


def test_no_table_row_appears_twice() -> None:
    rows = _data_rows(README)
    assert len(rows) == len(set(rows))
    assert not set(rows) & set(_data_rows(MANUAL))


@pytest.mark.parametrize("code", PYTHON)
def test_python_block_runs_as_written(code: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_shell_lines_are_commands_that_exist() -> None:
    assert SHELL
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    parser = build_parser()
    for line in SHELL:
        argv = shlex.split(line)
        if any(a.startswith("[") for a in argv):
            continue  # a synopsis ([--option] ...), not a command
        if argv[0] == "make":
            assert argv[1] in targets, line
            continue
        try:
            parser.parse_args(argv[1:])
        except SystemExit as exc:  # --help exits 0; a bad command exits 2
            assert exc.code == 0, line


def test_probe_line_runs() -> None:
    probes = [line for line in SHELL if line.startswith("nki-kernels probe")]
    assert probes
    cmd = [sys.executable, "-m", "nki_kernels.cli", *shlex.split(probes[0])[1:]]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "| yes |" in proc.stdout, proc.stderr[-2000:]


def test_parity_tables_are_the_committed_reports() -> None:
    table = build_readme.parity_table()
    assert table.count("\n") >= 3, "no parity reports in benchmarks/results/parity"
    assert table in MANUAL
    dist = build_readme.parity_dist_table()
    assert "FSDP2 (fully_shard)" in dist and "DistributedDataParallel" in dist
    assert dist in MANUAL


def test_manual_holds_every_page() -> None:
    manual = build_readme.build_manual()
    for name in build_readme.manual_pages():
        title = build_readme._title(build_readme._page(name))
        assert title in manual, name


def test_code_spans_are_not_rewritten_as_links() -> None:
    text = "`kernel[lnc](...)` and [the chart](benchmarks/results/speedup.png)"
    assert build_readme._relink(text) == (
        "`kernel[lnc](...)` and [the chart](../benchmarks/results/speedup.png)"
    )
    assert "`kernel[lnc](...)`" in MANUAL and "[lnc](../" not in MANUAL


# --- stated durations --------------------------------------------------------------

_DURATION = re.compile(
    r"\b(\d+(\.\d+)?\s*(s|sec|seconds?|min|minutes?|h|hours?)|(a|an|one|two|three|four|five|"
    r"ten|fifteen|twenty) (minutes?|hours?|seconds?))\b",
    flags=re.I,
)


@pytest.mark.parametrize("doc", ["README.md", "docs/MANUAL.md"])
def test_stated_durations_are_the_measured_ones(doc: str) -> None:
    # a line that names `make test` / `make fuzz` / `make bench` and a duration must state
    # exactly the measured figure of benchmarks/data/durations.json (with its date and
    # machine), or that it is not measured yet
    text = (ROOT / doc).read_text()
    recorded = durations.load()
    for line in text.splitlines():
        for command in durations.COMMANDS:
            if f"`{command}`" not in line and not line.startswith(command + " "):
                continue
            if not _DURATION.search(line):
                continue
            assert durations.stated(command) in line, (command, line)
            entry = recorded[command]
            if entry is not None:
                assert entry["date"] in line and entry["machine"] in line, line


def test_a_hand_written_duration_is_caught() -> None:
    assert _DURATION.search("make test    # the suite (about 3 minutes on 2 cores)")
    assert _DURATION.search("`make fuzz` takes 7 min")
    assert not _DURATION.search("`make test` runs the suite")


def test_stated_text_is_the_recorded_entry(tmp_path: Path) -> None:
    path = tmp_path / "durations.json"
    entry = {"seconds": 61.4, "date": "2026-01-02", "machine": "m", "source": "s"}
    durations.write("make fuzz", entry, path)
    assert durations.stated("make fuzz", path) == "1 min 1 s; measured 2026-01-02 on m (s)"
    assert durations.stated("make test", path) == "not measured yet"


def test_durations_file_holds_measured_runs_with_their_date_and_machine() -> None:
    data = json.loads(durations.DATA.read_text())
    assert set(data) <= set(durations.COMMANDS)
    for command, entry in data.items():
        assert entry["seconds"] > 0, command
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", entry["date"]), command
        assert entry["machine"] and entry["source"], command
        assert durations.stated(command) in README, command


# --- the chart --------------------------------------------------------------------


def test_committed_chart_is_drawn_from_the_committed_rows() -> None:
    from nki_kernels.bench import plot

    png = build_readme.CHART_PNG_PATH
    kept = json.loads(plot.data_path(png).read_text())
    digest = kept.pop("png_sha256")
    rows, _ = build_readme._bench_rows()
    assert kept == plot.chart_data(rows), "the chart's data is stale: run build_readme.py"
    assert digest == plot.sha256(png), "speedup.png is not the chart drawn from speedup.json"
    assert f"cost model {kept['cost_model']}" in README


# --- the first screen's claims ------------------------------------------------------

JARGON = (
    "NKI", "LNC", "MFU", "HBM", "SBUF", "PSUM", "native path", "band", "anchor", "ulp",
    "TorchNeuron", "GQA", "interpreter", "cost model", "emulated", "geometric mean",
    "TensorE", "VectorE", "bf16", "trn2", "KV cache", "SwiGLU", "top-k", "dropless",
)  # fmt: skip


def test_every_term_the_readme_uses_is_in_its_glossary() -> None:
    start = README.index("## Glossary")
    glossary = README[start : README.index("\n## ", start + 1)]
    body = README[:start] + README[README.index("\n## ", start + 1) :]
    for term in JARGON:
        if re.search(rf"\b{re.escape(term)}", body):
            assert re.search(rf"\*\*[^*]*{re.escape(term)}", glossary, flags=re.I), term


def test_support_matrix_lists_every_op() -> None:
    # the library's ops as a fresh process registers them (other tests register their own)
    code = (
        "import nki_kernels\n"
        "from nki_kernels.ops.registry import registered_ops\n"
        "print('\\n'.join(registered_ops()))"
    )
    names = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "flash_attention" in names
    matrix = README[README.index("## What works today") : README.index("## Quick start")]
    for name in names:
        if name.endswith("_backward"):
            continue
        assert f"`{name}`" in matrix, f"{name} is missing from the README's support matrix"
