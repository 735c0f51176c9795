"""Several writers and the faults they meet: real OS processes appending to one ledger at once, a
writer SIGKILLed while it holds the write transaction, and a clock that goes backwards.

Each runs on SQLite and on PostgreSQL (`backend` fixture: a fresh schema per test there).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import shiplift.tasks.ledger.timestamps
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.ledger.timestamps import MAX_CLOCK_SKEW_S

if TYPE_CHECKING:
    from tests.unit.conftest import Backend

REPO_ROOT = Path(__file__).resolve().parents[2]
WRITERS, RECORDS_EACH = 4, 10
# A writer process. It says each step on stdout and waits for a line on stdin before the next, so
# the parent starts every writer's open and appends at the same moment. "hold" appends one record
# but stops just before COMMIT, having said so, holding the write transaction until killed.
_WRITER = """
import sys, time
import sqlalchemy as sa
from shiplift.tasks.ledger.store import Ledger

url, schema, name, mode, count = sys.argv[1], sys.argv[2] or None, sys.argv[3], sys.argv[4], int(sys.argv[5])

def step(word):
    print(word, flush=True)
    sys.stdin.readline()

def append(n):
    ledger.append(release_id=name, model="gemma", stage="build", event="started", payload={"n": n}, actor=name)

def hold(_conn):
    print("inserted, not committed", flush=True)
    time.sleep(120)

step("imported")
ledger = Ledger(url, schema=schema)
if mode == "hold":
    sa.event.listen(sa.engine.Engine, "commit", hold)
    append(0)
step("opened")
for n in range(count):
    append(n)
"""


def _append(ledger: Ledger, release_id: str, stage: str = "build", event: str = "started", **payload):
    return ledger.append(release_id=release_id, model="gemma", stage=stage, event=event, payload=payload,
                         actor=release_id)


def _writer(backend: Backend, name: str, mode: str = "append") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _WRITER, backend.url, backend.schema or "", name, mode, str(RECORDS_EACH)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _all_say(writers: list[subprocess.Popen[str]], word: str) -> None:
    for writer in writers:
        said = writer.stdout.readline().strip()
        if said != word:
            writer.kill()
            raise AssertionError(f"writer said {said!r}, not {word!r}: {writer.communicate()[1]}")


def _go(writers: list[subprocess.Popen[str]]) -> None:
    for writer in writers:
        writer.stdin.write("go\n")
        writer.stdin.flush()


def test_processes_creating_and_appending_to_one_ledger_at_once_keep_one_chain(backend: Backend) -> None:
    writers = [_writer(backend, f"w{i}") for i in range(WRITERS)]
    for word in ("imported", "opened"):  # all open the new ledger (creating it) at once, then all append
        _all_say(writers, word)
        _go(writers)
    for writer in writers:
        _, errors = writer.communicate(timeout=120)
        assert writer.returncode == 0, errors
    with backend.open() as ledger:
        result, records = ledger.verify(), ledger.history()
    assert result.ok, result.problems
    assert [r.seq for r in records] == list(range(1, WRITERS * RECORDS_EACH + 1))
    written = [(r.release_id, r.payload["n"]) for r in records]
    assert sorted(written) == sorted((f"w{i}", n) for i in range(WRITERS) for n in range(RECORDS_EACH))
    for i in range(WRITERS):  # each writer's own records stay in the order it wrote them
        assert [n for name, n in written if name == f"w{i}"] == list(range(RECORDS_EACH))


def test_a_writer_killed_inside_its_transaction_leaves_nothing_and_blocks_no_one(backend: Backend) -> None:
    with backend.open() as ledger:
        for n in range(2):
            _append(ledger, "kept", n=n)
        doomed = _writer(backend, "doomed", mode="hold")
        _all_say([doomed], "imported")
        _go([doomed])
        _all_say([doomed], "inserted, not committed")
        waiter_seq: list[int] = []
        waiter = threading.Thread(target=lambda: waiter_seq.append(_append(ledger, "waiter", n=0).seq))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive(), "the held writer did not hold the write lock"
        assert [r.release_id for r in ledger.history()] == ["kept", "kept"]
        doomed.send_signal(signal.SIGKILL)
        doomed.communicate(timeout=10)
        waiter.join(30)
        assert doomed.returncode == -signal.SIGKILL and waiter_seq == [3]
        assert _append(ledger, "after", n=0).seq == 4
        result, records = ledger.verify(), ledger.history()
    assert result.ok, result.problems
    assert [(r.seq, r.release_id) for r in records] == [(1, "kept"), (2, "kept"), (3, "waiter"), (4, "after")]


def _clock(monkeypatch: pytest.MonkeyPatch, moment: datetime) -> None:
    monkeypatch.setattr(shiplift.tasks.ledger.timestamps, "utcnow", lambda: moment)


def test_a_clock_slightly_behind_records_the_newest_time_so_order_holds(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    noon = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    with backend.open() as ledger:
        _clock(monkeypatch, noon)
        first = _append(ledger, "rel-a", "promote", "succeeded")
        _clock(monkeypatch, noon - timedelta(seconds=MAX_CLOCK_SKEW_S - 1))
        second = _append(ledger, "rel-b", "promote", "succeeded")
        assert second.recorded_at == first.recorded_at == "2026-11-29T12:00:00.000000Z"
        assert ledger.served_at("gemma", noon - timedelta(seconds=1)) is None, "rel-b served before rel-a's promotion"
        assert ledger.served_at("gemma", noon).release_id == "rel-b"
        _clock(monkeypatch, noon + timedelta(seconds=1))
        assert _append(ledger, "rel-c").recorded_at == "2026-11-29T12:00:01.000000Z"
        assert ledger.verify().ok


def test_a_clock_far_behind_is_refused_naming_both_times(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    noon = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
    with backend.open() as ledger:
        _clock(monkeypatch, noon)
        _append(ledger, "rel-a")
        _clock(monkeypatch, noon - timedelta(hours=1))
        with pytest.raises(ConfigError, match="clock reads 2026-11-29T11:00:00.000000Z, 3600.000 s before") as refused:
            _append(ledger, "rel-b")
        assert "recorded at 2026-11-29T12:00:00.000000Z" in str(refused.value) and "NTP" in str(refused.value)
        assert [r.release_id for r in ledger.history()] == ["rel-a"]
        _clock(monkeypatch, noon + timedelta(seconds=1))
        assert _append(ledger, "rel-b").seq == 2 and ledger.verify().ok
