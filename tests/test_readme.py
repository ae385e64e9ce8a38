"""The README is assembled from docs/readme/ and must be in sync with it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _builder():
    spec = importlib.util.spec_from_file_location(
        "build_readme", ROOT / "scripts" / "build_readme.py"
    )
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_readme_is_assembled_from_its_sections():
    assert (ROOT / "README.md").read_text() == _builder().build(), (
        "README.md is stale: run `python scripts/build_readme.py`"
    )


def test_quick_start_shows_the_two_commands():
    text = (ROOT / "README.md").read_text()
    quick = text[text.index("## Quick start") :][:600]
    assert "make bench" in quick and "make test" in quick
