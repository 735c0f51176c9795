"""`shiplift release CONFIG --dry-run` for an aws config: every request the release would send, sending nothing.

The requests are built by the same builders the aws backend sends (`S3ArtifactStore`,
`CodeBuildImageBuilder` or, for a published image, `published_images`, `SageMakerHosting`, the eval
runners' request bodies), in the order a first release on a fresh account sends them (with
`backend.checkpoints`, also the checkpoint checks of preflight and the signed checkpoint at the
release's end), and each one is validated against the installed botocore service model, maximum
lengths, enums and patterns included (`tasks.backends.aws.service_model`). No credentials are needed.
Values only a real build can know (the sha256 of an archive, the ECR digest, the memory the build
measures, and every name derived from them) are deterministic placeholders that still fit their
field's pattern; each request lists the parameters that carry one. Waits appear once per wait (the
describe that would be polled).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tasks.backends.aws.base_images import docker_hub_note
from tasks.backends.aws.service_model import validate_request
from tasks.backends.interfaces import ComponentSpec, ModelRef
from tasks.families.base import AdoptedImageConfig
from tasks.pipeline.stages.common import candidate_name, compute, production_component, production_endpoint

PLACEHOLDER_PART = "one UploadPart per 64 MiB part of the file"


@dataclass
class Request:
    """One request the release would send; `placeholders` names the parameters holding a placeholder, and why."""

    stage: str
    service: str
    operation: str
    params: dict[str, Any]
    placeholders: dict[str, str] = field(default_factory=dict)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The printed line: stage, service, operation, params (bodies as text or a size), placeholders, note."""
        line: dict[str, Any] = {"stage": self.stage, "service": self.service, "operation": self.operation,
                                "params": _printable(self.params)}
        if self.placeholders:
            line["placeholders"] = self.placeholders
        if self.note:
            line["note"] = self.note
        return line


def _printable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", errors="replace")
        return text if text.startswith("{") else f"<{len(value)} bytes>"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def placeholder_hex(what: str, release_id: str) -> str:
    """A deterministic sha256-shaped stand-in for a value only a real build can know."""
    return hashlib.sha256(f"shiplift-dry-run:{what}:{release_id}".encode()).hexdigest()


class Plan:
    """Collects validated requests and marks every parameter that carries a placeholder value."""

    def __init__(self, arn: str = "arn:aws:sagemaker:us-east-1:000000000000"):
        self.arn = arn  # arn:aws:sagemaker:<region>:<account>, for the ListTags requests
        self.requests: list[Request] = []
        self.stage = "preflight"
        self.placeholders: dict[str, str] = {}  # placeholder text -> what it stands for

    def stand_in(self, value: str, what: str) -> str:
        """Register a placeholder value so every parameter holding it is marked."""
        self.placeholders[value] = what
        return value

    def add(self, service: str, operation: str, *, note: str | None = None, also: dict[str, str] | None = None,
            **params: Any) -> None:
        """Validate and record one request; `also` marks placeholders that are not strings (a measured number)."""
        validate_request(service, operation, params)
        marked: dict[str, str] = dict(also or {})
        _mark(params, "", self.placeholders, marked)
        self.requests.append(Request(self.stage, service, operation, params, marked, note))


def _mark(value: Any, path: str, placeholders: dict[str, str], marked: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _mark(item, f"{path}.{key}" if path else key, placeholders, marked)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _mark(item, f"{path}[{index}]", placeholders, marked)
    elif isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        found = [what for stand_in, what in placeholders.items() if stand_in in text]
        if found:
            marked[path] = "; ".join(dict.fromkeys(found))


def plan_release(config, *, config_dir: Path, with_champion: bool = False) -> list[Request]:
    """The requests of a first release of `config` (an aws config) on an account where nothing of it exists yet; with
    `with_champion`, of a later one: its gate also scores the serving champion and its promote updates production."""
    from tasks.backends.aws.backend import aws_backends
    from tasks.pipeline.release import release_id_for

    backend = config.backend
    parts = aws_backends(config, state_dir=Path(backend.state_dir), session=None)
    store, images, hosting = parts["store"], parts["images"], parts["hosting"]
    release_id = release_id_for(config)
    plan = Plan(arn=f"arn:aws:sagemaker:{backend.region}:{backend.account_id}")
    plan.add("sts", "GetCallerIdentity")
    plan.add("s3", "HeadBucket", Bucket=backend.bucket)
    if backend.kms_key_id:
        plan.add("kms", "DescribeKey", KeyId=backend.kms_key_id, note="the key must exist and be an enabled symmetric key")
    if backend.checkpoints is not None:
        _check_checkpoints(plan, backend.checkpoints)

    def upload(what: str, name: str) -> str:
        """The requests of `S3ArtifactStore.put_file` for a large file (multipart); returns its s3:// URI."""
        sha = plan.stand_in(placeholder_hex(what, release_id), f"sha256 of {what}, known after the build")
        key = store.key(sha, name)
        plan.add("s3", "HeadObject", Bucket=backend.bucket, Key=key, ChecksumMode="ENABLED")
        encryption = store.encryption_params()
        plan.add("s3", "CreateMultipartUpload", Bucket=backend.bucket, Key=key, ChecksumAlgorithm="SHA256",
                 Metadata={"sha256": sha}, **encryption, note="files up to 64 MiB go up in one conditional PutObject instead")
        part = plan.stand_in(base64.b64encode(bytes.fromhex(placeholder_hex(f"{what} part 1", release_id))).decode(),
                             f"SHA-256 of each part of {what}")
        plan.add("s3", "UploadPart", Bucket=backend.bucket, Key=key, UploadId="<UploadId>", PartNumber=1, Body=b"",
                 ChecksumAlgorithm="SHA256", ChecksumSHA256=part, note=PLACEHOLDER_PART)
        plan.add("s3", "CompleteMultipartUpload", Bucket=backend.bucket, Key=key, UploadId="<UploadId>", IfNoneMatch="*",
                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"<ETag>"', "ChecksumSHA256": part}]})
        plan.add("s3", "HeadObject", Bucket=backend.bucket, Key=key, ChecksumMode="ENABLED", note="verify size and sha256")
        return f"s3://{backend.bucket}/{key}"

    family = config.family
    plan.stage = "resolve"
    upload("the model source", family.source_file_name(config.artifact))
    plan.stage = "build"
    upload("the built model", family.built_file_name(config.artifact))
    plan.stage = "package"
    artifact_uri = upload("model.tar.gz", "model.tar.gz")
    artifact_sha = artifact_uri.split("/sha256/")[1].split("/")[0]

    plan.stage = "image"
    image = config.image
    if isinstance(image, AdoptedImageConfig):
        image_uri = _published_image(plan, image, backend.region, release_id)
    else:
        image_uri = _built_image(plan, image, backend, store, images, release_id)
    digest = image_uri.rsplit("@", 1)[1]

    memory = 1024
    ref = ModelRef(release_id=release_id, artifact_sha256=artifact_sha, image_digest=digest)
    spec_for = lambda copies: ComponentSpec(  # noqa: E731
        image_uri=image_uri, artifact_uri=artifact_uri, artifact_sha256=artifact_sha,
        environment=image.container_env(), copies=copies, compute=compute(config, memory), model_ref=ref)
    candidate = candidate_name(config, artifact_sha, digest)
    plan.stand_in(candidate, "a name derived from the artifact sha256 and the image digest")
    plan.stage = "deploy_candidate"
    names = _deploy(plan, hosting, candidate, candidate, spec_for(1), config.placement, role="candidate")

    plan.stage = "validate"
    single = hosting.single_model(config.placement, "candidate")
    plan.add("sagemaker", "DescribeEndpoint", EndpointName=candidate, note="the endpoint to invoke exists")
    if single:
        plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=candidate,
                 note="a single-model endpoint: no InferenceComponentName on InvokeEndpoint")
    production_names = production_endpoint(config), production_component(config)
    if with_champion:
        champion = _champion(plan, hosting, config, spec_for(config.rollout.copies), *production_names)
    else:
        plan.add("sagemaker", "DescribeEndpoint", EndpointName=production_names[0],
                 note="is a champion serving? on a fresh account: no (then no champion comparison)")
    _invocations(plan, config, config_dir, candidate, None if single else candidate)
    if with_champion:
        _invocations(plan, config, config_dir, *production_names, note="the champion, on the same tasks")
    for name in ("gate-report.json", "predictions.jsonl", "report.html"):
        sha = plan.stand_in(placeholder_hex(name, release_id), f"sha256 of {name}")
        plan.add("s3", "HeadObject", Bucket=backend.bucket, Key=store.key(sha, name), ChecksumMode="ENABLED")
        plan.add("s3", "PutObject", **{**store.put_params(store.key(sha, name), b"", sha),
                                       "ChecksumSHA256": base64.b64encode(bytes.fromhex(sha)).decode()})

    registry = parts.get("registry")
    if registry is not None:  # the view of the gate's decision, assumed pass (as the promote requests below are)
        report_sha = placeholder_hex("gate-report.json", release_id)
        records = [_record(plan, release_id, config, "package", {"artifact_sha256": artifact_sha}),
                   _record(plan, release_id, config, "image", {"image_digest": digest}),
                   _record(plan, release_id, config, "validate", {"decision": "pass", "metrics": {}})]
        _register(plan, registry, config, records, artifact_uri=artifact_uri, image_uri=image_uri,
                  gate_report={"uri": f"s3://{backend.bucket}/{store.key(report_sha, 'gate-report.json')}", "sha256": report_sha})

    plan.stage = "promote"
    production = spec_for(config.rollout.copies)
    if not with_champion:
        _deploy(plan, hosting, *production_names, production, config.placement, role="production")
    if config.rollout.strategy != "all_at_once":
        _rolling_update(plan, hosting, *production_names, production, config.rollout.plan(), fit=update_fit(config))
    elif with_champion:
        _update(plan, hosting, *production_names, production, champion, fit=update_fit(config))

    if registry is not None:
        records.append(_record(plan, release_id, config, "promote", {"endpoint": production_endpoint(config), "strategy":
                                                                      config.rollout.strategy, "component": production_component(config)}))
        _register(plan, registry, config, records)

    plan.stage = "teardown_candidate"
    _teardown(plan, candidate, *names)

    if backend.checkpoints is not None:
        plan.stage = "release"
        _checkpoint(plan, backend, release_id)
    return plan.requests


def _built_image(plan: Plan, image, backend, store, images, release_id: str) -> str:
    """The requests of `CodeBuildImageBuilder.build` when no image of this content exists yet; the image's URI."""
    from tasks.backends.aws.image_builder import image_tag, source_zip
    from tasks.backends.local.process_image import build_local_image

    local = build_local_image(image.kind, image.base_image)
    variant = "cuda" if image.on_gpu else "cpu"
    tag = image_tag(image.kind, variant, local.digest)
    data = source_zip(image.kind)
    source_key = images.source_key(data)
    plan.add("ecr", "DescribeRepositories", repositoryNames=[backend.ecr_repository])
    plan.add("ecr", "DescribeImages", repositoryName=backend.ecr_repository, imageIds=[{"imageTag": tag}],
             note="an image already built from this content is reused and nothing below runs")
    plan.add("codebuild", "ListBuildsForProject", projectName=backend.codebuild_project, sortOrder="DESCENDING",
             note="a build of this tag still running (an earlier attempt) is waited for instead of started again")
    plan.add("s3", "HeadObject", Bucket=backend.bucket, Key=source_key, ChecksumMode="ENABLED")
    plan.add("s3", "PutObject", **store.put_params(source_key, data, hashlib.sha256(data).hexdigest()))
    plan.add("codebuild", "BatchGetProjects", names=[backend.codebuild_project])
    plan.add("codebuild", "CreateProject", **images.project_request())
    plan.add("codebuild", "StartBuild", **images.build_request(image.kind, tag, variant, image.base_image, source_key),
             note=docker_hub_note(image.base_image))
    plan.add("codebuild", "BatchGetBuilds", ids=[f"{backend.codebuild_project}:<build id>"], note="polled until the build ends")
    plan.add("s3", "GetObject", Bucket=backend.bucket, Key=images.detail_key(tag))
    digest = "sha256:" + plan.stand_in(placeholder_hex("image digest", release_id), "ECR digest of the built image")
    plan.add("ecr", "DescribeImages", repositoryName=backend.ecr_repository, imageIds=[{"imageDigest": digest}])
    return f"{images.repository_uri()}@{digest}"


def _published_image(plan: Plan, image, region: str, release_id: str) -> str:
    """The request of `resolve_published`: the published image's tag resolved to its digest (no build, no upload); the
    image's URI, by the pinned `image.digest` or a placeholder for the digest ECR answers."""
    from tasks.backends.aws.published_images import repository_uri, resolve_request

    reference = image.reference(region)
    if image.digest:
        digest, note = image.digest, f"{reference} must still be the pinned image.digest, else nothing is deployed"
    else:
        digest = "sha256:" + plan.stand_in(placeholder_hex("published image digest", release_id),
                                           f"ECR digest of {reference}, as BatchGetImage answers it")
        note = f"{reference} resolved to its digest now; SageMaker pulls that digest, never the tag"
    plan.add("ecr", "BatchGetImage", **resolve_request(image, region), note=note)
    return f"{repository_uri(image, region)}@{digest}"


def _check_checkpoints(plan: Plan, settings) -> None:
    """The checks of `aws_checkpoint_parts` (in preflight, and again before signing): Object Lock on, the key's secret."""
    plan.add("s3", "HeadBucket", Bucket=settings.bucket, note="the checkpoint bucket")
    plan.add("s3", "GetObjectLockConfiguration", Bucket=settings.bucket, note="Object Lock must be enabled")
    plan.add("secretsmanager", "GetSecretValue", SecretId=settings.key_ref,
             note="the Ed25519 signing key as PEM text; shiplift never creates the secret")


def _checkpoint(plan: Plan, backend, release_id: str) -> None:
    """The requests of `tasks.ledger.checkpoints.checkpoint` into `S3CheckpointStore` at the release's end: read and verify
    every stored version, then put the signed head at the next position, retained."""
    from tasks.backends.aws.checkpoints import S3CheckpointStore
    from tasks.ledger.checkpoints import Checkpoint

    settings = backend.checkpoints
    store = S3CheckpointStore(None, bucket=settings.bucket, prefix=settings.prefix, retention_days=settings.retention_days,
                              lock_mode=settings.lock_mode, kms_key_id=backend.kms_key_id)
    _check_checkpoints(plan, settings)
    plan.add("s3", "ListObjectVersions", Bucket=store.bucket, Prefix=f"{store.prefix}/",
             note="every page; on a fresh account none, so this release's checkpoint takes position 1")
    plan.add("s3", "GetObject", Bucket=store.bucket, Key=store.key(1),
             VersionId=plan.stand_in("<VersionId>", "a version ListObjectVersions listed"),
             note="a later release: one per stored version, each verified against the ledger")
    ends = lambda value, what: plan.stand_in(value, f"{what}, known when the release ends")  # noqa: E731
    signed = Checkpoint(
        seq=1, head_hash=ends(placeholder_hex("ledger head", release_id), "the ledger head's hash"),
        merkle_root=ends(placeholder_hex("merkle root", release_id), "the Merkle root of the ledger's records"),
        signed_at=ends("1970-01-01T00:00:00.000000Z", "the signing time"),
        key_id=ends(placeholder_hex("checkpoint key", release_id)[:16], "the id of the secret's key"),
        signature=ends(base64.b64encode(hashlib.sha512(f"shiplift-dry-run:signature:{release_id}".encode()).digest()).decode(),
                       "the Ed25519 signature"))
    plan.add("s3", "PutObject", **store.put_params(1, signed),
             note="If-None-Match: a writer that took the position first makes this one read, verify and sign again",
             also={"Metadata.seq": "the ledger head's seq", "ChecksumSHA256": "SHA-256 of the signed checkpoint",
                   "ObjectLockRetainUntilDate": f"the signing time plus retention_days ({settings.retention_days})"})


def _record(plan: Plan, release_id: str, config, stage: str, payload: dict):
    """The succeeded ledger record a stage would append, its hash a placeholder (what the registry view reads)."""
    from tasks.ledger.store import Record

    digest = plan.stand_in(placeholder_hex(f"ledger record {stage}", release_id), f"sha256 of the {stage} ledger record")
    return Record(seq=0, record_hash=digest, prev_hash="0" * 64, release_id=release_id, model=config.name, stage=stage,
                  event="succeeded", actor="dry-run", recorded_at="", payload={"config_hash": config.config_hash(), **payload})


def _register(plan: Plan, registry, config, records: list, **first) -> None:
    """The requests of `SageMakerModelRegistry.sync` after the last of `records`: with `first` (after the gate) the
    model's group and the release's version are registered, else (after the promotion) the version is updated."""
    from tasks.backends.aws.registry import group_name, release_view

    plan.stage = "model_registry"
    view, group = release_view(records[0].release_id, records), group_name(config)
    plan.add("sagemaker", "DescribeModelPackageGroup", ModelPackageGroupName=group)
    if first:
        plan.add("sagemaker", "CreateModelPackageGroup", **registry.group_request(config), note="on a fresh account")
    plan.add("sagemaker", "ListModelPackages", **registry.list_request(group), note="is the release registered? (by its description)")
    if first:
        plan.add("sagemaker", "CreateModelPackage", **registry.package_request(config, view, **first))
    else:
        plan.add("sagemaker", "DescribeModelPackage", ModelPackageName=f"{plan.arn}:model-package/{group}/1")
    plan.add("sagemaker", "UpdateModelPackage", **registry.update_request(f"{plan.arn}:model-package/{group}/1", view, {}),
             note="a complete update: status, description and every metadata key")


def _deploy(plan: Plan, hosting, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str) -> tuple[str, str]:
    """The requests of `SageMakerHosting.deploy` on an account where none of them exist; (config, model) names."""
    on_gpu = bool(spec.compute.accelerators or spec.compute.accelerator_partition)
    model = hosting.model_request(component, spec, endpoint)
    single = hosting.single_model(placement, role)
    config = hosting.endpoint_config_request(endpoint, placement, model_name=model["ModelName"] if single else None,
                                             variant_name=component if single else "AllTraffic", on_gpu=on_gpu,
                                             release_id=spec.model_ref.release_id)
    plan.add("sagemaker", "DescribeModel", ModelName=model["ModelName"])
    plan.add("sagemaker", "CreateModel", **model)
    plan.add("sagemaker", "DescribeEndpointConfig", EndpointConfigName=config["EndpointConfigName"])
    plan.add("sagemaker", "CreateEndpointConfig", **config)
    if placement.kind == "mig_partition":
        plan.add("sagemaker", "DescribeEndpointConfig", EndpointConfigName=config["EndpointConfigName"],
                 note="read back: the AcceleratorPartitionLayouts must still be there")
    plan.add("sagemaker", "DescribeEndpoint", EndpointName=endpoint)
    plan.add("sagemaker", "CreateEndpoint", EndpointName=endpoint, EndpointConfigName=config["EndpointConfigName"],
             Tags=[t for t in config["Tags"] if t["Key"] != "shiplift:role"] + [{"Key": "shiplift:role", "Value": role}])
    plan.add("sagemaker", "DescribeEndpoint", EndpointName=endpoint, note="polled until InService (any other terminal status fails)")
    if not single:
        request = hosting.component_request(component, endpoint, spec, model["ModelName"])
        plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=component)
        plan.add("sagemaker", "CreateInferenceComponent", **request,
                 note="UpdateInferenceComponent instead when the component exists (a later release)",
                 also={"Specification.ComputeResourceRequirements.MinMemoryRequiredInMb":
                       "memory one copy needs, measured by the build (weights + KV cache + runtime)"})
        plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=component, note="polled until InService")
    _describe(plan, endpoint, component, config["EndpointConfigName"], model["ModelName"])
    return config["EndpointConfigName"], model["ModelName"]


def _champion(plan: Plan, hosting, config, spec: ComponentSpec, endpoint: str, component: str) -> tuple[str, str]:
    """The reads of `live_champion` when production serves a champion (a later release); its (config, model) names."""
    on_gpu = bool(spec.compute.accelerators or spec.compute.accelerator_partition)
    config_name = hosting.endpoint_config_request(endpoint, config.placement, model_name=None, variant_name="AllTraffic",
                                                  on_gpu=on_gpu, release_id=spec.model_ref.release_id)["EndpointConfigName"]
    model = plan.stand_in(f"{component}-{placeholder_hex('champion model', spec.model_ref.release_id)[:12]}",
                          "the champion's model, named by the release that promoted it")
    _describe(plan, endpoint, component, config_name, model)
    return config_name, model


def update_fit(config) -> str:
    """The note on an update of production: how its copies fit the endpoint (tasks.backends.capacity)."""
    from tasks.backends.capacity import room

    found = room(config.placement, config.image, config.rollout)
    if found is None:
        return "the instance type is not in shiplift's capacity tables, so the fit is not checked"
    return f"{found.describe_update()}: fits"


def _update(plan: Plan, hosting, endpoint: str, component: str, spec: ComponentSpec, champion: tuple[str, str], *,
            fit: str) -> None:
    """The requests of `SageMakerHosting.deploy` for production when the champion serves it: an update in place."""
    config_name, _ = champion
    model = hosting.model_request(component, spec, endpoint)
    plan.add("sagemaker", "DescribeModel", ModelName=model["ModelName"])
    plan.add("sagemaker", "CreateModel", **model)
    plan.add("sagemaker", "DescribeEndpointConfig", EndpointConfigName=config_name, note="production's config: it exists")
    plan.add("sagemaker", "DescribeEndpoint", EndpointName=endpoint, note="InService on that config: no endpoint change")
    plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=component, note="InService on the champion")
    request = hosting.component_request(component, endpoint, spec, model["ModelName"])
    plan.add("sagemaker", "UpdateInferenceComponent", **{k: request[k] for k in ("InferenceComponentName", "Specification", "RuntimeConfig")},
             note=f"no DeploymentConfig: the new copies start beside the old ones; capacity: {fit}",
             also={"Specification.ComputeResourceRequirements.MinMemoryRequiredInMb":
                   "memory one copy needs, measured by the build (weights + KV cache + runtime)"})
    plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=component,
             note="polled until InService; on the candidate's model is success, on the old one a failed promotion")
    _describe(plan, endpoint, component, config_name, model["ModelName"])


def _rolling_update(plan: Plan, hosting, endpoint: str, component: str, spec: ComponentSpec, rollout, *, fit: str) -> None:
    """The requests of `SageMakerHosting.roll_out` when a champion already serves the component (a later release)."""
    later = "a later release, with a champion on the component: "
    model = hosting.model_request(component, spec, endpoint)
    plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=component,
             note=later + "the first release (above) is deployed whole; every later one is a rolling update")
    plan.add("sagemaker", "DescribeModel", ModelName=model["ModelName"])
    plan.add("sagemaker", "CreateModel", **model)
    alarms = hosting.alarm_requests(endpoint, component, spec, rollout)
    for alarm in alarms:
        plan.add("cloudwatch", "PutMetricAlarm", **alarm, note=later + "an alarm SageMaker's rolling update watches")
    names = [alarm["AlarmName"] for alarm in alarms]
    plan.add("sagemaker", "UpdateInferenceComponent",
             **hosting.rolling_update_request(component, endpoint, spec, model["ModelName"], rollout, names),
             note=later + f"SageMaker moves the copies batch by batch and rolls back when an alarm fires; capacity: {fit}")
    plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=component,
             note="polled until the update ends; InService on the candidate's model is success, on the old one a rollback")
    plan.add("cloudwatch", "DescribeAlarms", AlarmNames=names, note=f"every {rollout.alarms.check_interval_s:g}s during the update")
    if rollout.online_gate:
        plan.add("cloudwatch", "PutMetricData", **hosting.gate_datum(component, failed=False),
                 note="after each replay of the online gate's canary set (InvokeEndpoint as in validate): 1 when the "
                      "candidate fails it on its own answers")
    plan.add("cloudwatch", "DeleteAlarms", AlarmNames=names, note="when the update has ended, either way")


def _describe(plan: Plan, endpoint: str, component: str, config_name: str, model_name: str) -> None:
    """The reads of `SageMakerHosting.describe`: what serves, checked against the spec by the caller."""
    plan.add("sagemaker", "DescribeEndpoint", EndpointName=endpoint, note="describe what serves")
    plan.add("sagemaker", "DescribeInferenceComponent", InferenceComponentName=component)
    plan.add("sagemaker", "DescribeEndpointConfig", EndpointConfigName=config_name)
    plan.add("sagemaker", "DescribeModel", ModelName=model_name)
    plan.add("sagemaker", "ListTags", ResourceArn=f"{plan.arn}:model/{model_name.lower()}", note="which release the model is")


def _invocations(plan: Plan, config, config_dir: Path, endpoint: str, component: str | None, *,
                 note: str | None = None) -> None:
    """One InvokeEndpoint per request the model family's gate sends (a task, a batch of pairs), with its body."""
    from tasks.config import resolve_data_path

    validation = config.validation
    paths = [(resolve_data_path(ref, config_dir), ref.splits) for ref in validation.datasets]
    bodies = config.family.invocation_bodies(validation, paths)
    named = {"InferenceComponentName": component} if component else {}
    for body in bodies:
        plan.add("sagemaker-runtime", "InvokeEndpoint", EndpointName=endpoint, Body=body, ContentType="application/json",
                 Accept="application/json", note=note, **named)


def _teardown(plan: Plan, endpoint: str, config_name: str, model_name: str) -> None:
    """The requests of `SageMakerHosting.delete_endpoint` for the candidate."""
    base = re.sub(r"-+$", "", endpoint[:52])
    plan.add("sagemaker", "ListInferenceComponents", EndpointNameEquals=endpoint)
    plan.add("sagemaker", "DescribeEndpoint", EndpointName=endpoint)
    plan.add("sagemaker", "DeleteEndpoint", EndpointName=endpoint)
    plan.add("sagemaker", "DescribeEndpoint", EndpointName=endpoint, note="polled until it is gone")
    for kind, name in (("EndpointConfig", config_name), ("Model", model_name)):
        plan.add("sagemaker", f"List{kind}s", NameContains=base)
        plan.add("sagemaker", "ListTags", ResourceArn=f"{plan.arn}:{kind.lower().replace('endpointconfig', 'endpoint-config')}/{name.lower()}",
                 note="only resources tagged shiplift:endpoint with this endpoint are deleted")
        plan.add("sagemaker", f"Delete{kind}", **{f"{kind}Name": name})
