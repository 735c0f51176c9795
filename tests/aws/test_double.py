"""The AWS double itself: it must refuse what SageMaker refuses, move through SageMaker's statuses, and serve real
model answers, or the aws backend's tests prove nothing."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
import urllib.request
import zipfile
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from botocore.validate import ParamValidator

from shiplift.tasks.artifacts.packaging import package_gguf, package_model_dir
from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.backends.aws.service_model import service_model

ROOT = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/shiplift-sagemaker"
BUCKET = "shiplift-test-artifacts"
MISSING_IMAGE = f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/shiplift-semif@sha256:{'0' * 64}"
SEMIF_ENV = {"SEMIF_MAX_TOKENS": "2048", "SEMIF_MAX_REQUEST_TOKENS": "1536"}
DECISION = {"decision": {"id": "q", "state": "The sky is blue.", "question": "Is the sky blue?",
                         "options": [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]}}
WAIT_S = 30.0
# one H100: 2 partitions
MIG_VARIANT = {"VariantName": "AllTraffic", "InstanceType": "ml.p5.4xlarge", "InitialInstanceCount": 1,
               "AcceleratorPartitionLayouts": [{"AcceleratorPartitionTypes": ["mig-1g.10gb", "mig-1g.10gb"]}]}
MIG_REQUIREMENTS = {"MinMemoryRequiredInMb": 1024, "NumberOfAcceleratorDevicesRequired": 1,
                    "AcceleratorPartitionType": "mig-1g.10gb"}


# ---- helpers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def semif_archive(tmp_path_factory) -> Path:
    """A tiny GGUF (seed 3) packaged as model.tar.gz, built once for the module."""
    folder = tmp_path_factory.mktemp("semif-model")
    gguf = write_tiny_gguf(folder / "tiny.gguf", seed=3)
    return package_gguf(gguf, folder / "package", manifest={"source": "tinymodel seed 3"}).path


@pytest.fixture(scope="module")
def encoder_archive(tmp_path_factory) -> Path:
    """The tiny random NLI encoder (seed 0, fp32 ONNX) packaged as model.tar.gz, built once for the module."""
    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_onnx_model_dir

    folder = tmp_path_factory.mktemp("encoder-model")
    model_dir = write_tiny_onnx_model_dir(folder / "model", seed=0, int8=False)
    return package_model_dir(model_dir, folder / "package", manifest={"source": "tinyencoder seed 0"},
                             model_file="model.onnx").path


def images_zip(skip: str = "") -> bytes:
    """The repository's images/ folder zipped as a repository-root source (`skip` leaves one file out)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path in sorted((ROOT / "images").rglob("*")):
            name = path.relative_to(ROOT).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and name != skip:
                archive.write(path, name)
    return buffer.getvalue()


def ensure_bucket(aws) -> None:
    """The test bucket, created on first use after a reset."""
    s3 = aws.client("s3")
    if BUCKET not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=BUCKET)


def start_build(aws, source: bytes, kind: str = "semif", tag: str = "t1") -> str:
    """Upload a source zip and start a CodeBuild build of `kind` the way the product does; the build id."""
    ensure_bucket(aws)
    s3, ecr, codebuild = aws.client("s3"), aws.client("ecr"), aws.client("codebuild")
    s3.put_object(Bucket=BUCKET, Key=f"sources/{kind}-{tag}.zip", Body=source)
    repositories = {r["repositoryName"]: r["repositoryUri"] for r in ecr.describe_repositories()["repositories"]}
    uri = (repositories.get(f"shiplift-{kind}")
           or ecr.create_repository(repositoryName=f"shiplift-{kind}")["repository"]["repositoryUri"])
    if f"shiplift-{kind}" not in codebuild.list_projects()["projects"]:
        codebuild.create_project(
            name=f"shiplift-{kind}", source={"type": "S3", "location": f"{BUCKET}/sources/none.zip"},
            artifacts={"type": "S3", "location": BUCKET},
            environment={"type": "LINUX_CONTAINER", "image": "aws/codebuild/standard:7.0",
                         "computeType": "BUILD_GENERAL1_SMALL", "privilegedMode": True},
            serviceRole=f"arn:aws:iam::{ACCOUNT}:role/shiplift-codebuild",
        )
    variables = {"IMAGE_NAME": kind, "IMAGE_TAG": tag, "VARIANT": "cpu", "ECR_REPOSITORY_URI": uri}
    return codebuild.start_build(
        projectName=f"shiplift-{kind}", sourceLocationOverride=f"{BUCKET}/sources/{kind}-{tag}.zip",
        environmentVariablesOverride=[{"name": k, "value": v, "type": "PLAINTEXT"} for k, v in variables.items()],
        artifactsOverride={"type": "S3", "location": BUCKET, "path": "builds", "name": f"{kind}-{tag}",
                           "packaging": "NONE"},
    )["build"]["id"]


def build_statuses(aws, build_id: str) -> list[dict]:
    """BatchGetBuilds until the build completes (deadline): every build record seen."""
    seen, deadline = [], time.monotonic() + WAIT_S
    while True:
        seen.append(aws.client("codebuild").batch_get_builds(ids=[build_id])["builds"][0])
        if seen[-1]["buildStatus"] != "IN_PROGRESS":
            return seen
        assert time.monotonic() < deadline, f"build {build_id} still in progress after {WAIT_S} s"
        time.sleep(0.05)


def publish_image(aws, archive: Path, tag: str = "t1", kind: str = "semif") -> tuple[str, str]:
    """Build the `kind` image through CodeBuild and upload the model archive: (image URI, ModelDataUrl)."""
    build_id = start_build(aws, images_zip(), kind=kind, tag=tag)
    assert build_statuses(aws, build_id)[-1]["buildStatus"] == "SUCCEEDED"
    detail = aws.client("s3").get_object(Bucket=BUCKET, Key=f"builds/{kind}-{tag}/image-detail.json")["Body"].read()
    aws.client("s3").upload_file(str(archive), BUCKET, f"models/{tag}/model.tar.gz")
    return json.loads(detail)["ImageURI"], f"s3://{BUCKET}/models/{tag}/model.tar.gz"


def create_model(aws, name: str, image: str = MISSING_IMAGE, data_url: str | None = None, **environment: str) -> None:
    """CreateModel as the product sends it (SemIf limits for the tiny model, network isolation on)."""
    container = {"Image": image, "Environment": {**SEMIF_ENV, **environment}}
    if data_url:
        container["ModelDataUrl"] = data_url
    aws.client("sagemaker").create_model(ModelName=name, PrimaryContainer=container, ExecutionRoleArn=ROLE,
                                         EnableNetworkIsolation=True)


def create_endpoint(aws, name: str, variant: dict, **config) -> None:
    """An endpoint config of one variant and an endpoint on it, both called `name`."""
    sagemaker = aws.client("sagemaker")
    sagemaker.create_endpoint_config(EndpointConfigName=name, ProductionVariants=[variant], **config)
    sagemaker.create_endpoint(EndpointName=name, EndpointConfigName=name)


def wait_until_settled(describe, status_key: str, **name) -> tuple[dict, list[str]]:
    """Describe until the status is no longer transitional (deadline); the last answer and every status seen."""
    seen, deadline = [], time.monotonic() + WAIT_S
    while True:
        answer = describe(**name)
        seen.append(answer[status_key])
        if answer[status_key] not in ("Creating", "Updating", "Deleting"):
            return answer, seen
        assert time.monotonic() < deadline, f"{name} still {seen[-1]} after {WAIT_S} s"
        time.sleep(0.05)


def wait_until_gone(describe, **name) -> list[str]:
    """Describe until 'Could not find …' (deadline); the statuses seen before (at least one: Deleting)."""
    seen, deadline = [], time.monotonic() + WAIT_S
    while True:
        try:
            answer = describe(**name)
        except ClientError as error:
            assert error.response["Error"]["Message"].startswith("Could not find"), error
            return seen
        seen.append(next(v for k, v in answer.items() if k.endswith("Status")))
        assert time.monotonic() < deadline, f"{name} not deleted after {WAIT_S} s"
        time.sleep(0.05)


def assert_output_shape(operation: str, answer: dict) -> None:
    """The parsed answer satisfies the operation's output shape (required members, types)."""
    shape = service_model("sagemaker").operation_model(operation).output_shape
    body = {k: v for k, v in answer.items() if k != "ResponseMetadata"}
    report = ParamValidator().validate(body, shape)
    assert not report.has_errors(), report.generate_report()


def client_error(call, *args, **kwargs) -> dict:
    """The error response of a call that must fail with a ClientError."""
    with pytest.raises(ClientError) as caught:
        call(*args, **kwargs)
    return caught.value.response


# ---- validation ------------------------------------------------------------------------


def _variant(**changes) -> dict:
    """A single-model production variant on model "m"; a change to None removes the field."""
    variant = {"VariantName": "AllTraffic", "ModelName": "m", "InstanceType": "ml.m5.large", "InitialInstanceCount": 1}
    return {k: v for k, v in {**variant, **changes}.items() if v is not None}


POOLS = [{"InstanceType": "ml.g6e.xlarge", "Priority": 1}, {"InstanceType": "ml.g5.2xlarge", "Priority": 2}]


@pytest.mark.parametrize("config, expected", [
    pytest.param({"EndpointConfigName": "c" * 64, "ProductionVariants": [_variant()]},
                 "EndpointConfigName: 64 characters, at most 63", id="64-character-name"),
    pytest.param({"EndpointConfigName": "c", "ProductionVariants": [_variant(InstanceType="ml.g9.mega")]},
                 "'ml.g9.mega' is not one of the allowed values", id="unknown-instance-type"),
    pytest.param({"EndpointConfigName": "c", "ProductionVariants": [_variant(
        InstanceType=None,
        InstancePools=[{"InstanceType": "ml.g5.2xlarge", "Priority": p % 5 + 1} for p in range(6)])]},
        "InstancePools: 6 items, at most 5", id="six-pools"),
    pytest.param({"EndpointConfigName": "c", "ProductionVariants": [_variant(InstancePools=POOLS)]},
                 "exactly one of InstanceType or InstancePools", id="pools-and-instance-type"),
    pytest.param({"EndpointConfigName": "c", "ProductionVariants": [_variant(
        InstanceType=None, InstancePools=[{**POOLS[0], "Priority": 1}, {**POOLS[1], "Priority": 1}])]},
        "unique priorities 1..2", id="duplicate-pool-priorities"),
    pytest.param({"EndpointConfigName": "c", "ExecutionRoleArn": ROLE, "ProductionVariants": [_variant(
        ModelName=None, InstanceType="ml.p4d.24xlarge",
        AcceleratorPartitionLayouts=[{"AcceleratorPartitionTypes": ["mig-3g.20gb", "mig-3g.20gb", "mig-1g.5gb",
                                                                    "mig-1g.5gb"]}])]},
        "needs 8 compute slices and 50 GB, but one GPU of ml.p4d.24xlarge has 7 compute slices and 40 GB",
        id="mig-too-big"),
    pytest.param({"EndpointConfigName": "c", "ProductionVariants": [_variant(
        InstanceType="ml.p5.48xlarge", AcceleratorPartitionLayouts=MIG_VARIANT["AcceleratorPartitionLayouts"])]},
        "supported only on endpoints for inference components", id="mig-on-single-model-variant"),
    pytest.param({"EndpointConfigName": "c", "ExecutionRoleArn": ROLE, "ProductionVariants": [_variant(
        ModelName=None, InstanceType="ml.g5.2xlarge",
        AcceleratorPartitionLayouts=MIG_VARIANT["AcceleratorPartitionLayouts"])]},
        "ml.g5.2xlarge does not support accelerator partitions", id="mig-on-non-mig-family"),
    pytest.param({"EndpointConfigName": "c", "ProductionVariants": [MIG_VARIANT]},
                 "require ExecutionRoleArn", id="ic-endpoint-without-execution-role"),
    pytest.param({"EndpointConfigName": "c", "ProductionVariants": [_variant(ModelName="absent")]},
                 f'Could not find model "arn:aws:sagemaker:us-east-1:{ACCOUNT}:model/absent".', id="unknown-model"),
])
def test_refuses_endpoint_configs_sagemaker_would_refuse(aws, config, expected):
    create_model(aws, "m")
    sagemaker = aws.client("sagemaker")
    error = client_error(sagemaker.create_endpoint_config, **config)["Error"]
    assert error["Code"] == "ValidationException"
    assert expected in error["Message"]
    assert sagemaker.list_endpoint_configs()["EndpointConfigs"] == []


def test_accepts_a_layout_that_fits_and_keeps_every_field(aws):
    sagemaker = aws.client("sagemaker")
    variant = {**MIG_VARIANT,
               "AcceleratorPartitionLayouts": [{"AcceleratorPartitionTypes": ["mig-3g.40gb", "mig-3g.40gb"]}]}
    sagemaker.create_endpoint_config(EndpointConfigName="fits", ProductionVariants=[variant], ExecutionRoleArn=ROLE,
                                     EnableNetworkIsolation=True)
    described = sagemaker.describe_endpoint_config(EndpointConfigName="fits")
    assert described["ProductionVariants"] == [variant]
    assert (described["ExecutionRoleArn"], described["EnableNetworkIsolation"]) == (ROLE, True)
    assert_output_shape("DescribeEndpointConfig", described)

    aws.scenario(drop_partition_layouts=True)
    variant = sagemaker.describe_endpoint_config(EndpointConfigName="fits")["ProductionVariants"][0]
    assert "AcceleratorPartitionLayouts" not in variant


def test_names_taken_and_unknown_get_sagemakers_messages(aws):
    sagemaker = aws.client("sagemaker")
    create_model(aws, "Taken")
    error = client_error(create_model, aws, "taken")["Error"]
    assert error == {"Code": "ValidationException",
                     "Message": 'Cannot create already existing model '
                                f'"arn:aws:sagemaker:us-east-1:{ACCOUNT}:model/taken".'}
    assert client_error(sagemaker.describe_endpoint,
                        EndpointName="nope")["Error"]["Message"] == 'Could not find endpoint "nope".'
    assert client_error(sagemaker.delete_endpoint_config, EndpointConfigName="nope")["Error"]["Message"] == \
        'Could not find endpoint configuration "nope".'
    assert client_error(sagemaker.describe_inference_component, InferenceComponentName="nope")["Error"]["Message"] == \
        'Could not find inference component "nope".'
    assert client_error(sagemaker.describe_model, ModelName="nope")["Error"]["Message"] == \
        f'Could not find model "arn:aws:sagemaker:us-east-1:{ACCOUNT}:model/nope".'
    missing_data = client_error(create_model, aws, "nodata", data_url=f"s3://{BUCKET}/none.tar.gz")["Error"]
    assert missing_data["Message"] == f"Could not find model data at s3://{BUCKET}/none.tar.gz."


def test_throttles_the_next_calls_then_lets_them_through(aws):
    aws.scenario(throttle={"CreateModel": 2})
    no_retries = aws.client("sagemaker", max_attempts=1)
    for _ in range(2):
        error = client_error(no_retries.create_model, ModelName="m", PrimaryContainer={"Image": MISSING_IMAGE})
        assert error["Error"] == {"Code": "ThrottlingException", "Message": "Rate exceeded"}
        assert error["ResponseMetadata"]["HTTPStatusCode"] == 400
    no_retries.create_model(ModelName="m", PrimaryContainer={"Image": MISSING_IMAGE})

    aws.scenario(throttle={"DescribeModel": 2})
    aws.client("sagemaker", max_attempts=3).describe_model(ModelName="m")  # boto3's retries absorb the throttling
    assert [c.operation for c in aws.calls].count("DescribeModel") == 3


def test_lists_filter_and_page_and_tags_follow_the_arn(aws):
    sagemaker = aws.client("sagemaker")
    for index in range(5):
        sagemaker.create_model(ModelName=f"shiplift-{index}", PrimaryContainer={"Image": MISSING_IMAGE},
                               Tags=[{"Key": "owner", "Value": "shiplift"}])
    sagemaker.create_model(ModelName="other", PrimaryContainer={"Image": MISSING_IMAGE})
    first = sagemaker.list_models(NameContains="shiplift", MaxResults=3, SortBy="Name", SortOrder="Ascending")
    second = sagemaker.list_models(NameContains="shiplift", MaxResults=3, SortBy="Name", SortOrder="Ascending",
                                   NextToken=first["NextToken"])
    assert [m["ModelName"] for m in first["Models"] + second["Models"]] == [f"shiplift-{i}" for i in range(5)]
    assert "NextToken" not in second

    model_arn = first["Models"][0]["ModelArn"]
    sagemaker.add_tags(ResourceArn=model_arn, Tags=[{"Key": "release", "Value": "r1"}])
    sagemaker.delete_tags(ResourceArn=model_arn, TagKeys=["owner"])
    assert sagemaker.list_tags(ResourceArn=model_arn)["Tags"] == [{"Key": "release", "Value": "r1"}]


# ---- status sequences (inference-component endpoints: no model server needed) -----------


def test_endpoint_stays_creating_for_the_polls_then_in_service(aws):
    aws.scenario(polls_before_ready=3)
    sagemaker = aws.client("sagemaker")
    create_endpoint(aws, "ic", MIG_VARIANT, ExecutionRoleArn=ROLE)
    early = client_error(aws.client("sagemaker-runtime").invoke_endpoint, EndpointName="ic", Body=b"{}")
    assert (early["Error"]["Code"], early["ResponseMetadata"]["HTTPStatusCode"]) == ("ValidationError", 400)
    assert "is not in service (status Creating)" in early["Error"]["Message"]
    described, seen = wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="ic")
    assert seen[:3] == ["Creating"] * 3 and seen[-1] == "InService"
    assert described["ProductionVariants"][0]["CurrentInstanceCount"] == 1
    assert_output_shape("DescribeEndpoint", described)
    assert [e["EndpointStatus"] for e in sagemaker.list_endpoints()["Endpoints"]] == ["InService"]


def test_instance_pools_fall_back_and_record_the_pool_that_provisioned(aws):
    aws.scenario(unavailable_instance_types={"ml.g6e.xlarge"})
    variant = {"VariantName": "AllTraffic", "InstancePools": POOLS, "InitialInstanceCount": 1}
    create_endpoint(aws, "pools", variant, ExecutionRoleArn=ROLE)
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="pools")
    assert described["EndpointStatus"] == "InService"
    assert described["ProductionVariants"][0]["InstancePools"] == [
        {"InstanceType": "ml.g6e.xlarge", "CurrentInstanceCount": 0},
        {"InstanceType": "ml.g5.2xlarge", "CurrentInstanceCount": 1},
    ]


def test_endpoint_fails_when_every_pool_lacks_capacity(aws):
    aws.scenario(unavailable_instance_types={"ml.g6e.xlarge", "ml.g5.2xlarge"})
    create_endpoint(aws, "pools", {"VariantName": "AllTraffic", "InstancePools": POOLS}, ExecutionRoleArn=ROLE)
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="pools")
    assert described["EndpointStatus"] == "Failed"
    assert "InsufficientInstanceCapacity" in described["FailureReason"]
    assert "ml.g6e.xlarge, ml.g5.2xlarge" in described["FailureReason"]
    assert "ProductionVariants" not in described


def test_fail_next_endpoint_fails_one_endpoint_only(aws):
    aws.scenario(fail_next_endpoint_with="Kernel panic on the host.")
    sagemaker = aws.client("sagemaker")
    create_endpoint(aws, "first", MIG_VARIANT, ExecutionRoleArn=ROLE)
    sagemaker.create_endpoint(EndpointName="second", EndpointConfigName="first")
    first, _ = wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="first")
    second, _ = wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="second")
    assert (first["EndpointStatus"], first["FailureReason"]) == ("Failed", "Kernel panic on the host.")
    assert second["EndpointStatus"] == "InService"


def test_update_endpoint_moves_to_the_new_config_unless_rolled_back(aws):
    """Not documented by AWS: the status after a rollback (the double: InService on the old config, no
    FailureReason)."""
    sagemaker = aws.client("sagemaker")
    create_endpoint(aws, "ep", MIG_VARIANT, ExecutionRoleArn=ROLE)
    wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="ep")
    sagemaker.create_endpoint_config(EndpointConfigName="ep-2", ExecutionRoleArn=ROLE,
                                     ProductionVariants=[{**MIG_VARIANT, "InitialInstanceCount": 2}])
    sagemaker.update_endpoint(EndpointName="ep", EndpointConfigName="ep-2")
    updated, seen = wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="ep")
    assert seen[0] == "Updating" and updated["EndpointStatus"] == "InService"
    assert (updated["EndpointConfigName"], updated["ProductionVariants"][0]["CurrentInstanceCount"]) == ("ep-2", 2)

    aws.scenario(roll_back_updates=True)
    sagemaker.update_endpoint(EndpointName="ep", EndpointConfigName="ep")
    rolled_back, _ = wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="ep")
    assert (rolled_back["EndpointStatus"], rolled_back["EndpointConfigName"]) == ("InService", "ep-2")
    assert "FailureReason" not in rolled_back

    relaid = {**MIG_VARIANT, "AcceleratorPartitionLayouts": [{"AcceleratorPartitionTypes": ["mig-7g.80gb"]}]}
    sagemaker.create_endpoint_config(EndpointConfigName="ep-3", ExecutionRoleArn=ROLE, ProductionVariants=[relaid])
    error = client_error(sagemaker.update_endpoint, EndpointName="ep", EndpointConfigName="ep-3")["Error"]
    assert "cannot change on a running endpoint" in error["Message"]


# ---- CodeBuild ---------------------------------------------------------------------------


def test_codebuild_build_reports_progress_pushes_the_image_and_writes_image_detail(aws):
    build_id = start_build(aws, images_zip())
    seen = build_statuses(aws, build_id)
    assert [b["buildStatus"] for b in seen] == ["IN_PROGRESS", "SUCCEEDED"]
    detail = json.loads(aws.client("s3").get_object(Bucket=BUCKET,
                                                    Key="builds/semif-t1/image-detail.json")["Body"].read())
    repository_uri, digest = detail["ImageURI"].split("@")
    assert repository_uri == f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/shiplift-semif"
    pushed = aws.client("ecr").describe_images(repositoryName="shiplift-semif")["imageDetails"]
    assert [(image["imageDigest"], image["imageTags"]) for image in pushed] == [(digest, ["t1"])]
    variables = {v["name"]: v["value"] for v in seen[-1]["environment"]["environmentVariables"]}
    assert variables["IMAGE_NAME"] == "semif"

    rebuilt = start_build(aws, images_zip(), tag="t2")
    build_statuses(aws, rebuilt)
    again = json.loads(aws.client("s3").get_object(Bucket=BUCKET,
                                                   Key="builds/semif-t2/image-detail.json")["Body"].read())
    assert again["ImageURI"].endswith(digest), "the same source must give the same digest"


@pytest.mark.parametrize("knobs, skip, phase, expected", [
    pytest.param({"fail_builds": True}, "", "BUILD", "docker build", id="fail-builds"),
    pytest.param({}, "images/common/sagemaker_http.py", "PRE_BUILD", "no common/sagemaker_http.py",
                 id="source-missing-a-file"),
])
def test_failed_builds_push_nothing(aws, knobs, skip, phase, expected):
    aws.scenario(**knobs)
    final = build_statuses(aws, start_build(aws, images_zip(skip=skip)))[-1]
    assert final["buildStatus"] == "FAILED"
    failed = [p for p in final["phases"] if p.get("phaseStatus") == "FAILED"]
    assert [p["phaseType"] for p in failed] == [phase]
    assert expected in failed[0]["contexts"][0]["message"]
    assert aws.client("ecr").describe_images(repositoryName="shiplift-semif")["imageDetails"] == []


# ---- the container runtime ---------------------------------------------------------------


def test_endpoint_fails_when_its_image_is_not_in_ecr(aws):
    create_model(aws, "m")
    create_endpoint(aws, "ep", _variant())
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="ep")
    assert described["EndpointStatus"] == "Failed"
    assert f"Requested image {MISSING_IMAGE} not found" in described["FailureReason"]


def test_endpoint_fails_with_the_log_tail_when_the_server_exits(aws, semif_archive, tmp_path):
    from shiplift.tasks.artifacts.packaging import package_model_dir

    image, _ = publish_image(aws, semif_archive)
    (tmp_path / "no-model").mkdir()
    (tmp_path / "no-model" / "README").write_text("no model here\n")
    packaged = package_model_dir(tmp_path / "no-model", tmp_path, manifest={}, model_file="README",
                                 archive_name="empty.tar.gz")  # a well-formed archive with no GGUF in it
    aws.client("s3").upload_file(str(packaged.path), BUCKET, "models/empty.tar.gz")
    create_model(aws, "empty", image, f"s3://{BUCKET}/models/empty.tar.gz")
    create_endpoint(aws, "ep", _variant(ModelName="empty"))
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="ep")
    assert described["EndpointStatus"] == "Failed"
    reason = described["FailureReason"]
    assert "did not pass the ping health check: the server process exited with code 2" in reason
    assert "no *.gguf file under SEMIF_MODEL_DIR" in reason  # the server's own words, from its log
    assert len(reason) <= 1024


def test_endpoint_fails_when_ping_misses_the_startup_deadline(aws, semif_archive):
    image, data_url = publish_image(aws, semif_archive)
    aws.scenario(container_start_timeout_s=0.01)
    create_model(aws, "tiny", image, data_url)
    create_endpoint(aws, "ep", _variant(ModelName="tiny"))
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="ep")
    assert described["EndpointStatus"] == "Failed"
    assert "GET /ping did not answer 200 before the startup health check deadline" in described["FailureReason"]
    assert aws.container_pids() == []


def test_single_model_endpoint_serves_real_semif_decisions(aws, semif_archive):
    image, data_url = publish_image(aws, semif_archive)
    create_model(aws, "tiny", image, data_url)
    create_endpoint(aws, "tiny", _variant(ModelName="tiny"))
    sagemaker, runtime = aws.client("sagemaker"), aws.client("sagemaker-runtime")
    described, _ = wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="tiny")
    assert described["EndpointStatus"] == "InService", described.get("FailureReason")
    assert described["ProductionVariants"][0]["DeployedImages"][0]["ResolvedImage"] == image
    assert_output_shape("DescribeEndpoint", described)

    answer = runtime.invoke_endpoint(EndpointName="tiny", Body=json.dumps(DECISION), ContentType="application/json")
    result = json.loads(answer["Body"].read())["result"]
    assert (answer["InvokedProductionVariant"], result["id"], result["option_ids"]) == ("AllTraffic", "q",
                                                                                        ["no", "yes"])
    assert sum(result["probabilities"]) == pytest.approx(1.0)
    with ThreadPoolExecutor(max_workers=3) as threads:
        answers = list(threads.map(lambda _: json.loads(runtime.invoke_endpoint(
            EndpointName="tiny", Body=json.dumps(DECISION), ContentType="application/json")["Body"].read()), range(3)))
    assert {json.dumps(a["result"]["probabilities"]) for a in answers} == {json.dumps(result["probabilities"])}

    model_error = client_error(runtime.invoke_endpoint, EndpointName="tiny", Body=b'{"decision": 1, "extra": 2}',
                               ContentType="application/json")
    assert model_error["Error"]["Code"] == "ModelError" and model_error["ResponseMetadata"]["HTTPStatusCode"] == 424
    assert model_error["OriginalStatusCode"] == 400 and "error" in json.loads(model_error["OriginalMessage"])
    assert model_error["LogStreamArn"].endswith("/aws/sagemaker/Endpoints/tiny")
    variant_dimensions = [{"Name": "EndpointName", "Value": "tiny"}, {"Name": "VariantName", "Value": "AllTraffic"}]
    assert [metric_sum(aws, name, variant_dimensions)
            for name in ("Invocations", "Invocation4XXErrors", "InvocationModelErrors")] \
        == [5, 1, 1]
    refused = client_error(runtime.invoke_endpoint, EndpointName="tiny", Body=b"{}",
                           InferenceComponentName="x")["Error"]
    assert refused["Code"] == "ValidationError" and "not allowed" in refused["Message"]

    pids = aws.container_pids()
    assert len(pids) == 1
    sagemaker.delete_endpoint(EndpointName="tiny")
    assert set(wait_until_gone(sagemaker.describe_endpoint, EndpointName="tiny")) == {"Deleting"}
    assert aws.container_pids() == []
    gone = client_error(runtime.invoke_endpoint, EndpointName="tiny", Body=json.dumps(DECISION))["Error"]
    assert gone == {"Code": "ValidationError", "Message": f"Endpoint tiny of account {ACCOUNT} not found."}


def test_encoder_images_run_the_encoder_server(aws, encoder_archive):
    image, data_url = publish_image(aws, encoder_archive, kind="encoder")
    aws.client("sagemaker").create_model(ModelName="nli", ExecutionRoleArn=ROLE, PrimaryContainer={
        "Image": image, "ModelDataUrl": data_url, "Environment": {"ENCODER_THREADS": "1"}})
    create_endpoint(aws, "nli", _variant(ModelName="nli"))
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="nli")
    assert described["EndpointStatus"] == "InService", described.get("FailureReason")
    pair = {"premise": "a man plays the guitar", "hypothesis": "a man plays music"}
    answer = aws.client("sagemaker-runtime").invoke_endpoint(EndpointName="nli", Body=json.dumps({"pairs": [pair]}),
                                                             ContentType="application/json")
    [result] = json.loads(answer["Body"].read())["results"]
    assert set(result["probabilities"]) == {"entailment", "neutral", "contradiction"}
    assert result["label"] in result["probabilities"]


def test_inference_components_on_mig_partitions(aws, aws_double_module, semif_archive):
    image, data_url = publish_image(aws, semif_archive)
    create_model(aws, "tiny-a", image, data_url)
    create_model(aws, "tiny-b", image, data_url, SEMIF_MAX_SHARED_DECISIONS="4")
    sagemaker, runtime = aws.client("sagemaker"), aws.client("sagemaker-runtime")
    create_endpoint(aws, "ic", MIG_VARIANT, ExecutionRoleArn=ROLE)
    wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="ic")

    def create_component(name: str, copies: int, **requirements) -> None:
        sagemaker.create_inference_component(
            InferenceComponentName=name, EndpointName="ic", VariantName="AllTraffic",
            Specification={"ModelName": "tiny-a", "ComputeResourceRequirements": {**MIG_REQUIREMENTS, **requirements}},
            RuntimeConfig={"CopyCount": copies})

    refused = client_error(create_component, "wrong", 1, AcceleratorPartitionType="mig-3g.40gb")["Error"]
    assert "is not one of the partition types declared" in refused["Message"]
    refused = client_error(create_component, "wrong", 1, NumberOfAcceleratorDevicesRequired=2)["Error"]
    assert "NumberOfAcceleratorDevicesRequired must be 1" in refused["Message"]
    create_component("decider", 1)
    described, seen = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                         InferenceComponentName="decider")
    assert seen[0] == "Creating", described.get("FailureReason")
    assert described["InferenceComponentStatus"] == "InService", described.get("FailureReason")
    assert described["RuntimeConfig"] == {"DesiredCopyCount": 1, "CurrentCopyCount": 1}
    assert described["Specification"]["Container"]["DeployedImage"]["ResolvedImage"] == image
    assert described["Specification"]["Container"]["ArtifactUrl"] == data_url
    assert_output_shape("DescribeInferenceComponent", described)

    answer = runtime.invoke_endpoint(EndpointName="ic", InferenceComponentName="decider", Body=json.dumps(DECISION),
                                     ContentType="application/json")
    assert json.loads(answer["Body"].read())["result"]["option_ids"] == ["no", "yes"]
    missing_name = client_error(runtime.invoke_endpoint, EndpointName="ic", Body=json.dumps(DECISION))["Error"]
    assert missing_name == {"Code": "ValidationError", "Message": aws_double_module.IC_NAME_REQUIRED}

    create_component("greedy", 2)  # one partition is left, two copies cannot fit
    greedy, _ = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                   InferenceComponentName="greedy")
    assert greedy["InferenceComponentStatus"] == "Failed"
    assert "has room for 1 (1 x ml.p5.4xlarge with 2 mig-1g.10gb partitions each, 1 held" in greedy["FailureReason"]

    aws.scenario(roll_back_updates=True)
    candidate = {"ModelName": "tiny-b", "ComputeResourceRequirements": MIG_REQUIREMENTS}
    one_at_a_time = {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1},
                                             "WaitIntervalInSeconds": 0}}
    # MaximumBatchSize must be 5-50 % of the copy count (API_InferenceComponentRollingUpdatePolicy): 1 of 1 copy is 100
    # %
    refused = client_error(sagemaker.update_inference_component, InferenceComponentName="decider",
                           Specification=candidate, DeploymentConfig=one_at_a_time)["Error"]
    assert refused["Code"] == "ValidationException" and "between 5% and 50% of the copy count" in refused["Message"]
    sagemaker.update_inference_component(InferenceComponentName="decider", Specification=candidate,
                                         RuntimeConfig={"CopyCount": 2}, DeploymentConfig=one_at_a_time)
    rolled_back, seen = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                           InferenceComponentName="decider")
    assert seen[0] == "Updating"
    assert (rolled_back["InferenceComponentStatus"], rolled_back["Specification"]["ModelName"]) == ("InService",
                                                                                                    "tiny-a")
    assert "FailureReason" not in rolled_back and "LastDeploymentConfig" in rolled_back

    aws.scenario(roll_back_updates=False)
    sagemaker.update_inference_component(InferenceComponentName="decider", Specification=candidate)
    updated, _ = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                    InferenceComponentName="decider")
    assert updated["Specification"]["ModelName"] == "tiny-b"
    assert updated["Specification"]["Container"]["Environment"]["SEMIF_MAX_SHARED_DECISIONS"] == "4"

    sagemaker.update_inference_component_runtime_config(InferenceComponentName="decider",
                                                        DesiredRuntimeConfig={"CopyCount": 2})
    scaled, seen = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                      InferenceComponentName="decider")
    assert seen[0] == "Updating" and scaled["RuntimeConfig"] == {"DesiredCopyCount": 2, "CurrentCopyCount": 2}
    assert len(aws.container_pids()) == 2

    listed = sagemaker.list_inference_components(EndpointNameEquals="ic", SortBy="Name", SortOrder="Ascending")
    assert [c["InferenceComponentName"] for c in listed["InferenceComponents"]] == ["decider", "greedy"]
    blocked = client_error(sagemaker.delete_endpoint, EndpointName="ic")["Error"]
    assert "Delete the inference components first" in blocked["Message"]
    for name in ("decider", "greedy"):
        sagemaker.delete_inference_component(InferenceComponentName=name)
        assert set(wait_until_gone(sagemaker.describe_inference_component, InferenceComponentName=name)) == {"Deleting"}
    assert aws.container_pids() == []
    sagemaker.delete_endpoint(EndpointName="ic")


# ---- CloudWatch: invocation metrics, alarm evaluation, rolling updates --------------------


CPU_VARIANT = {"VariantName": "AllTraffic", "InstanceType": "ml.m5.xlarge", "InitialInstanceCount": 1}
CPU_REQUIREMENTS = {"MinMemoryRequiredInMb": 1024, "NumberOfCpuCoresRequired": 1}
COMPONENT_DIMENSIONS = [{"Name": "InferenceComponentName", "Value": "decider"}]


@pytest.fixture(scope="module")
def other_semif_archive(tmp_path_factory) -> Path:
    """A second tiny GGUF (seed 4): a model whose answers name another sha256 than `semif_archive`'s."""
    folder = tmp_path_factory.mktemp("semif-model-b")
    gguf = write_tiny_gguf(folder / "tiny.gguf", seed=4)
    return package_gguf(gguf, folder / "package", manifest={"source": "tinymodel seed 4"}).path


def serving_component(aws, old_archive: Path, new_archive: Path, copies: int) -> None:
    """Models "old" and "new" (one image, two archives) and component "decider" of `copies` copies of "old" on a CPU
    inference-component endpoint, InService."""
    image, old_url = publish_image(aws, old_archive, tag="old")
    aws.client("s3").upload_file(str(new_archive), BUCKET, "models/new/model.tar.gz")
    create_model(aws, "old", image, old_url)
    create_model(aws, "new", image, f"s3://{BUCKET}/models/new/model.tar.gz")
    create_endpoint(aws, "ic", CPU_VARIANT, ExecutionRoleArn=ROLE)
    sagemaker = aws.client("sagemaker")
    wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="ic")
    sagemaker.create_inference_component(
        InferenceComponentName="decider", EndpointName="ic", VariantName="AllTraffic",
        Specification={"ModelName": "old", "ComputeResourceRequirements": CPU_REQUIREMENTS},
        RuntimeConfig={"CopyCount": copies})
    described, _ = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                      InferenceComponentName="decider")
    assert described["InferenceComponentStatus"] == "InService", described.get("FailureReason")


def test_an_update_needs_room_beside_the_old_copies_unless_managed_scaling_adds_instances(aws, semif_archive,
                                                                                        other_semif_archive):
    """Two two-core copies fill an ml.m5.xlarge (4 vCPUs). An update without DeploymentConfig starts its new copies
    beside the old ones (not documented for inference components: docs/aws-double.md), so it cannot place them there;
    with ManagedInstanceScaling up to 2 instances it can (API_ProductionVariantManagedInstanceScaling)."""
    image, old_url = publish_image(aws, semif_archive, tag="old")
    aws.client("s3").upload_file(str(other_semif_archive), BUCKET, "models/new/model.tar.gz")
    create_model(aws, "old", image, old_url)
    create_model(aws, "new", image, f"s3://{BUCKET}/models/new/model.tar.gz")
    sagemaker, two_cores = aws.client("sagemaker"), {**CPU_REQUIREMENTS, "NumberOfCpuCoresRequired": 2}
    scaling = {"Status": "ENABLED", "MinInstanceCount": 1, "MaxInstanceCount": 2}
    outcome = {}
    for name, variant in (("fixed", CPU_VARIANT), ("scaled", {**CPU_VARIANT, "ManagedInstanceScaling": scaling})):
        create_endpoint(aws, name, variant, ExecutionRoleArn=ROLE)
        wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName=name)
        sagemaker.create_inference_component(
            InferenceComponentName=f"{name}-ic", EndpointName=name, VariantName="AllTraffic",
            Specification={"ModelName": "old", "ComputeResourceRequirements": two_cores},
            RuntimeConfig={"CopyCount": 2})
        created, _ = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                        InferenceComponentName=f"{name}-ic")
        assert created["InferenceComponentStatus"] == "InService", created.get("FailureReason")
        sagemaker.update_inference_component(InferenceComponentName=f"{name}-ic",
                                             Specification={"ModelName": "new",
                                                            "ComputeResourceRequirements": two_cores})
        outcome[name], seen = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                                 InferenceComponentName=f"{name}-ic")
        assert seen[0] == "Updating"
    fixed, scaled = outcome["fixed"], outcome["scaled"]
    assert fixed["Specification"]["ModelName"] == "old", "the old copies serve"
    assert fixed["RuntimeConfig"]["CurrentCopyCount"] == 2, "the old copies serve"
    assert ("Unable to place 4 copies" in fixed["FailureReason"]
            and "has room for 2 (1 x ml.m5.xlarge with 4 vCPUs each" in fixed["FailureReason"]), fixed["FailureReason"]
    assert (scaled["InferenceComponentStatus"], scaled["Specification"]["ModelName"]) == ("InService", "new")
    assert "FailureReason" not in scaled
    sagemaker.update_inference_component_runtime_config(InferenceComponentName="scaled-ic",
                                                        DesiredRuntimeConfig={"CopyCount": 5})
    scaled_up, _ = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                      InferenceComponentName="scaled-ic")
    assert "has room for 4 (2 x ml.m5.xlarge" in scaled_up["FailureReason"], "2 instances hold 4 two-core copies, not 5"


def decide(aws, body: str = json.dumps(DECISION)) -> str:
    """Invoke "decider" once: the sha256 of the model that answered."""
    answer = aws.client("sagemaker-runtime").invoke_endpoint(EndpointName="ic", InferenceComponentName="decider",
                                                             Body=body, ContentType="application/json")
    return json.loads(answer["Body"].read())["result"]["model"]["sha256"]


def rolling_update(aws, policy: dict, alarms: tuple[str, ...] = (), model: str = "new") -> dict:
    """UpdateInferenceComponent of "decider" to `model` with this RollingUpdatePolicy and alarms; the
    DeploymentConfig."""
    config = {"RollingUpdatePolicy": policy}
    if alarms:
        config["AutoRollbackConfiguration"] = {"Alarms": [{"AlarmName": name} for name in alarms]}
    aws.client("sagemaker").update_inference_component(
        InferenceComponentName="decider", DeploymentConfig=config,
        Specification={"ModelName": model, "ComputeResourceRequirements": CPU_REQUIREMENTS})
    return config


def events(aws) -> list[str]:
    return [event.message for event in aws.rollout_events("decider")]


def metric_sum(aws, metric: str, dimensions: list[dict], namespace: str = "AWS/SageMaker") -> float:
    """GetMetricStatistics Sum of a metric over the last ten minutes."""
    now = time.time()
    points = aws.client("cloudwatch").get_metric_statistics(
        Namespace=namespace, MetricName=metric, Dimensions=dimensions, StartTime=now - 600, EndTime=now + 60,
        Period=3600, Statistics=["Sum"])["Datapoints"]
    return sum(point["Sum"] for point in points)


def error_rate_alarm(aws, name: str, minimum: int = 5) -> None:
    """The error-rate alarm the product creates for a component: metric math over its SageMaker metrics."""
    def summed(metric_id: str, metric: str) -> dict:
        return {"Id": metric_id, "ReturnData": False, "MetricStat": {"Metric": {
            "Namespace": "AWS/SageMaker", "MetricName": metric, "Dimensions": COMPONENT_DIMENSIONS}, "Period": 60,
            "Stat": "Sum"}}

    aws.client("cloudwatch").put_metric_alarm(
        AlarmName=name, EvaluationPeriods=1, DatapointsToAlarm=1, Threshold=0.01,
        ComparisonOperator="GreaterThanThreshold",
        TreatMissingData="notBreaching", Tags=[{"Key": "owner", "Value": "shiplift"}],
        Metrics=[summed("errors5xx", "Invocation5XXErrors"), summed("modelerrors", "InvocationModelErrors"),
                 summed("invocations", "Invocations"),
                 {"Id": "errorrate", "ReturnData": True,
                  "Expression": f"IF(invocations >= {minimum}, MAX([errors5xx, modelerrors]) / invocations, 0)"}])


def gauge_alarm(aws, name: str, treat_missing: str = "notBreaching", **changes) -> None:
    """A one-metric alarm on shiplift/Rollout OnlineGateFailed (Maximum over 10 s, > 0) as the product's online gate;
    a change to None removes the field."""
    alarm = {"AlarmName": name, "Namespace": "shiplift/Rollout", "MetricName": "OnlineGateFailed",
             "Dimensions": COMPONENT_DIMENSIONS, "Statistic": "Maximum", "Period": 10, "EvaluationPeriods": 1,
             "Threshold": 0.0, "ComparisonOperator": "GreaterThanThreshold", "TreatMissingData": treat_missing,
             **changes}
    aws.client("cloudwatch").put_metric_alarm(**{key: value for key, value in alarm.items() if value is not None})


def put_gauge(aws, value: float, age_s: float = 0.0) -> None:
    """PutMetricData of OnlineGateFailed as the product publishes it, `age_s` seconds ago."""
    from datetime import datetime, timedelta

    aws.client("cloudwatch").put_metric_data(Namespace="shiplift/Rollout", MetricData=[{
        "MetricName": "OnlineGateFailed", "Dimensions": COMPONENT_DIMENSIONS, "Value": value, "StorageResolution": 1,
        "Timestamp": datetime.now(UTC) - timedelta(seconds=age_s)}])


@pytest.mark.parametrize("expression, values, expected", [
    pytest.param("IF(invocations >= 5, MAX([errors5xx, modelerrors]) / invocations, 0)",
                 {"invocations": 8, "errors5xx": 1, "modelerrors": 2}, 0.25, id="error-rate"),
    pytest.param("IF(invocations >= 5, MAX([errors5xx, modelerrors]) / invocations, 0)",
                 {"invocations": 4, "errors5xx": 4, "modelerrors": 4}, 0.0, id="error-rate-too-few"),
    pytest.param("IF(invocations >= 5, MAX([errors5xx, modelerrors]) / invocations, 0)", {}, None,
                 id="error-rate-no-data"),
    pytest.param("a + b * 2 - -c / 4", {"a": 1, "b": 2, "c": 8}, 7.0, id="precedence"),
    pytest.param("(a + b) * 2", {"a": 1, "b": 2}, 6.0, id="parentheses"),
    pytest.param("a / (b - 2)", {"a": 1, "b": 2}, None, id="division-by-zero"),
    pytest.param("MIN([a, b, 7.5])", {"b": 9}, 7.5, id="min-skips-missing"),
    pytest.param("a + b", {"a": 1}, None, id="missing-propagates"),
    pytest.param("a < b", {"a": 1, "b": 2}, 1.0, id="comparison-true"),
    pytest.param("a >= b + 1", {"a": 1, "b": 2}, 0.0, id="comparison-false"),
    pytest.param("IF(a <= 0.5, 10, 20)", {"a": 0.75}, 20.0, id="if-false"),
])
def test_metric_math_evaluates_the_expressions_of_the_products_alarms(aws_double_module, expression, values, expected):
    ids = {"a", "b", "c", "invocations", "errors5xx", "modelerrors"}
    assert aws_double_module.MetricMath(expression, ids).evaluate(values) == expected


@pytest.mark.parametrize("expression, expected", [
    pytest.param("RATE(a)", "the function RATE is not supported", id="unsupported-function"),
    pytest.param("a == b", "unexpected character '='", id="equality"),
    pytest.param("a +", "it ends too early", id="truncated"),
    pytest.param("a + d", "'d' is not the id of an earlier metric", id="unknown-id"),
    pytest.param("IF(a, 1)", "expected ','", id="if-with-two-arguments"),
    pytest.param("MAX(a, b)", "expected '['", id="max-without-array"),
    pytest.param("a b", "unexpected 'b' after a complete expression", id="two-operands"),
])
def test_metric_math_refuses_what_it_does_not_evaluate(aws_double_module, expression, expected):
    with pytest.raises(aws_double_module.ApiError) as refused:
        aws_double_module.MetricMath(expression, {"a", "b"})
    assert refused.value.code == "ValidationException" and expected in refused.value.message


def test_alarms_are_judged_on_moto_datapoints(aws, aws_double_module):
    evaluate = aws_double_module.evaluate_alarms
    gauge_alarm(aws, "gate")
    gauge_alarm(aws, "gate-breaching", treat_missing="breaching")
    gauge_alarm(aws, "gate-missing", treat_missing="missing")
    assert {name: state for name, (state, _) in evaluate(["gate", "gate-breaching", "gate-missing"]).items()} == \
        {"gate": "OK", "gate-breaching": "ALARM", "gate-missing": "INSUFFICIENT_DATA"}
    put_gauge(aws, 0.0)
    assert evaluate(["gate"])["gate"][0] == "OK"
    put_gauge(aws, 1.0, age_s=15)  # older than the 10 s period
    assert evaluate(["gate"])["gate"][0] == "OK"
    put_gauge(aws, 1.0)
    state, reason = evaluate(["gate"])["gate"]
    assert state == "ALARM" and reason.startswith("Threshold Crossed: 1 out of the last 1 datapoints [1 (")
    described = aws.client("cloudwatch").describe_alarms(AlarmNames=["gate"])["MetricAlarms"][0]
    assert (described["StateValue"], described["StateReason"]) == ("ALARM", reason)
    assert json.loads(described["StateReasonData"])["recentDatapoints"] == [1.0]

    gauge_alarm(aws, "two-of-two", Period=60, EvaluationPeriods=2, DatapointsToAlarm=2)
    assert evaluate(["two-of-two"])["two-of-two"][0] == "OK"  # 1 of the last 2 periods breaches
    put_gauge(aws, 2.0, age_s=90)
    assert evaluate(["two-of-two"])["two-of-two"][0] == "ALARM"

    # p99 (nearest rank): 99, mean 50.5
    aws.client("cloudwatch").put_metric_data(Namespace="shiplift/Rollout", MetricData=[{
        "MetricName": "Latency", "Dimensions": COMPONENT_DIMENSIONS, "Values": [float(v) for v in range(1, 101)]}])
    gauge_alarm(aws, "p99", MetricName="Latency", Statistic=None, ExtendedStatistic="p99", Threshold=99.0,
                ComparisonOperator="GreaterThanOrEqualToThreshold")
    gauge_alarm(aws, "mean", MetricName="Latency", Statistic="Average", Threshold=50.0,
                ComparisonOperator="LessThanThreshold")
    gauge_alarm(aws, "count", MetricName="Latency", Statistic="SampleCount", Threshold=100,
                ComparisonOperator="LessThanOrEqualToThreshold")
    verdicts = evaluate(["p99", "mean", "count"])
    assert {name: state for name, (state, _) in verdicts.items()} == {"p99": "ALARM", "mean": "OK", "count": "ALARM"}

    error_rate_alarm(aws, "errors")
    data = [{"MetricName": name, "Dimensions": COMPONENT_DIMENSIONS, "Value": value}
            for name, value in (("Invocations", 10.0), ("Invocation5XXErrors", 1.0), ("InvocationModelErrors", 0.0))]
    aws.client("cloudwatch").put_metric_data(Namespace="AWS/SageMaker", MetricData=data)
    state, reason = evaluate(["errors"])["errors"]
    assert state == "ALARM" and "[0.1 (" in reason and "greater than the threshold (0.01)" in reason

    aws.client("cloudwatch").put_metric_alarm(
        AlarmName="odd", EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanThreshold",
        Metrics=[{"Id": "m", "ReturnData": False, "MetricStat": {"Metric": {"Namespace": "N", "MetricName": "M"},
                                                                 "Period": 60, "Stat": "Sum"}},
                 {"Id": "e", "Expression": "ANOMALY_DETECTION_BAND(m)", "ReturnData": True}])
    with pytest.raises(aws_double_module.ApiError, match="the function ANOMALY_DETECTION_BAND is not supported"):
        evaluate(["odd"])

    # a failed component: updates are checked all the same
    create_endpoint(aws, "ic", CPU_VARIANT, ExecutionRoleArn=ROLE)
    create_model(aws, "m")
    sagemaker = aws.client("sagemaker")
    wait_until_settled(sagemaker.describe_endpoint, "EndpointStatus", EndpointName="ic")
    sagemaker.create_inference_component(InferenceComponentName="decider", EndpointName="ic", VariantName="AllTraffic",
                                         Specification={"ModelName": "m",
                                                        "ComputeResourceRequirements": CPU_REQUIREMENTS},
                                         RuntimeConfig={"CopyCount": 2})
    wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                       InferenceComponentName="decider")
    policy = {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 0}
    for alarms, expected in ((("gate", "absent"),
                              "The CloudWatch alarms ['absent'] of AutoRollbackConfiguration do not exist"),
                             (("odd",), "the function ANOMALY_DETECTION_BAND is not supported")):
        error = client_error(rolling_update, aws, policy, alarms, model="m")["Error"]
        assert error["Code"] == "ValidationException" and expected in error["Message"]
    assert sagemaker.describe_inference_component(
        InferenceComponentName="decider")["InferenceComponentStatus"] == "Failed"


def test_rolling_update_serves_both_specs_batch_by_batch(aws, semif_archive, other_semif_archive):
    serving_component(aws, semif_archive, other_semif_archive, copies=2)
    old_sha = decide(aws)
    model_error = client_error(decide, aws, body='{"decision": 1}')
    assert model_error["OriginalStatusCode"] == 400
    sent = rolling_update(aws, {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 1})
    sagemaker = aws.client("sagemaker")
    refused = client_error(rolling_update, aws, {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 2},
                                                 "WaitIntervalInSeconds": 0})["Error"]
    assert "Cannot update in-progress inference component" in refused["Message"]

    answered, copies, invocations, deadline = set(), set(), 2, time.monotonic() + WAIT_S
    while ((described := sagemaker.describe_inference_component(InferenceComponentName="decider"))
           ["InferenceComponentStatus"] == "Updating"):
        assert described["Specification"]["ModelName"] == "old" and described["LastDeploymentConfig"] == sent
        copies.add(described["RuntimeConfig"]["CurrentCopyCount"])
        answered.add(decide(aws))
        invocations += 1
        assert time.monotonic() < deadline, "the rolling update did not end"
    new_sha = decide(aws)
    assert new_sha != old_sha and answered == {old_sha, new_sha}, "old and new copies serve side by side"
    assert copies <= {2, 3}  # (3 for the moment between a batch's new copy serving and an old one leaving)
    assert (described["InferenceComponentStatus"], described["Specification"]["ModelName"]) == ("InService", "new")
    assert described["RuntimeConfig"] == {"DesiredCopyCount": 2, "CurrentCopyCount": 2}
    assert described["LastDeploymentConfig"] == sent and "FailureReason" not in described
    assert_output_shape("DescribeInferenceComponent", described)
    assert len(aws.container_pids()) == 2
    assert [message.split(":")[0] for message in events(aws)] == [
        "started", "batch 1/2", "batch 1/2", "batch 2/2", "batch 2/2", "completed"]
    assert events(aws)[0] == ("started: 2 old copies -> 2 new copies in 2 batches of 1, wait 1 s, timeout 28800 s, "
                              "alarms []")
    with urllib.request.urlopen(f"{aws.url}/_double/rollouts", timeout=10) as answer:
        assert [event["message"] for event in json.load(answer)["events"]] == events(aws)

    assert metric_sum(aws, "Invocations", COMPONENT_DIMENSIONS) == invocations + 1
    assert metric_sum(aws, "Invocation4XXErrors", COMPONENT_DIMENSIONS) == 1
    assert metric_sum(aws, "InvocationModelErrors", COMPONENT_DIMENSIONS) == 1
    assert metric_sum(aws, "Invocation5XXErrors", COMPONENT_DIMENSIONS) == 0
    latency = aws.client("cloudwatch").get_metric_statistics(
        Namespace="AWS/SageMaker", MetricName="ModelLatency", Dimensions=COMPONENT_DIMENSIONS,
        StartTime=time.time() - 600,
        EndTime=time.time() + 60, Period=3600, Statistics=["SampleCount", "Maximum"])["Datapoints"]
    assert sum(p["SampleCount"] for p in latency) == invocations + 1 and latency[0]["Unit"] == "Microseconds"
    assert 0 < max(p["Maximum"] for p in latency) < 60e6


def test_rolling_update_rolls_back_when_an_alarm_fires(aws, semif_archive, other_semif_archive):
    serving_component(aws, semif_archive, other_semif_archive, copies=2)
    old_sha = decide(aws)
    error_rate_alarm(aws, "decider-errors")
    started = time.monotonic()
    rolling_update(aws, {"MaximumBatchSize": {"Type": "CAPACITY_PERCENT", "Value": 50}, "WaitIntervalInSeconds": 60,
                         "RollbackMaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}}, alarms=("decider-errors",))
    for _ in range(6):  # model errors (400) from whichever copies serve: 6 of 6 invocations
        client_error(decide, aws, body='{"decision": 1}')
    described, _ = wait_until_settled(aws.client("sagemaker").describe_inference_component, "InferenceComponentStatus",
                                      InferenceComponentName="decider")
    assert time.monotonic() - started < 30, "rolled back by the alarm, long before the 60 s bake ended"
    assert (described["InferenceComponentStatus"], described["Specification"]["ModelName"]) == ("InService", "old")
    assert "FailureReason" not in described and described["RuntimeConfig"]["CurrentCopyCount"] == 2
    assert {decide(aws) for _ in range(4)} == {old_sha}
    assert len(aws.container_pids()) == 2
    alarm = aws.client("cloudwatch").describe_alarms(AlarmNames=["decider-errors"])["MetricAlarms"][0]
    assert alarm["StateValue"] == "ALARM" and "greater than the threshold (0.01)" in alarm["StateReason"]
    log = events(aws)
    assert "rolling back: alarm decider-errors in ALARM" in log
    assert log[-2:] == ["rollback batch 1/1: starting 1 old copies", "rolled back: 2 old copies serving"]
    assert any(message.startswith("alarm decider-errors: ALARM: Threshold Crossed") for message in log)


def test_rolling_update_rolls_back_at_its_time_limit_or_when_new_copies_fail(aws, semif_archive, other_semif_archive):
    """Not documented by AWS: a timeout or new copies that fail to start roll back to the old spec
    (docs/aws-double.md)."""
    # a batch of 1 is 50 %, the most SageMaker takes
    serving_component(aws, semif_archive, other_semif_archive, copies=2)
    gauge_alarm(aws, "gate")
    aws.scenario(rolling_timeout_scale=0.005)  # 600 s in 3 s
    policy = {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 60,
              "MaximumExecutionTimeoutInSeconds": 600}
    rolling_update(aws, policy, alarms=("gate",))
    sagemaker = aws.client("sagemaker")
    described, _ = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                      InferenceComponentName="decider")
    assert (described["InferenceComponentStatus"], described["Specification"]["ModelName"]) == ("InService", "old")
    assert "FailureReason" not in described
    assert "rolling back: MaximumExecutionTimeoutInSeconds (600 s) passed" in events(aws)
    assert "alarm gate: OK: Threshold Crossed: no datapoints were received for 1 period and 1 missing datapoint was " \
           "treated as [NonBreaching]." in events(aws)

    create_model(aws, "broken")  # its image is not in ECR: the first batch fails to start
    rolling_update(aws, policy, model="broken")
    described, _ = wait_until_settled(sagemaker.describe_inference_component, "InferenceComponentStatus",
                                      InferenceComponentName="decider")
    assert (described["InferenceComponentStatus"], described["Specification"]["ModelName"]) == ("InService", "old")
    assert f"Requested image {MISSING_IMAGE} not found" in described["FailureReason"]
    assert described["RuntimeConfig"]["CurrentCopyCount"] == 2

    aws.scenario(rolling_timeout_scale=1.0)
    rolling_update(aws, policy)  # a 60 s bake: the reset below must cancel it, not wait for it
    deadline = time.monotonic() + WAIT_S
    while not events(aws)[-1].startswith("batch 1/2: 1 new and 2 old copies serving"):
        assert time.monotonic() < deadline, events(aws)
        time.sleep(0.05)
    started = time.monotonic()
    aws.reset()
    assert time.monotonic() - started < 10 and aws.container_pids() == []


# ---- other processes and the call log ----------------------------------------------------


SUBPROCESS = """
import json, os, urllib.request
import boto3
sagemaker = boto3.client("sagemaker")
print(json.dumps([e["EndpointName"] for e in sagemaker.list_endpoints()["Endpoints"]]))
request = urllib.request.Request(os.environ["AWS_ENDPOINT_URL"] + "/_double/scenario", method="POST",
                                 data=json.dumps({"throttle": {"DeleteEndpoint": 1}}).encode())
urllib.request.urlopen(request, timeout=10).read()
with urllib.request.urlopen(os.environ["AWS_ENDPOINT_URL"] + "/_double/calls", timeout=10) as answer:
    print(json.dumps([c["operation"] for c in json.load(answer)["calls"]]))
"""


def test_a_subprocess_reaches_the_double_through_the_environment(aws):
    create_endpoint(aws, "shared", MIG_VARIANT, ExecutionRoleArn=ROLE)
    done = subprocess.run([sys.executable, "-c", SUBPROCESS], capture_output=True, text=True, timeout=60, check=True)
    endpoints, operations = (json.loads(line) for line in done.stdout.splitlines())
    assert endpoints == ["shared"]
    assert operations == ["CreateEndpointConfig", "CreateEndpoint", "ListEndpoints"]
    assert ("sagemaker", "ListEndpoints", {}) in aws.calls
    throttled = client_error(aws.client("sagemaker", max_attempts=1).delete_endpoint, EndpointName="shared")
    assert throttled["Error"]["Code"] == "ThrottlingException"


def test_the_call_log_records_every_request_in_order(aws):
    sagemaker = aws.client("sagemaker")
    create_model(aws, "m")
    sagemaker.describe_model(ModelName="m")
    client_error(sagemaker.create_endpoint_config, EndpointConfigName="c" * 64, ProductionVariants=[_variant()])
    assert [(c.service, c.operation) for c in aws.calls] == [
        ("sagemaker", "CreateModel"), ("sagemaker", "DescribeModel"), ("sagemaker", "CreateEndpointConfig")]
    assert [c.operation for c in aws.calls if c.mutating] == ["CreateModel", "CreateEndpointConfig"]
    assert aws.calls[0].params["EnableNetworkIsolation"] is True
    with pytest.raises(ValueError, match="unknown scenario knobs"):
        aws.scenario(polls_before_readyy=2)
