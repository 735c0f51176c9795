"""The release ledger (DESIGN §10) and the one-promotion-per-model lease (§4).

Every stage appends records; nothing updates or deletes them. Each record carries the
sha256 of the previous record (`prev_hash`) and its own `record_hash` =
sha256(canonical JSON of every other field, `seq` and `prev_hash` included), so an edited,
deleted, inserted or reordered record breaks the chain and `verify()` names it.

Deleting the *newest* records leaves a shorter chain that is still internally
consistent; that is only detectable against a head hash kept somewhere else. Anchor
`head().record_hash` outside the database (a ticket, an S3 object with object lock, a
log line) and check it later with `verify(expected_head=...)`.

Appends are serialised across threads and processes: SQLite takes the write lock up
front (`BEGIN IMMEDIATE`), PostgreSQL takes a transaction-level advisory lock; `seq` is
the primary key and `prev_hash` is unique, so even a writer that bypassed the lock could
not fork the chain. A writer killed inside its transaction leaves nothing: the database rolls
it back and releases the lock. Timestamps are UTC, `YYYY-MM-DDTHH:MM:SS.ffffffZ` (sortable as
text).

`recorded_at` never goes backwards along the chain, because `served_at()` orders by it: a
writer whose clock reads up to MAX_CLOCK_SKEW_S earlier than the newest record (hosts drift)
records the newest record's time instead; a clock further behind is refused, naming both times.

The schema is versioned (tasks/ledger/schema.py, Alembic): opening a ledger writable migrates
it to this code's head under the writers' lock; read-only never migrates. A database migrated
by a newer shiplift is refused. On SQLite, `verify()` also runs the page check (`quick_check`),
so damage to pages the chain walk never reads (indexes, leases, the version table) is found too.

A model's promotion lease records its holder's name (shown, never parsed), a random token, the host and pid of a
run's process (none for an orchestrator's lease, held by name across its steps) and when the holder last renewed it:
whether a crashed run's lease may be taken over is judged from those (`acquire_lease(stopped=...)`).

`served_at()` reads records with stage `promote` and event `succeeded` (record a rollback as a
succeeded promotion of the earlier release): the last promotion that completed. A rollout's traffic steps are
appended as they happen, so `tasks.ledger.views.as_of` reads from them which releases served between two
batches; the audit views over records are `tasks.ledger.views`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import re
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Literal

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy import exc as sa_exc

from tasks.atomic import write_text_atomic
from tasks.ledger.events import SUCCEEDED
from tasks.errors import BadInput, ConfigError, IntegrityError, LeaseHeld, LeaseLost, NotFound, NotReady, ShipliftError
from tasks.hashing import canonical_json, sha256_json
from tasks.ledger.migrations import head_tables
from tasks.secret_keys import looks_secret

GENESIS_HASH = "0" * 64
WRITE_LOCK_TIMEOUT_S = 30
CONNECT_TIMEOUT_S = 10
MAX_LEASE_TTL_S = 7 * 24 * 3600
MAX_CLOCK_SKEW_S = 5.0
RESTORE_FIX = "restore the ledger from a backup; do not write to this copy"
PROMOTE_STAGE = "promote"
RECORD_FIELDS = (
    "seq",
    "record_hash",
    "prev_hash",
    "release_id",
    "model",
    "stage",
    "event",
    "actor",
    "recorded_at",
    "payload",
)
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
def _check_json(value: Any, path: str) -> None:
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadInput(
                f"payload{path} is {value}, which JSON cannot represent",
                fix="record non-finite numbers as null or a string",
            )
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _check_json(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadInput(
                    f"payload{path} has a non-string key {key!r}",
                    fix="use string keys only",
                )
            if looks_secret(key):
                raise BadInput(
                    f"payload key {path}.{key} looks like a secret; secrets never go into the ledger",
                    fix="drop it, or record a non-secret reference under a neutral key name",
                )
            _check_json(item, f"{path}.{key}")
        return
    raise BadInput(
        f"payload{path} is a {type(value).__name__}, which is not JSON",
        fix="convert it first (str(path), dt.isoformat(), float(x), list(array))",
    )


def _require_text(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value or value != value.strip():
        raise BadInput(
            f"{name} must be a non-empty string without surrounding whitespace, got {value!r}",
            fix=f"pass a {name} such as 'gemma3-270m'",
        )


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _fmt(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime(_TS_FORMAT)


def _parse_ts(text: str) -> datetime:
    return datetime.strptime(text, _TS_FORMAT).replace(tzinfo=timezone.utc)


def _recorded_at(head: sa.Row | None) -> str:
    """Now, or the head's time when this clock reads at most MAX_CLOCK_SKEW_S earlier; further back is refused."""
    now = _fmt(_utcnow())
    if head is None or now >= head.recorded_at:
        return now
    try:
        behind_s = (_parse_ts(head.recorded_at) - _parse_ts(now)).total_seconds()
    except ValueError as error:
        raise IntegrityError(
            f"the newest record (seq {head.seq}) has recorded_at {head.recorded_at!r}, which is not a timestamp",
            fix="run `shiplift ledger verify`; the record was edited",
        ) from error
    if behind_s > MAX_CLOCK_SKEW_S:
        raise ConfigError(
            f"this host's clock reads {now}, {behind_s:.3f} s before the newest record "
            f"(seq {head.seq}, recorded at {head.recorded_at}); records must not go back in time",
            fix="correct the system clock (NTP), then retry",
        )
    return head.recorded_at


def moment_text(when: datetime | str) -> str:
    """A moment as the ledger writes `recorded_at` (UTC, sortable as text), to compare with records: BadInput for a time
    that is not ISO 8601 or has no timezone."""
    return _as_utc_text(when)


def _as_utc_text(when: datetime | str) -> str:
    if isinstance(when, str):
        try:
            when = datetime.fromisoformat(when)
        except ValueError as error:
            raise BadInput(
                f"time {when!r} is not ISO 8601: {error}",
                fix="pass e.g. '2026-11-29T12:00:00Z'",
            ) from error
    if not isinstance(when, datetime):
        raise BadInput(f"time must be a datetime or ISO string, got {type(when).__name__}")
    if when.tzinfo is None:
        raise BadInput(
            f"time {when.isoformat()} has no timezone, so the moment is ambiguous",
            fix="pass a timezone-aware datetime or a string ending in Z or +00:00",
        )
    return _fmt(when)


@dataclass(frozen=True)
class Record:
    """One ledger record, as stored."""

    seq: int
    record_hash: str
    prev_hash: str
    release_id: str
    model: str
    stage: str
    event: str
    actor: str
    recorded_at: str
    payload: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-able dict (payload as a nested dict)."""
        return {name: getattr(self, name) for name in RECORD_FIELDS}


def content_hash(fields: dict[str, Any]) -> str:
    """A record's hash: of its canonical fields, all but record_hash itself (the chain and proofs recompute it)."""
    return sha256_json({k: v for k, v in fields.items() if k != "record_hash"})


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of a chain verification; `problems` name the seq and what is wrong. `chain` is the (seq,
    record_hash) of every record it checked, in seq order: what checkpoints sign and prove, from the same read."""

    ok: bool
    n_records: int
    head_hash: str | None
    problems: list[str]
    chain: list[tuple[int, str]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-able dict."""
        return {
            "ok": self.ok,
            "n_records": self.n_records,
            "head_hash": self.head_hash,
            "problems": list(self.problems),
        }


@dataclass(frozen=True)
class Lease:
    """The promotion lease on one model; leaving a `with` block releases it. `holder` is a name for people (an actor, an
    orchestrator's run) and is never parsed: a run's lease is its process's (`host`, `pid`) and is renewed and given
    back by its random `token`; an orchestrator's (no pid) is held by name across its steps' processes."""

    model: str
    holder: str
    release_id: str
    acquired_at: str
    expires_at: str
    renewed_at: str
    token: str | None = None  # None only on a lease taken before schema revision 0002
    host: str | None = None  # socket.gethostname() of the process holding a run's lease
    pid: int | None = None  # that process; None: an orchestrator's lease
    ledger: Ledger | None = field(default=None, repr=False, compare=False)
    taken_over: tuple[str, str] | None = None  # (the stopped holder, why) when this lease was taken over from it

    def to_dict(self) -> dict[str, str | int | None]:
        """The lease as a JSON-able dict."""
        return {name: getattr(self, name) for name in LEASE_FIELDS}

    def describe(self) -> str:
        """Who holds it, for people: the holder's name, its process (a run's lease) and when it last renewed."""
        process = f", process {self.pid} on {self.host}" if self.pid is not None else ", held by name"
        return f"{self.holder!r} (release {self.release_id!r}{process}; renewed {self.renewed_at}, expires {self.expires_at})"

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.ledger is not None:
            self.ledger.release_lease(self.model, self.holder, token=self.token)


LEASE_FIELDS = ("model", "holder", "release_id", "acquired_at", "expires_at", "renewed_at", "token", "host", "pid")


_CREATING = threading.Lock()  # held while this process builds a new SQLite ledger file beside its path


def _tables(schema: str | None) -> tuple[sa.Table, sa.Table]:
    """The records and leases tables this code reads and writes: its newest revision's."""
    return head_tables(schema)


def _sqlite_on_connect_read_only(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
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
    mode = "IMMEDIATE" if conn.get_execution_options().get("shiplift_write") else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


SQLITE_DAMAGED = {11: "SQLITE_CORRUPT", 24: "SQLITE_FORMAT", 26: "SQLITE_NOTADB"}
# reported as plain SQLITE_ERROR, or by the sqlite3 module itself (no SQLite code) for text it cannot decode
SQLITE_DAMAGE_WORDS = re.compile(r"malformed|unsupported file format|not a database|Could not decode to UTF-8")
POSTGRES_DAMAGED = {"XX001": "data_corrupted", "XX002": "index_corrupted"}


def _missing_table_or_column(error: sa_exc.DBAPIError) -> bool:
    """The query named a table or column the database lacks (its schema is not this code's)."""
    orig = error.orig
    if isinstance(orig, sqlite3.OperationalError):
        return str(orig).startswith(("no such table", "no such column"))
    return getattr(orig, "pgcode", None) in ("42P01", "42703")


def _refused_as_read_only(error: sa_exc.DBAPIError) -> bool:
    """The database refused a write because this ledger was opened read-only (SQLITE_READONLY, 25006)."""
    orig = error.orig
    if isinstance(orig, sqlite3.Error):
        return getattr(orig, "sqlite_errorcode", 0) & 0xFF == 8
    return getattr(orig, "pgcode", None) == "25006"


def _damage(error: sa_exc.DBAPIError) -> str | None:
    """The database's own name for a damaged file or page, else None (the error is about reaching it)."""
    orig = error.orig
    if isinstance(orig, sqlite3.Error):
        code = getattr(orig, "sqlite_errorcode", 0) & 0xFF
        if code in (0, 1) and SQLITE_DAMAGE_WORDS.search(str(orig)):
            return "SQLITE_ERROR"
        return SQLITE_DAMAGED.get(code)
    return POSTGRES_DAMAGED.get(getattr(orig, "pgcode", None) or "")


def _make_engine(url: str, schema: str | None, read_only: bool = False) -> tuple[sa.Engine, str]:
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


def _wal_sidecars(database: Path) -> tuple[Path, Path]:
    return database.with_name(database.name + "-wal"), database.with_name(database.name + "-shm")


def _absent_wal_sidecars(engine: sa.Engine) -> Path | None:
    """The SQLite file of `engine` when neither its `-wal` nor its `-shm` file exists yet (what a read-only open must
    not leave behind), else None (PostgreSQL, or a writer has the file open)."""
    if engine.dialect.name != "sqlite":
        return None
    database = Path(str(engine.url.database).removeprefix("file:").split("?", 1)[0])
    return None if any(side.exists() for side in _wal_sidecars(database)) else database


class Ledger:
    """Append-only, hash-chained release records plus per-model promotion leases."""

    def __init__(self, url: str, *, schema: str | None = None, read_only: bool = False):
        """Open a ledger at a SQLAlchemy URL, creating or migrating its schema to head; `schema` is PostgreSQL-only.
        `read_only` opens what is there without creating or changing anything (verification, queries)."""
        self._engine, self._shown_url = _make_engine(url, schema, read_only)
        self._postgres = self._engine.dialect.name == "postgresql"
        self._schema = schema
        self._records, self._leases = _tables(schema)
        self._migration: dict[str, str | None] | None = None
        self._sidecars_to_clear = _absent_wal_sidecars(self._engine) if read_only else None
        if not read_only:
            try:
                created = self._create_sqlite_file_whole(url)
                with self._write("schema") as conn:
                    self._migration = self._migrate(conn)
                if created is not None:
                    self._migration = created
            except BaseException:
                self._engine.dispose()
                raise

    def _migrate(self, conn: sa.Connection) -> dict[str, str | None]:
        from tasks.ledger.schema import migrate  # Alembic: only a writable open needs it (~0.2 s to import)

        return migrate(conn, self._schema, self._shown_url)

    def _create_sqlite_file_whole(self, url: str) -> dict[str, str | None] | None:
        """A new SQLite ledger appears with its tables or not at all: it is built beside its path and linked into
        place, so a reader never opens a file that exists but has no schema yet. Returns the migration, or None when
        the file was there already (or another process linked its own first)."""
        if self._postgres:
            return None
        path = Path(sa.engine.make_url(url).database).expanduser().resolve()
        with _CREATING:  # Alembic's migration context is one per process: threads take turns
            if path.exists() or not path.parent.is_dir():  # a missing folder is reported by the open that follows
                return None
            staging = path.with_name(f".{path.name}.{os.getpid()}.new")
            staging.unlink(missing_ok=True)  # left by a crashed run of this pid number; never linked, never read
            engine, _ = _make_engine(f"sqlite:///{staging}", None)
            try:
                with engine.connect() as conn:
                    conn.execution_options(shiplift_write=True)
                    with conn.begin():
                        migration = self._migrate(conn)
            finally:
                engine.dispose()  # the last connection's close checkpoints the WAL into the file and removes it
            try:
                os.link(staging, path)  # another process may have linked its own first: then that one is the ledger
            except FileExistsError:
                return None
            finally:
                staging.unlink(missing_ok=True)
            return migration

    @classmethod
    def for_sqlite(cls, path: str | Path) -> Ledger:
        """Open a SQLite ledger file, creating its folder and tables when missing."""
        resolved = Path(path).expanduser().resolve()
        resolved.parent.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{resolved}")

    def close(self) -> None:
        """Release pooled database connections. A read-only open of a WAL-mode SQLite file makes SQLite create its
        `-wal` and `-shm` files, which a read-only connection cannot remove: when they were not there before, one
        plain connection is opened and closed, so that SQLite, as the file's last connection, removes them again (an
        empty WAL writes no page; a writer still holding the file keeps them)."""
        self._engine.dispose()
        database, self._sidecars_to_clear = self._sidecars_to_clear, None
        if database is not None and any(side.exists() for side in _wal_sidecars(database)):
            try:
                conn = sqlite3.connect(database, timeout=1)
                try:
                    conn.execute("PRAGMA schema_version").fetchone()
                finally:
                    conn.close()
            except sqlite3.Error:
                pass  # a folder this user cannot write: SQLite kept its index in memory and created nothing

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- transactions -------------------------------------------------------------------

    def _lock_key(self, purpose: str) -> int:
        digest = hashlib.sha256(f"shiplift-ledger:{self._schema}:{purpose}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    @contextmanager
    def _write(self, purpose: str) -> Iterator[sa.Connection]:
        """A transaction that holds the writer lock for `purpose` until commit."""
        try:
            with self._engine.connect() as conn:
                conn.execution_options(shiplift_write=True)
                with conn.begin():
                    if self._postgres:
                        conn.exec_driver_sql(
                            f"SET LOCAL lock_timeout = '{WRITE_LOCK_TIMEOUT_S}s'"
                        )
                        conn.execute(
                            sa.text("SELECT pg_advisory_xact_lock(:key)"),
                            {"key": self._lock_key(purpose)},
                        )
                    yield conn
        except sa_exc.DBAPIError as error:
            raise self._database_error(error, f"check the database is up; a writer lock is awaited {WRITE_LOCK_TIMEOUT_S} s") from error

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        try:
            with self._engine.connect() as conn:
                yield conn
        except sa_exc.DBAPIError as error:
            raise self._schema_problem(error) or self._database_error(error, "check the database is up and retry") from error
        except UnicodeDecodeError as error:  # SQLite hands back a damaged page's text as it finds it
            raise IntegrityError(
                f"ledger database {self._shown_url} is damaged (text that is not UTF-8: {error.reason})",
                fix=RESTORE_FIX,
            ) from error

    def _schema_problem(self, error: sa_exc.DBAPIError) -> ShipliftError | None:
        """For a query that met a missing table or column, the schema revision the database is at and the fix."""
        if not _missing_table_or_column(error):
            return None
        from tasks.ledger.schema import read_problem

        try:
            with self._engine.connect() as conn:
                problem = read_problem(conn, self._schema, self._shown_url)
        except sa_exc.DBAPIError:
            return None
        return problem or IntegrityError(
            f"ledger database {self._shown_url} is at this shiplift's schema revision but lacks part of it ({error.orig})",
            fix="run `shiplift ledger verify`; restore the ledger from a backup if a table was dropped",
        )

    def _database_error(self, error: sa_exc.DBAPIError, fix: str) -> Exception:
        """A damaged database is an IntegrityError; one that cannot be reached is NotReady; anything else is a bug."""
        if _refused_as_read_only(error):
            return BadInput(
                f"ledger database {self._shown_url} was opened read-only and refused a write",
                fix="open the ledger without read_only to append or take leases",
            )
        damage = _damage(error)
        if damage:
            return IntegrityError(
                f"ledger database {self._shown_url} is damaged ({damage}: {error.orig})",
                fix=RESTORE_FIX,
            )
        if isinstance(error, sa_exc.OperationalError):
            return NotReady(f"ledger database {self._shown_url} is unreachable or busy: {error.orig}", fix=fix)
        return error

    # -- records ------------------------------------------------------------------------

    def append(
        self,
        *,
        release_id: str,
        model: str,
        stage: str,
        event: str,
        payload: dict[str, Any],
        actor: str,
    ) -> Record:
        """Append one record to the chain; the only way records enter the ledger."""
        for name, value in (
            ("release_id", release_id),
            ("model", model),
            ("stage", stage),
            ("event", event),
            ("actor", actor),
        ):
            _require_text(name, value)
        if not isinstance(payload, dict):
            raise BadInput(
                f"payload must be a dict, got {type(payload).__name__}",
                fix="pass the evidence as a dict of JSON values",
            )
        _check_json(payload, "")
        try:
            payload_text = canonical_json(payload).decode("utf-8")
        except ValueError as error:  # e.g. a lone surrogate in a string
            raise BadInput(f"payload cannot be encoded as UTF-8 JSON: {error}") from error
        records = self._records
        with self._write("append") as conn:
            head = conn.execute(
                sa.select(records.c.seq, records.c.record_hash, records.c.recorded_at)
                .order_by(records.c.seq.desc())
                .limit(1)
            ).first()
            seq, prev_hash = (head.seq + 1, head.record_hash) if head else (1, GENESIS_HASH)
            fields = {
                "seq": seq,
                "prev_hash": prev_hash,
                "release_id": release_id,
                "model": model,
                "stage": stage,
                "event": event,
                "actor": actor,
                "recorded_at": _recorded_at(head),
                "payload": json.loads(payload_text),
            }
            record = Record(record_hash=content_hash(fields), **fields)
            conn.execute(
                records.insert().values(
                    {**fields, "record_hash": record.record_hash, "payload": payload_text}
                )
            )
        return record

    @staticmethod
    def _to_record(row: sa.Row) -> Record:
        values = row._asdict()
        values["payload"] = json.loads(values["payload"])
        return Record(**values)

    def _select(self, *where: Any, newest_first: bool = False, limit: int | None = None) -> list[Record]:
        records = self._records
        order = records.c.seq.desc() if newest_first else records.c.seq
        query = sa.select(records).where(*where).order_by(order)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [self._to_record(row) for row in conn.execute(query)]

    def head(self) -> Record | None:
        """The newest record (anchor its record_hash elsewhere to detect tail deletion)."""
        found = self._select(newest_first=True, limit=1)
        return found[0] if found else None

    def verify(self, expected_head: str | None = None, *, allow_empty: bool = False) -> VerifyResult:
        """Recompute every hash and link; with `expected_head`, also require that anchor in the chain.
        A ledger with no records table, or no records, fails unless `allow_empty` (it was emptied or replaced)."""
        if expected_head is not None and not _HEX64.match(expected_head):
            raise BadInput(
                f"expected_head {expected_head!r} is not a lowercase hex sha256",
                fix="pass the record_hash you anchored from head()",
            )
        problems: list[str] = []
        chain: list[tuple[int, str]] = []
        last_seq, last_hash = 0, GENESIS_HASH
        anchor_seen = expected_head is None
        with self._read() as conn:
            self._require_undamaged(conn)
            if not sa.inspect(conn).has_table(self._records.name, schema=self._schema):
                problems = [] if allow_empty else [
                    f"{self._shown_url} has no {self._records.name} table: the database is empty or is not a "
                    "shiplift ledger (was it emptied or replaced?)"
                ]
                return VerifyResult(ok=not problems, n_records=0, head_hash=None, problems=problems)
            rows = conn.execution_options(yield_per=1000).execute(
                sa.select(self._records).order_by(self._records.c.seq)
            )
            for row in rows:
                chain.append((row.seq, row.record_hash))
                if row.seq != last_seq + 1:
                    problems.append(
                        f"seq {row.seq}: follows seq {last_seq}; records "
                        f"{last_seq + 1}..{row.seq - 1} are missing (deleted or renumbered)"
                    )
                if row.prev_hash != last_hash:
                    problems.append(
                        f"seq {row.seq}: prev_hash {row.prev_hash[:16]}... does not link to the "
                        f"record before it ({last_hash[:16]}...): a record was deleted, inserted "
                        "or reordered"
                    )
                fields = row._asdict()
                try:
                    fields["payload"] = json.loads(fields["payload"])
                except ValueError:
                    problems.append(f"seq {row.seq}: payload is not valid JSON (edited)")
                if content_hash(fields) != row.record_hash:
                    problems.append(
                        f"seq {row.seq}: record_hash does not match the record's content: "
                        "the record was edited"
                    )
                anchor_seen = anchor_seen or row.record_hash == expected_head
                last_seq, last_hash = row.seq, row.record_hash
        if not chain and not allow_empty:
            problems.append("the ledger holds no records: every record was deleted, or this is not the ledger expected")
        if not anchor_seen:
            problems.append(
                f"anchored head {expected_head} is not in the ledger: the newest records were "
                "deleted or the chain was rewritten"
            )
        return VerifyResult(
            ok=not problems,
            n_records=len(chain),
            head_hash=last_hash if chain else None,
            problems=problems,
            chain=chain,
        )

    def _require_undamaged(self, conn: sa.Connection) -> None:
        """SQLite's page check, so damage to pages the chain walk never reads (indexes, leases, version) is found too."""
        if self._postgres:
            return
        found = conn.exec_driver_sql("PRAGMA quick_check").scalars().all()
        if found != ["ok"]:
            raise IntegrityError(
                f"ledger database {self._shown_url} is damaged (SQLITE_CORRUPT: {'; '.join(found)})",
                fix=RESTORE_FIX,
            )

    def history(self, model: str | None = None) -> list[Record]:
        """All records, oldest first, optionally of one model."""
        if model is None:
            return self._select()
        _require_text("model", model)
        return self._select(self._records.c.model == model)

    def events(self, stage: str, event: str) -> list[Record]:
        """Every record of one stage and event, of any model, oldest first: what a question about all models (who
        was promoted where, which endpoints were retired) needs, without reading every record of the ledger."""
        _require_text("stage", stage)
        _require_text("event", event)
        return self._select(self._records.c.stage == stage, self._records.c.event == event)

    def release(self, release_id: str) -> list[Record]:
        """Every record of one release, oldest first."""
        _require_text("release_id", release_id)
        found = self._select(self._records.c.release_id == release_id)
        if not found:
            raise NotFound(
                f"release {release_id!r} has no ledger records",
                fix="list releases with `shiplift ledger history`",
            )
        return found

    def served_at(self, model: str, when: datetime | str) -> Record | None:
        """The latest succeeded promotion of `model` at or before `when` (None if none yet)."""
        _require_text("model", model)
        moment = _as_utc_text(when)
        records = self._records
        found = self._select(
            records.c.model == model,
            records.c.stage == PROMOTE_STAGE,
            records.c.event == SUCCEEDED,
            records.c.recorded_at <= moment,
            newest_first=True,
            limit=1,
        )
        return found[0] if found else None

    def export(
        self, fmt: Literal["json", "csv"], path: str | Path, *, model: str | None = None
    ) -> Path:
        """Write the records (optionally of one model) and the verify result to a file, atomically."""
        return write_text_atomic(Path(path).expanduser().resolve(), self.export_text(fmt, model=model))

    def export_text(self, fmt: Literal["json", "csv"], *, model: str | None = None) -> str:
        """The records (optionally of one model) and the verify result as `export` writes them."""
        renderers = {"json": _render_json, "csv": _render_csv}
        if fmt not in renderers:
            raise BadInput(f"export format {fmt!r} is unknown",
                           fix="use json or csv; for people, `shiplift ledger report` writes the HTML audit report")
        return renderers[fmt](self.history(model), self.verify(allow_empty=True))

    # -- leases -------------------------------------------------------------------------

    @staticmethod
    def _check_lease_args(model: str, holder: str, release_id: str, ttl_s: float) -> None:
        for name, value in (("model", model), ("holder", holder), ("release_id", release_id)):
            _require_text(name, value)
        if (
            isinstance(ttl_s, bool)
            or not isinstance(ttl_s, (int, float))
            or not math.isfinite(ttl_s)
            or not 0 < ttl_s <= MAX_LEASE_TTL_S
        ):
            raise BadInput(
                f"lease ttl_s must be a number in (0, {MAX_LEASE_TTL_S}], got {ttl_s!r}",
                fix="pass how long the lease lasts unless it is renewed, in seconds",
            )

    def _lease_of(self, conn: sa.Connection, model: str) -> Lease | None:
        """The lease row on `model` as a Lease (None: nobody has taken it, or it was given back)."""
        row = conn.execute(sa.select(self._leases).where(self._leases.c.model == model)).first()
        return None if row is None else Lease(ledger=self, **row._asdict())

    def acquire_lease(self, model: str, holder: str, release_id: str, ttl_s: float, *,
                      stopped: Callable[[Lease], str | None] | None = None, by_this_process: bool = False) -> Lease:
        """Take the promotion lease on `model`; LeaseHeld if another unexpired holder has it. `by_this_process`: the
        lease is this process's run's (host and pid recorded; renewed and given back with the returned lease's random
        token); otherwise an orchestrator's, held by `holder`'s name across its steps' processes. The same holder taking
        it again (the same process, or the same name) refreshes it. A holder of this same release that `stopped(lease)`
        says has stopped (a crashed run) is taken over at once; the Lease names it in `taken_over` for the caller to
        record. Another release's holder is never taken over."""
        self._check_lease_args(model, holder, release_id, ttl_s)
        host, pid = (socket.gethostname(), os.getpid()) if by_this_process else (None, None)
        taken_over = None
        with self._write("lease") as conn:
            now = _utcnow()
            current = self._lease_of(conn, model)
            live = current is not None and _parse_ts(current.expires_at) > now
            if live and (current.holder, current.release_id, current.host, current.pid) != (holder, release_id, host, pid):
                why = stopped(current) if stopped is not None and current.release_id == release_id else None
                if why is None:
                    same = " (this same release, in another run that is still alive)" if current.release_id == release_id else ""
                    raise LeaseHeld(
                        f"model {model!r} is being promoted by {current.describe()}{same}",
                        fix="wait for that run to finish or its lease to expire, then retry",
                    )
                taken_over, live = (current.holder, why), False
            values = {
                "holder": holder,
                "release_id": release_id,
                "acquired_at": current.acquired_at if live else _fmt(now),
                "expires_at": _fmt(now + timedelta(seconds=ttl_s)),
                "renewed_at": _fmt(now),
                "token": current.token if live else secrets.token_hex(16),
                "host": host,
                "pid": pid,
            }
            if current is None:
                conn.execute(self._leases.insert().values(model=model, **values))
            else:
                conn.execute(self._leases.update().where(self._leases.c.model == model).values(**values))
        return Lease(model=model, ledger=self, taken_over=taken_over, **values)

    def renew_lease(self, model: str, holder: str, release_id: str, ttl_s: float, *, token: str | None = None) -> Lease:
        """Extend `holder`'s lease on `model` by `ttl_s` from now and stamp the renewal; a run's lease is matched by its
        `token`, an orchestrator's by its name. LeaseLost when the lease is not this holder's (another run took it over
        after it expired or its process stopped, or it was given back): such a run must not touch production."""
        self._check_lease_args(model, holder, release_id, ttl_s)
        with self._write("lease") as conn:
            now = _utcnow()
            current = self._lease_of(conn, model)
            if current is None or not _held_by(current, holder, release_id, token):
                taken = f"it is held by {current.describe()}" if current is not None else "nobody holds it: it was given back"
                raise LeaseLost(
                    f"run {holder!r} lost the promotion lease on {model!r}: {taken}",
                    fix="this run stops before production; look at `shiplift ledger history` and rerun the release once "
                        "the other run has finished",
                )
            renewed = {"expires_at": _fmt(now + timedelta(seconds=ttl_s)), "renewed_at": _fmt(now)}
            conn.execute(self._leases.update().where(self._leases.c.model == model).values(**renewed))
        return replace(current, **renewed)

    def release_lease(self, model: str, holder: str, *, token: str | None = None) -> bool:
        """Give back `holder`'s lease on `model` (a run's by its `token`, an orchestrator's by name); False if it no
        longer held it (expired and taken over)."""
        _require_text("model", model)
        _require_text("holder", holder)
        leases = self._leases
        owned = leases.c.token == token if token is not None else leases.c.pid.is_(None)
        with self._write("lease") as conn:
            result = conn.execute(leases.delete().where(leases.c.model == model, leases.c.holder == holder, owned))
        return result.rowcount == 1


def _held_by(lease: Lease, holder: str, release_id: str, token: str | None) -> bool:
    """Whether `lease` is the one `holder` took for `release_id`: a run's by its token, an orchestrator's by name."""
    owned = lease.token == token if token is not None else lease.pid is None
    return (lease.holder, lease.release_id) == (holder, release_id) and owned


def _render_json(records: list[Record], verified: VerifyResult) -> str:
    document = {"verify": verified.to_dict(), "records": [r.to_dict() for r in records]}
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _row_cells(record: Record) -> list[str]:
    cells = record.to_dict()
    cells["payload"] = canonical_json(record.payload).decode("utf-8")
    return [str(cells[name]) for name in RECORD_FIELDS]


def _render_csv(records: list[Record], _verified: VerifyResult) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RECORD_FIELDS)
    writer.writerows(_row_cells(record) for record in records)
    return buffer.getvalue()


def current_revision(url: str, schema: str | None = None) -> str | None:
    """The schema revision of the ledger at `url` (None: new, or made before migrations); changes nothing."""
    from tasks.ledger.schema import revision_of

    with Ledger(url, schema=schema, read_only=True) as ledger, ledger._read() as conn:
        return revision_of(conn, schema)


def upgrade(url: str, schema: str | None = None) -> dict[str, str | None]:
    """Migrate the ledger at `url` to this shiplift's head, as opening it writable does.
    Returns `url`, `from` (None: new or unversioned), `to` and `action` (current, created, stamped, upgraded)."""
    with Ledger(url, schema=schema) as ledger:
        assert ledger._migration is not None
        return {"url": ledger._shown_url, **ledger._migration}
