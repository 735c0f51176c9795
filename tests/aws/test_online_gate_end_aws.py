"""No evidence is not a pass on SageMaker (issue 45 item 5): an online gate still undecided when SageMaker's rolling
update ends is judged then, and follows the release's inconclusive choice; block puts the champion's spec back.

The double follows the rolling-update behaviour AWS documents: the batches bake WaitIntervalInSeconds each ("the
length of the baking period, during which SageMaker AI monitors alarms for each batch on the new fleet",
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html) and the
alarms roll back only while the update runs ("If any of your alarms trip during the specified monitoring period,
SageMaker AI initiates a complete rollback", https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-configuration.html),
so once the update has ended it is InService on the new spec and only another UpdateInferenceComponent puts the old
one back."""

from __future__ import annotations

import pytest

from shiplift.tasks.backends.aws.hosting_requests import restore_request
from shiplift.tasks.backends.aws.service_model import request_problems
from shiplift.tasks.backends.interfaces import RolloutPlan
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import run_release
from tests.aws.test_rollout_aws import QUIET, _alarms_left, _placement, _serving_model

# one check only: its interval is longer than the whole update (two batches of a tiny model, a 1 s bake each), so the
# gate replays once, at the update's start, while the first new copy is still starting and the champion answers the
# first canary tasks; each task is sent once (rounds 1), so the candidate answers fewer than all 32, which
# validation.champion.min_samples asks for. No traffic: the error-rate alarm stays OK. The rollback moves one copy at
# a time: three instances hold the two copies and one more.
# Two releases on the double: ~20 s on 2 quiet cores.
SHORT_BAKE = {"strategy": "canary", "copies": 2, "wait_interval_s": 1, "maximum_execution_timeout_s": 600,
              "rollback_batch": {"type": "COPY_COUNT", "value": 1},
              "alarms": {"max_error_rate": 0.05, "min_invocations": 3, "check_interval_s": 300},
              "online_gate": {"split": "test", "max_tasks": 32, "rounds": 1}}


def test_a_gate_still_undecided_when_the_update_ends_puts_the_champions_spec_back(aws, aws_release, tiny_release,
                                                                                   tmp_path):
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", rollout=SHORT_BAKE,
                                         placement=_placement(aws_release), validation__champion__min_samples=32)
    first = run_release(config, progress=QUIET)
    assert first["status"] == "promoted", first
    sagemaker = aws.client("sagemaker")
    champion_model = sagemaker.describe_inference_component(
        InferenceComponentName=first["component"])["Specification"]["ModelName"]

    second = run_release(config, overrides=("artifact.quantization=F16",), progress=QUIET)
    assert second["status"] == "rolled_back", second
    reason = second["rollout"]["reason"]
    assert reason.startswith("online gate inconclusive: ") and "validation.inconclusive.choice is block" in reason
    assert "SageMaker's update had ended, so the previous spec was put back" in reason, reason

    # SageMaker's update did end on the candidate; the second update put the champion's model back on both copies
    events = [e.message for e in aws.rollout_events(first["component"])]
    assert any(m.startswith("completed: 2 new copies") for m in events), events
    updates = [c.params for c in aws.calls if c.operation == "UpdateInferenceComponent"]
    assert len(updates) == 2 and updates[1]["Specification"]["ModelName"] == champion_model
    assert updates[1]["RuntimeConfig"] == {"CopyCount": 2} and updates[1]["DeploymentConfig"] == {
        "RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 0,
                                "MaximumExecutionTimeoutInSeconds": 600}}, "rollout.rollback_batch at a time, no alarms"
    live = sagemaker.describe_inference_component(InferenceComponentName=first["component"])
    assert live["Specification"]["ModelName"] == champion_model
    assert first["artifact_sha256"] in _serving_model(aws, first["component"]), "the champion serves, on every copy"
    assert _alarms_left(aws) == []

    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    records = ledger.release(second["release_id"])
    verdicts = [r.payload for r in records if (r.stage, r.event) == ("bake", "verdict")]
    mid, end = verdicts[0], verdicts[-1]
    assert mid["alarm"] is None and mid["online_gate"]["decision"] == "inconclusive", "mid-update: only recorded"
    assert end["alarm"] == reason.split("; SageMaker's update had ended")[0], "the end's verdict carries the alarm"
    gate = end["online_gate"]
    assert gate["decision"] == "inconclusive" and gate["candidate_answers"] < gate["min_samples"] == 32, gate
    assert gate["inconclusive_choice"] == "block" and gate["extended_rounds"] == 0
    steps = [r.payload for r in records if r.stage == "traffic"]
    assert [s["phase"] for s in steps[-2:]] == ["rollout", "rollback"]
    assert (steps[-2]["old_copies"], steps[-2]["new_copies"]) == (0, 2), "the update ended: every copy new"
    assert (steps[-1]["old_copies"], steps[-1]["copies"]) == (2, 2), "the champion's copies serve again"
    promote = next(r for r in records if r.stage == "promote" and r.event == "rolled_back")
    assert promote.payload["reason"] == reason
    assert promote.payload["served"]["release_id"] == first["release_id"]
    assert ledger.served_at("tiny-aws", promote.recorded_at).release_id == first["release_id"]
    assert ledger.verify().ok


def _described(copies: int) -> dict:
    """A DescribeInferenceComponent answer (its output shape's members) of a champion on `copies` copies."""
    return {"InferenceComponentName": "shiplift-x", "EndpointName": "shiplift-x-prod", "VariantName": "AllTraffic",
            "InferenceComponentStatus": "InService",
            "Specification": {"ModelName": "shiplift-x-0123456789",
                              "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": 1,
                                                              "MinMemoryRequiredInMb": 2048},
                              "StartupParameters": {"ModelDataDownloadTimeoutInSeconds": 900,
                                                    "ContainerStartupHealthCheckTimeoutInSeconds": 900}},
            "RuntimeConfig": {"DesiredCopyCount": copies, "CurrentCopyCount": copies}}


@pytest.mark.parametrize(("copies", "rollback_batch", "rolling"), [(2, None, False), (2, 1, True), (4, 2, True),
                                                                     (1, 1, False), (4, 3, False)])
def test_the_restore_request_passes_the_service_model_and_rolls_only_a_batch_sagemaker_takes(copies, rollback_batch,
                                                                                             rolling):
    plan = RolloutPlan(strategy="canary", batch_copies=1, rollback_batch_copies=rollback_batch, max_execution_s=900,
                       online_gate=True)
    request = restore_request("shiplift-x", _described(copies), plan)
    assert request_problems("sagemaker", "UpdateInferenceComponent", request) == []
    assert request["Specification"] == _described(copies)["Specification"]
    assert request["RuntimeConfig"] == {"CopyCount": copies}
    # MaximumBatchSize 5-50 % of the copies (API_InferenceComponentRollingUpdatePolicy.html); outside it, all at once
    assert ("DeploymentConfig" in request) is rolling
    if rolling:
        assert request["DeploymentConfig"]["RollingUpdatePolicy"]["MaximumBatchSize"] == {"Type": "COPY_COUNT",
                                                                                          "Value": rollback_batch}
