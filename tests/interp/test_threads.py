"""The interpreter runs kernels with one BLAS thread and restores the caller's setting."""

from __future__ import annotations

import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from nki_kernels.interp.launch import run


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_kernels_run_on_one_blas_thread_and_the_setting_comes_back() -> None:
    seen: list[list[int]] = []

    def kernel() -> None:
        seen.append(_blas_threads())
        run(lambda: seen.append(_blas_threads()))  # nested: still one

    with threadpool_limits(2, user_api="blas"):
        outside = _blas_threads()
        run(kernel)
        after = _blas_threads()
    assert seen and all(n == 1 for threads in seen for n in threads)
    assert after == outside


def test_a_blas_library_loaded_after_the_first_run_is_limited_too() -> None:
    run(lambda: None)  # the controller has scanned the libraries loaded so far
    pytest.importorskip("scipy.linalg")  # loads scipy's own OpenBLAS (if not yet loaded)
    seen: list[list[int]] = []
    with threadpool_limits(2, user_api="blas"):
        run(lambda: seen.append(_blas_threads()))
    assert seen and all(n == 1 for n in seen[0]), seen
