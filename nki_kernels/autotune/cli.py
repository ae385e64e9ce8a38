"""The autotuner's commands: `tune`, `configs show|diff`, `buckets`.

    nki-kernels tune <op> --target trn2 --buckets 2048,8192 [--shape llama3-8b]
        [--trials N] [--storage URL] [--workers K] [--timeout S] [--config-dir DIR]
    nki-kernels configs show [--target trn2] [--op rms_norm] [--config-dir DIR]
    nki-kernels configs diff DIR_A DIR_B [--target trn2] [--op rms_norm]
    nki-kernels buckets --lengths FILE --max-buckets N [--cost linear|quadratic]
        [--op rms_norm --shape llama3-8b --target trn2]

The `nki_kernels.commands` modules `tune`, `configs` and `buckets` expose these to the
`nki-kernels` dispatcher. Worker processes of `tune --workers K` run this module with a
JSON job (`python -m nki_kernels.autotune.cli --worker JOB`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

STRATEGIES = ("auto", "tpe", "grid", "random")


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers; got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers; got {text!r}")
    return values


# ---------------------------------------------------------------------------- tune
def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `nki-kernels tune`."""
    p.add_argument("op", help="op to tune (rms_norm, add_rms_norm, layer_norm, ...)")
    p.add_argument("--target", default="trn2", help="trn1 | trn2 | trn3 (default trn2)")
    p.add_argument(
        "--buckets", type=_ints, help="bucket sizes (rows / tokens / seq), comma-separated"
    )
    p.add_argument("--shape", action="append", help="model shape name (repeatable; default: all)")
    p.add_argument("--dtype", default=None, help="dtype (default: the op's first, bfloat16)")
    p.add_argument(
        "--trials", type=int, default=None, help="distinct configs per study (default: all)"
    )
    p.add_argument("--storage", default=None, help="study storage URL (default: SQLite file)")
    p.add_argument("--workers", type=int, default=1, help="worker processes per study")
    p.add_argument("--timeout", type=float, default=None, help="seconds for the whole command")
    p.add_argument("--strategy", choices=STRATEGIES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--measurer", choices=("auto", "cost-model", "hardware"), default="auto")
    p.add_argument("--gate", choices=("always", "improving", "off"), default="always")
    p.add_argument(
        "--config-dir", default=None, help="export here (default: $NKI_KERNELS_CONFIG_DIR)"
    )
    p.add_argument("--no-export", action="store_true", help="tune only; write no config")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    from .families import get

    spec = get(args.op)
    shapes = args.shape or list(spec.shapes)
    for s in shapes:
        if s not in spec.shapes:
            raise SystemExit(
                f"--shape: expected one of {list(spec.shapes)} for {args.op}; got {s!r}"
            )
    buckets = args.buckets or list(spec.standard_buckets)
    dtype = args.dtype or spec.dtypes[0]
    return [
        {"op": args.op, "shape": s, "bucket": b, "dtype": dtype, "target": args.target}
        for s in shapes
        for b in buckets
    ]


def _tuner(job: dict[str, Any], storage_url: str | None, options: Any, worker: int = 0) -> Any:
    from ..targets import get_target
    from .families import get
    from .measure import select_measurer
    from .storage import open_storage
    from .study import Tuner

    spec = get(job["op"])
    problem = spec.make_problem(job["shape"], job["bucket"], job["dtype"])
    return Tuner(
        spec.make_tunable(),
        problem,
        get_target(job["target"]),
        storage=open_storage(storage_url),
        measurer=select_measurer(job.get("measurer", "auto")),
        options=options,
        worker=worker,
    )


def _options(args: argparse.Namespace) -> Any:
    from .study import TuneOptions

    # no --trials means the whole space: enumerate it rather than sample it
    strategy = "grid" if args.strategy == "auto" and args.trials is None else args.strategy
    return TuneOptions(strategy=strategy, seed=args.seed, gate=args.gate)


def _spawn_worker(
    job: dict[str, Any], args: argparse.Namespace, worker: int, timeout: float | None
) -> subprocess.Popen:
    payload = dict(job, storage=args.storage, strategy=args.strategy, seed=args.seed,
                   gate=args.gate, measurer=args.measurer, trials=args.trials,
                   timeout=timeout, worker=worker)  # fmt: skip
    cmd = [sys.executable, "-m", "nki_kernels.autotune.cli", "--worker", json.dumps(payload)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL)


def worker_main(payload: str) -> int:
    """Entry point of one worker process of `tune --workers K`."""
    import optuna

    from .study import TuneOptions

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    job = json.loads(payload)
    strategy = job["strategy"]
    if strategy == "auto" and job["trials"] is None:
        strategy = "grid"
    opts = TuneOptions(strategy=strategy, seed=job["seed"], gate=job["gate"])
    tuner = _tuner(job, job["storage"], opts, worker=job["worker"])
    tuner.run(n_trials=job["trials"], timeout=job["timeout"])
    return 0


class _Progress:
    """Progress bar of one study: trials done, best so far, invalid / rejected counts."""

    def __init__(self, tuner: Any, budget: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=budget, desc=tuner.key.name.split("@")[0], unit="cfg",
                            file=sys.stderr, dynamic_ncols=True)  # fmt: skip

    def update(self, report: Any) -> None:
        if self.bar is None:
            return
        from .study import INVALID, REJECTED

        self.bar.n = min(report.distinct_done, self.bar.total)
        best = f"{report.best.latency_ns / 1e3:.2f} us" if report.best else "-"
        self.bar.set_postfix_str(
            f"best {best} | invalid {report.count(INVALID)} | rejected {report.count(REJECTED)}"
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _on_trial(bar: _Progress) -> Any:
    return lambda _record, tuner: bar.update(tuner.report())


def run_tune(args: argparse.Namespace) -> int:
    """`nki-kernels tune`: one study per (shape, bucket); export the best configs."""
    import optuna

    from ..runtime.config_store import ConfigStore, default_store
    from .export import ExportRefused, export_best
    from .storage import is_shareable, normalize_url, redact

    if args.workers < 1:
        raise SystemExit(f"--workers: expected >= 1; got {args.workers}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = None
    if not args.no_export:
        if args.config_dir:
            store = ConfigStore([args.config_dir], args.config_dir)
        elif default_store().write_dir is None:
            raise SystemExit(
                "tune: no config directory to export to; pass --config-dir DIR, set "
                "NKI_KERNELS_CONFIG_DIR, or pass --no-export"
            )
        else:
            store = default_store()
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    print(f"storage: {redact(normalize_url(args.storage))}", file=sys.stderr)
    status = 0
    for job in _jobs(args):
        job["measurer"] = args.measurer
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        tuner = _tuner(job, args.storage, _options(args))
        if args.workers > 1 and not is_shareable(tuner.storage):
            raise SystemExit("--workers > 1 needs a shared --storage (not 'memory')")
        tuner.study()  # create it (and enqueue the default) before workers start
        procs = [_spawn_worker(job, args, w, remaining) for w in range(1, args.workers)]
        budget = min(args.trials or tuner.space.size, tuner.space.size)
        bar = _Progress(tuner, budget, not args.no_progress)
        try:
            report = tuner.run(args.trials, remaining, on_trial=_on_trial(bar))
            for p in procs:
                while p.poll() is None:
                    bar.update(tuner.report())
                    time.sleep(0.5)
            report = tuner.report()
            bar.update(report)
        finally:
            bar.close()
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        print(_summary(tuner, report))
        if store is not None:
            try:
                out = export_best(tuner, store)
            except ExportRefused as e:
                print(f"  not exported: {e}", file=sys.stderr)
                status = 1
            else:
                prov = out.provenance
                tuned, dflt = prov.latency_ns / 1e3, prov.default_latency_ns / 1e3
                print(f"  exported to {out.path} [{out.key}]: {tuned:.2f} us "
                      f"(default {dflt:.2f} us) {prov.measurer}")  # fmt: skip
        if deadline is not None and time.monotonic() >= deadline:
            print("tune: --timeout reached", file=sys.stderr)
            break
    return status


def _summary(tuner: Any, report: Any) -> str:
    from .study import ERROR, INVALID, REJECTED

    best, heur = report.best, report.heuristic
    label = best.label if best and best.label else tuner.measurer.name
    lines = [
        f"{report.name}: {report.distinct_done}/{report.space_size} configs, "
        f"{report.count(INVALID)} invalid, {report.count(REJECTED)} rejected (wrong output), "
        f"{report.count(ERROR)} errors, {report.duplicates} duplicate proposals"
    ]
    if tuner.search_problem != tuner.problem:
        lines.append(f"  trials priced {tuner.tunable.describe(tuner.search_problem)}")
    if best is None:
        return lines[0] + "\n  no valid config"
    lines.append(f"  best      {best.latency_ns / 1e3:10.2f} us {label}  {best.config}")
    if heur is not None and heur.latency_ns is not None and heur.outcome == "ok":
        gain = heur.latency_ns / best.latency_ns
        lines.append(f"  default   {heur.latency_ns / 1e3:10.2f} us {label}  (tuned x{gain:.3f})")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- configs
def add_configs_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `nki-kernels configs`."""
    sub = p.add_subparsers(dest="configs_cmd", metavar="show|summary|diff", required=True)
    show = sub.add_parser("show", help="list stored tuned configs with their provenance")
    show.add_argument("--target", default=None)
    show.add_argument("--op", default=None)
    show.add_argument("--config-dir", default=None, help="a user dir (default: env + shipped)")
    show.add_argument("--markdown", action="store_true", help="one markdown table row per entry")
    summ = sub.add_parser(
        "summary", help="markdown table: tuned vs default latency per op, bucket and target"
    )
    summ.add_argument("--op", default=None)
    summ.add_argument("--config-dir", default="shipped", help="default: the packaged configs")
    diff = sub.add_parser("diff", help="compare two config directories ('shipped' = packaged)")
    diff.add_argument("a")
    diff.add_argument("b")
    diff.add_argument("--target", default=None)
    diff.add_argument("--op", default=None)


def _dirs(arg: str | None) -> list[Path]:
    from ..runtime.config_store import SHIPPED_DIR, default_store

    if arg is None:
        return list(default_store().search_dirs)
    return [SHIPPED_DIR if arg == "shipped" else Path(arg)]


def _files(directory: Path, target: str | None, op: str | None) -> dict[tuple[str, str], Path]:
    out = {}
    for path in sorted(directory.glob("*/*.json")):
        t, o = path.parent.name, path.stem
        if (target is None or t == target) and (op is None or o == op):
            out[(t, o)] = path
    return out


def _entries(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    return dict(data.get("entries", {}))


def _current_hash(op: str) -> str | None:
    from .families import OPS

    if op not in OPS:
        return None
    try:
        return OPS[op].make_tunable().source_hash()
    except Exception:
        return None


def _compact_problem(key: str) -> str:
    """A problem key without the fields every shipped entry shares (bf16, weighted)."""
    parts = [p for p in key.split(",") if p not in ("dtype=bfloat16", "affine=w", "batch=1")]
    return ", ".join(parts)


def _configs_summary(directory: Path, op: str | None) -> list[str]:
    files = _files(directory, None, op)
    targets = sorted({t for t, _ in files})
    rows: dict[tuple[str, str], dict[str, str]] = {}
    speedups: list[float] = []
    measurers: set[str] = set()
    for (t, o), path in files.items():
        current = _current_hash(o)
        for key, entry in _entries(path).items():
            prov = entry.get("provenance", {})
            lat, dflt = prov.get("latency_ns", math.nan), prov.get("default_latency_ns", math.nan)
            stale = "" if current is None or prov.get("kernel_hash") == current else " STALE"
            speedups.append(dflt / lat)
            # "modeled (cost model v1, trn2; one of 8 units, x8)" -> "modeled (cost model v1, trn2)"
            measurers.add(re.sub(r";[^)]*\)", ")", str(prov.get("measurer", "unlabeled"))))
            cell = f"{dflt / 1e3:.1f} → {lat / 1e3:.1f} (x{dflt / lat:.2f}){stale}"
            rows.setdefault((o, key), {})[t] = cell
    head = ["op", "bucketed problem", *(f"{t}: default → tuned, us" for t in targets)]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (o, key), cells in sorted(rows.items(), key=lambda kv: (kv[0][0], _natural((kv[0][1], 0)))):
        out.append(
            f"| {o} | {_compact_problem(key)} | "
            + " | ".join(cells.get(t, "–") for t in targets)
            + " |"
        )
    if speedups:
        gm = math.exp(sum(math.log(x) for x in speedups) / len(speedups))
        out.append("")
        out.append(
            f"{len(speedups)} entries; speedup geomean x{gm:.3f}, max x{max(speedups):.2f}, "
            f"min x{min(speedups):.2f}. Latencies: " + "; ".join(sorted(measurers)) + "."
        )
    return out


def run_configs(args: argparse.Namespace) -> int:
    """`nki-kernels configs show|summary|diff`."""
    if args.configs_cmd == "summary":
        lines = _configs_summary(_dirs(args.config_dir)[0], args.op)
        print("\n".join(lines) if len(lines) > 2 else "no stored configs")
        return 0
    if args.configs_cmd == "show":
        from .export import describe_entry

        found = False
        if args.markdown:
            print("| op | target | bucketed problem | default (us) | tuned (us) | speedup | "
                  "tuned config | measurer |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
        for d in _dirs(args.config_dir):
            for (t, o), path in _files(d, args.target, args.op).items():
                found = True
                current = _current_hash(o)
                if not args.markdown:
                    print(f"{path}  ({t}, {o})")
                for key, entry in sorted(_entries(path).items(), key=_natural):
                    h = entry.get("provenance", {}).get("kernel_hash")
                    stale = "" if current is None or h == current else "  STALE (kernel changed)"
                    if args.markdown:
                        print(_markdown_row(o, t, key, entry, stale))
                    else:
                        print(f"  {key}\n    {describe_entry(entry)}{stale}")
        if not found:
            print("no stored configs", file=sys.stderr)
        return 0
    fa = _files(_dirs(args.a)[0], args.target, args.op)
    fb = _files(_dirs(args.b)[0], args.target, args.op)
    changes = 0
    for to in sorted(set(fa) | set(fb)):
        ea = _entries(fa[to]) if to in fa else {}
        eb = _entries(fb[to]) if to in fb else {}
        for key in sorted(set(ea) | set(eb)):
            line = _diff_line(ea.get(key), eb.get(key))
            if line:
                changes += 1
                print(f"{to[0]}/{to[1]} {key}: {line}")
    print(f"{changes} difference(s)")
    return 0


def _natural(item: tuple[str, Any]) -> list[tuple[str, int, str]]:
    """Sort key of a problem key: numeric fields compare as numbers."""
    out = []
    for part in item[0].split(","):
        name, _, value = part.partition("=")
        out.append((name, int(value), "") if value.isdigit() else (name, -1, value))
    return out


def _markdown_row(op: str, target: str, key: str, entry: dict[str, Any], stale: str) -> str:
    prov = entry.get("provenance", {})
    lat, dflt = prov.get("latency_ns", math.nan), prov.get("default_latency_ns", math.nan)
    cfg = ", ".join(f"{k}={v}" for k, v in entry.get("config", {}).items())
    return (
        f"| {op} | {target} | {key} | {dflt / 1e3:.1f} | {lat / 1e3:.1f} | "
        f"{dflt / lat:.3f}x | {cfg} | {prov.get('measurer', '?')}{stale} |"
    )


def _diff_line(a: dict[str, Any] | None, b: dict[str, Any] | None) -> str:
    if a is None or b is None:
        return "only in " + ("B" if a is None else "A")
    ca, cb = a.get("config", {}), b.get("config", {})
    fields = [
        f"{k}: {ca.get(k)} -> {cb.get(k)}"
        for k in sorted(set(ca) | set(cb))
        if ca.get(k) != cb.get(k)
    ]
    la = a.get("provenance", {}).get("latency_ns", math.nan)
    lb = b.get("provenance", {}).get("latency_ns", math.nan)
    if not fields and la == lb:
        return ""
    lat = f"latency {la / 1e3:.2f} -> {lb / 1e3:.2f} us"
    return "; ".join([*fields, lat])


# ---------------------------------------------------------------------------- buckets
def add_buckets_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `nki-kernels buckets`."""
    p.add_argument("--lengths", required=True, help="file: one length per line, or 'length count'")
    p.add_argument("--max-buckets", type=int, required=True, help="compiled variants allowed")
    p.add_argument("--align", type=int, default=1, help="boundaries are multiples of this")
    p.add_argument(
        "--cost",
        choices=("linear", "quadratic", "model"),
        default=None,
        help="time model: t(b) ~ b, ~ b^2, or the cost model of --op (default with --op)",
    )
    p.add_argument("--op", default=None, help="price buckets with this op's cost model")
    p.add_argument("--shape", default=None, help="model shape of --op")
    p.add_argument("--target", default="trn2")
    p.add_argument("--dtype", default=None)
    p.add_argument("--json", action="store_true", help="print the plans as JSON")


def _model_cost(args: argparse.Namespace, top: int) -> tuple[Any, str]:
    from ..runtime.buckets import DEFAULT_POLICY
    from ..targets import get_target
    from .buckets_opt import interpolated_cost
    from .families import get
    from .measure import CostModelMeasurer

    spec = get(args.op)
    shape = args.shape or spec.shapes[0]
    dtype = args.dtype or spec.dtypes[0]
    tunable, target, measurer = spec.make_tunable(), get_target(args.target), CostModelMeasurer()
    sizes = sorted(
        set(DEFAULT_POLICY.buckets(top)) | {1 << e for e in range(7, top.bit_length() + 1)}
    )
    points: dict[int, float] = {}
    label = ""
    for size in sizes:
        problem = spec.make_problem(shape, size, dtype)
        config = tunable.heuristic(problem, target)
        m = measurer.measure(tunable, problem, config, target)
        points[size] = m.latency_ns
        label = m.label
    desc = (
        f"{label}: {args.op} {shape} {dtype}, heuristic configs at {len(points)} sizes, "
        "linear in between"
    )
    return interpolated_cost(points), desc


def run_buckets(args: argparse.Namespace) -> int:
    """`nki-kernels buckets`: optimal boundaries vs the default and power-of-two policies."""
    from ..runtime.buckets import DEFAULT_POLICY
    from .buckets_opt import (
        LengthDistribution,
        evaluate,
        linear_cost,
        optimize,
        power_of_two_plan,
        quadratic_cost,
    )

    dist = LengthDistribution.from_file(args.lengths)
    kind = args.cost or ("model" if args.op else "linear")
    if kind == "model":
        if not args.op:
            raise SystemExit("buckets: --cost model needs --op")
        cost, desc = _model_cost(args, dist.max_length)
    elif kind == "quadratic":
        cost, desc = quadratic_cost(), "t(b) = b^2 (relative units)"
    else:
        cost, desc = linear_cost(), "t(b) = b (relative units)"
    plans = [optimize(dist, args.max_buckets, cost, align=args.align)]
    try:
        plans.append(evaluate(dist, DEFAULT_POLICY, cost, name=f"default {DEFAULT_POLICY.name()}"))
    except ValueError as e:
        print(f"default policy not evaluated: {e}", file=sys.stderr)
    plans.append(power_of_two_plan(dist, cost))
    if args.json:
        print(json.dumps({"time_model": desc, "plans": [p.__dict__ for p in plans]}, indent=1))
        return 0
    print(f"{dist.total} observed lengths ({len(dist.lengths)} distinct, max {dist.max_length}); "
          f"time model: {desc}")  # fmt: skip
    base = plans[1].expected_time if len(plans) > 2 else plans[-1].expected_time
    unit = "E[t] us" if kind == "model" else "E[t]"
    scale = 1e-3 if kind == "model" else 1.0
    print(f"{'plan':<34} {'buckets':>7} {unit:>14} {'vs default':>10} {'padding':>8}")
    for p in plans:
        print(f"{p.name:<34} {len(p.boundaries):>7} {p.expected_time * scale:>14.6g} "
              f"{p.expected_time / base:>9.3f}x {p.padding_waste:>7.1%}")  # fmt: skip
    print("optimal boundaries: " + ",".join(str(b) for b in plans[0].boundaries))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m nki_kernels.autotune.cli tune|configs|buckets ...`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1])
    ap = argparse.ArgumentParser(prog="python -m nki_kernels.autotune.cli")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_tune_arguments(sub.add_parser("tune"))
    add_configs_arguments(sub.add_parser("configs"))
    add_buckets_arguments(sub.add_parser("buckets"))
    args = ap.parse_args(argv)
    return {"tune": run_tune, "configs": run_configs, "buckets": run_buckets}[args.cmd](args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
