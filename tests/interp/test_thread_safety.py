"""Kernels launched from several threads at once keep their own launch state, settings,
BLAS limit and stdout (issue 31): each thread sees exactly what a serial run sees."""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from nki_kernels.interp import nisa, nl, run, settings
from nki_kernels.interp.errors import NkiValidationError
from nki_kernels.interp.threads import quiet_stdout

TIMEOUT = 30  # seconds any one wait may take before the test fails instead of hanging


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # reported by the test, not lost in the thread
            box["error"] = e

    t = threading.Thread(target=body)
    t.start()
    return t, box


def _result(t: threading.Thread, box: dict[str, Any]) -> Any:
    t.join(TIMEOUT)
    assert not t.is_alive(), "thread did not finish"
    if "error" in box:
        raise box["error"]
    return box["value"]


def _scale(x: Any, factor: float, pause: Callable[[], None], times: int = 1) -> Any:
    """out = x * factor**times, pausing (in Python, between instructions) halfway."""
    n, f = x.shape
    out = nl.ndarray((n, f), x.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((n, f), x.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    pause()
    for _ in range(times):
        nisa.tensor_scalar(dst=t, data=t, op0=nl.multiply, operand0=factor)
    nisa.dma_copy(dst=out, src=t)
    return out


def test_two_interleaved_launches_keep_their_own_launch_state() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    serial = [run(_scale, x, 2.0, lambda: None, n) for n in (1, 2)]
    a_paused, b_paused, a_done = threading.Event(), threading.Event(), threading.Event()

    def pause_a() -> None:
        a_paused.set()
        assert b_paused.wait(TIMEOUT)

    def pause_b() -> None:
        b_paused.set()
        assert a_done.wait(TIMEOUT)

    ta, box_a = _in_thread(lambda: run(_scale, x, 2.0, pause_a))
    assert a_paused.wait(TIMEOUT)
    # B launches and pauses halfway; A finishes its launch meanwhile, then B finishes
    tb, box_b = _in_thread(lambda: run(_scale, x, 3.0, pause_b, 2))
    a = _result(ta, box_a)
    a_done.set()
    b = _result(tb, box_b)
    np.testing.assert_array_equal(a.outputs, x * 2)
    np.testing.assert_array_equal(b.outputs, x * 9)
    for res, alone in zip((a, b), serial):
        assert [i.opcode for i in res.trace.instrs] == [i.opcode for i in alone.trace.instrs]


def test_an_nki_call_outside_a_kernel_is_refused_while_another_thread_runs_one() -> None:
    x = np.ones((2, 2), dtype=np.float32)
    paused, resume = threading.Event(), threading.Event()

    def pause() -> None:
        paused.set()
        assert resume.wait(TIMEOUT)

    ta, box = _in_thread(lambda: run(_scale, x, 1.0, pause))
    try:
        assert paused.wait(TIMEOUT)
        with pytest.raises(NkiValidationError, match="outside a kernel launch"):
            nl.ndarray((2, 2), nl.float32, buffer=nl.sbuf)
    finally:
        resume.set()
    _result(ta, box)


def _read_fresh() -> Any:
    out = nl.ndarray((1, 2), nl.float32, buffer=nl.shared_hbm)
    t = nl.ndarray((1, 2), nl.float32, buffer=nl.sbuf)  # never written
    nisa.dma_copy(dst=out, src=t)
    return out


def test_settings_are_per_thread() -> None:
    entered, leave = threading.Event(), threading.Event()

    def zeroed() -> Any:
        with settings(fresh_memory="zero"):
            entered.set()
            assert leave.wait(TIMEOUT)
            return run(_read_fresh).outputs

    ta, box = _in_thread(zeroed)
    try:
        assert entered.wait(TIMEOUT)
        mine = run(_read_fresh).outputs  # this thread's default: fresh memory is NaN
    finally:
        leave.set()
    assert np.isnan(mine).all()
    assert (_result(ta, box) == 0).all()


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_the_blas_limit_holds_until_the_last_concurrent_run_ends_then_comes_back() -> None:
    with threadpool_limits(2, user_api="blas"):
        outside = _blas_threads()
        b_started, a_done = threading.Event(), threading.Event()
        seen_b: list[list[int]] = []

        def kernel_b() -> None:
            b_started.set()
            assert a_done.wait(TIMEOUT)
            seen_b.append(_blas_threads())  # A's run ended: B's must still be limited

        def kernel_a() -> None:
            assert b_started.wait(TIMEOUT)

        tb, box_b = _in_thread(lambda: run(kernel_b))
        run(kernel_a)
        a_done.set()
        _result(tb, box_b)
        after = _blas_threads()
        seen_later: list[list[int]] = []
        run(lambda: seen_later.append(_blas_threads()))  # and the next run is limited again
        after_later = _blas_threads()
    assert seen_b and all(n == 1 for n in seen_b[0]), seen_b
    assert after == outside and after_later == outside
    assert seen_later and all(n == 1 for n in seen_later[0]), seen_later


def test_quiet_stdout_silences_the_calling_thread_only() -> None:
    real = sys.stdout
    caught = io.StringIO()
    sys.stdout = caught
    try:
        inside, done = threading.Event(), threading.Event()

        def quiet_printer() -> None:
            with quiet_stdout():
                print("dropped")
                inside.set()
                assert done.wait(TIMEOUT)
                print("dropped too")

        t, box = _in_thread(quiet_printer)
        assert inside.wait(TIMEOUT)
        print("kept")
        done.set()
        _result(t, box)
        assert sys.stdout is caught
    finally:
        sys.stdout = real
    assert caught.getvalue() == "kept\n"


def test_the_language_check_runs_once_even_when_threads_launch_a_kernel_first_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CPython 3.11's ast.parse is not thread-safe: the check (which parses kernel
    source) must never run in two threads at once (different kernels launched first at
    the same time), and runs once per kernel."""
    from nki_kernels.interp import subset
    from nki_kernels.interp.launch import Kernel

    inside, most, calls = [0], [0], [0]
    lock = threading.Lock()
    real = subset.check_kernel

    def slow_check(fn: Any) -> None:
        with lock:
            inside[0] += 1
            calls[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        real(fn)
        with lock:
            inside[0] -= 1

    monkeypatch.setattr(subset, "check_kernel", slow_check)
    shared, own = Kernel(_read_fresh), [Kernel(_read_fresh) for _ in range(4)]
    start = threading.Barrier(4)

    def first_launch(i: int) -> None:
        start.wait()
        shared.check_language()
        own[i].check_language()

    threads = [_in_thread(lambda i=i: first_launch(i)) for i in range(4)]
    for t, box in threads:
        _result(t, box)
    assert most[0] == 1 and calls[0] == 5
