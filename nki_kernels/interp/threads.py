"""Process-wide resources a kernel run borrows: the BLAS thread pool and stdout.

The interpreter's matmuls are NumPy calls on tiles of at most [128, 512]. On tiles that
small a multi-threaded BLAS spends longer waking and synchronizing its threads than
computing, and by how much depends on the machine and on OPENBLAS_NUM_THREADS /
OMP_NUM_THREADS (a Llama-3-8B-shaped attention forward + backward at S = 1024 took 28.9 s
with the default OpenBLAS threads and 1.37 s with one, as reported in issue 14). So while
any `run()` is in progress the BLAS libraries loaded in the process are limited to one
thread (threadpoolctl), and the caller's setting is restored when the last run ends.

The BLAS limit is process-wide, so it is reference-counted under a lock: runs in several
threads at once share one limit, and it is restored exactly once, when no run is left
(nested runs count too). The libraries are looked up again whenever modules were
imported since the last look (a scan costs ~2 ms): importing e.g. scipy.linalg loads a
second OpenBLAS, which a controller made before it would leave multi-threaded.

A liveness replay (launch.py) runs the kernel again and must not repeat its prints:
`quiet_stdout()` drops what the calling thread writes to `sys.stdout` inside the block,
and only that thread's: one proxy stands in for `sys.stdout` while any thread is quiet
(reference-counted like the BLAS limit), passing every other thread's writes through.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator
from typing import Any, TextIO

_lock = threading.Lock()  # guards the counters and the process-wide settings below
_blas_users = 0  # runs in progress in the process (all threads, nested ones included)
_saved: list[tuple[Any, int]] = []  # (library, its thread count) to restore at the end
_controller: Any = None
_modules_seen = -1  # len(sys.modules) when _controller scanned the loaded libraries


def _set_threads(lib: Any, n: int) -> None:
    # threadpoolctl lets only one "controlling" thread change a process-wide OpenBLAS
    # pool and silently ignores the others; the counter above already serializes the
    # changes made here, whichever thread makes them, so they go to the library directly
    getattr(lib, "_real_set_num_threads", lib.set_num_threads)(n)


def _start_limit() -> list[tuple[Any, int]]:
    """Limit every loaded BLAS to one thread; what to restore afterwards."""
    global _controller, _modules_seen
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # an optional speed-up: the results are the same either way
        return []
    if _controller is None or len(sys.modules) != _modules_seen:
        _modules_seen = len(sys.modules)
        _controller = ThreadpoolController()
    saved = []
    for lib in _controller.lib_controllers:
        if lib.user_api == "blas":
            saved.append((lib, lib.get_num_threads()))
            _set_threads(lib, 1)
    return saved


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS limited to one thread while any thread is inside such a block."""
    global _blas_users, _saved
    with _lock:
        if _blas_users == 0:
            _saved = _start_limit()
        _blas_users += 1
    try:
        yield
    finally:
        with _lock:
            _blas_users -= 1
            if _blas_users == 0:
                for lib, n in _saved:
                    _set_threads(lib, n)
                _saved = []


class _QuietStdout:
    """Stands in for `sys.stdout`: drops the writes of quiet threads, passes the rest."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner
        self.quiet: set[int] = set()  # thread idents inside quiet_stdout()

    def write(self, text: str) -> int:
        if threading.get_ident() in self.quiet:
            return len(text)
        return self.inner.write(text)

    def flush(self) -> None:
        if threading.get_ident() not in self.quiet:
            self.inner.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_proxy: _QuietStdout | None = None
_quiet_users = 0


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Drop what the calling thread prints to `sys.stdout` inside the block."""
    global _proxy, _quiet_users
    me = threading.get_ident()
    with _lock:
        if _proxy is None:
            _proxy = _QuietStdout(sys.stdout)
            sys.stdout = _proxy  # type: ignore[assignment]
        proxy = _proxy
        nested = me in proxy.quiet
        proxy.quiet.add(me)
        _quiet_users += 1
    try:
        yield
    finally:
        with _lock:
            if not nested:
                proxy.quiet.discard(me)
            _quiet_users -= 1
            if _quiet_users == 0:
                # put the original back unless someone replaced sys.stdout meanwhile
                if sys.stdout is proxy:
                    sys.stdout = proxy.inner
                _proxy = None


def is_quiet() -> bool:
    """Whether the calling thread is inside `quiet_stdout()` (program threads of a launch
    made by a quiet thread are quiet too)."""
    proxy = _proxy
    return proxy is not None and threading.get_ident() in proxy.quiet


__all__ = ["is_quiet", "one_blas_thread", "quiet_stdout"]
