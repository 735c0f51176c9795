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

Times and the clock are `tasks.ledger.timestamps` (`recorded_at` never goes backwards along the chain); the records,
their hash and the chain walk are `tasks.ledger.chain_records`; engines and driver errors are `tasks.ledger.database`.

The schema is versioned (tasks/ledger/schema.py, Alembic): opening a ledger writable migrates
it to this code's head under the writers' lock; read-only never migrates. A database migrated
by a newer shiplift is refused. On SQLite, `verify()` also runs the page check (`quick_check`),
so damage to pages the chain walk never reads (indexes, leases, the version table) is found too.

The promotion leases are `tasks.ledger.leases`; a `Ledger` reads and writes them under its writer lock.

`served_at()` reads records with stage `promote` and event `succeeded` (record a rollback as a
succeeded promotion of the earlier release): the last promotion that completed. A rollout's traffic steps are
appended as they happen, so `tasks.ledger.views.as_of` reads from them which releases served between two
batches; the audit views over records are `tasks.ledger.views`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from shiplift.tasks.atomic import write_text_atomic
from shiplift.tasks.errors import BadInput, IntegrityError, NotFound, NotReady, ShipliftError
from shiplift.tasks.hashing import canonical_json
from shiplift.tasks.ledger.chain_records import (
    GENESIS_HASH,
    Record,
    VerifyResult,
    check_json,
    content_hash,
    render_csv,
    render_json,
    require_text,
    walk_chain,
)
from shiplift.tasks.ledger.database import (
    RESTORE_FIX,
    WRITE_LOCK_TIMEOUT_S,
    absent_wal_sidecars,
    damage_name,
    make_engine,
    missing_table_or_column,
    refused_as_read_only,
    wal_sidecars,
)
from shiplift.tasks.ledger.events import SUCCEEDED
from shiplift.tasks.ledger.leases import Lease, LeaseBook
from shiplift.tasks.ledger.migrations import head_tables
from shiplift.tasks.ledger.schema import migrate, read_problem, revision_of
from shiplift.tasks.ledger.timestamps import as_utc_text, recorded_at

PROMOTE_STAGE = "promote"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


_CREATING = threading.Lock()  # held while this process builds a new SQLite ledger file beside its path


def _tables(schema: str | None) -> tuple[sa.Table, sa.Table]:
    """The records and leases tables this code reads and writes: its newest revision's."""
    return head_tables(schema)


class Ledger:
    """Append-only, hash-chained release records plus per-model promotion leases."""

    def __init__(self, url: str, *, schema: str | None = None, read_only: bool = False):
        """Open a ledger at a SQLAlchemy URL, creating or migrating its schema to head; `schema` is PostgreSQL-only.
        `read_only` opens what is there without creating or changing anything (verification, queries)."""
        self._engine, self._shown_url = make_engine(url, schema, read_only)
        self._postgres = self._engine.dialect.name == "postgresql"
        self._schema = schema
        self._records, self._leases = _tables(schema)
        self._lease_book = LeaseBook(self, self._leases, self._write)
        self._migration: dict[str, str | None] | None = None
        self._sidecars_to_clear = absent_wal_sidecars(self._engine) if read_only else None
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
            engine, _ = make_engine(f"sqlite:///{staging}", None)
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
        if database is not None and any(side.exists() for side in wal_sidecars(database)):
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
            fix = f"check the database is up; a writer lock is awaited {WRITE_LOCK_TIMEOUT_S} s"
            raise self._database_error(error, fix) from error

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        try:
            with self._engine.connect() as conn:
                yield conn
        except sa_exc.DBAPIError as error:
            raise self._schema_problem(error) or self._database_error(error,
                                                                      "check the database is up and retry") from error
        except UnicodeDecodeError as error:  # SQLite hands back a damaged page's text as it finds it
            raise IntegrityError(
                f"ledger database {self._shown_url} is damaged (text that is not UTF-8: {error.reason})",
                fix=RESTORE_FIX,
            ) from error

    def _schema_problem(self, error: sa_exc.DBAPIError) -> ShipliftError | None:
        """For a query that met a missing table or column, the schema revision the database is at and the fix."""
        if not missing_table_or_column(error):
            return None

        try:
            with self._engine.connect() as conn:
                problem = read_problem(conn, self._schema, self._shown_url)
        except sa_exc.DBAPIError:
            return None
        return problem or IntegrityError(
            f"ledger database {self._shown_url} is at this shiplift's schema revision but lacks part of it "
            f"({error.orig})",
            fix="run `shiplift ledger verify`; restore the ledger from a backup if a table was dropped",
        )

    def _database_error(self, error: sa_exc.DBAPIError, fix: str) -> Exception:
        """A damaged database is an IntegrityError; one that cannot be reached is NotReady; anything else is a bug."""
        if refused_as_read_only(error):
            return BadInput(
                f"ledger database {self._shown_url} was opened read-only and refused a write",
                fix="open the ledger without read_only to append or take leases",
            )
        damage = damage_name(error)
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
            require_text(name, value)
        if not isinstance(payload, dict):
            raise BadInput(
                f"payload must be a dict, got {type(payload).__name__}",
                fix="pass the evidence as a dict of JSON values",
            )
        check_json(payload, "")
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
                "recorded_at": recorded_at(head),
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
            return walk_chain(rows, expected_head, allow_empty)

    def _require_undamaged(self, conn: sa.Connection) -> None:
        """SQLite's page check, so damage to pages the chain walk never reads (indexes, leases, version) is found
        too."""
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
        require_text("model", model)
        return self._select(self._records.c.model == model)

    def events(self, stage: str, event: str) -> list[Record]:
        """Every record of one stage and event, of any model, oldest first: what a question about all models (who
        was promoted where, which endpoints were retired) needs, without reading every record of the ledger."""
        require_text("stage", stage)
        require_text("event", event)
        return self._select(self._records.c.stage == stage, self._records.c.event == event)

    def release(self, release_id: str) -> list[Record]:
        """Every record of one release, oldest first."""
        require_text("release_id", release_id)
        found = self._select(self._records.c.release_id == release_id)
        if not found:
            raise NotFound(
                f"release {release_id!r} has no ledger records",
                fix="list releases with `shiplift ledger history`",
            )
        return found

    def served_at(self, model: str, when: datetime | str) -> Record | None:
        """The latest succeeded promotion of `model` at or before `when` (None if none yet)."""
        require_text("model", model)
        moment = as_utc_text(when)
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
        renderers = {"json": render_json, "csv": render_csv}
        if fmt not in renderers:
            raise BadInput(f"export format {fmt!r} is unknown",
                           fix="use json or csv; for people, `shiplift ledger report` writes the HTML audit report")
        return renderers[fmt](self.history(model), self.verify(allow_empty=True))

    # -- leases (tasks.ledger.leases) ----------------------------------------------------

    def acquire_lease(self, model: str, holder: str, release_id: str, ttl_s: float, *,
                      stopped: Callable[[Lease], str | None] | None = None, by_this_process: bool = False) -> Lease:
        """Take the promotion lease on `model`; LeaseHeld if another unexpired holder has it (`LeaseBook.acquire`)."""
        return self._lease_book.acquire(model, holder, release_id, ttl_s, stopped=stopped,
                                        by_this_process=by_this_process)

    def renew_lease(self, model: str, holder: str, release_id: str, ttl_s: float, *, token: str | None = None) -> Lease:
        """Extend `holder`'s lease on `model` by `ttl_s` from now; LeaseLost when it lost it (`LeaseBook.renew`)."""
        return self._lease_book.renew(model, holder, release_id, ttl_s, token=token)

    def release_lease(self, model: str, holder: str, *, token: str | None = None) -> bool:
        """Give back `holder`'s lease on `model`; False if it no longer held it (`LeaseBook.release`)."""
        return self._lease_book.release(model, holder, token=token)


def current_revision(url: str, schema: str | None = None) -> str | None:
    """The schema revision of the ledger at `url` (None: new, or made before migrations); changes nothing."""
    with Ledger(url, schema=schema, read_only=True) as ledger, ledger._read() as conn:
        return revision_of(conn, schema)


def upgrade(url: str, schema: str | None = None) -> dict[str, str | None]:
    """Migrate the ledger at `url` to this shiplift's head, as opening it writable does.
    Returns `url`, `from` (None: new or unversioned), `to` and `action` (current, created, stamped, upgraded)."""
    with Ledger(url, schema=schema) as ledger:
        assert ledger._migration is not None
        return {"url": ledger._shown_url, **ledger._migration}
