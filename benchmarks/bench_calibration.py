"""Cost model calibration: every published anchor, modeled vs measured, with LOO errors.

Run: `python benchmarks/bench_calibration.py [--refit] [--json rows.json] [--markdown]`.

Prints the anchor table of `nki_kernels/perfmodel/anchors.json`: for each published
measurement its source, how it is priced (AWS's kernel run unmodified, or a faithful
re-implementation), the measured figure, the modeled figure with the shipped
parameters ("modeled (cost model v2, target)"), the error, and the leave-one-out error
(the anchor's error when the target is fitted without it; from fit_v3.json). Anchors
that cannot be priced yet are listed with the reason. Then the DMA efficiency curve.
`--refit` first redoes the fit (minutes of CPU) and rewrites fit_v3.json; the fitted
values must then be copied into nki_kernels/targets.py (a test checks they agree).
Exit status 1 if an available anchor is off by more than 15 %.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from nki_kernels.perfmodel import COST_MODEL_VERSION, modeled_label
from nki_kernels.perfmodel.anchor_fit import load_fit, refit, write_fit
from nki_kernels.perfmodel.anchors import AnchorSet, load_anchors
from nki_kernels.perfmodel.sweep import dma_sweep_table
from nki_kernels.targets import get_target

LIMIT_PCT = 15.0


def _fmt_ns(ns: float) -> str:
    for unit, scale in (("ms", 1e6), ("us", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.2f} {unit}"
    return f"{ns:.0f} ns"


def anchor_rows() -> tuple[list[dict], dict[str, str]]:
    """One row per available anchor (modeled now with the shipped parameters)."""
    fit = load_fit()["targets"]
    anchors = load_anchors()
    rows, unavailable = [], {}
    for target in sorted({a.target for a in anchors}):
        aset = AnchorSet.build(target, anchors)
        unavailable.update(aset.unavailable)
        modeled = aset.price(get_target(target))
        loo = fit.get(target, {}).get("anchors", {})
        for a in aset.anchors:
            rows.append(
                {
                    "id": a.id,
                    "fitted": a.fit,
                    "held_out": a.held_out,
                    "target": target,
                    "kernel": a.kernel,
                    "source": a.citation,
                    "priced_by": a.priced_by,
                    "quantity": a.quantity,
                    "measured_ns": a.measured_ns,
                    "modeled_ns": modeled[a.id],
                    "error_pct": 100 * (modeled[a.id] / a.measured_ns - 1),
                    "loo_error_pct": loo.get(a.id, {}).get("loo_error_pct"),
                    "provenance": modeled_label(target),
                }
            )
    return rows, unavailable


def _tag(r: dict) -> str:
    if r["fitted"]:
        return ""
    return " (held out)" if r.get("held_out") else " (not fitted)"


def markdown(rows: list[dict], unavailable: dict[str, str]) -> str:
    """The README's anchor table."""
    lines = [
        f"| anchor | target | priced with | measured | modeled (cost model {COST_MODEL_VERSION}) "
        "| error | LOO error |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        loo = f"{r['loo_error_pct']:+.1f} %" if r["loo_error_pct"] is not None else "n/a"
        lines.append(
            f"| {r['id']}{_tag(r)} | {r['target']} "
            f"| {r['priced_by']} | {_fmt_ns(r['measured_ns'])} "
            f"| {_fmt_ns(r['modeled_ns'])} | {r['error_pct']:+.1f} % | {loo} |"
        )
    for aid, why in unavailable.items():
        lines.append(f"| {aid} | | not priced: {why.split(':')[0]} | | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--refit", action="store_true", help="redo the fit, rewrite fit_v3.json")
    p.add_argument(
        "--targets",
        default="trn2,trn1",
        help="with --refit: the targets to refit (the others keep their stored records)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the rows with provenance")
    p.add_argument("--markdown", action="store_true", help="print the README table too")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    if args.refit:
        names = tuple(t for t in args.targets.split(",") if t)
        record = refit(names)
        try:
            kept = load_fit()["targets"]
        except FileNotFoundError:
            kept = {}
        others = {k: v for k, v in kept.items() if k not in names}
        record["targets"] = {**others, **record["targets"]}
        path = write_fit(record)
        print(f"fit rewritten: {path}")
        for name, rec in load_fit()["targets"].items():
            print(f"  {name}: " + ", ".join(f"{k}={v:.4g}" for k, v in rec["params"].items()))
    rows, unavailable = anchor_rows()
    print(
        f"Published anchors vs modeled (cost model {COST_MODEL_VERSION}); measured = AWS hardware"
    )
    print(
        f"  {'anchor':42s} {'tgt':4s} {'priced with':25s} {'measured':>10s} {'modeled':>10s} "
        f"{'error':>8s} {'LOO':>8s}"
    )
    worst = worst_fitted = 0.0
    for r in rows:
        worst = max(worst, abs(r["error_pct"]))
        if r["fitted"]:
            worst_fitted = max(worst_fitted, abs(r["error_pct"]))
        loo = f"{r['loo_error_pct']:+7.1f}%" if r["loo_error_pct"] is not None else "     n/a"
        print(
            f"  {r['id']:42s} {r['target']:4s} {r['priced_by']:25s} "
            f"{_fmt_ns(r['measured_ns']):>10s} {_fmt_ns(r['modeled_ns']):>10s} "
            f"{r['error_pct']:+7.1f}% {loo}"
        )
    for aid, why in unavailable.items():
        print(f"  not priced: {aid}: {why}")
    ok = worst <= LIMIT_PCT
    print(
        f"  worst error {worst:.1f} % (fitted anchors: {worst_fitted:.1f} %): "
        f"{'within' if ok else 'OUTSIDE'} +-{LIMIT_PCT:.0f} %"
    )
    if args.markdown:
        print()
        print(markdown(rows, unavailable))
    sweep = dma_sweep_table("trn2")
    print(
        f"\nDMA efficiency vs bytes per partition, [128, B] HBM -> SBUF -- {modeled_label('trn2')}"
    )
    print(f"  {'bytes':>6s} {'modeled %':>10s} {'published %':>12s}")
    for pt in sweep:
        print(f"  {pt.bytes_per_partition:6d} {pt.efficiency_pct:10.1f} {pt.published_pct:12.1f}")
    print(f"\n(computed in {time.perf_counter() - t0:.1f} s)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "cost_model_version": COST_MODEL_VERSION,
                    "anchors": rows,
                    "unavailable": unavailable,
                    "dma_sweep": [pt.__dict__ for pt in sweep],
                },
                fh,
                indent=2,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
