"""Canary releases on the local backend, through the promote stage: a first release that bakes under its online gate,
a rollout that succeeds, and one that a bake alarm rolls back under live traffic while the champion keeps serving,
then a rollback on demand to the first release through the same canary machinery; and a first release that fails
live, taken out of service and recorded."""

from __future__ import annotations

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.cli.demo import LiveTraffic
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.promotion import rollback
from shiplift.tasks.pipeline.release import run_release
from tests.e2e.test_release_local import QUIET, production

MODEL = "tiny-decision"
ENDPOINT, COMPONENT = f"shiplift-{MODEL}-prod", f"shiplift-{MODEL}"
CANARY = {"strategy": "canary", "copies": 2, "wait_interval_s": 4, "maximum_execution_timeout_s": 600,
          "alarms": {"max_error_rate": 0.05, "min_invocations": 3, "check_interval_s": 0.25}}


def _promote_record(ledger: Ledger, release_id: str):
    return next(r for r in ledger.release(release_id) if r.stage == "promote" and r.event != "started")


# ~95 s on 2 cores: make test-slow; tests/unit/test_as_of_rollout.py keeps a real local canary in make test
@pytest.mark.slow
def test_a_canary_succeeds_then_a_bad_canary_is_rolled_back_and_the_champion_serves(release_config, tmp_path):
    state_dir = tmp_path / "state"

    gated = {**CANARY, "online_gate": {"split": "test", "max_tasks": 32, "rounds": 8}}
    first = run_release(release_config(rollout=gated), progress=QUIET)
    assert first["status"] == "promoted"
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    steps = _promote_record(ledger, first["release_id"]).payload["steps"]
    assert [(s["phase"], s["batch"], s["batches"], s["old_copies"], s["new_copies"], s["alarm"]) for s in steps] == [
        ("rollout", 1, 1, 0, 2, None)], "nothing served: every copy started at once, then baked as one step"
    gate = steps[0]["online_gate"]  # candidate-only: no champion answered, so only the absolute checks
    assert gate["candidate_answers"] == 32 and gate["decision"] == "pass"
    assert list(gate["answers"]) == [gate["candidate"]]
    assert gate["attributed_by"] == "serving_id" and not any(c["name"].startswith("champion") for c in gate["checks"])

    second = run_release(release_config(rollout=gated, calibration__fit_temperature=True), progress=QUIET)
    assert second["status"] == "promoted"
    steps = _promote_record(ledger, second["release_id"]).payload["steps"]
    assert [(s["phase"], s["batch"], s["old_copies"], s["new_copies"], s["alarm"]) for s in steps] == [
        ("rollout", 1, 1, 1, None), ("rollout", 2, 0, 2, None)]
    gate = steps[0]["online_gate"]  # the canary set replayed through production while the first batch baked
    assert gate["candidate_answers"] == 32 and gate["decision"] == "pass" and gate["unattributed"] == 0
    # the same GGUF at a fitted temperature: its answers are told from the champion copy's by the serving id alone
    assert len(gate["answers"]) == 2 and gate["answers"][gate["candidate"]] == 32, gate["answers"]
    assert steps[0]["alarm_states"] == {"online_gate": "OK", "error_rate": "OK", "latency_p99": "OK"}
    traffic_steps = [r.payload for r in ledger.release(second["release_id"]) if r.stage == "traffic"]
    assert [(t["batch"], t["strategy"], t["from_release"]) for t in traffic_steps] == [
        (1, "canary", first["release_id"]), (2, "canary", first["release_id"])], "one ledger record per traffic step"
    assert traffic_steps[0]["live"]["copies"] == 2 and traffic_steps[0]["live"]["release_id"] == second["release_id"]
    verdicts = [r.payload for r in ledger.release(second["release_id"]) if r.stage == "bake"]
    assert [(v["batch"], v["alarm"]) for v in verdicts] == [(1, None), (2, None)] and "online_gate" in verdicts[0]
    assert [s["at"] for s in steps] == [r.recorded_at for r in ledger.release(second["release_id"])
                                        if r.stage == "traffic"]
    served = production(state_dir, MODEL)
    assert served["spec"]["model_ref"]["release_id"] == second["release_id"] and len(served["copies"]) == 2

    url = ProcessSupervisor(state_dir).endpoint_url(ENDPOINT)
    # the third release's copies refuse the shared decisions production receives
    with LiveTraffic(url, COMPONENT) as traffic:
        third = run_release(release_config(rollout=CANARY, calibration__fit_temperature=True,
                                           image__max_shared_decisions=1), progress=QUIET)
    assert third["status"] == "rolled_back", third
    record = _promote_record(ledger, third["release_id"])
    assert record.event == "rolled_back" and "error rate" in record.payload["reason"]
    phases = [(s["phase"], s["alarm"] is not None) for s in record.payload["steps"]]
    assert phases[0] == ("rollout", True) and phases[-1][0] == "rollback"
    assert record.payload["steps"][0]["alarm_states"]["error_rate"] == "ALARM"
    assert [r.payload["phase"] for r in ledger.release(third["release_id"]) if r.stage == "traffic"] == [
        p for p, _ in phases], "the rollback's steps are recorded too"
    kinds = [(r.stage, r.payload.get("phase")) for r in ledger.release(third["release_id"])
             if r.stage in ("traffic", "bake")]
    assert kinds[:3] == [("traffic", "rollout"), ("bake", "rollout"), ("traffic", "rollback")], \
        "the canary, the alarm that fired during its bake, then the rollback, each appended when it happened"
    alarm = next(r for r in ledger.release(third["release_id"]) if r.stage == "bake")
    assert "error rate" in alarm.payload["alarm"] and alarm.recorded_at < record.recorded_at
    served = production(state_dir, MODEL)
    assert served["spec"]["model_ref"]["release_id"] == second["release_id"], "the champion serves again"
    assert len(served["copies"]) == 2 and all(c["in_rotation"] for c in served["copies"])
    assert traffic.statuses[200] > 0 and traffic.statuses[424] > 0, traffic.statuses  # 424: the model's own 400
    assert set(traffic.statuses) <= {200, 424, 503}, traffic.statuses  # a model answer or a retryable 503, never lost

    earlier = sum(r.stage == "traffic" for r in ledger.release(first["release_id"]))  # its own first rollout
    back = rollback(state_dir, MODEL, first["release_id"], reason="the first release answered faster", actor="pytest",
                    expect_current=second["release_id"])  # on demand, with the same canary machinery
    assert (back["strategy"], back["steps"], back["served"]["release_id"]) == ("canary", 2, first["release_id"])
    served = production(state_dir, MODEL)
    assert served["spec"]["model_ref"]["release_id"] == first["release_id"] and len(served["copies"]) == 2
    steps = [r.payload for r in ledger.release(first["release_id"]) if r.stage == "traffic"][earlier:]
    assert [(t["phase"], t["batch"], t["new_copies"]) for t in steps] == [("rollout", 1, 1), ("rollout", 2, 2)]
    assert ledger.verify().ok


@pytest.mark.slow  # ~30 s on 2 cores: a first release of a tiny model, its bake under traffic
def test_a_first_release_that_fails_live_is_taken_out_of_service_and_recorded(release_config, tmp_path, monkeypatch):
    """Nothing serves the model yet; its build refuses the multi-decision requests production clients send (the
    offline gate sends single decisions, so it passes). It starts its copies, production traffic reaches them during
    their bake, the error-rate alarm fires, and the component is deleted: the release ends rolled back with why, and
    nothing serves. Before issue 45 it went to production all at once, unbaked."""
    from shiplift.tasks.pipeline.bake import BakeWatch

    state_dir, model = tmp_path / "state", "tiny-refuses"
    endpoint, component = f"shiplift-{model}-prod", f"shiplift-{model}"
    baked, traffic = BakeWatch.__call__, []

    def under_traffic(self, step):  # production clients find the new copies as soon as they serve
        with LiveTraffic(ProcessSupervisor(state_dir).endpoint_url(endpoint), component) as live:
            traffic.append(live)
            return baked(self, step)

    monkeypatch.setattr(BakeWatch, "__call__", under_traffic)
    release = run_release(release_config(name=model, rollout=CANARY, image__max_shared_decisions=1), progress=QUIET)
    assert release["status"] == "rolled_back", release
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    record = _promote_record(ledger, release["release_id"])
    assert record.event == "rolled_back" and "error rate" in record.payload["reason"]
    assert "taken out of service" in record.payload["reason"] and record.payload["served"] is None
    assert [(s["phase"], s["old_copies"], s["new_copies"], s["alarm"] is not None)
            for s in record.payload["steps"]] == [("rollout", 0, 2, True), ("rollback", 0, 0, False)]
    assert record.payload["steps"][0]["alarm_states"]["error_rate"] == "ALARM"
    kinds = [(r.stage, r.payload.get("phase")) for r in ledger.release(release["release_id"])
             if r.stage in ("traffic", "bake")]
    assert kinds == [("traffic", "rollout"), ("bake", "rollout"), ("traffic", "rollback")]
    assert component not in ProcessSupervisor(state_dir).describe_endpoint(endpoint)["components"], "nothing serves"
    assert ledger.served_at(model, "2100-01-01T00:00:00Z") is None
    assert traffic[0].statuses[424] > 0, traffic[0].statuses  # the copies' refusals the alarm counted
    assert ledger.verify().ok
