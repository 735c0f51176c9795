"""Canary releases on the local backend, through the promote stage: a rollout that succeeds, and one that a
bake alarm rolls back under live traffic while the champion keeps serving."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections import Counter

from tasks.hosting.local import LocalHosting
from tasks.ledger import Ledger
from tasks.release import run_release
from tests.e2e.test_release_local import QUIET, production

MODEL = "tiny-decision"
ENDPOINT, COMPONENT = f"shiplift-{MODEL}-prod", f"shiplift-{MODEL}"
CANARY = {"strategy": "canary", "copies": 2, "wait_interval_s": 4, "maximum_execution_timeout_s": 600,
          "alarms": {"max_error_rate": 0.05, "min_invocations": 3, "check_interval_s": 0.25}}


def _shared_decisions() -> bytes:
    """Two decisions on one state, sent as one `decisions` request (a candidate limited to one refuses it)."""
    options = [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]
    return json.dumps({"decisions": [{"id": f"q{i}", "state": "The sky is blue.", "question": "Is the sky blue?",
                                      "options": options} for i in range(2)]}).encode()


class Traffic:
    """Live traffic on production from a background thread, counting statuses, until stopped."""

    def __init__(self, url: str):
        self.url, self.stop, self.statuses = url, threading.Event(), Counter()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = _shared_decisions()
        while not self.stop.is_set():
            request = urllib.request.Request(f"{self.url}/invocations", data=body, method="POST", headers={
                "Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": COMPONENT})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    self.statuses[response.status] += 1
            except urllib.error.HTTPError as error:
                self.statuses[error.code] += 1
            except OSError:
                self.statuses["transport"] += 1

    def __enter__(self) -> "Traffic":
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def _promote_record(ledger: Ledger, release_id: str):
    return next(r for r in ledger.release(release_id) if r.stage == "promote" and r.event != "started")


def test_a_canary_succeeds_then_a_bad_canary_is_rolled_back_and_the_champion_serves(release_config, tmp_path):
    state_dir = tmp_path / "state"

    first = run_release(release_config(rollout=CANARY), progress=QUIET)
    assert first["status"] == "promoted"
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    assert _promote_record(ledger, first["release_id"]).payload["steps"] == [], "the first release is deployed whole"

    gated = {**CANARY, "online_gate": {"split": "test", "max_tasks": 32}}
    second = run_release(release_config(rollout=gated, calibration__fit_temperature=True), progress=QUIET)
    assert second["status"] == "promoted"
    steps = _promote_record(ledger, second["release_id"]).payload["steps"]
    assert [(s["phase"], s["batch"], s["old_copies"], s["new_copies"], s["alarm"]) for s in steps] == [
        ("rollout", 1, 1, 1, None), ("rollout", 2, 0, 2, None)]
    gate = steps[0]["online_gate"]  # the canary set replayed through production while the first batch baked
    assert gate["candidate_answers"] == 32 and gate["decision"] == "pass" and gate["unattributed"] == 0
    served = production(state_dir, MODEL)
    assert served["spec"]["model_ref"]["release_id"] == second["release_id"] and len(served["copies"]) == 2

    url = LocalHosting(state_dir).endpoint_url(ENDPOINT)
    with Traffic(url) as traffic:  # the third release's copies refuse the shared decisions production receives
        third = run_release(release_config(rollout=CANARY, calibration__fit_temperature=True,
                                           image__max_shared_decisions=1), progress=QUIET)
    assert third["status"] == "rolled_back", third
    record = _promote_record(ledger, third["release_id"])
    assert record.event == "rolled_back" and "error rate" in record.payload["reason"]
    phases = [(s["phase"], s["alarm"] is not None) for s in record.payload["steps"]]
    assert phases[0] == ("rollout", True) and phases[-1][0] == "rollback"
    served = production(state_dir, MODEL)
    assert served["spec"]["model_ref"]["release_id"] == second["release_id"], "the champion serves again"
    assert len(served["copies"]) == 2 and all(c["in_rotation"] for c in served["copies"])
    assert traffic.statuses[200] > 0 and traffic.statuses[424] > 0, traffic.statuses  # 424: the model's own 400
    assert set(traffic.statuses) <= {200, 424, 503}, traffic.statuses  # a model answer or a retryable 503, never lost
    assert ledger.verify().ok
