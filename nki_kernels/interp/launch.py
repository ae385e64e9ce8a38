"""Kernel launch: `nki.jit`, `kernel(...)`, `kernel[lnc](...)`, `nki.simulate` and `run()`.

Array arguments become HBM tensors (`nl.hbm`, or `nl.shared_hbm` under LNC2); other
arguments pass through as specialization-time values. The kernel body runs as eager
Python once per program (LNC core), exactly as the compiler's specialization does.
Returned tensors come back as the caller's array kind; inputs the kernel wrote to are
written back in place.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..targets import Target, get_target
from . import dtypes as dt
from . import state
from .errors import fail
from .tensor import NkiTensor, hbm, shared_hbm
from .trace import Trace


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a kernel argument or result, for trace-only runs."""

    shape: tuple[int, ...]
    dtype: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", dt.as_dtype(self.dtype))


@dataclass
class RunResult:
    """What one launch produced: outputs, the trace and the memory high-water marks."""

    outputs: Any
    trace: Trace

    @property
    def peak_sbuf_bytes(self) -> int:
        return max(self.trace.peak_sbuf_bytes)

    @property
    def peak_psum_banks(self) -> int:
        return max(self.trace.peak_psum_banks)


_settings: dict[str, Any] = {"target": None, "trace_only": False}


@contextlib.contextmanager
def settings(target: str | Target | None = None, trace_only: bool | None = None) -> Iterator[None]:
    """Defaults for kernel calls made inside the block (`kernel(...)`, `kernel[2](...)`)."""
    saved = dict(_settings)
    if target is not None:
        _settings["target"] = get_target(target)
    if trace_only is not None:
        _settings["trace_only"] = trace_only
    try:
        yield
    finally:
        _settings.update(saved)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _torch_to_numpy(t: Any) -> np.ndarray:
    import torch

    if t.device.type != "cpu":
        raise fail("LAUNCH", f"the interpreter takes CPU tensors; got a tensor on {t.device}")
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(dt.bfloat16)
    return t.contiguous().numpy()


def _numpy_to_torch(a: np.ndarray) -> Any:
    import torch

    if a.dtype == dt.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


class _Arg:
    __slots__ = ("kind", "value", "array", "tensor")

    def __init__(self, kind: str, value: Any, array: np.ndarray | None) -> None:
        self.kind = kind
        self.value = value
        self.array = array
        self.tensor: NkiTensor | None = None


def _classify(i: int, x: Any, trace_only: bool) -> _Arg:
    if isinstance(x, list):
        raise fail("LAUNCH", f"argument {i}: lists are rejected by nki.jit; pass a tuple")
    if isinstance(x, TensorSpec):
        if not trace_only:
            raise fail("LAUNCH", f"argument {i}: a TensorSpec needs trace_only=True")
        return _Arg("spec", x, None)
    if _is_torch(x):
        return _Arg("torch", x, _torch_to_numpy(x))
    if isinstance(x, np.ndarray):
        try:
            dt.as_dtype(x.dtype)
        except TypeError:
            raise fail(
                "LAUNCH", f"argument {i}: array dtype {x.dtype} is not an NKI dtype"
            ) from None
        return _Arg("numpy", x, x)
    return _Arg("value", x, None)


def _wrap(arg: _Arg, buffer: Any, trace_only: bool) -> NkiTensor:
    if arg.kind == "spec":
        spec = arg.value
        return _make_input(spec.shape, spec.dtype, buffer, None)
    a = arg.array
    assert a is not None
    shape = a.shape if a.ndim else (1,)
    d = dt.as_dtype(a.dtype)
    data = None if trace_only else np.ascontiguousarray(a).reshape(-1).copy()
    return _make_input(shape, d, buffer, data)


def _make_input(shape: tuple[int, ...], d: np.dtype, buffer: Any, data: np.ndarray | None) -> NkiTensor:
    from .tensor import NkiTensor as _T
    from .tensor import Storage, _row_major

    launch = state.current()
    st = Storage(launch, tuple(shape), d, buffer, data=data)
    if data is None and not launch.trace_only:
        raise AssertionError("numeric inputs need data")
    return _T(st, tuple(shape), _row_major(tuple(shape)), 0, d)


def _result(t: Any, trace_only: bool, as_torch: bool) -> Any:
    if t is None:
        return None
    if isinstance(t, tuple):
        return tuple(_result(x, trace_only, as_torch) for x in t)
    if isinstance(t, list):
        return [_result(x, trace_only, as_torch) for x in t]
    if not isinstance(t, NkiTensor):
        return t
    if t.buffer is not shared_hbm and t.buffer is not hbm:
        raise fail("LAUNCH", f"kernel output '{t.name}' must be an HBM tensor; got {t.buffer!r}")
    if trace_only:
        return TensorSpec(t.shape, t.dtype)
    out = t.array().copy()
    return _numpy_to_torch(out) if as_torch else out


def run(
    kernel: Callable[..., Any] | Kernel,
    *args: Any,
    lnc: int = 1,
    target: str | Target | None = None,
    trace_only: bool | None = None,
    grid: bool | None = None,
    **kwargs: Any,
) -> RunResult:
    """Interpret `kernel` on `args`; return outputs and the instruction trace.

    `target` is 'trn1' | 'trn2' | 'trn3' (default: NEURON_PLATFORM_TARGET_OVERRIDE, else
    trn2). `trace_only=True` skips the arithmetic: arguments may be `TensorSpec`s and
    outputs come back as `TensorSpec`s.
    """
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    if not isinstance(lnc, int) or lnc < 1 or lnc > 2:
        raise fail("LAUNCH", f"lnc must be 1 or 2; got {lnc!r}")
    tgt = get_target(target if target is not None else _settings["target"])
    t_only = bool(_settings["trace_only"] if trace_only is None else trace_only)
    launch = state.Launch(tgt, lnc, t_only)
    launch.grid = lnc > 1 if grid is None else grid
    wrapped = [_classify(i, a, t_only) for i, a in enumerate(args)]
    kw_wrapped = {k: _classify(-1, v, t_only) for k, v in kwargs.items()}
    as_torch = any(a.kind == "torch" for a in [*wrapped, *kw_wrapped.values()])
    buffer = shared_hbm if lnc > 1 else hbm
    outputs: Any = None
    state.push(launch)
    try:
        for a in [*wrapped, *kw_wrapped.values()]:
            if a.kind in ("numpy", "torch", "spec"):
                a.tensor = _wrap(a, buffer, t_only)
        for pid in range(lnc):
            launch.program_id = pid
            call_args = [a.tensor if a.tensor is not None else a.value for a in wrapped]
            call_kw = {k: (a.tensor if a.tensor is not None else a.value) for k, a in kw_wrapped.items()}
            ret = fn(*call_args, **call_kw)
            if pid == 0:
                outputs = ret
        launch.finish()
        result = _result(outputs, t_only, as_torch)
    finally:
        state.pop()
    if not t_only:
        for a in [*wrapped, *kw_wrapped.values()]:
            if a.tensor is not None and a.tensor.storage.dirty:
                data = a.tensor.storage.data
                assert data is not None
                if a.kind == "numpy":
                    a.value[...] = data.reshape(a.value.shape)
                elif a.kind == "torch":
                    a.value.copy_(_numpy_to_torch(data.reshape(a.array.shape)))
    return RunResult(result, launch.trace)


class Kernel:
    """An `nki.jit` kernel: call it, or index it with an LNC count (`kernel[2](...)`)."""

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        sig = inspect.signature(fn)
        if any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.parameters.values()):
            raise fail("LAUNCH", f"kernel {fn.__name__}: signatures may not use the '*' separator")
        self.fn = fn
        self.options = options  # mode=, debug_kernel=, ... are accepted and ignored
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"Kernel({self.fn.__module__}.{self.fn.__qualname__})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run(self, *args, **kwargs).outputs

    def __getitem__(self, lnc: Any) -> _Launcher:
        if isinstance(lnc, tuple):
            raise fail("LAUNCH", f"kernel[{lnc}]: SPMD grids are gone; pass one LNC integer")
        return _Launcher(self, lnc)


class _Launcher:
    def __init__(self, kernel: Kernel, lnc: int) -> None:
        self.kernel = kernel
        self.lnc = lnc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run(self.kernel, *args, lnc=self.lnc, grid=True, **kwargs).outputs


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """`@nki.jit` / `@nki.jit(**options)`: make a launchable kernel."""
    if fn is None:
        return lambda f: Kernel(f, **options)
    return Kernel(fn, **options)


def simulate(kernel: Any) -> Callable[..., Any]:
    """`nki.simulate(kernel)(*args)`: run in the interpreter (plain functions are wrapped)."""
    if isinstance(kernel, _Launcher):
        return kernel
    if not isinstance(kernel, Kernel):
        kernel = Kernel(kernel)
    return kernel
