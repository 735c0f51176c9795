"""`shiplift release CONFIG --dry-run` for an aws config: every request the release would send, sending nothing.

The dry run is the release itself: it opens the release (`open_loaded`), runs every stage of `tasks.pipeline.table`
through `run_stage` in the table's order and ends it (`finish`: the final status, the signed checkpoint), on the real
aws backend (`make_backends`). Only three things differ. Its boto3 session records instead of sending
(`tasks.backends.aws.recording_session`): each request is validated against the installed botocore service model,
maximum lengths, enums and patterns included, recorded under its stage, and answered by a model of an account where
nothing of the release exists yet (with `with_champion`, one where production serves a champion an earlier release
promoted). Its ledger is a scratch SQLite file. And what only a real release computes stands in, through the stage
context's model family (`StandInFamily`): the source, the built model and model.tar.gz are files of the size that goes
up in parts, one copy needs 1 GiB, the calibration scores are a dozen made-up answers, the gate sends the family's gate
requests as its gate sends them (`planned_gate`: every one to the candidate, and to the champion every one or only its
live latency sample, as the gate's reuse of the champion's recorded results decides) and passes, and the online gate
replays its canary requests and passes. Their values, and those only AWS or the release's end knows, are marked as
placeholders on every request that carries one. Each wait shows as the describe it polls, once. No credentials are
needed, nothing is sent, and nothing is left on disk.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shiplift.tasks.artifacts.packaging import ARCHIVE_NAME, PackagedModel
from shiplift.tasks.backends.aws.base_images import docker_hub_note
from shiplift.tasks.backends.aws.checkpoint_store import S3CheckpointStore
from shiplift.tasks.backends.aws.hosting_requests import VARIANT, tags
from shiplift.tasks.backends.aws.published_images import resolve_request
from shiplift.tasks.backends.aws.recording_session import (
    FreshAccount,
    Plan,
    Request,
    placeholder_hex,
    recording_session,
)
from shiplift.tasks.backends.capacity import room
from shiplift.tasks.backends.interfaces import ComponentSpec, ModelRef
from shiplift.tasks.backends.placement import MemoryEstimate
from shiplift.tasks.backends.registry import checkpoint_parts, make_backends
from shiplift.tasks.families.base import AdoptedImageConfig, BuiltModel
from shiplift.tasks.hashing import sha256_file
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.checkpoints import CheckpointLog, PrivateKeySigner, checkpoint, load_private_key
from shiplift.tasks.ledger.records import stage_payload
from shiplift.tasks.ledger.stage_results import DeployResult
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.orchestrators.run_options import ask_fresh_champion
from shiplift.tasks.pipeline.release import finish, open_loaded, release_id_for, run_stage
from shiplift.tasks.pipeline.stages.common import compute, production_component, production_endpoint
from shiplift.tasks.pipeline.table import STAGES
from shiplift.validation.champion_reuse import latency_turns
from shiplift.validation.evaluate import TURN_PER_WORKER, GateOutcome, Side, side_by_side, turns_of
from shiplift.validation.runner import Prediction

MEMORY_MB = 1024  # stands in for the memory one copy needs, which the build measures
CALIBRATION_ANSWERS = 12  # made-up answers a temperature fit stands on (it wants at least 10)
MEASURED = {"Specification.ComputeResourceRequirements.MinMemoryRequiredInMb":
            "memory one copy needs, measured by the build (weights + KV cache + runtime)"}
EVIDENCE = ("gate-report.json", "predictions.jsonl", "report.html")  # what a gate writes and validate keeps
# the plan's stage of the registry view's requests, whichever stage's record they follow
MODEL_REGISTRY = "model_registry"


def quiet(message: str) -> None:
    """A dry run's progress: said to nobody."""


def plan_release(config, *, config_path: Path, with_champion: bool = False,
                 fresh_champion: bool = False) -> list[Request]:
    """The requests of a first release of `config` (an aws config, read from `config_path`) on an account where nothing
    of it exists yet; with `with_champion`, of a later one: its gate also scores the serving champion (on every task
    with `fresh_champion`, as `shiplift release --fresh-champion` asks; see `planned_gate`) and its promote updates
    production."""
    release_id = release_id_for(config)
    plan = Plan()
    account = FreshAccount(config.backend, plan.stand_in, release_id=release_id)
    with tempfile.TemporaryDirectory(prefix="shiplift-dry-run-") as folder:
        scratch = Path(folder)
        ledger = Ledger(f"sqlite:///{scratch / 'ledger.db'}")
        try:
            backends = _recording_backends(config, scratch, ledger, plan, account)
            family = StandInFamily(config.family, plan, scratch / "stand-ins")
            if isinstance(config.image, AdoptedImageConfig):
                _publish(config, plan, account, release_id)
            if with_champion:
                _champion(config, backends, plan, account, ledger, release_id, CheckpointLog(scratch / "witness"))
            ctx = open_loaded(config, Path(config_path), backends, actor="dry-run", progress=quiet, family=family)
            if fresh_champion:
                ask_fresh_champion(ctx)
            for step in STAGES:
                plan.stage = step.name
                run_stage(ctx, step.name)
            plan.stage = "release"
            finish(ctx, failed=False)
            _mark_computed(plan, family, ledger)
        finally:
            ledger.close()
    return annotated(plan, config)


def _recording_backends(config, scratch: Path, ledger: Ledger, plan: Plan, account: FreshAccount):
    """The config's aws backends on the recording session, their state in the scratch folder, with no pause between
    polls (each wait of the recording account ends by its second poll), a scratch server that serves nothing (the
    stand-in family scores nothing), the registry view's requests filed under `MODEL_REGISTRY`, and checkpoints signed
    with the account's stand-in secret (a configured `public_key` could not match it; the requests are the same) into
    its bucket, with the scratch folder as the witness."""
    backend = config.backend
    checkpoints = backend.checkpoints and backend.checkpoints.model_copy(update={"public_key": None})
    dry = config.model_copy(update={"backend": backend.model_copy(update={
        "poll_s": 0.0, "state_dir": str(scratch), "checkpoints": checkpoints})})
    session = recording_session(plan, account)
    backends = make_backends(dry, ledger=ledger, session=session)
    def sign():
        signer, store = checkpoint_parts(dry, session=session)
        return checkpoint(ledger, store, signer, witness=CheckpointLog(scratch / "witness"))

    registry = backends.registry and PlannedRegistry(backends.registry, plan)
    return replace(backends, scratch=NothingServed(), registry=registry, checkpoint=sign if checkpoints else None)


class PlannedRegistry:
    """The backend's registry view, its requests filed in the plan under `MODEL_REGISTRY` (after the record they
    follow, within whichever stage appended it)."""

    def __init__(self, registry, plan: Plan):
        self.registry, self.plan = registry, plan
        self.follows = registry.follows

    def sync(self, release):
        stage, self.plan.stage = self.plan.stage, MODEL_REGISTRY
        try:
            return self.registry.sync(release)
        finally:
            self.plan.stage = stage


class NothingServed:
    """The scratch server of a dry run: nothing is started (the stand-in family's calibration asks no server)."""

    def serve(self, image, model_dir: Path, name: str):
        return nullcontext(None)


class StandInFamily:
    """The config's model family, with what only a real release computes stood in (see the module's docstring):
    resolve, build, memory, package, calibration scoring, the gate and the online gate. Everything else (file names,
    the gate's request bodies, its readout, its image's environment) is the family's own."""

    def __init__(self, family, plan: Plan, folder: Path):
        self.family, self.plan, self.folder = family, plan, folder
        self.files: dict[str, str] = {}  # sha256 of a stand-in file -> what it stands for
        folder.mkdir(parents=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.family, name)

    def _file(self, what: str, name: str, *, in_parts: bool) -> Path:
        """A file standing for `what`: of the smallest size that goes up in parts (a model), or small (a report); its
        label at both ends, so each part differs from other files' parts; sparse in between."""
        label = f"shiplift dry run: {what}\n".encode()
        size = 64 * 2**20 + len(label) if in_parts else 2 * len(label)
        path = self.folder / hashlib.sha256(label).hexdigest()[:16] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as out:
            out.write(label)
            out.seek(size - len(label))
            out.write(label)
        self.files[sha256_file(path)] = what
        return path

    def resolve(self, ctx, cache: Path) -> tuple[Path, str, dict]:
        path = self._file("the model source", self.family.source_file_name(ctx.config.artifact), in_parts=True)
        return path, sha256_file(path), {"kind": "dry-run stand-in"}

    def build(self, ctx) -> BuiltModel:
        path = self._file("the built model", self.family.built_file_name(ctx.config.artifact), in_parts=True)
        return BuiltModel(output=ctx.keep_file(path, path.name), model_dir=path.parent, model_sha256=sha256_file(path),
                          info={"stand_in": "the dry run builds nothing"})

    def summary_metrics(self, metrics: dict) -> dict:
        return {}  # the stand-in gate measures none of the family's own metrics

    def memory(self, ctx, built: BuiltModel) -> MemoryEstimate:
        return MemoryEstimate(MEMORY_MB, 0, 0, "stand-in")

    def package(self, built_model: Path, out_dir: Path, manifest: dict, calibration: Path | None) -> PackagedModel:
        path = self._file("model.tar.gz", ARCHIVE_NAME, in_parts=True)
        return PackagedModel(path=path, sha256=sha256_file(path), manifest=manifest)

    def calibration_predictions(self, ctx, invoker, path: Path, splits, settings) -> tuple[list, str]:
        answers = [Prediction(id=f"stand-in-{i}", dataset="calibration", expected="AB"[i % 2], option_ids=["A", "B"],
                              probabilities=None, option_logits=[1.0, 0.0] if i % 3 else [0.0, 1.0],
                              allowed_token_mass=None, temperature=None, latency_ms=0.0, server_forward_ms=None,
                              server_total_ms=None, attempts=1, retries_503=0, error=None, started_at=0.0)
                   for i in range(CALIBRATION_ANSWERS)]
        return answers, placeholder_hex("calibration set", ctx.release_id)

    def evaluate(self, candidate, champion, paths, out_dir: Path, *, validation, settings, context=None,
                 **_: Any) -> GateOutcome:
        """The family's gate requests, each dataset's, sent as its gate sends them (`planned_gate`); the release's
        context asked for as the report asks for it; the evidence files written; a pass."""
        planned_gate(self.plan, candidate, champion,
                     [self.family.invocation_bodies(validation, [path]) for path in paths], settings)
        out_dir.mkdir(parents=True, exist_ok=True)
        written = {name: self._file(name, name, in_parts=False) for name in EVIDENCE}
        for name, path in written.items():
            (out_dir / name).write_bytes(path.read_bytes())
        metrics = {"n": 0, "latency_ms": {"p95": {"value": None}}}
        if context is not None:
            context(metrics)
        return GateOutcome(decision="pass", checks=[], thresholds={}, datasets=[], metrics=metrics,
                           gate_report_json=out_dir / "gate-report.json", report_html=out_dir / "report.html")

    def online_gate(self, invoker, validation, gate, *, config_dir: Path, candidate_model_sha256: str):
        return StandInOnlineGate(invoker, self.family.invocation_bodies(
            validation, validation.dataset_paths(config_dir))[: gate.max_tasks],
            validation.request_timeout_s)


@dataclass(frozen=True)
class _Bodies:
    """One dataset's request bodies, as the gate's turns cut a dataset (`validation.evaluate.turns_of`)."""

    items: list[bytes]


def planned_gate(plan: Plan, candidate, champion, bodies: list[list[bytes]], settings) -> None:
    """Each dataset's request `bodies` sent as the family's gate sends them (`validation.evaluate.side_by_side`): in
    turns, alternately to the candidate and the champion. A champion whose recorded per-task results the gate may reuse
    (its offer neither absent nor fresh) answers only the turns of its live latency sample
    (`validation.champion_reuse.latency_turns`, as `validation.decisions.evaluate.score_decisions` picks them): a dry
    run does not read the ledger (its own is a scratch one), so it plans that case, and the note on each of the
    champion's requests states the condition (`champion_note`)."""
    sides = [Side(candidate, None), *([Side(champion, None)] if champion else [])]
    turns = turns_of([_Bodies(items) for items in bodies], sides, TURN_PER_WORKER * settings.concurrency)
    offer = champion.offer if champion else None
    reused = offer is not None and not offer.fresh
    live = latency_turns([len(t.items) for t in turns], offer.latency_sample) if reused else range(len(turns))
    note = champion_note(offer, sum(len(turns[i].items) for i in live), sum(map(len, bodies)))
    channels: dict[int, Any] = {}

    def send(target, turn, requests: dict) -> None:
        if id(target) not in channels:
            channels[id(target)] = target.invoker.open()
        sent = len(plan.requests)
        for body in turn.items:
            channels[id(target)].post(body, requests["timeout_s"])
        for request in plan.requests[sent:] if target is champion else ():
            if request.operation == "InvokeEndpoint":
                request.note = note

    side_by_side(sides, turns, send, lambda outcome: False, settings,
                 first_only=frozenset(range(len(turns))) - frozenset(live))


def champion_note(offer, sent: int, every: int) -> str:
    """What the plan says of the champion's gate requests: `sent` of the `every` one per task, and why."""
    if offer is None:
        return f"the champion on every task ({every} requests): this family's gate reuses no recorded results"
    if offer.fresh:
        return f"the champion on every task ({every} requests): {offer.fresh}"
    return (f"the champion's live latency sample, alternated with the candidate: {sent} of the gate's {every} "
            f"requests (validation.champion.latency_sample: {offer.latency_sample}); the gate reuses the per-task "
            "results an earlier gate recorded of this champion under the same identity (serving id, determinism "
            "profile, readout, dataset sha256). A gate whose champion has none scores it on every task "
            f"({every} requests), as --fresh-champion does; a dry run does not read the ledger, so it cannot tell "
            "which")


def champion_line(requests: list[Request], config) -> str | None:
    """The printed line on the champion's gate requests of a plan (None: the plan has no champion): how many, and
    their note (`champion_note`)."""
    asked = [r for r in requests if (r.stage, r.operation) == ("validate", "InvokeEndpoint")
             and r.params["EndpointName"] == production_endpoint(config)]
    return f"the gate's champion requests: {len(asked)}, {asked[0].note}" if asked else None


class StandInOnlineGate:
    """The online gate of a dry run: each replay sends its canary requests through the live component, and it passes."""

    def __init__(self, invoker, bodies: list[bytes], timeout_s: float):
        self.invoker, self.bodies, self.timeout_s = invoker, bodies, timeout_s

    def replay(self) -> None:
        channel = self.invoker.open()
        for body in self.bodies:
            channel.post(body, self.timeout_s)

    def extend(self) -> None:
        """Nothing more to send once the update has ended: the stand-in has passed."""

    def alarm(self) -> str | None:
        return None

    def evidence(self) -> dict:
        return {"stand_in": "a dry run's online gate passes"}


def _mark_computed(plan: Plan, family: StandInFamily, ledger: Ledger) -> None:
    """Mark what the release computes as it runs: the stand-in files' sha256 and their upload checksums, the ledger's
    record hashes and times (the registry view carries them), and the signed checkpoint's values."""
    for sha256, what in family.files.items():
        plan.stand_in(sha256, f"sha256 of {what}, known when the release computes it")
        for request in plan.requests:
            if request.operation in ("PutObject", "UploadPart") and sha256 in str(request.params.get("Key", "")):
                part = f", part {request.params['PartNumber']}" if "PartNumber" in request.params else ""
                plan.stand_in(request.params["ChecksumSHA256"], f"SHA-256 of {what}{part}")
    for record in ledger.history():
        plan.stand_in(record.record_hash, f"sha256 of the {record.stage} {record.event} ledger record")
        plan.stand_in(record.recorded_at, "when the ledger recorded it")
        if (record.stage, record.event) == (events.DEPLOY_CANDIDATE, events.SUCCEEDED):
            plan.stand_in(stage_payload(record, DeployResult).endpoint,
                          "a name derived from the artifact sha256 and the image digest")
    put = next((r for r in plan.requests if (r.stage, r.operation) == ("release", "PutObject")), None)
    if put is not None:  # the checkpoint the release's end signed into the Object Lock bucket
        signed, ends = json.loads(put.params["Body"]), "known when the release ends"
        for key, what in (("head_hash", "the ledger head's hash"),
                          ("merkle_root", "the Merkle root of the ledger's records"),
                          ("signed_at", "the signing time"), ("signature", "the Ed25519 signature")):
            plan.stand_in(signed[key], f"{what}, {ends}")
        plan.stand_in(signed["key_id"], "the id of the secret's key")
        plan.stand_in(put.params["ChecksumSHA256"], f"SHA-256 of the signed checkpoint, {ends}")
        plan.stand_in(put.params["Metadata"]["seq"], "the ledger head's seq")


def _publish(config, plan: Plan, account: FreshAccount, release_id: str) -> None:
    """The published image's tag, naming the pinned `image.digest` or, unpinned, a placeholder digest."""
    image, region = config.image, config.backend.region
    digest = image.digest or "sha256:" + plan.stand_in(
        placeholder_hex("published image digest", release_id),
        f"ECR digest of {image.reference(region)}, as BatchGetImage answers it")
    request = resolve_request(image, region)
    account.publish(request["registryId"], request["repositoryName"], image.tag, digest)


def _champion(config, backends, plan: Plan, account: FreshAccount, ledger: Ledger, release_id: str,
              witness: CheckpointLog) -> None:
    """Production serving a champion an earlier release promoted: its model (tagged with that release), the endpoint
    config this release would create, the endpoint and the component, InService; in the ledger, that release opened
    and promoted; and, where the config keeps checkpoints, the checkpoint that release ended with."""
    hosting, store = backends.hosting, backends.store
    endpoint, component = production_endpoint(config), production_component(config)

    def stand_in(what: str) -> str:
        return plan.stand_in(placeholder_hex(what, release_id), what)

    release = plan.stand_in(f"{config.name}-{placeholder_hex('champion release', release_id)[:12]}",
                            "the champion's release")
    ref = ModelRef(release_id=release, artifact_sha256=stand_in("the champion's artifact sha256"),
                   image_digest="sha256:" + stand_in("the champion's image digest"))
    spec = ComponentSpec(image_uri=f"{backends.images.repository_uri()}@{ref.image_digest}",
                         artifact_uri=f"s3://{store.bucket}/{store.key(ref.artifact_sha256, ARCHIVE_NAME)}",
                         artifact_sha256=ref.artifact_sha256, environment=config.image.container_env(),
                         copies=config.rollout.copies, compute=compute(config, MEMORY_MB), model_ref=ref)
    model = hosting.model_request(component, spec, endpoint, config.placement)
    plan.stand_in(model["ModelName"], "the champion's model, named by the release that promoted it")
    on_gpu = bool(spec.compute.accelerators or spec.compute.accelerator_partition)
    single = hosting.single_model(config.placement, "production")  # serverless: the model is the endpoint's variant
    serving = hosting.endpoint_config_request(endpoint, config.placement,
                                              model_name=model["ModelName"] if single else None,
                                              variant_name=component if single else VARIANT, on_gpu=on_gpu,
                                              release_id=ref.release_id)
    requests = [("CreateModel", model), ("CreateEndpointConfig", serving),
                ("CreateEndpoint", {"EndpointName": endpoint, "EndpointConfigName": serving["EndpointConfigName"],
                                    "Tags": tags(endpoint=endpoint, release=ref.release_id, role="production")})]
    if not single:
        requests.append(("CreateInferenceComponent",
                         hosting.component_request(component, endpoint, spec, model["ModelName"])))
    for operation, params in requests:
        account.seed("sagemaker", operation, params)
    for stage, event, payload in ((events.RELEASE, events.OPENED, {"config": config.model_dump(mode="json")}),
                                  (events.PROMOTE, events.SUCCEEDED, {"endpoint": endpoint, "component": component,
                                                                      "served": ref.model_dump()})):
        ledger.append(release_id=release, model=config.name, stage=stage, event=event, payload=payload, actor="dry-run")
    if config.backend.checkpoints is not None:
        _champion_checkpoint(config.backend, account, ledger, witness)


class _Signed:
    """A checkpoint store that keeps the one checkpoint signed into it (the champion's, before it is seeded)."""

    def __init__(self):
        self.signed = None

    def locked(self):
        return nullcontext()

    def entries(self) -> list:
        return []

    def append(self, signed) -> None:
        self.signed = signed


def _champion_checkpoint(backend, account: FreshAccount, ledger: Ledger, witness: CheckpointLog) -> None:
    """The checkpoint the champion's release ended with, signed with the account's key over the ledger as it was then
    and stored at position 1 of the checkpoint bucket (and the witness), so this release's end reads it back, verifies
    it against the ledger and signs position 2."""
    settings = backend.checkpoints
    pem = account.answer("secretsmanager", "GetSecretValue", {"SecretId": settings.key_ref}).parsed["SecretString"]
    kept = _Signed()
    checkpoint(ledger, kept, PrivateKeySigner(load_private_key(pem.encode(), "the dry run's stand-in secret")),
               witness=witness)
    store = S3CheckpointStore(None, bucket=settings.bucket, prefix=settings.prefix,
                              retention_days=settings.retention_days,
                              lock_mode=settings.lock_mode, kms_key_id=backend.kms_key_id)
    account.seed("s3", "PutObject", store.put_params(1, kept.signed))


def _holds(params: dict, path: str) -> bool:
    """Whether the dotted `path` names a value in `params`."""
    value: Any = params
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return True


Note = str | Callable[[dict], str | None] | None


def annotated(plan: Plan, config) -> list[Request]:
    """The recorded requests with the notes and non-string placeholders of `annotations` added, placeholders marked."""
    table = annotations(config)
    for request in plan.requests:
        note, also = table.get((request.stage, request.operation), (None, {}))
        note = note(request.params) if callable(note) else note
        request.note = "; ".join(text for text in (request.note, note) if text) or None
        request.placeholders.update({path: what for path, what in also.items() if _holds(request.params, path)})
    return plan.marked()


def annotations(config) -> dict[tuple[str, str], tuple[Note, dict[str, str]]]:
    """What the code does not say, by (stage, operation): a note for people (text, or made from the request's params)
    and the parameters holding a placeholder that is not a string."""
    image, backend, fit = config.image, config.backend, update_fit(config)
    table: dict[tuple[str, str], tuple[Note, dict[str, str]]] = {
        **{(stage, operation): (note, {}) for stage in ("resolve", "build", "package") for operation, note in (
            ("CreateMultipartUpload", "files up to 64 MiB go up in one conditional PutObject instead"),
            ("UploadPart", "one UploadPart per 64 MiB part of the file"))},
        ("preflight", "DescribeKey"): ("the key must exist and be an enabled symmetric key", {}),
        **{(stage, "ListTags"): ("which release the model is", {})
           for stage in ("deploy_candidate", "validate", "promote")},
        ("teardown_candidate", "ListTags"): ("only resources tagged shiplift:endpoint with this endpoint are deleted",
                                             {}),
        (MODEL_REGISTRY, "ListModelPackages"): ("is the release registered? (by its description)", {}),
        (MODEL_REGISTRY, "UpdateModelPackage"): ("a complete update: status, description and every metadata key", {}),
        ("image",
         "DescribeImages"): (lambda params: "an image already built from this content is reused and nothing below "
                                      "runs" if "imageTag" in params["imageIds"][0] else None, {}),
        ("image",
         "ListBuildsForProject"): ("a build of this tag still running (an earlier attempt) is waited for instead of "
                                            "started again", {}),
        ("deploy_candidate", "CreateInferenceComponent"): (None, MEASURED),
        ("promote", "InvokeEndpoint"): ("the online gate's canary replay through production, after each batch", {}),
        ("promote", "CreateInferenceComponent"): (None, MEASURED),
        ("promote", "UpdateInferenceComponent"): (lambda params: (
            "SageMaker moves the copies batch by batch and rolls back when an alarm fires"
            if "DeploymentConfig" in params
            else "no DeploymentConfig: the new copies start beside the old ones") + f"; capacity: {fit}", MEASURED),
        ("promote",
         "PutMetricData"): ("the online gate's verdict after each replay of its canary set: 1 when the candidate "
                                       "fails it on its own answers", {}),
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
            table[stage, "HeadBucket"] = (lambda params: "the checkpoint bucket"
                                          if params["Bucket"] == checkpoint_bucket
                                          else None, {})
            table[stage, "GetObjectLockConfiguration"] = ("Object Lock must be enabled", {})
            table[stage, "GetSecretValue"] = ("the Ed25519 signing key as PEM text; shiplift never creates the secret",
                                              {})
        table["release", "ListObjectVersions"] = (
            "every page; on a fresh account none, so this release's checkpoint takes position 1 (a later release first "
            "reads each stored version, GetObject, and verifies it against the ledger)", {})
        table["release", "PutObject"] = (
            "If-None-Match: a writer that took the position first makes this one read, verify and sign again",
            {"ObjectLockRetainUntilDate":
             f"the signing time plus retention_days ({backend.checkpoints.retention_days})"})
    return table


def update_fit(config) -> str:
    """The note on an update of production: how its copies fit the endpoint (tasks.backends.capacity)."""
    if config.placement.kind == "serverless":
        return "a serverless endpoint has no instances to fit: SageMaker starts compute per request"
    found = room(config.placement, config.image, config.rollout)
    if found is None:
        return "the instance type is not in shiplift's capacity tables, so the fit is not checked"
    return f"{found.describe_update()}: fits"
