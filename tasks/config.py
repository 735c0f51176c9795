"""Typed release configuration (DESIGN §2).

Load order: built-in defaults → the YAML file → `SHIPLIFT_CONFIG__a__b=value` environment
variables → `--set a.b=value` flags. Every model is frozen and forbids unknown keys; a bad
config raises ConfigError naming the file, the field path and what was expected.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, Field, SerializeAsAny, ValidationError, ValidationInfo, field_validator, model_serializer, model_validator

from tasks.backends.aws.backend_config import AwsBackend
from tasks.backends.local.backend_config import LocalBackend
from tasks.config_types import NAME_PATTERN, URL_PASSWORD, DatasetRef, Strict
from tasks.errors import ConfigError
from tasks.families.base import ArtifactConfig, BuiltImageConfig, GateConfig, ImageConfig
from tasks.families.registry import artifact_models, family_of, image_models, validation_models
from tasks.hashing import sha256_json
from tasks.backends.interfaces import BakeAlarms, RolloutPlan, ScaleToZeroPlan
from tasks.backends.capacity import batch_problem, room_problem
from tasks.backends.placement import InstancePoolPlacement, MigPartitionPlacement, Placement, driver_problem, is_gpu_instance
from tasks.secret_keys import looks_secret
from tasks.yamlfile import parse_yaml, read_yaml_file

ENV_PREFIX = "SHIPLIFT_CONFIG__"
MAX_RESOURCE_NAME = 63
PRIVATE_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)")
LOCATION_FIELDS = ("state_dir", "ledger_url", "profile", "checkpoints", "checkpoint_witness", "model_registry")  # left out of the config hash

Backend = Annotated[Union[LocalBackend, AwsBackend], Field(discriminator="kind")]


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
    def _approvers_go_with_required(self) -> "ApprovalConfig":
        if self.required and not self.approvers:
            raise ValueError("promotion.approval.required needs approvers: list who may approve (e.g. [alice@ops-host])")
        if self.approvers and not self.required:
            raise ValueError("promotion.approval.approvers are listed but required is false, so nobody would be asked; "
                             "set required: true, or leave approvers out")
        if len(set(self.approvers)) != len(self.approvers):
            raise ValueError("promotion.approval.approvers lists someone twice; list each identity once")
        return self


class PromotionConfig(Strict):
    """What must happen between a passed gate and production."""

    approval: ApprovalConfig = ApprovalConfig()




class AllAtOnce(Strict):
    """Replace every copy at once (the previous release keeps serving until the new copies are ready)."""

    strategy: Literal["all_at_once"]
    copies: int = Field(1, ge=1, le=16)

    def plan(self) -> RolloutPlan:
        return RolloutPlan(strategy="all_at_once")


class CapacitySize(Strict):
    """A number of copies, counted as SageMaker's InferenceComponentCapacitySize counts them."""

    type: Literal["COPY_COUNT", "CAPACITY_PERCENT"] = "COPY_COUNT"
    value: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _percent(self) -> "CapacitySize":
        if self.type == "CAPACITY_PERCENT" and self.value > 100:
            raise ValueError(f"a CAPACITY_PERCENT value is at most 100, got {self.value}")
        return self

    def copies_of(self, total: int) -> int:
        """The copies this size means out of `total` (a percentage rounds down, to at least one copy)."""
        return min(total, self.value) if self.type == "COPY_COUNT" else max(1, total * self.value // 100)


class OnlineGate(Strict):
    """A labelled canary set replayed through the live component in every bake, judged on the candidate's own
    answers against the champion's under the release's thresholds and champion rule. A gate that has not decided at
    the end of a bake's replay follows validation.inconclusive.choice (extend: `extend_rounds` more; else it blocks)."""

    split: str = Field("test", min_length=1, description="the split of the release's validation datasets replayed")
    max_tasks: int = Field(64, ge=1, le=10_000, description="at most this many tasks of that split, in file order")
    rounds: int = Field(4, ge=1, le=32, description="resends of tasks a champion copy answered, per bake")
    concurrency: int = Field(1, ge=1, le=64, description="requests in flight at once: the canary set is a probe, not "
                             "load, so its latencies are the copies' own")
    extend_rounds: int = Field(8, ge=1, le=256, description="with validation.inconclusive.choice extend: the most extra "
                               "rounds one bake replays while the gate has not decided, before it blocks")

    @model_serializer(mode="wrap")
    def _default_extension_unwritten(self, handler):
        """A gate that leaves `extend_rounds` at its default dumps (and hashes into a release id) as before it existed."""
        data = handler(self)
        if self.extend_rounds == type(self).model_fields["extend_rounds"].default:
            data.pop("extend_rounds", None)
        return data


class RollingUpdate(Strict):
    """Batches of copies with a bake after each, parameters as SageMaker's RollingUpdatePolicy takes them."""

    copies: int = Field(2, ge=2, le=16)
    alarms: BakeAlarms = BakeAlarms()
    online_gate: OnlineGate | None = None
    batch: CapacitySize = CapacitySize()
    wait_interval_s: int = Field(300, ge=0, le=3600, description="bake after each batch (WaitIntervalInSeconds)")
    rollback_batch: CapacitySize | None = Field(None, description="copies rolled back at a time; unset: all at once")
    maximum_execution_timeout_s: int = Field(3600, ge=600, le=28800, description="MaximumExecutionTimeoutInSeconds")

    @model_validator(mode="after")
    def _batch_leaves_old_copies(self) -> "RollingUpdate":
        if self.batch.copies_of(self.copies) >= self.copies:
            raise ValueError(
                f"a batch of {self.batch.copies_of(self.copies)} of {self.copies} copies replaces them all at once; "
                "make the batch smaller than rollout.copies, or use strategy all_at_once"
            )
        return self

    def plan(self) -> RolloutPlan:
        return RolloutPlan(
            strategy=self.strategy,
            batch_copies=self.batch.copies_of(self.copies),
            wait_interval_s=self.wait_interval_s,
            rollback_batch_copies=self.rollback_batch.copies_of(self.copies) if self.rollback_batch else None,
            max_execution_s=self.maximum_execution_timeout_s,
            alarms=self.alarms,
            online_gate=self.online_gate is not None,
        )


class Canary(RollingUpdate):
    """One batch of new copies, a bake, then the rest."""

    strategy: Literal["canary"]


class Linear(RollingUpdate):
    """Equal batches of new copies, a bake after each."""

    strategy: Literal["linear"]


BLUE_GREEN_REFUSED = (
    "rollout.strategy blue_green is not offered: on inference-component endpoints every caller names the "
    "component it invokes (InferenceComponentName), so a second, green component gets no traffic until every "
    "caller changes, and going back means changing them all again. A rolling update replaces the copies behind "
    "the one name instead; use canary (one batch, a bake, then the rest) or linear (equal batches, a bake after each)"
)


class BlueGreen(Strict):
    """Refused with the reason, so an old config says what to use instead."""

    strategy: Literal["blue_green"]

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        raise ValueError(BLUE_GREEN_REFUSED)


Rollout = Annotated[Union[AllAtOnce, Canary, Linear, BlueGreen], Field(discriminator="strategy")]


class ScaleToZero(Strict):
    """Production's copies scale in to zero after `idle_s` without a request and a copy starts again on the first
    request that finds none (that request and those during the start fail retryably; callers retry). The gate
    measures `cold_starts` starts of the candidate from zero, each until its first answer, and fails the release
    when their p95 is above `max_cold_start_p95_s` (docs/fleet.md, "Scale to zero")."""

    max_copies: int | None = Field(None, ge=1, le=64, description="most copies a busy component scales out to; "
                                   "unset: rollout.copies")
    idle_s: int = Field(900, ge=1, le=86400, description="seconds without an invocation before the copies go "
                        "(aws: the target-tracking policy's ScaleInCooldown)")
    invocations_per_copy: float = Field(10.0, gt=0, le=1e6, description="target invocations per copy and minute "
                                        "(aws: SageMakerInferenceComponentInvocationsPerCopy)")
    cold_starts: int = Field(3, ge=1, le=20, description="starts from zero the gate measures on the candidate")
    max_cold_start_p95_s: float = Field(gt=0, le=3600, allow_inf_nan=False,
                                        description="the gate's bound on the p95 of those starts, each from the first "
                                        "request to its answer")

    def plan(self, copies: int) -> ScaleToZeroPlan:
        return ScaleToZeroPlan(max_copies=self.max_copies or copies, idle_s=self.idle_s,
                               invocations_per_copy=self.invocations_per_copy)


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
    def _one_model_family(self) -> "ReleaseConfig":
        family = self.family
        if self.validation.kind != family.validation_kind:
            raise ValueError(
                f"artifact.kind {self.artifact.kind} on image.kind {self.image.kind} is gated by validation.kind "
                f"{family.validation_kind}, got validation.kind {self.validation.kind}"
            )
        return self

    @model_validator(mode="after")
    def _temperature_can_be_applied(self) -> "ReleaseConfig":
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
    def _rolling_update_fits_sagemaker(self) -> "ReleaseConfig":
        if self.backend.kind == "aws" and self.rollout.strategy != "all_at_once":
            problem = batch_problem(self.rollout)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _base_image_pullable_by_codebuild(self) -> "ReleaseConfig":
        if self.backend.kind == "aws" and isinstance(self.image, BuiltImageConfig):
            from tasks.backends.aws.base_images import base_image_problem

            problem = base_image_problem(self.image.base_image, account=self.backend.account_id, region=self.backend.region)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _online_gate_can_decide(self) -> "ReleaseConfig":
        gate = getattr(self.rollout, "online_gate", None)
        if gate is None:
            return self
        if not self.family.replays_online:
            raise ValueError(f"rollout.online_gate replays the gate's tasks through the live component; {self.artifact.kind} "
                             f"releases ({self.validation.kind} gates) cannot yet, so leave it out")
        listed = [ref.splits for ref in self.validation.datasets]
        if all(splits for splits in listed) and not any(gate.split in splits for splits in listed):
            raise ValueError(f"rollout.online_gate.split {gate.split!r} is not a split any validation dataset keeps "
                             f"({sorted({s for splits in listed for s in splits})}); name one of them")
        if gate.max_tasks < self.validation.champion.min_samples:
            raise ValueError(f"rollout.online_gate.max_tasks ({gate.max_tasks}) is below validation.champion.min_samples "
                             f"({self.validation.champion.min_samples}), so the gate could never decide; raise it")
        return self

    @model_validator(mode="after")
    def _someone_to_ask(self) -> "ReleaseConfig":
        if self.validation.inconclusive.choice == "ask" and not self.promotion.approval.required:
            raise ValueError("validation.inconclusive.choice ask hands an inconclusive gate to a person, but "
                             "promotion.approval names nobody; set promotion.approval {required: true, approvers: [...]}, "
                             "or choose block or extend")
        return self

    @model_validator(mode="after")
    def _serverless_can_host(self) -> "ReleaseConfig":
        """What Serverless Inference cannot host or do, refused before anything runs
        (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html, deployment-guardrails-exclusions.html)."""
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
            raise ValueError(f"rollout.strategy {self.rollout.strategy} moves inference-component copies in batches, but a "
                             "serverless endpoint has neither (SageMaker does no rolling deployment of one); use "
                             "rollout.strategy: all_at_once")
        if self.rollout.copies != 1:
            raise ValueError(f"rollout.copies is {self.rollout.copies}, but a serverless endpoint has no copies: SageMaker "
                             "starts compute per request up to placement.max_concurrency; leave rollout.copies out")
        if self.backend.kind == "aws" and placement.cold_starts > 1:
            raise ValueError(f"placement.cold_starts is {placement.cold_starts}, but on SageMaker only a new serverless "
                             "endpoint's first request is sure to start cold (no call sends its compute away); set "
                             "placement.cold_starts: 1")
        return self

    @model_validator(mode="after")
    def _placement_fits_image(self) -> "ReleaseConfig":
        placement, image = self.placement, self.image
        if placement.kind == "serverless":
            return self
        types = [p.instance_type for p in placement.pools] if isinstance(placement, InstancePoolPlacement) else [placement.instance_type]
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
                problem = driver_problem(instance_type, ami, needs_driver=image.min_gpu_driver, what=f"the {image.kind} GPU image",
                                         partition_type=getattr(placement, "partition_type", None))
                if problem:
                    raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _scale_to_zero_fits(self) -> "ReleaseConfig":
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
                             f"their bill) unless ManagedInstanceScaling may go to zero: set {needs} (MinInstanceCount 0 "
                             "alone does nothing without scale_to_zero, which adds the scaling policies)")
        return self

    @model_validator(mode="after")
    def _names_fit(self) -> "ReleaseConfig":
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


def _set_path(tree: dict, dotted: str, value: Any, origin: str) -> None:
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"{origin}: empty segment in {dotted!r}", fix="use a.b.c=value")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {dotted!r} descends into {key!r}, which is not a mapping", fix="override the parent key instead")
        node = child
    node[keys[-1]] = value


def _find_secret_keys(tree: Any, path: str = "") -> list[str]:
    found = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            here = f"{path}.{key}" if path else str(key)
            if looks_secret(key):
                found.append(here)
            found.extend(_find_secret_keys(value, here))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            found.extend(_find_secret_keys(value, f"{path}[{index}]"))
    return found


def _refuse_secrets(found: list[str], origin: object) -> None:
    """Secret-looking keys are named, never their values."""
    if found:
        raise ConfigError(
            f"{origin}: keys that look like secrets are not allowed in configs: {', '.join(found)}",
            fix="remove them; credentials come from the AWS credential chain or Airflow connections",
        )


def _apply_override(tree: dict, dotted: str, text: str, origin: str) -> None:
    """Set one `a.b.c` override, its value parsed as YAML; a secret-looking key is refused before its value is read."""
    _refuse_secrets([dotted] if any(looks_secret(key) for key in dotted.split(".")) else [], origin)
    _set_path(tree, dotted, parse_yaml(text, origin, field=dotted), origin)


def _field_path(tree: Any, loc: tuple) -> str:
    """The error location as the user wrote it: union tags that pydantic adds (`semif`, `pypi`) are dropped."""
    parts, node = [], tree
    for step in loc:
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        elif isinstance(node, (dict, list)) and step != loc[-1]:
            continue
        else:
            node = None
        parts.append(f"[{step}]" if isinstance(step, int) else str(step))
    return ".".join(parts).replace(".[", "[") or "(top level)"


FAMILY_PARTS = {"artifact": artifact_models, "image": image_models, "validation": validation_models}


def _members(annotation: Any) -> list:
    """What a field's annotation may hold, one entry per alternative (through Annotated, unions and Optional)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return [member for arg in get_args(annotation) for member in _members(arg)]
    return [annotation]


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def _tags(model: type[BaseModel]) -> dict[str, Any]:
    """The Literal fields of a model (`strategy: Literal["canary"]`): what tells it apart in a tagged union."""
    return {name: get_args(info.annotation) for name, info in model.model_fields.items()
            if get_origin(info.annotation) is Literal}


def _narrowed(candidates: list, node: Any) -> list:
    """The models among `candidates` whose tags (`kind`, `strategy`) the user's mapping names, when it names any."""
    models = [c for c in candidates if _is_model(c)]
    if len(models) < 2 or not isinstance(node, dict):
        return models
    chosen = [m for m in models if all(node[k] in values for k, values in _tags(m).items() if k in node)
              and any(k in node for k in _tags(m))]
    return chosen or models


def _family_models(part: str, node: Any, tree: Any) -> list:
    """The family classes that validate `artifact`, `image` or `validation` (chosen by kind, as `_family_part`)."""
    models = FAMILY_PARTS[part]()
    kind = node.get("kind") if isinstance(node, dict) else None
    if part == "validation" and kind is None and isinstance(tree, dict):
        try:
            kind = family_of(tree["artifact"]["kind"], tree["image"]["kind"]).validation_kind
        except Exception:  # noqa: BLE001 - no family follows from what is there: every gate's keys
            kind = None
    return [models[kind]] if isinstance(kind, str) and kind in models else list(models.values())


def _key_context(loc: tuple, tree: Any) -> tuple[list, list[str]] | None:
    """(the model classes that hold the key `loc[-1]`, the path to it as the user wrote it), walking the config's
    models along the error's location: a tagged union's variant (the tag pydantic inserts into `loc`), a family part's
    class (by its kind), list items; None when the location leads to no model."""
    candidates: list = [ReleaseConfig]
    node, parts, tagged = tree, [], False
    for step in loc[:-1]:
        if tagged:  # pydantic names the variant of a tagged union it tried: not a key the user wrote
            tagged = False
            chosen = [m for m in candidates if _is_model(m) and any(step in values for values in _tags(m).values())]
            candidates = chosen or candidates
            continue
        if isinstance(step, int):
            candidates = [get_args(c)[0] for c in candidates if get_origin(c) in (list, tuple) and get_args(c)]
            node = node[step] if isinstance(node, list) and 0 <= step < len(node) else None
            parts.append(f"[{step}]")
            continue
        child = node.get(step) if isinstance(node, dict) else None
        models = _narrowed(candidates, node)
        holder = next((m for m in models if step in m.model_fields), None)
        if holder is None:
            values = [get_args(c)[1] for c in candidates if get_origin(c) is dict and len(get_args(c)) == 2]
            if not values:
                return None
            candidates = [member for value in values for member in _members(value)]
        elif holder is ReleaseConfig and step in FAMILY_PARTS:
            candidates = _family_models(step, child, tree)
        else:
            info = holder.model_fields[step]
            candidates, tagged = _members(info.annotation), info.discriminator is not None
        node = child
        parts.append(str(step))
    models = _narrowed(candidates, node)
    return (models, parts) if models else None


def did_you_mean(loc: tuple, tree: Any) -> tuple[str, list[str], list[str]] | None:
    """For an unknown key at `loc`: (its path as written, the closest valid keys as full paths, every valid key at
    that level); the closest are looked for among the keys of that level, then one level down
    (`validation.min_accuracy` → `validation.thresholds.min_accuracy`). None when the level cannot be told."""
    import difflib

    try:
        found = _key_context(tuple(loc), tree)
        key = loc[-1]
        if found is None or not isinstance(key, str):
            return None
        models, parts = found
        names = list(dict.fromkeys(name for model in models for name in model.model_fields))
        close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
        if not close:
            below = list(dict.fromkeys(
                f"{name}.{inner}" for model in models for name, info in model.model_fields.items()
                for member in _members(info.annotation) if _is_model(member) for inner in member.model_fields))
            by_leaf: dict[str, list[str]] = {}
            for dotted in below:
                by_leaf.setdefault(dotted.rsplit(".", 1)[1], []).append(dotted)
            close = [d for leaf in difflib.get_close_matches(key, list(by_leaf), n=3, cutoff=0.75) for d in by_leaf[leaf]]
        prefix = ".".join(parts).replace(".[", "[")
        full = lambda name: f"{prefix}.{name}" if prefix else name  # noqa: E731
        return full(key), [full(name) for name in close], names
    except Exception:  # noqa: BLE001 - a suggestion is a courtesy: never the reason an error is not reported
        return None


def _format_validation_error(origin: str, exc: ValidationError, tree: Any,
                             set_by: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The error's lines (one per problem, at the path the user wrote) and the fixes it can name: for an unknown key,
    the closest valid key(s) of that level of the config (a --set or environment override is named as such)."""
    lines, fixes = [], []
    for err in exc.errors():
        where = _field_path(tree, err["loc"])
        got = err.get("input")
        shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        shown = URL_PASSWORD.sub(r"\1***@", shown)  # a refused ledger_url must not echo its password
        shown = PRIVATE_PEM.sub("<a private key, not shown>", shown)  # one pasted where a public key belongs
        line = f"  {where}: {err['msg']} (got {shown})"
        hint = did_you_mean(err["loc"], tree) if err["type"] == "extra_forbidden" else None
        if hint is not None:
            written, close, names = hint
            origin_of = (set_by or {}).get(written)
            line = f"  {written}: unknown key{f' (from {origin_of})' if origin_of else ''}: {err['msg']} (got {shown})"
            if close:
                line += f"; did you mean {' or '.join(close)}?"
                if origin_of and origin_of.startswith("--set "):
                    typed = origin_of.removeprefix("--set ")
                    fixes.append(f"write --set {close[0]}{typed[len(written):]}=… instead of --set {typed}=…")
                else:
                    fixes.append(f"rename {written} to {close[0]}")
            else:
                line += f"; the keys there are: {', '.join(names)}"
                fixes.append(f"remove {written}, or use one of the keys listed")
        lines.append(line)
    return f"{origin}: invalid release config\n" + "\n".join(lines), fixes


def _same_variant(base: dict, top: dict) -> bool:
    return all(base.get(tag) == top.get(tag) for tag in ("kind", "strategy") if tag in top)


def _deep_merge(base: dict, top: dict) -> dict:
    """Mappings merge key by key, except that a different `kind`/`strategy` replaces the whole mapping."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(value, dict) and isinstance(below, dict) and _same_variant(below, value):
            merged[key] = _deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def _read_tree(path: Path, chain: tuple[Path, ...]) -> dict:
    """Read one YAML file; `extends: other.yaml` (relative to it) is merged underneath, mappings deeply."""
    if not path.is_file():
        raise ConfigError(f"release config {path} does not exist", fix="pass a file under configs/releases/")
    if path.resolve() in chain:
        raise ConfigError(f"{path}: `extends` loops back through {[str(p) for p in chain]}", fix="remove the cycle")
    tree = read_yaml_file(path, "release config")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(tree).__name__}", fix="see configs/releases/gemma-decision.yaml")
    parent = tree.pop("extends", None)
    if parent is None:
        return tree
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends must be a file name, got {parent!r}", fix="write extends: other.yaml")
    return _deep_merge(_read_tree(path.parent / parent, chain + (path.resolve(),)), tree)


def load_release_config(
    path: str | Path, *, overrides: list[str] | tuple[str, ...] = (), environ: dict[str, str] | None = None
) -> ReleaseConfig:
    """Read, layer and validate a release config; raise ConfigError naming file, field and fix."""
    path = Path(path)
    tree = _read_tree(path, chain=())
    environ = os.environ if environ is None else environ
    set_by: dict[str, str] = {}  # dotted key -> the override that wrote it (named in an unknown-key error)
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX):
            dotted = name.removeprefix(ENV_PREFIX).replace("__", ".")
            _apply_override(tree, dotted, environ[name], f"environment {name}")
            set_by.update(_written_keys(dotted, f"environment {name}"))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {key.strip()!r} has no '='", fix="write --set a.b=value")
        _apply_override(tree, key.strip(), value, f"--set {key.strip()}")
        set_by.update(_written_keys(key.strip(), f"--set {key.strip()}"))
    _refuse_secrets(_find_secret_keys(tree), path)
    try:
        return ReleaseConfig.model_validate(tree)
    except ValidationError as exc:
        text, fixes = _format_validation_error(str(path), exc, tree, set_by)
        raise ConfigError(text, fix="; ".join(fixes) if fixes else "correct the fields listed above") from exc


def _written_keys(dotted: str, origin: str) -> dict[str, str]:
    """Every key an override `a.b.c` writes or creates (`a`, `a.b`, `a.b.c`), each named by the override."""
    keys = dotted.split(".")
    return {".".join(keys[:n]): origin for n in range(1, len(keys) + 1)}
