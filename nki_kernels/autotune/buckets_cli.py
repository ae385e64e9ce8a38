"""`nki-kernels buckets`: bucket boundaries for a length distribution, and a policy file.

    nki-kernels buckets --lengths FILE --max-buckets N [--align A] [--cost linear|quadratic|model]
        [--op rms_norm --shape llama3-8b --target trn2] [--write-policy FILE]

`--write-policy FILE` merges the optimal boundaries into a bucket-policy file (for `--op`,
or as the default policy); point `NKI_KERNELS_BUCKET_POLICY` at it and the ops, the config
lookup and `tune` use those boundaries. With `--cost model`, the op's heuristic config is
priced by the cost model at powers of two and their 1.5x midpoints (linear in between); a
size where it cannot be priced (the config does not fit) is left out with a note.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


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
    p.add_argument("--shape", default=None, help="model shape of --op (with --cost model)")
    p.add_argument("--target", default=None, help="with --cost model (default trn2)")
    p.add_argument("--dtype", default=None, help="with --cost model (default: the op's first)")
    p.add_argument("--json", action="store_true", help="print the plans as JSON")
    p.add_argument(
        "--write-policy", default=None, metavar="FILE", help="merge the optimal policy into FILE"
    )


def _price_sizes(top: int) -> list[int]:
    """Powers of two from 128 and their 1.5x midpoints, up to the first covering `top`."""
    out = []
    b = 128
    while True:
        out.append(b)
        if b >= top:
            return out
        if b >= 256:
            out.append(b * 3 // 2)
        b *= 2


def _model_cost(args: argparse.Namespace, top: int) -> tuple[Any, str]:
    from ..interp.errors import NkiValidationError
    from ..kernel_config import InvalidConfig
    from ..runtime.buckets import ExplicitBuckets, using_policy
    from ..targets import get_target
    from .buckets_opt import interpolated_cost
    from .families import get
    from .measure import CostModelMeasurer

    spec = get(args.op)
    shape = args.shape or spec.shapes[0]
    dtype = args.dtype or spec.dtypes[0]
    tunable, target, measurer = (
        spec.make_tunable(),
        get_target(args.target or "trn2"),
        CostModelMeasurer(),
    )
    points: dict[int, float] = {}
    skipped: list[str] = []
    label = ""
    for size in sorted(set(_price_sizes(top))):
        with using_policy(ExplicitBuckets((size,))):  # price the size itself, not its bucket
            problem = spec.make_problem(shape, size, dtype)
        config = tunable.heuristic(problem, target)
        unit, n = problem, 1
        if tunable.repricing is not None:
            unit, n = tunable.repricing(problem)  # identical units (heads): price one
        try:
            config.validate(problem, target)
            m = measurer.measure(tunable, unit, config, target)
        except (InvalidConfig, NkiValidationError) as e:
            skipped.append(f"{size} ({str(e).splitlines()[0][:80]})")
            continue
        points[size] = m.latency_ns * n
        label = m.label
    if skipped:
        print("not priced (heuristic config does not fit): " + "; ".join(skipped), file=sys.stderr)
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
    if args.max_buckets < 1:
        raise ValueError(f"--max-buckets: expected an int >= 1; got {args.max_buckets}")
    for opt, value in (("--target", args.target), ("--dtype", args.dtype), ("--shape", args.shape)):
        if kind != "model" and value is not None:  # it would change nothing: say so
            raise ValueError(
                f"{opt}: expected only with --cost model (the {kind} time model prices no "
                f"kernel); got {value!r}"
            )
    if kind == "model":
        if not args.op:
            raise ValueError("--cost model needs --op")
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
        if args.write_policy:
            from ..runtime.buckets import write_policy_file

            write_policy_file(args.write_policy, plans[0].policy(), op=args.op)
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
    if plans[0].note:
        print(plans[0].note)
    if args.write_policy:
        from ..runtime.buckets import POLICY_ENV_VAR, write_policy_file

        write_policy_file(args.write_policy, plans[0].policy(), op=args.op)
        scope = f"for {args.op}" if args.op else "as the default"
        print(f"wrote {plans[0].policy().name()} {scope} to {args.write_policy} "
              f"(use it: export {POLICY_ENV_VAR}={args.write_policy})")  # fmt: skip
    return 0
