"""The README's quick start shows the project's two commands."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_start_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("## Quick start") :][:600]
    assert "make bench" in quick and "make test" in quick
