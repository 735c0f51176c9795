"""`shiplift release CONFIG --dry-run` for an aws config: every request the release would send, sending nothing.

The dry run runs the real aws backend (`aws_backends`: `S3ArtifactStore`, `CodeBuildImageBuilder` or, for a published
image, `published_images`, `SageMakerHosting`, the Model Registry view, the checkpoint store and the gate's
`InvokeEndpoint` channel) stage by stage in the order of `tasks.pipeline.table.STAGES`, against a recording session
(`tasks.backends.aws.recording_session`): each request is validated against the installed botocore service model,
maximum lengths, enums and patterns included, recorded, and answered by a model of an account where nothing of the
release exists yet (or, with `with_champion`, where production serves a champion), so the plan is by construction
what the code sends. What only the release computes stands in: files of the multipart upload's size for the model it
downloads, builds and packages, a passing gate, the memory the build measures. Their values, and those only AWS
knows, are deterministic placeholders that still fit their field's pattern; each request lists the parameters that
carry one. Each wait shows as the describe it polls, once. No credentials are needed, nothing is sent, and nothing is
left on disk.
"""

from __future__ import annotations

import base64
import hashlib
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from tasks.backends.aws.base_images import docker_hub_note
from tasks.backends.aws.recording_session import FreshAccount, Plan, Request, placeholder_hex, recording_session
from tasks.backends.interfaces import ComponentSpec, ModelRef, ReleaseFacts
from tasks.families.base import AdoptedImageConfig
from tasks.pipeline.stages.common import (candidate_name, compute, production_component, production_endpoint,
                                          require_served)
from tasks.pipeline.table import STAGES

MEMORY_MB = 1024  # stands in for the memory one copy needs, which the build measures
MEASURED = {"Specification.ComputeResourceRequirements.MinMemoryRequiredInMb":
            "memory one copy needs, measured by the build (weights + KV cache + runtime)"}
EVIDENCE = ("gate-report.json", "predictions.jsonl", "report.html")  # what the gate writes and validate keeps
QUIET = lambda message: None  # noqa: E731


def plan_release(config, *, config_dir: Path, with_champion: bool = False) -> list[Request]:
    """The requests of a first release of `config` (an aws config) on an account where nothing of it exists yet; with
    `with_champion`, of a later one: its gate also scores the serving champion and its promote updates production."""
    with tempfile.TemporaryDirectory(prefix="shiplift-dry-run-") as scratch:
        release = DryRelease(config, config_dir, Path(scratch), with_champion=with_champion)
        release.parts["preflight"]()
        for step in STAGES:
            release.plan.stage = step.name
            getattr(release, step.name)()
        if config.backend.checkpoints is not None:
            release.plan.stage = "release"
            release.checkpoint()
    return release.annotated()


class DryRelease:
    """One release of an aws config through the real aws backend on a recording account; a method per stage of
    `STAGES` sends what that stage sends through the backend, the local computation stood in for."""

    def __init__(self, config, config_dir: Path, scratch: Path, *, with_champion: bool):
        from tasks.backends.aws.backend import aws_backends
        from tasks.pipeline.release import release_id_for

        self.config, self.config_dir, self.scratch = config, config_dir, scratch
        self.release_id = release_id_for(config)
        self.plan = Plan()
        backend = config.backend
        self.account = FreshAccount(backend, self.plan.stand_in, release_id=self.release_id)
        # The backend as configured, but: its state in the scratch folder; no pause between polls (each wait of the
        # recording account ends by its second poll); and no check of a configured checkpoint public_key, which the
        # account's stand-in secret cannot match (the requests are the same).
        checkpoints = backend.checkpoints and backend.checkpoints.model_copy(update={"public_key": None})
        dry = backend.model_copy(update={"poll_s": 0.0, "state_dir": str(scratch), "checkpoints": checkpoints})
        self.parts = aws_backends(config.model_copy(update={"backend": dry}), state_dir=scratch,
                                  session=recording_session(self.plan, self.account))
        self.store, self.hosting = self.parts["store"], self.parts["hosting"]
        self.production = production_endpoint(config), production_component(config)
        self.records: list = []  # the ledger records the registry view of the release reads
        if isinstance(config.image, AdoptedImageConfig):
            self._publish(config.image)
        if with_champion:
            self._champion()

    # -- the stages, in STAGES order -------------------------------------------------------------------------------
    def resolve(self) -> None:
        self._keep("the model source", self.config.family.source_file_name(self.config.artifact))

    def build(self) -> None:
        self._keep("the built model", self.config.family.built_file_name(self.config.artifact))

    def package(self) -> None:
        self.artifact = self._keep("model.tar.gz", "model.tar.gz")

    def image(self) -> None:
        self.image_ref = self.parts["images"].build(self.config.image, progress=QUIET)
        self.model_ref = ModelRef(release_id=self.release_id, artifact_sha256=self.artifact.sha256,
                                  image_digest=self.image_ref.digest)

    def deploy_candidate(self) -> None:
        self.candidate = self.plan.stand_in(candidate_name(self.config, self.artifact.sha256, self.image_ref.digest),
                                            "a name derived from the artifact sha256 and the image digest")
        spec = self._spec(copies=1)
        live = self.hosting.deploy(self.candidate, self.candidate, spec, self.config.placement, role="candidate", progress=QUIET)
        require_served(live, spec, where=f"candidate {self.candidate}")

    def validate(self) -> None:
        """The gate's requests, its scoring stood in for: the candidate's and the champion's channels, every request body
        of the model family's gate sent to each, the evidence kept; then the registry view of a pass."""
        from tasks.config import resolve_data_path
        from tasks.pipeline.stages.validate import live_champion

        validation = self.config.validation
        candidate = self.hosting.invoker(self.candidate, self.candidate, timeout_s=validation.request_timeout_s)
        champion, _ = live_champion(SimpleNamespace(config=self.config, backends=SimpleNamespace(hosting=self.hosting)))
        paths = [(resolve_data_path(ref, self.config_dir), ref.splits) for ref in validation.datasets]
        bodies = self.config.family.invocation_bodies(validation, paths)
        for invoker in (candidate, *([champion.invoker] if champion else [])):
            channel = invoker.open()
            for body in bodies:
                channel.post(body, validation.request_timeout_s)
        kept = {name: self._keep(name, name, in_parts=False) for name in EVIDENCE}
        report = kept["gate-report.json"]
        self._sync({"package": {"artifact_sha256": self.artifact.sha256}, "image": {"image_digest": self.image_ref.digest},
                    "validate": {"decision": "pass", "metrics": {}}},
                   gate_report={"uri": report.uri, "sha256": report.sha256})

    def promote(self) -> None:
        """What the promote stage sends for a passed candidate: the whole update, or the rolling one (with the reads of
        what serves that its traffic records take); then the registry view of the promotion."""
        from tasks.pipeline.bake import BakeWatch

        endpoint, component = self.production
        rollout, hosting = self.config.rollout, self.hosting
        spec = self._spec(copies=rollout.copies)
        if rollout.strategy == "all_at_once":
            live = hosting.deploy(endpoint, component, spec, self.config.placement, role="production", progress=QUIET)
        else:
            def traffic_record(kind: str, step) -> None:  # the stage's record of each step reads what serves
                if kind == "shifted":
                    hosting.describe(endpoint, component)

            plan = rollout.plan()
            if hosting.describe(endpoint, component) is not None and rollout.online_gate is not None:
                hosting.invoker(endpoint, component, timeout_s=self.config.validation.request_timeout_s)  # the gate's channel
            bake = BakeWatch(self.parts["metrics"], endpoint, component, spec.sha256(), plan.alarms, plan.wait_interval_s)
            hosting.roll_out(endpoint, component, spec, self.config.placement, plan, bake, progress=QUIET, on_step=traffic_record)
            live = hosting.describe(endpoint, component)
        require_served(live, spec, where=f"production {endpoint}/{component}")
        self._sync({"promote": {"endpoint": endpoint, "strategy": rollout.strategy, "component": component}})

    def teardown_candidate(self) -> None:
        self.hosting.delete_endpoint(self.candidate, progress=QUIET)

    def checkpoint(self) -> None:
        """The release's end: the checkpoint store checked again, its versions read, and the ledger's head, signed,
        put at the next position (the signing itself, which reads the ledger, stood in for)."""
        from tasks.backends.aws.checkpoints import aws_checkpoint_parts
        from tasks.ledger.checkpoints import Checkpoint

        _, store = aws_checkpoint_parts(self.hosting.aws, self.config.backend.checkpoints,
                                        kms_key_id=self.config.backend.kms_key_id)
        store.entries()
        self.plan.add("s3", "GetObject", Bucket=store.bucket, Key=store.key(1),
                      VersionId=self.plan.stand_in("<VersionId>", "a version ListObjectVersions listed"),
                      note="a later release: one per stored version, each verified against the ledger")
        ends = lambda value, what: self.plan.stand_in(value, f"{what}, known when the release ends")  # noqa: E731
        signature = hashlib.sha512(f"shiplift-dry-run:signature:{self.release_id}".encode()).digest()
        store.append(Checkpoint(
            seq=1, head_hash=ends(placeholder_hex("ledger head", self.release_id), "the ledger head's hash"),
            merkle_root=ends(placeholder_hex("merkle root", self.release_id), "the Merkle root of the ledger's records"),
            signed_at=ends("1970-01-01T00:00:00.000000Z", "the signing time"),
            key_id=ends(placeholder_hex("checkpoint key", self.release_id)[:16], "the id of the secret's key"),
            signature=ends(base64.b64encode(signature).decode(), "the Ed25519 signature")))

    # -- what the stages share -------------------------------------------------------------------------------------
    def annotated(self) -> list[Request]:
        """The recorded requests with the notes and non-string placeholders of `annotations` added, placeholders marked."""
        table = annotations(self.config)
        for request in self.plan.requests:
            note, also = table.get((request.stage, request.operation), (None, {}))
            note = note(request.params) if callable(note) else note
            request.note = "; ".join(text for text in (request.note, note) if text) or None
            request.placeholders.update({path: what for path, what in also.items() if _holds(request.params, path)})
        return self.plan.marked()

    def _keep(self, what: str, name: str, *, in_parts: bool = True):
        """The real upload (`S3ArtifactStore.put_file`) of a stand-in for a file the release computes: of the smallest
        size that goes up in parts (a model), or small (a report); its sha256 and checksums are placeholders."""
        label = f"shiplift dry run: {what} of {self.release_id}\n".encode()
        size = self.store.single_put_max_bytes + len(label) if in_parts else 2 * len(label)
        path = self.scratch / hashlib.sha256(label).hexdigest()
        with open(path, "wb") as out:  # sparse: the label at both ends (each part differs from other files' parts)
            out.write(label)
            out.seek(size - len(label))
            out.write(label)
        first = len(self.plan.requests)
        stored = self.store.put_file(path, name=name)
        path.unlink()
        self.plan.stand_in(stored.sha256, f"sha256 of {what}, known when the release computes it")
        for request in self.plan.requests[first:]:
            if request.operation in ("PutObject", "UploadPart"):
                part = f", part {request.params['PartNumber']}" if "PartNumber" in request.params else ""
                self.plan.stand_in(request.params["ChecksumSHA256"], f"SHA-256 of {what}{part}")
        return stored

    def _spec(self, *, copies: int) -> ComponentSpec:
        return ComponentSpec(image_uri=self.image_ref.uri, artifact_uri=self.artifact.uri, artifact_sha256=self.artifact.sha256,
                             environment=self.config.image.container_env(), copies=copies,
                             compute=compute(self.config, MEMORY_MB), model_ref=self.model_ref)

    def _sync(self, results: dict[str, dict], **first: Any) -> None:
        """The stages' succeeded ledger records (their hashes placeholders, their payloads `results`) appended, then the
        real registry view synced with them (`SageMakerModelRegistry.sync`); `first`: what registering the release needs."""
        from tasks.ledger.store import Record

        registry = self.parts["registry"]
        if registry is None:
            return
        for stage, payload in results.items():
            digest = self.plan.stand_in(placeholder_hex(f"ledger record {stage}", self.release_id),
                                        f"sha256 of the {stage} ledger record")
            self.records.append(Record(seq=0, record_hash=digest, prev_hash="0" * 64, release_id=self.release_id,
                                       model=self.config.name, stage=stage, event="succeeded", actor="dry-run", recorded_at="",
                                       payload={"config_hash": self.config.config_hash(), **payload}))
        self.plan.stage = "model_registry"
        registry.sync(ReleaseFacts(release_id=self.release_id, config=self.config, history=tuple(self.records),
                                   artifact_uri=self.artifact.uri, image_uri=self.image_ref.uri, **first))

    def _publish(self, image: AdoptedImageConfig) -> None:
        """The published image's tag, naming the pinned `image.digest` or, unpinned, a placeholder digest."""
        from tasks.backends.aws.published_images import resolve_request

        region = self.config.backend.region
        digest = image.digest or "sha256:" + self.plan.stand_in(
            placeholder_hex("published image digest", self.release_id),
            f"ECR digest of {image.reference(region)}, as BatchGetImage answers it")
        request = resolve_request(image, region)
        self.account.publish(request["registryId"], request["repositoryName"], image.tag, digest)

    def _champion(self) -> None:
        """Production serving a champion an earlier release promoted: its model (tagged with that release), the endpoint
        config this release would create, the endpoint and the component, InService."""
        from tasks.backends.aws.hosting import VARIANT, tags

        config, hosting, (endpoint, component) = self.config, self.hosting, self.production
        stand_in = lambda what: self.plan.stand_in(placeholder_hex(what, self.release_id), what)  # noqa: E731
        release = f"{config.name}-{placeholder_hex('champion release', self.release_id)[:12]}"
        ref = ModelRef(release_id=self.plan.stand_in(release, "the champion's release"),
                       artifact_sha256=stand_in("the champion's artifact sha256"),
                       image_digest="sha256:" + stand_in("the champion's image digest"))
        spec = ComponentSpec(image_uri=f"{self.parts['images'].repository_uri()}@{ref.image_digest}",
                             artifact_uri=f"s3://{self.store.bucket}/{self.store.key(ref.artifact_sha256, 'model.tar.gz')}",
                             artifact_sha256=ref.artifact_sha256, environment=config.image.container_env(),
                             copies=config.rollout.copies, compute=compute(config, MEMORY_MB), model_ref=ref)
        model = hosting.model_request(component, spec, endpoint)
        self.plan.stand_in(model["ModelName"], "the champion's model, named by the release that promoted it")
        on_gpu = bool(spec.compute.accelerators or spec.compute.accelerator_partition)
        serving = hosting.endpoint_config_request(endpoint, config.placement, model_name=None, variant_name=VARIANT,
                                                  on_gpu=on_gpu, release_id=ref.release_id)
        for operation, params in (
                ("CreateModel", model), ("CreateEndpointConfig", serving),
                ("CreateEndpoint", {"EndpointName": endpoint, "EndpointConfigName": serving["EndpointConfigName"],
                                    "Tags": tags(endpoint=endpoint, release=ref.release_id, role="production")}),
                ("CreateInferenceComponent", hosting.component_request(component, endpoint, spec, model["ModelName"]))):
            self.account.seed("sagemaker", operation, params)


def _holds(params: dict, path: str) -> bool:
    """Whether the dotted `path` names a value in `params`."""
    value: Any = params
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return True


Note = str | Callable[[dict], str | None] | None


def annotations(config) -> dict[tuple[str, str], tuple[Note, dict[str, str]]]:
    """What the code does not say, by (stage, operation): a note for people (text, or made from the request's params)
    and the parameters holding a placeholder that is not a string."""
    image, backend, fit = config.image, config.backend, update_fit(config)
    table: dict[tuple[str, str], tuple[Note, dict[str, str]]] = {
        **{(stage, operation): (note, {}) for stage in ("resolve", "build", "package") for operation, note in (
            ("CreateMultipartUpload", "files up to 64 MiB go up in one conditional PutObject instead"),
            ("UploadPart", "one UploadPart per 64 MiB part of the file"))},
        ("preflight", "DescribeKey"): ("the key must exist and be an enabled symmetric key", {}),
        **{(stage, "ListTags"): ("which release the model is", {}) for stage in ("deploy_candidate", "validate", "promote")},
        ("teardown_candidate", "ListTags"): ("only resources tagged shiplift:endpoint with this endpoint are deleted", {}),
        ("model_registry", "ListModelPackages"): ("is the release registered? (by its description)", {}),
        ("model_registry", "UpdateModelPackage"): ("a complete update: status, description and every metadata key", {}),
        ("image", "DescribeImages"): (lambda params: "an image already built from this content is reused and nothing below "
                                      "runs" if "imageTag" in params["imageIds"][0] else None, {}),
        ("image", "ListBuildsForProject"): ("a build of this tag still running (an earlier attempt) is waited for instead of "
                                            "started again", {}),
        ("deploy_candidate", "CreateInferenceComponent"): (None, MEASURED),
        ("validate", "InvokeEndpoint"): (lambda params: "the champion, on the same tasks"
                                         if params["EndpointName"] == production_endpoint(config) else None, {}),
        ("promote", "CreateInferenceComponent"): (None, MEASURED),
        ("promote", "UpdateInferenceComponent"): (lambda params: (
            "SageMaker moves the copies batch by batch and rolls back when an alarm fires" if "DeploymentConfig" in params
            else "no DeploymentConfig: the new copies start beside the old ones") + f"; capacity: {fit}", MEASURED),
        ("promote", "PutMetricData"): ("the online gate's verdict after each replay of its canary set (InvokeEndpoint as in "
                                       "validate): 1 when the candidate fails it on its own answers", {}),
    }
    if isinstance(image, AdoptedImageConfig):
        reference = image.reference(backend.region)
        table["image", "BatchGetImage"] = (
            f"{reference} must still be the pinned image.digest, else nothing is deployed" if image.digest
            else f"{reference} resolved to its digest now; SageMaker pulls that digest, never the tag", {})
    else:
        table["image", "StartBuild"] = (docker_hub_note(image.base_image), {})
    if backend.checkpoints is not None:
        checkpoint_bucket = backend.checkpoints.bucket
        for stage in ("preflight", "release"):  # checked before anything, and again before signing
            table[stage, "HeadBucket"] = (lambda params: "the checkpoint bucket" if params["Bucket"] == checkpoint_bucket
                                          else None, {})
            table[stage, "GetObjectLockConfiguration"] = ("Object Lock must be enabled", {})
            table[stage, "GetSecretValue"] = ("the Ed25519 signing key as PEM text; shiplift never creates the secret", {})
        table["release", "ListObjectVersions"] = (
            "every page; on a fresh account none, so this release's checkpoint takes position 1", {})
        table["release", "PutObject"] = (
            "If-None-Match: a writer that took the position first makes this one read, verify and sign again",
            {"Metadata.seq": "the ledger head's seq", "ChecksumSHA256": "SHA-256 of the signed checkpoint",
             "ObjectLockRetainUntilDate": f"the signing time plus retention_days ({backend.checkpoints.retention_days})"})
    return table


def update_fit(config) -> str:
    """The note on an update of production: how its copies fit the endpoint (tasks.backends.capacity)."""
    from tasks.backends.capacity import room

    found = room(config.placement, config.image, config.rollout)
    if found is None:
        return "the instance type is not in shiplift's capacity tables, so the fit is not checked"
    return f"{found.describe_update()}: fits"
