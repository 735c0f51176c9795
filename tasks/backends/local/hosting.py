"""The local backend's hosting: a neutral component spec turned into model-server processes on loopback.

`LoopbackHosting` implements `tasks.backends.interfaces.Hosting` over
`tasks.backends.local.supervisor.ProcessSupervisor` (router and copy processes) and `tasks.backends.local.rollout`
(their rolling updates): it extracts the artifact from the local store once per sha256, runs the image's own `server.py`
with the spec's container environment plus the model folder, host and port, and reads back what serves as a
`LiveComponent`. A production endpoint that several models share (`placement.endpoint`) holds only the copies its
placement's instances hold, counted as on aws (`tasks.backends.local.room`): a deploy, update or scale that would not
fit is refused before anything changes. `ScratchServer` serves a model folder that is not an artifact yet (calibration,
before the image is pinned) on this worker, on both backends.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shiplift.tasks.artifacts.packaging import safe_extract
from shiplift.tasks.backends.image_source import server_command
from shiplift.tasks.backends.interfaces import (
    Bake,
    ComponentMetrics,
    ComponentSpec,
    DeployPoll,
    KeepReplaced,
    LiveComponent,
    ManagedResource,
    ModelRef,
    OnStep,
    PlacementObtained,
    Progress,
    RolloutPlan,
    RolloutResult,
    RolloutStep,
    ScaleToZeroPlan,
)
from shiplift.tasks.backends.local.endpoint_state import ProcessSpec, ServerlessEmulation
from shiplift.tasks.backends.local.process_image import local_image_kind
from shiplift.tasks.backends.local.rollout import roll_out
from shiplift.tasks.backends.local.room import room_of
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.backends.placement import SERVERLESS_STARTUP_S
from shiplift.tasks.errors import Conflict, DeployFailed, NotFound
from shiplift.tasks.families.registry import env_prefix
from shiplift.validation.transport import HttpInvoker

# How long a local serverless component keeps its copy after its last request. SageMaker does not document how long a
# serverless endpoint keeps idle compute; this emulation gives it back after a minute.
LOCAL_SERVERLESS_IDLE_S = 60

def process_spec(kind: str, model_dir: Path, environment: dict[str, str], *, copies: int, model_ref: dict,
                 neutral: dict | None = None) -> ProcessSpec:
    """Run image `kind`'s server on a model folder: the container environment plus folder and loopback host."""
    prefix = env_prefix(kind)  # the model family that serves this image names its server's variables
    env = {**environment, f"{prefix}_MODEL_DIR": str(model_dir), f"{prefix}_HOST": "127.0.0.1"}
    return ProcessSpec(command=server_command(kind), env=env, copies=copies, port_env=f"{prefix}_PORT",
                       model_ref=model_ref, neutral=neutral)


class LoopbackHosting:
    """Endpoints are router processes on 127.0.0.1 and components are copies of the image's server."""

    kind = "local"

    def __init__(self, state_dir: Path, store):
        self.processes = ProcessSupervisor(state_dir)
        self.store = store
        self.models_dir = Path(state_dir) / "models"

    def model_dir(self, artifact_uri: str, artifact_sha256: str) -> Path:
        """The artifact extracted once into `models/<sha256>/` (safe extraction, manifest verified)."""
        target = self.models_dir / artifact_sha256
        if not target.is_dir():
            safe_extract(self.store.get(artifact_uri), target)
        return target

    def _process(self, spec: ComponentSpec) -> ProcessSpec:
        """The processes a neutral spec runs: the image's server on the artifact extracted once."""
        return process_spec(local_image_kind(spec.image_uri), self.model_dir(spec.artifact_uri, spec.artifact_sha256),
                            spec.environment, copies=spec.copies, model_ref=spec.model_ref.model_dump(),
                            neutral=spec.model_dump(mode="json"))

    def deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
               progress: Progress) -> LiveComponent:
        """Extract the artifact once, run the image's server as `spec.copies` processes behind the router, describe.
        CapacityError, changing nothing, where a shared production endpoint has no room for them."""
        process = self._process(spec)
        serverless = placement.kind == "serverless"
        progress(f"{role} {endpoint}/{component}: {spec.copies} local {local_image_kind(spec.image_uri)} process(es)"
                 + (", serverless" if serverless else ""))
        self._prepare_endpoint(endpoint, placement if role == "production" else None)
        self._refuse_conversion(endpoint, component, serverless)
        self.processes.put_component(endpoint, component, process)
        if serverless:
            self._emulate_serverless(endpoint, component, placement, progress)
        live = self.describe(endpoint, component)
        if live is None:
            raise NotFound(f"{endpoint}/{component} vanished right after its deploy",
                           fix="another command removed it; rerun the stage")
        return live

    def start_deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
                     progress: Progress) -> None:
        """`deploy`: the local start already waits for its processes to answer their probe (seconds, on this
        machine), so the polls after it find the component in service or failed."""
        self.deploy(endpoint, component, spec, placement, role=role, progress=progress)

    def poll_deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
                    progress: Progress) -> DeployPoll:
        """One `describe`: InService is done; a component gone, or one whose copies or router stopped answering since
        its start (Degraded, OutOfService), failed (DeployFailed, which a rerun of the stage starts again)."""
        live = self.describe(endpoint, component)
        if live is None or live.status != "InService":
            raise DeployFailed(f"{role} {endpoint}/{component} is {live.status if live else 'gone'} after its start",
                               fix="read the copies' logs under the state dir's endpoints/ folder; rerun the stage")
        return DeployPoll(in_service=True, status=live.status)

    def _prepare_endpoint(self, endpoint: str, placement) -> None:
        """The endpoint running and healed, with the room of a shared production placement recorded for its checks
        (a candidate's endpoint is its own and is not counted, as on aws, where it hosts one model)."""
        self.processes.ensure_endpoint(endpoint)
        self.processes.set_room(endpoint, room_of(placement) if placement is not None else None)

    def _refuse_conversion(self, endpoint: str, component: str, serverless: bool) -> None:
        """Conflict where the component exists on the other kind of endpoint: SageMaker cannot turn an instance-based
        endpoint into a serverless one (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html), and
        this backend refuses the way back too, so both backends need a new endpoint for either."""
        entry = self.processes.describe_endpoint(endpoint)["components"].get(component)
        if entry is not None and bool(entry.get("serverless")) != serverless:
            was, asked = ("serverless", "instance") if entry.get("serverless") else ("instance-based", "serverless")
            raise Conflict(f"{endpoint}/{component} is {was}, and an endpoint cannot become {asked}-based in place",
                           fix="keep the placement's kind, or release under a new name (a new endpoint) and delete "
                               f"{endpoint} once callers have moved")

    def _emulate_serverless(self, endpoint: str, component: str, placement, progress: Progress) -> None:
        """The router serves the component as SageMaker serves a serverless endpoint: compute (a copy) starts on the
        request that finds none, which waits for it; more than max_concurrency requests at once are throttled; the
        copy goes after LOCAL_SERVERLESS_IDLE_S idle, unless provisioned concurrency keeps it warm. Deployed without
        provisioned concurrency, it starts with no copy, so its first request is a cold start, as on SageMaker."""
        warm = placement.provisioned_concurrency is not None
        plan = ScaleToZeroPlan(max_copies=1, idle_s=LOCAL_SERVERLESS_IDLE_S, invocations_per_copy=1.0)
        emulation = ServerlessEmulation(hold_s=SERVERLESS_STARTUP_S, max_concurrency=placement.max_concurrency,
                                        warm=warm)
        self.processes.set_scaling(endpoint, component, plan, emulation)
        if not warm and self.processes.scale(endpoint, component, 0):
            progress(f"{endpoint}/{component}: serverless, no compute until the first request")

    def start_roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement, plan: RolloutPlan, *,
                       progress: Progress, keep: KeepReplaced) -> bool:
        """Nothing: the local rollout's batches and bakes are this process's own work (seconds per batch here), not an
        update the machine carries on alone, so `roll_out` runs them when the deferred promote's stage runs."""
        return False

    def poll_roll_out(self, endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan, bake: Bake, *,
                      progress: Progress, on_step: OnStep | None = None) -> DeployPoll:
        """Done at once: no update runs outside `roll_out` (`start_roll_out`)."""
        return DeployPoll(in_service=True, status=f"{endpoint}/{component}: the local rollout runs in the stage")

    def roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement, plan: RolloutPlan, bake: Bake, *,
                 progress: Progress, on_step: OnStep | None = None, previous: dict | None = None,
                 keep: KeepReplaced | None = None) -> RolloutResult:
        """A real rolling update of the component's processes (`rollout.roll_out`); deployed whole when new. The old
        copies are this process's to roll back to, so `previous` and `keep` (aws's) are not needed.

        The rollout bakes each batch right after it is in rotation, so `on_step` hears of a batch (shifted) as the
        bake starts and of its verdict (baked) as the bake ends, and of each rollback batch as it is in rotation. A
        rollback step whose record fails is not retried here (the rollback goes on); promote appends it late."""
        process = self._process(spec)
        self._prepare_endpoint(endpoint, placement)
        live = self.describe(endpoint, component)
        if live is None:
            progress(f"production {endpoint}/{component}: nothing serves yet, so all {spec.copies} copies start at "
                     "once")
            self.processes.put_component(endpoint, component, process)
            return RolloutResult(status="created")
        # scaled to zero, it rolls out all the same: each batch starts the candidate's copies and bakes them
        progress(f"production {endpoint}/{component}: {plan.strategy} rollout of {spec.copies} copies"
                 + (" (scaled to zero: the batches start the new copies, and bake them alone)" if live.copies == 0
                    else ""))
        if on_step is None:
            return roll_out(self.processes, endpoint, component, process, plan, bake, progress=progress)

        def watched(step: RolloutStep) -> str | None:
            on_step("shifted", step)
            alarm = bake(step)
            try:
                on_step("baked", step.model_copy(update={"alarm": alarm}))
            except Exception as exc:
                if not alarm:
                    raise  # stops the rollout here; a rerun resumes it
                progress(f"{endpoint}/{component}: WARNING the alarm's verdict was not recorded ({exc}); rolling "
                         "back anyway")
            return alarm

        def rolled_back(step: RolloutStep) -> None:
            try:
                on_step("shifted", step)
            except Exception as exc:  # the old copies must serve again whatever the ledger does
                progress(f"{endpoint}/{component}: WARNING rollback batch {step.batch} was not recorded ({exc}); "
                         "it is appended when the rollout returns")

        return roll_out(self.processes, endpoint, component, process, plan, watched, progress=progress,
                        on_rollback_step=rolled_back)

    def describe(self, endpoint: str, component: str) -> LiveComponent | None:
        """What serves, from the persisted spec and a live check of the router and every copy."""
        try:
            described = self.processes.describe_endpoint(endpoint)
        except NotFound:
            return None
        entry = described["components"].get(component)
        if entry is None:
            return None
        neutral = entry["spec"].get("neutral") or {}
        serving = [c for c in entry["copies"] if c["alive"] and c["ping"] == 200]
        if not described["router"]["alive"]:
            status = "OutOfService"  # nothing answers on the endpoint's port
        elif entry["registered"] and len(serving) == len(entry["copies"]) and (serving or entry["scale_to_zero"]):
            status = "InService"
        else:
            status = "Degraded"
        ref = entry["spec"]["model_ref"]
        return LiveComponent(
            endpoint=endpoint, component=component, status=status,
            image_digest=neutral.get("image_uri", "").rpartition("@")[2] or None,
            artifact_uri=neutral.get("artifact_uri"), artifact_sha256=neutral.get("artifact_sha256"),
            environment=neutral.get("environment", {}),
            copies=1 if entry["serverless"] and status == "InService" else len(serving),  # compute per request
            placement=PlacementObtained(kind="local-process", instance_count=len(serving), requested=(
                f"local serverless, max concurrency {entry['serverless']['max_concurrency']}"
                if entry["serverless"] else "local")),
            model_ref=ModelRef.model_validate(ref) if set(ref) == set(ModelRef.model_fields) else None,
        )

    def enable_scale_to_zero(self, endpoint: str, component: str, plan: ScaleToZeroPlan, *, progress: Progress) -> None:
        """The router stops the component's copies after `plan.idle_s` without a request and starts one when a request
        finds none (answering it, and those during the start, with SageMaker's retryable no-capacity error). Locally a
        component scales out from zero by one copy; `plan.max_copies` and `invocations_per_copy` (target tracking
        under load) act on aws only."""
        if self.processes.set_scaling(endpoint, component, plan):
            progress(f"{endpoint}/{component}: scales in to zero after {plan.idle_s}s idle, out on the first request")

    def set_copies(self, endpoint: str, component: str, copies: int, *, progress: Progress) -> None:
        """Start or stop copies until the component has `copies` (the ones taken away drain first)."""
        if self.processes.scale(endpoint, component, copies):
            progress(f"{endpoint}/{component}: now {copies} cop{'y' if copies == 1 else 'ies'}")

    def delete_endpoint(self, endpoint: str, *, progress: Progress) -> bool:
        """Stop the router and every copy (waited); False when there was no such endpoint."""
        removed = self.processes.delete_endpoint(endpoint)
        if removed:
            progress(f"deleted local endpoint {endpoint}")
        return removed

    def delete_component(self, endpoint: str, component: str, *, progress: Progress) -> bool:
        """Stop the component's copies and take it off the router (waited), the endpoint's other components serving
        on; False when it was not there."""
        removed = self.processes.delete_component(endpoint, component)
        if removed:
            progress(f"deleted local component {endpoint}/{component}")
        return removed

    def invoker(self, endpoint: str, component: str, *, timeout_s: float) -> HttpInvoker:
        """The router's runtime URL (NotFound when the endpoint does not exist), its errors unwrapped as on aws;
        dead copies are replaced first, so an evaluation never runs against a degraded endpoint."""
        self.processes.endpoint_url(endpoint)
        return HttpInvoker(self.processes.ensure_endpoint(endpoint).url, component, runtime=True)

    def managed_resources(self, prefix: str) -> list[ManagedResource]:
        """The local endpoints named with the prefix (every local endpoint is shiplift's)."""
        return [ManagedResource(kind="endpoint", name=e["name"]) for e in self.processes.list_endpoints()
                if e["name"].startswith(prefix)]

    def delete_resource(self, resource: ManagedResource, *, progress: Progress) -> None:
        """Delete one local endpoint."""
        self.delete_endpoint(resource.name, progress=progress)


class LocalMetrics:
    """Invocation metrics from the router's counters (since the router started; the window is ignored)."""

    per_spec = True  # the router counts by the spec of the copy that answered

    def __init__(self, hosting: LoopbackHosting):
        self.hosting = hosting

    def component_metrics(self, endpoint: str, component: str, *, window_s: float,
                          spec_sha256: str | None = None) -> ComponentMetrics:
        """The router's counters of one component; with `spec_sha256`, of the copies serving that neutral spec only
        (the router counts by the spec of the copy that answered)."""
        counters = self.hosting.processes.metrics(endpoint)["components"].get(component)
        if counters is None:
            raise NotFound(f"endpoint {endpoint} has served no requests for component {component}",
                           fix="invoke the component first, or check its name")
        if spec_sha256 is not None:
            shas = self.hosting.processes.spec_hashes_serving(endpoint, component, spec_sha256)
            parts = [counters["by_spec"][sha] for sha in shas if sha in counters["by_spec"]]
            if not parts:
                raise NotFound(f"no copy of spec {spec_sha256[:12]} on {endpoint}/{component} has answered yet",
                               fix="send it requests first")
            p99s = [part["latency_ms"]["p99"] for part in parts if part["latency_ms"]["p99"] is not None]
            return ComponentMetrics(invocations=sum(p["invocations"] for p in parts),
                                    errors_4xx=sum(p["invocation_4xx_errors"] for p in parts),
                                    errors_5xx=sum(p["invocation_5xx_errors"] for p in parts),
                                    model_errors=sum(p["model_errors"] for p in parts),
                                    latency_p99_ms=max(p99s) if p99s else None)
        return ComponentMetrics(invocations=counters["invocations"], errors_4xx=counters["invocation_4xx_errors"],
                                errors_5xx=counters["invocation_5xx_errors"], model_errors=counters["model_errors"],
                                latency_p99_ms=counters["latency_ms"]["p99"])


class ScratchServer:
    """Serve a model folder with an image's server on this worker's CPU for the length of a block (calibration)."""

    def __init__(self, state_dir: Path):
        self.processes = ProcessSupervisor(state_dir)

    @contextmanager
    def serve(self, image, model_dir: Path, name: str) -> Iterator[HttpInvoker]:
        """Run the image's server on the folder for the block; the endpoint is removed afterwards."""
        spec = process_spec(image.kind, model_dir, image.container_env(cpu_only=True), copies=1,
                            model_ref={"purpose": name})
        self.processes.ensure_endpoint(name)
        try:
            self.processes.put_component(name, "model", spec)
            yield HttpInvoker(self.processes.endpoint_url(name), "model")
        finally:
            self.processes.delete_endpoint(name)
