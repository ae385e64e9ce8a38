"""Run nki-library's test files through the interpreter: subprocesses, cache, tables.

Each AWS test file runs in its own worker process (`python -m
nki_kernels.conformance.aws_tests ROOT FILE [SELECT]`) with a time limit; `jobs`
workers run at once. The worker prints every case's result as it finishes and, first,
the ids it collected, so a file that runs out of time still reports what finished and
names each case left unrun (`timeout`).

Results are cached per file (`cache_dir/<file>.json`) with the checkout's commit, the
interpreter version (`interpreter_version`: a hash of the interpreter's and the
harness's sources), the `-k` filter and the time limit. A re-run skips a file whose
cache entry matches all of them (a time-out is re-run when the limit grew) unless
`rerun`; `file_table(load_cache(...))` prints the per-file table from the cache alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..runtime.atomic_files import write_text_atomic
from .aws_diagnose import PRE_05
from .aws_tests import COLLECTED, MARK, MAX_CASES_ENV, TESTS, CaseResult

STATUSES = ("pass", "wrong", "rejected", "missing-API", "error", "timeout", "skipped")
_PACKAGE = Path(__file__).resolve().parent.parent  # nki_kernels/


@dataclass
class FileRun:
    """One AWS test file's cached run."""

    file: str  # relative to the checkout root
    checkout: str  # the checkout's commit
    interpreter: str  # interpreter_version() when it ran
    project: str  # this repository's commit when it ran ("" outside git)
    select: str | None
    timeout_s: float
    started: str  # UTC, ISO 8601
    seconds: float
    load: float  # 1-minute load average when it started
    results: list[CaseResult] = field(default_factory=list)
    max_cases: int | None = None  # only the first N unskipped cases ran (a quick look)

    def timed_out(self) -> bool:
        """Whether the time limit stopped the file."""
        return any(r.status == "timeout" for r in self.results)


def interpreter_version() -> str:
    """A hash of the sources a result depends on (the interpreter and this harness)."""
    h = hashlib.sha256()
    for sub in ("interp", "conformance"):
        for path in sorted((_PACKAGE / sub).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:12]


def git_commit(path: Path) -> str:
    """The commit checked out at `path` ("" if it is not a git checkout)."""
    try:
        out = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except OSError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def cache_path(cache_dir: Path, rel: str) -> Path:
    """Where one test file's run is cached."""
    return Path(cache_dir) / (rel.replace("/", "__") + ".json")


def load_cache(cache_dir: Path) -> list[FileRun]:
    """Every cached file run under `cache_dir`, by file name."""
    runs = []
    for path in sorted(Path(cache_dir).glob("*.json")):
        data = json.loads(path.read_text())
        data["results"] = [CaseResult(**r) for r in data["results"]]
        runs.append(FileRun(**data))
    return runs


def _save(cache_dir: Path, run: FileRun) -> None:
    write_text_atomic(cache_path(cache_dir, run.file), json.dumps(asdict(run), indent=1))


def _fresh(
    run: FileRun,
    checkout: str,
    version: str,
    select: str | None,
    limit: float,
    max_cases: int | None = None,
) -> bool:
    key = (run.checkout, run.interpreter, run.select, run.max_cases)
    if key != (checkout, version, select, max_cases):
        return False
    return not (run.timed_out() and limit > run.timeout_s)


def run_file(
    root: Path,
    mod: Path,
    timeout_s: float,
    select: str | None = None,
    max_cases: int | None = None,
) -> FileRun:
    """One AWS test file in a worker subprocess, at most `timeout_s` seconds (`max_cases`:
    only its first N cases that are not skipped)."""
    root = Path(root)
    rel = str(Path(mod).resolve().relative_to(root.resolve()))
    cmd = [sys.executable, "-m", "nki_kernels.conformance.aws_tests", str(root), str(mod)]
    if select:
        cmd.append(select)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # stamped before the worker starts: the sources it imports, even if they change later
    version, project = interpreter_version(), git_commit(_PACKAGE.parent)
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    try:
        env = dict(os.environ)
        env[MAX_CASES_ENV] = str(max_cases or 0)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr, code = "", None
    results = worker_results(rel, stdout, stderr, code, timeout_s)
    return FileRun(
        rel, git_commit(root), version, project, select,
        timeout_s, started, time.perf_counter() - t0, load, results, max_cases,
    )  # fmt: skip


def worker_results(
    rel: str, stdout: str, stderr: str, returncode: int | None, timeout_s: float
) -> list[CaseResult]:
    """The case results of one worker run of test file `rel` from its output
    (`returncode` None: stopped at the time limit). A collected case without a result
    is a `timeout` when the limit stopped the worker, else an `error` naming how the
    worker ended (a signal, e.g. SIGKILL from the kernel's out-of-memory killer)."""
    lines = stdout.splitlines()
    done = [CaseResult(**json.loads(ln.split(MARK, 1)[1])) for ln in lines if MARK in ln]
    collected = [json.loads(ln.split(COLLECTED, 1)[1]) for ln in lines if COLLECTED in ln]
    finished = {r.nodeid for r in done}
    left = [n for n in (collected[0] if collected else []) if n not in finished]
    results = list(done)
    if returncode is None:
        detail = f"not reached in {timeout_s:.0f} s (the file's limit)"
        if not left:  # nothing collected yet: the file as one time-out
            left = [rel + "::<collection>"]
        results += [CaseResult(n, "timeout", detail, 0.0) for n in left]
    elif left and returncode != 0:
        how = _ended(returncode)
        results.append(CaseResult(left[0], "error", f"the worker {how} while this case ran"))
        results += [CaseResult(n, "error", f"not reached: the worker {how}") for n in left[1:]]
    elif not done:
        tail = (stderr.strip().splitlines() or ["the worker printed no result"])[-1][:300]
        results.append(CaseResult(rel, "error", tail, 0.0))
    return results


def _ended(returncode: int) -> str:
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    oom = " (the out-of-memory killer's signal)" if -returncode == signal.SIGKILL else ""
    return f"was killed by {name}{oom}"


def run_files(
    root: Path,
    modules: list[Path],
    timeout_s: float = 600.0,
    select: str | None = None,
    jobs: int = 1,
    cache_dir: Path | None = None,
    rerun: bool = False,
    progress: Callable[[FileRun, bool], None] | None = None,
    max_cases: int | None = None,
) -> list[FileRun]:
    """Every file of `modules`, `jobs` at a time; files whose cache entry is fresh are
    not run again (unless `rerun`). `progress(run, cached)` is called per file."""
    root = Path(root)
    checkout, version = git_commit(root), interpreter_version()
    cached = {r.file: r for r in load_cache(cache_dir)} if cache_dir is not None else {}

    def one(mod: Path) -> FileRun:
        rel = str(Path(mod).resolve().relative_to(root.resolve()))
        old = cached.get(rel)
        fresh = old is not None and _fresh(old, checkout, version, select, timeout_s, max_cases)
        if not rerun and old is not None and fresh:
            if progress is not None:
                progress(old, True)
            return old
        run = run_file(root, mod, timeout_s, select, max_cases)
        if cache_dir is not None:
            _save(cache_dir, run)
        if progress is not None:
            progress(run, False)
        return run

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(one, modules))


def summary(results: list[CaseResult]) -> dict[str, int]:
    """Cases per status."""
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    return counts


def _ran(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k not in ("skipped", "no-fast"))


def table(results: list[CaseResult]) -> str:
    """A Markdown table of the cases and a one-line summary."""
    rows = ["| AWS test case | result | detail |", "|---|---|---|"]
    for r in results:
        name = r.nodeid.removeprefix(str(TESTS) + "/")
        detail = r.detail.replace("|", "\\|")
        rows.append(f"| `{name}` | {r.status} | {detail} |")
    counts = summary(results)
    parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    rows += ["", f"{counts.get('pass', 0)} of {_ran(counts)} cases run pass ({parts})."]
    return "\n".join(rows)


def _first_reason(results: list[CaseResult]) -> str:
    for status in ("wrong", "rejected", "missing-API", "error", "timeout"):
        for r in results:
            if r.status == status:
                return r.detail.replace("|", "/")[:120]
    return ""


def file_table(runs: list[FileRun]) -> str:
    """The per-file Markdown table (cases per status, the first reason a case does not
    pass) and the totals: pass / cases that ran to an outcome or timed out."""
    head = "| AWS test file | " + " | ".join(STATUSES) + " | first reason not passing |"
    rows = [head, "|---|" + "---|" * (len(STATUSES) + 1)]
    total: dict[str, int] = {}
    empty = []
    for run in sorted(runs, key=lambda r: r.file):
        counts = summary(run.results)
        if set(counts) == {"no-fast"}:
            empty.append(run.file.removeprefix(str(TESTS / "nkilib") + "/"))
            continue
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
        cells = " | ".join(str(counts.get(s, 0)) for s in STATUSES)
        name = run.file.removeprefix(str(TESTS / "nkilib") + "/")
        rows.append(f"| `{name}` | {cells} | {_first_reason(run.results)} |")
    ran, passed = _ran(total), total.get("pass", 0)
    pct = f"{100 * passed / ran:.1f} %" if ran else "n/a"
    parts = ", ".join(f"{total.get(s, 0)} {s}" for s in STATUSES)
    rows += ["", f"Total: {parts}; {passed} of the {ran} cases not skipped pass ({pct})."]
    pre05 = sum(r.status == "wrong" and PRE_05 in r.detail for run in runs for r in run.results)
    if pre05 and ran:
        rows.append(
            f"Not counted as passes: {pre05} of the wrong cases match their golden under the "
            f"interpreter's pre-0.5 quantize_mx scale (re-run checked, see the reasons); "
            f"counting them would give {passed + pre05} of {ran} "
            f"({100 * (passed + pre05) / ran:.1f} %)."
        )
    if empty:
        rows.append("Files that mark no case `fast`: " + ", ".join(f"`{e}`" for e in empty) + ".")
    if runs:
        rows.append(_provenance(runs))
    return "\n".join(rows)


def _provenance(runs: list[FileRun]) -> str:
    """When, at which commits, under what load and limits the cached runs were measured."""
    days = sorted({r.started[:16].replace("T", " ") for r in runs})
    projects = sorted({r.project[:7] or "?" for r in runs})
    checkouts = sorted({r.checkout[:8] or "?" for r in runs})
    versions = sorted({r.interpreter for r in runs})
    limits = sorted({f"{r.timeout_s:.0f}" for r in runs})
    loads = [r.load for r in runs]
    partial = sum(r.max_cases is not None for r in runs)
    text = (
        f"Measured on this machine {days[0]} to {days[-1]} UTC (interpreter numeric mode), "
        f"nki-library at {', '.join(checkouts)}, this repository at {', '.join(projects)} "
        f"(interpreter versions {', '.join(versions)}), {'/'.join(limits)} s per file, "
        f"1-minute load average {min(loads):.1f}-{max(loads):.1f} when a file started."
    )
    if partial:
        text += f" {partial} files ran only their first cases (--max-cases)."
    return text
