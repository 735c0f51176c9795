"""SageMaker hosting and CodeBuild images, stage by stage and call by call against the AWS double: retries after a
failed endpoint or component (production's is updated again, never deleted), an endpoint config SageMaker does not see
yet, a component still Creating, a build already running, a production placement that changed, metrics from
CloudWatch, names that follow the config."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from shiplift.tasks.backends.aws import hosting_deploy
from shiplift.tasks.cli.demo import shared_decisions
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import BadInput, Conflict, DeployFailed, NotReady
from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage, run_release
from shiplift.tasks.pipeline.stages.common import candidate_name, production_component, production_endpoint

QUIET = lambda message: None  # noqa: E731
WAIT_S = 30.0
MIG = {"kind": "mig_partition", "instance_type": "ml.p4d.24xlarge", "partition_type": "mig-1g.10gb", "partitions": 2,
       "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}


def opened(aws_release, tiny_release, tmp_path, **changes):
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", **changes)
    begun = begin_orchestrated(config, holder="test", progress=QUIET)

    def run(stage):
        return run_orchestrated_stage(begun["release_id"], stage, ledger_url=begun["ledger_url"], progress=QUIET)

    return config, run


class Hosted:
    """The aws backend of a tiny release against the double, its image built, and specs of tiny GGUFs by seed (the
    way the stages build them)."""

    def __init__(self, aws, aws_release, tiny_release, tmp_path, **changes):
        from shiplift.tasks.backends.registry import make_backends

        aws_release.prepare_account(aws)
        self.config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "configs",
                                                                      tmp_path / "state", **changes))
        self.backends, self.folder = make_backends(self.config), tmp_path / "models"
        self.hosting, self.image = self.backends.hosting, self.backends.images.build(self.config.image, progress=QUIET)
        self.endpoint, self.component = production_endpoint(self.config), production_component(self.config)

    def spec(self, seed: int, *, copies: int = 1):
        from shiplift.tasks.artifacts.packaging import package_gguf
        from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
        from shiplift.tasks.backends.interfaces import ComponentSpec, ModelRef
        from shiplift.tasks.pipeline.stages.common import compute

        gguf = write_tiny_gguf(self.folder / f"seed{seed}" / "tiny.gguf", seed=seed)
        packaged = package_gguf(gguf, self.folder / f"seed{seed}" / "package", manifest={"seed": seed})
        stored = self.backends.store.put_file(packaged.path, name="model.tar.gz", progress=QUIET)
        return ComponentSpec(image_uri=self.image.uri, artifact_uri=stored.uri, artifact_sha256=stored.sha256,
                             environment=self.config.image.container_env(), copies=copies,
                             compute=compute(self.config, 1024),
                             model_ref=ModelRef(release_id=f"release-seed{seed}", artifact_sha256=stored.sha256,
                                                image_digest=self.image.digest))

    def candidate(self, spec) -> str:
        return candidate_name(self.config, spec.artifact_sha256, self.image.digest)


def component_requests(double, component: str) -> list[str]:
    """The mutating SageMaker requests on one inference component that reached the double, in order."""
    return [c.operation for c in double.calls if c.mutating and c.params.get("InferenceComponentName") == component]


def status_of(double, component: str) -> dict:
    return double.client("sagemaker").describe_inference_component(InferenceComponentName=component)


def test_a_retry_replaces_the_endpoint_an_earlier_attempt_left_failed(aws, aws_calls, aws_release, tiny_release,
                                                                      tmp_path):
    aws_release.prepare_account(aws)
    _, run = opened(aws_release, tiny_release, tmp_path)
    for stage in ("resolve", "build", "package", "image"):
        run(stage)
    aws.scenario(fail_next_endpoint_with="The primary container for production variant did not pass the ping health "
                                         "check.")
    with pytest.raises(DeployFailed, match="did not pass the ping health check"):
        run("deploy_candidate")
    deployed = run("deploy_candidate")  # what Airflow's retry does
    operations = [(op, params.get("EndpointName")) for _, op, params in aws_calls
                  if op in ("CreateEndpoint", "DeleteEndpoint")]
    assert operations == [("CreateEndpoint", deployed["endpoint"]), ("DeleteEndpoint", deployed["endpoint"]),
                          ("CreateEndpoint",
                           deployed["endpoint"])], "the Failed endpoint was deleted, then created again"
    assert aws.client("sagemaker").describe_endpoint(EndpointName=deployed["endpoint"])["EndpointStatus"] == "InService"
    run("teardown_candidate")


def test_a_build_of_the_same_content_already_running_is_waited_for_not_started_again(aws, aws_calls, aws_release,
                                                                                     tiny_release, tmp_path):
    from shiplift.tasks.backends.aws.image_builder import image_tag, source_zip
    from shiplift.tasks.backends.image_source import pin_image_source
    from shiplift.tasks.backends.registry import make_backends

    aws_release.prepare_account(aws)
    config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state"))
    images = make_backends(config).images
    local = pin_image_source("semif", config.image.base_image)
    tag = image_tag("semif", "cuda", local.digest)
    data = source_zip("semif")
    aws.client("s3").put_object(Bucket=aws_release.BUCKET, Key=images.source_key(data), Body=data)
    aws.client("codebuild").create_project(**{k: v for k, v in images.project_request().items()
                                              if k != "encryptionKey"})
    aws.scenario(build_polls_in_progress=2)
    aws.client("codebuild").start_build(**images.build_request("semif", tag, "cuda", config.image.base_image,
                                                               images.source_key(data)))
    assert not aws.client("ecr").describe_images(repositoryName=aws_release.REPOSITORY)["imageDetails"], \
        "not pushed while it runs"
    ref = images.build(config.image, progress=QUIET)  # an attempt that died after StartBuild, retried
    assert ref.uri.endswith(ref.digest) and tag in aws.client("ecr").describe_images(
        repositoryName=aws_release.REPOSITORY, imageIds=[{"imageDigest": ref.digest}])["imageDetails"][0]["imageTags"]
    assert [op for _, op, _ in aws_calls if op == "StartBuild"] == [], "the running build was waited for"
    assert "ListBuildsForProject" in [op for _, op, _ in aws_calls]


def test_production_on_a_changed_placement_is_refused_not_ignored(aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    first = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    assert run_release(first, progress=QUIET)["status"] == "promoted"
    moved = {"kind": "instance_type", "instance_type": "ml.g5.2xlarge", "max_instance_count": 2,
             "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}
    second = aws_release.write_aws_config(tiny_release, tmp_path / "configs-2", tmp_path / "state", placement=moved)
    with pytest.raises(Conflict, match="its placement changed"):
        run_release(second, progress=QUIET)
    component = aws.client("sagemaker").describe_inference_component(InferenceComponentName="shiplift-tiny-aws")
    assert component["InferenceComponentStatus"] == "InService", "the champion still serves"


def test_component_metrics_come_from_cloudwatch_over_a_whole_minute_window(aws, aws_release, tiny_release, tmp_path):
    from shiplift.tasks.backends.registry import make_backends

    aws_release.prepare_account(aws)
    path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    summary = run_release(path, progress=QUIET)
    now = dt.datetime.now(dt.UTC)
    dimension = [{"Name": "InferenceComponentName", "Value": summary["component"]}]
    aws.client("cloudwatch").put_metric_data(Namespace="AWS/SageMaker", MetricData=[
        {"MetricName": "Invocations", "Dimensions": dimension, "Value": 5, "Timestamp": now},
        {"MetricName": "Invocation5XXErrors", "Dimensions": dimension, "Value": 1, "Timestamp": now},
        {"MetricName": "ModelLatency", "Dimensions": dimension, "Value": 120000, "Timestamp": now,
         "Unit": "Microseconds"},
    ])
    metrics = make_backends(load_release_config(path)).metrics
    counted = metrics.component_metrics(summary["served_by"], summary["component"], window_s=90)
    assert (counted.invocations, counted.errors_5xx, counted.model_errors) == (5, 1, 0)
    assert counted.latency_p99_ms == pytest.approx(120.0), "ModelLatency is reported in microseconds"
    with pytest.raises(BadInput, match="60..86400"):
        metrics.component_metrics(summary["served_by"], summary["component"], window_s=5)


def test_candidate_names_follow_the_config_not_only_the_artifact(aws_release, tiny_release, tmp_path):
    one = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "a", tmp_path / "state"))
    other = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "a", tmp_path / "state",
                                                             image__threads=1))
    where = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "a", tmp_path / "elsewhere"))
    assert where.backend.state_dir != one.backend.state_dir and where.backend.ledger_url != one.backend.ledger_url
    artifact, digest = "a" * 64, "sha256:" + "b" * 64
    assert candidate_name(one, artifact, digest) != candidate_name(other, artifact, digest)
    assert candidate_name(one, artifact, digest) == candidate_name(where, artifact, digest), "not where state lives"
    assert len(candidate_name(one, artifact, digest)) <= 63


def test_a_failed_production_component_is_updated_again_and_never_deleted(aws, aws_release, tiny_release, tmp_path):
    """Not documented by AWS: a failed update leaves the component Failed with its old copies serving (the double's
    assumption, docs/aws-double.md); the code is safe either way, since it never deletes production."""
    hosted = Hosted(aws, aws_release, tiny_release, tmp_path)
    endpoint, component, placement = hosted.endpoint, hosted.component, hosted.config.placement
    champion, candidate = hosted.spec(3), hosted.spec(4)
    hosted.hosting.deploy(endpoint, component, champion, placement, role="production", progress=QUIET)
    reason = "The inference component's new copies did not pass the ping health check."
    aws.scenario(fail_next_component_with=reason)  # the update fails; the champion's copy keeps serving

    with pytest.raises(DeployFailed) as caught:
        hosted.hosting.deploy(endpoint, component, candidate, placement, role="production", progress=QUIET)
    assert reason in str(caught.value) and "keeps 1 copies of its previous model serving" in str(caught.value)
    failed = status_of(aws, component)
    assert (failed["InferenceComponentStatus"], failed["RuntimeConfig"]["CurrentCopyCount"]) == ("Failed", 1)
    answer = aws.client("sagemaker-runtime").invoke_endpoint(EndpointName=endpoint, InferenceComponentName=component,
                                                               ContentType="application/json", Body=shared_decisions())
    assert answer["Body"].read(), "the Failed component's copy of the champion still answers"

    said: list[str] = []
    # the rerun
    live = hosted.hosting.deploy(endpoint, component, candidate, placement, role="production", progress=said.append)
    assert live.status == "InService" and live.model_ref == candidate.model_ref
    assert component_requests(aws, component) == ["CreateInferenceComponent", "UpdateInferenceComponent",
                                                  "UpdateInferenceComponent"], "updated again, never deleted"
    assert any("is Failed" in m and "updating it again" in m and "not deleted" in m for m in said), said


def test_a_failed_candidate_component_without_copies_is_deleted_and_created_again(aws, aws_release, tiny_release,
                                                                                  tmp_path):
    hosted = Hosted(aws, aws_release, tiny_release, tmp_path, placement=MIG)  # a MIG candidate runs as a component
    spec = hosted.spec(3)
    name = hosted.candidate(spec)
    aws.scenario(fail_next_component_with="The inference component's copies did not pass the ping health check.")
    with pytest.raises(DeployFailed, match="did not pass the ping health check"):
        hosted.hosting.deploy(name, name, spec, hosted.config.placement, role="candidate", progress=QUIET)
    assert status_of(aws, name)["RuntimeConfig"]["CurrentCopyCount"] == 0

    live = hosted.hosting.deploy(name, name, spec, hosted.config.placement, role="candidate", progress=QUIET)
    assert live.status == "InService" and live.model_ref == spec.model_ref
    assert component_requests(aws, name) == ["CreateInferenceComponent", "DeleteInferenceComponent",
                                             "CreateInferenceComponent"]


def test_create_endpoint_is_retried_while_sagemaker_does_not_see_the_new_endpoint_config(aws, aws_calls, aws_release,
                                                                                        tiny_release, tmp_path):
    hosted = Hosted(aws, aws_release, tiny_release, tmp_path)
    spec = hosted.spec(3)
    name = hosted.candidate(spec)
    aws.scenario(endpoint_config_unseen=2)  # "Could not find endpoint configuration", twice, right after its creation
    said: list[str] = []

    live = hosted.hosting.deploy(name, name, spec, hosted.config.placement, role="candidate", progress=said.append)
    assert live.status == "InService" and live.model_ref == spec.model_ref
    assert [c.operation for c in aws.calls if c.operation in ("CreateEndpointConfig", "CreateEndpoint")] == \
        ["CreateEndpointConfig", "CreateEndpoint", "CreateEndpoint", "CreateEndpoint"]
    assert [op for _, op, _ in aws_calls].count("CreateEndpoint") == 3, "shiplift's own retries, not botocore's"
    assert len([m for m in said if "is not visible to SageMaker yet" in m]) == 2
    assert aws.scenario().endpoint_config_unseen == 0


def test_an_endpoint_config_that_stays_unseen_is_not_ready_after_a_deadline(aws, aws_release, tiny_release, tmp_path,
                                                                           monkeypatch):
    hosted = Hosted(aws, aws_release, tiny_release, tmp_path)
    spec = hosted.spec(3)
    name = hosted.candidate(spec)
    monkeypatch.setattr(hosting_deploy, "CONFIG_VISIBLE_S", 0.5)
    aws.scenario(endpoint_config_unseen=1000)
    with pytest.raises(NotReady) as caught:
        hosted.hosting.deploy(name, name, spec, hosted.config.placement, role="candidate", progress=QUIET)
    assert caught.value.retryable and "still does not find endpoint config" in str(caught.value)
    assert "Could not find endpoint configuration" in str(caught.value) and "rerun the stage" in caught.value.fix
    sent = len([c for c in aws.calls if c.operation == "CreateEndpoint"])
    assert 2 <= sent < 20, f"{sent} CreateEndpoint requests in 0.5 s: retried with backoff, bounded"
    assert aws.client("sagemaker").list_endpoints()["Endpoints"] == []


def test_a_rollout_waits_for_a_component_still_creating_before_it_updates_it(aws, aws_release, tiny_release, tmp_path,
                                                                            monkeypatch):
    """Not stated on API_UpdateInferenceComponent: that SageMaker refuses to update a component Creating or Updating
    (the issue reports it; the double refuses it, docs/aws-double.md); waiting first is right either way."""
    from shiplift.tasks.backends.interfaces import BakeAlarms, RolloutPlan

    hosted = Hosted(aws, aws_release, tiny_release, tmp_path)
    endpoint, component, placement = hosted.endpoint, hosted.component, hosted.config.placement
    plan = RolloutPlan(strategy="canary", batch_copies=1, wait_interval_s=0, max_execution_s=600,
                       alarms=BakeAlarms(check_interval_s=0.2))
    # a batch of 1 is 50 % of 2, SageMaker's most
    champion, candidate = hosted.spec(3, copies=2), hosted.spec(4, copies=2)
    # promote's first attempt creates production and runs out of time while the component is still Creating
    aws.scenario(polls_before_ready=40)
    monkeypatch.setattr(hosting_deploy, "COMPONENT_WAIT_S", 0.3)
    with pytest.raises(NotReady, match=f"inference component {component} is still Creating"):
        hosted.hosting.roll_out(endpoint, component, champion, placement, plan, lambda step: None, progress=QUIET)
    aws.scenario(polls_before_ready=1)
    assert status_of(aws, component)["InferenceComponentStatus"] == "Creating"

    said: list[str] = []
    started = time.monotonic()
    result = hosted.hosting.roll_out(endpoint, component, candidate, placement, plan, lambda step: None,
                                     progress=said.append)
    assert time.monotonic() - started < WAIT_S
    assert result.status == "succeeded", result
    assert any(f"{component} is Creating" in m and "waiting for it to end" in m for m in said), said
    assert component_requests(aws, component) == ["CreateInferenceComponent", "UpdateInferenceComponent"], \
        "one update, sent once the component was InService (SageMaker refuses one while it is Creating)"
    live = status_of(aws, component)
    assert live["InferenceComponentStatus"] == "InService"
    assert live["Specification"]["ModelName"] == hosted.hosting.model_request(component, candidate,
                                                                              endpoint)["ModelName"]
