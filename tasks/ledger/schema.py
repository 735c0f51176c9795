"""Versioned schema of the ledger's database: Alembic revisions in tasks/ledger/migrations/.

`migrate` runs inside the caller's write transaction (the ledger's "schema" lock), so two
processes opening a new ledger at once create it once, and a failed step changes nothing.
Ledgers made by shiplift before migrations have the tables but no version; they are stamped
as the baseline revision once their tables are checked to be exactly that schema. A database
at a revision this code does not know was migrated by a newer shiplift and is refused.
The version lives in its own table, `shiplift_ledger_version` (in the ledger's schema), so a
database shared with another Alembic user (Airflow's metadata database) keeps both apart.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError

from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.migrations import BASELINE_REVISION, baseline_tables

SCRIPT_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "shiplift_ledger_version"


@functools.cache
def _script(location: str) -> ScriptDirectory:
    return ScriptDirectory(location)


def head_revision() -> str:
    """The newest schema revision this code knows."""
    head = _script(str(SCRIPT_DIR)).get_current_head()
    assert head is not None, f"{SCRIPT_DIR} holds no revisions"
    return head


def _known(revision: str) -> bool:
    try:
        return _script(str(SCRIPT_DIR)).get_revision(revision) is not None
    except CommandError:  # no such revision here
        return False


def revision_of(conn: sa.Connection, schema: str | None) -> str | None:
    """The revision recorded in the database (None: new, or made before migrations)."""
    context = MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE, "version_table_schema": schema}
    )
    return context.get_current_revision()


def _has_ledger_tables(conn: sa.Connection, schema: str | None) -> bool:
    inspector = sa.inspect(conn)
    return any(inspector.has_table(table.name, schema=schema) for table in baseline_tables(schema))


def schema_differences(conn: sa.Connection, tables: tuple[sa.Table, ...], schema: str | None) -> list[Any]:
    """Alembic's differences between the database and `tables` (columns, types, keys, indexes), ignoring other
    tables."""
    if schema == conn.dialect.default_schema_name:  # Alembic names the default schema None
        schema = None
    names = {table.name for table in tables}
    metadata = sa.MetaData(schema=schema)
    for table in tables:
        table.to_metadata(metadata, schema=schema)

    def include_name(name: str | None, kind: str, _parents: dict[str, Any]) -> bool:
        return name == schema if kind == "schema" else kind != "table" or name in names

    context = MigrationContext.configure(
        conn, opts={"include_schemas": schema is not None, "include_name": include_name, "compare_type": True}
    )
    return compare_metadata(context, metadata)


def _config(conn: sa.Connection, schema: str | None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_DIR))
    config.attributes.update(connection=conn, schema=schema)
    return config


def _newer_schema_error(found: str, shown_url: str) -> ConfigError:
    return ConfigError(
        f"ledger database {shown_url} is at schema revision {found}, which this shiplift does not know "
        f"(its newest is {head_revision()}): a newer shiplift migrated it",
        fix="upgrade shiplift to the release that migrated this ledger; an older one must not open it",
    )


def read_problem(conn: sa.Connection, schema: str | None, shown_url: str) -> ConfigError | None:
    """Why a read-only ledger's query met a schema it cannot read (it never migrates), else None."""
    found, head = revision_of(conn, schema), head_revision()
    if found == head:
        return None
    if found is not None and not _known(found):
        return _newer_schema_error(found, shown_url)
    upgrade = f"run `shiplift ledger upgrade {shown_url}` (it migrates under the writers' lock)"
    if found is not None:
        return ConfigError(
            f"ledger database {shown_url} is at schema revision {found}; this shiplift reads revision {head}",
            fix=upgrade,
        )
    if _has_ledger_tables(conn, schema):
        return ConfigError(
            f"ledger database {shown_url} has no schema version (a ledger from before migrations) and "
            f"differs from what this shiplift reads (revision {head})",
            fix=upgrade,
        )
    return ConfigError(
        f"ledger database {shown_url} has no ledger tables (schema revision none; this shiplift's is {head})",
        fix="check the ledger URL; a new ledger is created by its first release or `shiplift ledger upgrade`",
    )


def migrate(conn: sa.Connection, schema: str | None, shown_url: str) -> dict[str, str | None]:
    """Bring the database on `conn` to head within the caller's transaction.
    Returns `from` (None: new or unversioned), `to`, and `action` (current, created, stamped, upgraded)."""
    found, head = revision_of(conn, schema), head_revision()
    if found == head:
        return {"from": found, "to": head, "action": "current"}
    if found is not None and not _known(found):
        raise _newer_schema_error(found, shown_url)
    config = _config(conn, schema)
    action = "upgraded"
    if found is None:
        action = "created"
        if _has_ledger_tables(conn, schema):
            _require_baseline(conn, schema, shown_url)
            command.stamp(config, BASELINE_REVISION)
            action = "stamped"
    command.upgrade(config, "head")
    return {"from": found, "to": head, "action": action}


def _describe(difference: tuple[Any, ...] | list[Any]) -> str:
    """One Alembic difference as words: the operation and the names it touches, e.g. `add_index ix_a`."""
    if isinstance(difference, list):  # the modify_* differences of one column come grouped
        return "; ".join(_describe(item) for item in difference)
    operation, *items = difference
    names = [_name(item) for item in items]
    return f"{operation} {'.'.join(name for name in names if isinstance(name, str))}"


def _name(item: Any) -> str | None:
    if isinstance(item, sa.UniqueConstraint) and not item.name:
        return f"unique({', '.join(item.columns.keys())})"
    return item if isinstance(item, str) else getattr(item, "name", None)


def _require_baseline(conn: sa.Connection, schema: str | None, shown_url: str) -> None:
    differences = schema_differences(conn, baseline_tables(schema), schema)
    if differences:
        raise ConfigError(
            f"ledger database {shown_url} has ledger tables but no schema version, and they differ from "
            f"revision {BASELINE_REVISION} (the schema before migrations), which would need: "
            + ", ".join(_describe(difference) for difference in differences),
            fix="point shiplift at a shiplift ledger; another application's tables of these names are not one",
        )
