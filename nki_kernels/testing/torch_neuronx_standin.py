"""Test doubles for TorchNeuron (`torch_neuronx`) and the real `nki`, as their sources say.

No Trainium and no Neuron pip repository here, so the device path of `runtime/` and
`ops/registry.py` is exercised against these doubles. Each behaviour follows a public
page or source, named next to it; nothing is added that those do not describe.

`real_device(lnc=None)` (a context manager) makes this process look like a trn2 host with
TorchNeuron: the emulated `neuron` device stops saying `emulated`, the `nki` seam reports
the real backend, `torch_neuronx` is importable, and an `nki.jit` kernel called with
neuron tensors goes to `handle_kernel_call` -- the double of torch-neuronx's integration:

* TorchNeuron `torch/guides/how-to-work-with-nki`: "Eager mode: The first call compiles
  the kernel for the input shapes, data types, and non-tensor argument values of that
  call. Later calls with the same inputs reuse the compiled kernel." -> `STATE.compiles`
  counts those keys (a repeat is `STATE.reuses`).
* same page: "Inside torch.compile(backend="neuron"): The kernel call becomes one node in
  the captured graph" -> every call is one `torch.ops.nki_standin.kernel_call` node,
  whose fake gives the output shapes from a trace-only interpretation (the double of
  `dump_config(...).return_types` in `torch_neuronx/nki_hop.py`; device loops whose trip
  count is read from memory run zero trips there, since outputs are allocated first).
* `nki.jit` (nki/api/nki/__init__.py): "The LNC value must match the
  NEURON_LOGICAL_NC_CONFIG environment variable set for the Neuron Runtime. Mismatching
  the two will cause a runtime error." -> `RuntimeError` when the launch's LNC differs
  from the runtime's (the variable when set, else 2: "On Trn2 ... LNC=2 (default)",
  logical-neuroncore-config.rst).
* `nki_op(name, fn=None, mutates_args={})` (`torch_neuronx/nki_hop.py`, pre-release):
  a `custom_op` whose fake is `fn` itself and whose `FunctionalTensorMode` dispatch runs
  `fn` under the mode, so `torch.compile` traces into the body.
* `wrap_nki(kernel)` (same file): reads `kernel.sign` (absent from the NKI 0.6 `Kernel`:
  AttributeError) and `__getitem__(grid)` does `tuple(map(int, grid))` (an int grid:
  TypeError). Kept so a test shows why the runtime uses the direct call `kernel[lnc]`.

The kernel itself runs in the project's interpreter on host copies of the tensors (the
double of the device); inputs it writes are copied back (eager only).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import itertools
import os
import sys
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

LNC_ENV_VAR = "NEURON_LOGICAL_NC_CONFIG"
RUNTIME_DEFAULT_LNC = 2  # trn2's documented default (logical-neuroncore-config.rst)
VERSION = "0.0+standin"


@dataclass
class StandinState:
    """What the double saw: compiles per documented key, reuses, and calls per LNC."""

    compiles: set[tuple[Any, ...]] = field(default_factory=set)
    reuses: int = 0
    calls_by_lnc: dict[int, int] = field(default_factory=dict)
    traced_calls: int = 0

    def reset(self) -> None:
        """Forget everything seen."""
        self.compiles.clear()
        self.reuses = 0
        self.calls_by_lnc.clear()
        self.traced_calls = 0


STATE = StandinState()

# kernel-call registrations: id -> (kernel, lnc, argument template)
_CALLS: dict[int, tuple[Any, int, tuple[Any, ...], tuple[str, ...]]] = {}
_CALL_IDS: dict[tuple[Any, ...], int] = {}
_ids = itertools.count()
_lock = threading.Lock()
_TENSOR = object()  # placeholder for a tensor slot in an argument template


def runtime_lnc() -> int:
    """The Neuron Runtime's LNC as the double sees it: the variable, else trn2's 2."""
    raw = os.environ.get(LNC_ENV_VAR)
    return int(raw) if raw else RUNTIME_DEFAULT_LNC


# ---- the kernel-call node ----------------------------------------------------------------
def _torch_dtype(np_dtype: Any) -> torch.dtype:
    name = np.dtype(np_dtype).name
    table = {
        "bfloat16": torch.bfloat16,
        "float8_e4m3fn": torch.float8_e4m3fn,
        "float8_e5m2": torch.float8_e5m2,
    }
    if name in table:
        return table[name]
    return torch.from_numpy(np.zeros(1, dtype=np_dtype)).dtype


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [leaf for v in x for leaf in _leaves(v)]
    return [] if x is None else [x]


def _rebuild(template: Any, tensors: Iterator[torch.Tensor]) -> Any:
    if isinstance(template, tuple):
        return tuple(_rebuild(v, tensors) for v in template)
    if isinstance(template, list):
        return [_rebuild(v, tensors) for v in template]
    return None if template is None else next(tensors)


def _interp_args(call_id: int, tensors: list[torch.Tensor], make: Callable[[Any], Any]) -> Any:
    kernel, lnc, template, kw_names = _CALLS[call_id]
    it = iter(tensors)
    values = [make(next(it)) if v is _TENSOR else v for v in template]
    n_pos = len(template) - len(kw_names)
    return kernel, lnc, values[:n_pos], dict(zip(kw_names, values[n_pos:]))


_STRUCTURES: dict[tuple[Any, ...], Any] = {}


def _structure_key(call_id: int, tensors: list[torch.Tensor]) -> tuple[Any, ...]:
    return (call_id, tuple((tuple(t.shape), t.dtype) for t in tensors))


def _output_structure(call_id: int, tensors: list[torch.Tensor]) -> Any:
    """The kernel's outputs as TensorSpecs (nested as it returns them): recorded by the
    eager run, else (under tracing) from a trace-only interpretation; per call and shapes."""
    from ..interp.launch import TensorSpec, run

    key = _structure_key(call_id, tensors)
    if key not in _STRUCTURES:
        kernel, lnc, pos, kw = _interp_args(
            call_id, tensors, lambda t: TensorSpec(tuple(t.shape), _np_dtype(t.dtype))
        )
        with _unknown_trips_as_zero():
            out = run(kernel, *pos, lnc=lnc, grid=lnc > 1, trace_only=True, **kw).outputs
        _STRUCTURES[key] = out
    return _STRUCTURES[key]


@contextlib.contextmanager
def _unknown_trips_as_zero() -> Iterator[None]:
    """Within the block, a trace-only device loop whose bound is a register loaded from
    memory (no value without data: the MoE kernels' block count) runs zero trips instead
    of failing. Only for finding a kernel's output shapes, which its allocations fix
    before any loop (as `dump_config(...).return_types` finds them by compiling)."""
    from ..interp import loops

    bound = loops._bound

    def lenient(x: Any, arg: str, where: str) -> int:
        if isinstance(x, loops.VirtualRegister) and x._value is None:
            return 0
        return bound(x, arg, where)

    with _lock:
        loops._bound = lenient  # type: ignore[assignment]
        try:
            yield
        finally:
            loops._bound = bound  # type: ignore[assignment]


def _specs(out: Any) -> Any:
    from ..interp.launch import TensorSpec

    if isinstance(out, (tuple, list)):
        return type(out)(_specs(v) for v in out)
    if out is None:
        return None
    if isinstance(out, np.ndarray):
        return TensorSpec(out.shape, out.dtype)
    return TensorSpec(tuple(out.shape), _np_dtype(out.dtype))


def _np_dtype(dtype: torch.dtype) -> Any:
    import ml_dtypes

    table = {
        torch.bfloat16: ml_dtypes.bfloat16,
        torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
        torch.float8_e5m2: ml_dtypes.float8_e5m2,
    }
    if dtype in table:
        return table[dtype]
    # a real (non-fake) tensor even while a FakeTensorMode is active (tracing)
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return torch.empty(0, dtype=dtype).numpy().dtype


@torch.library.custom_op("nki_standin::kernel_call", mutates_args=())
def kernel_call(call_id: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """One NKI kernel call on the (emulated) device: interpret it on host copies."""
    from ..interp.launch import run

    device = tensors[0].device if tensors else torch.device("cpu")
    hosts = [t.detach().cpu().clone() for t in tensors]
    kernel, lnc, pos, kw = _interp_args(call_id, hosts, lambda t: t)
    out = run(kernel, *pos, lnc=lnc, grid=lnc > 1, **kw).outputs
    _STRUCTURES[_structure_key(call_id, tensors)] = _specs(out)
    for t, h in zip(tensors, hosts):  # in-place writes of the kernel (eager only)
        if not torch.equal(t.detach().cpu(), h):
            with torch.no_grad():
                t.copy_(h.to(device))
    return [leaf.to(device) for leaf in _leaves(out)]


@kernel_call.register_fake
def _kernel_call_fake(call_id: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    device = tensors[0].device if tensors else torch.device("cpu")
    specs = _leaves(_output_structure(call_id, tensors))
    return [torch.empty(s.shape, dtype=_torch_dtype(s.dtype), device=device) for s in specs]


def handle_kernel_call(kernel: Any, lnc: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch-neuronx's side of `kernel[lnc](neuron tensors)` (see the module docstring)."""
    runtime = runtime_lnc()
    if lnc != runtime:
        raise RuntimeError(
            f"LNC mismatch: kernel launched with LNC={lnc} but {LNC_ENV_VAR}={runtime} for "
            f"the Neuron Runtime"
        )
    values = [*args, *kwargs.values()]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    template = tuple(_TENSOR if isinstance(v, torch.Tensor) else v for v in values)
    name = f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"
    key = (name, lnc, tuple(kwargs), template)
    with _lock:
        call_id = _CALL_IDS.get(key)
        if call_id is None:
            call_id = next(_ids)
            _CALL_IDS[key] = call_id
            _CALLS[call_id] = (kernel, lnc, template, tuple(kwargs))
    tracing = any(_is_traced(t) for t in tensors)
    if tracing:
        STATE.traced_calls += 1
    else:
        compile_key = (key, tuple((tuple(t.shape), t.dtype) for t in tensors))
        if compile_key in STATE.compiles:
            STATE.reuses += 1
        STATE.compiles.add(compile_key)
        STATE.calls_by_lnc[lnc] = STATE.calls_by_lnc.get(lnc, 0) + 1
    out = torch.ops.nki_standin.kernel_call(call_id, tensors)
    structure = _output_structure(call_id, tensors)
    return _rebuild(structure, iter(out))


def _is_traced(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return bool(is_fake(t)) or torch._C._dispatch_tls_local_include_set().has(
        torch._C.DispatchKey.Functionalize
    )


# ---- torch_neuronx's Python API ------------------------------------------------------------
def nki_op(
    name: str, fn: Callable[..., Any] | None = None, mutates_args: str | Iterable[str] = ()
) -> Any:
    """`torch_neuronx.nki_op`: a custom op whose fake is `fn` and whose body torch.compile
    traces (FunctionalTensorMode dispatch runs `fn` under the mode)."""

    def define(body: Callable[..., Any]) -> Any:
        from torch._library.infer_schema import infer_schema
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode

        op = torch.library.custom_op(
            name,
            body,
            mutates_args=mutates_args,
            schema=infer_schema(body, mutates_args=mutates_args),
        )
        op.register_fake(body)

        def decompose(mode: Any, func: Any, types_: Any, args: Any, kwargs: Any) -> Any:
            del func
            known = (torch.Tensor, FunctionalTensor)
            if any(not (issubclass(t, FakeTensor) or t in known) for t in types_):
                return NotImplemented
            with mode:
                return body(*args, **kwargs)

        op.register_torch_dispatch(FunctionalTensorMode, decompose)
        return op

    return define if fn is None else define(fn)


class _HOPCaller:
    """`NKIHOPCaller` of the pre-release source: only the grid handling is reproduced."""

    def __init__(self, kernel: Any, grid: tuple[int, ...]) -> None:
        self.kernel, self.grid = kernel, grid

    def __getitem__(self, grid: Any) -> _HOPCaller:
        return _HOPCaller(self.kernel, tuple(map(int, grid)))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        lnc = self.grid[0] if self.grid else 1
        return handle_kernel_call(self.kernel, lnc, args, kwargs)


def wrap_nki(kernel: Any) -> _HOPCaller:
    """`torch_neuronx.wrap_nki` of the pre-release source: reads `kernel.sign`."""
    kernel.sign  # noqa: B018 - the attribute access the source makes (NKI 0.6: absent)
    return _HOPCaller(kernel, ())


def _module() -> types.ModuleType:
    mod = types.ModuleType("torch_neuronx")
    mod.__spec__ = importlib.machinery.ModuleSpec("torch_neuronx", None)
    mod.__version__ = VERSION  # type: ignore[attr-defined]
    mod.nki_op = nki_op  # type: ignore[attr-defined]
    mod.wrap_nki = wrap_nki  # type: ignore[attr-defined]
    return mod


class _RealLookingBackend:
    """`torch.neuron` of the emulated device, minus `emulated` (a real-looking device)."""

    emulated = False

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def real_device(lnc: int | None = None) -> Iterator[types.ModuleType]:
    """Within the block this process looks like a trn2 host with TorchNeuron (see the
    module docstring); `lnc` sets `NEURON_LOGICAL_NC_CONFIG` for the block. Needs the
    emulated device (`neuron_device.install()`)."""
    from .. import nki as seam
    from ..interp import launch as interp_launch
    from ..runtime import lnc as runtime_lnc_mod
    from . import neuron_device

    if not neuron_device.is_installed():
        raise RuntimeError("real_device(): needs the emulated neuron device installed first")
    saved_env = os.environ.get(LNC_ENV_VAR)
    saved_neuron = torch.neuron  # type: ignore[attr-defined]
    saved_backend = seam.BACKEND
    saved_module = sys.modules.get("torch_neuronx")
    mod = _module()
    try:
        if lnc is not None:
            os.environ[LNC_ENV_VAR] = str(lnc)
        torch.neuron = _RealLookingBackend(saved_neuron)  # type: ignore[attr-defined]
        seam.BACKEND = "neuron"
        sys.modules["torch_neuronx"] = mod
        interp_launch.DEVICE_INTEGRATIONS.append(handle_kernel_call)
        runtime_lnc_mod.set_runtime_lnc(None)  # the edge reads the variable afresh
        yield mod
    finally:
        interp_launch.DEVICE_INTEGRATIONS.remove(handle_kernel_call)
        if saved_module is None:
            sys.modules.pop("torch_neuronx", None)
        else:
            sys.modules["torch_neuronx"] = saved_module
        seam.BACKEND = saved_backend
        torch.neuron = saved_neuron  # type: ignore[attr-defined]
        if saved_env is None:
            os.environ.pop(LNC_ENV_VAR, None)
        else:
            os.environ[LNC_ENV_VAR] = saved_env
        runtime_lnc_mod.set_runtime_lnc(None)


__all__ = [
    "LNC_ENV_VAR",
    "STATE",
    "StandinState",
    "handle_kernel_call",
    "kernel_call",
    "nki_op",
    "real_device",
    "runtime_lnc",
    "wrap_nki",
]
