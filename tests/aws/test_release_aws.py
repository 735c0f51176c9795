"""Releases on the aws backend, end to end against the AWS double: S3, CodeBuild + ECR, SageMaker, and the
gate scoring real model answers through `sagemaker-runtime` (the double runs the release's own server)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import begin_orchestrated, release_id_for, run_orchestrated_stage, run_release

ROOT = Path(__file__).resolve().parents[2]
QUIET = lambda message: None  # noqa: E731
DECISION = {"id": "q", "state": "The sky is blue.", "question": "Is the sky blue?",
            "options": [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]}


def sagemaker_names(double, operation: str) -> list[str]:
    key = {"CreateEndpoint": "EndpointName", "CreateModel": "ModelName", "CreateEndpointConfig": "EndpointConfigName",
           "CreateInferenceComponent": "InferenceComponentName"}[operation]
    return [call.params[key] for call in double.calls if call.operation == operation]


def test_release_on_an_instance_pool_falls_back_gates_and_promotes(aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    aws.scenario(unavailable_instance_types=["ml.g6e.xlarge"])
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    summary = run_release(config, progress=QUIET)
    assert summary["status"] == "promoted" and summary["decision"] == "pass", summary
    assert summary["placement"]["instance_type"] == "ml.g6.2xlarge"
    assert summary["placement"]["tried"] == ["ml.g6e.xlarge"]
    assert summary["image_uri"].startswith(f"{aws_release.ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/"
                                           "shiplift/semif@sha256:")

    sm = aws.client("sagemaker")
    candidate = sagemaker_names(aws, "CreateEndpoint")[0]
    assert "-cand-" in candidate and sm.list_endpoints()["Endpoints"] == [
        {**sm.list_endpoints()["Endpoints"][0], "EndpointName": summary["served_by"]}], "only production is left"
    assert not [c for c in sm.list_endpoint_configs()["EndpointConfigs"] if "-cand-" in c["EndpointConfigName"]]
    assert not [m for m in sm.list_models()["Models"]
                if "-cand-" in m["ModelName"]], "the candidate went with its model"
    component = sm.describe_inference_component(InferenceComponentName=summary["component"])
    assert component["InferenceComponentStatus"] == "InService" and component["EndpointName"] == summary["served_by"]
    model = sm.describe_model(ModelName=component["Specification"]["ModelName"])
    assert model["EnableNetworkIsolation"] is True and model["PrimaryContainer"]["ModelDataUrl"].startswith("s3://shiplift-test-artifacts/")
    assert model["PrimaryContainer"]["Environment"]["SEMIF_MAX_TOKENS"] == "2048"
    answer = aws.client("sagemaker-runtime").invoke_endpoint(
        EndpointName=summary["served_by"], InferenceComponentName=summary["component"], ContentType="application/json",
        Body=json.dumps({"decision": DECISION}))
    result = json.loads(answer["Body"].read())["result"]
    assert result["option_ids"] == ["no", "yes"] and abs(sum(result["probabilities"]) - 1) < 1e-6

    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    state = ReleaseState.load(ledger, summary["release_id"])
    assert state.result("deploy_candidate").placement["instance_type"] == "ml.g6.2xlarge", \
        "placement obtained is in the ledger"
    assert state.result("package").artifact_uri.startswith("s3://shiplift-test-artifacts/shiplift/artifacts/sha256/")
    assert set(state.result("validate").evidence) == {"gate-report.json", "predictions.jsonl", "report.html"}
    assert ledger.verify().ok
    [package] = sm.list_model_packages(ModelPackageGroupName="shiplift-tiny-aws")["ModelPackageSummaryList"]
    assert package["ModelApprovalStatus"] == "Approved", \
        "the Model Registry's version of the release follows its promotion"

    mutating = len([c for c in aws.calls if c.mutating])
    assert run_release(config, progress=QUIET) == summary, "a rerun of a finished release changes nothing"
    assert len([c for c in aws.calls if c.mutating]) == mutating


# ~17 s: make test-slow; make test gates a second release against its champion locally (tests/e2e/test_release_local.py)
@pytest.mark.slow
def test_a_second_release_updates_the_production_component_and_is_gated_against_the_champion(
        aws, aws_calls, aws_release, tiny_release, tmp_path):
    """Not documented for inference components: that an update without DeploymentConfig starts every new copy beside the
    old ones, and that ManagedInstanceScaling adds instances for them (the double's capacity, docs/aws-double.md)."""
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    first = run_release(config, progress=QUIET)
    second = run_release(config, overrides=("calibration.fit_temperature=true",), progress=QUIET)
    assert (first["status"], second["status"]) == ("promoted", "promoted")
    report = json.loads(Path(second["report"]).with_name("gate-report.json").read_text())
    assert report["extra"]["champion"]["endpoint"] == first["served_by"], "scored against the live champion"
    assert [c.params["InferenceComponentName"] for c in aws.calls
            if c.operation == "UpdateInferenceComponent"] == [second["component"]]
    builds = [call for call in aws_calls if call[1] == "StartBuild"]
    assert len(builds) == 1, "the second release reused the image built from the same content"
    live = aws.client("sagemaker").describe_inference_component(InferenceComponentName=second["component"])
    model = aws.client("sagemaker").describe_model(ModelName=live["Specification"]["ModelName"])
    assert second["artifact_sha256"] in model["PrimaryContainer"]["ModelDataUrl"]

    from shiplift.tasks.errors import Conflict
    from shiplift.tasks.pipeline.audit import audit

    state_dir = str(tmp_path / "state")
    assert audit(state_dir)["models"]["tiny-aws"]["live"]["release_id"] == second["release_id"], \
        "read through SageMaker"
    first_model = next(c.params["ModelName"] for c in aws.calls if c.operation == "CreateModel"
                       and first["artifact_sha256"] in c.params["PrimaryContainer"]["ModelDataUrl"]
                       and "-cand-" not in c.params["ModelName"])
    aws.client("sagemaker").update_inference_component(  # someone puts the first model back behind the ledger's back
        InferenceComponentName=second["component"],
        Specification={"ModelName": first_model,
                       "ComputeResourceRequirements": live["Specification"]["ComputeResourceRequirements"]},
        RuntimeConfig={"CopyCount": live["RuntimeConfig"]["DesiredCopyCount"]})
    deadline = time.monotonic() + 30
    while aws.client("sagemaker").describe_inference_component(
            InferenceComponentName=second["component"])["InferenceComponentStatus"] != "InService":
        assert time.monotonic() < deadline, "the manual update did not end"
        time.sleep(0.05)
    with pytest.raises(Conflict) as drift:
        audit(state_dir)
    message = str(drift.value)
    assert f"serves release_id '{first['release_id']}', the ledger" in message
    assert f"'{second['release_id']}'" in message
    assert f"serves artifact_sha256 '{first['artifact_sha256']}'" in message


def test_an_update_that_ends_in_service_on_the_old_spec_is_a_failed_promotion(aws, aws_release, tiny_release, tmp_path):
    """Not documented by AWS: how a failed or rolled-back update shows (the double: InService on the old spec,
    docs/aws-double.md); shiplift never reads success from the status alone."""
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    first = run_release(config, progress=QUIET)
    aws.scenario(roll_back_updates=True)
    try:
        run_release(config, overrides=("calibration.fit_temperature=true",), progress=QUIET)
        raise AssertionError("a rolled-back update was reported as a promotion")
    except Exception as exc:  # noqa: BLE001 - the domain error is asserted below
        assert type(exc).__name__ == "Conflict" and "does not serve the candidate" in str(exc)
        assert "artifact_sha256" in str(exc)
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    assert ledger.served_at("tiny-aws",
                            "2100-01-01T00:00:00Z").release_id == first["release_id"], "the champion still serves"
    failed = [r for r in ledger.history("tiny-aws") if r.stage == "promote" and r.event == "failed"]
    assert failed and "does not serve the candidate" in failed[-1].payload["error"]


def test_encoder_release_on_mig_partitions(aws, aws_release, tmp_path):
    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_checkpoint
    from shiplift.tasks.hashing import sha256_tree

    aws.client("s3").create_bucket(Bucket=aws_release.BUCKET)
    aws.client("ecr").create_repository(repositoryName="shiplift/encoder", imageTagMutability="IMMUTABLE")
    checkpoint = write_tiny_checkpoint(tmp_path / "checkpoint", seed=0)
    tree = yaml.safe_load((ROOT / "configs/releases/mdeberta-nli.yaml").read_text())
    tree["name"] = "tiny-mig"
    tree["artifact"] = {"kind": "onnx",
                        "source": {"kind": "path", "path": str(checkpoint), "sha256": sha256_tree(checkpoint)},
                        "int8": False}
    tree["calibration"]["fit_temperature"] = False
    tree["validation"]["thresholds"] = {"min_accuracy": 0.0, "min_macro_f1": 0.0, "min_class_recall": 0.0,
                                        "max_ece": 1.0}
    tree["validation"]["n_bootstrap"] = 200
    tree["backend"].update(bucket=aws_release.BUCKET, ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
                           state_dir=str(tmp_path / "state"), poll_s=0.05)
    config = tmp_path / "tiny-mig.yaml"
    config.write_text(yaml.safe_dump(tree))
    summary = run_release(config, progress=QUIET)
    assert summary["status"] == "promoted", summary
    # the layout (7 x mig-1g.10gb) is carved on every GPU of every instance: 1 H100 x 1 instance of ml.p5.4xlarge
    assert summary["placement"] == {**summary["placement"], "kind": "mig_partition", "partition_type": "mig-1g.10gb",
                                    "partitions": 7}
    creates = [c.params for c in aws.calls if c.operation == "CreateInferenceComponent"]
    assert [c["RuntimeConfig"]["CopyCount"] for c in creates] == [1, 2], \
        "candidate: one copy; production: rollout.copies, a partition each"
    for create in creates:
        requirements = create["Specification"]["ComputeResourceRequirements"]
        assert requirements["AcceleratorPartitionType"] == "mig-1g.10gb"
        assert requirements["NumberOfAcceleratorDevicesRequired"] == 1
    configs = [c.params for c in aws.calls if c.operation == "CreateEndpointConfig"]
    for sent in configs:
        variant = sent["ProductionVariants"][0]
        assert "ModelName" not in variant and sent["ExecutionRoleArn"].endswith("role/shiplift-sagemaker-execution")
        assert variant["AcceleratorPartitionLayouts"] == [{"AcceleratorPartitionTypes": ["mig-1g.10gb"] * 7}]
    pairs = {"pairs": [{"premise": "The order shipped on May 3.", "hypothesis": "The order shipped."}]}
    answer = aws.client("sagemaker-runtime").invoke_endpoint(EndpointName=summary["served_by"],
                                                             InferenceComponentName=summary["component"],
                                                             ContentType="application/json", Body=json.dumps(pairs))
    assert set(json.loads(answer["Body"].read())["results"][0]["probabilities"]) == {"entailment", "neutral",
                                                                                     "contradiction"}


def test_a_dropped_partition_layout_is_refused_before_any_endpoint(aws, aws_release, tmp_path, tiny_release):
    aws_release.prepare_account(aws)
    aws.scenario(drop_partition_layouts=True)
    placement = {"kind": "mig_partition", "instance_type": "ml.p5.48xlarge", "partition_type": "mig-1g.10gb",
                 "partitions": 1, "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", placement=placement)
    try:
        run_release(config, progress=QUIET)
        raise AssertionError("a dropped layout went unnoticed")
    except Exception as exc:  # noqa: BLE001
        assert type(exc).__name__ == "IntegrityError" and "the partition layout was dropped" in str(exc)
    assert not [c for c in aws.calls if c.operation == "CreateEndpoint"]


def test_killed_after_create_endpoint_then_rerun_finds_it_by_name(aws, aws_release, tiny_release, tmp_path):
    """SIGKILL `shiplift stage deploy_candidate` right after CreateEndpoint went out, then run it again."""
    aws_release.prepare_account(aws)
    aws.scenario(polls_before_ready=40)  # the endpoint stays Creating while the stage is killed
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    begun = begin_orchestrated(config, holder="test", progress=QUIET)
    for stage in ("resolve", "build", "package", "image"):
        run_orchestrated_stage(begun["release_id"], stage, ledger_url=begun["ledger_url"], progress=QUIET)
    command = [sys.executable, "-m", "shiplift.tasks.cli.main", "stage", "deploy_candidate", "--release",
               begun["release_id"],
               "--ledger-url", begun["ledger_url"]]
    victim = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not sagemaker_names(aws, "CreateEndpoint"):
        time.sleep(0.02)
    assert victim.poll() is None, "the stage finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    aws.scenario(polls_before_ready=1)
    result = run_orchestrated_stage(begun["release_id"], "deploy_candidate", ledger_url=begun["ledger_url"],
                                    progress=QUIET)
    assert sagemaker_names(aws,
                           "CreateEndpoint") == [result["endpoint"]], "one CreateEndpoint in all: the rerun found it"
    assert len(sagemaker_names(aws, "CreateModel")) == 1 and len(sagemaker_names(aws, "CreateEndpointConfig")) == 1
    ledger = Ledger(begun["ledger_url"])
    assert [r.event for r in ledger.release(begun["release_id"])
            if r.stage == "deploy_candidate"] == ["started", "started", "succeeded"]
    run_orchestrated_stage(begun["release_id"], "teardown_candidate", ledger_url=begun["ledger_url"], progress=QUIET)
    assert aws.client("sagemaker").list_endpoints()["Endpoints"] == []


def collapsed(calls: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive repeats folded into one (a wait polls its describe several times; the dry run prints it once)."""
    return [call for index, call in enumerate(calls) if index == 0 or calls[index - 1] != call]


def test_the_dry_run_sends_what_the_release_sends(aws, aws_calls, aws_release, tiny_release, tmp_path):
    """The dry run's STS, SageMaker, CodeBuild and ECR requests are the ones a real first release sends, in order
    (S3 differs only in single-part vs multipart uploads; InvokeEndpoint is counted apart)."""
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.orchestrators.dry_run import plan_release

    aws_release.prepare_account(aws)
    config_path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    config = load_release_config(config_path)
    planned = plan_release(config, config_path=config_path)
    # the dry run goes through the backend's own calls
    dry = [(service, operation) for service, operation, _ in aws_calls]
    assert dry == [(r.service, r.operation) for r in planned
                   if r.service != "sagemaker-runtime"], "every request is printed"
    aws_calls.clear()
    assert run_release(config_path, progress=QUIET)["status"] == "promoted"
    kept = ("sts", "sagemaker", "codebuild", "ecr")
    sent = collapsed([(service, operation) for service, operation, _ in aws_calls if service in kept])
    assert sent == collapsed([(r.service, r.operation) for r in planned if r.service in kept])
    production = lambda calls: sorted({name for name in calls if name and "-cand-" not in name})  # noqa: E731
    assert production(params.get("EndpointName") for _, _, params in aws_calls) == production(
        r.params.get("EndpointName")
        for r in planned) == ["shiplift-tiny-aws-prod"], "names not derived from placeholders agree"
    assert release_id_for(config) in json.dumps([r.to_json() for r in planned])
