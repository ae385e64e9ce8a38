"""The interpreter's BLAS thread pool: one thread while a kernel runs.

The interpreter's matmuls are NumPy calls on tiles of at most [128, 512]. On tiles that
small a multi-threaded BLAS spends longer waking and synchronizing its threads than
computing, and by how much depends on the machine and on OPENBLAS_NUM_THREADS /
OMP_NUM_THREADS (a Llama-3-8B-shaped attention forward + backward at S = 1024 took 28.9 s
with the default OpenBLAS threads and 1.37 s with one, as reported in issue 14). So each
`run()` limits the BLAS libraries loaded in the process to one thread and restores the
caller's setting when it returns (threadpoolctl); nested runs keep the limit.

The libraries are looked up again whenever modules were imported since the last look
(a scan costs ~2 ms): importing e.g. scipy.linalg loads a second OpenBLAS, which a
controller made before it would leave multi-threaded.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

_depth = 0
_controller: Any = None
_modules_seen = -1  # len(sys.modules) when _controller scanned the loaded libraries


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS limited to one thread inside the block (no-op without threadpoolctl)."""
    global _depth, _controller, _modules_seen
    if _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # an optional speed-up: the results are the same either way
        yield
        return
    if _controller is None or len(sys.modules) != _modules_seen:
        _modules_seen = len(sys.modules)
        _controller = ThreadpoolController()
    _depth = 1
    try:
        with _controller.limit(limits=1, user_api="blas"):
            yield
    finally:
        _depth = 0


__all__ = ["one_blas_thread"]
