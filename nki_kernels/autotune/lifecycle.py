"""Worker processes of `tune --workers K`: they die with their parent and end cleanly.

- A worker is started with the parent-death signal set (`prctl(PR_SET_PDEATHSIG,
  SIGTERM)` through ctypes, Linux): when the parent dies -- even by SIGKILL -- the kernel
  sends the worker SIGTERM. A worker whose parent is already gone when it starts exits.
  Elsewhere the worker polls its parent's pid between trials (`parent_alive`).
- SIGTERM becomes the `Terminated` exception (`raise_on_sigterm`), so the tuner marks the
  running trial abandoned (not RUNNING) before the process exits.
- The job, storage URL included, reaches the worker through its environment
  (`JOB_ENV_VAR`), never its command line: `ps` shows argv to every user, while
  `/proc/<pid>/environ` is readable by the owner only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

JOB_ENV_VAR = "NKI_KERNELS_WORKER_JOB"
PARENT_ENV_VAR = "NKI_KERNELS_WORKER_PARENT"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class Terminated(BaseException):
    """The process received SIGTERM (its parent died, or someone stopped it)."""


def _set_parent_death_signal() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn_worker(job: dict[str, Any]) -> subprocess.Popen[bytes]:
    """Start `python -m nki_kernels.autotune.cli --worker` with `job` in its environment."""
    env = dict(os.environ)
    env[JOB_ENV_VAR] = json.dumps(job)
    env[PARENT_ENV_VAR] = str(os.getpid())
    env.setdefault("PYTHONUNBUFFERED", "1")
    cmd = [sys.executable, "-m", "nki_kernels.autotune.cli", "--worker"]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, env=env, preexec_fn=_set_parent_death_signal
    )


def worker_job() -> dict[str, Any]:
    """The job of this worker process (from its environment; the variable is removed)."""
    raw = os.environ.pop(JOB_ENV_VAR, None)
    if raw is None:
        raise SystemExit(f"--worker: expected the job in ${JOB_ENV_VAR}")
    job: dict[str, Any] = json.loads(raw)
    return job


def parent_alive() -> bool:
    """False once the process that started this worker is gone."""
    pid = os.environ.get(PARENT_ENV_VAR)
    if not pid or not pid.isdigit():
        return True
    return os.getppid() == int(pid)


@contextlib.contextmanager
def raise_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM into `Terminated` in the main thread for the duration."""

    def handler(_sig: int, _frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(procs: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    """SIGTERM every live worker, wait up to `grace_s` for each, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            p.wait()


__all__ = [
    "JOB_ENV_VAR",
    "Terminated",
    "parent_alive",
    "raise_on_sigterm",
    "spawn_worker",
    "stop",
    "worker_job",
]
