"""Signed checkpoints against an adversary who can write the database, on SQLite and on the real PostgreSQL
server: a chain edited and rehashed, a truncated tail, a replaced database, a forged checkpoint and one signed
by another key are each detected and named; bad keys, a clock that goes backwards and a broken chain are
refused and nothing is signed."""

from __future__ import annotations

import json
import os
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from shiplift.tasks.errors import ConfigError, IntegrityError, NotFound
from shiplift.tasks.ledger import merkle
from shiplift.tasks.ledger.checkpoints import (
    CheckpointLog,
    SigningKey,
    check_proof,
    checkpoint,
    prove,
    verify_with_checkpoints,
)
from shiplift.tasks.ledger.store import GENESIS_HASH, Ledger, content_hash
from tests.unit.conftest import Backend
from tests.unit.test_ledger import _append


@pytest.fixture
def key(tmp_path: Path) -> SigningKey:
    return SigningKey(tmp_path / "keys" / "signing.pem")


@pytest.fixture
def log(tmp_path: Path) -> CheckpointLog:
    return CheckpointLog(tmp_path / "state" / "ledger-checkpoints.jsonl")


def _signed(ledger: Ledger, log: CheckpointLog, key: SigningKey, n: int = 4):
    for i in range(n):
        _append(ledger, n=i)
    return checkpoint(ledger, log, key)


def _rewrite(backend: Backend, ledger: Ledger, seq: int, payload: dict) -> None:
    """What an attacker with write access does: edit record `seq`, then recompute every hash from there on."""
    records = ledger._records
    with backend.engine.begin() as conn:
        rows = [row._asdict() for row in conn.execute(sa.select(records).order_by(records.c.seq))]
        prev = GENESIS_HASH
        for row in rows:
            row["payload"] = payload if row["seq"] == seq else json.loads(row["payload"])
            row["prev_hash"] = prev
            row["record_hash"] = content_hash(row)
            prev = row["record_hash"]
            conn.execute(records.update().where(records.c.seq == row["seq"]).values(
                prev_hash=row["prev_hash"], record_hash=row["record_hash"], payload=json.dumps(row["payload"])))


def _problems(ledger, log, key) -> list[str]:
    verdict = verify_with_checkpoints(ledger, log, key.public)
    assert verdict["ok"] is not bool(verdict["problems"])
    return verdict["problems"]


def test_a_checkpoint_signs_the_head_and_a_later_chain_extends_it(ledger, log, key):
    first = _signed(ledger, log, key)
    assert (first.seq, first.head_hash, first.key_id) == (4, ledger.history()[3].record_hash, key.key_id)
    assert ledger.head().payload == {"seq": 4, "key_id": key.key_id, "head_hash": first.head_hash,
                                     "signed_at": first.signed_at}, "the chain records the checkpoint"
    assert checkpoint(ledger, log, key) == first and ledger.head().seq == 5, "nothing new: no second checkpoint"
    _append(ledger, n=9)
    second = checkpoint(ledger, log, key)
    verdict = verify_with_checkpoints(ledger, log, key.public)
    assert verdict["ok"] and verdict["checked_against"] == second.to_dict() and verdict["checkpoints"] == 2
    assert oct(key.path.stat().st_mode & 0o777) == "0o600"


def test_a_chain_edited_and_rehashed_verifies_alone_but_not_against_its_checkpoint(backend, ledger, log, key):
    _signed(ledger, log, key)
    _rewrite(backend, ledger, 2, {"n": 99, "accuracy": 1.0})
    assert ledger.verify().ok, "the rewritten chain is self-consistent"
    problems = _problems(ledger, log, key)
    assert len(problems) == 2 and problems[0].startswith("record 4 hashes to")
    assert "the chain was rewritten" in problems[0]
    assert problems[1].startswith("the Merkle root of records 1..4 is") and "the records were rewritten" in problems[1]


def test_a_truncated_tail_is_named(backend, ledger, log, key):
    _signed(ledger, log, key)
    backend.raw("DELETE FROM {records} WHERE seq >= 3")
    problems = _problems(ledger, log, key)
    assert problems == [problems[0]] and "covers seq 4, but the ledger ends at seq 2" in problems[0]


def test_a_replaced_database_is_detected(tmp_path, ledger, log, key):
    _signed(ledger, log, key)
    other = Ledger.for_sqlite(tmp_path / "other.db")
    for i in range(6):
        other.append(release_id="rel-1", model="gemma", stage="build", event="started", payload={"n": i},
                     actor="mallory")
    problems = _problems(other, log, key)
    assert any("the chain was rewritten (or the database was replaced)" in p for p in problems), problems


def test_a_forged_checkpoint_and_one_signed_by_another_key_are_named(tmp_path, ledger, log, key):
    signed = _signed(ledger, log, key)
    forged = {**signed.to_dict(), "seq": 2}  # claims a shorter history with the real signature
    other_key = SigningKey(tmp_path / "other-keys" / "signing.pem")
    foreign = {**signed.to_dict(), "key_id": other_key.key_id, "signature": other_key.sign(signed.body())}
    with log.path.open("a") as handle:
        handle.write(json.dumps(forged) + "\n" + json.dumps(foreign) + "\n" + "not json\n")
    problems = _problems(ledger, log, key)
    assert any("line 2 (seq 2) has a signature that does not verify" in p and "forged" in p for p in problems), problems
    assert any(f"line 3 (seq 4) names key {other_key.key_id}" in p and "signed by another key" in p for p in problems)
    assert any(p.startswith("checkpoint line 4 is not a checkpoint") for p in problems)
    assert verify_with_checkpoints(ledger, log,
                                   key.public)["checked_against"] == signed.to_dict(), "the valid one counts"


def test_refusals_sign_nothing(tmp_path, backend, ledger, log, key):
    signed = _signed(ledger, log, key)
    lines = log.path.read_text()
    _append(ledger, n=7)
    with pytest.raises(IntegrityError, match="clock reads .* before the latest checkpoint"):
        checkpoint(ledger, log, key, now=datetime.now(UTC) - timedelta(days=1))
    backend.raw("UPDATE {records} SET actor = 'mallory' WHERE seq = 1")
    with pytest.raises(IntegrityError, match="does not verify, so its head is not signed.*seq 1.*edited"):
        checkpoint(ledger, log, key)
    assert log.path.read_text() == lines and log.latest() == signed, "nothing was re-signed"

    loose = tmp_path / "loose.pem"
    loose.write_bytes(key.path.read_bytes())
    os.chmod(loose, 0o644)
    with pytest.raises(ConfigError, match="readable by others .*chmod 600"):
        SigningKey(loose)
    with pytest.raises(ConfigError, match="inside the state dir"):
        SigningKey(tmp_path / "state" / "key.pem", state_dir=tmp_path / "state")
    with pytest.raises(NotFound, match="no checkpoint key at"):
        SigningKey(tmp_path / "missing.pem", create=False)
    assert not (tmp_path / "missing.pem").exists() and not (tmp_path / "state" / "key.pem").exists()


def test_cli_verify_reports_the_checkpoint_and_fails_on_a_rewrite(tmp_path, capsys):
    from shiplift.tasks.cli.main import main
    from shiplift.tasks.console import EXIT_REJECTED

    state = tmp_path / "state"
    state.mkdir()
    ledger = Ledger.for_sqlite(state / "ledger.db")
    for i in range(3):
        _append(ledger, n=i)
    keyfile = str(tmp_path / "k" / "key.pem")
    assert main(["ledger", "checkpoint", "--state-dir", str(state), "--key", keyfile, "--json"]) == 0
    signed = json.loads(capsys.readouterr().out)
    assert main(["ledger", "verify", "--state-dir", str(state), "--key", keyfile, "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["ok"] and verdict["checked_against"]["head_hash"] == signed["head_hash"]
    proof = tmp_path / "proof.json"
    assert main(["ledger", "prove", "rel-1", "--state-dir", str(state), "--key", keyfile, "--out", str(proof)]) == 0
    assert main(["ledger", "check-proof", str(proof), "--key", keyfile]) == 0
    checked = json.loads(capsys.readouterr().out)
    assert checked == {"ok": True, "release_id": "rel-1", "records": 3, "problems": [],
                       "covers": {"release_id": "rel-1", "records": 3, "seqs": [1, 2, 3], "checkpoint_seq": 3,
                                  "head_hash": signed["head_hash"]}}
    assert main(["ledger", "check-proof", str(tmp_path / "none.json"), "--key", keyfile]) == 1
    assert "no proof file" in capsys.readouterr().err
    engine = sa.create_engine(f"sqlite:///{state / 'ledger.db'}")
    _rewrite(Backend("sqlite", "", None, engine), ledger, 1, {"n": "forged"})
    assert main(["ledger", "verify", "--state-dir", str(state), "--key", keyfile]) == EXIT_REJECTED
    headline, problem = capsys.readouterr().out.splitlines()[:2]
    assert headline.startswith("Ledger verification FAILED (4 records; extends the checkpoint of seq 3")
    assert problem.startswith("  - record 3 hashes to") and "the chain was rewritten" in problem
    engine.dispose()


# RFC 6962's test inputs and the Merkle tree hashes of their first n entries (certificate-transparency's
# merkle tree test vectors), an independent reference for the tree.
CT_INPUTS = [b"", b"\x00", b"\x10", b"\x20\x21", b"\x30\x31", b"\x40\x41\x42\x43",
             b"\x50\x51\x52\x53\x54\x55\x56\x57", bytes(range(0x60, 0x70))]
CT_ROOTS = ["6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
            "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
            "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
            "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
            "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
            "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"]


def test_merkle_roots_match_rfc_6962_test_vectors_and_every_path_proves_its_leaf():
    leaves = [merkle.leaf(data) for data in CT_INPUTS]
    assert [merkle.root(leaves[:n]).hex() for n in range(1, 9)] == CT_ROOTS
    many = [merkle.leaf(bytes([i])) for i in range(70)]
    for size in range(1, 71):
        root = merkle.root(many[:size])
        for index in range(size):
            path = merkle.Tree(many[:size]).audit_path(index)
            assert len(path) <= (size - 1).bit_length(), "O(log n) hashes"
            assert merkle.included(many[index], index, size, path, root)
            assert not merkle.included(merkle.leaf(b"another record"), index, size, path, root)
            if path:
                assert not merkle.included(many[index], index, size, path[:-1], root), "a shortened path proves nothing"


def test_a_release_is_proven_included_with_the_checkpoint_alone(tmp_path, ledger, log, key):
    for i in range(5):
        _append(ledger, release_id="rel-a" if i % 2 else "rel-b", n=i)
    checkpoint(ledger, log, key)
    _append(ledger, release_id="rel-a", n=99)  # after the checkpoint
    proof = prove(ledger, log, "rel-a", key.public)
    assert [r["seq"] for r in proof["records"]] == [2, 4] and proof["not_yet_checkpointed"] == [7]
    assert check_proof(json.loads(json.dumps(proof)), key.public) == []
    moved = json.loads(json.dumps(proof))
    moved["records"][0]["path"] = proof["records"][1]["path"]  # another record's place in the tree
    assert check_proof(moved,
                       key.public) == ["record 2 is not proven included in the checkpoint of "
                                       f"{proof['checkpoint']['signed_at']}"]
    forged = json.loads(json.dumps(proof))
    forged["checkpoint"]["merkle_root"] = "0" * 64
    assert check_proof(forged,
                       key.public) == ["the proof's checkpoint signature does not verify: it was forged or edited"]
    other = SigningKey(tmp_path / "other" / "key.pem")
    assert "signed by another key" in check_proof(proof, other.public)[0]
    with pytest.raises(NotFound, match="release 'rel-zzz' has no ledger records"):
        prove(ledger, log, "rel-zzz", key.public)


def test_deleting_the_newest_record_the_record_of_the_latest_checkpoint_fails_verify(backend, ledger, log, key):
    """Issue 44: the newest record is the chain's record of its latest checkpoint; deleted, the chain still ends past
    the checkpoint's seq with the hash it signed, so only checking every logged checkpoint against the chain's records
    of them names it. Nothing is signed over it."""
    signed = _signed(ledger, log, key)
    assert ledger.head().seq == 5 and ledger.head().payload["seq"] == signed.seq
    backend.raw("DELETE FROM {records} WHERE seq = 5")
    assert ledger.verify().ok, "the shorter chain is self-consistent"
    assert _problems(ledger, log, key) == [
        f"the checkpoint of seq 4 signed {signed.signed_at} is in the checkpoint log, but no record of the chain "
        "(which ends at seq 4) records it: the record appended after it was signed was deleted (the newest records "
        "were), or the database was replaced"]
    with pytest.raises(IntegrityError, match="does not verify, so its head is not signed"):
        checkpoint(ledger, log, key)


def test_cli_verify_fails_when_the_newest_record_of_a_checkpointed_ledger_is_deleted(tmp_path, capsys):
    from shiplift.tasks.cli.main import main
    from shiplift.tasks.console import EXIT_REJECTED

    state, keyfile = tmp_path / "state", str(tmp_path / "k" / "key.pem")
    with Ledger.for_sqlite(state / "ledger.db") as ledger:
        for i in range(3):
            _append(ledger, n=i)
        assert main(["ledger", "checkpoint", "--state-dir", str(state), "--key", keyfile]) == 0
        _append(ledger, n=3)
        assert main(["ledger", "checkpoint", "--state-dir", str(state), "--key", keyfile]) == 0
        assert main(["ledger", "verify", "--state-dir", str(state), "--key", keyfile]) == 0
        newest = ledger.head()
    assert (newest.seq, newest.payload["seq"]) == (6, 5), "the newest record records the latest checkpoint"
    with sqlite3.connect(state / "ledger.db") as conn:
        conn.execute("DELETE FROM ledger_records WHERE seq = 6")
    capsys.readouterr()
    assert main(["ledger", "verify", "--state-dir", str(state), "--key", keyfile]) == EXIT_REJECTED
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Ledger verification FAILED (5 records; extends the checkpoint of seq 5")
    assert lines[1].startswith("  - the checkpoint of seq 5 signed") and "no record of the chain" in lines[1]


def test_a_proof_cut_down_to_its_first_record_is_refused(tmp_path, capsys):
    """Issue 44: a proof states what it covers (the release, how many records and their seqs, the checkpoint's seq and
    head hash), so one cut down to its first record no longer checks as `"ok": true, "records": 1`."""
    from shiplift.tasks.cli.main import main
    from shiplift.tasks.console import EXIT_BAD_INPUT, EXIT_REJECTED

    state, keyfile, proof = tmp_path / "state", str(tmp_path / "k" / "key.pem"), tmp_path / "proof.json"
    with Ledger.for_sqlite(state / "ledger.db") as ledger:
        for i in range(5):
            _append(ledger, release_id="rel-a" if i % 2 == 0 else "rel-b", n=i)
    assert main(["ledger", "checkpoint", "--state-dir", str(state), "--key", keyfile]) == 0
    assert main(["ledger", "prove", "rel-a", "--state-dir", str(state), "--key", keyfile, "--out", str(proof)]) == 0
    whole = json.loads(proof.read_text())
    assert whole["covers"] == {"release_id": "rel-a", "records": 3, "seqs": [1, 3, 5], "checkpoint_seq": 5,
                               "head_hash": whole["checkpoint"]["head_hash"]}
    capsys.readouterr()
    proof.write_text(json.dumps({**whole, "records": whole["records"][:1]}))
    assert main(["ledger", "check-proof", str(proof), "--key", keyfile]) == EXIT_REJECTED
    checked = json.loads(capsys.readouterr().out)
    assert (checked["ok"], checked["records"]) == (False, 1)
    assert checked["problems"] == ["the proof states it covers 3 records (seqs [1, 3, 5]) but holds 1 (seqs [1]): "
                                   "records [3, 5] were cut out"]
    proof.write_text(json.dumps({key: value for key, value in whole.items() if key != "covers"}))
    assert main(["ledger", "check-proof", str(proof), "--key", keyfile]) == EXIT_BAD_INPUT
    assert "does not state what it covers" in capsys.readouterr().err
