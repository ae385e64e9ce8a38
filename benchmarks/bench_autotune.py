"""Search efficiency of the autotuner: trials TPE needs to get within 2% of the grid optimum.

For one op per kernel family and three buckets each, on the cost model (trn2):

1. the exhaustive grid: every config of the search space is validated and, if valid,
   priced (trace-only launch + cost model); the table of latencies is cached in
   `benchmarks/data/autotune_grid/` (keyed by kernel hash and cost-model version);
2. TPE (the tuner's default strategy) and random search (the baseline) run against a
   replay of that table -- the same latencies, looked up instead of re-priced -- with
   several seeds; a run's score is the number of distinct configs it evaluated until its
   best was within 2% of the grid optimum.

Reported: the grid size (all configs / valid ones), how far the heuristic default is from
the optimum, and the median / worst count over seeds for TPE as the tuner runs it (default
first), TPE from scratch ("cold": no default enqueued -- the search itself) and random
search from scratch (the baseline). Goal: TPE cold's median <= 25% of the grid.
Every latency is modeled (cost model vN, trn2); nothing here is a measurement.

    python benchmarks/bench_autotune.py [--seeds 5] [--target trn2] [--ops rms_norm,...]
        [--buckets 2048,...] [--encoding values|index|categorical] [--variants tpe_cold,...]
        [--first-seed N]

`--encoding` picks how the studies store parameters (`autotune.space`): comparing runs
of the same grid and seeds under each measures what showing values in the dashboard
costs the search.

Rows are appended to `benchmarks/data/autotune_efficiency.jsonl`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import optuna

from nki_kernels.autotune.families import get
from nki_kernels.autotune.measure import CostModelMeasurer, Measurement, Measurer
from nki_kernels.autotune.space import ENCODINGS, SearchSpace
from nki_kernels.autotune.storage import open_storage
from nki_kernels.autotune.study import TuneOptions, Tuner
from nki_kernels.interp.errors import NkiValidationError
from nki_kernels.kernel_config import InvalidConfig
from nki_kernels.perfmodel import COST_MODEL_VERSION, modeled_label
from nki_kernels.targets import get_target

DATA = Path(__file__).resolve().parent / "data"
WITHIN = 1.02
# (op, model shape, buckets): one op per kernel family
CASES = (
    ("rms_norm", "llama3-8b", (2048, 8192, 32768)),
    ("flash_attention", "llama3-8b", (2048, 8192, 32768)),
    ("moe_mlp", "fine-grained-64e", (512, 2048, 4096)),
)


def grid_table(op: str, shape: str, bucket: int, target: Any) -> dict[str, Any]:
    """{config key: latency_ns or the invalid reason} over the whole space (cached)."""
    spec = get(op)
    tunable = spec.make_tunable()
    problem = spec.make_problem(shape, bucket, spec.dtypes[0])
    path = DATA / "autotune_grid" / f"{op}-{shape}-{bucket}-{target.name}.json"
    stamp = {"kernel_hash": tunable.source_hash(), "cost_model": COST_MODEL_VERSION}
    if path.exists():
        cached = json.loads(path.read_text())
        if cached.get("stamp") == stamp:
            return cached
    measurer = CostModelMeasurer()
    space = SearchSpace(tunable.config_cls, problem, target)
    search = tunable.proxy(problem)
    table: dict[str, Any] = {}
    t0 = time.monotonic()
    for config in space.configs():
        try:
            config.validate(problem, target)
            table[config.key()] = measurer.measure(tunable, search, config, target).latency_ns
        except (InvalidConfig, NkiValidationError) as e:
            table[config.key()] = f"invalid: {e}"
    out = {"stamp": stamp, "problem": tunable.describe(problem), "size": space.size,
           "seconds": time.monotonic() - t0, "table": table}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=0, sort_keys=True))
    return out


class ReplayMeasurer(Measurer):
    """Looks latencies up in a grid table (the same numbers the cost model gave)."""

    def __init__(self, table: dict[str, Any], target: str) -> None:
        self.table = table
        self.name = f"cost-model {COST_MODEL_VERSION}"
        self.label = modeled_label(target)
        self.calls = 0

    def measure(self, tunable: Any, problem: Any, config: Any, target: Any) -> Measurement:
        self.calls += 1
        v = self.table[config.key()]
        if isinstance(v, str):
            raise InvalidConfig(v)
        return Measurement(float(v), self.label)


def trials_to_target(op: str, shape: str, bucket: int, target: Any, table: dict[str, Any],
                     strategy: str, seed: int, default_first: bool,
                     encoding: str = "values") -> int | None:  # fmt: skip
    """Distinct configs evaluated until the best is within WITHIN of the grid optimum
    (`default_first`: the heuristic default is trial 0, as in a real tuning run;
    `encoding`: how the study stores parameters, `space.ENCODINGS`)."""
    spec = get(op)
    problem = spec.make_problem(shape, bucket, spec.dtypes[0])
    best = min(v for v in table.values() if not isinstance(v, str))
    tuner = Tuner(
        spec.make_tunable(),
        problem,
        target,
        storage=open_storage("memory"),
        measurer=ReplayMeasurer(table, target.name),
        options=TuneOptions(
            strategy=strategy,
            seed=seed,
            gate="off",
            enqueue_default=default_first,
            encoding=encoding,
        ),
    )
    found: list[int] = []

    def watch(record: Any, t: Tuner) -> None:
        if found:
            return
        rep = t.report()
        if rep.best is not None and rep.best.latency_ns <= WITHIN * best:
            found.append(rep.distinct_done)

    done = 0
    while not found and done < tuner.space.size:
        rep = tuner.run(n_trials=min(tuner.space.size, done + 10), on_trial=watch)
        done = rep.distinct_done
    return found[0] if found else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--target", default="trn2")
    ap.add_argument("--ops", default=None, help="comma-separated subset of the ops")
    ap.add_argument("--buckets", default=None, help="comma-separated subset of the buckets")
    ap.add_argument(
        "--encoding",
        default="values",
        choices=ENCODINGS,
        help="how studies store parameters (values: as the dashboard shows them)",
    )
    ap.add_argument(
        "--variants",
        default="tpe,tpe_cold,random_cold",
        help="comma-separated subset of tpe, tpe_cold, random_cold",
    )
    ap.add_argument("--first-seed", type=int, default=0)  # fmt: skip
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    target = get_target(args.target)
    only = set(args.ops.split(",")) if args.ops else None
    only_buckets = {int(b) for b in args.buckets.split(",")} if args.buckets else None
    rows = []
    label = modeled_label(target.name)
    print(f"search efficiency, {label}: distinct configs evaluated until within 2% of the "
          f"grid optimum (median/worst of {args.seeds} seeds); "
          "default = heuristic vs optimum")  # fmt: skip
    print(f"{'op':<16}{'bucket':>7}{'grid':>6}{'valid':>6}{'default':>9}"
          f"{'TPE':>9}{'TPE cold':>10}{'random':>10}{'cold/grid':>10}")  # fmt: skip
    every = (("tpe", "tpe", True), ("tpe_cold", "tpe", False), ("random_cold", "random", False))
    variants = tuple(v for v in every if v[0] in args.variants.split(","))
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    for op, shape, buckets in CASES:
        if only and op not in only:
            continue
        spec = get(op)
        for bucket in buckets:
            if only_buckets and bucket not in only_buckets:
                continue
            g = grid_table(op, shape, bucket, target)
            table = g["table"]
            lat = [v for v in table.values() if not isinstance(v, str)]
            optimum = min(lat)
            problem = spec.make_problem(shape, bucket, spec.dtypes[0])
            default = table[spec.make_tunable().heuristic(problem, target).key()]
            gap = default / optimum - 1 if not isinstance(default, str) else float("nan")
            res = {}
            counts_by_variant = {}
            for name, strategy, first in variants:
                counts = [
                    trials_to_target(
                        op, shape, bucket, target, table, strategy, s, first, args.encoding
                    )
                    for s in seeds
                ]
                counts_by_variant[name] = counts
                ok = [c for c in counts if c is not None]
                res[name] = (statistics.median(ok), max(ok)) if ok else (None, None)
            cold = res.get("tpe_cold", (None, None))[0]
            frac = cold / g["size"] if cold else float("nan")
            cell = {k: f"{v[0]:g}/{v[1]}" for k, v in res.items()}
            print(f"{op:<16}{bucket:>7}{g['size']:>6}{len(lat):>6}{gap:>+9.1%}"
                  f"{cell.get('tpe', '-'):>9}{cell.get('tpe_cold', '-'):>10}"
                  f"{cell.get('random_cold', '-'):>10}{frac:>10.1%}", flush=True)  # fmt: skip
            rows.append({
                "bench": "autotune_efficiency", "op": op, "shape": shape, "bucket": bucket,
                "target": target.name, "label": label, "grid": g["size"], "valid": len(lat),
                "optimum_ns": optimum, "default_gap": gap,
                **{f"{k}_median": v[0] for k, v in res.items()},
                **{f"{k}_worst": v[1] for k, v in res.items()},
                "tpe_cold_fraction": frac, "seeds": args.seeds, "within": WITHIN,
                "first_seed": args.first_seed, "encoding": args.encoding,
                "counts": counts_by_variant,
                "problem": g["problem"], "kernel_hash": g["stamp"]["kernel_hash"],
                "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            })  # fmt: skip
    out = DATA / "autotune_efficiency.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
