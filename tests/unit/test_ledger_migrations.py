"""The ledger's versioned schema: created at head (0002), ledgers from before migrations stamped as 0001
and upgraded, a 0001 ledger's leases kept through 0002 (the lease holder's token, host, pid and renewal), a newer
schema refused untouched, and the upgrade path proven with test-only revisions 0003 in a copy of the shipped
script directory.

Each runs on SQLite and on PostgreSQL (`backend` fixture: a fresh schema per test there).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

import shiplift.tasks.ledger.store
from shiplift.tasks.errors import ConfigError, LeaseHeld
from shiplift.tasks.ledger import schema as ledger_schema
from shiplift.tasks.ledger.schema import VERSION_TABLE, head_revision, schema_differences
from shiplift.tasks.ledger.store import Ledger, current_revision, upgrade

if TYPE_CHECKING:
    from tests.unit.conftest import Backend

REVISION_0003 = '''"""Test-only revision."""
import sqlalchemy as sa
from alembic import context, op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    SCHEMA = context.config.attributes["schema"]
    RECORDS = f'"{SCHEMA}".ledger_records' if SCHEMA else "ledger_records"
'''
ADD_NOTE = '    op.add_column("ledger_records", sa.Column("note", sa.Text, nullable=True), schema=SCHEMA)\n'
FAIL_HALFWAY = ADD_NOTE + '    raise RuntimeError("revision 0003 failed halfway")\n'
RENAME_ACTOR = '    op.execute(f"ALTER TABLE {RECORDS} RENAME COLUMN actor TO who")\n'


def _append(ledger: Ledger, release_id: str = "rel-1", **payload: Any) -> int:
    return ledger.append(release_id=release_id, model="gemma", stage="build", event="started", payload=payload,
                         actor="tester").seq


def _ledger_at_head(backend: Backend, records: int = 3) -> None:
    with backend.open() as ledger:
        for n in range(records):
            _append(ledger, n=n)


def _ledger_at_0001(backend: Backend, records: int = 3) -> None:
    """A ledger as shiplift made it before revision 0002: the shipped migrations without 0002."""
    with tempfile.TemporaryDirectory() as folder:
        scripts = Path(folder) / "migrations"
        shutil.copytree(ledger_schema.SCRIPT_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__", "0002_*"))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ledger_schema, "SCRIPT_DIR", scripts)
            assert head_revision() == "0001"
            _ledger_at_head(backend, records)


def _scripts_with_0003(tmp_path: Path, body: str) -> Path:
    """A copy of the shipped migrations plus a test-only revision 0003 running `body`."""
    scripts = tmp_path / "migrations"
    shutil.copytree(ledger_schema.SCRIPT_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    (scripts / "versions" / "0003_test.py").write_text(REVISION_0003 + body)
    return scripts


def _qualified(backend: Backend, table: str) -> str:
    return f'"{backend.schema}".{table}' if backend.schema else table


def _execute(backend: Backend, *statements: str) -> None:
    with backend.engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement)


def _snapshot(backend: Backend) -> dict[str, tuple[list[str], list[str]]]:
    """Every table in the ledger's schema: its columns and its rows."""
    with backend.engine.connect() as conn:
        inspector = sa.inspect(conn)
        return {
            table: (
                [column["name"] for column in inspector.get_columns(table, schema=backend.schema)],
                sorted(repr(tuple(row)) for row in conn.exec_driver_sql(f"SELECT * FROM {_qualified(backend, table)}")),
            )
            for table in sorted(inspector.get_table_names(schema=backend.schema))
        }


def _columns(backend: Backend) -> list[str]:
    return _snapshot(backend)["ledger_records"][0]


def _read_only(backend: Backend) -> Ledger:
    return Ledger(backend.url, schema=backend.schema, read_only=True)


def test_a_new_ledger_is_created_at_head_with_exactly_the_tables_the_code_uses(backend: Backend) -> None:
    assert head_revision() == "0002"
    created = upgrade(backend.url, backend.schema)
    assert {**created, "url": None} == {"url": None, "from": None, "to": "0002", "action": "created"}
    assert current_revision(backend.url, backend.schema) == "0002"
    with backend.engine.connect() as conn:
        assert schema_differences(conn, shiplift.tasks.ledger.store._tables(backend.schema), backend.schema) == []
        recorded = conn.exec_driver_sql(f"SELECT version_num FROM {_qualified(backend, VERSION_TABLE)}").all()
    assert recorded == [("0002",)], "the version must live in the ledger's own schema"
    assert upgrade(backend.url, backend.schema)["action"] == "current"


def test_a_ledger_from_before_migrations_is_stamped_0001_and_keeps_its_records(backend: Backend) -> None:
    _ledger_at_0001(backend)
    _execute(backend, f"DROP TABLE {_qualified(backend, VERSION_TABLE)}")  # as create_all left it
    assert current_revision(backend.url, backend.schema) is None
    stamped = upgrade(backend.url, backend.schema)
    assert (stamped["from"], stamped["to"], stamped["action"]) == (None, "0002", "stamped")
    assert current_revision(backend.url, backend.schema) == "0002"
    with backend.open() as ledger:
        assert ledger.verify().ok and _append(ledger) == 4


def test_a_0001_ledgers_lease_is_kept_through_0002_and_still_held_by_its_name(backend: Backend) -> None:
    """Revision 0002 adds the holder's token, host, pid and renewal time to the leases: a lease taken before it keeps
    its holder and expiry, its renewal time is its acquisition, and with no process recorded it is held by its name
    (as an orchestrator's is) until it is given back or expires."""
    _ledger_at_0001(backend)
    _execute(backend,
             f"INSERT INTO {_qualified(backend, 'leases')} (model, holder, release_id, acquired_at, expires_at) "
                      "VALUES ('gemma', 'airflow:refresh/run-1', 'rel-1', '2026-12-06T10:00:00.000000Z', "
                      "'2100-01-01T00:00:00.000000Z')")
    upgraded = upgrade(backend.url, backend.schema)
    assert (upgraded["from"], upgraded["to"], upgraded["action"]) == ("0001", "0002", "upgraded")
    with backend.engine.connect() as conn:
        assert schema_differences(conn, shiplift.tasks.ledger.store._tables(backend.schema), backend.schema) == []
    with backend.open() as ledger:
        with pytest.raises(LeaseHeld, match="'airflow:refresh/run-1' .*held by name; renewed 2026-12-06T10:00"):
            ledger.acquire_lease("gemma", "bob@ops-host/pid-1", "rel-1", 60, by_this_process=True)
        renewed = ledger.renew_lease("gemma", "airflow:refresh/run-1", "rel-1", 60)
        assert (renewed.acquired_at, renewed.token, renewed.pid) == ("2026-12-06T10:00:00.000000Z", None, None)
        assert ledger.release_lease("gemma", "airflow:refresh/run-1")


@pytest.mark.parametrize("damage, words", [
    ("DROP TABLE {leases}", "add_table"),
    ("DROP INDEX {index}", "add_index"),
    ("DROP TABLE {leases}; DROP TABLE {records}; CREATE TABLE {records} (seq BIGINT PRIMARY KEY, note TEXT)",
     "add_column"),
], ids=["no-leases", "no-index", "other-table"])
def test_unversioned_tables_that_are_not_revision_0001_are_refused_and_left_alone(
    backend: Backend, damage: str, words: str
) -> None:
    _ledger_at_0001(backend)
    names = {name: _qualified(backend, name) for name in ("leases", VERSION_TABLE)}
    names.update(records=_qualified(backend, "ledger_records"), index=_qualified(backend, "ix_ledger_records_release"))
    _execute(backend, f"DROP TABLE {names[VERSION_TABLE]}", *damage.format(**names).split("; "))
    before = _snapshot(backend)
    with pytest.raises(ConfigError,
                       match="has ledger tables but no schema version, and they differ from revision 0001") as refused:
        backend.open()
    assert words in str(refused.value)
    assert _snapshot(backend) == before


def test_a_schema_newer_than_this_code_is_refused_and_left_alone(backend: Backend) -> None:
    _ledger_at_head(backend, records=2)
    _execute(backend, f"UPDATE {_qualified(backend, VERSION_TABLE)} SET version_num = '0099'")
    before = _snapshot(backend)
    for opening in (backend.open, lambda: upgrade(backend.url, backend.schema)):
        with pytest.raises(ConfigError, match="at schema revision 0099, which this shiplift does not know "
                                              r"\(its newest is 0002\)") as refused:
            opening()
        assert "upgrade shiplift" in str(refused.value)
    assert _snapshot(backend) == before
    with _read_only(backend) as reader:  # it still reads what it can
        assert reader.verify().ok and len(reader.history()) == 2
    assert current_revision(backend.url, backend.schema) == "0099"


def test_an_upgrade_through_a_new_revision_keeps_every_record_verifying(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ledger_at_head(backend)
    monkeypatch.setattr(ledger_schema, "SCRIPT_DIR", _scripts_with_0003(tmp_path, ADD_NOTE))
    assert head_revision() == "0003"
    with _read_only(backend) as reader:  # behind head, read-only: reads, never migrates
        assert reader.verify().ok and len(reader.history()) == 3
    assert current_revision(backend.url, backend.schema) == "0002" and "note" not in _columns(backend)

    upgraded = upgrade(backend.url, backend.schema)
    assert (upgraded["from"], upgraded["to"], upgraded["action"]) == ("0002", "0003", "upgraded")
    assert current_revision(backend.url, backend.schema) == "0003" and "note" in _columns(backend)
    with backend.open() as ledger:
        assert ledger.verify().ok and _append(ledger) == 4
        assert ledger.verify().n_records == 4
    with backend.engine.connect() as conn:
        differences = schema_differences(conn, shiplift.tasks.ledger.store._tables(backend.schema), backend.schema)
    assert [d[0] for d in differences] == ["remove_column"] and differences[0][3].name == "note"

    monkeypatch.undo()  # this code again knows only 0001 and 0002; the database is at 0003
    with pytest.raises(ConfigError, match="revision 0003, which this shiplift does not know"):
        backend.open()
    with _read_only(backend) as reader:
        assert reader.verify().ok and reader.verify().n_records == 4


def test_a_migration_that_fails_halfway_changes_nothing(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ledger_at_head(backend)
    before = _snapshot(backend)
    monkeypatch.setattr(ledger_schema, "SCRIPT_DIR", _scripts_with_0003(tmp_path, FAIL_HALFWAY))
    with pytest.raises(RuntimeError, match="failed halfway"):
        backend.open()
    assert _snapshot(backend) == before and current_revision(backend.url, backend.schema) == "0002"


def test_a_read_only_ledger_names_the_revision_it_cannot_read(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend.name == "sqlite":
        (tmp_path / "ledger.db").write_bytes(b"")
    with _read_only(backend) as reader, pytest.raises(ConfigError,
                                                      match=r"has no ledger tables \(schema revision none"):
        reader.history()
    assert _snapshot(backend) == {}, "a read-only ledger created something"

    _ledger_at_head(backend)
    monkeypatch.setattr(ledger_schema, "SCRIPT_DIR", _scripts_with_0003(tmp_path, RENAME_ACTOR))
    upgrade(backend.url, backend.schema)
    monkeypatch.undo()
    with (_read_only(backend) as reader,
          pytest.raises(ConfigError, match="revision 0003, which this shiplift does not know") as refused):
        reader.history()
    assert "upgrade shiplift" in str(refused.value)


def test_cli_upgrade_stamps_an_old_ledger_and_refuses_one_that_is_not_there(tmp_path: Path, capsys) -> None:
    import json

    from shiplift.tasks.cli.main import main
    from tests.unit.conftest import Backend

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    engine = sa.create_engine(url)
    _ledger_at_0001(Backend("sqlite", url, None, engine), records=1)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE {VERSION_TABLE}")
    engine.dispose()
    assert main(["ledger", "upgrade", "--state-dir", str(tmp_path)]) == 0
    done = json.loads(capsys.readouterr().out)
    assert (done["from"], done["to"], done["action"]) == (None, head_revision(), "stamped")
    assert main(["ledger", "upgrade", "--state-dir", str(tmp_path / "elsewhere")]) == 2
    assert "no ledger at" in capsys.readouterr().err and not (tmp_path / "elsewhere").exists()
