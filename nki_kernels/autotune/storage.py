"""Where studies live: one URL names an Optuna storage every worker can share.

- no URL: an SQLite file (embedded, nothing to run; WAL journal so several local worker
  processes can write; a killed run resumes from it);
- `sqlite:///path.db`, `postgresql://user@host/db`, `mysql://...`: any SQLAlchemy URL
  Optuna's RDB storage accepts. Point workers on many machines at one PostgreSQL
  database to scale tuning out;
- `journal:///path/to/file.log` (or a path ending in `.log` / `.journal`): Optuna's
  append-only journal file, for shared file systems without a database server;
- `memory`: in-process only (tests, single-worker throwaway runs).

Passwords: leave them out of the URL (`postgresql://tuner@db-host/tune`) and let the
PostgreSQL driver find them in `PGPASSWORD` or `~/.pgpass` (libpq's own lookup). A URL
that does carry one is never printed with it: `redact` replaces it by `***` in every log
line and error of the tuner (`StorageError` messages are redacted), workers receive the URL
through their environment, not their command line, and a password with an unescaped `@`
is refused with a hint to percent-encode it (`%40`) instead of leaking its tail into a
host-name error.
"""

from __future__ import annotations

import importlib
import os
import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy.event
import sqlalchemy.exc
from optuna.storages import BaseStorage, InMemoryStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

DEFAULT_DB_NAME = "autotune.db"
STORAGE_ENV_VAR = "NKI_KERNELS_STORAGE"


class StorageError(ValueError):
    """A storage URL or connection problem; the message never holds a password."""


_RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql")


def default_storage_path(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The default SQLite file, `<cache_dir>/autotune.db` (default dir ~/.cache/nki-kernels)."""
    base = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "nki-kernels"
    return base / DEFAULT_DB_NAME


def normalize_url(url: str | None, cache_dir: str | os.PathLike[str] | None = None) -> str:
    """The canonical form of a storage argument (see the module docstring)."""
    if url is None or url == "":
        return f"sqlite:///{default_storage_path(cache_dir)}"
    if url in ("memory", ":memory:"):
        return "memory"
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower() if "://" in url else ""
    if scheme == "journal":
        return url
    if scheme in _RDB_SCHEMES:
        netloc = url.split("://", 1)[1].split("/", 1)[0]
        if netloc.count("@") > 1:
            raise StorageError(
                f"storage: the credentials of {redact(url)} contain an unescaped '@'; "
                "percent-encode it as %40, or leave the password out of the URL and use "
                "PGPASSWORD / ~/.pgpass"
            )
        if url.startswith("postgres://"):
            url = "postgresql" + url[len("postgres") :]
        return url
    if scheme:
        raise StorageError(
            f"storage: expected an SQLite/PostgreSQL/MySQL URL, journal:///path, a file path "
            f"or 'memory'; got {redact(url)!r} (scheme {scheme!r})"
        )
    path = Path(url)
    if path.suffix in (".log", ".journal", ".jsonl"):
        return f"journal:///{path.resolve()}"
    return f"sqlite:///{path.resolve()}"


def _journal_path(url: str) -> str:
    rest = url.split(":", 1)[1]
    if rest.startswith("///"):
        return "/" + rest[3:].lstrip("/")
    return rest.lstrip("/") if rest.startswith("//") else rest


def _pg_driver() -> str:
    """The installed PostgreSQL DB-API driver (SQLAlchemy >= 2.1 defaults to psycopg 3)."""
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        return driver
    raise ImportError(
        "storage: a postgresql:// URL needs a PostgreSQL driver; install psycopg2-binary"
    )


def _prepare_sqlite(url: str) -> None:
    path = url[len("sqlite:///") :]
    if not path or path == ":memory:":
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=60)
    try:
        # WAL lets readers proceed while one worker writes; it persists in the file.
        # Switching needs an exclusive lock and SQLite does not wait for it (no busy
        # handler), so a worker starting while another writes retries.
        for attempt in range(300):
            try:
                if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    con.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError:
                if attempt == 299:
                    raise
                time.sleep(0.1)
    finally:
        con.close()


def _sqlite_session_rules(storage: RDBStorage) -> None:
    """Per-connection rules for SQLite.

    synchronous=NORMAL: in WAL mode a commit survives the process being killed (only an
    OS crash can lose the last ones), without an fsync per trial attribute.

    BEGIN IMMEDIATE: SQLite ignores SELECT ... FOR UPDATE, so Optuna's read-check-write
    when a worker takes a queued trial (WAITING -> RUNNING) is not atomic by default and
    two workers can both take the same trial. Taking the write lock when each transaction
    begins serializes those read-check-writes, as row locks do on PostgreSQL."""

    def on_connect(dbapi_con: Any, _record: Any) -> None:
        dbapi_con.isolation_level = None  # the driver must not issue its own BEGIN
        dbapi_con.execute("PRAGMA synchronous=NORMAL")

    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    sqlalchemy.event.listen(storage.engine, "connect", on_connect)
    sqlalchemy.event.listen(storage.engine, "begin", on_begin)
    storage.engine.dispose()  # reconnect under these rules


def open_storage(
    url: str | None = None, cache_dir: str | os.PathLike[str] | None = None
) -> BaseStorage:
    """Open (creating if needed) the storage named by `url`."""
    canon = normalize_url(url, cache_dir)
    try:
        return _open(canon)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, OSError) as e:
        detail = scrub(str(e).splitlines()[0] if str(e) else type(e).__name__, canon)
        raise StorageError(f"storage {redact(canon)}: cannot open ({detail})") from None


def _open(canon: str) -> BaseStorage:
    if canon == "memory":
        return InMemoryStorage()
    if canon.startswith("journal:"):
        path = Path(_journal_path(canon))
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    engine_kwargs: dict[str, object] = {}
    if canon.startswith("postgresql://"):
        canon = "postgresql+" + _pg_driver() + canon[len("postgresql") :]
    if canon.startswith("sqlite:"):
        _prepare_sqlite(canon)
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    for attempt in range(5):
        try:
            storage = RDBStorage(canon, engine_kwargs=engine_kwargs)
            if canon.startswith("sqlite:"):
                _sqlite_session_rules(storage)
            return storage
        except sqlalchemy.exc.DBAPIError:
            # workers that start together race to create the schema on a fresh database;
            # the loser sees a unique-violation / "already exists" and simply retries
            if attempt == 4:
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def is_shareable(storage: BaseStorage) -> bool:
    """True when several processes can use `storage` (everything but in-memory)."""
    return not isinstance(storage, InMemoryStorage)


# user:password@ before the query string: the password may hold '/' (SQLAlchemy's URL
# parser reads it so), and an unescaped '@' (refused, but never printed): it runs from the
# user's ':' to the last '@'
_CREDS = re.compile(r"^(?P<head>[\w+.-]+://(?P<user>[^:/@]*):)(?P<pw>.*)(?P<tail>@[^@]*)$", re.S)
# password-like parameters of the query string (?password=..., &passwd=...)
_QUERY_PW = re.compile(r"(?P<key>[?&](?:password|passwd|pwd)=)(?P<pw>[^&#]*)", re.I)


def redact(url: str) -> str:
    """`url` with any password (in the credentials or the query string) replaced by ***,
    for logs and provenance."""
    if "://" not in url:
        return url
    base, q, query = url.partition("?")
    m = _CREDS.match(base)
    if m is not None:
        base = m["head"] + "***" + m["tail"]
    return _QUERY_PW.sub(lambda p: p["key"] + "***", base + q + query)


def _passwords(url: str) -> list[str]:
    if "://" not in url:
        return []
    m = _CREDS.match(url.partition("?")[0])
    found = [m["pw"]] if m is not None and m["pw"] else []
    return found + [q["pw"] for q in _QUERY_PW.finditer(url) if q["pw"]]


def scrub(text: str, url: str | None) -> str:
    """`text` with `url` and its password (raw and percent-decoded) replaced."""
    if not url:
        return text
    from urllib.parse import unquote

    text = text.replace(url, redact(url))
    for pw in _passwords(url):
        for secret in {pw, unquote(pw)}:
            if len(secret) >= 3:
                text = text.replace(secret, "***")
    return text


__all__ = [
    "STORAGE_ENV_VAR",
    "StorageError",
    "default_storage_path",
    "is_shareable",
    "normalize_url",
    "open_storage",
    "redact",
    "scrub",
]
