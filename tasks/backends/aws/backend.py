"""The aws backend's parts, built from an `AwsBackend` config (imported lazily by `tasks.backends.registry`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shiplift.tasks.backends.aws.artifact_store import S3ArtifactStore
from shiplift.tasks.backends.aws.checkpoint_store import aws_checkpoint_parts
from shiplift.tasks.backends.aws.cloudwatch import CloudWatchMetrics
from shiplift.tasks.backends.aws.hosting import SageMakerHosting
from shiplift.tasks.backends.aws.image_builder import CodeBuildImageBuilder
from shiplift.tasks.backends.aws.model_registry import SageMakerModelRegistry
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.errors import ConfigError, NotFound


def aws_backends(config, *, state_dir: Path, session: Any = None) -> dict:
    """Store, image builder, hosting, metrics, the preflight check and the Model Registry view of one aws config; no
    AWS call is made here."""
    backend = config.backend
    aws = Aws(region=backend.region, profile=backend.profile, access=session)
    store = S3ArtifactStore(aws, bucket=backend.bucket, prefix=backend.key_prefix, kms_key_id=backend.kms_key_id,
                            cache_dir=state_dir / "s3-cache")
    hosting = SageMakerHosting(aws, backend, poll_s=backend.poll_s)
    return {"store": store, "images": CodeBuildImageBuilder(aws, backend, store, poll_s=backend.poll_s),
            "hosting": hosting, "metrics": CloudWatchMetrics(aws, hosting),
            "preflight": lambda: preflight(aws, backend),
            "registry": SageMakerModelRegistry(aws, backend) if backend.model_registry else None}


def preflight(aws: Aws, backend) -> dict:
    """Before anything is created: usable credentials for the config's account, the bucket in the config's region, and
    (where the config names them) a checkpoint bucket with Object Lock and a checkpoint key secret."""
    identity = aws.call("sts", "GetCallerIdentity")
    if identity["Account"] != backend.account_id:
        raise ConfigError(f"the AWS credentials are for account {identity['Account']}, but the config deploys into "
                          f"{backend.account_id} (its execution_role_arn)",
                          fix="use credentials of that account (AWS_PROFILE / backend.profile), or fix the "
                              "config; nothing was created")
    try:
        bucket = aws.call("s3", "HeadBucket", Bucket=backend.bucket)
    except NotFound as exc:
        raise ConfigError(f"bucket {backend.bucket} does not exist (or is not visible to {identity['Arn']})",
                          fix="create it (see the README, On AWS) or fix backend.bucket; nothing was created") from exc
    headers = bucket.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    region = bucket.get("BucketRegion") or headers.get("x-amz-bucket-region")
    if region and region != backend.region:
        raise ConfigError(f"bucket {backend.bucket} is in {region}, the config deploys into {backend.region}",
                          fix=f"set backend.region: {region}, or use a bucket in {backend.region}; nothing was created")
    found = {"account": identity["Account"], "caller": identity["Arn"], "bucket_region": region or backend.region}
    if backend.kms_key_id:
        found["kms_key_arn"] = kms_key_arn(aws, backend)
    if backend.checkpoints is not None:
        found["checkpoint_key_id"] = aws_checkpoint_parts(aws, backend.checkpoints,
                                                          kms_key_id=backend.kms_key_id)[0].key_id
    return found


def kms_key_arn(aws: Aws, backend) -> str:
    """The ARN of the key `backend.kms_key_id` names (a key id, key ARN, alias or alias ARN), refused unless it is an
    enabled symmetric encryption key: S3 encrypts objects with symmetric keys only
    (https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html)."""
    try:
        key = aws.call("kms", "DescribeKey", KeyId=backend.kms_key_id)["KeyMetadata"]
    except NotFound as exc:
        raise ConfigError(f"backend.kms_key_id {backend.kms_key_id!r} names no KMS key in {backend.region} of account "
                          f"{backend.account_id}",
                          fix="create the key and alias (aws kms create-key; aws kms create-alias), or fix "
                              "backend.kms_key_id; nothing was created") from exc
    wanted_fields = (("KeyState", "Enabled"), ("KeyUsage", "ENCRYPT_DECRYPT"), ("KeySpec", "SYMMETRIC_DEFAULT"))
    problems = [f"{field} is {key.get(field)!r}, needs {wanted!r}" for field, wanted in wanted_fields
                if key.get(field) != wanted]
    if problems:
        raise ConfigError(f"KMS key {key['Arn']} (backend.kms_key_id {backend.kms_key_id!r}): {'; '.join(problems)}",
                          fix="name an enabled symmetric encryption key in backend.kms_key_id; nothing was created")
    return key["Arn"]
