"""The manual's ledger page keeps two ledgers printed by the CLI, between markers:
`python -m nki_kernels.ledger.docs` rewrites them from the committed rows (and the
ledger cache); `tests/ledger` fails when the page and the CLI disagree.

`python -m nki_kernels.ledger.docs --refresh` first prices every documented command into
the committed ledger rows (`benchmarks/data/ledger_rows.jsonl`; after a cost-model
change: minutes, the MoE backward most of them) and redraws the chart; then run
`python scripts/build_readme.py`."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "readme" / "ledger.md"
LEDGERS = {
    "train": ["--model", "llama3-8b", "--phase", "train", "--seq", "8192"],
    "decode": ["--model", "llama3-8b", "--phase", "decode", "--batch", "64", "--context", "32768"],
}


# the commands whose rows are committed (README, manual, tests)
REFRESH = [
    ["ledger", "--model", "llama3-8b", "--plot", "benchmarks/results/ledger_cost.png"],
    ["ledger", "--model", "llama3-8b", "--phase", "train", "--seq", "8192", "--target", "trn3"],
    ["bench", "--model", "llama3-8b", "--seq", "4096"],
    ["ledger", "--model", "mixtral-8x7b", "--phase", "prefill", "--seq", "4096"],
    ["ledger", "--model", "mixtral-8x7b", "--phase", "decode", "--batch", "64"],
    ["ledger", "--model", "mixtral-8x7b", "--phase", "train", "--seq", "4096"],
    ["ledger", "--model", "mixtral-8x7b", "--phase", "train", "--seq", "8192"],
    ["ledger", "--model", "qwen3-moe-like", "--phase", "train", "--seq", "4096"],
    ["ledger", "--model", "qwen3-moe-like", "--phase", "train", "--seq", "8192"],
    ["ledger", "--model", "qwen3-moe-like", "--phase", "decode", "--batch", "64"],
    ["ledger", "--model", "deepseek-v3-like", "--phase", "prefill", "--seq", "4096"],
    ["ledger", "--model", "deepseek-v3-like", "--phase", "train", "--seq", "8192"],
    [
        "ledger",
        "--model",
        "deepseek-v3-like",
        "--phase",
        "decode",
        "--batch",
        "64",
        "--plot",
        "benchmarks/results/ledger_cost_deepseek.png",
    ],
]


def refresh() -> None:
    """Price the documented commands into the committed ledger rows."""
    from ..cli import main as cli_main
    from .store import COMMITTED_CACHE

    root = PAGE.parents[2]
    for argv in REFRESH:
        argv = [a if not a.endswith(".png") else str(root / a) for a in argv]
        print("refresh:", " ".join(argv), flush=True)
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli_main([*argv, "--cache", str(COMMITTED_CACHE)])
        if rc != 0:
            raise RuntimeError(f"{' '.join(argv)}: exit status {rc}")


def render(name: str) -> str:
    """The CLI's output for one documented ledger (no cache writes)."""
    from ..cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["ledger", *LEDGERS[name], "--cache", "-"])
    if rc != 0:
        raise RuntimeError(f"ledger {name}: exit status {rc}")
    return buf.getvalue().rstrip() + "\n"


def block(name: str, text: str) -> str:
    cmd = "nki-kernels ledger " + " ".join(LEDGERS[name])
    return f"<!-- ledger-{name} -->\n```text\n$ {cmd}\n{text}```\n<!-- /ledger-{name} -->"


def documented(page: str, name: str) -> str | None:
    m = re.search(rf"<!-- ledger-{name} -->.*?<!-- /ledger-{name} -->", page, flags=re.S)
    return m.group(0) if m else None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args != ["--refresh"]:
        print("usage: python -m nki_kernels.ledger.docs [--refresh]", file=sys.stderr)
        return 2
    if args:
        refresh()
    page = PAGE.read_text()
    for name in LEDGERS:
        old = documented(page, name)
        if old is None:
            print(f"{PAGE}: no <!-- ledger-{name} --> markers", file=sys.stderr)
            return 1
        page = page.replace(old, block(name, render(name)))
    PAGE.write_text(page)
    print(f"{PAGE} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
