"""Model a kernel's latency on trn1/trn2/trn3 from its trace (the cost model; no hardware).

`nki-kernels estimate <kernel> --shape ... --target trn2 [--timeline out.json]`; every
figure printed is labeled "modeled (cost model vN, target)" and the latency and MFU carry
their band (the range over the parameter sets the published anchors allow; see
`nki_kernels.perfmodel.band`). `--target-override FILE` prices with a `calibrate`
override. Kernels are looked up by name in `nki_kernels.perfmodel.registry`, or your own
kernel is loaded from `module:function` (or `path/to/file.py:function`) and given the
arguments `--arg` names, e.g.

    nki-kernels estimate mykernels:matmul --arg lhsT=2048x2048 --arg rhs=2048x4096:float32

(`NAME=SIZExSIZE[:DTYPE]` is a tensor in HBM, default dtype `--dtype` or bfloat16;
`NAME=VALUE` a Python literal passed as is).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

NAME = "estimate"
HELP = "model a kernel's latency from its trace (cost model; no hardware)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `estimate`."""
    parser.add_argument(
        "kernel",
        nargs="?",
        help="registered kernel name (see --list), or your own: module:function or "
        "path/to/file.py:function (with --arg)",
    )
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=SHAPE[:DTYPE]|NAME=VALUE",
        help="an argument of your own kernel (repeatable): a tensor, e.g. x=4096x8192:bfloat16, "
        "or a Python literal, e.g. eps=1e-6",
    )
    parser.add_argument(
        "--shape", help="sizes of the kernel's dims, e.g. 4096,8192,8192 or M=4096,..."
    )
    parser.add_argument("--dtype", default=None, help="input dtype (default: the kernel's)")
    parser.add_argument("--target", default="trn2", help="trn1 | trn2 | trn3 (default trn2)")
    parser.add_argument(
        "--lnc",
        type=int,
        default=None,
        help="logical core size, 1 or 2 (default: the LNC the ops launch at, as "
        "`nki-kernels doctor` prints)",
    )
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
    from ..runtime.lnc import runtime_lnc

    try:
        if args.target_override:
            use_override(args.target_override)
        tgt = get_target(args.target)
        lnc = runtime_lnc(tgt) if args.lnc is None else args.lnc
        if ":" in args.kernel:
            kernel = load_kernel(args.kernel)
            pos, kw = user_args(kernel, args.arg, args.dtype or "bfloat16")
            name = args.kernel
            shape: dict[str, Any] = {a.partition("=")[0]: a.partition("=")[2] for a in args.arg}
        else:
            if args.arg:
                raise ValueError("--arg: only for your own kernel (module:function)")
            entry = registry.get(args.kernel)
            shape = (
                registry.parse_shape(args.shape, entry.dims)
                if args.shape
                else dict(zip(entry.dims, entry.default_shape))
            )
            pos, kw = entry.args(shape, args.dtype)
            kernel, name = entry.kernel, entry.name
        trace = trace_kernel(kernel, *pos, target=tgt, lnc=lnc, **kw)
    except (KeyError, ValueError, TypeError, NkiValidationError) as exc:
        text = str(exc.args[0] if exc.args else exc)
        text = re.sub(r"^(shape|lnc|target):", lambda m: f"--{m.group(1)}:", text)
        print(f"nki-kernels estimate: error: {text}", file=sys.stderr)
        return 2
    sched = schedule(trace, tgt, record=bool(args.timeline))
    est = build_estimate(trace, sched)
    title = f"{name} (LNC {lnc}) " + " ".join(f"{d}={s}" for d, s in shape.items())
    banded = None if args.no_band else band_estimate(trace, tgt)
    if args.json:
        extra = {}
        if banded is not None:
            extra = {
                "latency_band_ns": [banded.latency_lo_ns, banded.latency_hi_ns],
                "mfu_band": [banded.mfu_lo, banded.mfu_hi],
            }
        print(
            json.dumps(
                {"kernel": name, "shape": shape, "lnc": lnc, **est.to_dict(), **extra}, indent=2
            )
        )
    else:
        print(summary(est, title))
        if banded is not None:
            print(
                f"  band (parameter sets the anchors allow): latency {banded.latency_text()}, "
                f"MFU {banded.mfu_text()}"
            )
    if args.timeline:
        path = write_chrome_trace(args.timeline, trace, sched, name=name)
        print(f"timeline written to {path} ({est.label})", file=sys.stderr)
    return 0


def load_kernel(spec: str) -> Any:
    """The kernel named by `module:function` or `path/to/file.py:function`."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise ValueError(f"kernel: expected module:function or file.py:function; got {spec!r}")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"kernel: no file {where!r}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        if "" not in sys.path:
            sys.path.insert(0, "")  # the user's own modules, from the working directory
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as exc:
            raise ValueError(f"kernel: no module {exc.name!r} (from {spec!r})") from None
    if not hasattr(module, attr):
        raise ValueError(f"kernel: {where} has no {attr!r}")
    return getattr(module, attr)


_TENSOR = re.compile(r"^(\d+(?:x\d+)*)(?::(\w+))?$")


def user_args(kernel: Any, specs: list[str], dtype: str) -> tuple[tuple, dict]:
    """The positional and keyword arguments `--arg` gives for `kernel`'s signature."""
    from ..interp import TensorSpec

    values: dict[str, Any] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--arg: expected NAME=SHAPE[:DTYPE] or NAME=VALUE; got {spec!r}")
        m = _TENSOR.match(text.strip())
        if m:
            shape = tuple(int(n) for n in m.group(1).split("x"))
            values[name] = TensorSpec(shape, m.group(2) or dtype)
            continue
        try:
            values[name] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise ValueError(
                f"--arg: {name}: expected a shape like 128x512[:bfloat16] or a Python "
                f"literal; got {text!r}"
            ) from None
    fn = getattr(kernel, "fn", kernel)
    try:
        bound = inspect.signature(fn).bind(**values)
    except TypeError as exc:
        params = ", ".join(inspect.signature(fn).parameters)
        raise ValueError(f"--arg: {exc} (the kernel takes: {params})") from None
    return tuple(bound.args), dict(bound.kwargs)
