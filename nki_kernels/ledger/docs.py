"""The manual's ledger page keeps two ledgers printed by the CLI, between markers:
`python -m nki_kernels.ledger.docs` rewrites them from the committed rows (and the
ledger cache); `tests/ledger` fails when the page and the CLI disagree."""

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


def main() -> int:
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
