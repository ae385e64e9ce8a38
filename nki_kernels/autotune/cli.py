"""The autotuner's commands: `tune` here, `configs` (configs_cli), `buckets` (buckets_cli).

    nki-kernels tune <op> --target trn2 --buckets 2048,8192 [--shape llama3-8b | hidden=5120]
        [--bucket-policy SPEC] [--trials N] [--storage URL] [--workers K] [--timeout S]
        [--stale-after S] [--gate improving|always|off] [--strategy auto|tpe|grid|random|full]
        [--config-dir DIR] [--regate] [--reset [STUDY]] [--lnc 1|2]
        [--rank nominal|pessimistic]

`--lnc` is the LNC the kernel is launched (and priced) at: default the LNC every op of
this process launches at (`runtime.lnc.runtime_lnc`: $NEURON_LOGICAL_NC_CONFIG, else the
target's default on a real Neuron device, else 1), so the exported configs are the ones
the calls here look up; pass `--lnc 2` to tune for a default trn2 from a CPU host. Into
a directory of your own only configs that beat the shipped ones are exported.
`--rank pessimistic` ranks configs by the slow end of the cost model's band instead of
its nominal figure.

`--storage` defaults to `$NKI_KERNELS_STORAGE` (read here, once), else an SQLite file.
Worker processes of `tune --workers K` run this module (`python -m nki_kernels.autotune.cli
--worker`) with their job in the environment (`lifecycle`). User errors (bad op, shape,
bucket, storage URL, ...) end the command with one line on stderr and exit status 2;
Ctrl-C ends it with a one-line summary and the command that resumes it (status 130).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

STRATEGIES = ("auto", "tpe", "grid", "random", "full")
GATES = ("improving", "always", "off")


class UsageError(Exception):
    """A user error of a command: printed as one line, no traceback."""


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


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}; got {text!r}") from None
        if not v > 0:
            raise argparse.ArgumentTypeError(f"expected a number >= 1; got {text!r}")
        return v

    parse.__name__ = kind.__name__
    return parse


def run_command(
    name: str, fn: Callable[[argparse.Namespace], int], args: argparse.Namespace
) -> int:
    """Run a command; user errors become one line on stderr (exit 2), no traceback."""
    from .storage import StorageError, scrub

    try:
        return fn(args)
    except (UsageError, StorageError, ValueError, LookupError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"nki-kernels {name}: error: {scrub(msg, getattr(args, 'storage', None))}",
              file=sys.stderr)  # fmt: skip
        return 2


# ---------------------------------------------------------------------------- tune
def add_tune_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `nki-kernels tune`."""
    p.add_argument("op", help="op to tune (rms_norm, add_rms_norm, layer_norm, ...)")
    p.add_argument("--target", default="trn2", help="trn1 | trn2 | trn3 (default trn2)")
    p.add_argument(
        "--buckets", type=_ints, help="bucket sizes (rows / tokens / seq), comma-separated"
    )
    p.add_argument(
        "--bucket-policy",
        default=None,
        help="bucket policy spec (e.g. explicit[384,1408,4096]); default: the op's policy "
        "($NKI_KERNELS_BUCKET_POLICY file, else the default policy)",
    )
    p.add_argument(
        "--shape",
        action="append",
        help="model name or explicit dims, e.g. hidden=5120 | E=16,top_k=4,H=2048,I=1408 | "
        "head_dim=64,q_heads=32,kv_heads=8 (repeatable; default: the op's models)",
    )
    p.add_argument("--dtype", default=None, help="dtype (default: the op's first, bfloat16)")
    p.add_argument(
        "--trials", type=_positive(int), default=None, help="distinct configs per study (>= 1)"
    )
    p.add_argument("--storage", default=None, help="study storage URL (default: SQLite file)")
    p.add_argument("--workers", type=_positive(int), default=1, help="processes per study")
    p.add_argument("--timeout", type=_positive(float), default=None, help="seconds, whole run")
    p.add_argument(
        "--stale-after",
        type=_positive(float),
        default=3600.0,
        help="seconds after which a RUNNING trial of another host counts as abandoned",
    )
    p.add_argument("--strategy", choices=STRATEGIES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--measurer", choices=("auto", "cost-model", "hardware"), default="auto")
    p.add_argument("--gate", choices=GATES, default="improving")
    p.add_argument(
        "--lnc",
        type=int,
        choices=(1, 2),
        default=None,
        help="LNC the kernel is launched and priced at (default: the target's runtime "
        "default: $NEURON_LOGICAL_NC_CONFIG, else 2 on trn2/trn3, 1 on trn1)",
    )
    p.add_argument(
        "--rank",
        choices=("nominal", "pessimistic"),
        default="nominal",
        help="rank configs by the nominal modeled latency or by the slow end of its band "
        "(the highest latency over the cost model's leave-one-out parameter sets)",
    )
    p.add_argument(
        "--config-dir", default=None, help="export here (default: $NKI_KERNELS_CONFIG_DIR)"
    )
    p.add_argument("--no-export", action="store_true", help="tune only; write no config")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--regate",
        action="store_true",
        help="re-check the selected studies' best unchecked configs with the gate, then export",
    )
    p.add_argument(
        "--reset",
        nargs="?",
        const="",
        default=None,
        metavar="STUDY",
        help="delete STUDY (a study name), or without a name the studies selected by "
        "op/--shape/--buckets, and exit",
    )


def _policy(args: argparse.Namespace) -> Any:
    from ..runtime.buckets import policy_for

    return policy_for(args.op, args.bucket_policy)


def _jobs(args: argparse.Namespace) -> list[dict[str, Any]]:
    from ..runtime.buckets import ExplicitBuckets, using_policy
    from ..targets import get_target
    from .families import get

    spec = get(args.op)
    get_target(args.target)
    shapes = args.shape or list(spec.shapes)
    dtype = args.dtype or spec.dtypes[0]
    if dtype not in spec.dtypes:
        raise UsageError(
            f"--dtype: expected one of {list(spec.dtypes)} for {args.op}; got {dtype!r}"
        )
    policy = _policy(args)
    if args.buckets:
        buckets = list(args.buckets)
    elif isinstance(policy, ExplicitBuckets):
        buckets = list(policy.boundaries)
    else:
        buckets = list(spec.standard_buckets)
    for b in buckets:
        try:
            mapped = policy.bucket(b)
        except ValueError:
            mapped = None
        if mapped != b:
            have = ",".join(str(x) for x in policy.buckets(min(b, 1 << 20))[-4:]) or "none"
            raise UsageError(
                f"--buckets: {b} is not a boundary of the bucket policy {policy.name()} "
                f"(it maps to {mapped}; boundaries up to it: ...{have}); pass --bucket-policy "
                f"with that boundary, or tune a boundary the policy has"
            )
    with using_policy(policy):
        for s in shapes:
            spec.make_problem(s, buckets[0], dtype)  # the shape's own error, one line
    lnc = tune_lnc(args)
    if lnc != 1:
        spec.tunable(lnc)  # a family tuned at LNC 1 only: its one-line error
    return [
        {"op": args.op, "shape": s, "bucket": b, "dtype": dtype, "target": args.target,
         "bucket_policy": policy.name(), "lnc": lnc, "rank": args.rank}
        for s in shapes
        for b in buckets
    ]  # fmt: skip


def tune_lnc(args: argparse.Namespace) -> int:
    """The LNC of a `tune` / `configs which` run: --lnc, else the LNC the ops of this
    process launch at (`runtime_lnc`), so both name the config a call here uses."""
    from ..runtime.lnc import runtime_lnc

    if getattr(args, "lnc", None) is not None:
        return int(args.lnc)
    return runtime_lnc(args.target)


def _tuner(job: dict[str, Any], storage: Any, options: Any, worker: int = 0) -> Any:
    from ..runtime.buckets import parse_policy, using_policy
    from ..runtime.lnc import LNC_ENV_VAR, runtime_lnc
    from ..targets import get_target
    from .families import get
    from .measure import HardwareMeasurer, select_measurer
    from .study import Tuner

    spec = get(job["op"])
    with using_policy(parse_policy(job.get("bucket_policy", "default"))):
        problem = spec.make_problem(job["shape"], job["bucket"], job["dtype"])
    lnc, target = int(job.get("lnc", 1)), get_target(job["target"])
    measurer = select_measurer(
        job.get("measurer", "auto"), bands=job.get("rank", "nominal") == "pessimistic"
    )
    if isinstance(measurer, HardwareMeasurer) and lnc != runtime_lnc(target):
        raise UsageError(
            f"--lnc: the hardware measurer launches at the runtime's LNC "
            f"({runtime_lnc(target)}, ${LNC_ENV_VAR}); got --lnc {lnc}"
        )
    return Tuner(
        spec.tunable(lnc),
        problem,
        target,
        storage=storage,
        measurer=measurer,
        options=dataclasses.replace(options, rank=job.get("rank", "nominal")),
        worker=worker,
    )


def _options(strategy: str, trials: int | None, seed: int, gate: str, stale: float) -> Any:
    from .study import TuneOptions

    # no --trials means the whole space: enumerate it rather than sample it
    if strategy == "auto" and trials is None:
        strategy = "grid"
    if strategy == "full":
        strategy = "grid"
    return TuneOptions(strategy=strategy, seed=seed, gate=gate, stale_after_s=stale)


def worker_main() -> int:
    """Entry point of one worker process of `tune --workers K` (job in the environment)."""
    import optuna

    from .lifecycle import Terminated, parent_alive, raise_on_sigterm, worker_job
    from .storage import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    job = worker_job()
    if not parent_alive():
        return 1
    opts = _options(job["strategy"], job["trials"], job["seed"], job["gate"], job["stale_after"])
    try:
        with raise_on_sigterm():
            tuner = _tuner(job, open_storage(job["storage"]), opts, worker=job["worker"])
            tuner.run(n_trials=job["trials"], timeout=job["timeout"])
    except (KeyboardInterrupt, Terminated):
        return 130
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


def resume_command(args: argparse.Namespace) -> str:
    """The `nki-kernels tune ...` command that continues this run (storage redacted)."""
    from .storage import redact

    parts = ["nki-kernels", "tune", args.op, "--target", args.target, "--lnc", str(tune_lnc(args))]
    if args.buckets:
        parts += ["--buckets", ",".join(map(str, args.buckets))]
    for s in args.shape or []:
        parts += ["--shape", s]
    for flag, value in (("--bucket-policy", args.bucket_policy), ("--dtype", args.dtype),
                        ("--trials", args.trials), ("--config-dir", args.config_dir)):  # fmt: skip
        if value is not None:
            parts += [flag, str(value)]
    if args.storage:
        parts += ["--storage", redact(args.storage)]
    if args.workers > 1:
        parts += ["--workers", str(args.workers)]
    rank = getattr(args, "rank", "nominal")
    for flag, value, default in (("--strategy", args.strategy, "auto"), ("--gate", args.gate,
                                 "improving"), ("--seed", args.seed, 0),
                                 ("--rank", rank, "nominal")):  # fmt: skip
        if value != default:
            parts += [flag, str(value)]
    if args.no_export:
        parts.append("--no-export")
    return " ".join(shlex.quote(p) for p in parts)


@contextlib.contextmanager
def _clean_stop(procs: list[Any]) -> Iterator[None]:
    from .lifecycle import raise_on_sigterm, stop

    try:
        with raise_on_sigterm():
            yield
    finally:
        stop(procs)


def _export_store(args: argparse.Namespace) -> Any:
    from ..runtime.config_store import ConfigStore, default_store

    if args.no_export:
        return None
    if args.config_dir:
        return ConfigStore([args.config_dir], args.config_dir)
    if default_store().write_dir is None:
        raise UsageError(
            "no config directory to export to; pass --config-dir DIR, set "
            "NKI_KERNELS_CONFIG_DIR, or pass --no-export"
        )
    return default_store()


def _reset(args: argparse.Namespace, storage: Any, jobs: list[dict[str, Any]]) -> int:
    import optuna

    from .study import CLAIM_SEP

    names = {s.study_name for s in storage.get_all_studies()}
    if args.reset:
        targets = [args.reset]
        if args.reset not in names:
            raise UsageError(f"--reset: no study named {args.reset!r} in this storage")
    else:
        targets = [_tuner(j, storage, _options("auto", None, 0, "off", 3600.0)).key.name
                   for j in jobs]  # fmt: skip
    for name in targets:
        doomed = [n for n in names if n == name or n.startswith(name + CLAIM_SEP)]
        for n in doomed:
            optuna.delete_study(study_name=n, storage=storage)
        print(f"deleted {name}" + (f" and {len(doomed) - 1} claim(s)" if len(doomed) > 1 else "")
              if doomed else f"no study {name}")  # fmt: skip
    return 0


def run_tune(args: argparse.Namespace) -> int:
    """`nki-kernels tune`: one study per (shape, bucket); export the best configs."""
    import optuna

    from .export import ExportRefused, ShippedIsFaster, export_best
    from .full_grid import run_full_grid
    from .lifecycle import Terminated, spawn_worker
    from .storage import STORAGE_ENV_VAR, is_shareable, normalize_url, open_storage, redact

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.storage is None:
        args.storage = os.environ.get(STORAGE_ENV_VAR) or None
    if args.strategy == "full" and args.workers > 1:
        raise UsageError("--strategy full prices the space in one process; drop --workers")
    jobs = _jobs(args)
    url = normalize_url(args.storage)
    storage = open_storage(args.storage)
    if args.reset is not None:
        return _reset(args, storage, jobs)
    store = _export_store(args)
    if args.workers > 1 and not is_shareable(storage):
        raise UsageError("--workers > 1 needs a shared --storage (not 'memory')")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    print(f"storage: {redact(url)}", file=sys.stderr)
    status = 0
    opts = _options(args.strategy, args.trials, args.seed, args.gate, args.stale_after)
    for job in jobs:
        job["measurer"] = args.measurer
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        tuner = _tuner(job, storage, opts)
        tuner.study()  # create it (and enqueue the default) before workers start
        procs: list[Any] = []
        budget = min(args.trials or tuner.space.size, tuner.space.size)
        bar = _Progress(tuner, budget, not args.no_progress and not args.regate)
        try:
            with _clean_stop(procs):
                if args.regate:
                    for rec, ok, why in tuner.regate():
                        print(f"  regate trial {rec.number}: {'passed' if ok else why}")
                elif args.strategy == "full":
                    run_full_grid(tuner)
                else:
                    payload = dict(job, storage=args.storage, strategy=args.strategy,
                                   seed=args.seed, gate=args.gate, trials=args.trials,
                                   timeout=remaining, stale_after=args.stale_after)  # fmt: skip
                    procs += [spawn_worker(dict(payload, worker=w)) for w in range(1, args.workers)]
                    tuner.run(args.trials, remaining, on_trial=_on_trial(bar))
                    while any(p.poll() is None for p in procs):
                        bar.update(tuner.report())
                        time.sleep(0.5)
        except (KeyboardInterrupt, Terminated) as e:
            bar.close()
            with contextlib.suppress(Exception):
                tuner.drop_claims()  # the abandoned trial is finished: its claim goes too
            report = tuner.report()
            best = f"best {report.best.latency_ns / 1e3:.2f} us" if report.best else "no best yet"
            why = "interrupted" if isinstance(e, KeyboardInterrupt) else "terminated"
            print(f"tune: {why}: {report.name}: {report.distinct_done}/{budget} configs, {best}; "
                  f"resume with: {resume_command(args)}", file=sys.stderr)  # fmt: skip
            return 130 if isinstance(e, KeyboardInterrupt) else 143
        finally:
            bar.close()
        report = tuner.report()
        bar.update(report)
        with contextlib.suppress(Exception):
            tuner.drop_claims()
        print(_summary(tuner, report))
        if store is not None:
            try:
                out = export_best(tuner, store)
            except ShippedIsFaster as e:
                print(f"  not exported: {e}")  # the shipped config stays in use: not an error
            except ExportRefused as e:
                print(f"  not exported: {e}", file=sys.stderr)
                status = 1
            else:
                from ..runtime.config_records import banded_us

                prov = out.provenance
                tuned = banded_us(prov.latency_ns, prov.latency_band_ns)
                dflt = banded_us(prov.default_latency_ns, prov.default_latency_band_ns)
                full = " on the full problem" if tuner.search_problem != tuner.problem else ""
                print(f"  exported to {out.path} [{out.key}]: {tuned} (default {dflt}){full} "
                      f"{prov.measurer}, {prov.rank} ranking")  # fmt: skip
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
        lines.append(
            f"  trials priced {tuner.tunable.describe(tuner.search_problem)}: a cheaper proxy "
            "with the same tiling, so 'best' and 'default' below are the proxy's latencies; "
            "the exported line re-prices both configs on the full problem "
            f"({tuner.tunable.describe(tuner.problem)})"
        )
    if best is None:
        return lines[0] + "\n  no valid config"
    slow = (
        ""
        if best.latency_hi_ns is None
        else f" (band's slow end {best.latency_hi_ns / 1e3:.2f} us)"
    )
    lines.append(f"  best      {best.latency_ns / 1e3:10.2f} us{slow} {label}  {best.config}")
    if heur is not None and heur.latency_ns is not None and heur.outcome == "ok":
        gain = heur.latency_ns / best.latency_ns
        lines.append(f"  default   {heur.latency_ns / 1e3:10.2f} us {label}  (tuned x{gain:.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m nki_kernels.autotune.cli tune|configs|buckets ...`)."""
    from .buckets_cli import add_buckets_arguments, run_buckets
    from .configs_cli import add_configs_arguments, run_configs

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        return worker_main()
    ap = argparse.ArgumentParser(prog="python -m nki_kernels.autotune.cli")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_tune_arguments(sub.add_parser("tune"))
    add_configs_arguments(sub.add_parser("configs"))
    add_buckets_arguments(sub.add_parser("buckets"))
    args = ap.parse_args(argv)
    fn = {"tune": run_tune, "configs": run_configs, "buckets": run_buckets}[args.cmd]
    return run_command(args.cmd, fn, args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
