"""The main job: ours vs AWS's nki-library kernels vs TorchNeuron's native path.

Without options it prints the three-way tables of the whole benchmark matrix from the
committed rows (`benchmarks/data/bench_rows.jsonl`: ours and native; `peer_rows.jsonl`:
AWS's kernels), then re-prices a quick subset live and says how far the committed rows
are from it. `--reprice` re-prices every row of ours and native (`--full`: the whole
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

DATA = Path("benchmarks/data")
BENCH_ROWS = DATA / "bench_rows.jsonl"
PEER_ROWS = DATA / "peer_rows.jsonl"
DEFAULT_ROWS = Path("benchmarks/results/comparison.jsonl")
DETAILS_PAGE = "03-benchmark-details.md"  # the LNC 1 tables, next to the --markdown page
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
        "--rows",
        type=Path,
        default=DEFAULT_ROWS,
        help=f"append the live rows to this JSON-lines file (default {DEFAULT_ROWS}; '-' = none)",
    )
    parser.add_argument("--data", type=Path, default=DATA, help=f"committed rows (default {DATA})")
    parser.add_argument(
        "--measured",
        type=Path,
        metavar="FILE",
        help="measured rows (`nki-kernels hwcheck --out`) shown beside ours as 'measured "
        "(hardware)' (default benchmarks/data/measured_rows.jsonl when it exists)",
    )
    parser.add_argument("--plot", type=Path, help="draw the speedups into this PNG file")
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="PATH",
        help="write the README's table section (headline + tables) from the rows to PATH",
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
    from ..bench.peer import peer_notes, peer_rows
    from ..bench.rows import append_rows, read_rows, write_rows
    from ..bench.table import comparison_table, dropping_table
    from ..model_shapes import FINE_GRAINED_MOE, MIXTRAL_8X7B_MOE
    from ..perfmodel import COST_MODEL_VERSION

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
        print(f"no committed rows in {bench_path}; run `nki-kernels bench --reprice --full`")
        return 1
    all_rows = merge_peer(committed, peer)
    from ..bench.measured import for_bench, unmatched
    from ..perfmodel.measurements import MeasurementFileError

    try:
        measured, measured_notes = for_bench(args.measured)
    except MeasurementFileError as exc:
        print(f"bench: --measured: {exc}", file=sys.stderr)
        return 2
    commits = sorted({str(r.extra.get("nki_library_commit")) for r in peer})
    print(
        f"nki-kernels vs AWS's nki-library kernels vs TorchNeuron's native path -- modeled "
        f"(cost model {COST_MODEL_VERSION})"
        + (
            "; only the 'measured (hardware)' column holds hardware measurements.\n"
            if measured
            else "; no figure below is a hardware measurement.\n"
        )
        + f"Rows: {bench_path} and {peer_path} (nki-library {', '.join(commits) or 'none'}). "
        f"{LNC2_METHOD}.\n"
    )
    for name in names:
        fam = [r for r in all_rows if r.family == name]
        print(f"## {name}\n")
        print(comparison_table(fam, measured))
        drop = dropping_table(fam)
        if drop:
            print("\nNot a dropless baseline (tokens over capacity are dropped):\n")
            print(drop)
        print()
    for note in measured_notes + unmatched(
        measured, [(r.op, r.case, r.target, r.lnc) for r in all_rows]
    ):
        print(f"- {note}")
    print()
    notes = peer_notes(peer)
    if notes:
        print("AWS kernels that did not run through the interpreter:")
        for n in notes:
            print(f"- {n}")
        print()
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
    if live and str(args.rows) != "-":
        append_rows(args.rows, [r for r in live if not math.isnan(r.latency_us)])
        print(f"live rows appended to {args.rows}")
    if args.markdown:
        from ..bench.readme import markdown

        head, details = markdown(all_rows, COST_MODEL_VERSION, commits)
        args.markdown.write_text(head + "\n")
        more = args.markdown.with_name(DETAILS_PAGE)
        more.write_text(details + "\n")
        print(f"README table section written to {args.markdown}, LNC 1 tables to {more}")
    if args.plot:
        from ..bench.plot import speedup_chart

        speedup_chart(all_rows, args.plot)
        print(f"chart written to {args.plot}")
    return 0
