"""MoE layer benchmark: modeled latency, MFU and bounding resource on trn2 and trn3.

Run: `python benchmarks/bench_moe.py [--json rows.json] [--backward] [--quick]`.

Shapes: a Mixtral-8x7B-like layer (H=4096, I=14336, E=8, top-2) and a fine-grained one
(H=2048, I=1408, E=64, top-6), T in {512, 4096, 16384}, uniform and skewed routing, bf16,
one NeuronCore. The layer forward = NKI router + blockwise expert MLP with the weighted
combine (the host-side block plan is not modeled). MFU counts the routed FLOPs only,
2 * T * k * 3 * H * I, against one core's TensorE bf16 peak; padding slots are overhead.
Every figure is "modeled (cost model vN, target)" -- never a measurement. Pricing uses
representative blocks (see nki_kernels/moe/pricing.py); `check` is the relative gap
between the last two per-block increments.

Goal (issue 6): trn2, bf16, uniform routing, T = 4096, Mixtral-like: forward >= 70 % MFU.
Exit status 1 if that goal is missed. `moe_rows()` is the entry point for `make bench`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from nki_kernels.model_shapes import MOE_SHAPES, TOKEN_COUNTS
from nki_kernels.moe.pricing import layer_row
from nki_kernels.perfmodel import COST_MODEL_VERSION, modeled_label

TARGETS = ("trn2", "trn3")
ROUTINGS = ("uniform", "skewed")
GOAL = {"target": "trn2", "model": "mixtral-8x7b", "tokens": 4096, "routing": "uniform"}
GOAL_MFU_PCT = 70.0


def moe_rows(
    targets: tuple[str, ...] = TARGETS,
    tokens: tuple[int, ...] = TOKEN_COUNTS,
    routings: tuple[str, ...] = ROUTINGS,
    backward: bool = False,
) -> list[dict[str, Any]]:
    """Benchmark rows (one per target x shape x T x routing), each labeled 'modeled'."""
    rows = []
    for target in targets:
        for shape in MOE_SHAPES:
            for t in tokens:
                for kind in routings:
                    rows.append(layer_row(shape, t, kind, target, backward=backward))
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The printed report (markdown table)."""
    bwd = any("bwd_ms" in r for r in rows)
    head = (
        "| target | model | T | routing | blocks | latency ms | MFU % | bound | busiest | check |"
    )
    sep = "|---|---|---:|---|---:|---:|---:|---|---|---:|"
    if bwd:
        head += " bwd ms | bwd MFU % |"
        sep += "---:|---:|"
    lines = [head, sep]
    for r in rows:
        busy = f"{r['busiest_engine']} {r['active_pct'][r['busiest_engine']]:.0f}%"
        check = "exact" if r["priced_exactly"] else f"{100 * r['extrapolation_check']:.2f}%"
        line = (
            f"| {r['target']} | {r['model']} | {r['tokens']} | {r['routing']} | {r['blocks']} | "
            f"{r['latency_ms']:.3f} | {r['mfu_routed_pct']:.1f} | {r['roofline_bound']} | "
            f"{busy} | {check} |"
        )
        if bwd:
            line += f" {r['bwd_ms']:.3f} | {r['bwd_mfu_routed_pct']:.1f} |"
        lines.append(line)
    labels = sorted({r["label"] for r in rows})
    lines.append("")
    lines.append(
        "All figures: " + "; ".join(labels) + ". MFU on routed FLOPs, one NeuronCore, bf16."
    )
    return "\n".join(lines)


def goal_met(rows: list[dict[str, Any]]) -> tuple[bool, float | None]:
    for r in rows:
        if all(r[k] == v for k, v in GOAL.items()):
            return r["mfu_routed_pct"] >= GOAL_MFU_PCT, r["mfu_routed_pct"]
    return False, None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--json", metavar="PATH", help="also write the rows with provenance")
    p.add_argument("--backward", action="store_true", help="also price the backward kernel")
    p.add_argument("--quick", action="store_true", help="only the goal row's target and T")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.quick:
        rows = moe_rows(targets=("trn2",), tokens=(4096,), backward=args.backward)
    else:
        rows = moe_rows(backward=args.backward)
    print(
        "MoE layer forward -- "
        + ", ".join(modeled_label(t) for t in sorted({r["target"] for r in rows}))
    )
    print(format_table(rows))
    ok, mfu = goal_met(rows)
    shown = "n/a" if mfu is None else f"{mfu:.1f} %"
    print(
        f"\nGoal: trn2 bf16 uniform T=4096 Mixtral-like forward >= {GOAL_MFU_PCT:.0f} % MFU: "
        f"{'met' if ok else 'MISSED'} ({shown}, {modeled_label('trn2')})"
    )
    print(f"(cost model {COST_MODEL_VERSION}; priced in {time.perf_counter() - t0:.1f} s)")
    if args.json:
        payload = {
            "cost_model_version": COST_MODEL_VERSION,
            "timestamp": datetime.now(UTC).isoformat(timespec="seconds"),
            "rows": rows,
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
