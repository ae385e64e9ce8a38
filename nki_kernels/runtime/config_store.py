"""Tuned kernel configs: JSON per target and op, keyed by bucketed problem, with provenance.

Layout: `<dir>/<target>/<op>.json`::

    {"format": 1, "op": "rms_norm", "target": "trn2",
     "entries": {"dtype=bfloat16,hidden=4096,rows=4096": {
         "config": {...KernelConfig fields...},
         "provenance": {"kernel_hash": "...", "measurer": "modeled (cost model v1, trn2)",
                        "latency_ns": 1234.0, "default_latency_ns": 1500.0,
                        "trials": 64, "date": "2025-01-01T00:00:00+00:00"}}}}

A *problem* is the bucketed description of a call: a Mapping or a dataclass of ints and
strings (e.g. rows=4096, hidden=4096, dtype="bfloat16"); its canonical key string is
`problem_key(problem)`. The config class of an op is the `KernelConfig` subclass whose
`op_name` is the op (or pass `config_cls=`).

Lookup (`ConfigStore.lookup`), over the user directory first, then the shipped
`nki_kernels/configs/`:

1. the exact key;
2. the nearest compatible key: same field names and the same non-numeric values, the
   smallest sum of |log2(a / b)| over numeric fields (ties: the smaller problem), and the
   config must pass `validate(problem, target)`;
3. the heuristic default, `config_cls.heuristic(problem, target)`, with one
   `ConfigFallbackWarning` per (op, target).

An entry whose `kernel_hash` differs from the kernel's current source hash is not used:
it is skipped with a `StaleConfigWarning` (once per entry). Writes (`put`) are atomic
(temporary file + `os.replace`) under an advisory file lock, and merge into the file.

The user directory is the one setting read from the environment: `NKI_KERNELS_CONFIG_DIR`,
read once by `default_store()`; `set_config_dir()` changes it at run time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import math
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kernel_config import InvalidConfig, KernelConfig
from ..targets import Target, get_target

FORMAT = 1
CONFIG_DIR_ENV_VAR = "NKI_KERNELS_CONFIG_DIR"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "configs"


class ConfigFallbackWarning(UserWarning):
    """No usable tuned config: the heuristic default is used."""


class StaleConfigWarning(UserWarning):
    """A stored config was tuned for other kernel source (hash mismatch) or does not load."""


@dataclass(frozen=True)
class Provenance:
    """Where a stored config came from."""

    kernel_hash: str
    measurer: str  # "modeled (cost model vN, <target>)" or "measured (hardware)"
    latency_ns: float
    default_latency_ns: float
    trials: int
    date: str  # ISO 8601

    @staticmethod
    def now() -> str:
        """The current time as an ISO 8601 UTC string (for `date`)."""
        return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        """Parse a stored provenance record (ValueError naming missing fields)."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"provenance: missing field(s) {missing}")
        return cls(**{n: data[n] for n in names})


def _problem_items(problem: Any) -> dict[str, Any]:
    if isinstance(problem, Mapping):
        items = dict(problem)
    elif dataclasses.is_dataclass(problem) and not isinstance(problem, type):
        items = dataclasses.asdict(problem)
    else:
        raise TypeError(
            f"problem: expected a Mapping or a dataclass instance; got {type(problem).__name__}"
        )
    for k, v in items.items():
        if isinstance(v, bool) or not isinstance(v, (int, float, str)):
            raise TypeError(f"problem field {k!r}: expected int, float or str; got {v!r}")
        if isinstance(v, str) and ("," in v or "=" in v):
            raise ValueError(f"problem field {k!r}: ',' and '=' are reserved; got {v!r}")
    return items


def problem_key(problem: Any) -> str:
    """Canonical key string of a bucketed problem: 'name=value' pairs sorted by name."""
    items = _problem_items(problem)
    return ",".join(f"{k}={items[k]}" for k in sorted(items))


def _parse_key(key: str) -> dict[str, int | float | str]:
    out: dict[str, int | float | str] = {}
    for part in key.split(","):
        name, _, raw = part.partition("=")
        value: int | float | str = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        out[name] = value
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _distance(a: Mapping[str, Any], b: Mapping[str, Any]) -> float | None:
    """log2 distance between compatible problems, None when incompatible."""
    if set(a) != set(b):
        return None
    d = 0.0
    for k, va in a.items():
        vb = b[k]
        numeric = isinstance(va, (int, float)) and isinstance(vb, (int, float))
        if not numeric:
            if str(va) != str(vb):
                return None
        elif va != vb:
            if va <= 0 or vb <= 0:
                return None
            d += abs(math.log2(va / vb))
    return d


def config_class_for(op: str) -> type[KernelConfig]:
    """The KernelConfig subclass whose `op_name` is `op`."""
    seen: list[type[KernelConfig]] = []
    stack = list(KernelConfig.__subclasses__())
    while stack:
        cls = stack.pop()
        if cls.op_name == op:
            seen.append(cls)
        stack.extend(cls.__subclasses__())
    if len(seen) != 1:
        found = "none" if not seen else ", ".join(c.__qualname__ for c in seen)
        raise LookupError(
            f"op {op!r}: expected exactly one KernelConfig subclass with op_name={op!r}; "
            f"found {found} (pass config_cls=)"
        )
    return seen[0]


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _read(path: Path) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: expected a config file with format {FORMAT}")
    return data


class ConfigStore:
    """Tuned configs from `search_dirs` (in order); `write_dir` receives `put()`s."""

    def __init__(
        self,
        search_dirs: Sequence[str | os.PathLike[str]],
        write_dir: str | os.PathLike[str] | None,
    ) -> None:
        self.search_dirs = [Path(d) for d in search_dirs]
        self.write_dir = Path(write_dir) if write_dir is not None else None
        self._files: dict[Path, tuple[int, dict[str, Any]]] = {}
        self._warned: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------

    def path(self, directory: Path, op: str, target: str | Target) -> Path:
        """The JSON file of `op` on `target` under `directory`."""
        return directory / get_target(target).name / f"{op}.json"

    def _load(self, path: Path) -> dict[str, Any]:
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return {}
        cached = self._files.get(path)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            entries = _read(path).get("entries", {})
        except (OSError, ValueError) as e:
            self._warn_once(("file", str(path)), f"config file not used: {e}", StaleConfigWarning)
            entries = {}
        self._files[path] = (mtime, entries)
        return entries

    def entries(self, op: str, target: str | Target) -> list[tuple[str, dict[str, Any], str]]:
        """(key, entry, source file) of every stored entry, in search-dir order."""
        out = []
        for d in self.search_dirs:
            path = self.path(d, op, target)
            for key, entry in self._load(path).items():
                out.append((key, entry, str(path)))
        return out

    def _warn_once(self, tag: tuple[str, ...], msg: str, category: type[Warning]) -> None:
        with self._lock:
            if tag in self._warned:
                return
            self._warned.add(tag)
        warnings.warn(msg, category, stacklevel=4)

    def _usable(
        self,
        op: str,
        tgt: Target,
        key: str,
        entry: Mapping[str, Any],
        source: str,
        cls: type[KernelConfig],
        problem: Any,
        kernel_hash: str | None,
    ) -> tuple[KernelConfig, Provenance] | None:
        try:
            prov = Provenance.from_dict(entry["provenance"])
            cfg = cls.from_dict(entry["config"])
        except (KeyError, TypeError, ValueError) as e:
            msg = f"{source}: entry {key!r} of {op} does not load ({e}); not used"
            self._warn_once(("load", source, key), msg, StaleConfigWarning)
            return None
        if kernel_hash is not None and prov.kernel_hash != kernel_hash:
            msg = (
                f"{source}: config for {op} on {tgt.name} at {key} was tuned for kernel source "
                f"{prov.kernel_hash}, current source is {kernel_hash}; not used (re-tune it)"
            )
            self._warn_once(("hash", source, key), msg, StaleConfigWarning)
            return None
        try:
            cfg.validate(problem, tgt)
        except InvalidConfig:
            return None
        return cfg, prov

    def lookup(
        self,
        op: str,
        target: str | Target,
        problem: Any,
        *,
        config_cls: type[KernelConfig] | None = None,
        kernel_hash: str | None = None,
    ) -> tuple[KernelConfig, Provenance | None]:
        """(config, provenance) for `problem`; provenance is None for the heuristic default.

        `kernel_hash` (from `kernel_source_hash(kernel)`) rejects configs tuned for other
        kernel source; None skips that check.
        """
        tgt = get_target(target)
        cls = config_cls or config_class_for(op)
        want = _problem_items(problem)
        key = problem_key(want)
        entries = self.entries(op, tgt)
        ranked = []
        for order, (k, entry, source) in enumerate(entries):
            parsed = _parse_key(k)
            d = 0.0 if k == key else _distance(want, parsed)
            if d is not None:
                sizes = tuple(float(parsed[n]) for n in sorted(parsed) if _is_number(parsed[n]))
                ranked.append((d, k != key, sizes, order, k, entry, source))
        # exact keys first (in search-dir order), then the nearest compatible ones; ties
        # go to the smaller problem
        for *_, k, entry, source in sorted(ranked, key=lambda r: r[:4]):
            hit = self._usable(op, tgt, k, entry, source, cls, problem, kernel_hash)
            if hit is not None:
                return hit
        msg = (
            f"no tuned config for {op} on {tgt.name} at {key}; using the heuristic default "
            f"(reported once per op and target)"
        )
        self._warn_once(("default", op, tgt.name), msg, ConfigFallbackWarning)
        return cls.heuristic(problem, tgt), None

    # -- writing -----------------------------------------------------------------------

    def put(
        self,
        op: str,
        target: str | Target,
        problem: Any,
        config: KernelConfig,
        provenance: Provenance,
        *,
        directory: str | os.PathLike[str] | None = None,
    ) -> Path:
        """Store `config` for `problem` (atomically merged into the op's JSON file)."""
        root = Path(directory) if directory is not None else self.write_dir
        if root is None:
            raise ValueError(
                f"put: no directory to write to; pass directory= or set {CONFIG_DIR_ENV_VAR}"
            )
        tgt = get_target(target)
        key = problem_key(problem)
        path = self.path(root, op, tgt)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(path):
            data = _read(path) if path.exists() else {}
            data.update({"format": FORMAT, "op": op, "target": tgt.name})
            entries = dict(data.get("entries", {}))
            entries[key] = {"config": config.to_dict(), "provenance": provenance.to_dict()}
            data["entries"] = {k: entries[k] for k in sorted(entries)}
            fd, tmp = tempfile.mkstemp(prefix=f".{op}.", suffix=".json.tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        self._files.pop(path, None)
        return path


_default: ConfigStore | None = None


def default_store() -> ConfigStore:
    """The process-wide store: `$NKI_KERNELS_CONFIG_DIR` (read once, here) then shipped."""
    global _default
    if _default is None:
        user = os.environ.get(CONFIG_DIR_ENV_VAR) or None
        _default = ConfigStore([*([user] if user else []), SHIPPED_DIR], user)
    return _default


def lookup_config(
    op: str,
    problem: Any,
    kernel: Any,
    *,
    target: str | Target | None = None,
    config_cls: type[KernelConfig] | None = None,
    store: ConfigStore | None = None,
) -> KernelConfig:
    """The config an op launches `kernel` with for bucketed `problem` on `target`.

    `ConfigStore.lookup` on the default store, with the kernel's current source hash so
    that configs tuned for other kernel source are not used.
    """
    from .kernel_cache import kernel_source_hash

    cfg, _ = (store or default_store()).lookup(
        op,
        get_target(target),
        problem,
        config_cls=config_cls,
        kernel_hash=kernel_source_hash(kernel),
    )
    return cfg


def set_config_dir(path: str | os.PathLike[str] | None) -> ConfigStore:
    """Point the default store at a user config directory (None: shipped configs only)."""
    global _default
    dirs = [*([path] if path is not None else []), SHIPPED_DIR]
    _default = ConfigStore(dirs, path)
    return _default


__all__ = [
    "CONFIG_DIR_ENV_VAR",
    "SHIPPED_DIR",
    "ConfigFallbackWarning",
    "ConfigStore",
    "Provenance",
    "StaleConfigWarning",
    "config_class_for",
    "default_store",
    "lookup_config",
    "problem_key",
    "set_config_dir",
]
