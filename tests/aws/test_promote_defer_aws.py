"""The promote stage's wait holds no worker on SageMaker (issue 48 item 5), and the online gate's aws edges (issue 45).

A deferred promote's start sends SageMaker's rolling update (what it replaces recorded in the ledger first) and returns;
each poll is one DescribeInferenceComponent and, while the update runs, one check baked by the online gate; the stage
run after the polls follows the update SageMaker ended and judges its last step. That stage run is also what a rerun
after a crash between the update's end and its verdict does: it judges again, never takes the spec as promoted, and
puts back the spec the ledger recorded (DescribeInferenceComponent documents no member holding the spec an update
replaces: https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DescribeInferenceComponent.html). A rolled-back
update of a component scaled to zero ends InService at zero copies, as the rollback puts the old fleet back
(RollbackMaximumBatchSize, https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html).
Each test runs two releases on the double: ~20-30 s on 2 quiet cores."""

from __future__ import annotations

import pytest

import shiplift.tasks.pipeline.deferred as deferred
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage, run_release
from shiplift.validation.online_gate import OnlineGate
from tests.aws.test_rollout_aws import QUIET, _alarms_left, _placement, _serving_model
from tests.aws.test_scale_to_zero_aws import SCALE_TO_ZERO, placement
from tests.aws.test_scale_to_zero_bake_aws import GATED_CANARY, _scale_to_zero

HOLDER = "airflow:refresh_tiny_aws/run-2"
# a gated canary whose put-back moves one copy at a time: three instances hold the two copies and one more
ROLLOUT = {**GATED_CANARY, "rollback_batch": {"type": "COPY_COUNT", "value": 1}}
ALARM = "online gate failed on the new copies (the test's verdict)"
THROUGH_GATE = ("resolve", "build", "package", "image", "deploy_candidate", "validate")


def _gated(aws, aws_release, tiny_release, tmp_path, rollout: dict = ROLLOUT, **changes) -> tuple[dict, dict]:
    """A promoted champion, then a candidate release run through its gate: (champion summary, candidate's begin)."""
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", rollout=rollout,
                                         **changes)
    first = run_release(config, progress=QUIET)
    assert first["status"] == "promoted", first
    begun = begin_orchestrated(config, holder=HOLDER, overrides=("artifact.quantization=F16",), progress=QUIET)
    for stage in THROUGH_GATE:
        run_orchestrated_stage(begun["release_id"], stage, holder=HOLDER, ledger_url=begun["ledger_url"],
                               progress=QUIET)
    return first, begun


def _deferred(begun: dict, action: str) -> dict:
    call = deferred.start_orchestrated if action == "start" else deferred.poll_orchestrated
    return call(begun["release_id"], "promote", holder=HOLDER, ledger_url=begun["ledger_url"], progress=QUIET)


def _polled_to_the_end(begun: dict) -> list[dict]:
    answers: list[dict] = []
    while not answers or not answers[-1]["done"]:
        answers.append(_deferred(begun, "poll"))
        assert len(answers) < 200, answers[-3:]
    return answers


def _updates(aws_calls) -> list[dict]:
    return [params for _, operation, params in aws_calls if operation == "UpdateInferenceComponent"]


def _records(begun: dict, stage: str, event: str | None = None) -> list[dict]:
    return [r.payload for r in Ledger(begun["ledger_url"]).release(begun["release_id"])
            if r.stage == stage and event in (None, r.event)]


def test_a_deferred_promote_sends_the_update_once_polls_its_checks_then_judges_its_end(aws, aws_calls, aws_release,
                                                                                      tiny_release, tmp_path):
    first, begun = _gated(aws, aws_release, tiny_release, tmp_path, placement=_placement(aws_release))
    sagemaker, component = aws.client("sagemaker"), first["component"]
    champion_model = sagemaker.describe_inference_component(
        InferenceComponentName=component)["Specification"]["ModelName"]
    aws_calls.clear()

    assert _deferred(begun, "start")["started"]["sent"] is True
    assert _deferred(begun, "start")["started"]["sent"] is False, "a retried start follows the update it sent"
    assert len(_updates(aws_calls)) == 1 and "RollingUpdatePolicy" in _updates(aws_calls)[0]["DeploymentConfig"]
    kept = _records(begun, "rollout", "replaced")
    assert len(kept) == 1 and kept[0]["previous"]["Specification"]["ModelName"] == champion_model
    assert kept[0]["previous"]["RuntimeConfig"] == {"DesiredCopyCount": 2}, "read before the update was sent"

    answers = _polled_to_the_end(begun)
    running = [a for a in answers if not a["done"]]
    assert running and all("Updating" in a["status"] for a in running), answers
    checks = [s for s in _records(begun, "traffic", "step") if s["check"] is not None]
    assert [s["check"] for s in checks] == list(range(1, len(running) + 1)), "one check per poll, numbered on"
    assert len(_records(begun, "bake", "verdict")) == len(running), "each check baked by the online gate"

    promoted = run_orchestrated_stage(begun["release_id"], "promote", holder=HOLDER, ledger_url=begun["ledger_url"],
                                      progress=QUIET)
    assert promoted["event"] == "succeeded" and promoted["served"]["release_id"] == begun["release_id"], promoted
    assert len(_updates(aws_calls)) == 1, "the stage followed the update the start sent"
    end = _records(begun, "bake", "verdict")[-1]
    gate = end["online_gate"]
    assert end["alarm"] is None and gate["decision"] == "pass" and gate["candidate_answers"] == 32, gate
    assert list(gate["answers"]) == [gate["candidate"]], "judged at the update's end on every copy new"
    assert promoted["served"]["artifact_sha256"] in _serving_model(aws, component)
    assert _alarms_left(aws) == []
    stage = [(e, p.get("deferred")) for e, p in ((r.event, r.payload) for r in Ledger(begun["ledger_url"]).release(
        begun["release_id"]) if r.stage == "promote")]
    assert stage == [("started", True), ("started", True), ("started", None), ("succeeded", None)]


def test_a_rerun_after_the_update_ended_unjudged_judges_it_and_puts_the_ledger_s_spec_back(
        aws, aws_calls, aws_release, tiny_release, tmp_path, monkeypatch):
    """The crash between SageMaker's update ending on the new spec and the online gate's final verdict: the polls
    saw the update end, and nothing judged its last step. The stage's rerun bakes it (here the gate fails there), and
    UpdateInferenceComponent puts back the spec the ledger recorded before the update; the release never counts the
    candidate as promoted. The old code took the InService new spec as `unchanged` and promoted it."""
    first, begun = _gated(aws, aws_release, tiny_release, tmp_path, placement=_placement(aws_release))
    sagemaker, component = aws.client("sagemaker"), first["component"]
    champion_model = sagemaker.describe_inference_component(
        InferenceComponentName=component)["Specification"]["ModelName"]
    _deferred(begun, "start")
    _polled_to_the_end(begun)
    live = sagemaker.describe_inference_component(InferenceComponentName=component)
    assert live["InferenceComponentStatus"] == "InService" and live["Specification"]["ModelName"] != champion_model
    aws_calls.clear()

    seen = []

    def failing(gate: OnlineGate) -> str:
        seen.append(gate.evidence()["candidate_answers"])
        return ALARM

    monkeypatch.setattr(OnlineGate, "alarm", failing)
    result = run_orchestrated_stage(begun["release_id"], "promote", holder=HOLDER, ledger_url=begun["ledger_url"],
                                    progress=QUIET)
    assert result["event"] == "rolled_back", result
    assert seen == [32], "the rerun replayed a round of its own and judged it"
    updates = _updates(aws_calls)
    assert len(updates) == 1 and updates[0]["Specification"]["ModelName"] == champion_model, updates
    assert updates[0]["RuntimeConfig"] == {"CopyCount": 2}
    assert first["artifact_sha256"] in _serving_model(aws, component), "the champion serves again"
    assert result["served"]["release_id"] == first["release_id"]
    assert _records(begun, "bake", "verdict")[-1]["alarm"] == ALARM
    assert [s["phase"] for s in _records(begun, "traffic", "step")][-1] == "rollback"


def test_a_rerun_with_no_recorded_spec_refuses_to_guess_it(aws, aws_calls, aws_release, tiny_release, tmp_path,
                                                            monkeypatch):
    """Without the ledger's record (an update sent before shiplift recorded it) the rerun does not read a spec from
    the description (AWS documents none there): it fails with the rollback to run, production untouched."""
    from shiplift.tasks.errors import DeployFailed
    from shiplift.tasks.pipeline.stages import promote

    _, begun = _gated(aws, aws_release, tiny_release, tmp_path, placement=_placement(aws_release))
    monkeypatch.setattr(promote, "replaced", lambda ctx, at: (lambda previous: None, None))  # nothing kept
    _deferred(begun, "start")
    _polled_to_the_end(begun)
    aws_calls.clear()
    monkeypatch.setattr(OnlineGate, "alarm", lambda gate: "online gate failed (the test's verdict)")
    with pytest.raises(DeployFailed, match="ledger holds no record of what it replaced"):
        run_orchestrated_stage(begun["release_id"], "promote", holder=HOLDER, ledger_url=begun["ledger_url"],
                               progress=QUIET)
    assert _updates(aws_calls) == []


def test_a_rolled_back_update_of_a_component_scaled_to_zero_ends_in_service_at_zero_copies(
        aws, aws_release, tiny_release, tmp_path):
    """SageMaker rolls the update back after its first batch: the old fleet is zero copies, so the component is
    InService with none on the champion's spec (the double ended it Failed, and the release failed with it). No online
    gate here: its requests would wake the component (scale out from zero) and blur what the rollback left."""
    aws.scenario(scaling_cooldown_scale=0.01)
    ungated = {key: value for key, value in ROLLOUT.items() if key != "online_gate"}
    first, begun = _gated(aws, aws_release, tiny_release, tmp_path, rollout=ungated,
                          placement=placement(aws_release, instance_count=2),
                          scale_to_zero={**SCALE_TO_ZERO, "cold_starts": 1})
    sagemaker, component = aws.client("sagemaker"), first["component"]
    _scale_to_zero(sagemaker, component)
    champion_model = sagemaker.describe_inference_component(
        InferenceComponentName=component)["Specification"]["ModelName"]
    aws.scenario(roll_back_updates=True)
    result = run_orchestrated_stage(begun["release_id"], "promote", holder=HOLDER, ledger_url=begun["ledger_url"],
                                    progress=QUIET)
    assert result["event"] == "rolled_back", result
    live = sagemaker.describe_inference_component(InferenceComponentName=component)
    assert live["InferenceComponentStatus"] == "InService" and "FailureReason" not in live
    assert live["Specification"]["ModelName"] == champion_model and live["RuntimeConfig"]["CurrentCopyCount"] == 0
    assert any(m.startswith("rolled back: 0 old copies") for m in (e.message for e in aws.rollout_events(component)))
    assert result["served"]["release_id"] == first["release_id"]
