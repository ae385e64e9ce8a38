"""Run an NKI kernel on torch tensors or NumPy arrays, on whichever backend can run it.

`launch(kernel, *args, config=..., **statics)`:

* positional `args` are the kernel's positional parameters: tensors/arrays become HBM
  tensors, anything else is a specialization-time value (hashable; part of the key);
* `config` (a `KernelConfig`) is expanded into keyword arguments -- its field names are
  the kernel's parameter names -- and `statics` are passed as keyword arguments too;
* the specialization comes from the compiled-kernel cache (`KERNEL_CACHE`), keyed by
  shapes, dtypes, statics, config, target, LNC and backend;
* `lnc` defaults to the process's runtime LNC (`runtime.lnc.runtime_lnc`:
  `NEURON_LOGICAL_NC_CONFIG`, else the target's default on a real device, else 1). On a
  real device an explicit `lnc` must equal it: `nki.jit` documents a mismatch as a runtime
  error, so it is refused here first, with the two values named.

Backends, chosen from the tensors' device and the `nki` seam:

* CPU tensors or NumPy arrays, interpreter seam: the project's interpreter;
* tensors on the emulated `neuron` device: copied to the host, interpreted, copied back;
* tensors on a real `neuron` device: the specialization's launcher `kernel[lnc]`
  (`runtime.neuron_device`), made once per specialization;
* CPU tensors when the seam is the real `nki`: the official simulator (`nki.simulate`),
  via `runtime.neuron_device.simulate`.

Outputs come back as the input kind: torch tensors on the inputs' device, or arrays.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import nki as seam
from ..kernel_config import KernelConfig
from ..targets import Target, get_target
from . import neuron_device
from .kernel_cache import KERNEL_CACHE, KernelCache, Specialization
from .lnc import LNC_ENV_VAR, check_lnc, runtime_lnc


@dataclass(frozen=True)
class RecordedLaunch:
    """One launch seen by `record_launches`: the specialization and the arguments it ran
    on (as passed to it: device tensors on the device path, host tensors otherwise)."""

    spec: Specialization
    args: tuple[Any, ...]

    def run(self) -> Any:
        """Launch the same specialization on the same arguments again."""
        return self.spec(*self.args)


_RECORDING: contextvars.ContextVar[list[RecordedLaunch] | None] = contextvars.ContextVar(
    "nki_kernels_launch_recording", default=None
)


@contextlib.contextmanager
def record_launches() -> Iterator[list[RecordedLaunch]]:
    """Collect every `launch` made inside the block (what `hwcheck` times)."""
    seen: list[RecordedLaunch] = []
    token = _RECORDING.set(seen)
    try:
        yield seen
    finally:
        _RECORDING.reset(token)


def _record(spec: Specialization, args: tuple[Any, ...]) -> None:
    seen = _RECORDING.get()
    if seen is not None:
        seen.append(RecordedLaunch(spec, args))


def _interpret(kernel: Any, *args: Any, target: Target, lnc: int, **kwargs: Any) -> Any:
    from ..interp import run

    return run(kernel, *args, target=target, lnc=lnc, **kwargs).outputs


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "device")


def _map_out(x: Any, fn: Any) -> Any:
    if isinstance(x, tuple):
        return tuple(_map_out(v, fn) for v in x)
    if isinstance(x, list):
        return [_map_out(v, fn) for v in x]
    return fn(x) if _is_tensor(x) else x


def launch(
    kernel: Any,
    *args: Any,
    config: KernelConfig | None = None,
    target: str | Target | None = None,
    lnc: int | None = None,
    mutated: Sequence[int] = (),
    cache: KernelCache | None = None,
    **statics: Any,
) -> Any:
    """Run `kernel(*args, **config fields, **statics)`; see the module docstring.

    `mutated` lists positional indices of tensors the kernel writes in place (their new
    contents are copied back to the caller's tensors on every backend).
    """
    tgt = get_target(target)
    kwargs = dict(config.to_dict()) if config is not None else {}
    clash = set(kwargs) & set(statics)
    if clash:
        raise ValueError(f"launch: {sorted(clash)} given both in config and as keyword arguments")
    kwargs.update(statics)

    devices = {str(a.device) for a in args if _is_tensor(a)}
    if len(devices) > 1:
        raise ValueError(
            f"launch({getattr(kernel, '__name__', kernel)}): expected all tensors on one device; "
            f"got {sorted(devices)}"
        )
    if any(isinstance(a, np.ndarray) for a in args) and devices:
        raise ValueError("launch: expected torch tensors or NumPy arrays, not both")
    device = next(iter(devices)) if devices else "cpu"
    on_neuron = device.startswith("neuron")

    kcache = cache or KERNEL_CACHE
    runtime = runtime_lnc(tgt)
    lnc = runtime if lnc is None else check_lnc(lnc)
    if on_neuron and neuron_device.is_real_neuron():
        if lnc != runtime:
            raise ValueError(
                f"lnc: expected {runtime} on this neuron device (the Neuron Runtime's LNC: "
                f"{LNC_ENV_VAR} or the {tgt.name} default); got {lnc}"
            )
        spec = kcache.get(
            kernel, args, kwargs, tgt, lnc, "neuron", neuron_device.call, neuron_device.launcher
        )
        _record(spec, args)
        return spec(*args)

    # Host execution (interpreter or the official simulator).
    host_args = tuple(a.detach().cpu() if _is_tensor(a) else a for a in args)
    backend = "interpreter" if seam.BACKEND == "interpreter" else "nki.simulate"
    runner = _interpret if backend == "interpreter" else neuron_device.simulate
    spec = kcache.get(kernel, host_args, kwargs, tgt, lnc, backend, runner)
    _record(spec, host_args)
    outputs = spec(*host_args)
    if on_neuron:
        for i in mutated:
            args[i].copy_(host_args[i])
        return _map_out(outputs, lambda t: t.to(device))
    return outputs


__all__ = ["RecordedLaunch", "launch", "record_launches"]
