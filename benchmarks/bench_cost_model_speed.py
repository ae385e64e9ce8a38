"""Pricing speed of the cost model: a 1,000,000-instruction trace in under 10 s, and a
band over every parameter set on a real kernel trace, compiled path against reference.

Run: `python benchmarks/bench_cost_model_speed.py [--instructions N] [--limit S]`
builds a synthetic attention-like trace (nki_kernels.perfmodel.synthetic; building it is
not timed), prices it with `estimate_trace` on one core and reports the CPU time of this
process (the limit applies to it: wall time on a shared machine also counts other
processes) and the wall time. Exit status 1 if pricing exceeds the limit.

`--band [--seq 8192] [--op fwd|bwd] [--target trn2]` traces our flash attention (one
kv-head group of Llama-3 8B, as the benchmark rows price it) and prices its band -- the
trace scheduled under every parameter set -- twice: with the reference loop
(`schedule(..., compiled=False)`, how every band was priced before the compiled path)
and with the compiled path (`perfmodel/compiled.py`: compiled once, rescheduled per
set). Prints both CPU times and checks that every set gives the same latency (exit
status 1 otherwise). Every latency printed is modeled (cost model vN, target).
"""

from __future__ import annotations

import argparse
import sys
import time

from nki_kernels.perfmodel import estimate_trace
from nki_kernels.perfmodel.synthetic import synthetic_trace


def synthetic(args: argparse.Namespace) -> int:
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


def band_speed(args: argparse.Namespace) -> int:
    from nki_kernels.attention import bench as attn
    from nki_kernels.attention.config import (
        AttentionProblem,
        FlashBwdConfig,
        FlashFwdConfig,
        with_kv_overlap,
    )
    from nki_kernels.model_shapes import LLAMA3_8B_ATTN as shape
    from nki_kernels.perfmodel import modeled_label, trace_kernel
    from nki_kernels.perfmodel.band import parameter_sets
    from nki_kernels.perfmodel.compiled import reuse_compiled
    from nki_kernels.perfmodel.timeline import schedule
    from nki_kernels.targets import get_target

    tgt = get_target(args.target)
    s, op = args.seq, args.op
    problem = AttentionProblem(s, s, shape.head_dim, 32, 8, 1, "bfloat16", "none")
    cfg = (FlashFwdConfig if op == "fwd" else FlashBwdConfig).heuristic(problem, tgt)
    if op == "fwd":
        cfg = with_kv_overlap(cfg, problem, tgt)
    kernel, kargs = attn._specs(op, s, shape, 1, 4, 1, "bfloat16", False, cfg)
    c = time.process_time()
    trace = trace_kernel(kernel, *kargs, target=tgt)
    traced = time.process_time() - c
    sets = parameter_sets(tgt)
    c = time.process_time()
    ref = [schedule(trace, t, compiled=False).latency_ns for t in sets]
    t_ref = time.process_time() - c
    c = time.process_time()
    with reuse_compiled():
        new = [schedule(trace, t).latency_ns for t in sets]
    t_new = time.process_time() - c
    print(
        f"flash attention {op} S={s}, one kv-head group, {tgt.name}: {len(trace):,} "
        f"instructions, traced in {traced:.1f} s CPU"
    )
    print(f"band over {len(sets)} parameter sets, CPU seconds (this process):")
    print(f"  reference loop (every set from scratch): {t_ref:.2f} s")
    print(f"  compiled once, rescheduled per set:      {t_new:.2f} s ({t_ref / t_new:.2f}x)")
    same = ref == new
    print(
        f"  latencies {'identical' if same else 'DIFFER'} under every set "
        f"({min(ref) / 1e6:.3f}-{max(ref) / 1e6:.3f} ms, {modeled_label(tgt.name)})"
    )
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--instructions", type=int, default=1_000_000)
    p.add_argument("--limit", type=float, default=10.0, help="seconds allowed for pricing")
    p.add_argument("--target", default="trn2")
    p.add_argument("--band", action="store_true", help="band speed on a flash attention trace")
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--op", choices=("fwd", "bwd"), default="fwd")
    args = p.parse_args(argv)
    return band_speed(args) if args.band else synthetic(args)


if __name__ == "__main__":
    sys.exit(main())
