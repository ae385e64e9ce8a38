"""Refit the cost model's parameters of one target to your own hardware measurements.

`nki-kernels calibrate --measurements rows.jsonl --target trn2 [--out trn2.json]` reads
the measured rows `nki-kernels hwcheck` writes (format: nki_kernels.perfmodel.measurements),
re-prices every row whose `estimable` names a registered kernel, fits the target's DMA
parameters within their documented ranges (least squares in log ratio) and saves a
target override. Use it with `nki-kernels estimate --target-override trn2.json` or by
pointing NKI_KERNELS_TARGETS_DIR at the directory; every modeled figure then names the
measurement file in its label.
"""

from __future__ import annotations

import argparse
import sys

NAME = "calibrate"
HELP = "refit a target's cost-model parameters to measured rows (writes a target override)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `calibrate`."""
    parser.add_argument(
        "--measurements",
        required=True,
        metavar="FILE.jsonl",
        help="measured rows (the hwcheck format)",
    )
    parser.add_argument("--target", default="trn2", help="trn1 | trn2 | trn3 (default trn2)")
    parser.add_argument(
        "--out",
        metavar="PATH.json",
        help="where to write the override (default nki-kernels-targets/<target>.json)",
    )
    parser.add_argument(
        "--no-loo", action="store_true", help="skip the leave-one-out refits (no band sets; faster)"
    )


def run(args: argparse.Namespace) -> int:
    """Fit, print the before/after table, write the override; returns the exit status."""
    from pathlib import Path

    from ..perfmodel.calibrate import CalibrationError, calibrate
    from ..perfmodel.estimate import COST_MODEL_VERSION
    from ..perfmodel.measurements import MeasurementFileError, load_rows
    from ..targets import get_target

    try:
        target = get_target(args.target).name
        rows = load_rows(args.measurements)
        result = calibrate(
            rows, target, source=Path(args.measurements).name, with_loo=not args.no_loo
        )
    except (MeasurementFileError, CalibrationError, ValueError) as exc:
        print(f"nki-kernels calibrate: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out or f"nki-kernels-targets/{target}.json")
    result.save(out)
    print(f"calibrate {target}: {len(result.rows)} measured rows ({len(result.skipped)} skipped)")
    print(f"  {'row':40s} {'measured us':>12s} {'v2 shipped':>11s} {'calibrated':>11s} {'LOO':>7s}")
    for r in result.rows:
        loo = f"{r.loo_error_pct:+6.1f}%" if r.loo_error_pct is not None else "    n/a"
        print(
            f"  {r.id:40.40s} {r.measured_ns / 1e3:12.3f} "
            f"{100 * (r.before_ns / r.measured_ns - 1):+10.1f}% "
            f"{100 * (r.after_ns / r.measured_ns - 1):+10.1f}% {loo}"
        )
    for rid, why in result.skipped.items():
        print(f"  skipped {rid}: {why}")
    print("  parameters: " + ", ".join(f"{k}={v:.4g}" for k, v in result.parameters.items()))
    print(f"  errors: modeled (cost model {COST_MODEL_VERSION}, {target}) vs measured rows")
    print(
        f"override written to {out} ({result.provenance}); use it with "
        f"`nki-kernels estimate --target-override {out}`"
    )
    return 0
