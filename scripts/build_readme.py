"""Assemble README.md from the sections in docs/readme/ (the sources of the README).

Each component keeps its README section next to the others in docs/readme/; this script
puts them in reading order, lifting sections written one heading level too deep.
Run `python scripts/build_readme.py` after editing a section.
"""

from __future__ import annotations

import sys
from pathlib import Path

SECTIONS_DIR = Path(__file__).resolve().parents[1] / "docs" / "readme"
README = SECTIONS_DIR.parents[1] / "README.md"

# reading order; sections whose top heading is '###' are lifted one level
ORDER = (
    "00-overview.md",
    "01-benchmarks.md",
    "02-benchmark-table.md",
    "torch-ops.md",
    "norms.md",
    "attention.md",
    "moe.md",
    "autotune.md",
    "interpreter.md",
    "interpreter-instructions.md",
    "interpreter-conformance.md",
    "cost-model.md",
    "on-trn2.md",
    "99-development.md",
)
LIFT = {"interpreter.md", "cost-model.md"}


def _lift(text: str) -> str:
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("###"):
            line = line[1:]
        out.append(line)
    return "\n".join(out)


def build() -> str:
    """The README text assembled from the sections."""
    missing = [name for name in ORDER if not (SECTIONS_DIR / name).exists()]
    extra = sorted(p.name for p in SECTIONS_DIR.glob("*.md") if p.name not in ORDER)
    if missing or extra:
        raise SystemExit(f"docs/readme: missing sections {missing}, unlisted sections {extra}")
    parts = []
    for name in ORDER:
        text = (SECTIONS_DIR / name).read_text().strip()
        parts.append(_lift(text) if name in LIFT else text)
    return "\n\n".join(parts) + "\n"


def main() -> int:
    README.write_text(build())
    print(f"wrote {README} ({len(README.read_text().splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
