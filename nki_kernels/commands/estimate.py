"""Model a kernel's latency on trn1/trn2/trn3 from its trace (the cost model; no hardware).

`nki-kernels estimate <kernel> --shape ... --target trn2 [--timeline out.json]`; every
figure printed is labeled "modeled (cost model vN, target)" and the latency and MFU carry
their band (the range over the parameter sets the published anchors allow; see
`nki_kernels.perfmodel.band`). `--target-override FILE` prices with a `calibrate`
override. Kernels are looked up by name in `nki_kernels.perfmodel.registry`.
"""

from __future__ import annotations

import argparse
import json
import sys

NAME = "estimate"
HELP = "model a kernel's latency from its trace (cost model; no hardware)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `estimate`."""
    parser.add_argument("kernel", nargs="?", help="registered kernel name (see --list)")
    parser.add_argument(
        "--shape", help="sizes of the kernel's dims, e.g. 4096,8192,8192 or M=4096,..."
    )
    parser.add_argument("--dtype", default=None, help="input dtype (default: the kernel's)")
    parser.add_argument("--target", default="trn2", help="trn1 | trn2 | trn3 (default trn2)")
    parser.add_argument("--lnc", type=int, default=1, help="logical core size, 1 or 2")
    parser.add_argument(
        "--timeline", metavar="OUT.json", help="write a Chrome trace of the schedule"
    )
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.add_argument("--list", action="store_true", help="list the estimable kernels")
    parser.add_argument(
        "--target-override", metavar="FILE.json", help="a `calibrate` target override to use"
    )
    parser.add_argument("--no-band", action="store_true", help="skip the uncertainty band")


def run(args: argparse.Namespace) -> int:
    """Price the kernel and print its summary (or JSON); returns the exit status."""
    from ..interp.errors import NkiValidationError
    from ..perfmodel import registry
    from ..perfmodel.api import trace_kernel
    from ..perfmodel.band import band_estimate
    from ..perfmodel.chrome_trace import write_chrome_trace
    from ..perfmodel.estimate import build_estimate
    from ..perfmodel.summary import summary
    from ..perfmodel.timeline import schedule
    from ..targets import get_target, use_override

    if args.list or not args.kernel:
        for name in registry.names():
            entry = registry.get(name)
            dims = ",".join(f"{d}={s}" for d, s in zip(entry.dims, entry.default_shape))
            print(f"{name:24s} --shape {dims:28s} {entry.description}")
        return 0 if args.list else 2
    try:
        if args.target_override:
            use_override(args.target_override)
        entry = registry.get(args.kernel)
        tgt = get_target(args.target)
        shape = (
            registry.parse_shape(args.shape, entry.dims)
            if args.shape
            else dict(zip(entry.dims, entry.default_shape))
        )
        pos, kw = entry.args(shape, args.dtype)
        trace = trace_kernel(entry.kernel, *pos, target=tgt, lnc=args.lnc, **kw)
    except (KeyError, ValueError, TypeError, NkiValidationError) as exc:
        print(f"nki-kernels estimate: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    sched = schedule(trace, tgt, record=bool(args.timeline))
    est = build_estimate(trace, sched)
    title = f"{entry.name} " + " ".join(f"{d}={s}" for d, s in shape.items())
    banded = None if args.no_band else band_estimate(trace, tgt)
    if args.json:
        extra = {}
        if banded is not None:
            extra = {
                "latency_band_ns": [banded.latency_lo_ns, banded.latency_hi_ns],
                "mfu_band": [banded.mfu_lo, banded.mfu_hi],
            }
        print(
            json.dumps({"kernel": entry.name, "shape": shape, **est.to_dict(), **extra}, indent=2)
        )
    else:
        print(summary(est, title))
        if banded is not None:
            print(
                f"  band (parameter sets the anchors allow): latency {banded.latency_text()}, "
                f"MFU {banded.mfu_text()}"
            )
    if args.timeline:
        path = write_chrome_trace(args.timeline, trace, sched, name=entry.name)
        print(f"timeline written to {path} ({est.label})", file=sys.stderr)
    return 0
