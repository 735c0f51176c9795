"""The aws backend's config: account, region, bucket, repositories, roles, and where checkpoints are signed and kept."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, field_validator

from shiplift.tasks.config_types import LedgerUrl, Strict
from shiplift.tasks.ledger.checkpoint_keys import load_public_key

# How long a cold start's measurement waits for an endpoint to give back its last instance once no component has a copy
# (SageMakerHosting.wait_for_zero_instances). ManagedInstanceScaling's IDLE_RELEASE "releases instances that have no
# hosted inference component copies"
# (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariantManagedInstanceScalingScaleInPolicy.html)
# on SageMaker's own schedule, which AWS does not state; AWS's scale-to-zero post saw about 10 minutes.
# Three times that.
INSTANCE_RELEASE_WAIT_S = 1800


class AwsCheckpoints(Strict):
    """Where the aws backend signs the ledger's head and keeps the signed checkpoints
    (`tasks.backends.aws.checkpoint_store`)."""

    key_ref: str = Field(pattern=r"^(arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:)?[A-Za-z0-9/_+=.@-]+$",
                         max_length=2048, description="name or ARN of the Secrets Manager secret holding the Ed25519 "
                         "signing key as PEM text (the config names it, never holds it)")
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="a bucket with Object Lock enabled")
    prefix: str = Field("shiplift/ledger-checkpoints", pattern=r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$",
                        max_length=512)
    retention_days: int = Field(3650, ge=1, le=36500, description="how long S3 refuses to delete a checkpoint")
    lock_mode: Literal["COMPLIANCE", "GOVERNANCE"] = Field(
        "COMPLIANCE", description="COMPLIANCE: nobody can delete early; GOVERNANCE (trial accounts) can be bypassed")
    public_key: str | None = Field(None, max_length=4096, description="the signing key's public half as PEM "
                                   "(SubjectPublicKeyInfo): verification uses it and never reads the secret; signing "
                                   "refuses a secret whose key differs. None: verification reads the secret")

    @field_validator("public_key")
    @classmethod
    def _ed25519_public_key(cls, pem: str | None) -> str | None:
        if pem is not None:
            load_public_key(pem)
        return pem


class AwsBackend(Strict):
    """S3 + CodeBuild/ECR + SageMaker + CloudWatch in one account and region; credentials never live here."""

    kind: Literal["aws"]
    region: str = Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")
    profile: str | None = Field(None, min_length=1, description="a named profile of the AWS credential chain")
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$", description="artifacts, image sources, evidence")
    key_prefix: str = Field("shiplift", pattern=r"^[A-Za-z0-9!_.*'()-]+(/[A-Za-z0-9!_.*'()-]+)*$")
    kms_key_id: str | None = Field(None, pattern=r"^(arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[A-Za-z0-9/_-]+"
                                                 r"|alias/[A-Za-z0-9/_-]+|[0-9a-f-]{36})$",
                                   description="SSE-KMS key for every object shiplift writes; "
                                               "None = the bucket default")
    execution_role_arn: str = Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+",
                                    description="what SageMaker runs models as")
    ecr_repository: str = Field(pattern=r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$",
                                max_length=256)
    codebuild_project: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{1,254}$")
    codebuild_role_arn: str = Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+",
                                    description="what CodeBuild builds images as")
    build_timeout_s: int = Field(3600, ge=300, le=8 * 3600, description="deadline of one image build")
    poll_s: float = Field(15.0, gt=0, le=300, description="seconds between status polls while waiting on AWS")
    ledger_url: LedgerUrl = Field(min_length=1,
                                  description="SQLAlchemy URL every worker reaches (PostgreSQL in production)")
    state_dir: str = Field(default_factory=lambda: os.environ.get("SHIPLIFT_HOME", ".shiplift"),
                           description="this worker's scratch and caches (nothing another worker needs)")
    checkpoints: AwsCheckpoints | None = Field(None, description="sign the ledger's head after each release; "
                                                                 "None: not checkpointed")
    model_registry: bool = Field(True, description="register each release as a version in a SageMaker Model Registry "
                                 "group per model, its approval status following the gate and promotion "
                                 "(a view of the ledger)")

    @property
    def instance_release_wait_s(self) -> int:
        """The longest a cold start waits for the endpoint to give back its instances (the validate stage's timeout
        counts it per start)."""
        return INSTANCE_RELEASE_WAIT_S

    @property
    def account_id(self) -> str:
        """The account of the execution role (the one the release deploys into)."""
        return self.execution_role_arn.split(":")[4]
