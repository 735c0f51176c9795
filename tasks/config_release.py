"""The release config's top-level model (DESIGN §2): `ReleaseConfig`, assembled from the families' and backends'
classes and the rollout parts, with the checks that span its parts, and its hash (the release id's input)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from shiplift.tasks.backends.aws.backend_config import AwsBackend
from shiplift.tasks.backends.aws.base_images import base_image_problem
from shiplift.tasks.backends.capacity import batch_problem, room_problem
from shiplift.tasks.backends.local.backend_config import LocalBackend
from shiplift.tasks.backends.placement import (
    InstancePoolPlacement,
    MigPartitionPlacement,
    Placement,
    driver_problem,
    is_gpu_instance,
)
from shiplift.tasks.config_rollout import AllAtOnce, Rollout, ScaleToZero
from shiplift.tasks.config_types import NAME_PATTERN, DatasetRef, Strict
from shiplift.tasks.families.base import ArtifactConfig, BuiltImageConfig, GateConfig, ImageConfig
from shiplift.tasks.families.registry import artifact_models, family_of, image_models, validation_models
from shiplift.tasks.hashing import sha256_json

MAX_RESOURCE_NAME = 63
# left out of the config hash
LOCATION_FIELDS = ("state_dir", "ledger_url", "profile", "checkpoints", "checkpoint_witness", "model_registry")

Backend = Annotated[LocalBackend | AwsBackend, Field(discriminator="kind")]


class CalibrationConfig(Strict):
    fit_temperature: bool = False
    dataset: DatasetRef = DatasetRef(path="builtin:decisions", splits=["calibration"])


Identity = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^\S(.*\S)?$")]


class ApprovalConfig(Strict):
    """A person approves a passed candidate before it reaches production (change control). `approvers` are the
    identities the orchestrator knows: `$SHIPLIFT_ACTOR` (else user@host) for the CLI. `four_eyes` refuses an approval
    by whoever opened the release. Unanswered for `timeout_s`, the release ends rejected and the champion keeps serving;
    the candidate is torn down while it waits unless `keep_candidate` (its cost per hour is stated)."""

    required: bool = False
    approvers: list[Identity] = []
    timeout_s: float = Field(72 * 3600, gt=0, le=30 * 24 * 3600, allow_inf_nan=False)
    four_eyes: bool = True
    keep_candidate: bool = False

    @model_validator(mode="after")
    def _approvers_go_with_required(self) -> ApprovalConfig:
        if self.required and not self.approvers:
            raise ValueError("promotion.approval.required needs approvers: "
                             "list who may approve (e.g. [alice@ops-host])")
        if self.approvers and not self.required:
            raise ValueError("promotion.approval.approvers are listed but required is false, so nobody would be asked; "
                             "set required: true, or leave approvers out")
        if len(set(self.approvers)) != len(self.approvers):
            raise ValueError("promotion.approval.approvers lists someone twice; list each identity once")
        return self


class PromotionConfig(Strict):
    """What must happen between a passed gate and production."""

    approval: ApprovalConfig = ApprovalConfig()


def _family_part(field: str, value: Any, models: dict[str, type]) -> Any:
    """One of the release config's family parts (artifact, image, validation), validated by the class its `kind`
    names; what is wrong inside it is reported at its own path (`artifact.source.sha256`)."""
    if any(isinstance(value, model) for model in models.values()):
        return value
    known = ", ".join(sorted(models))
    if not isinstance(value, dict):
        raise ValueError(f"{field} must be a mapping with a kind ({known})")
    kind = value.get("kind")
    if not isinstance(kind, str) or kind not in models:
        raise ValueError(f"{field}.kind must be one of {known}, got {kind!r}")
    return models[kind].model_validate(value)


class ReleaseConfig(Strict):
    """One model's release: what to build, where to place it, how to gate and roll it out."""

    name: str = Field(pattern=NAME_PATTERN, max_length=40, description="model name, stable across releases")
    description: str = ""
    resource_prefix: str = Field("shiplift", pattern=NAME_PATTERN, max_length=16)
    schedule: str | None = None
    artifact: SerializeAsAny[ArtifactConfig]  # the model family's classes (tasks.families), chosen by kind
    image: SerializeAsAny[ImageConfig]
    backend: Backend
    placement: Placement
    calibration: CalibrationConfig = CalibrationConfig()
    validation: SerializeAsAny[GateConfig]
    rollout: Rollout = AllAtOnce(strategy="all_at_once")
    promotion: PromotionConfig = PromotionConfig()
    scale_to_zero: ScaleToZero | None = None
    keep_candidate: bool = False

    @field_validator("artifact", mode="plain")
    @classmethod
    def _family_artifact(cls, value: Any) -> ArtifactConfig:
        return _family_part("artifact", value, artifact_models())

    @field_validator("image", mode="plain")
    @classmethod
    def _family_image(cls, value: Any) -> ImageConfig:
        return _family_part("image", value, image_models())

    @field_validator("validation", mode="plain")
    @classmethod
    def _family_gate(cls, value: Any, info: ValidationInfo) -> GateConfig:
        artifact, image = info.data.get("artifact"), info.data.get("image")
        if isinstance(value, dict) and "kind" not in value:  # the family's own gate
            if artifact is None or image is None:
                raise ValueError("validation.kind follows from artifact.kind and image.kind, which are invalid above")
            value = {**value, "kind": family_of(artifact.kind, image.kind).validation_kind}
        return _family_part("validation", value, validation_models())

    @model_validator(mode="after")
    def _one_model_family(self) -> ReleaseConfig:
        family = self.family
        if self.validation.kind != family.validation_kind:
            raise ValueError(
                f"artifact.kind {self.artifact.kind} on image.kind {self.image.kind} is gated by validation.kind "
                f"{family.validation_kind}, got validation.kind {self.validation.kind}"
            )
        return self

    @model_validator(mode="after")
    def _temperature_can_be_applied(self) -> ReleaseConfig:
        if self.calibration.fit_temperature and not self.family.temperature_scaling:
            raise ValueError(f"calibration.fit_temperature fits a temperature the server applies, but image.kind "
                             f"{self.image.kind} serves the model as published and cannot apply one; leave "
                             "calibration.fit_temperature false (or serve on an image that applies it)")
        return self

    @property
    def family(self):
        """The model family (`tasks.families.base.ModelFamily`) that owns this release's artifact and image."""
        return family_of(self.artifact.kind, self.image.kind)

    @model_validator(mode="after")
    def _rolling_update_fits_sagemaker(self) -> ReleaseConfig:
        if self.backend.kind == "aws" and self.rollout.strategy != "all_at_once":
            problem = batch_problem(self.rollout)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _base_image_pullable_by_codebuild(self) -> ReleaseConfig:
        if self.backend.kind == "aws" and isinstance(self.image, BuiltImageConfig):
            problem = base_image_problem(self.image.base_image, account=self.backend.account_id,
                                         region=self.backend.region)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _online_gate_can_decide(self) -> ReleaseConfig:
        gate = getattr(self.rollout, "online_gate", None)
        if gate is None:
            return self
        if not self.family.replays_online:
            raise ValueError("rollout.online_gate replays the gate's tasks through the live component; "
                             f"{self.artifact.kind} releases ({self.validation.kind} gates) cannot yet, "
                             "so leave it out")
        listed = [ref.splits for ref in self.validation.datasets]
        if all(splits for splits in listed) and not any(gate.split in splits for splits in listed):
            raise ValueError(f"rollout.online_gate.split {gate.split!r} is not a split any validation dataset keeps "
                             f"({sorted({s for splits in listed for s in splits})}); name one of them")
        if gate.max_tasks < self.validation.champion.min_samples:
            raise ValueError(f"rollout.online_gate.max_tasks ({gate.max_tasks}) is below "
                             f"validation.champion.min_samples ({self.validation.champion.min_samples}), so the gate "
                             "could never decide; raise it")
        return self

    @model_validator(mode="after")
    def _someone_to_ask(self) -> ReleaseConfig:
        if self.validation.inconclusive.choice == "ask" and not self.promotion.approval.required:
            raise ValueError("validation.inconclusive.choice ask hands an inconclusive gate to a person, but "
                             "promotion.approval names nobody; set promotion.approval {required: true, approvers: "
                             "[...]}, or choose block or extend")
        return self

    @model_validator(mode="after")
    def _serverless_can_host(self) -> ReleaseConfig:
        """What Serverless Inference cannot host or do, refused before anything runs
        (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html,
        deployment-guardrails-exclusions.html)."""
        placement = self.placement
        if placement.kind != "serverless":
            return self
        if self.image.on_gpu:
            raise ValueError(f"placement is serverless, which runs on CPUs only (SageMaker Serverless Inference has no "
                             f"GPUs), but the {self.image.kind} image runs on the GPU; run it on the CPU, or use an "
                             "instance or MIG placement")
        if self.scale_to_zero is not None:
            raise ValueError("a serverless endpoint scales to zero by itself; leave scale_to_zero out and set the "
                             "cold-start bound as placement.max_cold_start_p95_s")
        if self.rollout.strategy != "all_at_once":
            raise ValueError(f"rollout.strategy {self.rollout.strategy} moves inference-component copies in batches, "
                             "but a serverless endpoint has neither (SageMaker does no rolling deployment of one); use "
                             "rollout.strategy: all_at_once")
        if self.rollout.copies != 1:
            raise ValueError(f"rollout.copies is {self.rollout.copies}, but a serverless endpoint has no copies: "
                             "SageMaker starts compute per request up to placement.max_concurrency; leave "
                             "rollout.copies out")
        if self.backend.kind == "aws" and placement.cold_starts > 1:
            raise ValueError(f"placement.cold_starts is {placement.cold_starts}, but on SageMaker only a new "
                             "serverless endpoint's first request is sure to start cold (no call sends its compute "
                             "away); set placement.cold_starts: 1")
        return self

    @model_validator(mode="after")
    def _placement_fits_image(self) -> ReleaseConfig:
        placement, image = self.placement, self.image
        if placement.kind == "serverless":
            return self
        types = ([p.instance_type for p in placement.pools] if isinstance(placement, InstancePoolPlacement)
                 else [placement.instance_type])
        if isinstance(placement, MigPartitionPlacement) and not image.on_gpu:
            raise ValueError(f"placement is a MIG GPU partition but the image runs on the CPU; {image.gpu_fix}")
        problem = room_problem(placement, image, self.rollout) if self.backend.kind == "aws" else None
        if problem:
            raise ValueError(problem)
        if image.on_gpu:
            cpu_only = [t for t in types if not is_gpu_instance(t)]
            if cpu_only:
                raise ValueError(f"the image runs on the GPU but {cpu_only} have no GPU; pick GPU instance types "
                                 "or run the image on the CPU")
            ami = getattr(placement, "inference_ami_version", None)
            for instance_type in types:
                problem = driver_problem(instance_type, ami, needs_driver=image.min_gpu_driver,
                                         what=f"the {image.kind} GPU image",
                                         partition_type=getattr(placement, "partition_type", None))
                if problem:
                    raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _scale_to_zero_fits(self) -> ReleaseConfig:
        scaling = self.scale_to_zero
        if scaling is None:
            return self
        copies = self.rollout.copies
        if scaling.max_copies is not None and scaling.max_copies < copies:
            raise ValueError(f"scale_to_zero.max_copies ({scaling.max_copies}) is below rollout.copies ({copies}), the "
                             "copies a release starts with; raise it or leave it out")
        if self.backend.kind == "aws" and getattr(self.placement, "min_instance_count", None) != 0:
            needs = ("placement.min_instance_count: 0 (the MIG endpoint's one instance may then go)"
                     if isinstance(self.placement, MigPartitionPlacement) else
                     "placement.min_instance_count: 0 and placement.max_instance_count")
            raise ValueError("scale_to_zero frees the component's copies, but the endpoint keeps its instances (and "
                             f"their bill) unless ManagedInstanceScaling may go to zero: set {needs} "
                             "(MinInstanceCount 0 alone does nothing without scale_to_zero, which adds the scaling "
                             "policies)")
        return self

    @model_validator(mode="after")
    def _names_fit(self) -> ReleaseConfig:
        longest = f"{self.resource_prefix}-{self.name}-cand-{'0' * 10}"  # a shared endpoint's name is shorter
        if len(longest) > MAX_RESOURCE_NAME:
            raise ValueError(
                f"resource_prefix + name are too long: derived names such as {longest!r} would be {len(longest)} "
                f"characters, SageMaker allows {MAX_RESOURCE_NAME}; shorten resource_prefix or name"
            )
        return self

    @property
    def cold_start_bound(self) -> tuple[int, float] | None:
        """How many cold starts the gate measures and the bound on their p95: a serverless placement's, or
        scale_to_zero's; None when production never starts from zero."""
        if self.placement.kind == "serverless":
            return self.placement.cold_starts, self.placement.max_cold_start_p95_s
        if self.scale_to_zero is not None:
            return self.scale_to_zero.cold_starts, self.scale_to_zero.max_cold_start_p95_s
        return None

    def config_hash(self) -> str:
        """sha256 of the canonical JSON of the effective config, without where state, the ledger and
        credentials come from: the release id must not depend on the worker that computes it."""
        tree = self.model_dump(mode="json")
        for key in LOCATION_FIELDS:
            tree["backend"].pop(key, None)
        for added in ("max_instance_count", "min_instance_count", "endpoint"):  # added later: unset, hashes as before
            if tree["placement"].get(added, 0) is None:
                del tree["placement"][added]
        if tree.get("scale_to_zero", 0) is None:
            del tree["scale_to_zero"]
        if self.promotion == PromotionConfig():  # added later: a config without an approval hashes as before
            del tree["promotion"]
        return sha256_json(tree)
