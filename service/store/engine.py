"""Opening the SQLite database: engine settings, migrations at startup, and clear errors.

``open_store(path)`` is the only way the daemon gets a database. It creates the parent
directory, migrates to the newest Alembic revision, proves that it can write, and turns
every way this can fail (read-only file or directory, a lock held by another process, a
full disk, a file that is not SQLite, a database from a newer vramd) into a ``StoreError``
that names the file and says what to do, instead of a driver traceback.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import alembic.command
import alembic.config
import alembic.script
import alembic.util
import sqlalchemy.exc
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, Connection
from sqlalchemy.orm import Session, sessionmaker

from service.errors import StoreError

DEFAULT_BUSY_TIMEOUT_MS = 5000
# An execution option: transactions of ``Store.read()`` begin deferred (see above).
READ_ONLY = "vramd_read_only"
SQLITE_MAGIC = b"SQLite format 3\x00"


def migrations_dir() -> Path:
    """Where the Alembic scripts live: ``$VRAMD_MIGRATIONS`` or ``<repo>/migrations``."""
    override = os.environ.get("VRAMD_MIGRATIONS")
    if override:
        return Path(override)
    # From this file rather than ``service.__file__``: under an editable install ``service``
    # can load as a namespace package, whose ``__file__`` is None.
    return Path(__file__).resolve().parents[2] / "migrations"


def make_engine(url: str | URL, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Engine:
    """An engine for a SQLite URL with vramd's pragmas and transaction handling.

    Shared by ``open_store`` and ``migrations/env.py``, so a database created by the
    ``alembic`` command is configured exactly like one created by the daemon.
    """
    engine = create_engine(url, connect_args={"timeout": busy_timeout_ms / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the driver; the "begin" hook below emits it. PRAGMAs then
        # run outside any transaction, where journal_mode and foreign_keys take effect.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            # busy_timeout first: setting WAL may itself have to wait for a lock.
            cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys = ON")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        reading = connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")

    return engine


class Store:
    """An open, migrated database: the engine and a session factory.

    Sessions do not expire objects on commit, so rows returned by query functions can be
    read after their session has ended (they are plain snapshots then).
    """

    def __init__(self, engine: Engine, path: Path) -> None:
        self.engine = engine
        self.path = path
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._readers = sessionmaker(
            engine.execution_options(**{READ_ONLY: True}), expire_on_commit=False
        )

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed if the block succeeds, else rolled back.

        A database failure on the way (disk full, lock timeout) is raised as
        ``StoreError`` naming the file; other errors pass through unchanged.
        """
        try:
            with self._sessions.begin() as session:
                yield session
        except sqlalchemy.exc.OperationalError as exc:
            raise StoreError(explain_sqlite_error(exc, self.path)) from exc

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session: it sees the last commit and never waits for the write lock.

        For reads on the event loop (the API): with WAL a reader is not blocked by a
        writer, not even by another process holding ``BEGIN EXCLUSIVE``. Writes belong
        in ``session()`` (or the store writer): closing this session rolls back.
        """
        try:
            with self._readers() as session:
                yield session
        except sqlalchemy.exc.OperationalError as exc:
            raise StoreError(explain_sqlite_error(exc, self.path)) from exc

    def close(self) -> None:
        """Close every pooled connection (and with them the WAL and shared-memory files)."""
        self.engine.dispose()


def open_store(db_path: str | Path, *, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS) -> Store:
    """Open (creating if needed) and migrate the database at ``db_path``.

    Raises ``StoreError`` with an actionable message when the file cannot be used.
    ``busy_timeout_ms`` is how long to wait for a lock held by another process.

    Every connection runs with WAL (readers never block the writer), ``foreign_keys=ON``
    (SQLite's default is off), a busy timeout (wait for a lock instead of failing at once) and
    ``synchronous=NORMAL`` (durable enough with WAL, far fewer fsyncs at one sample a second).

    Transactions: the stdlib driver's "legacy" mode only BEGINs before DML, so reads are not
    isolated and DDL is not transactional. We switch it off and emit ``BEGIN IMMEDIATE``
    ourselves at the start of every transaction. IMMEDIATE takes the write lock up front, so
    a read-then-write (activating a policy version, bumping a counter) cannot fail half-way
    with SQLITE_BUSY, which the busy timeout cannot retry; in WAL mode readers outside
    vramd are not blocked by it. Migrations run inside one such transaction, so a failed
    migration leaves the file as it was. ``store.read()`` is the exception: a read-only
    transaction starts with a plain (deferred) ``BEGIN`` and never asks for the write lock, so
    with WAL it reads the last committed state even while another process holds that lock.
    """
    path = Path(db_path).expanduser().absolute()
    _check_path(path)
    engine = make_engine(URL.create("sqlite", database=str(path)), busy_timeout_ms=busy_timeout_ms)
    try:
        _migrate(engine)
        _check_writable(engine)
    except alembic.util.CommandError as exc:
        engine.dispose()
        raise StoreError(
            f"database {path} cannot be migrated: {exc}. It may have been written by a "
            "newer vramd; upgrade vramd or point --db at another file"
        ) from exc
    except (sqlalchemy.exc.DBAPIError, sqlite3.Error) as exc:
        engine.dispose()
        raise StoreError(explain_sqlite_error(exc, path)) from exc
    except BaseException:
        engine.dispose()
        raise
    return Store(engine, path)


def explain_sqlite_error(exc: BaseException, path: Path) -> str:
    """Turn a driver error into a sentence that names the file and the way out."""
    cause = _sqlite_cause(exc)
    detail = str(cause) if cause is not None else str(exc)
    code = getattr(cause, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    lowered = detail.lower()
    if is_busy(exc):
        return (
            f"database {path} is locked by another process (waited for the busy timeout); "
            "is another vramd running on the same file?"
        )
    if primary == 8 or "readonly" in lowered or "read-only" in lowered:  # SQLITE_READONLY
        return f"database {path} is read-only; make it and its directory writable"
    if primary == 13 or "disk is full" in lowered or _out_of_space(code, path):  # SQLITE_FULL
        return f"database {path} cannot be written: the disk is full; free some space"
    if primary in (11, 26) or "not a database" in lowered:  # SQLITE_CORRUPT, SQLITE_NOTADB
        return (
            f"{path} is not a SQLite database (or is damaged); move it aside or point "
            "--db at another file"
        )
    if primary in (3, 14) or "unable to open" in lowered:  # SQLITE_PERM, SQLITE_CANTOPEN
        return (
            f"database {path} cannot be opened: {detail}; check that the file and its "
            "directory exist and are writable"
        )
    return f"database {path} cannot be used: {detail}"


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` (possibly wrapped) is SQLite's "database is locked": worth a retry."""
    cause = _sqlite_cause(exc)
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF in (5, 6):  # SQLITE_BUSY, SQLITE_LOCKED
        return True
    return "locked" in str(cause if cause is not None else exc).lower()


# In WAL mode a full disk first shows as SQLITE_IOERR_SHMSIZE (growing the -shm file)
# or another SQLITE_IOERR, not as SQLITE_FULL.
SQLITE_IOERR = 10
SQLITE_IOERR_SHMSIZE = 4874


def _out_of_space(code: object, path: Path) -> bool:
    if not isinstance(code, int) or code & 0xFF != SQLITE_IOERR:
        return False
    if code == SQLITE_IOERR_SHMSIZE:
        return True
    try:
        usage = shutil.disk_usage(path.parent)
    except OSError:
        return False
    return usage.free < 1024 * 1024  # an I/O error with no room left is a full disk


def _sqlite_cause(exc: BaseException) -> sqlite3.Error | None:
    """The underlying sqlite3 error of a (possibly wrapped) exception, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sqlite3.Error):
            return current
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def _check_path(path: Path) -> None:
    """Refuse paths SQLite would fail on with a vague message, before opening them."""
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as exc:
        raise StoreError(
            f"cannot create the directory for database {path}: {exc.filename or parent} "
            "exists and is not a directory; choose another --db path"
        ) from exc
    except OSError as exc:
        raise StoreError(
            f"cannot create the directory for database {path}: {exc.strerror}; "
            "create it or choose another --db path"
        ) from exc
    if path.is_dir():
        raise StoreError(f"database path {path} is a directory; give a file path")
    # WAL keeps -wal and -shm files next to the database, so the directory must be writable
    # even when the file already exists.
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(
            f"cannot write database {path}: directory {parent} is not writable "
            "(SQLite creates its -wal and -shm files there); fix its permissions"
        )
    if not path.exists():
        return
    if not os.access(path, os.W_OK):
        raise StoreError(f"database {path} is read-only; make it writable")
    try:
        with path.open("rb") as f:
            header = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"cannot read database {path}: {exc.strerror}") from exc
    # An empty file is a valid, new database to SQLite.
    if header and header != SQLITE_MAGIC:
        raise StoreError(
            f"{path} is not a SQLite database; move it aside or point --db at another file"
        )


def _alembic_config(url: str) -> alembic.config.Config:
    config = alembic.config.Config()
    # ConfigParser interpolation: a literal % in a path must be doubled.
    config.set_main_option("script_location", str(migrations_dir()).replace("%", "%%"))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _migrate(engine: Engine) -> None:
    """Upgrade to head on a connection of ``engine`` (env.py reuses it, pragmas and all)."""
    location = migrations_dir()
    if not (location / "env.py").is_file():
        raise StoreError(
            f"Alembic migrations not found in {location}; set VRAMD_MIGRATIONS to the "
            "migrations directory of this vramd"
        )
    config = _alembic_config(engine.url.render_as_string(hide_password=False))
    _refuse_downgrade(engine, config)
    with engine.connect() as connection:
        config.attributes["connection"] = connection
        alembic.command.upgrade(config, "head")


def _refuse_downgrade(engine: Engine, config: alembic.config.Config) -> None:
    """A schema this vramd does not know was written by a newer one: refuse before
    anything changes (docs/operations.md, "Restarts and upgrades")."""
    with engine.connect() as connection:
        has_version = connection.execute(
            text("SELECT 1 FROM sqlite_master WHERE type='table' AND name='alembic_version'")
        ).first()
        if has_version is None:
            return
        found = [
            row[0] for row in connection.execute(text("SELECT version_num FROM alembic_version"))
        ]
    scripts = alembic.script.ScriptDirectory.from_config(config)
    known = {script.revision for script in scripts.walk_revisions()}
    unknown = [revision for revision in found if revision not in known]
    if unknown:
        raise StoreError(
            f"database {engine.url.database} was written by a newer vramd (schema "
            f"{', '.join(unknown)}; this vramd knows up to {scripts.get_current_head()}): "
            "a downgrade is refused and nothing was changed, runtimes included; run the "
            "newer vramd, or point --db at another file"
        )


def _check_writable(engine: Engine) -> None:
    """Write one row for real, so a database we cannot write fails now, not mid-request."""
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = version_num"))
