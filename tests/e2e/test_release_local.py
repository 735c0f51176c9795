"""End to end on the local backend: real llama.cpp adapter processes, router, SQLite ledger."""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tasks.errors import LeaseHeld
from tasks.hosting.local import LocalHosting
from tasks.ledger import Ledger
from tasks.release import STAGES, run_release

QUIET = lambda message: None  # noqa: E731


def production(state_dir: Path, model: str) -> dict:
    return LocalHosting(state_dir).describe_endpoint(f"shiplift-{model}-prod")["components"][model]


def ask(url: str, component: str) -> dict:
    body = json.dumps({"decision": {"id": "q", "state": "The sky is blue.", "question": "Is the sky blue?",
                                    "options": [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]}})
    request = urllib.request.Request(f"{url}/invocations", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": component})
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
    hosting = LocalHosting(state_dir)
    assert [e["name"] for e in hosting.list_endpoints()] == ["shiplift-tiny-decision-prod"], "candidate torn down"
    answer = ask(hosting.endpoint_url("shiplift-tiny-decision-prod"), "tiny-decision")
    assert answer["option_ids"] == ["no", "yes"] and abs(sum(answer["probabilities"]) - 1) < 1e-6

    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    records = ledger.release(first["release_id"])
    assert [(r.stage, r.event) for r in records if r.event != "started"] == [(s, "succeeded") for s in STAGES]
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
    answer = ask(hosting.endpoint_url("shiplift-tiny-decision-prod"), "tiny-decision")
    assert answer["temperature"] == pytest.approx(second["temperature"])

    strict = run_release(release_config(validation__thresholds={"min_accuracy": 0.99, "max_ece": 1.0}), progress=QUIET)
    assert strict["status"] == "rejected" and strict["decision"] == "fail"
    assert strict["stages"]["promote"] == "succeeded"  # ran, and recorded a skip
    assert production(state_dir, "tiny-decision")["spec"]["model_ref"]["release_id"] == second["release_id"]
    assert ledger.verify().ok
    skipped = [r for r in ledger.release(strict["release_id"]) if r.stage == "promote" and r.event == "skipped"]
    assert len(skipped) == 1

    served_now = ledger.served_at("tiny-decision", datetime.now(timezone.utc))
    assert served_now.release_id == second["release_id"]
    diff = ledger.diff(first["release_id"], second["release_id"])
    assert "artifact_sha256" in diff["changed"] and "image_digest" not in diff["changed"]
    export = tmp_path / "ledger.html"
    ledger.export("html", export)
    assert first["release_id"] in export.read_text()


def test_crash_in_validate_tears_down_and_resumes(release_config, tmp_path, monkeypatch):
    from tasks.stages import validate

    state_dir = tmp_path / "state"
    real_run = validate.run

    def crash(ctx):
        raise RuntimeError("simulated crash during validate")

    monkeypatch.setattr(validate, "run", crash)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_release(release_config(), progress=QUIET)
    assert LocalHosting(state_dir).list_endpoints() == [], "the candidate is torn down after a failure"
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
    assert LocalHosting(state_dir).list_endpoints() == []


def test_orchestrated_run_is_stage_by_stage_and_retries_do_not_duplicate(release_config, tmp_path):
    """What Airflow and Step Functions do: begin, one call per stage (retried once), end."""
    import subprocess
    import sys

    from tasks.release import begin_orchestrated, end_orchestrated, run_orchestrated_stage

    state_dir = tmp_path / "state"
    begun = begin_orchestrated(release_config(), holder="airflow:refresh/run-1", progress=QUIET)
    with pytest.raises(LeaseHeld, match="airflow:refresh/run-1"):
        begin_orchestrated(release_config(), holder="airflow:refresh/run-2", progress=QUIET)
    for stage in STAGES:
        first = run_orchestrated_stage(begun["state_dir"], begun["release_id"], stage, progress=QUIET)
        if stage != "teardown_candidate":
            assert run_orchestrated_stage(begun["state_dir"], begun["release_id"], stage, progress=QUIET) == first
    cli = subprocess.run([sys.executable, "-m", "tasks.cli", "stage", "build", "--release", begun["release_id"],
                          "--state-dir", begun["state_dir"]], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and json.loads(cli.stdout)["gguf_sha256"]
    summary = end_orchestrated(begun["state_dir"], begun["release_id"], holder="airflow:refresh/run-1", failed=False, progress=QUIET)
    assert summary["status"] == "promoted"
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    succeeded = [r.stage for r in ledger.release(begun["release_id"]) if r.event == "succeeded"]
    assert succeeded.count("build") == 1 and succeeded.count("deploy_candidate") == 1
    begin_orchestrated(release_config(), holder="airflow:refresh/run-2", progress=QUIET)  # the lease was given back
