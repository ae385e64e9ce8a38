"""Assemble README.md (one page) and docs/MANUAL.md (the manual) from docs/readme/.

Every topic keeps its page in docs/readme/<topic>.md. README.md is the short page a
newcomer reads: the overview with the support matrix and the quick start
(00-overview.md), the benchmark summary generated here from the committed rows, the
glossary, the manual's contents and the development notes. docs/MANUAL.md is every other
page in reading order (pages not listed below follow, sorted by name, so a new page is
never lost), with root-relative links outside code rewritten for its folder. Generated
here, so they cannot disagree with the data: the parity tables (from
benchmarks/results/parity/*.json), the benchmark summary and tables (from
benchmarks/data/*_rows.jsonl), the chart benchmarks/results/speedup.png (redrawn when its
data changed; the data it was drawn from is kept beside it) and every stated duration of
`make test` / `make fuzz` / `make bench` (from benchmarks/data/durations.json, see
scripts/durations.py). Run `python scripts/build_readme.py` after editing a page.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import durations  # scripts/durations.py: the measured durations of make test / fuzz / bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's nki_kernels, not an installed copy
PAGES = ROOT / "docs" / "readme"
README = ROOT / "README.md"
MANUAL = ROOT / "docs" / "MANUAL.md"
PARITY = ROOT / "benchmarks" / "results" / "parity"
PARITY_MARK = "<!-- parity-table -->"
PARITY_DIST_MARK = "<!-- parity-dist-table -->"
BENCH_MARK = "<!-- bench-tables -->"
DETAILS_MARK = "<!-- bench-details -->"
DURATIONS_MARK = "<!-- quick-start-durations -->"
MODEL_LINKS_MARK = "<!-- model-links -->"
BENCH_ROWS = ROOT / "benchmarks" / "data" / "bench_rows.jsonl"
PEER_ROWS = ROOT / "benchmarks" / "data" / "peer_rows.jsonl"
CHART_PNG = "benchmarks/results/speedup.png"
CHART_PNG_PATH = ROOT / CHART_PNG

# the README: the overview (with the support matrix and quick start), the benchmark
# summary generated from the committed rows, the glossary, the manual's contents, the
# development notes; every other page is in the manual only (nothing appears twice)
README_HEAD = ("00-overview.md",)
# after the benchmark summary: the cost ledger (one training and one serving ledger)
README_LEDGER = "ledger.md"
README_TAIL = ("glossary.md", "99-development.md")
README_ONLY = frozenset({"00-overview.md", README_LEDGER, "glossary.md", "99-development.md"})
# the manual, in reading order; sections whose top heading is '###' are lifted one level
MANUAL_ORDER = (
    "use-in-a-model.md",
    "serving.md",
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
)
LIFT = {"interpreter.md", "cost-model.md"}
# pages the README's "Use it in a model" section points to when they exist
MODEL_PAGES = (
    ("use-in-a-model.md", "patch, parity and probe in detail"),
    ("serving.md", "serving: KV caches, decode and the serving loop"),
    ("ledger.md", "what a whole model's layers cost, ours vs native vs AWS"),
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


def _measured_on(r: dict) -> str:
    """Where a report's seconds were measured (reports before 2026-12-04 did not say)."""
    env = r.get("environment") or {}
    if not env.get("date"):
        return "not recorded"
    load = env.get("load_average_1min")
    return f"{env['date']}, {env['machine']}" + ("" if load is None else f", load {load:g}")


def parity_table() -> str:
    """The summary of every parity report in benchmarks/results/parity (measured)."""
    rows = [
        "| model | dtype | steps | tolerance (fixed first) | noise floor | max abs Δloss "
        "| first divergent step | NaN/Inf grads | resume Δ | s/step torch | s/step NKI "
        "(interpreter) | NKI / torch | seconds measured on (CPU, 1-min load at start) "
        "| verdict |",
        "|---|---|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|---|:---:|",
    ]
    for path in sorted(PARITY.glob("*.json")):
        r = json.loads(path.read_text())
        first = r["first_divergent_step"]
        torch_s = r["reference"]["seconds"] / r["steps"]
        nki_s = r["candidate"]["seconds"] / r["steps"]
        rows.append(
            f"| {r['model']} | {r['dtype']} | {r['steps']} | {r['tolerance']:.2e} "
            f"| {r['floor']:.2e} | {max(r['deltas']):.2e} | {'none' if first is None else first} "
            f"| {sum(r['candidate']['nonfinite'])} | {r['resume_max_delta']:.1e} "
            f"| {torch_s:.3f} | {nki_s:.3f} | {nki_s / torch_s:.0f}x | {_measured_on(r)} "
            f"| {'PASS' if r['passed'] else 'FAIL'} |"
        )
    return "\n".join(rows)


def _floor(r: dict) -> str:
    """A --nproc report's measured noise floor ("none" in reports from before the mode
    measured one: their tolerance is the 16-ulp term)."""
    return f"{r['floor']:.2e}" if "floor" in r else "none"


def parity_dist_table() -> str:
    """The `--nproc` reports in benchmarks/results/parity/distributed (measured), a row
    per model and wrapper."""
    rows = [
        "| model | ranks | wrapper | steps | tolerance (fixed first) | noise floor "
        "| max abs Δloss | first divergent step "
        "| NaN/Inf grads | params identical on all ranks | resume Δ (fresh processes) "
        "| FSDP2 vs DDP Δ | s/step torch | s/step NKI | verdict |",
        "|---|---:|---|---:|---:|---:|---:|:---:|---:|:---:|---:|---:|---:|---:|:---:|",
    ]
    for path in sorted((PARITY / "distributed").glob("*.json")):
        r = json.loads(path.read_text())
        for w in ("ddp", "fsdp2"):
            x = r[w]
            first = x["first_divergent_step"]
            cross = max(r["fsdp2_vs_ddp_max_delta"].values())
            rows.append(
                f"| {r['model']} | {r['world_size']} | {x['wrapper']} | {r['steps']} "
                f"| {r['tolerance']:.2e} | {_floor(r)} | {x['max_delta']:.2e} "
                f"| {'none' if first is None else first} "
                f"| {sum(x['nonfinite_grads']['candidate'])} "
                f"| {'yes' if all(x['params_in_sync'].values()) else '**no**'} "
                f"| {x['resume_max_delta']:.1e} | {cross:.1e} "
                f"| {x['seconds_per_step']['reference']:.2f} "
                f"| {x['seconds_per_step']['candidate']:.2f} "
                f"| {'PASS' if x['passed'] else 'FAIL'} |"
            )
    return "\n".join(rows)


def _bench_rows() -> tuple[list, list[str]]:
    """The committed benchmark rows (ours, native and AWS's merged) and the nki-library
    commits of AWS's rows."""
    from nki_kernels.bench.compare import merge_peer
    from nki_kernels.bench.rows import read_rows

    ours, peer = read_rows(BENCH_ROWS), read_rows(PEER_ROWS)
    commits = sorted({str(r.extra.get("nki_library_commit")) for r in peer})
    return merge_peer(ours, peer), commits


def bench_pages() -> tuple[str, str]:
    """(the LNC 2 tables page, the LNC 1 details page), generated from the committed rows."""
    from nki_kernels.bench.readme import markdown
    from nki_kernels.perfmodel import COST_MODEL_VERSION

    rows, commits = _bench_rows()
    return markdown(rows, COST_MODEL_VERSION, commits)


def bench_summary() -> str:
    """The README's headline: the one-screen summary of the committed rows at LNC 2."""
    from nki_kernels.bench import summary
    from nki_kernels.perfmodel import COST_MODEL_VERSION

    rows, _ = _bench_rows()
    lines = summary.summarize(rows, 2, COST_MODEL_VERSION)
    tables = anchor(_title(_page("01-benchmarks.md")))
    return "\n".join(
        [
            "## Headline numbers (modeled)",
            "",
            "Our kernels against AWS's own NKI kernels and the native path for the same "
            "PyTorch code, per family, phase and target: geometric means of the speedup "
            "(their latency / ours; > 1: ours is faster) over the benchmark cases at LNC 2, "
            "each with its band. Every figure is **modeled (cost model "
            f"{COST_MODEL_VERSION})**, priced from the committed rows "
            "(`benchmarks/data/`); none is measured. Every case, the LNC 1 tables, how "
            f"each baseline is built and why ours loses where it does: the manual's "
            f"[benchmarks page](docs/MANUAL.md#{tables}) and its "
            "[findings](docs/MANUAL.md#findings).",
            "",
            summary.markdown(lines, 2),
            "",
            f"![speedups of ours at LNC 2, every case (modeled)]({CHART_PNG})",
        ]
    )


def _model_links() -> str:
    present = {p.name for p in PAGES.glob("*.md")}
    links = []
    for name, what in MODEL_PAGES:
        if name in present:
            title = _title(_page(name))
            where = "" if name in README_ONLY else "docs/MANUAL.md"
            links.append(f"- [{title}]({where}#{anchor(title)}): {what}")
    return "\n".join(["", *links]) if links else ""


def _page(name: str) -> str:
    text = (PAGES / name).read_text().strip()
    if PARITY_MARK in text:
        text = text.replace(PARITY_MARK, parity_table())
    if PARITY_DIST_MARK in text:
        text = text.replace(PARITY_DIST_MARK, parity_dist_table())
    if BENCH_MARK in text or DETAILS_MARK in text:
        tables, details = bench_pages()
        text = text.replace(BENCH_MARK, tables).replace(DETAILS_MARK, details)
    if DURATIONS_MARK in text:
        text = text.replace(DURATIONS_MARK, durations.quick_start_text())
    if MODEL_LINKS_MARK in text:
        text = text.replace(MODEL_LINKS_MARK, _model_links())
    for command in durations.COMMANDS:
        text = text.replace(durations.mark(command), durations.stated(command))
    return _lift(text) if name in LIFT else text


def manual_pages() -> list[str]:
    """Every manual page, in reading order, then unlisted pages by name."""
    present = {p.name for p in PAGES.glob("*.md")}
    listed = [n for n in MANUAL_ORDER if n in present]
    extra = sorted(present - set(MANUAL_ORDER) - README_ONLY)
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
    parts = [_page(n) for n in README_HEAD]
    parts.append(bench_summary())
    if (PAGES / README_LEDGER).exists():
        parts.append(_page(README_LEDGER))
    parts += [_page(README_TAIL[0]), _links()]
    parts += [_page(n) for n in README_TAIL[1:]]
    return "\n\n".join(parts) + "\n"


def _relink(text: str) -> str:
    """Root-relative links and images, rewritten for docs/MANUAL.md; code (fenced
    blocks and `spans`) is left as written, so `kernel[lnc](...)` stays code."""
    out, fence = [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        if fence or line.startswith("```"):
            out.append(line)
            continue
        parts = line.split("`")
        for i in range(0, len(parts), 2):  # even pieces are outside code spans
            parts[i] = _LINK.sub(lambda m: f"{m.group(1)}../{m.group(2)}{m.group(3)}", parts[i])
        out.append("`".join(parts))
    return "\n".join(out)


def build_manual() -> str:
    """The manual's text: a contents list, then every page."""
    pages = [_page(n) for n in manual_pages()]
    toc = [f"- [{_title(p)}](#{anchor(_title(p))})" for p in pages if _title(p)]
    head = [
        "# nki-kernels manual",
        "",
        "Assembled from docs/readme/*.md by scripts/build_readme.py; the short version, "
        "with the support matrix and the [glossary](../README.md#glossary) of the terms "
        "used here, is the [README](../README.md).",
        "",
        *toc,
    ]
    return "\n".join(head) + "\n\n" + _relink("\n\n".join(pages)) + "\n"


def main() -> int:
    from nki_kernels.bench import plot

    rows, _ = _bench_rows()
    try:
        drawn = plot.refresh_chart(rows, CHART_PNG_PATH)
    except ImportError:
        print(f"{CHART_PNG_PATH} not redrawn: matplotlib is not installed (the dev extra)")
    else:
        print(
            f"{'redrew' if drawn else 'kept'} {CHART_PNG_PATH} "
            f"(its data: {plot.data_path(CHART_PNG_PATH)})"
        )
    README.write_text(build())
    MANUAL.write_text(build_manual())
    print(f"wrote {README} ({len(README.read_text().splitlines())} lines)")
    print(f"wrote {MANUAL} ({len(MANUAL.read_text().splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
