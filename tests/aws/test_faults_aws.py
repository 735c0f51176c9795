"""Faults on the aws backend, one per class, against the AWS double (DESIGN §7, §12): each is the right domain error,
its message names the problem (and the fix), what was or was not created is checked in the double, and the ledger
says where the release stopped."""

from __future__ import annotations

import hashlib
import os

import boto3
import pytest
from botocore.retries import standard

from shiplift.tasks.backends.aws.artifact_store import S3ArtifactStore
from shiplift.tasks.backends.aws.session import MAX_ATTEMPTS, Aws
from shiplift.tasks.backends.placement import MigPartitionPlacement, fit_problem
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import (
    CapacityError,
    ConfigError,
    Conflict,
    DeployFailed,
    IntegrityError,
    Throttled,
)
from shiplift.tasks.families.gguf_decisions import gguf_memory
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline import table
from shiplift.tasks.pipeline.release import run_release

QUIET = lambda message: None  # noqa: E731
OTHER_ACCOUNT = "210987654321"
POOL_TYPES = ["ml.g6e.xlarge", "ml.g6.2xlarge", "ml.g5.2xlarge"]
QWEN3_4B = {"block_count": 36, "head_count": 32, "head_count_kv": 8, "key_length": 128, "value_length": 128,
            "embedding_length": 2560}


DEPLOY_ATTEMPTS = 1 + table.STEPS["deploy_candidate"].retries  # the release retries a retryable failure per the table


@pytest.fixture
def stage_retries(monkeypatch) -> list[int]:
    """The release's retries of a retryable stage failure, recorded (attempt numbers) instead of waited for."""
    asked: list[int] = []

    class Recorded:
        def delay(self, attempt: int) -> float:
            asked.append(attempt)
            return 0.0

    monkeypatch.setattr(table, "BACKOFF", Recorded())
    return asked


def ledger_of(tmp_path) -> Ledger:
    return Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")


def events(ledger: Ledger, model: str = "tiny-aws") -> list[tuple[str, str]]:
    return [(r.stage, r.event) for r in ledger.history(model)]


def failing_release(config, error_type):
    """Run the release; return the exception, which must be exactly `error_type`."""
    with pytest.raises(error_type) as caught:
        run_release(config, progress=QUIET)
    assert type(caught.value) is error_type, f"{type(caught.value).__name__}: {caught.value}"
    return caught.value


def sagemaker_left(double) -> dict[str, list[str]]:
    sm = double.client("sagemaker")
    return {"endpoints": [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]],
            "configs": [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]],
            "models": [m["ModelName"] for m in sm.list_models()["Models"]]}


def objects(double, bucket: str) -> list[str]:
    return [o["Key"] for o in double.client("s3").list_objects_v2(Bucket=bucket).get("Contents", [])]


def assert_nothing_created(double, aws_calls, bucket: str | None, tmp_path) -> None:
    """Only read-only preflight calls went out, no SageMaker request at all, no object, and no release opened."""
    assert [(service, operation) for service, operation, _ in aws_calls
            if not operation.startswith(("Get", "Head"))] == []
    assert double.calls == [], "no SageMaker request"
    if bucket:
        assert objects(double, bucket) == []
    ledger = ledger_of(tmp_path)
    assert not [r for r in ledger.history("tiny-aws") if r.event == "opened"], "the release was never opened"
    assert ledger.history("tiny-aws") == []


# -- preflight: before anything is created --------------------------------------------------------------

def test_no_credentials_is_a_config_error_from_the_preflight(aws, aws_calls, aws_release, tiny_release, tmp_path,
                                                             monkeypatch):
    aws_release.prepare_account(aws)  # the double's own client has its own credentials
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # on an EC2 host the instance role would answer
    assert "AWS_ENDPOINT_URL" in os.environ, "still pointed at the double"

    error = failing_release(config, ConfigError)
    assert "sts GetCallerIdentity: no usable AWS credentials" in str(error)
    assert "AWS_PROFILE" in error.fix and "aws_default connection" in error.fix and "nothing was created" in error.fix
    assert [(s, o) for s, o, _ in aws_calls] == [("sts", "GetCallerIdentity")], "the preflight is the first call"
    assert_nothing_created(aws, aws_calls, aws_release.BUCKET, tmp_path)


def test_a_bucket_in_another_region_is_a_config_error_naming_both(aws, aws_calls, aws_release, tiny_release, tmp_path):
    env = aws.env()
    eu = boto3.client("s3", region_name="eu-west-1", endpoint_url=aws.url, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    eu.create_bucket(Bucket=aws_release.BUCKET, CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    aws.client("ecr").create_repository(repositoryName=aws_release.REPOSITORY, imageTagMutability="IMMUTABLE")
    # moto answers HeadBucket from another region with 200 and x-amz-bucket-region / BucketRegion: eu-west-1
    assert aws.client("s3").head_bucket(Bucket=aws_release.BUCKET)["BucketRegion"] == "eu-west-1"
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")

    error = failing_release(config, ConfigError)
    assert f"bucket {aws_release.BUCKET} is in eu-west-1, the config deploys into us-east-1" in str(error)
    assert "set backend.region: eu-west-1" in error.fix and "nothing was created" in error.fix
    assert [(s, o) for s, o, _ in aws_calls] == [("sts", "GetCallerIdentity"), ("s3", "HeadBucket")]
    assert_nothing_created(aws, aws_calls, aws_release.BUCKET, tmp_path)


def test_credentials_of_another_account_are_a_config_error(aws, aws_calls, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                          backend__execution_role_arn=f"arn:aws:iam::{OTHER_ACCOUNT}:role/shiplift-sagemaker-execution")
    error = failing_release(config, ConfigError)
    assert (f"the AWS credentials are for account {aws_release.ACCOUNT}, "
            f"but the config deploys into {OTHER_ACCOUNT}") in str(error)
    assert "execution_role_arn" in str(error) and "nothing was created" in error.fix
    assert [(s, o) for s, o, _ in aws_calls] == [("sts", "GetCallerIdentity")]
    assert_nothing_created(aws, aws_calls, aws_release.BUCKET, tmp_path)


# -- SageMaker refuses or fails the candidate ------------------------------------------------------------

def test_no_capacity_in_any_pool_is_a_capacity_error_and_the_candidate_is_torn_down(aws, aws_release, tiny_release,
                                                                                    tmp_path, stage_retries):
    aws_release.prepare_account(aws)
    aws.scenario(unavailable_instance_types=POOL_TYPES)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")

    error = failing_release(config, CapacityError)
    assert error.retryable is True
    assert "no capacity in any instance pool; tried ml.g6e.xlarge, ml.g6.2xlarge, ml.g5.2xlarge" in str(error)
    assert "InsufficientInstanceCapacity" in str(error), "SageMaker's FailureReason is in the message"
    assert "add instance types to placement.pools" in error.fix
    # CapacityError is retryable: the stage ran once and then its table's retries, each attempt one CreateEndpoint.
    assert stage_retries == list(range(1, DEPLOY_ATTEMPTS))
    assert len([c for c in aws.calls if c.operation == "CreateEndpoint"]) == DEPLOY_ATTEMPTS
    assert sagemaker_left(aws) == {"endpoints": [], "configs": [],
                                   "models": []}, "the candidate went, with its config and model"

    ledger = ledger_of(tmp_path)
    failed = [r for r in ledger.history("tiny-aws") if r.stage == "deploy_candidate" and r.event == "failed"]
    assert len(failed) == DEPLOY_ATTEMPTS and failed[-1].payload["error"] == str(error)
    assert {r.payload["error_type"] for r in failed} == {"CapacityError"}
    assert events(ledger)[-3:] == [("teardown_candidate", "started"), ("teardown_candidate", "succeeded"),
                                   ("release", "failed")]
    teardown = [r for r in ledger.history("tiny-aws") if r.stage == "teardown_candidate"][-1]
    assert teardown.payload["removed"] is True
    assert ("validate", "started") not in events(ledger)


def test_an_endpoint_that_fails_to_start_is_deploy_failed_with_its_failure_reason(aws, aws_release, tiny_release,
                                                                                  tmp_path, stage_retries):
    reason = ("The primary container for production variant shiplift-tiny-aws-cand did not pass the ping health check. "
              "Please check CloudWatch logs for this endpoint.")
    aws_release.prepare_account(aws)
    aws.scenario(fail_next_endpoint_with=reason)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")

    error = failing_release(config, DeployFailed)
    assert error.retryable is False and stage_retries == [], "DeployFailed is not retryable: no second attempt"
    assert f"is Failed: {reason}" in str(error) and "CloudWatch logs" in error.fix
    failed = [r for r in ledger_of(tmp_path).history("tiny-aws") if r.stage == "deploy_candidate"
              and r.event == "failed"]
    assert len(failed) == 1 and reason in failed[0].payload["error"]
    assert failed[0].payload["error_type"] == "DeployFailed"
    assert sagemaker_left(aws)["endpoints"] == [], "the failed candidate was deleted"


# -- throttling: botocore's bounded retries, then Throttled ----------------------------------------------

def test_a_little_throttling_is_absorbed_by_botocores_retries(aws, aws_calls, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    aws.scenario(throttle={"CreateEndpoint": 2})
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    summary = run_release(config, progress=QUIET)
    assert summary["status"] == "promoted", summary
    sent = [c for c in aws.calls if c.operation == "CreateEndpoint"]
    assert len([c for c in sent
                if "-cand-" in c.params["EndpointName"]]) == 3, "two throttled attempts, then the one that went through"
    assert len([o for _, o, _ in aws_calls if o == "CreateEndpoint"]) == 2, \
        "shiplift itself called CreateEndpoint once per endpoint: the retries were botocore's"


def test_lasting_throttling_is_throttled_after_a_bounded_number_of_attempts(aws, aws_calls, aws_release, tiny_release,
                                                                            tmp_path, monkeypatch, stage_retries):
    aws_release.prepare_account(aws)
    aws.scenario(throttle={"CreateEndpoint": 50})
    delays = []
    backoff = standard.ExponentialBackoff.delay_amount

    def no_sleep(self, context):  # botocore's exponential backoff (up to 1+2+4+8+16 s) is recorded, not slept
        delays.append(backoff(self, context))
        return 0

    monkeypatch.setattr(standard.ExponentialBackoff, "delay_amount", no_sleep)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")

    error = failing_release(config, Throttled)
    assert error.retryable is True and isinstance(error, Throttled)
    assert "sagemaker CreateEndpoint: ThrottlingException" in str(error) and "retry later" in error.fix
    attempts = [c for c in aws.calls if c.operation == "CreateEndpoint"]
    # Throttled is retryable: the stage's table retries, and inside each attempt the backend calls CreateEndpoint once
    # (the backend adds no loop of its own) and botocore makes its bounded attempts.
    assert stage_retries == list(range(1, DEPLOY_ATTEMPTS))
    assert len([o for _, o, _ in aws_calls if o == "CreateEndpoint"]) == DEPLOY_ATTEMPTS
    assert "bounded retries" in str(error)
    assert len(attempts) == MAX_ATTEMPTS * DEPLOY_ATTEMPTS, \
        f"{len(attempts)} CreateEndpoint requests reached the service, the message says {MAX_ATTEMPTS} per call"
    assert len(delays) == len(attempts) - DEPLOY_ATTEMPTS and all(d >= 0 for d in delays)
    failed = [r for r in ledger_of(tmp_path).history("tiny-aws") if r.stage == "deploy_candidate"
              and r.event == "failed"]
    assert len(failed) == DEPLOY_ATTEMPTS and {r.payload["error_type"] for r in failed} == {"Throttled"}
    assert sagemaker_left(aws)["endpoints"] == [] and sagemaker_left(aws)["configs"] == []


# -- the image stage --------------------------------------------------------------------------------------

def test_a_repository_with_mutable_tags_is_refused_before_any_build(aws, aws_calls, aws_release, tiny_release,
                                                                    tmp_path):
    aws_release.prepare_account(aws, tag_mutability="MUTABLE")
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")

    error = failing_release(config, ConfigError)
    assert f"ECR repository {aws_release.REPOSITORY} does not make every tag immutable (MUTABLE)" in str(error)
    assert "--image-tag-mutability IMMUTABLE" in error.fix
    assert not [o for _, o, _ in aws_calls if o in ("StartBuild", "CreateProject")], "no CodeBuild build started"
    assert not [k for k in objects(aws, aws_release.BUCKET) if "/image-sources/" in k], "no build context uploaded"
    assert aws.calls == [], "nothing reached SageMaker"
    failed = [r for r in ledger_of(tmp_path).history("tiny-aws") if r.event == "failed" and r.stage != "release"]
    assert [r.stage for r in failed] == ["image"] and failed[0].payload["error_type"] == "ConfigError"


# -- the artifact store ------------------------------------------------------------------------------------

def store_and_source(aws, tmp_path, bucket: str, data: bytes):
    """A bucket, a file to store, and the store as tasks.backends.aws.backend builds it (reaching the double through the
    environment the `aws` fixture set): (store, source, sha256, key)."""
    aws.client("s3").create_bucket(Bucket=bucket)
    source = tmp_path / "model.tar.gz"
    source.write_bytes(data)
    sha256 = hashlib.sha256(data).hexdigest()
    store = S3ArtifactStore(Aws(region="us-east-1"), bucket=bucket, prefix="shiplift", kms_key_id=None,
                            cache_dir=tmp_path / "s3-cache")
    return store, source, sha256, store.key(sha256, "model.tar.gz")


@pytest.mark.parametrize("tamper, named", [
    ("truncate", "size"),  # same sha256 metadata, fewer bytes
    ("replace", "sha256"),  # same size, other bytes and metadata
])
def test_an_object_changed_between_upload_and_verification_is_an_integrity_error(aws, aws_release, tmp_path,
                                                                                 monkeypatch, tamper, named):
    data = b"shiplift artifact " * 1000
    store, source, sha256, key = store_and_source(aws, tmp_path, aws_release.BUCKET, data)
    sent: list[str] = []
    call = Aws.call

    def tampering(self, service, operation, **params):
        if operation == "HeadObject" and sent[-1:] == ["PutObject"]:  # the verification right after the upload
            other = data[:-100] if tamper == "truncate" else bytes(reversed(data))
            metadata = {"sha256": sha256 if tamper == "truncate" else hashlib.sha256(other).hexdigest()}
            aws.client("s3").put_object(Bucket=aws_release.BUCKET, Key=key, Body=other, Metadata=metadata)
        sent.append(operation)
        return call(self, service, operation, **params)

    monkeypatch.setattr(Aws, "call", tampering)
    with pytest.raises(IntegrityError) as caught:
        store.put_file(source, name="model.tar.gz")
    message = str(caught.value)
    assert f"s3://{aws_release.BUCKET}/{key} does not match {source} after the upload" in message
    assert named in message and "delete it and rerun the stage" in caught.value.fix
    if tamper == "truncate":
        assert f"size {len(data) - 100} (uploaded {len(data)})" in message
    else:
        assert f"sha256 metadata {hashlib.sha256(bytes(reversed(data))).hexdigest()} (uploaded {sha256})" in message
    assert sent == ["HeadObject", "PutObject", "HeadObject"]


def test_other_content_under_the_content_addressed_key_is_a_conflict_and_is_left_alone(aws, aws_release, tmp_path,
                                                                                       aws_calls):
    data = b"the real artifact" * 100
    store, source, sha256, key = store_and_source(aws, tmp_path, aws_release.BUCKET, data)
    squatter = b"someone else's bytes"
    aws.client("s3").put_object(Bucket=aws_release.BUCKET, Key=key, Body=squatter)

    with pytest.raises(Conflict) as caught:
        store.put_file(source, name="model.tar.gz")
    assert f"s3://{aws_release.BUCKET}/{key} exists with other content ({len(squatter)} bytes" in str(caught.value)
    assert f"this file is {len(data)} bytes, {sha256}" in str(caught.value) and "never overwritten" in str(caught.value)
    assert [o for _, o, _ in aws_calls] == ["HeadObject"], "no write was attempted"
    assert aws.client("s3").get_object(Bucket=aws_release.BUCKET, Key=key)["Body"].read() == squatter


# -- placement and sizing -----------------------------------------------------------------------------------

def test_a_mig_layout_that_does_not_fit_one_gpu_is_refused_at_load(aws_release, tiny_release, tmp_path):
    placement = {"kind": "mig_partition", "instance_type": "ml.p4d.24xlarge", "partition_type": "mig-3g.40gb",
                 "partitions": 2, "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", placement=placement)
    with pytest.raises(ConfigError) as caught:
        load_release_config(config, environ={})
    message = str(caught.value)
    assert "placement" in message and "2 x mig-3g.40gb needs 6 compute slices and 80 GB" in message
    assert "one A100 40 GB GPU of ml.p4d.24xlarge has 7 slices and 40 GB" in message
    assert "fewer or smaller partitions" in message


def test_a_model_that_does_not_fit_its_partition_says_by_how_much():
    placement = MigPartitionPlacement(kind="mig_partition", instance_type="ml.p4d.24xlarge",
                                      partition_type="mig-1g.10gb",
                                      partitions=4, inference_ami_version="al2023-ami-sagemaker-inference-gpu-4-1")
    estimate = gguf_memory(2_500_000_000, QWEN3_4B, context_tokens=131072, on_gpu=True)
    problem = fit_problem(estimate, placement)
    # 2385 MiB weights + 18432 MiB f16 KV cache (131072 x 36 x 8 x 256 x 2 B) + 1536 MiB runtime = 22353 MiB; 10240 fit
    assert "the model needs 21.8 GB" in problem and "KV cache 18.0 GB" in problem
    assert "a mig-1g.10gb partition holds 10 GB: 11.8 GB short" in problem
    assert "use a larger partition type" in problem and "lower the context (image.max_tokens)" in problem


# -- config load ---------------------------------------------------------------------------------------------

def test_a_ledger_url_with_a_password_is_refused_without_echoing_it(aws_release, tiny_release, tmp_path):
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state",
                                          backend__ledger_url="postgresql+psycopg://shiplift:hunter2@db.internal:5432/shiplift")
    with pytest.raises(ConfigError) as caught:
        load_release_config(config, environ={})
    message = str(caught.value)
    assert "backend.ledger_url" in message and "ledger_url carries a password" in message and "PGPASSWORD" in message
    assert "hunter2" not in message, "the refusal must not print the secret it refuses (DESIGN §12)"


def test_an_unknown_instance_type_is_refused_at_load(aws_release, tiny_release, tmp_path):
    placement = {"kind": "instance_pool", "pools": [{"instance_type": "ml.g6e.xlarge", "priority": 1},
                                                    {"instance_type": "ml.g99.xlarge", "priority": 2}],
                 "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state", placement=placement)
    with pytest.raises(ConfigError) as caught:
        load_release_config(config, environ={})
    message = str(caught.value)
    assert ("placement.pools[1].instance_type: Value error, "
            "ml.g99.xlarge is not a SageMaker hosting instance type") in message
    assert "ProductionVariantInstanceType" in message and "ml.g6e.xlarge'" not in message
