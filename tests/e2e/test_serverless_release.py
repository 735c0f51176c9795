"""Serverless placement on the local backend, end to end (docs/fleet.md, "Serverless encoders"; issue 36, item 4): a
real tiny NLI encoder release on `placement.kind: serverless` is gated with the encoder's checks plus its cold starts
(each from no compute to the first answer), promoted to a production endpoint that starts with no compute, and the
first request after that is held through the start and answered on its first attempt, as SageMaker Serverless
Inference answers it. A bound below what a start takes rejects the release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shiplift.tasks.artifacts.tiny_encoder import write_tiny_checkpoint
from shiplift.tasks.backends.local.hosting import LoopbackHosting
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.hashing import sha256_tree
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import run_release
from shiplift.validation.cold_start import CHECK_NAME, first_answer
from shiplift.validation.transport import HttpInvoker

QUIET = lambda message: None  # noqa: E731
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def serverless(tmp_path_factory):
    root = tmp_path_factory.mktemp("serverless")
    checkpoint = write_tiny_checkpoint(root / "checkpoint", seed=0)
    state = root / "state"

    def write(name: str, bound: float) -> Path:
        tree = yaml.safe_load((ROOT / "configs/releases/minilm-nli.yaml").read_text())
        tree["name"] = name
        tree["artifact"]["source"] = {"kind": "path", "path": str(checkpoint), "sha256": sha256_tree(checkpoint)}
        tree["backend"] = {"kind": "local", "state_dir": str(state)}
        tree["placement"] = {"kind": "serverless", "memory_size_mb": 2048, "max_concurrency": 4, "cold_starts": 3,
                             "max_cold_start_p95_s": bound}
        tree["calibration"]["fit_temperature"] = False
        tree["validation"]["thresholds"] = {"min_accuracy": 0.0, "min_macro_f1": 0.0, "min_class_recall": 0.0,
                                            "max_ece": 1.0}
        tree["validation"]["n_bootstrap"] = 200
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tree))
        return path

    try:
        yield {"state": state, "write": write}
    finally:
        for endpoint in ProcessSupervisor(state).list_endpoints():
            ProcessSupervisor(state).delete_endpoint(endpoint["name"])


def gate_report(state: Path, release_id: str) -> dict:
    records = Ledger.for_sqlite(state / "ledger.db").release(release_id)
    validated = next(r.payload for r in records if (r.stage, r.event) == ("validate", "succeeded"))
    return json.loads(Path(validated["report_json"]).read_text())


def test_a_serverless_encoder_is_gated_on_its_cold_starts_and_serves_from_no_compute(serverless):
    state = serverless["state"]
    result = run_release(serverless["write"]("tiny-nli-sls", 60), progress=QUIET)
    assert result["status"] == "promoted", result
    report = gate_report(state, result["release_id"])
    check = next(c for c in report["checks"] if c["name"] == CHECK_NAME)
    starts = report["extra"]["release"]["cold_start"]["starts"]
    assert len(starts) == 3 and all(s["error"] is None and s["seconds"] > 0 for s in starts)
    assert [s["attempts"] for s in starts] == [1, 1, 1], "held through each start, not refused: serverless waits"
    assert check["status"] == "pass" and check["observed"] == pytest.approx(max(s["seconds"] for s in starts), abs=1e-3)
    assert {"macro_f1", "recall_entailment"} <= {c["name"] for c in report["checks"]}, "the encoder's own checks too"
    assert "serverless bills per request" in json.dumps(report["extra"]["release"]["cost"])

    endpoint, component = "shiplift-tiny-nli-sls-prod", "shiplift-tiny-nli-sls"
    described = ProcessSupervisor(state).describe_endpoint(endpoint)["components"][component]
    assert described["copies"] == [] and described["serverless"]["max_concurrency"] == 4, "no compute until asked"
    live = LoopbackHosting(state, store=None).describe(endpoint, component)
    assert (live.status, live.copies) == ("InService", 1)

    body = json.dumps({"pairs": [{"premise": "The order shipped on May 3.",
                                  "hypothesis": "The order shipped."}]}).encode()
    url = ProcessSupervisor(state).describe_endpoint(endpoint)["url"]
    start = first_answer(HttpInvoker(url, component, runtime=True), body, timeout_s=30, deadline_s=120)
    assert start.error is None and start.attempts == 1
    assert len(ProcessSupervisor(state).describe_endpoint(endpoint)["components"][component]["copies"]) == 1


def test_a_cold_start_slower_than_the_bound_rejects_the_serverless_release(serverless):
    result = run_release(serverless["write"]("tiny-nli-sls-slow", 0.001), progress=QUIET)
    assert result["status"] == "rejected"
    report = gate_report(serverless["state"], result["release_id"])
    check = next(c for c in report["checks"] if c["name"] == CHECK_NAME)
    assert report["decision"] == "fail" and check["status"] == "fail"
    # within twice a 1 ms bound a start is either unanswered or slower than the bound (its time may round to 1 ms)
    assert "got no answer" in check["reason"] or check["observed"] > 0.001
