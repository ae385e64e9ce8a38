"""Signals around a tuning trial: the trial timeout (SIGALRM) and Ctrl-C / SIGTERM held
while a trial is created (see study.py, "Interruption")."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any


class TrialTimeout(BaseException):
    """The `timeout` of `Tuner.run` expired inside a trial."""


@contextlib.contextmanager
def alarm(deadline: float | None) -> Iterator[None]:
    """Raise TrialTimeout in this (main) thread when `deadline` (monotonic) passes."""
    if deadline is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TrialTimeout()

    def fire(_sig: int, _frame: Any) -> None:
        raise TrialTimeout()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, remaining)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


DEFERRED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while a trial is created: `study.ask()` writes the RUNNING
    trial before it returns, so an interrupt inside it would leave a trial nobody owns.
    A held signal is raised again on exit, once the caller has the trial to abandon.
    (Python runs signal handlers in the main thread whichever thread the OS picked, so
    swapping the handlers holds them where a thread signal mask would not.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum))
                for s in DEFERRED_SIGNALS}  # fmt: skip
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)
        if held:
            signal.raise_signal(held[0])
