"""The ledger's trust story against someone who can write the state dir (issue 18, items 1-5): an anchored head adds
to the signed-checkpoint check, a checkpointed ledger records its checkpoints in its own chain (so a deleted, emptied
or cut-back log is named), a proof proves its records' full content and nothing else, checking needs the public key
alone, and every malformed input is refused with exit 2 and a fix, never a traceback."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from shiplift.tasks.cli.main import main
from shiplift.tasks.console import EXIT_BAD_INPUT, EXIT_REJECTED
from shiplift.tasks.ledger.events import CHECKPOINTED, LEDGER
from shiplift.tasks.ledger.store import Ledger
from tests.unit.test_ledger import _append


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A state dir holding a six-record SQLite ledger of two releases (rel-a: seqs 1, 3, 5; rel-b: 2, 4, 6)."""
    folder = tmp_path / "state"
    with Ledger.for_sqlite(folder / "ledger.db") as ledger:
        for i in range(6):
            _append(ledger, release_id="rel-a" if i % 2 == 0 else "rel-b", n=i)
    return folder


@pytest.fixture
def key(tmp_path: Path) -> str:
    return str(tmp_path / "keys" / "ledger.pem")


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def checkpointed(capsys, state: Path, key: str) -> dict:
    code, out, err = cli(capsys, "ledger", "checkpoint", "--state-dir", str(state), "--key", key, "--json")
    assert code == 0, err
    return json.loads(out)


def raw(state: Path, sql: str, *params) -> None:
    """What someone with write access to the database does, bypassing the ledger."""
    with sqlite3.connect(state / "ledger.db") as conn:
        conn.execute(sql, params)


def hash_at(state: Path, seq: int) -> str:
    with sqlite3.connect(state / "ledger.db") as conn:
        return conn.execute("SELECT record_hash FROM ledger_records WHERE seq = ?", (seq,)).fetchone()[0]


def verify(capsys, state: Path, key: str, *extra: str) -> tuple[int, dict, str]:
    code, out, err = cli(capsys, "ledger", "verify", "--state-dir", str(state), "--key", key, "--json", *extra)
    return code, json.loads(out) if out else {}, err


# 1 ------------------------------------------------------------------------------------------------------------------

def test_an_anchored_head_adds_to_the_checkpoint_check_and_never_replaces_it(capsys, state, key):
    checkpointed(capsys, state, key)
    anchor = hash_at(state, 3)
    code, verdict, _ = verify(capsys, state, key, "--expect-head", anchor)
    assert code == 0 and verdict["checked_against"]["seq"] == 6, "both checks ran"
    raw(state, "DELETE FROM ledger_records WHERE seq >= 4")
    code, verdict, _ = verify(capsys, state, key, "--expect-head", anchor)
    assert code == EXIT_REJECTED and any("covers seq 6, but the ledger ends at seq 3" in p for p in verdict["problems"])
    code, verdict, _ = verify(capsys, state, key, "--expect-head", "a" * 64)
    assert code == EXIT_REJECTED and any("anchored head" in p for p in verdict["problems"]), "the anchor still counts"


# 2 ------------------------------------------------------------------------------------------------------------------

def test_each_checkpoint_is_recorded_in_the_chain_once(capsys, state, key):
    signed = checkpointed(capsys, state, key)
    assert checkpointed(capsys, state, key) == signed, "nothing new: no second checkpoint and no second record"
    with Ledger(f"sqlite:///{state / 'ledger.db'}", read_only=True) as ledger:
        records = ledger.history()
    assert len(records) == 7 and (records[-1].stage, records[-1].event) == (LEDGER, CHECKPOINTED)
    assert records[-1].payload == {k: signed[k] for k in ("seq", "key_id", "head_hash", "signed_at")}
    code, verdict, _ = verify(capsys, state, key)
    assert code == 0 and verdict["recorded_checkpoints"] == 1


@pytest.mark.parametrize("damage", ["deleted", "emptied", "cut back"])
def test_a_missing_emptied_or_cut_back_log_is_a_verification_failure_naming_what_is_missing(capsys, state, key, damage):
    first = checkpointed(capsys, state, key)
    with Ledger.for_sqlite(state / "ledger.db") as ledger:
        _append(ledger, release_id="rel-c", n=7)
    second = checkpointed(capsys, state, key)
    log = state / "ledger-checkpoints.jsonl"
    if damage == "deleted":
        log.unlink()
    else:
        log.write_text("" if damage == "emptied" else log.read_text().splitlines(keepends=True)[0])
    code, verdict, _ = verify(capsys, state, key)
    missing = [second] if damage == "cut back" else [first, second]
    assert code == EXIT_REJECTED and len(verdict["problems"]) == len(missing), verdict
    for problem, lost in zip(verdict["problems"], missing, strict=True):
        assert f"the checkpoint of seq {lost['seq']} signed {lost['signed_at']} by key {lost['key_id']}" in problem
        assert "the checkpoint log was deleted, emptied or cut back" in problem


def test_verify_by_url_finds_the_log_beside_a_sqlite_ledger_or_refuses_with_the_fix(capsys, state, key, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("SHIPLIFT_HOME", str(tmp_path / "elsewhere"))
    checkpointed(capsys, state, key)
    copied = tmp_path / "copied.db"  # the same ledger, away from its state dir
    with sqlite3.connect(state / "ledger.db") as source, sqlite3.connect(copied) as target:
        source.backup(target)
    code, _, err = cli(capsys, "ledger", "verify", "--ledger-url", f"sqlite:///{copied}", "--key", key)
    assert code == EXIT_BAD_INPUT and "records 1 checkpoint" in err and "fix: pass --state-dir" in err
    code, _, _ = cli(capsys, "ledger", "verify", "--ledger-url", f"sqlite:///{copied}", "--key", key, "--state-dir",
                     str(state))
    assert code == 0
    raw(state, "DELETE FROM ledger_records WHERE seq >= 4")
    code, out, _ = cli(capsys, "ledger", "verify", "--ledger-url", f"sqlite:///{state / 'ledger.db'}", "--key", key)
    assert code == EXIT_REJECTED and "covers seq 6, but the ledger ends at seq 3" in out


# 3 ------------------------------------------------------------------------------------------------------------------

@pytest.fixture
def proof(capsys, state, key, tmp_path) -> Path:
    checkpointed(capsys, state, key)
    path = tmp_path / "proof.json"
    code, _, err = cli(capsys, "ledger", "prove", "rel-a", "--state-dir", str(state), "--key", key, "--out", str(path))
    assert code == 0, err
    return path


def check(capsys, path: Path, key: str, value=None) -> tuple[int, str, str]:
    if value is not None:
        path.write_text(value if isinstance(value, str) else json.dumps(value))
    return cli(capsys, "ledger", "check-proof", str(path), "--key", key)


def test_a_proof_proves_its_records_full_content(capsys, proof, key):
    good = json.loads(proof.read_text())
    code, out, _ = check(capsys, proof, key)
    assert code == 0 and json.loads(out) == {"ok": True, "release_id": "rel-a", "records": 3, "covers": good["covers"],
                                             "problems": []}
    for release_id in ("rel-b", "rel-invented"):
        code, out, _ = check(capsys, proof, key, {**good, "release_id": release_id})
        problems = json.loads(out)["problems"]
        assert code == EXIT_REJECTED and len(problems) == 4 and f"not of release {release_id}" in problems[0]
        assert problems[3].startswith("the proof states it covers release rel-a in the checkpoint of seq 6") and \
            f"but holds release {release_id}" in problems[3]
    edited = json.loads(json.dumps(good))
    edited["records"][0].update(stage="promote", event="succeeded")
    code, out, _ = check(capsys, proof, key, edited)
    assert code == EXIT_REJECTED and json.loads(out)["problems"] == [
        "record 1's content does not hash to its record_hash: the record was edited"]


@pytest.mark.parametrize("edit, words", [
    (lambda p: {**p, "records": []}, "proves no record"),
    (lambda p: {k: v for k, v in p.items() if k != "records"}, "has no records"),
    (lambda p: {**p, "records": p["records"][:1] * 50}, "record 1 appears more than once"),
    (lambda p: {**p, "records": [{**p["records"][0], "seq": True}]}, "seq must be a whole number"),
    (lambda p: {**p, "records": None}, "records must be a list"),
    (lambda p: {**p, "records": [1]}, "record 1 of the proof is not an object"),
    (lambda p: {**p, "records": "abc"}, "records must be a list"),
    (lambda p: [p], "is not a JSON object"),
    (lambda p: "a proof", "is not a JSON object"),
    (lambda p: None, "is not a JSON object"),
], ids=["empty", "no-records", "duplicated", "seq-true", "records-null", "records-[1]", "records-abc", "list",
        "string", "null"])
def test_empty_duplicate_and_ill_typed_proofs_are_refused(capsys, proof, key, edit, words):
    code, out, err = check(capsys, proof, key, json.dumps(edit(json.loads(proof.read_text()))))
    assert code == EXIT_BAD_INPUT and out == "" and words in err and "fix:" in err


# 4 ------------------------------------------------------------------------------------------------------------------

def test_verify_and_check_proof_need_only_the_exported_public_key(capsys, state, key, proof, tmp_path):
    public = tmp_path / "ledger.pub"
    code, _, err = cli(capsys, "ledger", "public-key", "--key", key, "--out", str(public))
    assert code == 0 and public.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert "PRIVATE" not in public.read_text()
    code, out, _ = cli(capsys, "ledger", "public-key", "--key", key)
    assert code == 0 and out == public.read_text()
    os.remove(key)  # from here on, nobody holds the private key
    code, out, _ = cli(capsys, "ledger", "check-proof", str(proof), "--public-key", str(public))
    assert code == 0 and json.loads(out)["ok"]
    code, out, _ = cli(capsys, "ledger", "verify", "--state-dir", str(state), "--public-key", str(public), "--json")
    assert code == 0 and json.loads(out)["checked_against"]["seq"] == 6
    code, _, err = cli(capsys, "ledger", "verify", "--state-dir", str(state), "--public-key",
                       str(tmp_path / "none.pub"))
    assert code == EXIT_BAD_INPUT and "no public key file" in err


# 5 ------------------------------------------------------------------------------------------------------------------

def test_a_proof_file_that_is_nested_too_deep_or_a_directory_and_prove_out_a_directory_are_refused(
        capsys, state, key, proof, tmp_path):
    code, _, err = check(capsys, proof, key, "[" * 100_000 + "]" * 100_000)
    assert code == EXIT_BAD_INPUT and "nested too deep" in err and "fix:" in err
    code, _, err = check(capsys, tmp_path, key)
    assert code == EXIT_BAD_INPUT and "is a directory" in err and "fix:" in err
    code, _, err = cli(capsys, "ledger", "prove", "rel-a", "--state-dir", str(state), "--key", key, "--out",
                       str(tmp_path))
    assert code == EXIT_BAD_INPUT and "is a directory" in err and "fix:" in err


@pytest.mark.parametrize("damage, words", [
    (lambda log: log.write_text(log.read_text() + "[" * 100_000 + "]" * 100_000 + "\n"), "nested too deep"),
    (lambda log: log.write_bytes(log.read_bytes() + b"\xff\n"), "is not UTF-8"),
    (lambda log: (log.unlink(), log.mkdir()), "is a directory"),
], ids=["deep-line", "non-utf8", "directory"])
def test_a_checkpoint_log_that_cannot_be_read_is_refused_with_the_fix(capsys, state, key, damage, words):
    checkpointed(capsys, state, key)
    damage(state / "ledger-checkpoints.jsonl")
    code, out, err = verify(capsys, state, key)
    assert code == EXIT_BAD_INPUT and words in err and "fix:" in err


# Optional: witnesses ------------------------------------------------------------------------------------------------

def test_a_witness_copy_of_the_signed_heads_names_a_ledger_and_log_cut_back_together(capsys, state, key, tmp_path,
                                                                                     monkeypatch):
    witness = tmp_path / "witness"  # another disk, mount or host: not writable by whoever holds the state dir
    monkeypatch.setenv("SHIPLIFT_CHECKPOINT_WITNESS", str(witness))
    first = checkpointed(capsys, state, key)
    with Ledger.for_sqlite(state / "ledger.db") as ledger:
        _append(ledger, release_id="rel-c", n=7)
    second = checkpointed(capsys, state, key)
    assert (witness / "ledger-checkpoints.jsonl").read_text() == (state / "ledger-checkpoints.jsonl").read_text()
    log = state / "ledger-checkpoints.jsonl"
    log.write_text(log.read_text().splitlines(keepends=True)[0])  # both cut back to the first checkpoint:
    raw(state, f"DELETE FROM ledger_records WHERE seq > {first['seq'] + 1}")  # consistent with each other
    monkeypatch.delenv("SHIPLIFT_CHECKPOINT_WITNESS")
    assert verify(capsys, state, key)[0] == 0, "without a witness, a ledger and log rewound together look whole"
    code, verdict, _ = verify(capsys, state, key, "--witness", str(witness))
    assert code == EXIT_REJECTED and verdict["problems"] == [
        f"witness line 2 holds the checkpoint of seq {second['seq']} signed {second['signed_at']}, which the "
        "checkpoint log lacks: the log was cut back or replaced",
        f"the checkpoint of {second['signed_at']} covers seq {second['seq']}, but the ledger ends at seq "
        f"{first['seq'] + 1}: its newest records were deleted (or the database was replaced)"]
    code, _, err = cli(capsys, "ledger", "verify", "--state-dir", str(state), "--key", key, "--witness", str(tmp_path))
    assert code == EXIT_BAD_INPUT and "no witness log at" in err
    (witness / "ledger-checkpoints.jsonl").write_text(json.dumps({**second, "seq": 2}) + "\n")
    code, verdict, _ = verify(capsys, state, key, "--witness", str(witness))
    assert code == EXIT_REJECTED and verdict["problems"] == [
        f"checkpoint witness line 1 (seq 2) has a signature that does not verify with key {second['key_id']}: it was "
        "forged or edited"]


def test_a_local_config_names_its_witness_and_a_witness_inside_the_state_dir_is_refused(tmp_path, monkeypatch):
    """`backend.checkpoint_witness` is what signing writes to and what `verify --config` checks against, with no
    environment variable; a folder inside the state dir would be cut back with the log, so the config is refused."""
    from shiplift.tasks.backends.registry import checkpoint_witness, sign_checkpoint
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.errors import ConfigError
    from shiplift.tasks.pipeline.audit import verify_ledger

    monkeypatch.delenv("SHIPLIFT_CHECKPOINT_WITNESS", raising=False)
    monkeypatch.setenv("SHIPLIFT_CHECKPOINT_KEY", str(tmp_path / "keys" / "ledger.pem"))
    base = Path(__file__).resolve().parents[2] / "configs" / "releases" / "gemma-decision.yaml"
    state, witness = tmp_path / "state", tmp_path / "other-disk" / "witness"
    config = load_release_config(base,
                                 overrides=(f"backend.state_dir={state}", f"backend.checkpoint_witness={witness}"))
    assert checkpoint_witness(config).path == witness / "ledger-checkpoints.jsonl"
    with Ledger.for_sqlite(state / "ledger.db") as ledger:
        _append(ledger, release_id="rel-a", n=3)
        first = sign_checkpoint(ledger, config)
        _append(ledger, release_id="rel-b", n=3)
        second = sign_checkpoint(ledger, config)
    assert [json.loads(line)["seq"] for line in (witness / "ledger-checkpoints.jsonl").read_text().splitlines()] == [
        first.seq, second.seq]
    log = state / "ledger-checkpoints.jsonl"
    log.write_text(log.read_text().splitlines(keepends=True)[0])  # ledger and log cut back together
    raw(state, f"DELETE FROM ledger_records WHERE seq > {first.seq + 1}")
    with Ledger(f"sqlite:///{state / 'ledger.db'}", read_only=True) as ledger:
        assert verify_ledger(ledger, state)["ok"], "without the witness they look whole"
        verdict = verify_ledger(ledger, state, config=config)
    assert not verdict["ok"] and any("which the checkpoint log lacks" in p for p in verdict["problems"])
    with pytest.raises(ConfigError, match="is inside backend.state_dir"):
        load_release_config(base, overrides=(f"backend.state_dir={state}", f"backend.checkpoint_witness={state / 'w'}"))


def test_the_ledgers_own_records_can_never_be_mistaken_for_a_models():
    """Views leave records of model LEDGER out of the releases: no release config may be named so."""
    import re

    from shiplift.tasks.config_types import NAME_PATTERN

    assert re.fullmatch(NAME_PATTERN, LEDGER) is None
