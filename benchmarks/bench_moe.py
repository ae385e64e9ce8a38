"""MoE layer benchmark: modeled latency, MFU and bounding resource on trn2 and trn3.

Run: `python benchmarks/bench_moe.py [--json rows.json] [--backward] [--quick] [--markdown]
[--no-bands]`.
The forward table takes ~1 min; `--backward` adds the op's backward (router recompute +
expert backward + router backward) and takes several minutes (a Mixtral backward block
interprets ~50k instructions; pricing traces 1..4 blocks per target and T).

Shapes: a Mixtral-8x7B-like layer (H=4096, I=14336, E=8, top-2) and a fine-grained one
(H=2048, I=1408, E=64, top-6), T in {512, 4096, 16384}, uniform and skewed routing, bf16,
one NeuronCore. The layer forward = NKI router + blockwise expert MLP with the weighted
combine (the host-side block plan is not modeled). MFU counts the routed FLOPs only,
2 * T * k * 3 * H * I, against one core's TensorE bf16 peak; padding slots are overhead.
Every figure is "modeled (cost model vN, target)" -- never a measurement -- and, unless
`--no-bands`, carries its band over the cost model's parameter sets (`--markdown`
prints them; ~6x the pricing). Pricing uses
representative blocks (see nki_kernels/moe/pricing.py); `check` is the relative gap
between the last two per-block increments.

Goals (trn2, bf16, uniform routing, T = 4096): Mixtral-like forward >= 70 % MFU (issue 6),
backward >= 45 % MFU (with --backward); fine-grained forward >= 55 % MFU. Exit status 1
if one of the goals that were priced is missed. `moe_rows()` is the entry point for
`make bench`.
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
from nki_kernels.perfmodel.band import format_band

TARGETS = ("trn2", "trn3")
ROUTINGS = ("uniform", "skewed")
GOAL = {"target": "trn2", "model": "mixtral-8x7b", "tokens": 4096, "routing": "uniform"}
GOAL_MFU_PCT = 70.0
# (row selector, row key, minimum %, description)
GOALS = (
    (GOAL, "mfu_routed_pct", GOAL_MFU_PCT, "Mixtral-like forward"),
    (GOAL, "bwd_mfu_routed_pct", 45.0, "Mixtral-like backward"),
    ({**GOAL, "model": "fine-grained-64e"}, "mfu_routed_pct", 55.0, "fine-grained forward"),
)


def moe_rows(
    targets: tuple[str, ...] = TARGETS,
    tokens: tuple[int, ...] = TOKEN_COUNTS,
    routings: tuple[str, ...] = ROUTINGS,
    backward: bool = False,
    bands: bool = False,
) -> list[dict[str, Any]]:
    """Benchmark rows (one per target x shape x T x routing), each labeled 'modeled';
    `bands`: each latency with its band over the cost model's parameter sets."""
    rows = []
    for target in targets:
        for shape in MOE_SHAPES:
            for t in tokens:
                for kind in routings:
                    rows.append(layer_row(shape, t, kind, target, backward=backward, bands=bands))
    return rows


# columns whose cells are text (left-aligned); every other column is a number
_TEXT_COLUMNS = {"target", "model", "routing", "bound", "busiest", "fwd busiest", "bwd busiest"}


def _header(cols: tuple[str, ...], bwd_cols: tuple[str, ...], bwd: bool) -> list[str]:
    """A markdown table's header and separator lines (with the backward's columns if
    `bwd`)."""
    names = cols + (bwd_cols if bwd else ())
    sep = "".join("---|" if c in _TEXT_COLUMNS else "---:|" for c in names)
    return ["| " + " | ".join(names) + " |", "|" + sep]


def _with_band(ms: float, mfu: float, band: list[float] | None) -> tuple[str, str]:
    """'12.04 (11.9–12.3)' and its MFU '38.1 (37.3–38.5)' (MFU falls as latency grows)."""
    if not band:
        return f"{ms:.2f}", f"{mfu:.1f}"
    lo, hi = band
    return format_band(ms, lo, hi, "", 2), format_band(mfu, mfu * ms / hi, mfu * ms / lo, "", 1)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The README's table: forward (and backward) latency and MFU with their bands."""
    bwd = any("bwd_ms" in r for r in rows)
    lines = _header(
        ("target", "model", "T", "routing", "blocks", "fwd ms", "fwd MFU %", "fwd busiest"),
        ("bwd blocks", "bwd ms", "bwd MFU %", "bwd busiest"),
        bwd,
    )
    for r in rows:
        eng = r["busiest_engine"]
        ms, mfu = _with_band(r["latency_ms"], r["mfu_routed_pct"], r.get("latency_band_ms"))
        line = (
            f"| {r['target']} | {r['model']} | {r['tokens']} | {r['routing']} | {r['blocks']} | "
            f"{ms} | {mfu} | {eng} {r['active_pct'][eng]:.0f}% |"
        )
        if bwd:
            beng = r["bwd_busiest_engine"]
            bms, bmfu = _with_band(r["bwd_ms"], r["bwd_mfu_routed_pct"], r.get("bwd_band_ms"))
            line += (
                f" {r['bwd_blocks']} | {bms} | {bmfu} | {beng} {r['bwd_active_pct'][beng]:.0f}% |"
            )
        lines.append(line)
    return "\n".join(lines)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The printed report (markdown table)."""
    bwd = any("bwd_ms" in r for r in rows)
    lines = _header(
        (
            "target",
            "model",
            "T",
            "routing",
            "blocks",
            "latency ms",
            "MFU %",
            "bound",
            "busiest",
            "check",
        ),
        ("bwd blocks", "bwd ms", "bwd MFU %", "bwd busiest", "bwd check"),
        bwd,
    )
    for r in rows:
        busy = f"{r['busiest_engine']} {r['active_pct'][r['busiest_engine']]:.0f}%"
        check = "exact" if r["priced_exactly"] else f"{100 * r['extrapolation_check']:.2f}%"
        line = (
            f"| {r['target']} | {r['model']} | {r['tokens']} | {r['routing']} | {r['blocks']} | "
            f"{_with_band(r['latency_ms'], r['mfu_routed_pct'], r.get('latency_band_ms'))[0]} | "
            f"{r['mfu_routed_pct']:.1f} | {r['roofline_bound']} | "
            f"{busy} | {check} |"
        )
        if bwd:
            eng = r["bwd_busiest_engine"]
            bcheck = 100 * r["bwd_extrapolation_check"]
            line += (
                f" {r['bwd_blocks']} | "
                f"{_with_band(r['bwd_ms'], r['bwd_mfu_routed_pct'], r.get('bwd_band_ms'))[0]} | "
                f"{r['bwd_mfu_routed_pct']:.1f} | "
                f"{eng} {r['bwd_active_pct'][eng]:.0f}% | {bcheck:.2f}% |"
            )
        lines.append(line)
    labels = sorted({r["label"] for r in rows})
    lines.append("")
    lines.append(
        "All figures: " + "; ".join(labels) + ". MFU on routed FLOPs, one NeuronCore, bf16."
    )
    return "\n".join(lines)


def goal_met(rows: list[dict[str, Any]]) -> tuple[bool, float | None]:
    """The issue's goal: (met, MFU %) of the trn2 T=4096 uniform Mixtral forward row."""
    for r in rows:
        if all(r[k] == v for k, v in GOAL.items()):
            return r["mfu_routed_pct"] >= GOAL_MFU_PCT, r["mfu_routed_pct"]
    return False, None


# MFU key -> (its latency key, that latency's band key)
_MFU_LATENCY = {
    "mfu_routed_pct": ("latency_ms", "latency_band_ms"),
    "bwd_mfu_routed_pct": ("bwd_ms", "bwd_band_ms"),
}


def goals(rows: list[dict[str, Any]]) -> list[tuple[str, float, float, bool, str]]:
    """(description, minimum %, modeled %, met, the MFU with its band when priced) of
    every goal whose row was priced."""
    out = []
    for sel, key, minimum, what in GOALS:
        for r in rows:
            if all(r[k] == v for k, v in sel.items()) and key in r:
                lat, band_key = _MFU_LATENCY[key]
                band, mfu = r.get(band_key), r[key]
                text = f"{mfu:.1f} %"
                if band:  # MFU falls as latency grows
                    lo, hi = mfu * r[lat] / band[1], mfu * r[lat] / band[0]
                    text = format_band(mfu, lo, hi, "%", 1)
                out.append((what, minimum, r[key], r[key] >= minimum, text))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--json", metavar="PATH", help="also write the rows with provenance")
    p.add_argument("--backward", action="store_true", help="also price the backward kernel")
    p.add_argument("--quick", action="store_true", help="only the goal row's target and T")
    p.add_argument(
        "--no-bands", action="store_true", help="skip the bands (about 6x faster pricing)"
    )
    p.add_argument("--markdown", action="store_true", help="print the README's markdown table")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    bands = not args.no_bands
    if args.quick:
        rows = moe_rows(targets=("trn2",), tokens=(4096,), backward=args.backward, bands=bands)
    else:
        rows = moe_rows(backward=args.backward, bands=bands)
    what = "forward and backward" if args.backward else "forward"
    print(
        f"MoE layer {what} -- "
        + ", ".join(modeled_label(t) for t in sorted({r["target"] for r in rows}))
    )
    print(markdown_table(rows) if args.markdown else format_table(rows))
    results = goals(rows)
    print()
    for what, minimum, _, met, text in results:
        print(
            f"Goal: trn2 bf16 uniform T=4096 {what} >= {minimum:.0f} % MFU: "
            f"{'met' if met else 'MISSED'} ({text}, {modeled_label('trn2')})"
        )
    ok = bool(results) and all(met for _, _, _, met, _ in results)
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
