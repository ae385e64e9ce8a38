"""Measurers: how the tuner gets a latency for one config.

One small interface, `Measurer.measure(tunable, problem, config, target) -> Measurement`,
with two implementations:

- `CostModelMeasurer` (default): a trace-only interpreter launch priced by the cost model.
  Deterministic, needs no device; its figures are *modeled* and say so.
- `HardwareMeasurer`: the real toolchain. The op's `device_launcher` compiles the kernel
  with `nki.jit` and places seeded inputs on the neuron device once; the measurer then
  runs it `warmup` times untimed and `repeats` times timed, and reports the median. It is
  deliberately thin: it cannot run where there is no device, so everything it does beyond
  timing a callable lives in the op's launcher. Each measurement is also a measured row
  in `hwcheck`'s JSONL format (`perfmodel.measurements.MeasuredRow`, in
  `details["row"]`, appended to `rows` when given), so `calibrate` and `bench` read the
  tuner's measurements like hwcheck's.

Both launch the kernel at the tunable's LNC (`Tunable.lnc`, `kernel[lnc]`); the cost
model's label names it ("modeled (cost model v2, trn2, LNC 2)"). With `bands=True` the
cost model also prices each config under every parameter set of its band
(`perfmodel.band.parameter_sets`: the leave-one-out fits and the unanchored corners) and
reports them (`Measurement.set_ns`, `band_ns`): the pessimistic ranking ranks by the slow end.

`select_measurer("auto")` picks hardware when the real `nki` package and a neuron device
are present, else the cost model. Interpreter rule errors (`NkiValidationError`, including
`MemoryPlanError`) and `InvalidConfig` propagate: the study driver records them.
"""

from __future__ import annotations

import statistics
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..interp.trace import Trace
from ..kernel_config import KernelConfig
from ..targets import Target
from .tunable import Tunable


@dataclass(frozen=True)
class Measurement:
    """One config's latency and where it came from."""

    latency_ns: float
    label: str  # "modeled (cost model v2, trn2, LNC 2)" or "measured (hardware)"
    details: dict[str, Any] = field(default_factory=dict)
    # latency under each parameter set of the cost model's band (the first is the shipped
    # set, = latency_ns); None when not priced (bands off, or hardware)
    set_ns: tuple[float, ...] | None = None

    @property
    def band_ns(self) -> tuple[float, float] | None:
        """(fast end, slow end) of the band, or None."""
        return None if not self.set_ns else (min(self.set_ns), max(self.set_ns))

    def scaled(self, n: int, label: str) -> Measurement:
        """This measurement for `n` identical units run one after another."""
        sets = None if self.set_ns is None else tuple(v * n for v in self.set_ns)
        return Measurement(self.latency_ns * n, label, self.details, sets)


class Measurer(ABC):
    """Gives a latency for one config of one problem on one target."""

    #: provenance recorded in studies and exported configs ("cost-model v1", "hardware")
    name: str = ""

    @abstractmethod
    def measure(
        self, tunable: Tunable, problem: Any, config: KernelConfig, target: Target
    ) -> Measurement:
        """Latency of `config`; raises on configs that cannot run."""


class TraceMeasurer(Measurer):
    """Trace-only launch priced by `price(trace, target) -> (latency_ns, details)`."""

    def __init__(
        self, price: Callable[[Trace, Target], tuple[float, dict[str, Any]]], name: str
    ) -> None:
        self._price = price
        self.name = name

    def measure(
        self, tunable: Tunable, problem: Any, config: KernelConfig, target: Target
    ) -> Measurement:
        config.validate(problem, target)
        trace = tunable.trace(problem, config, target)
        latency, details = self._price(trace, target)
        return Measurement(float(latency), f"modeled ({self.name}, {target.name})", details)


def with_lnc(label: str, lnc: int) -> str:
    """'modeled (cost model v2, trn2)' -> 'modeled (cost model v2, trn2, LNC 2)'."""
    return f"{label[:-1]}, LNC {lnc})" if label.endswith(")") else f"{label} (LNC {lnc})"


class CostModelMeasurer(TraceMeasurer):
    """The default measurer: the project's cost model over a trace-only launch at the
    tunable's LNC; with `bands`, also under every parameter set of the band."""

    def __init__(self, bands: bool = False) -> None:
        from ..perfmodel import COST_MODEL_VERSION, estimate_trace

        def price(trace: Trace, target: Target) -> tuple[float, dict[str, Any]]:
            est = estimate_trace(trace, target)
            details = {"bound_by": est.bound_by, "mfu": est.mfu, "mbu": est.mbu}
            return float(est.latency_ns), details

        super().__init__(price, f"cost-model {COST_MODEL_VERSION}")
        self.version = COST_MODEL_VERSION
        self.bands = bands

    def measure(
        self, tunable: Tunable, problem: Any, config: KernelConfig, target: Target
    ) -> Measurement:
        from ..perfmodel import modeled_label
        from ..perfmodel.band import parameter_sets
        from ..perfmodel.timeline import schedule

        label = with_lnc(modeled_label(target.name, self.version), tunable.lnc)
        sets = parameter_sets(target)[1:] if self.bands else []
        if tunable.price is not None:
            config.validate(problem, target)
            latency, details = tunable.price(problem, config, target)
            others = [float(tunable.price(problem, config, t)[0]) for t in sets]
        else:
            config.validate(problem, target)
            trace = tunable.trace(problem, config, target)
            latency, details = self._price(trace, target)
            others = [float(schedule(trace, t).latency_ns) for t in sets]
        set_ns = (float(latency), *others) if self.bands else None
        return Measurement(float(latency), label, details, set_ns)


class HardwareMeasurer(Measurer):
    """Median wall time of the compiled kernel on the neuron device, after warm-up."""

    name = "hardware"

    def __init__(
        self,
        warmup: int = 3,
        repeats: int = 20,
        clock: Callable[[], float] = time.perf_counter,
        rows: str | Path | None = None,
    ) -> None:
        if warmup < 0:
            raise ValueError(f"warmup: expected >= 0; got {warmup}")
        if repeats < 1:
            raise ValueError(f"repeats: expected >= 1; got {repeats}")
        self.warmup = warmup
        self.repeats = repeats
        self._clock = clock
        self.rows = rows

    def measure(
        self, tunable: Tunable, problem: Any, config: KernelConfig, target: Target
    ) -> Measurement:
        if tunable.device_launcher is None:
            raise RuntimeError(f"op {tunable.op!r} has no device launcher for hardware timing")
        config.validate(problem, target)
        run = tunable.device_launcher(problem, config, target)
        for _ in range(self.warmup):
            run()
        times = []
        for _ in range(self.repeats):
            t0 = self._clock()
            run()
            times.append(self._clock() - t0)
        median_ns = statistics.median(times) * 1e9
        spread = (max(times) - min(times)) * 1e9
        row = measured_row(tunable, problem, config, target, [t * 1e9 for t in times])
        if self.rows is not None:
            from ..perfmodel.measurements import append_row

            append_row(self.rows, row)
        return Measurement(
            median_ns,
            "measured (hardware)",
            {"repeats": self.repeats, "spread_ns": spread, "row": row.to_dict()},
        )


def measured_row(
    tunable: Tunable, problem: Any, config: KernelConfig, target: Target, samples_ns: list[float]
) -> Any:
    """The tuner's hardware measurement of one config as hwcheck's measured row (device
    and versions from `hwcheck.neuron_device_info`, LNC the runtime's)."""
    from ..commands.hwcheck import neuron_device_info
    from ..perfmodel.measurements import MeasuredRow, latency_stats, now_utc_iso
    from ..runtime.lnc import runtime_lnc

    info = neuron_device_info()
    shape = {
        f.name: v
        for f in fields(problem)
        if isinstance(v := getattr(problem, f.name), int) and not isinstance(v, bool) and v > 0
    }
    kernel = tunable.kernels[0]
    return MeasuredRow(
        device=info.device,
        sdk_version=info.sdk_version,
        torch_neuronx_version=info.torch_neuronx_version,
        lnc=runtime_lnc(target),
        target=target.name,
        estimable=None,
        kernel=getattr(getattr(kernel, "fn", kernel), "__name__", str(kernel)),
        kernel_hash=tunable.source_hash(),
        shape=shape,
        dtype=tunable.dtype(problem),
        config={
            k: v
            for k, v in config.to_dict().items()
            if v is None or isinstance(v, (bool, int, float, str))
        },
        latency_ns=latency_stats(samples_ns),
        modeled_ns=None,
        timestamp=now_utc_iso(),
    )


def hardware_available() -> bool:
    """True when `neuron` tensors live on a real device driven by TorchNeuron (with the
    real `nki` toolchain behind the seam), as `runtime.neuron_device` decides."""
    from ..runtime.neuron_device import is_real_neuron

    return is_real_neuron()


def select_measurer(kind: str = "auto", bands: bool = False) -> Measurer:
    """'auto' (hardware where a device exists, else cost model), 'cost-model' or 'hardware';
    `bands`: the cost model prices every parameter set of its band too."""
    if kind == "auto":
        kind = "hardware" if hardware_available() else "cost-model"
    if kind == "cost-model":
        return CostModelMeasurer(bands=bands)
    if kind == "hardware":
        if not hardware_available():
            raise RuntimeError(
                "measurer: 'hardware' needs the Neuron nki package and a real neuron device "
                "(TorchNeuron); neither is present here -- use 'cost-model'"
            )
        return HardwareMeasurer()
    raise ValueError(f"measurer: expected 'auto', 'cost-model' or 'hardware'; got {kind!r}")
