"""The aws backend's parts, built from an `AwsBackend` config (imported lazily by `tasks.backends.registry`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.backends.aws.checkpoints import aws_checkpoint_parts
from tasks.backends.aws.hosting import SageMakerHosting
from tasks.backends.aws.image_builder import CodeBuildImageBuilder
from tasks.backends.aws.metrics import CloudWatchMetrics
from tasks.backends.aws.registry import SageMakerModelRegistry
from tasks.backends.aws.session import Aws
from tasks.backends.aws.store import S3ArtifactStore
from tasks.errors import ConfigError, NotFound


def aws_backends(config, *, state_dir: Path, session: Any = None) -> dict:
    """Store, image builder, hosting, metrics, the preflight check and the Model Registry view of one aws config; no
    AWS call is made here."""
    backend = config.backend
    aws = Aws(region=backend.region, profile=backend.profile, access=session)
    store = S3ArtifactStore(aws, bucket=backend.bucket, prefix=backend.key_prefix, kms_key_id=backend.kms_key_id,
                            cache_dir=state_dir / "s3-cache")
    hosting = SageMakerHosting(aws, backend, poll_s=backend.poll_s)
    return {"store": store, "images": CodeBuildImageBuilder(aws, backend, store, poll_s=backend.poll_s), "hosting": hosting,
            "metrics": CloudWatchMetrics(aws, hosting), "preflight": lambda: preflight(aws, backend),
            "registry": SageMakerModelRegistry(aws, backend) if backend.model_registry else None}


def preflight(aws: Aws, backend) -> dict:
    """Before anything is created: usable credentials for the config's account, the bucket in the config's region, and
    (where the config names them) a checkpoint bucket with Object Lock and a checkpoint key secret."""
    identity = aws.call("sts", "GetCallerIdentity")
    if identity["Account"] != backend.account_id:
        raise ConfigError(f"the AWS credentials are for account {identity['Account']}, but the config deploys into "
                          f"{backend.account_id} (its execution_role_arn)",
                          fix="use credentials of that account (AWS_PROFILE / backend.profile), or fix the config; nothing was created")
    try:
        bucket = aws.call("s3", "HeadBucket", Bucket=backend.bucket)
    except NotFound as exc:
        raise ConfigError(f"bucket {backend.bucket} does not exist (or is not visible to {identity['Arn']})",
                          fix="create it (see the README, On AWS) or fix backend.bucket; nothing was created") from exc
    region = bucket.get("BucketRegion") or bucket.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("x-amz-bucket-region")
    if region and region != backend.region:
        raise ConfigError(f"bucket {backend.bucket} is in {region}, the config deploys into {backend.region}",
                          fix=f"set backend.region: {region}, or use a bucket in {backend.region}; nothing was created")
    found = {"account": identity["Account"], "caller": identity["Arn"], "bucket_region": region or backend.region}
    if backend.checkpoints is not None:
        found["checkpoint_key_id"] = aws_checkpoint_parts(aws, backend.checkpoints, kms_key_id=backend.kms_key_id)[0].key_id
    return found
