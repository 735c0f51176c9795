"""The database under the ledger: engines for SQLite and PostgreSQL, and what a driver error means.

SQLite takes the write lock up front (`BEGIN IMMEDIATE`) and runs in WAL mode; a read-only open is SQLite's own
(`mode=ro`) or PostgreSQL's read-only transactions. An error is classified as damage (the database's own name for
it), a refused write (opened read-only) or a missing table or column (a schema that is not this code's).
"""

from __future__ import annotations

import re
import sqlite3
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc

from shiplift.tasks.errors import ConfigError

WRITE_LOCK_TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 10
RESTORE_FIX = "restore the ledger from a backup; do not write to this copy"


def _sqlite_on_connect_read_only(dbapi_connection: Any, _record: Any) -> None:
    """A read-only SQLite connection: SQLAlchemy's "begin" hook emits BEGIN itself."""
    dbapi_connection.isolation_level = None


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    """A writable SQLite connection: BEGIN left to the "begin" hook, the file switched to WAL."""
    # Let SQLAlchemy's "begin" hook emit BEGIN itself (pysqlite's implicit BEGIN is deferred).
    dbapi_connection.isolation_level = None
    # Switching to WAL needs an exclusive lock and SQLite does not wait for it with the busy
    # handler, so several processes opening a new ledger at once retry until the deadline.
    deadline = time.monotonic() + WRITE_LOCK_TIMEOUT_S
    while True:
        try:
            if dbapi_connection.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                dbapi_connection.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sqlite_on_begin(conn: sa.Connection) -> None:
    """BEGIN IMMEDIATE for a writer's transaction (the write lock up front), DEFERRED for a reader's."""
    mode = "IMMEDIATE" if conn.get_execution_options().get("shiplift_write") else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


SQLITE_DAMAGED = {11: "SQLITE_CORRUPT", 24: "SQLITE_FORMAT", 26: "SQLITE_NOTADB"}
# reported as plain SQLITE_ERROR, or by the sqlite3 module itself (no SQLite code) for text it cannot decode
SQLITE_DAMAGE_WORDS = re.compile(r"malformed|unsupported file format|not a database|Could not decode to UTF-8")
POSTGRES_DAMAGED = {"XX001": "data_corrupted", "XX002": "index_corrupted"}


def missing_table_or_column(error: sa_exc.DBAPIError) -> bool:
    """The query named a table or column the database lacks (its schema is not this code's)."""
    orig = error.orig
    if isinstance(orig, sqlite3.OperationalError):
        return str(orig).startswith(("no such table", "no such column"))
    return getattr(orig, "pgcode", None) in ("42P01", "42703")


def refused_as_read_only(error: sa_exc.DBAPIError) -> bool:
    """The database refused a write because this ledger was opened read-only (SQLITE_READONLY, 25006)."""
    orig = error.orig
    if isinstance(orig, sqlite3.Error):
        return getattr(orig, "sqlite_errorcode", 0) & 0xFF == 8
    return getattr(orig, "pgcode", None) == "25006"


def damage_name(error: sa_exc.DBAPIError) -> str | None:
    """The database's own name for a damaged file or page, else None (the error is about reaching it)."""
    orig = error.orig
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", 0) & 0xFF
        if code in (0, 1) and SQLITE_DAMAGE_WORDS.search(str(orig)):
            return "SQLITE_ERROR"
        return SQLITE_DAMAGED.get(code)
    return POSTGRES_DAMAGED.get(getattr(orig, "pgcode", None) or "")


def make_engine(url: str, schema: str | None, read_only: bool = False) -> tuple[sa.Engine, str]:
    """The engine for a ledger URL and the URL as shown to people (password hidden); ConfigError for a URL that
    is not a persistent SQLite file or a psycopg2 PostgreSQL database."""
    try:
        parsed = sa.engine.make_url(url)
    except sa_exc.ArgumentError as error:
        raise ConfigError(
            f"ledger URL {url!r} is not a database URL: {error}",
            fix="use sqlite:////abs/path/ledger.db or postgresql+psycopg2://user@host:5432/db",
        ) from error
    shown = parsed.render_as_string(hide_password=True)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ConfigError(
                f"ledger URL {shown} is an in-memory database; a ledger must persist",
                fix="use Ledger.for_sqlite(path) or sqlite:////abs/path/ledger.db",
            )
        if schema is not None:
            raise ConfigError(
                f"schema {schema!r} was given for the SQLite ledger {shown}",
                fix="schemas apply to PostgreSQL only; drop the schema argument",
            )
        if read_only:  # SQLite's own read-only open: no schema, no journal-mode switch, no page written
            path = Path(parsed.database).expanduser().resolve()
            parsed = parsed.set(database=f"file:{path.as_posix()}?mode=ro", query={"uri": "true"})
        engine = sa.create_engine(parsed, connect_args={"timeout": WRITE_LOCK_TIMEOUT_S})
        sa_event.listen(engine, "connect", _sqlite_on_connect_read_only if read_only else _sqlite_on_connect)
        sa_event.listen(engine, "begin", _sqlite_on_begin)
        return engine, shown
    if backend == "postgresql" and parsed.get_driver_name() == "psycopg2":
        connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
        if read_only:
            connect_args["options"] = "-c default_transaction_read_only=on"
        engine = sa.create_engine(parsed, connect_args=connect_args, pool_pre_ping=True)
        return engine, shown
    raise ConfigError(
        f"ledger URL {shown} uses {parsed.drivername}, which the ledger does not support",
        fix="use sqlite:///... or postgresql+psycopg2://...",
    )


def wal_sidecars(database: Path) -> tuple[Path, Path]:
    """The `-wal` and `-shm` files SQLite keeps beside `database` in WAL mode."""
    return database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")


def absent_wal_sidecars(engine: sa.Engine) -> Path | None:
    """The SQLite file of `engine` when neither its `-wal` nor its `-shm` file exists yet (what a read-only open must
    not leave behind), else None (PostgreSQL, or a writer has the file open)."""
    if engine.dialect.name != "sqlite":
        return None
    database = Path(str(engine.url.database).removeprefix("file:").split("?", 1)[0])
    return None if any(side.exists() for side in wal_sidecars(database)) else database

