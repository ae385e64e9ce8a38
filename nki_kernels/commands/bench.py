"""The main job: ours vs AWS's nki-library kernels vs TorchNeuron's native path.

Without options it prints a one-screen summary of the whole benchmark matrix from the
committed rows (`benchmarks/data/bench_rows.jsonl`: ours and native; `peer_rows.jsonl`:
AWS's kernels) -- per family, phase and target, geometric means with bands, and where
ours is slower -- writes the full tables and the chart to an output folder outside git's
view (`build/bench/` of the checkout), then re-prices a quick subset live and says how
far the committed rows are from it. It changes no tracked file and runs from any
directory. `--reprice` re-prices every row of ours and native (`--full`: the whole
matrix, tens of minutes; else the quick subset) and rewrites the committed file;
`--peer PATH` prices AWS's kernels from a local nki-library checkout and rewrites the peer
rows. Every figure is "modeled (cost model vN, target)"; none is a measurement.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
from pathlib import Path

NAME = "bench"
HELP = "ours vs AWS's nki-library kernels vs TorchNeuron's native path (modeled tables)"

# the checkout this package runs from (an editable install), else the working directory
_CHECKOUT = Path(__file__).resolve().parents[2]
_IN_CHECKOUT = (_CHECKOUT / "benchmarks" / "data").is_dir()
DATA = _CHECKOUT / "benchmarks" / "data" if _IN_CHECKOUT else Path("benchmarks/data")
BENCH_ROWS = DATA / "bench_rows.jsonl"
PEER_ROWS = DATA / "peer_rows.jsonl"
OUT = _CHECKOUT / "build" / "bench" if _IN_CHECKOUT else Path("nki-kernels-bench")
STALE = 0.02  # relative gap between committed and live rows that counts as stale


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..bench.compare import SUITES

    parser.add_argument(
        "--suite",
        action="append",
        choices=sorted(SUITES),
        help="only these families (repeatable; default: all)",
    )
    parser.add_argument(
        "--full", action="store_true", help="with --reprice / --peer: the whole matrix"
    )
    parser.add_argument(
        "--reprice",
        action="store_true",
        help=f"re-price ours and native and rewrite {BENCH_ROWS}",
    )
    parser.add_argument(
        "--peer",
        type=Path,
        metavar="PATH",
        help=f"price AWS's kernels from this nki-library checkout and rewrite {PEER_ROWS}",
    )
    parser.add_argument(
        "--bands",
        action="store_true",
        help="with --reprice: each row's band over the cost model's parameter sets (slower)",
    )
    parser.add_argument("--no-check", action="store_true", help="skip the live re-price check")
    parser.add_argument(
        "--out",
        type=Path,
        default=OUT,
        metavar="DIR",
        help=f"write the full tables (tables.md), the chart and the live rows here (default {OUT})",
    )
    parser.add_argument(
        "--tables", action="store_true", help="also print the full tables after the summary"
    )
    parser.add_argument(
        "--rows",
        type=Path,
        default=None,
        help="append the live rows to this JSON-lines file "
        "(default DIR/live_rows.jsonl; '-' = none)",
    )
    parser.add_argument("--data", type=Path, default=DATA, help=f"committed rows (default {DATA})")
    parser.add_argument(
        "--measured",
        type=Path,
        metavar="FILE",
        help="measured rows (`nki-kernels hwcheck --out`) shown beside ours as 'measured "
        "(hardware)' (default benchmarks/data/measured_rows.jsonl when it exists)",
    )
    parser.add_argument(
        "--plot", type=Path, help="draw the speedups into this PNG file (default DIR/speedup.png)"
    )
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="PATH",
        help="write the manual's table pages (LNC 2, then LNC 1) from the rows to PATH",
    )
    from ..ledger.cli_args import add_shape_arguments  # bench --model: ledger's pricing

    add_shape_arguments(parser, model_required=False)


def _price(names: list[str], full: bool, bands: bool = False) -> list:
    from ..bench.compare import SUITES

    rows = []
    for name in names:
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # config-store fallbacks to heuristic defaults
            got = SUITES[name].rows(full, bands)
        print(f"priced {name}: {len(got)} rows in {time.perf_counter() - t0:.0f} s", flush=True)
        rows.extend(got)
    return rows


def _check(committed: list, live: list) -> list[str]:
    """Live rows vs the committed rows of the same case: the stale ones, as text."""
    index = {
        (r.family, r.op, r.case, r.target, r.lnc, r.impl, r.extra.get("path", "")): r
        for r in committed
    }
    stale = []
    for r in live:
        old = index.get((r.family, r.op, r.case, r.target, r.lnc, r.impl, r.extra.get("path", "")))
        if old is None:
            stale.append(
                f"{r.impl} {r.op} {r.case} {r.target} LNC {r.lnc}: not in the committed rows"
            )
        elif abs(old.latency_us / r.latency_us - 1) > STALE:
            stale.append(
                f"{r.impl} {r.op} {r.case} {r.target} LNC {r.lnc}: committed "
                f"{old.latency_us:,.1f} us, now {r.latency_us:,.1f} us"
            )
    return stale


def run(args: argparse.Namespace) -> int:
    from ..ledger.cli_args import run_bench_model, wants_model

    if wants_model(args):  # bench --model: the ledger's per-model pricing
        return run_bench_model(args)
    from ..bench.compare import LNC2_METHOD, SUITES, merge_peer
    from ..bench.peer import peer_rows
    from ..bench.rows import append_rows, read_rows, write_rows
    from ..model_shapes import FINE_GRAINED_MOE, MIXTRAL_8X7B_MOE
    from ..perfmodel import COST_MODEL_VERSION

    for opt, given, needs in (("--full", args.full, args.reprice or args.peer is not None),
                              ("--bands", args.bands, args.reprice)):  # fmt: skip
        if given and not needs:  # alone it would change nothing: say so
            wants = "--reprice or --peer" if opt == "--full" else "--reprice"
            raise ValueError(f"{opt}: expected together with {wants}; got {opt} alone")
    names = args.suite or list(SUITES)
    bench_path, peer_path = args.data / BENCH_ROWS.name, args.data / PEER_ROWS.name
    if args.peer is not None:
        # --full: the whole matrix (attention at S = 32K takes ~5 min per case); else the
        # quick set (trn2; S = 2K; [16384, 4096], as the live check); either replaces only
        # its own rows
        quick = (
            {}
            if args.full
            else {
                "targets": ("trn2",),
                "seqs": (2048,),
                "norm_shapes": ((16384, 4096),),
            }
        )
        got = peer_rows(
            args.peer,
            moe_shapes=(MIXTRAL_8X7B_MOE, FINE_GRAINED_MOE),
            families=names,
            log=lambda m: print(m, flush=True),
            **quick,  # type: ignore[arg-type]
        )
        done = {(r.family, r.op, r.case, r.target, r.lnc) for r in got}
        keep = [
            r
            for r in (read_rows(peer_path) if peer_path.exists() else [])
            if (r.family, r.op, r.case, r.target, r.lnc) not in done
        ]
        write_rows(peer_path, keep + got)
        print(f"{len(got)} peer rows written to {peer_path}")
    live = []
    if args.reprice:
        live = _price(names, args.full, args.bands)
        keep = [
            r
            for r in (read_rows(bench_path) if bench_path.exists() else [])
            if r.family not in names
        ]
        if not args.full and bench_path.exists():
            # a quick re-price replaces only the rows it priced
            done = {(r.family, r.op, r.case, r.target, r.lnc) for r in live}
            keep = [
                r
                for r in read_rows(bench_path)
                if (r.family, r.op, r.case, r.target, r.lnc) not in done
            ]
        write_rows(bench_path, keep + live)
        print(f"{len(live)} rows written to {bench_path}")
    committed = [
        r for r in (read_rows(bench_path) if bench_path.exists() else []) if r.family in names
    ]
    peer = [r for r in (read_rows(peer_path) if peer_path.exists() else []) if r.family in names]
    if not committed:
        print(
            f"nki-kernels bench: error: --data: no committed rows in {bench_path} (run "
            "`nki-kernels bench --reprice --full` to price them)",
            file=sys.stderr,
        )
        return 2
    all_rows = merge_peer(committed, peer)
    from ..bench.measured import for_bench
    from ..perfmodel.measurements import MeasurementFileError
    from ..runtime.atomic_files import write_text_atomic

    try:
        measured, measured_notes = for_bench(args.measured)
    except MeasurementFileError as exc:
        print(f"bench: --measured: {exc}", file=sys.stderr)
        return 2
    commits = sorted({str(r.extra.get("nki_library_commit")) for r in peer})
    tables = _full_tables(args, names, all_rows, peer, measured, measured_notes)
    args.out.mkdir(parents=True, exist_ok=True)
    tables_path = args.out / "tables.md"
    write_text_atomic(
        tables_path,
        f"# nki-kernels bench: every table (modeled, cost model {COST_MODEL_VERSION})\n\n"
        f"Rows: {bench_path} and {peer_path} (nki-library {', '.join(commits) or 'none'}). "
        f"{LNC2_METHOD}.\n\n" + tables,
    )
    _print_summary(all_rows, bool(measured), bench_path, peer_path, commits)
    for note in measured_notes:
        print(f"- {note}")
    plot_path = args.plot or args.out / "speedup.png"
    try:
        from ..bench.plot import speedup_chart

        speedup_chart(all_rows, plot_path)
        chart = f", chart: {plot_path}"
    except ImportError:  # matplotlib is a dev extra
        chart = " (no chart: matplotlib is not installed)"
    print(f"\nfull tables: {tables_path}{chart}")
    if args.tables:
        print("\n" + tables)
    sys.stdout.flush()
    if not args.no_check and not args.reprice:
        t0 = time.perf_counter()
        live = _price(names, False)
        stale = _check(committed, live)
        print(
            f"live re-price of {len(live)} rows ({time.perf_counter() - t0:.0f} s): "
            + (
                f"{len(stale)} differ from the committed rows by > {STALE:.0%}:"
                if stale
                else "the committed rows match."
            )
        )
        for s in stale:
            print(f"- {s}")
    rows_path = args.rows if args.rows is not None else args.out / "live_rows.jsonl"
    if live and str(rows_path) != "-":
        append_rows(rows_path, [r for r in live if not math.isnan(r.latency_us)])
        print(f"live rows appended to {rows_path}")
    if args.markdown:
        from ..bench.readme import markdown

        head, details = markdown(all_rows, COST_MODEL_VERSION, commits)
        write_text_atomic(args.markdown, head + "\n\n" + details + "\n")
        print(f"the manual's table pages written to {args.markdown}")
    return 0


def _print_summary(
    rows: list, measured: bool, bench_path: Path, peer_path: Path, commits: list[str]
) -> None:
    from ..bench import summary
    from ..perfmodel import COST_MODEL_VERSION

    print(
        f"nki-kernels vs AWS's nki-library kernels vs the native path -- modeled (cost model "
        f"{COST_MODEL_VERSION}, LNC 2)"
        + (
            "; only the 'measured (hardware)' column holds hardware measurements (tables)."
            if measured
            else "; nothing here is measured."
        )
    )
    print(f"rows: {bench_path}, {peer_path} (nki-library {', '.join(commits) or 'none'})")
    print("speedup = their latency / ours (> 1: ours is faster); geometric mean over the cases\n")
    print(summary.text(summary.summarize(rows, 2, COST_MODEL_VERSION), 2))


def _full_tables(
    args: argparse.Namespace,
    names: list[str],
    all_rows: list,
    peer: list,
    measured: dict,
    measured_notes: list[str],
) -> str:
    """Every comparison table, the dropping compositions and the notes, as Markdown."""
    from ..bench.measured import unmatched
    from ..bench.peer import peer_notes
    from ..bench.table import comparison_table, dropping_table

    out: list[str] = []
    for name in names:
        fam = [r for r in all_rows if r.family == name]
        out += [f"## {name}", "", comparison_table(fam, measured), ""]
        drop = dropping_table(fam)
        if drop:
            out += ["Not a dropless baseline (tokens over capacity are dropped):", "", drop, ""]
    notes = measured_notes + unmatched(
        measured, [(r.op, r.case, r.target, r.lnc) for r in all_rows]
    )
    out += [f"- {n}" for n in notes]
    failed = peer_notes(peer)
    if failed:
        out += ["", "AWS kernels that did not run through the interpreter:", ""]
        out += [f"- {n}" for n in failed]
    return "\n".join(out) + "\n"
