"""Compiled-kernel cache keyed by (kernel, bucket shapes, dtypes, config, target, statics,
LNC, backend).

On hardware a new key means a compile (minutes with neuronx-cc); in the interpreter,
"compiling" is creating a `Specialization` -- the kernel bound to exact argument shapes,
dtypes, specialization-time values and a target. Either way the number of entries is the
number of compiles, and `KernelCache.compiles` lets a test check that sizes inside one
bucket share one compile.

On the device path a specialization also holds the *launcher* made once for it
(`prepare(kernel, lnc)`, e.g. `kernel[lnc]`): `KernelCache.wraps` counts the launchers
made, so a test can check that repeated calls neither re-wrap nor recompile.

A Specialization refuses arguments whose shape or dtype differ from its key, so a kernel
only ever runs at the bucket shapes it was specialized for.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import threading
import types
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..targets import Target

ArgSpec = tuple[tuple[int, ...], str]  # (shape, dtype name) of one array argument


def kernel_name(kernel: Any) -> str:
    """`module.qualname` of the Python function behind an `nki.jit` kernel."""
    fn = getattr(kernel, "fn", None) or getattr(kernel, "__wrapped__", None) or kernel
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


_hash_memo: dict[str, str] = {}  # filled idempotently: a race computes one value twice
_calls_lock = threading.Lock()


def _kernel_modules(fn: Any) -> list[types.ModuleType]:
    """The module defining `fn` and, transitively, the modules of its own package that it
    takes names from (the kernel's helpers), sorted by name."""
    root = inspect.getmodule(fn)
    if root is None:
        return []
    pkg = root.__name__.rpartition(".")[0]
    found = {root.__name__: root}
    stack = [root]
    while stack and pkg:
        for value in vars(stack.pop()).values():
            name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", "")
            if isinstance(name, str) and name.startswith(pkg + ".") and name not in found:
                module = sys.modules.get(name)
                if module is not None:
                    found[name] = module
                    stack.append(module)
    return [found[n] for n in sorted(found)]


def kernel_source_hash(kernel: Any) -> str:
    """sha256 (first 16 hex digits) of the source files that define `kernel`.

    Whole files are hashed, not only the function: kernels inline undecorated helpers from
    their module and from sibling modules of their package (tiling helpers, configs), and a
    change to any of them changes what a tuned config measured.
    """
    fn = getattr(kernel, "fn", None) or getattr(kernel, "__wrapped__", None) or kernel
    name = kernel_name(kernel)
    if name not in _hash_memo:
        digest = hashlib.sha256()
        modules = _kernel_modules(fn)
        try:
            for module in modules:
                digest.update(module.__name__.encode())
                digest.update(inspect.getsource(module).encode())
        except (OSError, TypeError):
            modules = []
        if not modules:
            digest = hashlib.sha256(inspect.getsource(fn).encode())
        _hash_memo[name] = digest.hexdigest()[:16]
    return _hash_memo[name]


@dataclass(frozen=True)
class CacheKey:
    """Everything a compile depends on."""

    kernel: str
    args: tuple[ArgSpec | tuple[str, Hashable], ...]
    statics: tuple[tuple[str, Hashable], ...]
    target: str
    lnc: int
    backend: str


@dataclass
class Specialization:
    """A kernel bound to one CacheKey; calling it runs the kernel on matching arrays."""

    key: CacheKey
    kernel: Any
    statics: Mapping[str, Any]
    target: Target
    runner: Callable[..., Any]
    calls: int = field(default=0)
    handle: Any = field(default=None, repr=False)  # the launcher; None: run `kernel`

    def check_args(self, args: tuple[Any, ...]) -> None:
        """Raise ValueError unless `args` match the shapes and dtypes of the key."""
        if len(args) != len(self.key.args):
            raise ValueError(
                f"{self.key.kernel}: expected {len(self.key.args)} arguments; got {len(args)}"
            )
        for i, (a, spec) in enumerate(zip(args, self.key.args)):
            got = arg_spec(a)
            if got != spec:
                raise ValueError(
                    f"{self.key.kernel}: argument {i} expected {spec} (the specialized bucket "
                    f"shape); got {got}"
                )

    def __call__(self, *args: Any) -> Any:
        """Run the specialized kernel on arguments of its key's shapes and dtypes."""
        self.check_args(args)
        with _calls_lock:  # `+=` is a read and a write: threads calling at once lose counts
            self.calls += 1
        fn = self.kernel if self.handle is None else self.handle
        return self.runner(fn, *args, target=self.target, lnc=self.key.lnc, **self.statics)


def arg_spec(a: Any) -> ArgSpec | tuple[str, Hashable]:
    """The cache-key entry of one positional argument: (shape, dtype) or ('value', v)."""
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return tuple(int(s) for s in a.shape), str(a.dtype).removeprefix("torch.")
    try:
        hash(a)
    except TypeError:
        raise TypeError(
            f"kernel argument {a!r}: non-tensor arguments are specialization-time values and "
            f"must be hashable (use a tuple, not a list)"
        ) from None
    return ("value", a)


class KernelCache:
    """Specializations by CacheKey, with compile, hit and wrap counters."""

    def __init__(self) -> None:
        self._entries: dict[CacheKey, Specialization] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.wraps = 0

    @property
    def compiles(self) -> int:
        """Number of specializations created (= compiles)."""
        return len(self._entries)

    def compiles_for(self, kernel: Any) -> int:
        """Number of specializations of one kernel."""
        name = kernel_name(kernel)
        return sum(1 for k in self.keys() if k.kernel == name)

    def keys(self) -> list[CacheKey]:
        """The cache keys, in creation order."""
        with self._lock:
            return list(self._entries)

    def get(
        self,
        kernel: Any,
        args: tuple[Any, ...],
        statics: Mapping[str, Any],
        target: Target,
        lnc: int,
        backend: str,
        runner: Callable[..., Any],
        prepare: Callable[[Any, int], Any] | None = None,
    ) -> Specialization:
        """The specialization for these arguments, creating ("compiling") it on a miss.

        `prepare(kernel, lnc)`, when given, makes the specialization's launcher on a miss
        (once per key; counted in `wraps`).
        """
        for k, v in statics.items():
            try:
                hash(v)
            except TypeError:
                raise TypeError(
                    f"kernel argument {k}={v!r}: specialization-time values must be hashable"
                ) from None
        key = CacheKey(
            kernel=kernel_name(kernel),
            args=tuple(arg_spec(a) for a in args),
            statics=tuple(sorted(statics.items())),
            target=target.name,
            lnc=lnc,
            backend=backend,
        )
        with self._lock:
            spec = self._entries.get(key)
            if spec is not None:
                self.hits += 1
                return spec
            spec = Specialization(key, kernel, dict(statics), target, runner)
            if prepare is not None:
                spec.handle = prepare(kernel, lnc)
                self.wraps += 1
            self._entries[key] = spec
            return spec

    def clear(self) -> None:
        """Drop every specialization and reset the counters."""
        with self._lock:
            self._entries.clear()
            self.hits = 0
            self.wraps = 0


KERNEL_CACHE = KernelCache()

__all__ = [
    "KERNEL_CACHE",
    "CacheKey",
    "KernelCache",
    "Specialization",
    "arg_spec",
    "kernel_name",
    "kernel_source_hash",
]
