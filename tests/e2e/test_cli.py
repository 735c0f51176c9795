"""The `shiplift` command line as a user runs it: real processes, real files, exit codes."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import pytest

from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.ledger.store import Ledger

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "validation" / "data" / "decisions.jsonl"


@pytest.fixture
def served_tiny_model(tmp_path, serve_semif):
    return serve_semif(write_tiny_gguf(tmp_path / "tiny.gguf", seed=5), ready_timeout_s=60)


def test_eval_jevbench_writes_recomputable_evidence(served_tiny_model, tmp_path, cli):
    out = tmp_path / "eval"
    result = cli("eval", "jevbench", "--endpoint", served_tiny_model, "--data", str(DECISIONS), "--split", "test",
                      "--out", str(out), "--min-accuracy", "0.99", "--bootstrap", "200", "--json")
    assert result.returncode == 3, result.stderr  # a random tiny model cannot reach 0.99
    summary = json.loads(result.stdout)
    assert summary["decision"] == "fail" and summary["n"] == 111
    report = json.loads((out / "gate-report.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 111 and all(r["error"] is None for r in rows)
    recomputed = sum(r["option_ids"][max(range(len(r["probabilities"])),
                                         key=r["probabilities"].__getitem__)] == r["expected"]
                                         for r in rows) / len(rows)
    assert report["metrics"]["accuracy"]["value"] == pytest.approx(recomputed)
    assert "<svg" in (out / "report.html").read_text()


def test_eval_refuses_a_dataset_that_fails_its_expectations(served_tiny_model, tmp_path, cli):
    bad = tmp_path / "bad.jsonl"
    row = json.loads(DECISIONS.read_text().splitlines()[0])
    bad.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")  # duplicate ids
    result = cli("eval", "jevbench", "--endpoint", served_tiny_model, "--data", str(bad), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "unique" in result.stderr
    assert not (tmp_path / "o").exists()


def test_config_validate_reports_file_and_field(tmp_path, cli):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "configs/releases/gemma-decision.yaml").read_text().replace("threads: 2", "threads: lots"))
    result = cli("config", "validate", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "image.threads" in result.stderr
    good = cli("config", "validate", "configs/releases/qwen35-4b-semif.yaml", "--json")
    assert good.returncode == 0 and json.loads(good.stdout)["release_id"].startswith("qwen35-4b-semif-")


def test_ledger_verify_detects_an_edited_and_a_deleted_record(tmp_path, cli):
    db = tmp_path / "ledger.db"
    ledger = Ledger.for_sqlite(db)
    for stage in ("resolve", "build", "package"):
        ledger.append(release_id="r1", model="m", stage=stage, event="succeeded", payload={"n": 1}, actor="test")
    ledger.close()
    url = f"sqlite:///{db}"
    ok = cli("ledger", "verify", "--ledger-url", url, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    history = cli("ledger", "history", "--records", "--ledger-url", url)
    assert history.returncode == 0 and [line.split()[0] for line in history.stdout.splitlines()[2:]] == ["1", "2", "3"]
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE ledger_records SET payload = ? WHERE seq = 2", ('{"n":2}',))
    edited = cli("ledger", "verify", "--ledger-url", url, "--json")
    assert edited.returncode == 3 and "2" in json.dumps(json.loads(edited.stdout)["problems"])
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE ledger_records SET payload = ? WHERE seq = 2", ('{"n":1}',))
        raw.execute("DELETE FROM ledger_records WHERE seq = 2")
    deleted = cli("ledger", "verify", "--ledger-url", url, "--json")
    assert deleted.returncode == 3 and json.loads(deleted.stdout)["ok"] is False


def test_ledger_commands_without_a_ledger_say_how_to_get_one(tmp_path, cli):
    result = cli("ledger", "history", "--state-dir", str(tmp_path))
    assert result.returncode == 2 and "run a release first" in result.stderr


def test_endpoints_list_and_stop(tmp_path, cli):
    from shiplift.tasks.backends.local.endpoint_state import ProcessSpec
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

    hosting = ProcessSupervisor(tmp_path)
    hosting.ensure_endpoint("cli-test")
    spec = ProcessSpec(command=[sys.executable, str(ROOT / "tests/fakes/fake_model_server.py")], copies=1,
                         port_env="FAKE_PORT", model_ref={"release_id": "x"})
    hosting.put_component("cli-test", "model", spec)
    listed = cli("endpoints", "list", "--json", "--state-dir", str(tmp_path))
    assert listed.returncode == 0 and [e["name"] for e in json.loads(listed.stdout)] == ["cli-test"]
    neither = cli("endpoints", "stop", "--state-dir", str(tmp_path))
    assert neither.returncode == 2
    stopped = cli("endpoints", "stop", "--all", "--state-dir", str(tmp_path))
    assert stopped.returncode == 0 and "stopped cli-test" in stopped.stdout
    assert ProcessSupervisor(tmp_path).list_endpoints() == []


# ~18 s: make test-slow; make test serves and gates the encoder through a release (tests/e2e/test_release_local.py)
@pytest.mark.slow
def test_serve_encoder_and_eval_nli(tmp_path, serve, cli):
    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_onnx_model_dir

    model_dir = write_tiny_onnx_model_dir(tmp_path / "model", seed=0)
    url = serve("encoder", "--model-dir", str(model_dir), "--threads", "1", "--variant", "int8", ready_timeout_s=60)
    out = tmp_path / "nli"
    result = cli("eval", "nli", "--endpoint", url, "--data", str(ROOT / "validation/data/nli.jsonl"), "--split", "test",
                 "--out", str(out), "--min-macro-f1", "0.99", "--bootstrap", "200", "--json")
    assert result.returncode == 3, result.stderr  # a random tiny encoder cannot reach macro-F1 0.99
    summary = json.loads(result.stdout)
    assert summary["n"] == 90 and summary["n_truncated"] == 0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 90 and all(r["option_ids"] == ["entailment", "neutral", "contradiction"] for r in rows)
    assert json.loads((out / "gate-report.json").read_text())["decision"] == "fail"
    missing = cli("serve", "encoder", "--model-dir", str(tmp_path / "absent"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
