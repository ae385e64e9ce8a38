"""Kernel launch: `nki.jit`, `kernel(...)`, `kernel[lnc](...)`, `nki.simulate` and `run()`.

Array arguments become HBM tensors (`nl.hbm`, or `nl.shared_hbm` under LNC2); other
arguments pass through as specialization-time values. The kernel body runs as eager
Python once per program (LNC core), exactly as the compiler's specialization does.
Returned tensors come back as the caller's array kind; inputs the kernel wrote to are
written back in place. NumPy's BLAS runs one thread while a kernel runs (`threads.py`).
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from ..targets import Target, get_target
from . import dtypes as dt
from . import state
from .errors import MemoryPlanError, NkiValidationError, fail
from .liveness import Liveness
from .memory import SBUF_ALIGN, SBUF_MIN_ALIGN
from .nkiobject import NKIObject
from .packing import last_resorts
from .programs import Programs
from .tensor import NkiTensor, Storage, hbm, row_major, shared_hbm
from .threads import one_blas_thread, quiet_stdout
from .trace import Trace


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a kernel argument or result, for trace-only runs."""

    shape: tuple[int, ...]
    dtype: Any

    def __post_init__(self) -> None:
        try:
            shape = tuple(operator.index(s) for s in self.shape)
        except TypeError:
            shape = ()
        if not shape or min(shape) < 1:
            raise fail(
                "LAUNCH", f"TensorSpec shape: expected a tuple of positive ints; got {self.shape!r}"
            )
        dtype = dt.as_dtype(self.dtype, "TensorSpec dtype")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)


@dataclass
class RunResult:
    """What one launch produced: outputs, the trace and the memory high-water marks."""

    outputs: Any
    trace: Trace

    @property
    def peak_sbuf_bytes(self) -> int:
        """Peak live SBUF bytes per partition over the programs."""
        return max(self.trace.peak_sbuf_bytes)

    @property
    def peak_psum_banks(self) -> int:
        """Peak live PSUM banks over the programs."""
        return max(self.trace.peak_psum_banks)


MX_SCALES = ("nki-0.6", "pre-0.5")  # quantize_mx block scale: NKI 0.5+, or the OCP sample one


@contextlib.contextmanager
def settings(
    target: str | Target | None = None,
    trace_only: bool | None = None,
    free_unused_tiles: bool | None = None,
    mx_scale: str | None = None,
    fresh_memory: str | None = None,
    compiler_schedule: bool | None = None,
) -> Iterator[None]:
    """Defaults for kernel calls made inside the block (`kernel(...)`, `kernel[2](...)`)
    by the calling thread (other threads keep their own settings).

    `free_unused_tiles` (default True): when a launch is replayed with last-use lifetimes
    (liveness.py), an on-chip tile no instruction touches is freed at once, as the
    compiler drops a dead allocation; False keeps its Python lifetime (a dry run of a
    reduced problem whose full size uses every buffer).
    `compiler_schedule` (default True): in that replay, memory is accounted as neuronx-cc's
    default flow schedules it -- each tile placed at its first access, and an instruction
    that reads PSUM into SBUF counted right after the last instruction it depends on
    (liveness.py); False places each tile at its allocation, in program order.
    `mx_scale="pre-0.5"`: `nisa.quantize_mx` uses the block scale of NKI before 0.5, the
    OCP sample algorithm's, half of NKI 0.5+'s (a compatibility mode for goldens written
    against it; the default "nki-0.6" is the documented current behaviour).
    `fresh_memory="zero"`: fresh allocations start as zeros instead of NaN / the integer
    sentinel ("poison", the default) -- a diagnostic: an output that changes with it
    depends on memory no instruction wrote.
    """
    if fresh_memory is not None and fresh_memory not in ("poison", "zero"):
        raise ValueError(f"fresh_memory: expected 'poison' or 'zero'; got {fresh_memory!r}")
    if mx_scale is not None and mx_scale not in MX_SCALES:
        raise ValueError(f"mx_scale: expected one of {', '.join(MX_SCALES)}; got {mx_scale!r}")
    new = dict(state.settings_now())
    if target is not None:
        new["target"] = get_target(target)
    for name, value in (
        ("trace_only", trace_only),
        ("free_unused_tiles", free_unused_tiles),
        ("compiler_schedule", compiler_schedule),
        ("mx_scale", mx_scale),
        ("fresh_memory", fresh_memory),
    ):
        if value is not None:
            new[name] = value
    token = state.SETTINGS.set(MappingProxyType(new))
    try:
        yield
    finally:
        state.SETTINGS.reset(token)


# ---- torch <-> numpy (bf16 / fp8 travel as raw bits) ------------------------------------
def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def _torch_bits() -> dict[Any, tuple[Any, np.dtype, dt.NkiDtype]]:
    """torch dtypes NumPy cannot hold: torch dtype -> (torch carrier, NumPy carrier, NKI dtype)."""
    import torch

    table: dict[Any, tuple[Any, np.dtype, dt.NkiDtype]] = {
        torch.bfloat16: (torch.int16, np.dtype(np.int16), dt.bfloat16),
        torch.float8_e4m3fn: (torch.uint8, np.dtype(np.uint8), dt.float8_e4m3fn),
        torch.float8_e5m2: (torch.uint8, np.dtype(np.uint8), dt.float8_e5m2),
    }
    if hasattr(torch, "float8_e8m0fnu"):
        table[torch.float8_e8m0fnu] = (torch.uint8, np.dtype(np.uint8), dt.float8_e8m0fnu)
    return table


def _torch_to_numpy(where: str, t: Any) -> np.ndarray:
    if t.device.type != "cpu":
        raise fail("LAUNCH", f"{where}: the interpreter takes CPU tensors; got {t.device}")
    import torch

    # a private copy: .numpy() on the caller's tensor would mark its storage not
    # resizable for good, and FSDP2 frees unsharded parameters with storage.resize_(0)
    t = t.detach().clone(memory_format=torch.contiguous_format)
    bits = _torch_bits().get(t.dtype)
    if bits is not None:
        return t.view(bits[0]).numpy().view(bits[2]._np)  # type: ignore[no-any-return]
    try:
        a = t.numpy()
        dt.as_dtype(a.dtype)
    except TypeError:
        raise fail("LAUNCH", f"{where}: torch dtype {t.dtype} is not an NKI dtype") from None
    return a  # type: ignore[no-any-return]


def _numpy_to_torch(a: np.ndarray) -> Any:
    import torch

    a = np.ascontiguousarray(a)
    for tdtype, (_, carrier, ndtype) in _torch_bits().items():
        if a.dtype == ndtype._np:
            return torch.from_numpy(a.view(carrier)).view(tdtype)
    if a.dtype == dt.float8_e4m3._np:
        # Trainium's e4m3 has no torch dtype: hand back the exact values as fp32
        return torch.from_numpy(a.astype(np.float32))
    return torch.from_numpy(a)


class _Arg:
    __slots__ = ("array", "kind", "tensor", "value")

    def __init__(self, kind: str, value: Any, array: np.ndarray | None) -> None:
        self.kind = kind
        self.value = value
        self.array = array
        self.tensor: NkiTensor | None = None


def _classify(where: str, x: Any, trace_only: bool) -> _Arg:
    if isinstance(x, TensorSpec):
        if not trace_only:
            raise fail("LAUNCH", f"{where}: a TensorSpec needs trace_only=True")
        return _Arg("spec", x, None)
    if _is_torch(x):
        return _Arg("torch", x, _nonempty(where, _torch_to_numpy(where, x)))  # type: ignore[arg-type]
    if isinstance(x, np.ndarray):
        try:
            dt.as_dtype(x.dtype)
        except TypeError:
            raise fail("LAUNCH", f"{where}: array dtype {x.dtype} is not an NKI dtype") from None
        return _Arg("numpy", x, _nonempty(where, x))
    if isinstance(x, list):
        raise fail("LAUNCH", f"{where}: lists are rejected by nki.jit; pass a tuple")
    if isinstance(x, NKIObject):  # specialization-time objects, hashable or not
        return _Arg("value", x, None)
    try:
        hash(x)
    except TypeError:
        raise fail(
            "LAUNCH",
            f"{where}: non-tensor arguments must be hashable (they key the compile cache); "
            f"got {type(x).__name__}",
        ) from None
    return _Arg("value", x, None)


def _nonempty(where: str, a: np.ndarray) -> np.ndarray:
    if a.size == 0:
        raise fail(
            "LAUNCH", f"{where}: an NKI tensor needs every dim >= 1; got an empty array {a.shape}"
        )
    return a


def _wrap(arg: _Arg, buffer: Any, launch: state.Launch) -> NkiTensor:
    if arg.kind == "spec":
        shape, d, data = arg.value.shape, arg.value.dtype, None
    else:
        a = arg.array
        assert a is not None
        shape = a.shape if a.ndim else (1,)
        d = dt.as_dtype(a.dtype)
        data = None if launch.trace_only else _borrow(a)
    st = Storage(launch, tuple(shape), d, buffer, data=data)
    st.is_input = True
    st.borrowed = data is not None
    return NkiTensor(st, tuple(shape), row_major(tuple(shape)), 0, d)


def _borrow(a: np.ndarray) -> np.ndarray:
    """A read-only flat view of input `a` (copied only if it is not contiguous): the
    storage copies it at its first write (`Storage.own`), so inputs the kernel only
    reads are never copied -- for AWS's model-sized MoE tests, gigabytes per launch."""
    flat = np.ascontiguousarray(a).reshape(-1).view()
    flat.flags.writeable = False
    return flat


def _result(t: Any, trace_only: bool, as_torch: bool) -> Any:
    if t is None:
        return None
    if isinstance(t, tuple):
        return tuple(_result(x, trace_only, as_torch) for x in t)
    if isinstance(t, list):
        return [_result(x, trace_only, as_torch) for x in t]
    if not isinstance(t, NkiTensor):
        return t
    st = t.storage
    if st.buffer.on_chip:
        raise fail("LAUNCH", f"kernel output '{t.name}' must be an HBM tensor; got {t.buffer!r}")
    if st.buffer is hbm and not st.is_input:
        raise fail(
            "LAUNCH",
            f"kernel output '{t.name}' is private HBM (nl.hbm); allocate outputs with "
            "buffer=nl.shared_hbm",
        )
    if t.indirect is not None:
        raise fail("LAUNCH", f"kernel output '{t.name}' is an indirect view")
    if trace_only:
        return TensorSpec(t.shape, t.dtype)
    out = t.array().copy()
    return _numpy_to_torch(out) if as_torch else out


def run(
    kernel: Callable[..., Any] | Kernel | _Launcher,
    *args: Any,
    lnc: int = 1,
    target: str | Target | None = None,
    trace_only: bool | None = None,
    grid: bool | None = None,
    **kwargs: Any,
) -> RunResult:
    """Interpret `kernel` on `args`; return outputs and the instruction trace.

    `target` is 'trn1' | 'trn2' | 'trn3' (default: the `settings()` block, else
    NEURON_PLATFORM_TARGET_OVERRIDE, else trn2). `lnc=2` runs two programs that share
    HBM. `trace_only=True` skips the arithmetic: arguments may be `TensorSpec`s and
    outputs come back as `TensorSpec`s. These keywords are `run`'s own; a kernel
    parameter of the same name (`lnc`, `target`, ...) is passed with `run_call`.
    """
    return run_call(kernel, args, kwargs, lnc=lnc, target=target, trace_only=trace_only, grid=grid)


def run_call(
    kernel: Callable[..., Any] | Kernel | _Launcher,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    lnc: int = 1,
    target: str | Target | None = None,
    trace_only: bool | None = None,
    grid: bool | None = None,
) -> RunResult:
    """`run` with the kernel's arguments as a tuple and a dict: every keyword in `kwargs`
    reaches the kernel, also one named like an option of `run` (AWS's test wrappers take
    `lnc`)."""
    if isinstance(kernel, _Launcher):  # run(kernel[2], ...)
        lnc, grid, kernel = kernel.lnc, True if grid is None else grid, kernel.kernel
    if isinstance(kernel, Kernel):
        kernel.check_language()
    fn = kernel.fn if isinstance(kernel, Kernel) else kernel
    if type(lnc) is not int or not 1 <= lnc <= 2:
        raise fail("LAUNCH", f"lnc: expected 1 or 2; got {lnc!r}")
    tgt = get_target(target if target is not None else state.settings_now()["target"])
    t_only = bool(state.settings_now()["trace_only"] if trace_only is None else trace_only)
    wrapped = [_classify(f"argument {i}", a, t_only) for i, a in enumerate(args)]
    kw_wrapped = {k: _classify(f"argument {k!r}", v, t_only) for k, v in kwargs.items()}
    every = [*wrapped, *kw_wrapped.values()]

    def attempt(
        liveness: Liveness | None,
        rotate: bool = True,
        arithmetic: bool = True,
        granule: int = SBUF_ALIGN,
    ) -> tuple[Any, state.Launch]:
        launch = state.Launch(tgt, lnc, t_only or not arithmetic)
        launch.grid = lnc > 1 if grid is None else grid
        launch.liveness = liveness
        if liveness is not None:
            liveness.reset()
        for prog in launch.programs:
            prog.memory.set_rotation(rotate)
            prog.memory.set_granule(granule)
        if not rotate:  # a replay: the kernel's prints were shown by the first attempt
            with quiet_stdout():
                return _interpret(fn, launch, wrapped, kw_wrapped), launch
        return _interpret(fn, launch, wrapped, kw_wrapped), launch

    def placed(liveness: Liveness | None, granule: int = SBUF_ALIGN) -> tuple[Any, state.Launch]:
        # Rotating placement (memory.py) first; where its fragmentation overflows a plan
        # that lowest-address first-fit places, first-fit.
        try:
            return attempt(liveness, granule=granule)
        except MemoryPlanError as e:
            if not getattr(e, "fragmented", False):
                raise
            _drop_frames(e)
            return attempt(liveness, rotate=False, granule=granule)

    try:
        result, launch = placed(None)
    except MemoryPlanError as first:
        _drop_frames(first)
        # The plan with Python lifetimes overflows: replay with the compiler's lifetimes
        # (each tile freed after its last use; see liveness.py).
        recorder = _record_uses(attempt)
        free_unused = bool(state.settings_now()["free_unused_tiles"])
        try:
            plan = Liveness(
                recorder.counts,
                free_unused=free_unused,
                reorder=recorder.reorder,
                spans=recorder.spans,
                ranges=recorder.live_ranges(),
            )
            try:
                result, launch = placed(plan)
            except MemoryPlanError as e:
                if e.rule != "SBUF_OVERFLOW":
                    raise
                _drop_frames(e)
                # the last resort before an overflow: tiles at the finest alignment the
                # public sources allow (memory.py, SBUF_MIN_ALIGN), then fills and loads
                # deferred to their tiles' first reads (liveness.py)
                try:
                    result, launch = placed(plan, SBUF_MIN_ALIGN)
                except MemoryPlanError as e2:
                    if e2.rule != "SBUF_OVERFLOW" or not recorder.reorder:
                        raise
                    _drop_frames(e2)
                    result, launch = last_resorts(recorder, free_unused, placed, e2, _drop_frames)
        except MemoryPlanError as e:
            msg = str(e).rsplit(" (rule ", 1)[0]
            raise MemoryPlanError(
                e.rule,
                _even_with(
                    msg, recorder.reorder, e.rule == "SBUF_OVERFLOW", getattr(e, "tried", "")
                ),
            ) from first
    if not t_only:
        _write_back(every)
    return RunResult(result, launch.trace)


def _even_with(msg: str, reorder: bool, fine: bool = False, more: str = "") -> str:
    """An overflow message of the replay: what the replay tried, before the live list."""
    head, sep, tiles = msg.partition("; live: ")
    tried = ", even with every tile freed after its last use"
    if reorder:
        tried += f" (placed at its first use, PSUM read-outs moved up{more})"
    if fine:
        tried += f" and placed at {SBUF_MIN_ALIGN}-byte alignment"
    return head + tried + sep + tiles


def _drop_frames(e: BaseException) -> None:
    """Free the frames of a failed attempt before the next one runs: its traceback holds
    the kernel's locals, i.e. that attempt's copies of the inputs and its tiles (for
    AWS's model-sized MoE tests, gigabytes). The error keeps its message and chain."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        cur.__traceback__ = None
        cur = cur.__cause__ or cur.__context__


def _record_uses(attempt: Callable[..., Any]) -> Liveness:
    """The recording pass of a liveness replay: the use count of every on-chip tile.

    The counts depend only on which instructions the kernel issues, never on the data
    (the meta-program is deterministic), so the pass skips the arithmetic; a kernel
    whose control flow reads values from memory (a register-bounded loop), which a
    trace-only run cannot follow, is recorded with its arithmetic.
    """
    with quiet_stdout():  # kernel prints: once per replay
        reorder = bool(state.settings_now()["compiler_schedule"])
        recorder = Liveness(reorder=reorder)
        try:
            _, launch = attempt(recorder, arithmetic=False)
        except NkiValidationError:
            recorder = Liveness(reorder=reorder)
            _, launch = attempt(recorder)
    # the instructions a `depends_on` edge names keep their place (liveness.py)
    recorder.named = {p for i in launch.trace.instrs for p in i.attrs.get("depends_on", ())}
    return recorder


def _interpret(
    fn: Callable[..., Any], launch: state.Launch, wrapped: list[_Arg], kw_wrapped: dict[str, _Arg]
) -> Any:
    """Run the kernel body once in `launch`; the launch's outputs."""
    t_only = launch.trace_only
    lnc = launch.lnc
    every = [*wrapped, *kw_wrapped.values()]
    as_torch = any(a.kind == "torch" for a in every)
    buffer = shared_hbm if lnc > 1 else hbm
    outputs: Any = None
    state.push(launch)
    try:
        for a in every:
            if a.kind != "value":
                a.tensor = _wrap(a, buffer, launch)
        call_args = [a.tensor if a.tensor is not None else a.value for a in wrapped]
        call_kw = {
            k: (a.tensor if a.tensor is not None else a.value) for k, a in kw_wrapped.items()
        }
        with one_blas_thread():
            if lnc == 1:
                outputs = fn(*call_args, **call_kw)
            else:
                launch.concurrent = Programs(launch)
                outputs = launch.concurrent.run(lambda: fn(*call_args, **call_kw))[0]
        launch.program_id = 0
        launch.finish()
        return _result(outputs, t_only, as_torch)
    finally:
        state.pop()


def _write_back(args: list[_Arg]) -> None:
    """Copy the data of inputs the kernel wrote into the caller's arrays, in place."""
    for a in args:
        if a.tensor is None or not a.tensor.storage.dirty:
            continue
        data = a.tensor.storage.data
        assert data is not None and a.array is not None
        if a.kind == "numpy":
            a.value[...] = data.reshape(a.value.shape)
        elif a.kind == "torch":
            a.value.detach().copy_(_numpy_to_torch(data.reshape(a.array.shape)))


# `nki.jit` "detects the current framework by inspecting its arguments" and, for torch
# tensors, "uses PyTorch integration" (nki/api/nki/__init__.py). Torch tensors on a device
# other than the CPU go to the integration registered here: TorchNeuron's on hardware,
# `nki_kernels.testing.torch_neuronx_standin` in tests. Each entry is
# `handler(kernel, lnc, args, kwargs) -> outputs`; empty: the interpreter takes CPU only.
DEVICE_INTEGRATIONS: list[Callable[..., Any]] = []


def _device_call(kernel: Kernel, lnc: int, args: Any, kwargs: Any) -> tuple[bool, Any]:
    if DEVICE_INTEGRATIONS and any(
        _is_torch(a) and a.device.type != "cpu" for a in (*args, *kwargs.values())
    ):
        return True, DEVICE_INTEGRATIONS[-1](kernel, lnc, args, kwargs)
    return False, None


# The language check parses kernel source with `ast`, whose recursion-depth bookkeeping
# is not thread-safe in CPython 3.11 (two threads parsing at once can raise SystemError
# "AST constructor recursion depth mismatch"): checks run one at a time, once per kernel.
_LANGUAGE_CHECK = threading.Lock()


class Kernel:
    """An `nki.jit` kernel: call it, or index it with an LNC count (`kernel[2](...)`)."""

    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        sig = inspect.signature(fn)
        if any(p.kind is inspect.Parameter.KEYWORD_ONLY for p in sig.parameters.values()):
            raise fail("LAUNCH", f"kernel {fn.__name__}: signatures may not use the '*' separator")
        if "platform_target" in options:
            raise fail("LAUNCH", "nki.jit(platform_target=...) is gone; set the target per run")
        self.fn = fn
        self.options = options  # mode=, debug_kernel=, ... are accepted and ignored
        self.__name__ = fn.__name__
        self.__qualname__ = getattr(fn, "__qualname__", fn.__name__)
        self.__module__ = fn.__module__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        self._checked = False

    def check_language(self) -> None:
        """Check the kernel and the functions it reaches against the NKI language subset
        (once, at the first launch, when every helper it names exists; rule LANGUAGE)."""
        if self._checked:
            return
        from .subset import TRANSITIONAL, check_kernel

        with _LANGUAGE_CHECK:  # threads launching a kernel first at once: one checks
            if self._checked:
                return
            try:
                check_kernel(self.fn)
            except NkiValidationError as e:
                if not self.fn.__module__.startswith(TRANSITIONAL):
                    raise
                warnings.warn(str(e), state.InterpreterWarning, stacklevel=3)
            self._checked = True

    def __repr__(self) -> str:
        return f"Kernel({self.fn.__module__}.{self.fn.__qualname__})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the kernel; returns its outputs. Called from inside a running kernel it is
        inlined into the caller's program, as the compiler does (same program_id, memory
        and trace; tensors pass through)."""
        if state.active() is not None:
            return self.fn(*args, **kwargs)
        handled, out = _device_call(self, 1, args, kwargs)
        return out if handled else run_call(self, args, kwargs).outputs

    def __getitem__(self, lnc: Any) -> _Launcher:
        if isinstance(lnc, tuple) or type(lnc) is not int or not 1 <= lnc <= 2:
            raise fail(
                "LAUNCH", f"kernel[{lnc!r}]: takes one LNC integer, 1 or 2 (SPMD grids are gone)"
            )
        return _Launcher(self, lnc)


class _Launcher:
    def __init__(self, kernel: Kernel, lnc: int) -> None:
        self.kernel = kernel
        self.lnc = lnc

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        launch = state.active()
        if launch is not None:
            if self.lnc != launch.lnc:
                raise fail(
                    "LAUNCH",
                    f"{self.kernel.__name__}[{self.lnc}] called inside a kernel launched "
                    f"with LNC {launch.lnc}: an inlined kernel runs in the caller's programs",
                )
            return self.kernel.fn(*args, **kwargs)
        handled, out = _device_call(self.kernel, self.lnc, args, kwargs)
        if handled:
            return out
        return run_call(self.kernel, args, kwargs, lnc=self.lnc, grid=True).outputs


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
