"""Pricing speed of the cost model: a 1,000,000-instruction trace in under 10 s.

Run: `python benchmarks/bench_cost_model_speed.py [--instructions N] [--limit S]`.
Builds a synthetic attention-like trace (nki_kernels.perfmodel.synthetic; building it
is not timed), prices it with `estimate_trace` on one core and reports the CPU time of
this process (the limit applies to it: wall time on a shared machine also counts other
processes) and the wall time. Exit status 1 if pricing exceeds the limit.
"""

from __future__ import annotations

import argparse
import sys
import time

from nki_kernels.perfmodel import estimate_trace
from nki_kernels.perfmodel.synthetic import synthetic_trace


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instructions", type=int, default=1_000_000)
    p.add_argument("--limit", type=float, default=10.0, help="seconds allowed for pricing")
    p.add_argument("--target", default="trn2")
    args = p.parse_args(argv)
    t = time.perf_counter()
    trace = synthetic_trace(args.instructions, args.target)
    built = time.perf_counter() - t
    t, c = time.perf_counter(), time.process_time()
    est = estimate_trace(trace)
    priced, wall = time.process_time() - c, time.perf_counter() - t
    print(f"synthetic trace: {len(trace):,} instructions (built in {built:.1f} s)")
    print(
        f"priced in {priced:.2f} s CPU ({wall:.2f} s wall) = "
        f"{1e9 * priced / max(1, len(trace)):.0f} ns CPU per instruction"
    )
    print(f"  -> {est.latency_ms:.3f} ms, {est.label}; busiest engine {est.bottleneck}")
    ok = priced < args.limit
    print(f"limit {args.limit:.0f} s: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
