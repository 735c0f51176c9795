"""The release ledger: hash chain, tamper detection, concurrency, queries, leases.

Every chain and lease test runs on SQLite and on PostgreSQL (SHIPLIFT_TEST_DATABASE_URL, default
the local trust-auth server); the PostgreSQL variants skip, saying why, only when that
server is unreachable. Each PostgreSQL test works in its own schema and drops it after.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shiplift.tasks.errors import BadInput, ConfigError, IntegrityError, LeaseHeld, NotFound, NotReady
from shiplift.tasks.hashing import sha256_json
from shiplift.tasks.ledger.store import GENESIS_HASH, Ledger
from shiplift.tasks.secret_keys import looks_secret
from tests.unit.conftest import Backend

REPO_ROOT = Path(__file__).resolve().parents[2]


def _append(ledger: Ledger, release_id: str = "rel-1", stage: str = "build", event: str = "started", **payload):
    return ledger.append(
        release_id=release_id, model="gemma", stage=stage, event=event, payload=payload, actor="tester"
    )


def test_chain_links_and_verifies(ledger: Ledger) -> None:
    first = _append(ledger, n=1)
    second = _append(ledger, event="succeeded", n=2, metrics={"accuracy": 0.5})
    third = _append(ledger, stage="package", n=3)
    assert [r.seq for r in (first, second, third)] == [1, 2, 3]
    assert first.prev_hash == GENESIS_HASH
    assert second.prev_hash == first.record_hash and third.prev_hash == second.record_hash
    body = {k: v for k, v in second.to_dict().items() if k != "record_hash"}
    assert sha256_json(body) == second.record_hash
    result = ledger.verify()
    assert result.ok and result.problems == []
    assert result.n_records == 3 and result.head_hash == third.record_hash
    assert ledger.head() == third
    assert ledger.history() == [first, second, third]


def test_edited_payload_is_detected(backend: Backend, ledger: Ledger) -> None:
    for n in range(3):
        _append(ledger, n=n)
    backend.raw("UPDATE {records} SET payload = '{{\"n\":99}}' WHERE seq = 2")
    result = ledger.verify()
    assert not result.ok
    assert any(p.startswith("seq 2:") and "edited" in p for p in result.problems), result.problems


def test_edited_actor_is_detected(backend: Backend, ledger: Ledger) -> None:
    for n in range(2):
        _append(ledger, n=n)
    backend.raw("UPDATE {records} SET actor = 'mallory' WHERE seq = 1")
    problems = ledger.verify().problems
    assert any(p.startswith("seq 1:") and "edited" in p for p in problems), problems


def test_deleted_middle_record_is_detected(backend: Backend, ledger: Ledger) -> None:
    for n in range(4):
        _append(ledger, n=n)
    backend.raw("DELETE FROM {records} WHERE seq = 2")
    result = ledger.verify()
    assert not result.ok and result.n_records == 3
    assert any(p.startswith("seq 3:") and "missing" in p for p in result.problems), result.problems
    assert any(p.startswith("seq 3:") and "prev_hash" in p for p in result.problems)


def test_deleted_newest_record_needs_an_anchor(backend: Backend, ledger: Ledger) -> None:
    for n in range(3):
        _append(ledger, n=n)
    anchor = ledger.head().record_hash
    backend.raw("DELETE FROM {records} WHERE seq = 3")
    assert ledger.verify().ok  # a shorter chain is self-consistent ...
    result = ledger.verify(expected_head=anchor)  # ... but the anchored head is gone
    assert not result.ok
    assert any("anchored head" in p and anchor in p for p in result.problems)


def test_anchor_still_verifies_after_later_appends(ledger: Ledger) -> None:
    anchor = _append(ledger, n=1).record_hash
    _append(ledger, n=2)
    assert ledger.verify(expected_head=anchor).ok
    with pytest.raises(BadInput, match="expected_head"):
        ledger.verify(expected_head="not-a-hash")


def test_reordered_records_are_detected(backend: Backend, ledger: Ledger) -> None:
    for n in range(3):
        _append(ledger, n=n)
    backend.raw("UPDATE {records} SET seq = -1 WHERE seq = 1")
    backend.raw("UPDATE {records} SET seq = 1 WHERE seq = 2")
    backend.raw("UPDATE {records} SET seq = 2 WHERE seq = -1")
    result = ledger.verify()
    assert not result.ok
    assert any(p.startswith("seq 1:") for p in result.problems)
    assert any(p.startswith("seq 2:") for p in result.problems)


def test_an_inserted_record_is_detected(backend: Backend, ledger: Ledger) -> None:
    """A forged record slipped in after seq 1 with a correct hash of its own: the database refuses a second record
    chained to the same predecessor, and relinking the next record to the forgery breaks that record's hash."""
    for n in range(3):
        _append(ledger, n=n)
    first, second = ledger.history()[:2]
    forged = {**second.to_dict(), "seq": 2, "payload": {"n": "forged"}, "prev_hash": first.record_hash}
    forged["record_hash"] = sha256_json({k: v for k, v in forged.items() if k != "record_hash"})
    backend.raw("UPDATE {records} SET seq = seq + 10 WHERE seq >= 2")
    values = ("{seq}, '{record_hash}', '{prev_hash}', '{release_id}', '{model}', '{stage}', '{event}', '{actor}', "
              "'{recorded_at}', '{payload}'").format(**forged | {"payload": json.dumps(forged["payload"])})
    values = values.replace("{", "{{").replace("}", "}}")  # raw() formats the table name in
    with pytest.raises(sa.exc.IntegrityError):  # prev_hash is unique: one successor per record
        backend.raw(f"INSERT INTO {{records}} VALUES ({values})")
    backend.raw(f"UPDATE {{records}} SET prev_hash = '{forged['record_hash']}' WHERE seq = 12")
    backend.raw(f"INSERT INTO {{records}} VALUES ({values})")
    backend.raw("UPDATE {records} SET seq = seq - 9 WHERE seq >= 12")
    result = ledger.verify()
    assert not result.ok and result.n_records == 4
    assert any(p.startswith("seq 3:") and "record_hash does not match" in p for p in result.problems), result.problems
    assert not any(p.startswith("seq 2:") for p in result.problems), "the forgery itself is well formed"


def _assert_single_chain(ledger: Ledger, expected: int) -> None:
    result = ledger.verify()
    assert result.ok, result.problems
    assert result.n_records == expected
    assert [r.seq for r in ledger.history()] == list(range(1, expected + 1))


def test_concurrent_thread_appends_keep_one_chain(backend: Backend, ledger: Ledger) -> None:
    errors: list[BaseException] = []

    def worker(index: int, own_engine: bool) -> None:
        target = backend.open() if own_engine else ledger
        try:
            for n in range(12):
                _append(target, release_id=f"t{index}", n=n)
        except BaseException as error:  # noqa: BLE001 - surfaced by the assert below
            errors.append(error)
        finally:
            if own_engine:
                target.close()

    threads = [threading.Thread(target=worker, args=(i, i % 2 == 0)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    _assert_single_chain(ledger, 72)


_PROCESS_WORKER = """
import sys
from shiplift.tasks.ledger.store import Ledger
url, schema, name, count = sys.argv[1], sys.argv[2] or None, sys.argv[3], int(sys.argv[4])
ledger = Ledger(url, schema=schema)
for n in range(count):
    ledger.append(release_id=name, model="gemma", stage="build", event="started",
                  payload={"n": n}, actor=name)
ledger.close()
"""


def test_concurrent_process_appends_keep_one_chain(backend: Backend, ledger: Ledger) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROCESS_WORKER, backend.url, backend.schema or "", f"p{i}", "15"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(3)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err.decode()
    _assert_single_chain(ledger, 45)
    assert {r.actor for r in ledger.history()} == {"p0", "p1", "p2"}


@pytest.mark.parametrize(
    "payload",
    [
        {"password": "hunter2"},
        {"aws": {"secret_access_key": "x"}},
        {"creds": [{"AWSAccessKeyId": "AKIA..."}]},
        {"hfToken": "hf_x"},
        {"api_key": "k"},
        {"client_secret": "s"},
    ],
)
def test_secret_looking_keys_are_refused(ledger: Ledger, payload: dict) -> None:
    with pytest.raises(BadInput, match="looks like a secret"):
        _append(ledger, **payload)
    assert ledger.verify().n_records == 0


def test_token_counts_and_tokenizer_keys_are_not_secrets() -> None:
    for key in ("input_tokens", "max_tokens", "eos_token_id", "tokenizer_model", "kms_key_id"):
        assert not looks_secret(key), key
    for key in ("token", "session_token", "authToken", "db_password", "privateKey"):
        assert looks_secret(key), key


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        ({"path": Path("x")}, "PosixPath"),
        ({"x": float("nan")}, "nan"),
        ({"x": {1: "a"}}, "non-string key"),
        ({"x": "\ud800"}, "UTF-8"),
    ],
)
def test_non_json_payload_is_refused(ledger: Ledger, payload: dict, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        ledger.append(release_id="r", model="m", stage="s", event="e", payload=payload, actor="a")
    assert ledger.history() == []


def test_blank_fields_are_refused(ledger: Ledger) -> None:
    with pytest.raises(BadInput, match="release_id"):
        ledger.append(release_id=" ", model="m", stage="s", event="e", payload={}, actor="a")
    with pytest.raises(BadInput, match="payload must be a dict"):
        ledger.append(release_id="r", model="m", stage="s", event="e", payload=[1], actor="a")


def test_ledger_has_no_update_or_delete_methods() -> None:
    public = {name for name in dir(Ledger) if not name.startswith("_")}
    assert not {n for n in public if any(w in n for w in ("update", "delete", "remove", "edit"))}


def test_history_and_release(ledger: Ledger) -> None:
    _append(ledger, "rel-1", "build", "succeeded", artifact_sha256="a" * 64, config_hash="c1")
    _append(ledger, "rel-1", "validate", "succeeded", metrics={"accuracy": 0.33}, decision="pass")
    ledger.append(release_id="other", model="bert", stage="build", event="started", payload={}, actor="x")
    _append(ledger, "rel-2", "build", "succeeded", artifact_sha256="b" * 64, config_hash="c1")
    _append(ledger, "rel-2", "validate", "succeeded", metrics={"accuracy": 0.31}, decision="fail")
    assert [r.release_id for r in ledger.history("gemma")] == ["rel-1", "rel-1", "rel-2", "rel-2"]
    assert [r.stage for r in ledger.release("rel-1")] == ["build", "validate"]
    with pytest.raises(NotFound, match="nope"):
        ledger.release("nope")


def test_served_at_returns_latest_promotion_before_time(ledger: Ledger) -> None:
    first = _append(ledger, "rel-1", "promote", "succeeded")
    _append(ledger, "rel-2", "promote", "failed")
    time.sleep(0.002)
    second = _append(ledger, "rel-3", "promote", "succeeded")
    assert ledger.served_at("gemma", first.recorded_at).release_id == "rel-1"
    between = datetime.fromisoformat(second.recorded_at) - timedelta(microseconds=1)
    assert ledger.served_at("gemma", between).release_id == "rel-1"
    assert ledger.served_at("gemma", second.recorded_at).release_id == "rel-3"
    before = datetime.fromisoformat(first.recorded_at) - timedelta(seconds=1)
    assert ledger.served_at("gemma", before) is None
    assert ledger.served_at("bert", datetime.now(UTC)) is None
    with pytest.raises(BadInput, match="no timezone"):
        ledger.served_at("gemma", datetime(2026, 1, 1))
    with pytest.raises(BadInput, match="ISO 8601"):
        ledger.served_at("gemma", "yesterday")


def test_export_json_and_csv(ledger: Ledger, tmp_path: Path) -> None:
    _append(ledger, note="<script>alert(1)</script>")
    _append(ledger, event="succeeded", note="a,b\nc")
    exported = json.loads(ledger.export("json", tmp_path / "out" / "l.json").read_text())
    assert exported["verify"]["ok"] and len(exported["records"]) == 2
    assert exported["records"][1]["payload"] == {"note": "a,b\nc"}
    with open(ledger.export("csv", tmp_path / "l.csv"), newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["seq"] for r in rows] == ["1", "2"]
    assert json.loads(rows[1]["payload"]) == {"note": "a,b\nc"}
    with pytest.raises(BadInput, match="ledger report"):
        ledger.export("html", tmp_path / "l.html")  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="xml"):
        ledger.export("xml", tmp_path / "l.xml")  # type: ignore[arg-type]


def test_lease_held_names_holder_release_and_expiry(ledger: Ledger) -> None:
    lease = ledger.acquire_lease("gemma", "alice", "rel-1", ttl_s=60)
    with pytest.raises(LeaseHeld) as caught:
        ledger.acquire_lease("gemma", "bob", "rel-2", ttl_s=60)
    message = str(caught.value)
    assert "alice" in message and "rel-1" in message and lease.expires_at in message
    with pytest.raises(LeaseHeld, match="alice"):
        ledger.acquire_lease("gemma", "alice", "rel-9", ttl_s=60)
    assert ledger.acquire_lease("bert", "bob", "rel-2", ttl_s=60).holder == "bob"


def test_same_holder_refreshes_lease(ledger: Ledger) -> None:
    first = ledger.acquire_lease("gemma", "alice", "rel-1", ttl_s=5)
    time.sleep(0.01)
    again = ledger.acquire_lease("gemma", "alice", "rel-1", ttl_s=60)
    assert again.acquired_at == first.acquired_at
    assert again.expires_at > first.expires_at


def test_expired_lease_is_taken_over(ledger: Ledger) -> None:
    ledger.acquire_lease("gemma", "alice", "rel-1", ttl_s=0.2)
    time.sleep(0.3)
    taken = ledger.acquire_lease("gemma", "bob", "rel-2", ttl_s=60)
    assert taken.holder == "bob"
    assert ledger.release_lease("gemma", "alice") is False  # alice lost it
    with pytest.raises(LeaseHeld, match="bob"):
        ledger.acquire_lease("gemma", "carol", "rel-3", ttl_s=60)


def test_lease_context_manager_releases(ledger: Ledger) -> None:
    with ledger.acquire_lease("gemma", "alice", "rel-1", ttl_s=60) as lease:
        assert lease.to_dict()["holder"] == "alice"
        with pytest.raises(LeaseHeld):
            ledger.acquire_lease("gemma", "bob", "rel-2", ttl_s=60)
    assert ledger.acquire_lease("gemma", "bob", "rel-2", ttl_s=60).holder == "bob"


def test_concurrent_lease_acquire_has_one_winner(backend: Backend) -> None:
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def contender(index: int) -> None:
        own = backend.open()
        try:
            barrier.wait(timeout=30)
            own.acquire_lease("gemma", f"h{index}", f"rel-{index}", ttl_s=60)
            outcomes.append("won")
        except LeaseHeld:
            outcomes.append("held")
        finally:
            own.close()

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["held", "held", "held", "won"]


@pytest.mark.parametrize("ttl", [0, -1, float("inf"), True, "60"])
def test_bad_lease_ttl_is_refused(ledger: Ledger, ttl: object) -> None:
    with pytest.raises(BadInput, match="ttl_s"):
        ledger.acquire_lease("gemma", "alice", "rel-1", ttl_s=ttl)  # type: ignore[arg-type]


def test_bad_urls_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="in-memory"):
        Ledger("sqlite://")
    with pytest.raises(ConfigError, match="not support"):
        Ledger("mysql+pymysql://u@localhost/db")
    with pytest.raises(ConfigError, match="not a database URL"):
        Ledger("::nonsense::")
    with pytest.raises(ConfigError, match="PostgreSQL only"):
        Ledger(f"sqlite:///{tmp_path / 'x.db'}", schema="s")


def test_unreachable_postgres_is_not_ready() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(NotReady, match="unreachable") as caught:
        Ledger(f"postgresql+psycopg2://postgres:s3cr3t@127.0.0.1:{port}/none")
    assert "s3cr3t" not in str(caught.value)


def test_for_sqlite_creates_folder_and_persists(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "ledger.db"
    with Ledger.for_sqlite(path) as first:
        record = _append(first)
    with Ledger.for_sqlite(path) as reopened:
        assert reopened.head() == record


def test_record_to_dict_is_json(ledger: Ledger) -> None:
    record = _append(ledger, nested={"list": [1, 2.5, None, True]})
    assert json.loads(json.dumps(record.to_dict())) == record.to_dict()
    assert ledger.head().payload["nested"]["list"] == [1, 2.5, None, True]


# -- verification never writes, and names an empty, replaced or damaged ledger -----------------


def _read_only(backend: Backend) -> Ledger:
    return Ledger(backend.url, schema=backend.schema, read_only=True)


def _has_records_table(backend: Backend) -> bool:
    with backend.engine.connect() as conn:
        return sa.inspect(conn).has_table("ledger_records", schema=backend.schema)


def test_verifying_an_emptied_ledger_fails_and_creates_nothing(backend: Backend, tmp_path: Path) -> None:
    if backend.name == "sqlite":
        (tmp_path / "ledger.db").write_bytes(b"")
    with _read_only(backend) as ledger:
        result = ledger.verify()
    assert not result.ok and result.n_records == 0
    assert "has no ledger_records table" in result.problems[0] and "emptied or replaced" in result.problems[0]
    assert not _has_records_table(backend)
    if backend.name == "sqlite":
        assert (tmp_path / "ledger.db").stat().st_size == 0


def test_a_ledger_whose_records_were_all_deleted_fails(backend: Backend, ledger: Ledger) -> None:
    for n in range(2):
        _append(ledger, n=n)
    backend.raw("DELETE FROM {records}")
    result = ledger.verify()
    assert not result.ok and "holds no records" in result.problems[0]
    assert ledger.verify(allow_empty=True).ok, "an export of a new ledger may be empty"


def test_verify_does_not_change_a_single_byte(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with Ledger.for_sqlite(path) as ledger:
        for n in range(20):
            _append(ledger, n=n)
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE ledger_records SET actor = 'mallory' WHERE seq = 7")
    before = path.read_bytes()
    with Ledger(f"sqlite:///{path}", read_only=True) as ledger:
        result = ledger.verify()
    assert not result.ok and any(p.startswith("seq 7:") for p in result.problems)
    assert path.read_bytes() == before


def test_the_database_refuses_writes_through_a_read_only_ledger(backend: Backend, ledger: Ledger) -> None:
    _append(ledger, n=1)
    with _read_only(backend) as reader, pytest.raises(BadInput, match="opened read-only and refused a write"):
        _append(reader, n=2)
    assert ledger.verify().n_records == 1


def _cli_verify(url: str, capsys) -> tuple[int, str, str]:
    from shiplift.tasks.cli.main import main

    code = main(["ledger", "verify", "--ledger-url", url])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _real_ledger_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "source.db"
    with Ledger.for_sqlite(path) as ledger:
        for n in range(300):
            _append(ledger, release_id=f"rel-{n}", n=n, padding="x" * 200)
    return path.read_bytes()


@pytest.mark.parametrize("damage, words", [
    (lambda data: os.urandom(8192), "damaged (SQLITE_NOTADB"),
    (lambda data: data[: len(data) // 2], "damaged (SQLITE_CORRUPT"),
    (lambda data: data[:8192] + os.urandom(4096) + data[12288:], "damaged (SQLITE_CORRUPT"),
], ids=["random-bytes", "truncated", "overwritten-pages"])
def test_a_damaged_database_file_is_named_damaged(tmp_path: Path, capsys, damage, words: str) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(damage(_real_ledger_bytes(tmp_path)))
    before = path.read_bytes()
    code, out, err = _cli_verify(f"sqlite:///{path}", capsys)
    assert code == 3 and words in err and "restore the ledger from a backup" in err
    assert out == "" and path.read_bytes() == before


def test_verify_of_a_missing_ledger_is_bad_input_and_creates_nothing(tmp_path: Path, capsys) -> None:
    code, _, err = _cli_verify(f"sqlite:///{tmp_path / 'absent.db'}", capsys)
    assert code == 2 and "no ledger at" in err
    assert list(tmp_path.iterdir()) == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_to_the_file_is_a_failed_verify_or_an_integrity_error(tmp_path: Path, data) -> None:
    """Overwrite bytes anywhere in a real ledger file: verification fails and says why, or the chain is intact."""
    pristine = _pristine_ledger(tmp_path)
    damaged = bytearray(pristine)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        chunk = data.draw(st.binary(min_size=1, max_size=64))
        damaged[at:at + len(chunk)] = chunk
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    path = folder / "ledger.db"
    path.write_bytes(bytes(damaged))
    try:
        with Ledger(f"sqlite:///{path}", read_only=True) as ledger:
            result = ledger.verify()
    except IntegrityError as exc:
        assert "damaged" in str(exc)
        return
    assert result.ok == (result.n_records == 40 and not result.problems)
    assert path.read_bytes() == bytes(damaged)


_PRISTINE: dict[str, bytes] = {}


def _pristine_ledger(tmp_path: Path) -> bytes:
    """A 40-record SQLite ledger file (checkpointed, so the whole chain is in the main file); built once."""
    if "bytes" not in _PRISTINE:
        path = Path(tempfile.mkdtemp(dir=tmp_path)) / "ledger.db"
        with Ledger.for_sqlite(path) as ledger:
            for n in range(40):
                _append(ledger, release_id=f"rel-{n % 7}", n=n)
        _PRISTINE["bytes"] = path.read_bytes()
    return _PRISTINE["bytes"]


def test_a_new_sqlite_ledger_appears_with_its_tables_or_not_at_all(tmp_path, monkeypatch):
    """A reader polling for the file (`shiplift ledger history` while the first release starts) never opens one that
    exists without its schema: the schema is built in a staging file beside it, which is then linked into place."""
    from shiplift.tasks.ledger import store

    path = tmp_path / "ledger.db"
    (tmp_path / f".ledger.db.{os.getpid()}.new").write_bytes(b"left by a crashed run")  # never linked, replaced
    seen_during_migration = []
    migrate = store.Ledger._migrate

    def watching(self, conn):
        seen_during_migration.append(path.exists())
        return migrate(self, conn)

    monkeypatch.setattr(store.Ledger, "_migrate", watching)
    ledger = Ledger(f"sqlite:///{path}")
    assert seen_during_migration[0] is False, "the ledger's path existed while its schema was being made"
    assert ledger._migration["action"] == "created"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".new")] == [], "staging files are gone"
    with Ledger(f"sqlite:///{path}", read_only=True) as reader:
        assert reader.history() == []
    ledger.close()
    assert Ledger(f"sqlite:///{path}")._migration["action"] == "current"
