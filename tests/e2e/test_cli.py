"""The `shiplift` command line as a user runs it: real processes, real files, exit codes."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tasks.ledger import Ledger
from tasks.tinymodel import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
DECISIONS = ROOT / "validation" / "data" / "decisions.jsonl"


def shiplift(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tasks.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_ready(process: subprocess.Popen, port: int, timeout_s: float = 120) -> str:
    """Poll /ping until the adapter answers 200; fail with its log if it exits or times out."""
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                if response.status == 200:
                    return url
        except OSError:
            time.sleep(0.2)
    process.kill()
    pytest.fail(f"shiplift serve semif did not become ready: {process.stderr.read().decode()[-2000:]}")


@pytest.fixture
def served_tiny_model(tmp_path):
    """`shiplift serve semif` on a tiny GGUF, as a user would start it."""
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", seed=5)
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tasks.cli", "serve", "semif", "--gguf", str(gguf), "--port", str(port), "--threads", "1",
                                "--max-tokens", "2048", "--max-request-tokens", "1536"],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    yield wait_ready(process, port, 60)
    process.terminate()
    process.wait(timeout=30)


def test_eval_jevbench_writes_recomputable_evidence(served_tiny_model, tmp_path):
    out = tmp_path / "eval"
    result = shiplift("eval", "jevbench", "--endpoint", served_tiny_model, "--data", str(DECISIONS), "--split", "test",
                      "--out", str(out), "--min-accuracy", "0.99", "--bootstrap", "200")
    assert result.returncode == 3, result.stderr  # a random tiny model cannot reach 0.99
    summary = json.loads(result.stdout)
    assert summary["decision"] == "fail" and summary["n"] == 111
    report = json.loads((out / "gate-report.json").read_text())
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 111 and all(r["error"] is None for r in rows)
    recomputed = sum(r["option_ids"][max(range(len(r["probabilities"])), key=r["probabilities"].__getitem__)] == r["expected"] for r in rows) / len(rows)
    assert report["metrics"]["accuracy"]["value"] == pytest.approx(recomputed)
    assert "<svg" in (out / "report.html").read_text()


def test_eval_refuses_a_dataset_that_fails_its_expectations(served_tiny_model, tmp_path):
    bad = tmp_path / "bad.jsonl"
    row = json.loads(DECISIONS.read_text().splitlines()[0])
    bad.write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")  # duplicate ids
    result = shiplift("eval", "jevbench", "--endpoint", served_tiny_model, "--data", str(bad), "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "unique" in result.stderr
    assert not (tmp_path / "o").exists()


def test_config_validate_reports_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / "configs/releases/gemma-decision.yaml").read_text().replace("threads: 2", "threads: lots"))
    result = shiplift("config", "validate", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "image.threads" in result.stderr
    good = shiplift("config", "validate", "configs/releases/qwen35-4b-semif.yaml")
    assert good.returncode == 0 and json.loads(good.stdout)["release_id"].startswith("qwen35-4b-semif-")


def test_ledger_verify_detects_an_edited_and_a_deleted_record(tmp_path):
    db = tmp_path / "ledger.db"
    ledger = Ledger.for_sqlite(db)
    for stage in ("resolve", "build", "package"):
        ledger.append(release_id="r1", model="m", stage=stage, event="succeeded", payload={"n": 1}, actor="test")
    ledger.close()
    url = f"sqlite:///{db}"
    ok = shiplift("ledger", "verify", "--url", url)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"] is True
    history = shiplift("ledger", "history", "--url", url)
    assert history.returncode == 0 and len(history.stdout.splitlines()) == 3
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE ledger_records SET payload = ? WHERE seq = 2", ('{"n":2}',))
    edited = shiplift("ledger", "verify", "--url", url)
    assert edited.returncode == 3 and "2" in json.dumps(json.loads(edited.stdout)["problems"])
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE ledger_records SET payload = ? WHERE seq = 2", ('{"n":1}',))
        raw.execute("DELETE FROM ledger_records WHERE seq = 2")
    deleted = shiplift("ledger", "verify", "--url", url)
    assert deleted.returncode == 3 and json.loads(deleted.stdout)["ok"] is False


def test_ledger_commands_without_a_ledger_say_how_to_get_one(tmp_path):
    result = shiplift("ledger", "history", "--state-dir", str(tmp_path))
    assert result.returncode == 2 and "run a release first" in result.stderr


def test_endpoints_list_and_stop(tmp_path):
    from tasks.hosting.local import ComponentSpec, LocalHosting

    hosting = LocalHosting(tmp_path)
    hosting.ensure_endpoint("cli-test")
    spec = ComponentSpec(command=[sys.executable, str(ROOT / "tests/fakes/fake_model_server.py")], copies=1,
                         port_env="FAKE_PORT", model_ref={"release_id": "x"})
    hosting.put_component("cli-test", "model", spec)
    listed = shiplift("endpoints", "list", "--state-dir", str(tmp_path))
    assert listed.returncode == 0 and [e["name"] for e in json.loads(listed.stdout)] == ["cli-test"]
    neither = shiplift("endpoints", "stop", "--state-dir", str(tmp_path))
    assert neither.returncode == 2
    stopped = shiplift("endpoints", "stop", "--all", "--state-dir", str(tmp_path))
    assert stopped.returncode == 0 and "stopped cli-test" in stopped.stdout
    assert LocalHosting(tmp_path).list_endpoints() == []
