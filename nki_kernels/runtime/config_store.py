"""Tuned kernel configs: JSON per target and op, keyed by bucketed problem, with provenance.

Layout: `<dir>/<target>/<op>.json`::

    {"format": 1, "op": "rms_norm", "target": "trn2",
     "entries": {"dtype=bfloat16,hidden=4096,rows=4096": {
         "config": {...KernelConfig fields...},
         "provenance": {"kernel_hash": "...", "measurer": "modeled (cost model v1, trn2)",
                        "latency_ns": 1234.0, "default_latency_ns": 1500.0,
                        "trials": 64, "date": "2025-01-01T00:00:00+00:00"}}}}

Keys carry the launch's LNC: `lnc=2` is one more field of the key of a config tuned at
LNC 2; a key without it is LNC 1 (`lnc_items`).

A *problem* is the bucketed description of a call: a Mapping or a dataclass of ints and
strings (e.g. rows=4096, hidden=4096, dtype="bfloat16"); its canonical key string is
`problem_key(problem)`. The config class of an op is the `KernelConfig` subclass whose
`op_name` is the op (or pass `config_cls=`).

Lookup (`ConfigStore.decide` / `lookup`), over the user directory first, then the shipped
`nki_kernels/configs/`:

1. the exact key ("tuned entry");
2. the nearest stored key that differs only in the *bucketed* dimension (`BUCKET_FIELDS`:
   rows, tokens, seq_q, seq_k): every other field -- hidden size, experts, top-k, heads,
   head_dim, dtype, mask, affine -- must be equal. Smallest sum of |log2(a / b)| over the
   bucketed fields wins (ties: the smaller problem) ("nearest bucket"). A config tuned for
   hidden 4096 is never used at hidden 5120, nor a 64-expert one at 16 experts: tile
   choices do not transfer across those, while along the bucketed dimension the same
   tiling repeats over more tiles;
3. the heuristic default, `config_cls.heuristic(problem, target)`, with one
   `ConfigFallbackWarning` per process (the first op and shape that fell back; later
   fallbacks are silent, `nki_kernels.explain` names each call's decision), none when
   `NKI_KERNELS_QUIET_FALLBACK=1`.

Each candidate must pass the schema (`config_schema.check_entry`: field types, provenance)
and `validate(problem, target)` (ranges and fit); a failing entry is skipped with one
`InvalidEntryWarning` naming the file, the entry and the field or rule, so a malformed
entry never reaches a kernel. An entry whose `kernel_hash` differs from the kernel's
current source hash is skipped with a `StaleConfigWarning` (once per entry).

Reading never takes an op down (config_files.py): only regular files are opened, with a
size and nesting bound; a file, key or directory that cannot be used -- bad JSON, nested
too deep, a FIFO, a symlink loop, `NKI_KERNELS_CONFIG_DIR` pointing at a file, a key
such as rows=1e400 -- is reported once with an `InvalidEntryWarning` and ignored, and
the op runs on the other directories' configs or the heuristic default. Each file is
parsed into an index once per version (its mtime, size and inode), and each decision is
remembered until one of the files it was read from changes, so a lookup costs one stat
per search directory, however many entries the store holds.

Writes (`put`) are atomic (temporary file + `os.replace`, the temporary removed on any
failure; a kill can leave at most a `.<op>.*.json.tmp` file, which readers ignore and
the next `put` removes) under an advisory lock on the file itself; files are written
group- and world-readable (0644) so a shared config directory works for every user.

`ConfigStore.decide` returns a `ConfigDecision`: the config, where it came from, the
entry's key, file and provenance; `nki_kernels.explain(op, *args)` records the decisions
of one call. With `NKI_KERNELS_LOG_CONFIGS=1` (read once, by `default_store()`), every
decision is logged once per (op, target, problem) on the `nki_kernels.configs` logger.

The user directory comes from `NKI_KERNELS_CONFIG_DIR`, read once by `default_store()`;
`set_config_dir()` changes it at run time.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..kernel_config import InvalidConfig, KernelConfig
from ..targets import Target, get_target
from .atomic_files import dir_lock
from .config_files import (
    ConfigFileError,
    FileIndex,
    build_index,
    file_stamp,
    read_config_file,
)
from .config_keys import BUCKET_FIELDS, key_distance, lnc_items, problem_key
from .config_records import ConfigDecision, Provenance
from .config_schema import EntryError, check_entry

FORMAT = 1
CONFIG_DIR_ENV_VAR = "NKI_KERNELS_CONFIG_DIR"
LOG_ENV_VAR = "NKI_KERNELS_LOG_CONFIGS"
QUIET_FALLBACK_ENV_VAR = "NKI_KERNELS_QUIET_FALLBACK"
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "configs"
TUNED, NEAREST, DEFAULT = "tuned entry", "nearest bucket", "heuristic default"
FILE_MODE = 0o644
LOG = logging.getLogger("nki_kernels.configs")
MAX_DECISIONS = 4096  # remembered lookups per store (each a few hundred bytes)


def _fallback_text(op: str, target: str, key: str) -> str:
    return (
        f"nki-kernels: no tuned tile sizes for {op} at this shape on {target} ({key}), so the "
        "kernel's built-in heuristic ones are used: results are the same, only speed on "
        "Trainium may differ. Reported once per process for the first such call; "
        f"`nki-kernels tune {op}` tunes it, {QUIET_FALLBACK_ENV_VAR}=1 silences this."
    )


def _caller_level() -> int:
    """The `warnings.warn` stacklevel of the first frame outside this package and torch,
    so a warning points at the user's line, not into the library."""
    import sys

    pkg = str(Path(__file__).resolve().parents[1])
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(pkg) and "/torch/" not in name and "<frozen" not in name:
            return level
        frame, level = frame.f_back, level + 1
    return 2


class ConfigFallbackWarning(UserWarning):
    """No usable tuned config: the heuristic default is used."""


class StaleConfigWarning(UserWarning):
    """A stored config was tuned for other kernel source (hash mismatch) or does not load."""


class InvalidEntryWarning(StaleConfigWarning):
    """A stored entry fails the schema or does not fit the problem: it is skipped."""


_RECORDER: contextvars.ContextVar[list[ConfigDecision] | None] = contextvars.ContextVar(
    "nki_config_decisions", default=None
)


@contextlib.contextmanager
def recording_decisions() -> Iterator[list[ConfigDecision]]:
    """Collect the `ConfigDecision` of every `lookup_config` made inside the block."""
    out: list[ConfigDecision] = []
    token = _RECORDER.set(out)
    try:
        yield out
    finally:
        _RECORDER.reset(token)


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


def _read(path: Path) -> dict[str, Any]:
    """A config file's JSON ({} when there is none; ConfigFileError, a ValueError naming
    the file, for anything unusable: see config_files.py)."""
    data = read_config_file(path)
    return {} if data is None else data


class ConfigStore:
    """Tuned configs from `search_dirs` (in order); `write_dir` receives `put()`s.

    `log_decisions` logs every lookup decision once per (op, target, problem) on the
    `nki_kernels.configs` logger.
    """

    def __init__(
        self,
        search_dirs: Sequence[str | os.PathLike[str]],
        write_dir: str | os.PathLike[str] | None,
        *,
        log_decisions: bool = False,
    ) -> None:
        self.search_dirs = [Path(d) for d in search_dirs]
        self.write_dir = Path(write_dir) if write_dir is not None else None
        self.log_decisions = log_decisions
        self._files: dict[Path, FileIndex] = {}
        # decisions by (op, target, problem key, LNC, config class, kernel hash, bucket
        # fields) and the stamps of the files they were read from
        self._decisions: dict[tuple[Any, ...], tuple[tuple[Any, ...], ConfigDecision]] = {}
        self._warned: set[tuple[str, ...]] = set()
        self._lock = threading.Lock()

    # -- reading -----------------------------------------------------------------------

    def path(self, directory: Path, op: str, target: str | Target) -> Path:
        """The JSON file of `op` on `target` under `directory`."""
        return directory / get_target(target).name / f"{op}.json"

    def _index(self, path: Path) -> FileIndex:
        """The parsed index of `path`, re-read only when its stamp changes; an unusable
        file is reported once (per path and reason) and counts as empty."""
        try:
            stamp = file_stamp(path)
        except ConfigFileError as e:
            self._warn_once(("file", str(path), str(e)), f"config file not used: {e}",
                            InvalidEntryWarning)  # fmt: skip
            return FileIndex(None)
        cached = self._files.get(path)
        if cached is not None and cached.stamp == stamp:
            return cached
        if stamp is None:
            index = FileIndex(None)
        else:
            try:
                index = build_index(stamp, _read(path).get("entries", {}))
            except ConfigFileError as e:
                self._warn_once(("file", str(path), str(e)), f"config file not used: {e}",
                                InvalidEntryWarning)  # fmt: skip
                index = FileIndex(stamp)
            for key, why in index.rejected:
                msg = f"{path}: entry {key!r}: {why}; skipped"
                self._warn_once(("key", str(path), key), msg, InvalidEntryWarning)
        with self._lock:
            self._files[path] = index
        return index

    def _indexes(self, op: str, target: str | Target) -> list[tuple[Path, FileIndex]]:
        return [
            (path, self._index(path))
            for path in (self.path(d, op, target) for d in self.search_dirs)
        ]

    def entries(self, op: str, target: str | Target) -> list[tuple[str, dict[str, Any], str]]:
        """(key, entry, source file) of every usable stored entry, in search-dir order."""
        return [
            (k.key, k.entry, str(path))
            for path, index in self._indexes(op, target)
            for k in index.keys
        ]

    def _warn_once(self, tag: tuple[str, ...], msg: str, category: type[Warning]) -> None:
        with self._lock:
            if tag in self._warned:
                return
            self._warned.add(tag)
        warnings.warn(msg, category, stacklevel=_caller_level())

    def _usable(
        self,
        op: str,
        tgt: Target,
        key: str,
        entry: Any,
        source: str,
        cls: type[KernelConfig],
        problem: Any,
        kernel_hash: str | None,
    ) -> tuple[KernelConfig, Provenance] | str:
        """(config, provenance) of a usable entry, else why it is not used (warned once)."""
        try:
            cfg, fields = check_entry(cls, entry)
        except EntryError as e:
            msg = f"{source}: entry {key!r} of {op}: {e}; skipped"
            self._warn_once(("load", source, key), msg, InvalidEntryWarning)
            return f"[{key}] in {source}: {e}"
        prov = Provenance(**fields)
        if kernel_hash is not None and prov.kernel_hash != kernel_hash:
            msg = (
                f"{source}: config for {op} on {tgt.name} at {key} was tuned for kernel source "
                f"{prov.kernel_hash}, current source is {kernel_hash}; not used (re-tune it)"
            )
            self._warn_once(("hash", source, key), msg, StaleConfigWarning)
            return f"[{key}] in {source}: stale (kernel hash {prov.kernel_hash})"
        try:
            cfg.validate(problem, tgt)
        except InvalidConfig as e:
            msg = (
                f"{source}: entry {key!r} of {op}: config does not fit {problem_key(problem)} "
                f"on {tgt.name}: {e.reason}; skipped"
            )
            self._warn_once(("fit", source, key, problem_key(problem)), msg, InvalidEntryWarning)
            return f"[{key}] in {source}: does not fit ({e.reason})"
        return cfg, prov

    def _decide(
        self,
        op: str,
        tgt: Target,
        problem: Any,
        cls: type[KernelConfig],
        kernel_hash: str | None,
        bucket_fields: frozenset[str],
        lnc: int,
        want: dict[str, Any],
        key: str,
        indexes: list[tuple[Path, FileIndex]],
    ) -> ConfigDecision:
        ranked = []
        order = 0
        for path, index in indexes:
            for ik in index.keys:
                d = 0.0 if ik.key == key else key_distance(want, ik.fields, bucket_fields)
                if d is not None:
                    ranked.append((d, ik.key != key, ik.sizes, order, ik.key, ik.entry, str(path)))
                order += 1
        skipped: list[str] = []
        # exact keys first (in search-dir order), then the nearest ones; ties go to the
        # smaller problem
        for *_, k, entry, source in sorted(ranked, key=lambda r: r[:4]):
            hit = self._usable(op, tgt, k, entry, source, cls, problem, kernel_hash)
            if isinstance(hit, str):
                skipped.append(hit)
                continue
            return ConfigDecision(
                op, tgt.name, key, hit[0], TUNED if k == key else NEAREST, k, source, hit[1],
                tuple(skipped), lnc,
            )  # fmt: skip
        if os.environ.get(QUIET_FALLBACK_ENV_VAR, "") in ("", "0"):
            self._warn_once(("default",), _fallback_text(op, tgt.name, key), ConfigFallbackWarning)
        cfg = cls.heuristic(problem, tgt)
        return ConfigDecision(op, tgt.name, key, cfg, DEFAULT, skipped=tuple(skipped), lnc=lnc)

    def decide(
        self,
        op: str,
        target: str | Target,
        problem: Any,
        *,
        config_cls: type[KernelConfig] | None = None,
        kernel_hash: str | None = None,
        bucket_fields: frozenset[str] = BUCKET_FIELDS,
        lnc: int = 1,
    ) -> ConfigDecision:
        """The `ConfigDecision` for `problem` launched at `lnc` logical cores (see the
        module docstring for the order; `lnc_items` for how the LNC enters the key).

        `kernel_hash` (from `kernel_source_hash(kernel)`) rejects configs tuned for other
        kernel source; None skips that check.
        """
        tgt = get_target(target)
        cls = config_cls or config_class_for(op)
        want = lnc_items(problem, lnc)
        key = problem_key(want)
        indexes = self._indexes(op, tgt)
        stamps = tuple(index.stamp for _, index in indexes)
        memo = (op, tgt.name, key, lnc, cls, kernel_hash, bucket_fields)
        hit = self._decisions.get(memo)
        if hit is not None and hit[0] == stamps:
            decision = hit[1]
        else:
            decision = self._decide(op, tgt, problem, cls, kernel_hash, bucket_fields, lnc,
                                    want, key, indexes)  # fmt: skip
            # a heuristic default is not remembered: it is cheap, and the heuristic is code
            # (a patched or reloaded one must be asked again), not a file this memo tracks
            if decision.source != DEFAULT:
                with self._lock:
                    if len(self._decisions) >= MAX_DECISIONS:
                        self._decisions.clear()
                    self._decisions[memo] = (stamps, decision)
        if self.log_decisions:
            with self._lock:
                first = ("log", op, tgt.name, key) not in self._warned
                self._warned.add(("log", op, tgt.name, key))
            if first:
                LOG.info("config decision: %s", decision.describe().replace("\n", ";"))
        return decision

    def lookup(
        self,
        op: str,
        target: str | Target,
        problem: Any,
        *,
        config_cls: type[KernelConfig] | None = None,
        kernel_hash: str | None = None,
        lnc: int = 1,
    ) -> tuple[KernelConfig, Provenance | None]:
        """(config, provenance) for `problem`; provenance is None for the heuristic default."""
        d = self.decide(
            op, target, problem, config_cls=config_cls, kernel_hash=kernel_hash, lnc=lnc
        )
        return d.config, d.provenance

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
        lnc: int = 1,
    ) -> Path:
        """Store `config` for `problem` tuned at `lnc` (atomically merged into the op's
        JSON file)."""
        root = Path(directory) if directory is not None else self.write_dir
        if root is None:
            raise ValueError(
                f"put: no directory to write to; pass directory= or set {CONFIG_DIR_ENV_VAR}"
            )
        tgt = get_target(target)
        key = problem_key(lnc_items(problem, lnc))
        path = self.path(root, op, tgt)
        path.parent.mkdir(parents=True, exist_ok=True)
        with dir_lock(path.parent):
            for debris in path.parent.glob(f".{op}.*.json.tmp"):
                # a temporary of a writer killed mid-put (the lock is ours: nobody else writes)
                with contextlib.suppress(FileNotFoundError):
                    debris.unlink()
            with contextlib.suppress(FileNotFoundError):
                path.with_name(path.name + ".lock").unlink()  # left by older versions
            data = _read(path)
            data.update({"format": FORMAT, "op": op, "target": tgt.name})
            entries = dict(data.get("entries", {}))
            entries[key] = {"config": config.to_dict(), "provenance": provenance.to_dict()}
            data["entries"] = {k: entries[k] for k in sorted(entries)}
            fd, tmp = tempfile.mkstemp(prefix=f".{op}.", suffix=".json.tmp", dir=path.parent)
            try:
                os.fchmod(fd, FILE_MODE)
                with os.fdopen(fd, "w") as f:
                    json.dump(data, f, indent=1, sort_keys=True, allow_nan=False)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        with self._lock:
            self._files.pop(path, None)
        return path


_default: ConfigStore | None = None
_default_lock = threading.Lock()


def default_store() -> ConfigStore:
    """The process-wide store: `$NKI_KERNELS_CONFIG_DIR` (read once, here) then shipped."""
    global _default
    store = _default
    if store is not None:
        return store
    with _default_lock:  # one store even when the first calls come from several threads
        return _make_default()


def _make_default() -> ConfigStore:
    global _default
    if _default is None:
        user = os.environ.get(CONFIG_DIR_ENV_VAR) or None
        log = os.environ.get(LOG_ENV_VAR, "").strip().lower() not in ("", "0", "false", "no")
        if log and not LOG.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("nki_kernels: %(message)s"))
            LOG.addHandler(handler)
            LOG.setLevel(logging.INFO)
        _default = ConfigStore([*([user] if user else []), SHIPPED_DIR], user, log_decisions=log)
    return _default


def lookup_config(
    op: str,
    problem: Any,
    kernel: Any,
    *,
    target: str | Target | None = None,
    config_cls: type[KernelConfig] | None = None,
    store: ConfigStore | None = None,
    lnc: int | None = None,
) -> KernelConfig:
    """The config an op launches `kernel` with for bucketed `problem` on `target`.

    `ConfigStore.lookup` on the default store, with the kernel's current source hash so
    that configs tuned for other kernel source are not used, at `lnc` (default: the
    runtime's, `runtime.lnc.runtime_lnc`, the LNC `launch` uses).
    """
    from .kernel_cache import kernel_source_hash
    from .lnc import runtime_lnc

    tgt = get_target(target)
    decision = (store or default_store()).decide(
        op,
        tgt,
        problem,
        config_cls=config_cls,
        kernel_hash=kernel_source_hash(kernel),
        lnc=runtime_lnc(tgt) if lnc is None else lnc,
    )
    recorder = _RECORDER.get()
    if recorder is not None:
        recorder.append(decision)
    return decision.config


def set_config_dir(path: str | os.PathLike[str] | None) -> ConfigStore:
    """Point the default store at a user config directory (None: shipped configs only)."""
    global _default
    dirs = [*([path] if path is not None else []), SHIPPED_DIR]
    log = _default.log_decisions if _default is not None else False
    _default = ConfigStore(dirs, path, log_decisions=log)
    return _default


__all__ = [
    "BUCKET_FIELDS",
    "CONFIG_DIR_ENV_VAR",
    "DEFAULT",
    "LOG_ENV_VAR",
    "NEAREST",
    "SHIPPED_DIR",
    "TUNED",
    "ConfigDecision",
    "ConfigFallbackWarning",
    "ConfigStore",
    "InvalidEntryWarning",
    "Provenance",
    "StaleConfigWarning",
    "config_class_for",
    "default_store",
    "lnc_items",
    "lookup_config",
    "problem_key",
    "recording_decisions",
    "set_config_dir",
]
