"""A canary onto production scaled to zero bakes on SageMaker too (issue 45 item 5): the rolling update from no copy
starts the candidate's copies batch by batch (the new copies start "on the new endpoint fleet" a batch at a time,
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html), the online
gate's requests that find none are retried until a copy serves (the no-capacity answer of
https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html), the gate judges the new
copies' own answers before the release counts as promoted, and scale to zero's target and policies stay in place."""

from __future__ import annotations

import time

from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage, run_release
from tests.aws.test_rollout_aws import QUIET, _alarms_left
from tests.aws.test_scale_to_zero_aws import SCALE_TO_ZERO, placement

# Two releases on the double: ~20 s on 2 quiet cores.
GATED_CANARY = {"strategy": "canary", "copies": 2, "wait_interval_s": 1, "maximum_execution_timeout_s": 600,
                "alarms": {"max_error_rate": 0.05, "min_invocations": 3, "check_interval_s": 0.5},
                "online_gate": {"split": "test", "max_tasks": 32, "rounds": 2}}


def _scale_to_zero(sagemaker, component: str) -> None:
    """What the target-tracking policy does to an idle component: no copy (waited for)."""
    sagemaker.update_inference_component_runtime_config(InferenceComponentName=component,
                                                        DesiredRuntimeConfig={"CopyCount": 0})
    deadline = time.monotonic() + 60
    while (live := sagemaker.describe_inference_component(InferenceComponentName=component))[
            "InferenceComponentStatus"] != "InService":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert live["RuntimeConfig"]["CurrentCopyCount"] == 0


def test_a_canary_onto_production_scaled_to_zero_is_baked_on_the_new_copies_answers(aws, aws_release, tiny_release,
                                                                                   tmp_path):
    aws_release.prepare_account(aws)
    aws.scenario(scaling_cooldown_scale=0.01)  # the step policy's 60 s cooldown between starts from zero: 0.6 s
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                         rollout=GATED_CANARY, placement=placement(aws_release, instance_count=2),
                                         scale_to_zero={**SCALE_TO_ZERO, "cold_starts": 1})
    first = run_release(config, progress=QUIET)
    assert first["status"] == "promoted", first
    sagemaker, component = aws.client("sagemaker"), first["component"]
    begun = begin_orchestrated(config, holder="test", overrides=("artifact.quantization=F16",), progress=QUIET)
    for stage in ("resolve", "build", "package", "image", "deploy_candidate", "validate"):
        run_orchestrated_stage(begun["release_id"], stage, ledger_url=begun["ledger_url"], progress=QUIET)
    _scale_to_zero(sagemaker, component)  # the champion check woke it; idle again before promote

    promoted = run_orchestrated_stage(begun["release_id"], "promote", ledger_url=begun["ledger_url"], progress=QUIET)
    assert promoted["event"] == "succeeded", promoted
    run_orchestrated_stage(begun["release_id"], "teardown_candidate", ledger_url=begun["ledger_url"], progress=QUIET)
    events = [e.message for e in aws.rollout_events(component)]
    assert any(m.startswith("started: 0 old copies -> 2 new copies") for m in events), events
    live = sagemaker.describe_inference_component(InferenceComponentName=component)
    model = sagemaker.describe_model(ModelName=live["Specification"]["ModelName"])
    assert live["RuntimeConfig"]["CurrentCopyCount"] == 2 and promoted["served"]["release_id"] == begun["release_id"]
    assert promoted["served"]["artifact_sha256"] in model["PrimaryContainer"]["ModelDataUrl"]

    ledger = Ledger(begun["ledger_url"])
    verdicts = [r.payload for r in ledger.release(begun["release_id"]) if (r.stage, r.event) == ("bake", "verdict")]
    end = verdicts[-1]  # the update ended: every copy new, and the gate decided on their answers
    gate = end["online_gate"]
    assert end["alarm"] is None and gate["decision"] == "pass" and gate["candidate_answers"] == 32, gate
    assert list(gate["answers"]) == [gate["candidate"]], "no champion copy served: the new copies' own answers"
    steps = [r.payload for r in ledger.release(begun["release_id"]) if r.stage == "traffic"]
    assert (steps[-1]["phase"], steps[-1]["old_copies"], steps[-1]["new_copies"]) == ("rollout", 0, 2)
    targets = aws.client("application-autoscaling").describe_scalable_targets(ServiceNamespace="sagemaker")
    assert [(t["ResourceId"], t["MinCapacity"]) for t in targets["ScalableTargets"]] == [
        (f"inference-component/{component}", 0)], "scale to zero applies after the bake"
    assert _alarms_left(aws) == [f"{component}-no-capacity"], "the rollout's alarms are gone, scale to zero's stays"
