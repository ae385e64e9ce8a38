"""Check every op on a Neuron device and measure its kernels: `nki-kernels hwcheck`.

Needs TorchNeuron, the Neuron `nki` and a visible `neuron` device (trn2 / trn3);
without them it prints what is missing and exits 2. For every op at the README's model
shapes (`--quick`: small shapes, a smoke test):

1. forward and backward (forward only for decode) on the device against the fp32 torch
   reference, at the
   per-dtype tolerances of `testing.tolerances` (scaled by the reference's magnitude,
   grown with the reduction length);
2. every kernel launch the op made (one per specialization: kernel, bucket shapes,
   config, LNC) timed on the device: `--warmup` launches, then `--repeats` launches each
   between two device synchronizations; median, min and max;
3. the cost model's figure for the same launch beside it, labelled as modeled;
4. one measured row per launch appended to `--out` (the JSONL format of
   `perfmodel.measurements`, which `nki-kernels calibrate` fits). The calibration
   kernels of `perfmodel.registry` are measured too: their rows name the estimable
   that calibrate re-prices.

Exit status: 0 when every check passed, 1 when one failed (rows are still written),
2 when the device is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

NAME = "hwcheck"
HELP = "on a Neuron device: check every op against torch and measure its kernels (JSONL rows)"
NEEDS = ("torch-neuronx", "nki", "neuron")


@dataclass(frozen=True)
class DeviceInfo:
    """Where the measurements come from (the row fields that describe the machine)."""

    device: str
    torch_device: str
    sdk_version: str
    torch_neuronx_version: str | None


class Timer(Protocol):
    """Device time of one launch: `repeats` samples in ns after `warmup` launches."""

    def __call__(self, launch: Any, warmup: int, repeats: int) -> list[float]: ...


def synchronized_timer(synchronize: Callable[[], None]) -> Timer:
    """Host-clock time of each launch between two device synchronizations."""

    def time_launch(launch: Any, warmup: int, repeats: int) -> list[float]:
        for _ in range(warmup):
            launch.run()
        synchronize()
        samples = []
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            launch.run()
            synchronize()
            samples.append(float(time.perf_counter_ns() - t0))
        return samples

    return time_launch


@dataclass(frozen=True)
class Case:
    """One op at one shape: inputs, the op call and its fp32 reference."""

    op: str
    shape: str
    make: Callable[[Any], dict[str, Any]]  # torch.Generator -> named CPU inputs
    call: Callable[[dict[str, Any]], Any]  # inputs (on the device) -> output tensor
    reference: Callable[[dict[str, Any]], Any]  # fp32 inputs -> fp32 output
    reduction: int  # longest sum behind any output or gradient (tolerance growth)
    # the benchmark rows this case measures: (forward op, backward op, case), the
    # `BenchRow.op` / `.case` texts of `make bench` (None: a case the bench has not)
    bench: tuple[str, str, str] | None = None
    backward: bool = True  # False: an inference-only op (decode), forward checked alone


@dataclass
class Result:
    """What hwcheck found for one case: failures (empty: passed) and measured rows."""

    case: Case
    failures: list[str]
    rows: list[Any]


def missing_requirements() -> list[str]:
    """What of `NEEDS` this machine lacks, each with its meaning (doctor's wording)."""
    from . import doctor

    report = doctor.collect()
    return [f"{r}: {doctor.REQUIREMENTS[r]}" for r in NEEDS if not report.satisfied(r)]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def neuron_device_info() -> DeviceInfo:
    """The real device: instance type (DMI product name), SDK and torch-neuronx versions."""
    try:
        device = Path("/sys/devices/virtual/dmi/id/product_name").read_text().strip()
    except OSError:
        device = ""
    sdk = _version("neuronx-cc") or _version("nki") or "unknown"
    return DeviceInfo(device or "neuron", "neuron", sdk, _version("torch-neuronx"))


def _float_inputs(inputs: dict[str, Any]) -> list[str]:
    return [k for k, v in inputs.items() if v.is_floating_point() and not k.startswith("_")]


def _recorded(phases: dict[str, list[Any]] | None, phase: str) -> Any:
    import contextlib

    from ..runtime.launch import record_launches

    if phases is None:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def block() -> Any:
        with record_launches() as seen:
            yield
        phases.setdefault(phase, []).extend(seen)

    return block()


def check_case(
    case: Case, device: str, seed: int = 0, phases: dict[str, list[Any]] | None = None
) -> list[str]:
    """Forward and backward of `case` on `device` against the reference; failures.
    With `phases`, the launches of the forward and of the backward are appended to
    `phases["fwd"]` and `phases["bwd"]`."""
    import torch

    from ..testing.tolerances import tolerance

    inputs = case.make(torch.Generator().manual_seed(seed))
    grads = _float_inputs(inputs) if case.backward else []
    dev = {k: v.detach().to(device).requires_grad_(k in grads) for k, v in inputs.items()}
    ref = {k: v.detach().float().requires_grad_(k in grads) for k, v in inputs.items()}
    with _recorded(phases, "fwd"):
        out = case.call(dev)
    want = case.reference(ref)
    if case.backward:
        g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1))
        with _recorded(phases, "bwd"):
            out.backward(g.to(out.dtype).to(device))
        want.backward(g.to(out.dtype).float())
    pairs = [("output", out, want)] + [(f"d{k}", dev[k].grad, ref[k].grad) for k in grads]
    failures = []
    for name, got, exp in pairs:
        if got is None or exp is None:
            failures.append(f"{case.op} {case.shape}: {name} missing")
            continue
        scale = float(exp.abs().max()) or 1.0
        tol = tolerance(out.dtype, case.reduction, scale)
        err = float((got.detach().cpu().float() - exp.detach()).abs().max())
        bound = tol.atol
        if not err <= bound:
            failures.append(
                f"{case.op} {case.shape}: {name} max |error| {err:.3g} > {bound:.3g} "
                f"({str(out.dtype).removeprefix('torch.')} tolerance over {case.reduction} terms)"
            )
    return failures


def _spec_of(t: Any) -> Any:
    import ml_dtypes
    import torch

    from ..interp import TensorSpec

    special = {torch.bfloat16: ml_dtypes.bfloat16, torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn}
    dtype = special.get(t.dtype) or torch.empty(0, dtype=t.dtype).numpy().dtype
    return TensorSpec(tuple(t.shape), dtype)


def modeled_ns(launch: Any) -> float | None:
    """The cost model's latency of the same launch (trace-only), or None if it cannot."""
    from ..perfmodel import estimate

    spec = launch.spec
    args = [_spec_of(a) if hasattr(a, "shape") else a for a in launch.args]
    try:
        est = estimate(spec.kernel, *args, target=spec.target, lnc=spec.key.lnc, **spec.statics)
    except Exception:  # a launch the trace-only mode cannot price keeps modeled_ns null
        return None
    return float(est.latency_ns)


def _row_config(statics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in statics.items() if v is None or isinstance(v, (bool, int, float, str))}


def measure(
    launches: Iterable[Any],
    info: DeviceInfo,
    timer: Timer,
    warmup: int,
    repeats: int,
    estimable: str | None = None,
    shape: dict[str, int] | None = None,
    bench: tuple[str, str] | None = None,
) -> list[Any]:
    """One measured row per distinct specialization among `launches` (with how many
    times it was launched); `bench` = (op, case) labels the rows with a benchmark row."""
    from ..perfmodel.measurements import MeasuredRow, latency_stats, now_utc_iso
    from ..runtime.kernel_cache import kernel_source_hash

    launches = list(launches)
    counts: dict[Any, int] = {}
    for launch in launches:
        counts[launch.spec.key] = counts.get(launch.spec.key, 0) + 1
    rows, seen = [], set()
    for launch in launches:
        key = launch.spec.key
        if key in seen:
            continue
        seen.add(key)
        samples = timer(launch, warmup, repeats)
        dims = shape or {
            f"arg{i}.d{j}": int(n)
            for i, a in enumerate(launch.args)
            if hasattr(a, "shape")
            for j, n in enumerate(a.shape)
        }
        first = next((a for a in launch.args if hasattr(a, "dtype")), None)
        rows.append(
            MeasuredRow(
                device=info.device,
                sdk_version=info.sdk_version,
                torch_neuronx_version=info.torch_neuronx_version,
                lnc=key.lnc,
                target=launch.spec.target.name,
                estimable=estimable,
                kernel=key.kernel.rpartition(".")[2],
                kernel_hash=kernel_source_hash(launch.spec.kernel),
                shape=dims,
                dtype=str(getattr(first, "dtype", "none")).removeprefix("torch."),
                config=_row_config(dict(launch.spec.statics)),
                latency_ns=latency_stats(samples),
                modeled_ns=modeled_ns(launch),
                timestamp=now_utc_iso(),
                op=bench[0] if bench else None,
                case=bench[1] if bench else None,
                launches=counts[key],
            )
        )
    return rows


def run_case(case: Case, info: DeviceInfo, timer: Timer, warmup: int, repeats: int) -> Result:
    """Check `case` and measure the kernels its forward and backward launched (rows of
    a case the bench has are labelled with its forward / backward benchmark rows)."""
    phases: dict[str, list[Any]] = {}
    failures = check_case(case, info.torch_device, phases=phases)
    rows = []
    for i, phase in enumerate(("fwd", "bwd")):
        label = (case.bench[i], case.bench[2]) if case.bench else None
        rows += measure(phases.get(phase, []), info, timer, warmup, repeats, bench=label)
    return Result(case, failures, rows)


def calibration_rows(
    info: DeviceInfo,
    timer: Timer,
    warmup: int,
    repeats: int,
    shapes: dict[str, dict[str, int]] | None = None,
) -> list[Any]:
    """Measured rows of the registered calibration kernels (estimable set), at their
    default shapes or `shapes[name]`."""
    import torch

    from ..perfmodel import registry
    from ..runtime.launch import launch, record_launches

    rows = []
    for name in sorted(shapes) if shapes is not None else registry.names():
        entry = registry.get(name)
        dims = (shapes or {}).get(name) or dict(zip(entry.dims, entry.default_shape))
        args, kwargs = entry.args(dims)
        g = torch.Generator().manual_seed(0)
        real = [_tensor_for(a, g, info.torch_device) for a in args]
        with record_launches() as launches:
            launch(entry.kernel, *real, **kwargs)
        rows += measure(launches, info, timer, warmup, repeats, estimable=name, shape=dims)
    return rows


def _tensor_for(a: Any, g: Any, device: str) -> Any:
    import torch

    from ..interp import TensorSpec

    if not isinstance(a, TensorSpec):
        return a
    dtype = getattr(torch, str(a.dtype))
    return (torch.randn(a.shape, generator=g) * 0.1).to(dtype).to(device)


def format_row(row: Any) -> str:
    """One line: kernel, shape, LNC, the measured figure and the modeled one beside it."""
    from ..perfmodel import COST_MODEL_VERSION, modeled_label

    lat = row.latency_ns
    dims = "x".join(str(v) for v in row.shape.values())
    text = (
        f"{row.kernel:<24} [{dims} {row.dtype}] lnc {row.lnc}  measured (hardware, "
        f"{row.device}): median {lat['median'] / 1e3:.1f} us (min {lat['min'] / 1e3:.1f}, "
        f"max {lat['max'] / 1e3:.1f}, {lat['repeats']} repeats)"
    )
    if row.modeled_ns is not None:
        label = modeled_label(row.target, COST_MODEL_VERSION)
        text += f" | {label}: {row.modeled_ns / 1e3:.1f} us"
    return text


def run_all(
    cases: Sequence[Case],
    info: DeviceInfo,
    timer: Timer,
    out: str | Path,
    warmup: int = 3,
    repeats: int = 20,
    calibration: dict[str, dict[str, int]] | None = None,
    emit: Callable[[str], None] = print,
) -> int:
    """Check and measure `cases` (and the calibration kernels), append every row to
    `out`; 0 when all checks pass, else 1."""
    from ..perfmodel.measurements import append_row

    failed = False
    for case in cases:
        result = run_case(case, info, timer, warmup, repeats)
        status = "ok" if not result.failures else "FAILED"
        emit(f"{case.op} {case.shape}: forward + backward vs torch reference {status}")
        for f in result.failures:
            emit(f"  {f}")
        failed |= bool(result.failures)
        for row in result.rows:
            append_row(out, row)
            emit("  " + format_row(row))
    for row in calibration_rows(info, timer, warmup, repeats, calibration):
        append_row(out, row)
        emit("  " + format_row(row))
    emit(f"rows appended to {out}")
    return 1 if failed else 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options: --out, --warmup, --repeats, --quick, --ops."""
    parser.add_argument("--out", default="measurements.jsonl", help="JSONL file rows go to")
    parser.add_argument("--warmup", type=int, default=3, help="untimed launches per kernel")
    parser.add_argument("--repeats", type=int, default=20, help="timed launches per kernel")
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke test)")
    parser.add_argument("--ops", default="", help="comma-separated ops (default: all)")


def run(args: argparse.Namespace) -> int:
    """Check the device, then run every case; see the module docstring."""
    from .hwcheck_cases import cases_for

    for name, value, least in (("warmup", args.warmup, 0), ("repeats", args.repeats, 1)):
        if value < least:
            print(f"hwcheck: --{name}: expected >= {least}; got {value}", file=sys.stderr)
            return 2
    try:  # a bad --ops is named on any machine, not only where a device is present
        cases = cases_for(args.ops.split(",") if args.ops else None, quick=args.quick)
    except ValueError as exc:
        print(f"hwcheck: {exc}", file=sys.stderr)
        return 2
    missing = missing_requirements()
    if missing:
        print("hwcheck needs a Neuron device with TorchNeuron; missing:", file=sys.stderr)
        for m in missing:
            print(f"  {m}", file=sys.stderr)
        print("(nothing was measured; see `nki-kernels doctor`)", file=sys.stderr)
        return 2
    import torch

    # TorchNeuron's device module; torch.accelerator is PyTorch's generic route to it
    sync = getattr(getattr(torch, "neuron", None), "synchronize", None)
    timer = synchronized_timer(sync or torch.accelerator.synchronize)
    return run_all(cases, neuron_device_info(), timer, args.out, args.warmup, args.repeats)


__all__ = [
    "Case",
    "DeviceInfo",
    "Timer",
    "calibration_rows",
    "check_case",
    "format_row",
    "measure",
    "missing_requirements",
    "modeled_ns",
    "run_all",
    "run_case",
    "synchronized_timer",
]
