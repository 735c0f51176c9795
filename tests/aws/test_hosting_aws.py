"""SageMaker hosting and CodeBuild images, stage by stage against the AWS double: retries after a failed endpoint, a
build already running, a production placement that changed, metrics from CloudWatch, names that follow the config."""

from __future__ import annotations

import datetime as dt

import pytest

from tasks.config import load_release_config
from tasks.errors import BadInput, Conflict, DeployFailed
from tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage, run_release
from tasks.pipeline.stages.common import candidate_name

QUIET = lambda message: None  # noqa: E731


def opened(aws_release, tiny_release, tmp_path, **changes):
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", **changes)
    begun = begin_orchestrated(config, holder="test", progress=QUIET)
    run = lambda stage: run_orchestrated_stage(begun["release_id"], stage, ledger_url=begun["ledger_url"], progress=QUIET)  # noqa: E731
    return config, run


def test_a_retry_replaces_the_endpoint_an_earlier_attempt_left_failed(aws, aws_calls, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    _, run = opened(aws_release, tiny_release, tmp_path)
    for stage in ("resolve", "build", "package", "image"):
        run(stage)
    aws.scenario(fail_next_endpoint_with="The primary container for production variant did not pass the ping health check.")
    with pytest.raises(DeployFailed, match="did not pass the ping health check"):
        run("deploy_candidate")
    deployed = run("deploy_candidate")  # what Airflow's retry does
    operations = [(op, params.get("EndpointName")) for _, op, params in aws_calls if op in ("CreateEndpoint", "DeleteEndpoint")]
    assert operations == [("CreateEndpoint", deployed["endpoint"]), ("DeleteEndpoint", deployed["endpoint"]),
                          ("CreateEndpoint", deployed["endpoint"])], "the Failed endpoint was deleted, then created again"
    assert aws.client("sagemaker").describe_endpoint(EndpointName=deployed["endpoint"])["EndpointStatus"] == "InService"
    run("teardown_candidate")


def test_a_build_of_the_same_content_already_running_is_waited_for_not_started_again(aws, aws_calls, aws_release, tiny_release,
                                                                                   tmp_path):
    from tasks.backends.aws.image_builder import image_tag, source_zip
    from tasks.backends.registry import make_backends
    from tasks.backends.local.process_image import build_local_image

    aws_release.prepare_account(aws)
    config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state"))
    images = make_backends(config).images
    local = build_local_image("semif", config.image.base_image)
    tag = image_tag("semif", "cuda", local.digest)
    data = source_zip("semif")
    aws.client("s3").put_object(Bucket=aws_release.BUCKET, Key=images.source_key(data), Body=data)
    aws.client("codebuild").create_project(**{k: v for k, v in images.project_request().items() if k != "encryptionKey"})
    aws.scenario(build_polls_in_progress=2)
    aws.client("codebuild").start_build(**images.build_request("semif", tag, "cuda", config.image.base_image, images.source_key(data)))
    assert not aws.client("ecr").describe_images(repositoryName=aws_release.REPOSITORY)["imageDetails"], "not pushed while it runs"
    ref = images.build(config.image, progress=QUIET)  # an attempt that died after StartBuild, retried
    assert ref.uri.endswith(ref.digest) and tag in aws.client("ecr").describe_images(
        repositoryName=aws_release.REPOSITORY, imageIds=[{"imageDigest": ref.digest}])["imageDetails"][0]["imageTags"]
    assert [op for _, op, _ in aws_calls if op == "StartBuild"] == [], "the running build was waited for"
    assert "ListBuildsForProject" in [op for _, op, _ in aws_calls]


def test_production_on_a_changed_placement_is_refused_not_ignored(aws, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    first = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    assert run_release(first, progress=QUIET)["status"] == "promoted"
    moved = {"kind": "instance_type", "instance_type": "ml.g5.2xlarge", "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}
    second = aws_release.write_aws_config(tiny_release, tmp_path / "configs-2", tmp_path / "state", placement=moved)
    with pytest.raises(Conflict, match="its placement changed"):
        run_release(second, progress=QUIET)
    component = aws.client("sagemaker").describe_inference_component(InferenceComponentName="shiplift-tiny-aws")
    assert component["InferenceComponentStatus"] == "InService", "the champion still serves"


def test_component_metrics_come_from_cloudwatch_over_a_whole_minute_window(aws, aws_release, tiny_release, tmp_path):
    from tasks.backends.registry import make_backends

    aws_release.prepare_account(aws)
    path = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    summary = run_release(path, progress=QUIET)
    now = dt.datetime.now(dt.timezone.utc)
    dimension = [{"Name": "InferenceComponentName", "Value": summary["component"]}]
    aws.client("cloudwatch").put_metric_data(Namespace="AWS/SageMaker", MetricData=[
        {"MetricName": "Invocations", "Dimensions": dimension, "Value": 5, "Timestamp": now},
        {"MetricName": "Invocation5XXErrors", "Dimensions": dimension, "Value": 1, "Timestamp": now},
        {"MetricName": "ModelLatency", "Dimensions": dimension, "Value": 120000, "Timestamp": now, "Unit": "Microseconds"},
    ])
    metrics = make_backends(load_release_config(path)).metrics
    counted = metrics.component_metrics(summary["served_by"], summary["component"], window_s=90)
    assert (counted.invocations, counted.errors_5xx, counted.model_errors) == (5, 1, 0)
    assert counted.latency_p99_ms == pytest.approx(120.0), "ModelLatency is reported in microseconds"
    with pytest.raises(BadInput, match="60..86400"):
        metrics.component_metrics(summary["served_by"], summary["component"], window_s=5)


def test_candidate_names_follow_the_config_not_only_the_artifact(aws_release, tiny_release, tmp_path):
    one = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "a", tmp_path / "state"))
    other = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "a", tmp_path / "state", image__threads=1))
    where = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "a", tmp_path / "elsewhere"))
    assert where.backend.state_dir != one.backend.state_dir and where.backend.ledger_url != one.backend.ledger_url
    artifact, digest = "a" * 64, "sha256:" + "b" * 64
    assert candidate_name(one, artifact, digest) != candidate_name(other, artifact, digest)
    assert candidate_name(one, artifact, digest) == candidate_name(where, artifact, digest), "not where state lives"
    assert len(candidate_name(one, artifact, digest)) <= 63
