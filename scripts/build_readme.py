"""Assemble README.md (one page) and docs/MANUAL.md (the manual) from docs/readme/.

Every topic keeps its page in docs/readme/<topic>.md. README.md is the short page a
newcomer reads: what this is, the quick start, using it in a model (patch, parity,
probe), the headline table and links into the manual. docs/MANUAL.md is every page in
reading order (pages not listed below follow, sorted by name, so a new page is never
lost), with root-relative links rewritten for its folder. The parity table in the
"use it in a model" page is generated here from benchmarks/results/parity/*.json.
Run `python scripts/build_readme.py` after editing a page.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "readme"
README = ROOT / "README.md"
MANUAL = ROOT / "docs" / "MANUAL.md"
PARITY = ROOT / "benchmarks" / "results" / "parity"
PARITY_MARK = "<!-- parity-table -->"
PARITY_DIST_MARK = "<!-- parity-dist-table -->"

# the README page, in order (the headline table is the benchmark page's table)
README_PAGES = ("00-overview.md", "use-in-a-model.md", "02-benchmark-table.md", "ledger.md")
README_TAIL = ("99-development.md",)
# the manual, in reading order; sections whose top heading is '###' are lifted one level
MANUAL_ORDER = (
    "use-in-a-model.md",
    "architecture.md",
    "01-benchmarks.md",
    "02-benchmark-table.md",
    "03-benchmark-details.md",
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
HEADLINE = (
    "## Headline numbers (modeled)\n\n"
    "Our kernels against AWS's own NKI kernels and TorchNeuron's native path for the same "
    "PyTorch code, every figure **modeled** by the cost model (no Trainium here); how "
    "each baseline is built and priced, and the LNC 1 tables, are in the manual's "
    "[benchmarks page](docs/MANUAL.md#{anchor})."
)
_LINK = re.compile(r"(\]\()(?!https?://|#|mailto:|/)([^)\s]+)(\))")


def _lift(text: str) -> str:
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("###"):
            line = line[1:]
        out.append(line)
    return "\n".join(out)


def _title(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
    return ""


def anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    slug = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return slug.replace(" ", "-")


def parity_table() -> str:
    """The summary of every parity report in benchmarks/results/parity (measured)."""
    rows = [
        "| model | dtype | steps | tolerance (fixed first) | noise floor | max abs Δloss "
        "| first divergent step | NaN/Inf grads | resume Δ | s/step torch | s/step NKI | verdict |",
        "|---|---|---:|---:|---:|---:|:---:|---:|---:|---:|---:|:---:|",
    ]
    for path in sorted(PARITY.glob("*.json")):
        r = json.loads(path.read_text())
        first = r["first_divergent_step"]
        rows.append(
            f"| {r['model']} | {r['dtype']} | {r['steps']} | {r['tolerance']:.2e} "
            f"| {r['floor']:.2e} | {max(r['deltas']):.2e} | {'none' if first is None else first} "
            f"| {sum(r['candidate']['nonfinite'])} | {r['resume_max_delta']:.1e} "
            f"| {r['reference']['seconds'] / r['steps']:.2f} "
            f"| {r['candidate']['seconds'] / r['steps']:.2f} "
            f"| {'PASS' if r['passed'] else 'FAIL'} |"
        )
    return "\n".join(rows)


def parity_dist_table() -> str:
    """The `--nproc` reports in benchmarks/results/parity/distributed (measured), a row
    per model and wrapper."""
    rows = [
        "| model | ranks | wrapper | steps | tolerance | max abs Δloss | first divergent step "
        "| NaN/Inf grads | params identical on all ranks | resume Δ (fresh processes) "
        "| FSDP2 vs DDP Δ | s/step torch | s/step NKI | verdict |",
        "|---|---:|---|---:|---:|---:|:---:|---:|:---:|---:|---:|---:|---:|:---:|",
    ]
    for path in sorted((PARITY / "distributed").glob("*.json")):
        r = json.loads(path.read_text())
        for w in ("ddp", "fsdp2"):
            x = r[w]
            first = x["first_divergent_step"]
            cross = max(r["fsdp2_vs_ddp_max_delta"].values())
            rows.append(
                f"| {r['model']} | {r['world_size']} | {x['wrapper']} | {r['steps']} "
                f"| {r['tolerance']:.2e} | {x['max_delta']:.2e} "
                f"| {'none' if first is None else first} "
                f"| {sum(x['nonfinite_grads']['candidate'])} "
                f"| {'yes' if all(x['params_in_sync'].values()) else '**no**'} "
                f"| {x['resume_max_delta']:.1e} | {cross:.1e} "
                f"| {x['seconds_per_step']['reference']:.2f} "
                f"| {x['seconds_per_step']['candidate']:.2f} "
                f"| {'PASS' if x['passed'] else 'FAIL'} |"
            )
    return "\n".join(rows)


def _page(name: str) -> str:
    text = (PAGES / name).read_text().strip()
    if PARITY_MARK in text:
        text = text.replace(PARITY_MARK, parity_table())
    if PARITY_DIST_MARK in text:
        text = text.replace(PARITY_DIST_MARK, parity_dist_table())
    return _lift(text) if name in LIFT else text


def manual_pages() -> list[str]:
    """Every manual page, in reading order, then unlisted pages by name."""
    present = {p.name for p in PAGES.glob("*.md")}
    listed = [n for n in MANUAL_ORDER if n in present]
    extra = sorted(present - set(MANUAL_ORDER) - {"00-overview.md"})
    return listed + extra


def _links() -> str:
    lines = [
        "## The manual",
        "",
        "Everything else, one page per topic, all in [docs/MANUAL.md](docs/MANUAL.md):",
        "",
    ]
    for name in manual_pages():
        title = _title(_page(name))
        if title and not title.startswith("The table"):
            lines.append(f"- [{title}](docs/MANUAL.md#{anchor(title)})")
    return "\n".join(lines)


def build() -> str:
    """The README text."""
    parts = [_page(n) for n in README_PAGES[:2]]
    parts.append(HEADLINE.format(anchor=anchor(_title(_page("01-benchmarks.md")))))
    parts += [_page(n) for n in README_PAGES[2:]]
    parts.append(_links())
    parts += [_page(n) for n in README_TAIL]
    return "\n\n".join(parts) + "\n"


def _relink(text: str) -> str:
    """Root-relative links and images, rewritten for docs/MANUAL.md."""
    return _LINK.sub(lambda m: f"{m.group(1)}../{m.group(2)}{m.group(3)}", text)


def build_manual() -> str:
    """The manual's text: a contents list, then every page."""
    pages = [_page(n) for n in manual_pages()]
    toc = [f"- [{_title(p)}](#{anchor(_title(p))})" for p in pages if _title(p)]
    head = [
        "# nki-kernels manual",
        "",
        "Assembled from docs/readme/*.md by scripts/build_readme.py; the short version is "
        "the [README](../README.md).",
        "",
        *toc,
    ]
    return "\n".join(head) + "\n\n" + _relink("\n\n".join(pages)) + "\n"


def main() -> int:
    README.write_text(build())
    MANUAL.write_text(build_manual())
    print(f"wrote {README} ({len(README.read_text().splitlines())} lines)")
    print(f"wrote {MANUAL} ({len(MANUAL.read_text().splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
