"""An emulated `neuron` device: PyTorch's Python PrivateUse1 backend backed by host memory.

Without TorchNeuron there is no `neuron` device, yet the ops' neuron dispatch, autograd on
neuron tensors, `nn.Module.to("neuron")` and `torch.compile` over neuron tensors must be
tested. `install()` renames PrivateUse1 to `neuron` (through
`torch.utils.backend_registration._setup_privateuseone_for_python_backend`, torch >= 2.10)
and implements the device in Python:

Memory model
    Every neuron storage is created here, with the right byte size and a data pointer into
    a host (CPU) storage allocated alongside it. The neuron storage does not own that
    memory; the host storage is kept alive in `_LIVE`, keyed by the neuron storage's
    identity (`untyped_storage()._cdata`), and a `weakref.finalize` on the neuron storage
    drops the entry when the storage dies. (PyTorch preserves a storage's Python object
    while C++ still holds the storage, so the finalizer runs only when the last tensor
    using it -- including C++-made aliases such as `detach()` -- is gone.)

    Because sizes are right, PyTorch's own C++ view machinery works on neuron tensors and
    a view shares its base's storage. A tensor's host data is then the host storage seen
    through the tensor's own sizes, strides and offset (`host_view`), so an in-place write
    through any view lands in the base's memory.

Dispatch
    Explicit PrivateUse1 kernels: `empty.memory_format`, `empty_strided`, `_copy_from`,
    `_copy_from_and_resize`, `resize_` and the `set_` overloads (metadata and storage
    changes must happen on the neuron tensor itself). Everything else goes through one
    boxed fallback that runs the op on host views (neuron devices in the arguments mapped
    to `cpu`) and maps the results back: a result that aliases an argument's memory
    becomes a neuron alias of that argument's storage, a fresh result adopts its CPU
    storage as the host memory of a new neuron storage (no copy), and a geometry change
    of an argument (in-place metadata ops) is applied to the neuron tensor. Host views
    have fixed-size storages, so an `out=` argument that must grow makes the op run
    again into scratch tensors, copied back with a resize. `detach` is deliberately not
    overridden (`nn.Parameter` needs the C++ alias).

Safety
    `install()` never renames PrivateUse1 when a real `neuron` backend is registered, or
    when `torch_neuronx` is importable (it registers the real one when imported): it then
    returns False and changes nothing. A PrivateUse1 already claimed under another name is
    an error. The backend module registered as `torch.neuron` carries `emulated = True`
    so the runtime can tell the emulation from the real device.
"""

from __future__ import annotations

import importlib.util
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

DEVICE_NAME = "neuron"
_CPU = torch.device("cpu")
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

_lock = threading.Lock()
_installed = False
# Set when install() found the autograd engine already running: the device is registered
# (PrivateUse1 cannot be unregistered) but unusable; every later use raises this instead
# of reaching PyTorch's internal assert on the engine's device queues.
_unusable: str | None = None
_libs: list[torch.library.Library] = []
# neuron storage identity -> the host storage that holds its bytes
_LIVE: dict[int, torch.UntypedStorage] = {}


class _EmulatedBackendModule:
    """`torch.neuron` for the emulated device (one device, always available)."""

    emulated = True

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def _is_in_bad_fork(self) -> bool:
        return False

    # torch.autocast("neuron") asks the backend module which low-precision dtypes it takes.
    def get_amp_supported_dtype(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    # Random ops run on the host through the fallback, so the device's generator is the CPU's.
    def manual_seed_all(self, seed: int) -> None:
        torch.default_generator.manual_seed(seed)

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        del device
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        del device
        torch.set_rng_state(state)

    def synchronize(self, device: Any = None) -> None:
        del device


def is_installed() -> bool:
    """True when this process runs the emulated neuron device."""
    return _installed


def real_neuron_backend_present() -> bool:
    """True when a real `neuron` backend owns PrivateUse1 or TorchNeuron is importable."""
    name = torch._C._get_privateuse1_backend_name()
    if name == DEVICE_NAME and not _installed:
        return True
    return importlib.util.find_spec("torch_neuronx") is not None


def install() -> bool:
    """Make `neuron` an emulated device backed by host memory; idempotent.

    Returns True when the emulated device is active, False when a real neuron backend is
    present (TorchNeuron registered or importable) -- then nothing is changed. Raises
    RuntimeError when PrivateUse1 already belongs to another backend, or when autograd's
    engine started before the device existed.

    Call it before the first `.backward()` of the process (e.g. at the top of a
    `conftest.py`): the autograd engine sizes its per-device queues once, when it first
    runs, and a device registered later cannot take part in backward passes.
    """
    global _installed
    with _lock:
        if _unusable is not None:
            raise RuntimeError(_unusable)
        if _installed:
            return True
        if real_neuron_backend_present():
            return False
        name = torch._C._get_privateuse1_backend_name()
        if name != "privateuseone":
            raise RuntimeError(
                f"install(): PrivateUse1 is already registered as {name!r}; the emulated "
                f"{DEVICE_NAME!r} device needs it unclaimed"
            )
        from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

        _setup_privateuseone_for_python_backend(
            DEVICE_NAME, backend_module=_EmulatedBackendModule()
        )
        _register_kernels()
        _installed = True
    _check_autograd_engine()
    return True


def _check_autograd_engine() -> None:
    global _unusable
    x = torch.ones(1, device=DEVICE_NAME, requires_grad=True)
    try:
        (x * 2).sum().backward()
    except RuntimeError as e:
        if "device_ready_queues_" not in str(e):
            raise
        _unusable = (
            "install(): the autograd engine started before the emulated neuron device was "
            "registered, so backward passes on neuron tensors cannot run in this process; "
            "call nki_kernels.testing.neuron_device.install() before the first backward "
            "(for pytest: at import time of the root conftest.py)"
        )
        raise RuntimeError(_unusable) from None


def live_storages() -> int:
    """Number of neuron storages whose host memory is still held (for leak tests)."""
    return len(_LIVE)


def live_bytes() -> int:
    """Host bytes held for live neuron storages."""
    return sum(s.nbytes() for s in list(_LIVE.values()))


# ---------------------------------------------------------------------------------------
# storages and tensors


def _release(key: int) -> None:
    _LIVE.pop(key, None)


def _adopt(host: Any) -> Any:
    """A neuron storage whose bytes are `host`'s; `host` lives as long as it does."""
    device = torch.device(DEVICE_NAME, 0)
    st = torch._C._construct_storage_from_data_pointer(host.data_ptr(), device, host.nbytes())
    key = st._cdata
    _LIVE[key] = host
    weakref.finalize(st, _release, key)
    return st


def _set_neuron(t: torch.Tensor, storage: Any, offset: Any, size: Any, stride: Any) -> torch.Tensor:
    # The CPU kernel of set_ only edits TensorImpl metadata, which is device-neutral.
    op = torch.ops.aten.set_.source_Storage_storage_offset
    return op.redispatch(_CPU_KEYS, t, storage, offset, list(size), list(stride))


def _neuron_on(
    storage: Any, dtype: torch.dtype, offset: Any, size: Any, stride: Any
) -> torch.Tensor:
    shell = torch._C._acc.create_empty_tensor((0,), dtype)
    return _set_neuron(shell, storage, offset, size, stride)


def _wrap_host(cpu: torch.Tensor) -> torch.Tensor:
    """A new neuron tensor over `cpu`'s memory (adopted, not copied), same geometry."""
    if _unusable is not None:
        raise RuntimeError(f"neuron device unusable: {_unusable}")
    st = _adopt(cpu.untyped_storage())
    return _neuron_on(st, cpu.dtype, cpu.storage_offset(), cpu.size(), cpu.stride())


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing the host memory of neuron tensor `t` (same sizes/strides).

    Valid while `t` (or another user of its storage) is alive; writes go to `t`'s memory.
    """
    if t.device.type != DEVICE_NAME:
        raise ValueError(f"host_view: expected a {DEVICE_NAME} tensor; got one on {t.device}")
    st = t.untyped_storage()
    if st._cdata not in _LIVE:
        raise RuntimeError("host_view: this neuron storage was not created by the emulated device")
    # Non-owning and fixed-size on purpose: a CPU kernel must never reallocate it.
    view_st = torch._C._construct_storage_from_data_pointer(st.data_ptr(), _CPU, st.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(view_st, t.storage_offset(), t.size(), t.stride())


def _host(x: torch.Tensor) -> torch.Tensor:
    return host_view(x) if x.device.type == DEVICE_NAME else x


def _contiguous_strides(size: Any) -> list[int]:
    strides, acc = [], 1
    for s in reversed(list(size)):
        strides.append(acc)
        acc *= max(int(s), 1)
    return strides[::-1]


# ---------------------------------------------------------------------------------------
# explicit kernels


def _empty_memory_format(
    size: Any,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
    memory_format: Any = None,
) -> torch.Tensor:
    del layout, device, pin_memory
    fmt = memory_format if memory_format is not None else torch.contiguous_format
    cpu = torch.empty(size, dtype=dtype, memory_format=fmt)
    return _wrap_host(cpu)


def _empty_strided(
    size: Any,
    stride: Any,
    dtype: torch.dtype | None = None,
    layout: Any = None,
    device: Any = None,
    pin_memory: Any = None,
) -> torch.Tensor:
    del layout, device, pin_memory
    return _wrap_host(torch.empty_strided(size, stride, dtype=dtype))


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    del non_blocking
    _host(dst).copy_(_host(src))
    return dst


def _resize_(self: torch.Tensor, size: Any, memory_format: Any = None) -> torch.Tensor:
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        raise NotImplementedError(f"resize_ on {DEVICE_NAME}: memory_format {memory_format}")
    size = [int(s) for s in size]
    if list(self.size()) == size:
        return self  # as on CPU: same sizes keep the strides
    numel = 1
    for s in size:
        numel *= s
    needed = (self.storage_offset() + numel) * self.element_size() if numel else 0
    st = self.untyped_storage()
    if needed > st.nbytes():
        host = torch.empty(needed, dtype=torch.uint8).untyped_storage()
        if st.nbytes():
            old = torch._C._construct_storage_from_data_pointer(st.data_ptr(), _CPU, st.nbytes())
            host[: st.nbytes()].copy_(old)
        st = _adopt(host)
    return _set_neuron(self, st, self.storage_offset(), size, _contiguous_strides(size))


def _copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    _resize_(dst, src.size())
    return _copy_from(src, dst)


def _redispatch_cpu(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        return op.redispatch(_CPU_KEYS, *args, **kwargs)

    return kernel


# ---------------------------------------------------------------------------------------
# boxed fallback


def _map(x: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(x, (list, tuple)):
        return type(x)(_map(v, fn) for v in x)
    return fn(x)


def _geometry(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(t.size()), t.stride(), t.storage_offset()


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return _run_on_host(op, args, kwargs, grow_outs=False)
    except RuntimeError as e:
        if "not resizable" not in str(e):
            raise
    # Host views have fixed-size storages: an out= argument that must grow gets a
    # scratch CPU tensor instead, copied back with a resize.
    return _run_on_host(op, args, kwargs, grow_outs=True)


def _run_on_host(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grow_outs: bool) -> Any:
    originals: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(host) -> (neuron, host)
    by_ptr: dict[int, torch.Tensor] = {}  # host data pointer -> a neuron tensor on it
    scratch: list[tuple[torch.Tensor, torch.Tensor]] = []  # (neuron out, CPU scratch)

    def to_host(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == DEVICE_NAME:
            hv = host_view(x)
            originals[id(hv)] = (x, hv)
            if x.untyped_storage().nbytes():
                by_ptr[x.untyped_storage().data_ptr()] = x
            return hv
        if isinstance(x, torch.device) and x.type == DEVICE_NAME:
            return _CPU
        return x

    def to_scratch(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.device.type == DEVICE_NAME:
            tmp = torch.empty(0, dtype=x.dtype)
            scratch.append((x, tmp))
            return tmp
        return x

    out_names = set()
    if grow_outs:
        out_names = {
            a.name
            for a in op._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        }
    h_args = [_map(a, to_host) for a in args]
    h_kwargs = {k: _map(v, to_scratch if k in out_names else to_host) for k, v in kwargs.items()}

    result = op(*h_args, **h_kwargs)

    # In-place metadata ops (t_, squeeze_, as_strided_) and out= arguments that shrank
    # changed the host view only: give the neuron tensor the same geometry.
    for n_t, hv in originals.values():
        if _geometry(hv) != _geometry(n_t):
            _set_neuron(n_t, n_t.untyped_storage(), hv.storage_offset(), hv.size(), hv.stride())
    back = {}
    for n_t, tmp in scratch:
        _copy_from_and_resize(tmp, n_t)
        back[id(tmp)] = n_t

    def to_neuron(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) in originals:
            return originals[id(x)][0]
        if id(x) in back:
            return back[id(x)]
        if x.device.type != "cpu":
            return x
        src = by_ptr.get(x.untyped_storage().data_ptr()) if x.untyped_storage().nbytes() else None
        if src is not None:
            return _neuron_on(
                src.untyped_storage(), x.dtype, x.storage_offset(), x.size(), x.stride()
            )
        return _wrap_host(x)

    return _map(result, to_neuron)


def _register_kernels() -> None:
    lib = torch.library.Library("aten", "IMPL")
    key = "PrivateUse1"
    lib.impl("empty.memory_format", _empty_memory_format, key)
    lib.impl("empty_strided", _empty_strided, key)
    lib.impl("_copy_from", _copy_from, key)
    lib.impl("_copy_from_and_resize", _copy_from_and_resize, key)
    lib.impl("resize_", _resize_, key)
    for overload in ("source_Storage_storage_offset", "source_Storage", "source_Tensor"):
        lib.impl(f"set_.{overload}", _redispatch_cpu(getattr(torch.ops.aten.set_, overload)), key)
    lib.impl("set_", _redispatch_cpu(torch.ops.aten.set_.default), key)
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_fallback, dispatch_key=key)
    # torch registers no autocast kernels for PrivateUse1: aten ops pass autocast by (they
    # run in the dtypes given); the nki ops install their own rules (ops/_autocast.py).
    fallback.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    _libs.extend([lib, fallback])


__all__ = [
    "DEVICE_NAME",
    "host_view",
    "install",
    "is_installed",
    "live_bytes",
    "live_storages",
    "real_neuron_backend_present",
]
