"""A canary onto production scaled to zero bakes (issue 45 item 5, "no evidence is not a pass"), on the local backend:
with no copy serving, the rollout still moves batch by batch, each batch's new copies started and baked under the
alarms and the online gate on their own answers, and scale to zero applies again once the release has passed. (It was
put on every copy at once, unbaked, before.)"""

from __future__ import annotations

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage, run_release

QUIET = lambda message: None  # noqa: E731
MODEL = "tiny-zero-canary"
ENDPOINT, COMPONENT = f"shiplift-{MODEL}-prod", f"shiplift-{MODEL}"
GATED_CANARY = {"strategy": "canary", "copies": 2, "wait_interval_s": 1, "maximum_execution_timeout_s": 600,
                "alarms": {"max_error_rate": 0.05, "min_invocations": 3, "check_interval_s": 0.25},
                "online_gate": {"split": "test", "max_tasks": 32, "rounds": 2}}


def _copies(state_dir) -> list[dict]:
    return ProcessSupervisor(state_dir).describe_endpoint(ENDPOINT)["components"][COMPONENT]["copies"]


def test_a_canary_onto_production_scaled_to_zero_starts_and_bakes_each_batch(tmp_path, tiny_release):
    state_dir = tmp_path / "state"
    config = tiny_release.write_tiny_config(tmp_path / "configs", state_dir, name=MODEL, rollout=GATED_CANARY,
                                            scale_to_zero={"idle_s": 600, "cold_starts": 1,
                                                           "max_cold_start_p95_s": 60})
    try:
        first = run_release(config, progress=QUIET)
        assert first["status"] == "promoted", first
        begun = begin_orchestrated(config, holder="test", overrides=("artifact.quantization=F16",), progress=QUIET)
        def stage(name: str) -> dict:
            return run_orchestrated_stage(begun["release_id"], name, state_dir=state_dir, progress=QUIET)

        for name in ("resolve", "build", "package", "image", "deploy_candidate", "validate"):
            stage(name)
        # idle: the router's scaler takes production to no copy (as it does after idle_s)
        assert ProcessSupervisor(state_dir).scale(ENDPOINT, COMPONENT, 0) and _copies(state_dir) == []

        promoted = stage("promote")
        assert promoted["event"] == "succeeded", promoted
        steps = promoted["steps"]
        assert [(s["phase"], s["batch"], s["old_copies"], s["new_copies"], s["alarm"]) for s in steps] == [
            ("rollout", 1, 0, 1, None), ("rollout", 2, 0, 2, None)], "batch by batch from zero, each baked"
        for step in steps:  # judged on the new copies' own answers (no champion copy serves to compare with)
            gate = step["online_gate"]
            assert gate["decision"] == "pass" and gate["candidate_answers"] == 32 and list(gate["answers"]) == [
                gate["candidate"]], gate
        ledger = Ledger.for_sqlite(state_dir / "ledger.db")
        verdicts = [r.payload for r in ledger.release(begun["release_id"]) if (r.stage, r.event) == ("bake",
                                                                                                      "verdict")]
        assert [(v["batch"], v["alarm"]) for v in verdicts] == [(1, None), (2, None)]
        described = ProcessSupervisor(state_dir).describe_endpoint(ENDPOINT)["components"][COMPONENT]
        assert len(described["copies"]) == 2 and described["wanted"] == 2, "the release's copies, not zero"
        assert described["scale_to_zero"], "scale to zero applies again after the bake"
    finally:
        tiny_release.stop_endpoints(state_dir)
