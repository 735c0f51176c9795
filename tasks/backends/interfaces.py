"""The backend seams (DESIGN §3): what every stage may ask of a store, an image builder, hosting,
metrics and the ledger, and the frozen value types that cross them.

Stages import only this module; `tasks.backends.registry.make_backends` picks an implementation (local
processes on loopback, or S3 + CodeBuild/ECR + SageMaker) and imports it lazily. Both raise the
domain errors of `tasks.errors`, so a stage never handles a library exception.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shiplift.tasks.hashing import sha256_json

if TYPE_CHECKING:
    from shiplift.tasks.backends.placement import Placement

# The longest a hosting waits in one deploy (endpoint start + component start, on top of an instance pool's provision
# timeout) and in one teardown (component and endpoint deletion): the stage table's timeouts add these.
DEPLOY_WAIT_S = 3600
TEARDOWN_WAIT_S = 3600
SCALE_WAIT_S = DEPLOY_WAIT_S // 2  # the longest `set_copies` waits for a component's copy count to hold
SHA256_HEX = r"^[0-9a-f]{64}$"
IMAGE_BY_DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
Progress = Callable[[str], None]
Role = Literal["candidate", "production"]


def _pinned(uri: str) -> str:
    if not IMAGE_BY_DIGEST.match(uri):
        raise ValueError(f"image {uri!r} is not pinned by digest (repo@sha256:<64 lowercase hex>)")
    return uri


PinnedImage = Annotated[str, AfterValidator(_pinned)]


class Frozen(BaseModel):
    """Base of the value types: immutable, unknown fields refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class StoredArtifact(Frozen):
    """Where an artifact lives (`file://…` or `s3://…`) and what it is."""

    uri: str
    sha256: str = Field(pattern=SHA256_HEX)
    size: int = Field(ge=0)

    def to_dict(self) -> dict[str, str | int]:
        return self.model_dump()


class ImageRef(Frozen):
    """A serving image pinned by digest: `uri` is always `repo@sha256:<digest>`.

    `size_bytes` is the image's size as its registry reports it, or None where the backend cannot tell (a local
    image is a server's source tree, not a container; a published image's BatchGetImage answer has no size). On aws it
    is ECR's `imageSizeInBytes`, the COMPRESSED size of the pushed layers, the largest manifest's for a manifest list
    (https://docs.aws.amazon.com/AmazonECR/latest/APIReference/API_ImageDetail.html: the Docker client compresses
    layers before pushing them, so `docker images`, which shows the uncompressed size, may show a larger one)."""

    name: str
    uri: PinnedImage
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    base_image: str
    files: int
    source_sha256: str | None = Field(None, description="digest of the build context the image was built from")
    size_bytes: int | None = Field(None, ge=0, description="the registry's size of the image (ECR: compressed layers); "
                                   "None: unknown")

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()


class ModelRef(Frozen):
    """The identity a serving component must report: the ledger compares it with what is live."""

    release_id: str
    artifact_sha256: str = Field(pattern=SHA256_HEX)
    image_digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")


class Compute(Frozen):
    """What one copy needs: CPU cores, memory, and either whole accelerators or one MIG partition."""

    cpu_cores: float | None = Field(None, gt=0)
    memory_mb: int = Field(ge=128)
    accelerators: int = Field(0, ge=0)
    accelerator_partition: str | None = Field(None, pattern=r"^mig-[0-9]+g\.[0-9]+gb")


class ComponentSpec(Frozen):
    """A backend-neutral inference component: image by digest, artifact by URI and sha256,
    container environment, copy count and compute. Local runs it as processes on loopback; aws as
    `CreateModel` + `Create/UpdateInferenceComponent`."""

    image_uri: PinnedImage
    artifact_uri: str
    artifact_sha256: str = Field(pattern=SHA256_HEX)
    environment: dict[str, str]
    copies: int = Field(ge=1, le=64)
    compute: Compute
    model_ref: ModelRef

    def sha256(self) -> str:
        """Content hash of the spec: equal hashes mean an identical component."""
        return sha256_json(self.model_dump(mode="json"))

    def served_identity(self) -> dict[str, Any]:
        """What must be live for this spec to count as served (copies are checked apart)."""
        return {"image_digest": self.image_uri.rsplit("@", 1)[1], "artifact_uri": self.artifact_uri,
                "artifact_sha256": self.artifact_sha256, "environment": dict(self.environment)}

    def serving_id(self) -> str:
        """What the component serves, as one id: the hash of its image, artifact and container environment (copies
        and release aside). The hosting hands it to every copy as SHIPLIFT_SERVING_ID (outside the hashed
        environment) and the servers echo it, so live answers are told apart by what serves them: a release that
        changes only the temperature or the image has its own, where the GGUF's sha256 is the champion's."""
        return sha256_json(self.served_identity())


class PlacementObtained(Frozen):
    """What the backend actually got, recorded in the ledger (the pool entry that provisioned, the partitions)."""

    kind: Literal["local-process", "instance_pool", "mig_partition", "instance_type", "serverless"]
    requested: str
    instance_type: str | None = None
    instance_count: int = 0
    partition_type: str | None = None
    partitions: int = 0
    tried: tuple[str, ...] = ()
    ami_version: str | None = None


class LiveComponent(Frozen):
    """A typed `describe`: what serves on an endpoint's component right now."""

    endpoint: str
    component: str
    status: str
    image_digest: str | None
    artifact_uri: str | None
    artifact_sha256: str | None
    environment: dict[str, str]
    copies: int
    placement: PlacementObtained
    model_ref: ModelRef | None = None
    failure_reason: str | None = None

    def served_identity(self) -> dict[str, Any]:
        """What serves here, in the fields of `ComponentSpec.served_identity`."""
        return {"image_digest": self.image_digest, "artifact_uri": self.artifact_uri,
                "artifact_sha256": self.artifact_sha256, "environment": dict(self.environment)}

    def serving_id(self) -> str:
        """What serves here as one id: `ComponentSpec.serving_id` of the spec it serves."""
        return sha256_json(self.served_identity())

    def differences(self, spec: ComponentSpec) -> list[str]:
        """Each field where the live component is not `spec` ("InService on the old spec" shows here)."""
        live = self.served_identity()
        problems = [f"{key} is {live[key]!r}, expected {want!r}" for key, want in spec.served_identity().items()
                    if live[key] != want]
        if self.copies != spec.copies:
            problems.append(f"copies is {self.copies}, expected {spec.copies}")
        if self.model_ref is not None and self.model_ref != spec.model_ref:
            problems.append(f"model_ref is {self.model_ref.model_dump()}, expected {spec.model_ref.model_dump()}")
        return problems


class DeployPoll(Frozen):
    """One look at a deploy `Hosting.start_deploy` began: `in_service` once the component serves (the stage then
    checks it serves the spec), else still going, with the backend's status (Creating, Updating, ...). A deploy that
    failed is raised, as `deploy` raises it (CapacityError, DeployFailed), never returned."""

    in_service: bool
    status: str


class ComponentMetrics(Frozen):
    """Invocation counters of one component over a window (router counters locally, CloudWatch on aws)."""

    invocations: int
    errors_4xx: int
    errors_5xx: int
    model_errors: int
    latency_p99_ms: float | None


class BakeAlarms(BaseModel):
    """What rolls a rollout back while a batch bakes, judged on the new model's answers: evaluated in process
    on the local backend, sent as CloudWatch alarms that SageMaker watches on the aws backend."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    max_error_rate: float = Field(0.01, ge=0, le=1, description="(5xx + model errors) / invocations of the new copies")
    max_latency_p99_ms: float | None = Field(None, gt=0, description="p99 latency of the new copies' answers")
    min_invocations: int = Field(1, ge=1, description="rates are judged once the new copies have answered this many")
    check_interval_s: float = Field(5.0, gt=0, le=300, description="how often the alarms are read during a bake")


class RolloutPlan(Frozen):
    """How a component moves to a new spec, as SageMaker's RollingUpdatePolicy counts it: batches of copies
    with a bake (`wait_interval_s`) after each, a rollback batch size (None: every copy at once), a
    deadline for the whole update, the alarms that roll it back and whether an online gate judges it.
    `canary` is one batch then the rest; `linear` equal batches."""

    strategy: Literal["all_at_once", "canary", "linear"]
    batch_copies: int = Field(1, ge=1)
    wait_interval_s: float = Field(0.0, ge=0)
    rollback_batch_copies: int | None = Field(None, ge=1)
    max_execution_s: float = Field(3600.0, gt=0)
    alarms: BakeAlarms = BakeAlarms()
    online_gate: bool = False

    def targets(self, copies: int) -> list[int]:
        """New-spec copies after each step, ending at `copies`: all_at_once [N], canary [b, N], linear [b, 2b, …, N]."""
        batch = min(self.batch_copies, copies)
        if self.strategy == "all_at_once" or batch == copies:
            return [copies]
        if self.strategy == "canary":
            return [batch, copies]
        return [min(copies, batch * step) for step in range(1, -(-copies // batch) + 1)]


class ScaleToZeroPlan(Frozen):
    """How a component scales in to zero copies when idle and out again on the first request that finds none
    (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html): a scalable target
    of 0..`max_copies` copies, a target-tracking policy on invocations per copy that scales in after `idle_s`, and a
    step-scaling policy that adds one copy when the component's NoCapacityInvocationFailures alarm fires."""

    max_copies: int = Field(ge=1, le=64)
    idle_s: int = Field(ge=1, le=86400)
    invocations_per_copy: float = Field(gt=0)


class RolloutStep(Frozen):
    """One traffic step of a rollout or its rollback. Where shiplift drives the batches (local) it is batch n
    of N with the copies of each spec serving after it; where SageMaker drives them (aws) it is the n-th
    `check` during the update, with the component's copy count and the states of its alarms, because
    SageMaker reports neither the batch nor which copies run which spec."""

    phase: Literal["rollout", "rollback"]
    batch: int | None = None
    check: int | None = None
    batches: int
    old_copies: int | None = None
    new_copies: int | None = None
    copies: int | None = None  # every copy serving, where the backend cannot tell old from new (SageMaker)
    old_spec_sha256: str | None = None  # None where the backend keeps no previous spec (SageMaker)
    new_spec_sha256: str
    alarm_states: dict[str, str] = Field(default_factory=dict)  # alarm name -> OK, ALARM or INSUFFICIENT_DATA
    alarm: str | None = None  # the alarm that fired during this step's bake, if one did

    def key(self) -> tuple[str, int | None, int | None]:
        """What tells this step from the rollout's others (for evidence gathered during its bake)."""
        return self.phase, self.batch, self.check


class RolloutResult(Frozen):
    """How a rollout ended: succeeded (the new spec serves), rolled_back (an alarm fired; the old spec serves,
    `reason` says which), unchanged (the new spec was already serving), created (nothing served before, so
    the component was deployed whole) or withdrawn (nothing served before, and the new copies failed their bake, so
    the component was deleted: nothing serves); every step it took."""

    status: Literal["succeeded", "rolled_back", "unchanged", "created", "withdrawn"]
    reason: str | None = None
    steps: tuple[RolloutStep, ...] = ()


# watch a step (local: its wait interval; aws: one check); the alarm that fired, or None
Bake = Callable[[RolloutStep], "str | None"]
StepKind = Literal["shifted", "baked"]
OnStep = Callable[[StepKind, RolloutStep], None]
"""Told of a rollout's progress the moment it happens, so the ledger dates it right: `shifted` once a step's copies have
moved (local: a batch or a rollback batch is in rotation; aws: a check has seen the component), before its bake;
`baked` once the bake has judged it (the step's `alarm` set to the alarm that fired, or None). Raising stops the
rollout where it is (a rerun resumes it), except for a verdict that rolls back: the rollback goes on."""
# told what a backend's update is about to replace (aws: the component's spec and copy count), before it is sent
KeepReplaced = Callable[[dict[str, Any]], None]


class ManagedResource(Frozen):
    """One resource shiplift created (for `shiplift cleanup`): its kind, name and tags."""

    kind: str
    name: str
    tags: dict[str, str] = Field(default_factory=dict)


class Channel(Protocol):
    """One worker's line to a model: POST a body, get (HTTP status, body); close when done."""

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]: ...

    def close(self) -> None: ...


@runtime_checkable
class Invoker(Protocol):
    """How the eval runners reach a model; hosting hands one out per (endpoint, component)."""

    def describe(self) -> dict[str, Any]:
        """Where the answers come from (URL or endpoint, component), for the gate report."""
        ...

    def open(self) -> Channel:
        """A channel for one worker thread (keep-alive HTTP locally, `InvokeEndpoint` on aws)."""
        ...


@runtime_checkable
class ArtifactStore(Protocol):
    """Content-addressed, never-overwriting storage for artifacts and evidence."""

    def put_file(self, path: str | Path, *, name: str, progress: Progress | None = None) -> StoredArtifact:
        """Store a file under its sha256; the same content again returns the stored one."""
        ...

    def get(self, uri: str) -> Path:
        """A local, sha256-verified path to a stored artifact (downloaded into a cache when remote)."""
        ...

    def exists(self, sha256: str) -> bool:
        """Whether content with this sha256 is stored."""
        ...


@runtime_checkable
class ImageBuilder(Protocol):
    """Builds (or finds, by content) the serving image of an image config and pins it by digest."""

    def build(self, image: Any, *, progress: Progress) -> ImageRef:
        """Build or find the image of an image config; the ImageRef is pinned by digest."""
        ...


@runtime_checkable
class Hosting(Protocol):
    """Endpoints and their inference components, placed as the config asks."""

    kind: str

    def deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement: Placement, *, role: Role,
               progress: Progress) -> LiveComponent:
        """Create or update until `component` on `endpoint` should serve `spec`, then describe what is live (the
        stage checks it is `spec`: an update can end InService on the old spec). Raises CapacityError (with every
        type tried), DeployFailed (with the backend's reason), NotReady on a deadline, Conflict on a name clash."""
        ...

    def start_deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement: Placement, *, role: Role,
                     progress: Progress) -> None:
        """`deploy` without its wait (a deferred stage's start, docs/airflow.md): create or find everything `deploy`
        would and return; what can only be created once something else is in service (an inference component on its
        new endpoint) is created by a later `poll_deploy`. Idempotent; raises what `deploy` raises before its wait."""
        ...

    def poll_deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement: Placement, *, role: Role,
                    progress: Progress) -> DeployPoll:
        """One look at a deploy `start_deploy` began (and its next create, where the endpoint just came up); raises
        the failure `deploy` would (CapacityError, DeployFailed) once the backend reports one."""
        ...

    def roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement: Placement, plan: RolloutPlan,
                 bake: Bake, *, progress: Progress, on_step: OnStep | None = None, previous: dict | None = None,
                 keep: KeepReplaced | None = None) -> RolloutResult:
        """Move the component to `spec` as `plan` says and roll back to the previous spec when an alarm fires. Local
        drives the batches and calls `bake` after each (an alarm it returns rolls back); aws sends SageMaker's rolling
        update with the plan's alarms and calls `bake` at every check while it runs. Each step is told to `on_step`
        as it happens (shifted, then baked), every step the result lists included. A component that does not exist
        yet is deployed whole. Where the backend's update outlives the process (aws), what it replaces is told to
        `keep` before it is sent, and a run that follows an update it did not send is given it back as `previous`
        (the ledger keeps it); local keeps the old copies itself and ignores both."""
        ...

    def start_roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement: Placement,
                       plan: RolloutPlan, *, progress: Progress, keep: KeepReplaced) -> bool:
        """`roll_out` without its wait (the promote stage's deferred start, docs/airflow.md): send an update the
        backend carries on by itself (aws: SageMaker's rolling update, `keep` told what it replaces first) and return
        whether one was sent. Nothing is sent where the component is absent, where this rollout's update is under way
        or ended, where the spec serves already, or where the backend has no update that outlives the process (local
        drives its batches inside `roll_out`); `roll_out` then does the rest. Idempotent; NotReady (retryable) while
        the component changes for another cause."""
        ...

    def poll_roll_out(self, endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan, bake: Bake, *,
                      progress: Progress, on_step: OnStep | None = None) -> DeployPoll:
        """One look at the update `start_roll_out` sent: while it runs, one check (its alarms' states and `bake`, the
        online gate's round, told to `on_step`) and `in_service` False; once it has ended, or where none runs,
        `in_service` True, and `roll_out` follows what it ended as (judges its last step, rolls back, or raises)."""
        ...

    def describe(self, endpoint: str, component: str) -> LiveComponent | None:
        """What serves on the component now, or None when the endpoint or component is absent."""
        ...

    def enable_scale_to_zero(self, endpoint: str, component: str, plan: ScaleToZeroPlan, *, progress: Progress) -> None:
        """Let the component scale in to zero copies after `plan.idle_s` without an invocation, and out again when a
        request finds no copy (that request fails retryably: the caller retries). Idempotent."""
        ...

    def set_copies(self, endpoint: str, component: str, copies: int, *, progress: Progress) -> None:
        """Set the component's copy count now and wait until it holds; 0 stops every copy (a cold start's start)."""
        ...

    def delete_component(self, endpoint: str, component: str, *, progress: Progress) -> bool:
        """Take one component out of service: stop its copies and remove it from the endpoint (its scaling with it),
        waiting, leaving the endpoint's other components serving; False if absent."""
        ...

    def delete_endpoint(self, endpoint: str, *, progress: Progress) -> bool:
        """Remove the endpoint and everything on it, in dependency order, waiting; False if absent."""
        ...

    def invoker(self, endpoint: str, component: str, *, timeout_s: float) -> Invoker:
        """How the eval runners reach the component; NotFound when the endpoint does not exist."""
        ...

    def managed_resources(self, prefix: str) -> list[ManagedResource]:
        """Every resource named with `prefix` and tagged by shiplift (endpoints, components, …)."""
        ...

    def delete_resource(self, resource: ManagedResource, *, progress: Progress) -> None:
        """Delete one resource `managed_resources` listed, waiting where the backend must."""
        ...


@runtime_checkable
class Metrics(Protocol):
    """Invocation metrics of live components: the seam rollouts and alarms read. `per_spec` says whether the
    backend can split a component's metrics by the spec each copy serves (the router can; CloudWatch cannot,
    so on aws SageMaker's own alarms judge the component during a rollout)."""

    per_spec: bool

    def component_metrics(self, endpoint: str, component: str, *, window_s: float,
                          spec_sha256: str | None = None) -> ComponentMetrics:
        """Invocation counters and p99 latency of one component over the last `window_s` seconds; with
        `spec_sha256` (a ComponentSpec's hash), of the copies serving that spec only (BadInput where the backend
        cannot split them)."""
        ...


@runtime_checkable
class LedgerStore(Protocol):
    """The append-only release ledger (tasks.ledger.store.Ledger on any SQLAlchemy URL)."""

    def append(self, *, release_id: str, model: str, stage: str, event: str, payload: dict[str, Any],
               actor: str) -> Any: ...

    def release(self, release_id: str) -> list[Any]: ...

    def history(self, model: str | None = None) -> list[Any]: ...

    def events(self, stage: str, event: str) -> list[Any]: ...

    def served_at(self, model: str, when: Any) -> Any: ...

    def acquire_lease(self, model: str, holder: str, release_id: str, ttl_s: float, *,
                      stopped: Callable[[Any], str | None] | None = None,
                      by_this_process: bool = False) -> AbstractContextManager: ...

    def renew_lease(self, model: str, holder: str, release_id: str, ttl_s: float, *,
                    token: str | None = None) -> Any: ...

    def release_lease(self, model: str, holder: str, *, token: str | None = None) -> bool: ...


@dataclass(frozen=True)
class ReleaseFacts:
    """What a backend's view of a release reads (the registry): the release, its config, its model's ledger history,
    and its artifact, image and gate report once those stages succeeded. Never the stage context."""

    release_id: str
    config: Any  # tasks.config.ReleaseConfig (not imported: the config imports these seams)
    history: tuple[Any, ...]  # the model's ledger records, oldest first
    artifact_uri: str | None = None
    image_uri: str | None = None
    gate_report: dict[str, Any] | None = None  # the kept gate-report.json


@runtime_checkable
class ReleaseRegistry(Protocol):
    """A view of releases outside the ledger (the SageMaker Model Registry on aws): it follows the ledger, never leads
    it, so it is written after the ledger and a failed write is repaired by the next sync."""

    follows: frozenset[tuple[str, str]]  # the (stage, event) records after which the release's view is synced

    def sync(self, release: ReleaseFacts) -> dict[str, Any] | None:
        """Make the view of the release match its ledger records (reads only when it already does); None while the
        release has no record the view follows."""
        ...


@runtime_checkable
class ScratchServer(Protocol):
    """Serves a model folder that is not an artifact yet (calibration) with an image's server on this worker."""

    def serve(self, image: Any, model_dir: Path, name: str) -> AbstractContextManager[Invoker]:
        """Serve the folder with the image's server for the block; yields its invoker."""
        ...
