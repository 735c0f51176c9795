"""End to end on the local backend: real llama.cpp adapter processes, router, SQLite ledger."""

from __future__ import annotations

import json
import os
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import IntegrityError, LeaseHeld
from shiplift.tasks.ledger.events import STAGES
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import run_release

QUIET = lambda message: None  # noqa: E731


def production(state_dir: Path, model: str) -> dict:
    return ProcessSupervisor(state_dir).describe_endpoint(f"shiplift-{model}-prod")["components"][f"shiplift-{model}"]


def ask(url: str, component: str) -> dict:
    body = json.dumps({"decision": {"id": "q", "state": "The sky is blue.", "question": "Is the sky blue?",
                                    "options": [{"id": "no", "description": "no"},
                                                {"id": "yes", "description": "yes"}]}})
    request = urllib.request.Request(f"{url}/invocations", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "X-Amzn-SageMaker-Inference-Component": component})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["result"]


def test_release_promotes_then_gates_the_next_against_the_champion(release_config, tmp_path):
    state_dir = tmp_path / "state"
    first = run_release(release_config(), progress=QUIET)
    assert first["status"] == "promoted" and first["decision"] == "pass"
    assert set(first["stages"].values()) == {"succeeded"}
    served = production(state_dir, "tiny-decision")
    assert served["spec"]["model_ref"]["release_id"] == first["release_id"]
    assert served["spec"]["model_ref"]["artifact_sha256"] == first["artifact_sha256"]
    hosting = ProcessSupervisor(state_dir)
    assert [e["name"] for e in hosting.list_endpoints()] == ["shiplift-tiny-decision-prod"], "candidate torn down"
    answer = ask(hosting.endpoint_url("shiplift-tiny-decision-prod"), "shiplift-tiny-decision")
    assert answer["option_ids"] == ["no", "yes"] and abs(sum(answer["probabilities"]) - 1) < 1e-6

    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    records = ledger.release(first["release_id"])
    assert [(r.stage, r.event) for r in records if r.event != "started"] == [
        ("release", "opened"), *((s, "succeeded") for s in STAGES), ("release", "promoted")]
    assert records[0].payload["config"]["name"] == "tiny-decision", "the opened record carries the effective config"
    n_records = len(ledger.history())

    again = run_release(release_config(), progress=QUIET)
    assert again == first, "a rerun of a finished release changes nothing"
    assert len(ledger.history()) == n_records

    second = run_release(release_config(), overrides=("calibration.fit_temperature=true",), progress=QUIET)
    assert second["release_id"] != first["release_id"]
    assert second["temperature"] != 1.0
    report = json.loads(Path(second["report"]).with_name("gate-report.json").read_text())
    champion_checks = [c for c in report["checks"] if c["name"].startswith("champion")]
    assert champion_checks and all(c["status"] != "skipped" for c in champion_checks)
    assert (Path(second["report"]).parent / "champion-predictions.jsonl").is_file()
    assert second["status"] == "promoted"
    assert production(state_dir, "tiny-decision")["spec"]["model_ref"]["release_id"] == second["release_id"]
    answer = ask(hosting.endpoint_url("shiplift-tiny-decision-prod"), "shiplift-tiny-decision")
    assert answer["temperature"] == pytest.approx(second["temperature"])

    strict = run_release(release_config(validation__thresholds={"min_accuracy": 0.99, "max_ece": 1.0}), progress=QUIET)
    assert strict["status"] == "rejected" and strict["decision"] == "fail"
    assert strict["stages"]["promote"] == "succeeded"  # ran, and recorded a skip
    assert production(state_dir, "tiny-decision")["spec"]["model_ref"]["release_id"] == second["release_id"]
    assert ledger.verify().ok
    from shiplift.tasks.ledger.checkpoints import (
        CheckpointLog,
        SigningKey,
        default_key_path,
        log_path,
        verify_with_checkpoints,
    )

    log = CheckpointLog(log_path(state_dir))
    head = ledger.head()
    assert (head.stage, head.event, head.payload["seq"]) == ("_ledger", "checkpointed", head.seq - 1) and \
        [c.seq for _, c, _ in log.entries()][-1] == head.seq - 1, "each release ends with a signed checkpoint, recorded"
    signed = verify_with_checkpoints(ledger, log, SigningKey(default_key_path(), create=False).public)
    assert signed["ok"] and signed["checkpoints"] == 3, signed
    skipped = [r for r in ledger.release(strict["release_id"]) if r.stage == "promote" and r.event == "skipped"]
    assert len(skipped) == 1

    served_now = ledger.served_at("tiny-decision", datetime.now(UTC))
    assert served_now.release_id == second["release_id"]
    from shiplift.tasks.ledger.views import diff

    changed = diff(ledger, first["release_id"], second["release_id"])["changed"]
    assert "artifact_sha256" in changed and "config.calibration.fit_temperature" in changed
    assert "image_digest" not in changed
    export = tmp_path / "ledger.json"
    ledger.export("json", export)
    assert first["release_id"] in export.read_text()


def test_crash_in_validate_tears_down_and_resumes(release_config, tmp_path, monkeypatch):
    from shiplift.tasks.pipeline.stages import validate

    state_dir = tmp_path / "state"
    real_run = validate.run

    def crash(ctx):
        raise RuntimeError("simulated crash during validate")

    monkeypatch.setattr(validate, "run", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_release(release_config(), progress=QUIET)
    assert ProcessSupervisor(state_dir).list_endpoints() == [], "the candidate is torn down after a failure"
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    assert any(r.stage == "validate" and r.event == "failed" for r in ledger.history())

    monkeypatch.setattr(validate, "run", real_run)
    resumed = run_release(release_config(), progress=QUIET)
    assert resumed["status"] == "promoted"
    builds = [r for r in ledger.history() if r.stage == "build" and r.event == "succeeded"]
    assert len(builds) == 1, "the resumed run did not rebuild"
    deploys = [r for r in ledger.history() if r.stage == "deploy_candidate" and r.event == "succeeded"]
    assert len(deploys) == 2, "the candidate was deployed again after the teardown"
    assert ledger.verify().ok


def test_second_run_for_the_same_model_fails_fast_naming_the_holder(release_config, tmp_path):
    config = release_config()
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    with ledger.acquire_lease("tiny-decision", "someone-else@ci", "tiny-decision-other", 600):
        with pytest.raises(LeaseHeld, match="someone-else@ci"):
            run_release(config, progress=QUIET)
    assert ProcessSupervisor(state_dir).list_endpoints() == []


def test_orchestrated_run_is_stage_by_stage_and_retries_do_not_duplicate(release_config, tmp_path):
    """What Airflow and Step Functions do: begin, one call per stage (retried once), end."""
    import subprocess
    import sys

    from shiplift.tasks.pipeline.release import begin_orchestrated, end_orchestrated, run_orchestrated_stage

    state_dir = tmp_path / "state"
    begun = begin_orchestrated(release_config(), holder="airflow:refresh/run-1", progress=QUIET)
    with pytest.raises(LeaseHeld, match="airflow:refresh/run-1"):
        begin_orchestrated(release_config(), holder="airflow:refresh/run-2", progress=QUIET)
    for stage in STAGES:
        first = run_orchestrated_stage(begun["release_id"], stage, state_dir=begun["state_dir"], progress=QUIET)
        if stage != "teardown_candidate":
            assert run_orchestrated_stage(begun["release_id"], stage, state_dir=begun["state_dir"],
                                          progress=QUIET) == first
    cli = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "stage", "build", "--release",
                          begun["release_id"],
                          "--state-dir", begun["state_dir"], "--json"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and json.loads(cli.stdout)["gguf_sha256"]
    summary = end_orchestrated(begun["release_id"], holder="airflow:refresh/run-1", failed=False,
                               state_dir=begun["state_dir"], progress=QUIET)
    assert summary["status"] == "promoted"
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    succeeded = [r.stage for r in ledger.release(begun["release_id"]) if r.event == "succeeded"]
    assert succeeded.count("build") == 1 and succeeded.count("deploy_candidate") == 1
    begin_orchestrated(release_config(), holder="airflow:refresh/run-2", progress=QUIET)  # the lease was given back


def processes_using(state_dir: str) -> list[int]:
    """Live (non-zombie) processes whose command line or environment names the state folder."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue
            text = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if state_dir.encode() in text and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def test_a_stage_killed_midway_and_retried_does_not_duplicate(release_config, tmp_path):
    """SIGKILL `shiplift stage deploy_candidate` while it starts the candidate, then retry it, as Airflow would."""
    import signal
    import subprocess
    import sys
    import time

    from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage

    begun = begin_orchestrated(release_config(), holder="test", progress=QUIET)
    state_dir, release_id = begun["state_dir"], begun["release_id"]
    for stage in ("resolve", "build", "package", "image"):
        run_orchestrated_stage(release_id, stage, state_dir=state_dir, progress=QUIET)
    command = [sys.executable, "-m", "shiplift.tasks.cli.main", "stage", "deploy_candidate", "--release", release_id,
               "--state-dir", state_dir]
    victim = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoints = Path(state_dir) / "endpoints"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(endpoints.glob("*-cand-*.json")):
        time.sleep(0.05)
    assert victim.poll() is None, "the stage finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)

    retried = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert retried.returncode == 0, retried.stderr
    hosting = ProcessSupervisor(state_dir)
    candidates = [e for e in hosting.list_endpoints() if "-cand-" in e["name"]]
    assert len(candidates) == 1
    described = hosting.describe_endpoint(candidates[0]["name"])
    copies = described["components"][candidates[0]["name"]]["copies"]
    assert len(copies) == 1 and all(c["alive"] and c["ping"] == 200 for c in copies)
    assert len(processes_using(state_dir)) == 2, "only the router and one copy run: nothing orphaned by the kill"
    ledger = Ledger.for_sqlite(Path(state_dir) / "ledger.db")
    events = [r.event for r in ledger.release(release_id) if r.stage == "deploy_candidate"]
    assert events == ["started", "started", "succeeded"]
    assert ledger.verify().ok


def test_a_release_killed_during_validate_is_resumed_by_its_rerun_at_once(release_config, tmp_path):
    """Issue 18, item 6: SIGKILL `shiplift release CONFIG` while validate runs, then run the same command again. The
    dead run's lease (4 h TTL) is taken over at once because its process on this host is gone, the takeover is a ledger
    record, and the release continues on the candidate the dead run left (deploy_candidate is not run again)."""
    import signal
    import subprocess
    import sys
    import time

    config = release_config()
    command = [sys.executable, "-m", "shiplift.tasks.cli.main", "release", str(config)]
    victim = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path, deadline, started = tmp_path / "state" / "ledger.db", time.monotonic() + 240, []
    while time.monotonic() < deadline and victim.poll() is None and not started:
        if path.exists():  # the release creates it; a read-only reader never does
            with Ledger(f"sqlite:///{path}", read_only=True) as reader:
                started = [r for r in reader.history() if r.stage == "validate" and r.event == "started"]
        time.sleep(0.1)
    assert started, "the release did not reach validate, or finished before it could be killed"
    assert victim.poll() is None, "the release did not reach validate, or finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    release_id = started[0].release_id

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    ledger = Ledger.for_sqlite(path)
    assert "took the promotion lease over from '" in rerun.stderr and f"pid-{victim.pid}'" in rerun.stderr
    records = ledger.release(release_id)
    [takeover] = [r for r in records if r.event == "lease_taken_over"]
    assert takeover.payload["from_holder"].endswith(f"/pid-{victim.pid}") and "is gone" in takeover.payload["reason"]
    assert [r.event for r in records if r.stage == "deploy_candidate"] == ["started",
                                                                           "succeeded"], "the candidate was reused"
    assert records[-1].event == "promoted" and ledger.verify().ok


def test_encoder_release_exports_checks_parity_and_serves_nli(tmp_path):
    """An ONNX encoder goes through the same stages: export + int8 + parity, encoder server, NLI gate."""
    import yaml

    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_checkpoint
    from shiplift.tasks.hashing import sha256_tree

    checkpoint = write_tiny_checkpoint(tmp_path / "checkpoint", seed=0)
    tree = yaml.safe_load((Path(__file__).resolve().parents[2] / "configs/releases/minilm-nli.yaml").read_text())
    tree["name"] = "tiny-nli"
    tree["artifact"]["source"] = {"kind": "path", "path": str(checkpoint), "sha256": sha256_tree(checkpoint)}
    tree["backend"] = {"kind": "local", "state_dir": str(tmp_path / "state")}
    tree["validation"]["thresholds"] = {"min_accuracy": 0.0, "min_macro_f1": 0.0, "min_class_recall": 0.0,
                                        "max_ece": 1.0}
    tree["validation"]["n_bootstrap"] = 200
    config = tmp_path / "tiny-nli.yaml"
    config.write_text(yaml.safe_dump(tree))

    summary = run_release(config, progress=QUIET)
    assert summary["status"] == "promoted", summary
    from shiplift.tasks.ledger.release_state import ReleaseState

    state = ReleaseState.load(Ledger.for_sqlite(tmp_path / "state" / "ledger.db"), summary["release_id"])
    parity = state.result("build").model_extra["parity"]
    assert parity["passed"] and set(parity["variants"]) == {"fp32", "int8"}
    report = json.loads(Path(summary["report"]).with_name("gate-report.json").read_text())
    assert {"macro_f1", "recall_entailment", "recall_neutral", "recall_contradiction"} <= {c["name"]
                                                                                           for c in report["checks"]}
    budget = state.result("build").info["int8_budget"]  # the served int8 graph's budget, judged by the build
    carried = next(c for c in report["checks"] if c["name"] == "int8_accuracy_drop_vs_fp32")
    assert (carried["status"], carried["observed"], carried["threshold"]) == (budget["status"], budget["observed"],
                                                                              0.01)
    assert "parity probes: builtin:nli calibration" in carried["reason"]
    hosting = ProcessSupervisor(tmp_path / "state")
    body = json.dumps({"pairs": [{"premise": "The order shipped on May 3.",
                                  "hypothesis": "The order shipped."}]}).encode()
    request = urllib.request.Request(f"{hosting.endpoint_url('shiplift-tiny-nli-prod')}/invocations", data=body,
                                     method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        result = json.loads(response.read())
    assert result["model"]["variant"] == "int8"
    assert result["results"][0]["label"] in ("entailment", "neutral", "contradiction")
    assert abs(sum(result["results"][0]["probabilities"].values()) - 1) < 1e-6

    drifted = dict(tree, name="tiny-nli-bad")
    drifted["artifact"] = dict(tree["artifact"], source={"kind": "path", "path": str(checkpoint), "sha256": "0" * 64})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(drifted))
    with pytest.raises(IntegrityError, match="content digest"):
        run_release(bad, progress=QUIET)
