"""Deploying to SageMaker: a model, an endpoint config, an endpoint and (except for single-model endpoints) an inference
component, each found by its content-derived name before it is created, a Failed one an earlier attempt left replaced
(a production component updated again, never deleted), and a serverless production endpoint kept serverless."""

from __future__ import annotations

import time

from shiplift.tasks.backends.aws.hosting_calls import (
    COMPONENT_WAIT_S,
    UNSETTLED,
    SageMakerCalls,
    current_copies,
    failure_reason,
)
from shiplift.tasks.backends.aws.hosting_cleanup import Cleanup
from shiplift.tasks.backends.aws.hosting_describe import describe_component
from shiplift.tasks.backends.aws.hosting_requests import (
    VARIANT,
    component_request,
    endpoint_config_request,
    is_serverless,
    model_request,
    single_model,
    tags,
)
from shiplift.tasks.backends.aws.service_model import request_applied
from shiplift.tasks.backends.aws.waiters import look, wait_for
from shiplift.tasks.backends.interfaces import DEPLOY_WAIT_S, ComponentSpec, DeployPoll, LiveComponent, Progress
from shiplift.tasks.errors import CapacityError, Conflict, DeployFailed, IntegrityError, NotFound, NotReady

ENDPOINT_WAIT_S = DEPLOY_WAIT_S // 2  # on top of the pool's provision timeout; with the component's: the stage table's
# CreateEndpoint/UpdateEndpoint read a new endpoint config eventually consistently (API_CreateEndpoint): retried with
# backoff from min(poll_s, CONFIG_RETRY_S), doubling up to CONFIG_RETRY_MAX_S, until CONFIG_VISIBLE_S
CONFIG_RETRY_S, CONFIG_RETRY_MAX_S, CONFIG_VISIBLE_S = 1.0, 8.0, 60.0
MODEL_COMPARED = ("PrimaryContainer", "ExecutionRoleArn", "EnableNetworkIsolation")  # what an existing model must hold


class Deployer:
    """Creates (or finds) what a component serves on and waits for it; a Failed leftover is replaced
    through `cleanup`."""

    def __init__(self, calls: SageMakerCalls, cleanup: Cleanup):
        self.calls, self.cleanup = calls, cleanup

    def deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
               progress: Progress) -> LiveComponent:
        """Model, endpoint config (MIG layout read back), endpoint and, except for single-model candidates,
        the component, each waited for."""
        model, config, single = self._prepare(endpoint, component, spec, placement, role=role)
        self._ensure_endpoint(endpoint, config, placement, role=role, release_id=spec.model_ref.release_id,
                              progress=progress)
        if not single:
            self._ensure_component(component_request(component, endpoint, spec, model["ModelName"]), progress,
                                   role=role)
        return self._described(endpoint, component)

    def start(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
              progress: Progress) -> None:
        """`deploy` without its waits: model, endpoint config and endpoint created (or found, a Failed one replaced),
        and the component sent where its endpoint is InService already; on a new endpoint, `poll` sends it once the
        endpoint is up. A component still Creating or Updating from an earlier attempt is NotReady (retryable): it
        cannot be updated until it settles."""
        model, config, single = self._prepare(endpoint, component, spec, placement, role=role)
        live = self._send_endpoint(endpoint, config, placement, role=role, release_id=spec.model_ref.release_id,
                                   progress=progress)
        if not single and (live or {}).get("EndpointStatus") == "InService":
            request = component_request(component, endpoint, spec, model["ModelName"])
            if not self._send_component(request, progress, role=role, settle=False):
                raise NotReady(f"inference component {component} is still Creating or Updating from an earlier "
                               "attempt, and SageMaker updates it only once that ends",
                               fix="the stage's retry starts it again once it has settled")

    def poll(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
             progress: Progress) -> DeployPoll:
        """One DescribeEndpoint (waiters.json's EndpointInService acceptors) and, on an endpoint with components, one
        DescribeInferenceComponent (InferenceComponentInService's); an absent component on an endpoint just come up
        is created here. A failure is raised as `deploy` raises it."""
        state, status, answer = look(self.calls.aws, "EndpointInService", {"EndpointName": endpoint})
        if state == "failure":
            raise self._endpoint_failure(endpoint, answer, placement)
        if state is None or single_model(placement, role):
            return DeployPoll(in_service=state == "success", status=f"endpoint {status}")
        if self.calls.inference_component(endpoint, component) is None:
            model = model_request(component, spec, endpoint, placement, role_arn=self.calls.backend.execution_role_arn)
            self._send_component(component_request(component, endpoint, spec, model["ModelName"]), progress,
                                 role=role, settle=False)
        state, status, answer = look(self.calls.aws, "InferenceComponentInService",
                                     {"InferenceComponentName": component})
        if state == "failure":
            raise self._component_failure(component, answer)
        return DeployPoll(in_service=state == "success", status=f"inference component {status}")

    def _prepare(self, endpoint: str, component: str, spec: ComponentSpec, placement, *,
                 role: str) -> tuple[dict, dict, bool]:
        """The model and the endpoint config, created unless they exist (a MIG layout read back): their requests and
        whether the endpoint is single-model."""
        role_arn = self.calls.backend.execution_role_arn
        on_gpu = bool(spec.compute.accelerators or spec.compute.accelerator_partition)
        model = model_request(component, spec, endpoint, placement, role_arn=role_arn)
        self.ensure_model(model)
        single = single_model(placement, role)
        config = endpoint_config_request(endpoint, placement, model_name=model["ModelName"] if single else None,
                                         variant_name=component if single else VARIANT, on_gpu=on_gpu,
                                         release_id=spec.model_ref.release_id, role_arn=role_arn, role=role)
        self._ensure("EndpointConfig", config["EndpointConfigName"], config, ("ProductionVariants", "ExecutionRoleArn"))
        if placement.kind == "mig_partition":
            self._check_layout(config)
        return model, config, single

    def _described(self, endpoint: str, component: str) -> LiveComponent:
        live = describe_component(self.calls, endpoint, component)
        if live is None:
            raise NotFound(f"{endpoint}/{component} vanished right after its deploy", fix="rerun the stage")
        return live

    def ensure_model(self, request: dict) -> None:
        """Create the model of a CreateModel request unless it exists with the same container, role and isolation."""
        self._ensure("Model", request["ModelName"], request, MODEL_COMPARED)

    def _ensure(self, kind: str, name: str, request: dict, compared: tuple[str, ...]) -> None:
        """Create a model or endpoint config unless it exists; an existing one must hold the same content."""
        key = f"{kind}Name"
        try:
            live = self.calls.sm(f"Describe{kind}", **{key: name})
        except NotFound:
            self.calls.sm(f"Create{kind}", **request)
            return
        differs = [field for field in compared if field in request
                   and not request_applied(live.get(field), request[field])]
        if differs:
            raise Conflict(f"SageMaker {kind} {name} exists with other {', '.join(differs)} than this release asks for",
                           fix=f"its name derives from content, so someone changed it by hand: delete {name} and rerun")

    def _check_layout(self, config: dict) -> None:
        """A MIG layout SageMaker dropped would place copies on whole GPUs: read the config back and refuse that."""
        sent = config["ProductionVariants"][0]["AcceleratorPartitionLayouts"]
        live = self.calls.sm("DescribeEndpointConfig", EndpointConfigName=config["EndpointConfigName"])
        got = (live.get("ProductionVariants") or [{}])[0].get("AcceleratorPartitionLayouts")
        if got != sent:
            raise IntegrityError(
                f"endpoint config {config['EndpointConfigName']} reads back AcceleratorPartitionLayouts {got!r}, "
                f"not the {sent!r} sent: the partition layout was dropped",
                fix="upgrade botocore (>= 1.44 knows the MIG fields) and check the region supports MIG partitions; "
                    f"delete {config['EndpointConfigName']} before rerunning")

    def _ensure_endpoint(self, endpoint: str, config: dict, placement, *, role: str, release_id: str,
                         progress: Progress) -> None:
        """Create the endpoint (or find it by name), replace it when an earlier attempt left it Failed, and wait."""
        self._send_endpoint(endpoint, config, placement, role=role, release_id=release_id, progress=progress)
        deadline = getattr(placement, "provision_timeout_s", 0) + ENDPOINT_WAIT_S
        state, answer = wait_for(self.calls.aws, "EndpointInService", {"EndpointName": endpoint}, deadline_s=deadline,
                                 poll_s=self.calls.poll_s, progress=progress, what=f"endpoint {endpoint}")
        if state == "failure":
            raise self._endpoint_failure(endpoint, answer, placement)

    def _send_endpoint(self, endpoint: str, config: dict, placement, *, role: str, release_id: str,
                       progress: Progress) -> dict | None:
        """CreateEndpoint (or UpdateEndpoint to this config), unless the endpoint runs it; one an earlier attempt left
        Failed is replaced. Returns the endpoint's description from before the call (None when it was created)."""
        name = config["EndpointConfigName"]
        live = self.calls.describe_endpoint(endpoint)
        if live is not None and live.get("EndpointStatus") == "Failed":
            progress(f"{role} {endpoint} is Failed from an earlier attempt ({failure_reason(live)}); replacing it")
            self.cleanup.delete_endpoint_only(endpoint, progress)
            live = None
        if live is None:
            progress(f"{role} {endpoint}: CreateEndpoint ({placement.kind})")
            self._with_config("CreateEndpoint", progress, EndpointName=endpoint, EndpointConfigName=name,
                              Tags=tags(endpoint=endpoint, release=release_id, role=role))
        elif live.get("EndpointConfigName") != name:
            if role == "production" and placement.kind == "serverless":
                self._check_stays_serverless(endpoint, live)
            elif role == "production":
                raise Conflict(f"production {endpoint} runs endpoint config {live.get('EndpointConfigName')}, not "
                               f"{name}: its placement changed, and a MIG layout cannot change on a running endpoint",
                               fix="keep the production placement, or move production to a new endpoint "
                                   "(a new resource_prefix)")
            if live.get("EndpointStatus") == "InService":
                self._with_config("UpdateEndpoint", progress, EndpointName=endpoint, EndpointConfigName=name)
                live = {**live, "EndpointStatus": "Updating"}
        return live

    @staticmethod
    def _endpoint_failure(endpoint: str, answer: dict | None, placement) -> CapacityError | DeployFailed:
        """The error of an endpoint that ended in a failure status: CapacityError (every pool tried) where its reason
        says capacity, DeployFailed otherwise."""
        reason = failure_reason(answer)
        if placement.kind == "instance_pool" and "capacity" in reason.lower():
            tried = [p.instance_type for p in sorted(placement.pools, key=lambda p: p.priority)]
            return CapacityError(f"endpoint {endpoint}: no capacity in any instance pool; tried {', '.join(tried)}: "
                                 f"{reason}",
                                 fix="add instance types to placement.pools, raise provision_timeout_s, or retry later")
        return DeployFailed(f"endpoint {endpoint} is {(answer or {}).get('EndpointStatus')}: {reason}",
                            fix="read the FailureReason and the endpoint's CloudWatch logs; teardown removes it, then "
                                "rerun")

    def _check_stays_serverless(self, endpoint: str, live: dict) -> None:
        """A serverless release's new endpoint config may replace a serverless one (UpdateEndpoint), never an
        instance-based one: SageMaker refuses to convert an instance-based endpoint to serverless
        (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html)."""
        if not is_serverless(self.calls.config_of(live) or {}):
            raise Conflict(f"production {endpoint} is instance-based (endpoint config "
                           f"{live.get('EndpointConfigName')}), and SageMaker cannot turn an instance-based "
                           "endpoint serverless",
                           fix="keep the instance placement, or release under a new name (a new endpoint) and delete "
                               f"{endpoint} once callers have moved")

    def _with_config(self, operation: str, progress: Progress, **params) -> dict:
        """CreateEndpoint or UpdateEndpoint, retried while SageMaker does not see the endpoint config just created yet:
        it reads configs eventually consistently and answers ValidationException "Could not find endpoint
        configuration" (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateEndpoint.html says to
        retry). Backoff doubles up to CONFIG_RETRY_MAX_S; NotReady (retryable) once CONFIG_VISIBLE_S have passed."""
        name = params["EndpointConfigName"]
        deadline, delay = time.monotonic() + CONFIG_VISIBLE_S, min(self.calls.poll_s, CONFIG_RETRY_S)
        while True:
            try:
                return self.calls.sm(operation, **params)
            except NotFound as exc:
                if "Could not find endpoint configuration" not in exc.problem:
                    raise
                if time.monotonic() + delay > deadline:
                    raise NotReady(f"SageMaker {operation} of {params['EndpointName']} still does not find endpoint "
                                   f"config {name} after {CONFIG_VISIBLE_S:g}s: {exc.problem}",
                                   fix=f"rerun the stage; if it persists, check that {name} exists in "
                                       f"{self.calls.backend.region}") from exc
                progress(f"{operation}: endpoint config {name} is not visible to SageMaker yet; retrying in {delay:g}s")
                time.sleep(delay)
                delay = min(delay * 2, CONFIG_RETRY_MAX_S)

    def _ensure_component(self, request: dict, progress: Progress, *, role: str) -> None:
        """Create or update the component to this request (`_send_component`, a Creating or Updating one settled
        first) and wait."""
        self._send_component(request, progress, role=role, settle=True)
        state, answer = self.calls.wait(request["InferenceComponentName"], deadline_s=COMPONENT_WAIT_S,
                                        progress=progress)
        if state == "failure":
            raise self._component_failure(request["InferenceComponentName"], answer)

    def _send_component(self, request: dict, progress: Progress, *, role: str, settle: bool) -> bool:
        """Create or update the component to this request unless it serves it; True once sent or found sent. One
        Creating or Updating is waited for first where `settle` (SageMaker refuses to update it), else False is
        returned and nothing sent. One an earlier attempt left Failed is deleted and created again only when it is a
        candidate's with no copy; production's (whose copies may still serve the champion after a failed update) is
        updated again, never deleted."""
        calls, component = self.calls, request["InferenceComponentName"]
        try:
            live = calls.sm("DescribeInferenceComponent", InferenceComponentName=component)
        except NotFound:
            live = None
        if live is not None and live["EndpointName"] != request["EndpointName"]:
            raise Conflict(f"inference component {component} already runs on endpoint {live['EndpointName']}",
                           fix="component names are global to the account and region: delete it or "
                               "change resource_prefix")
        if live is not None and live.get("InferenceComponentStatus") in UNSETTLED:
            if not settle:
                return False
            progress(f"inference component {component} is {live['InferenceComponentStatus']}; waiting for it "
                     "to end first")
            live = calls.settled(component, progress, deadline_s=COMPONENT_WAIT_S)
        failed = live is not None and live.get("InferenceComponentStatus") == "Failed"
        if failed and role == "candidate" and not current_copies(live):
            progress(f"inference component {component} is Failed from an earlier attempt "
                     f"({failure_reason(live)}); replacing it")
            self.cleanup.delete_inference_component(component, progress)
            live = failed = None
        if live is None:
            progress(f"inference component {component}: CreateInferenceComponent "
                     f"({request['RuntimeConfig']['CopyCount']} copies)")
            calls.sm("CreateInferenceComponent", **request)
        else:
            same = (live.get("Specification", {}).get("ModelName") == request["Specification"]["ModelName"]
                    and live.get("RuntimeConfig", {}).get("DesiredCopyCount") == request["RuntimeConfig"]["CopyCount"])
            if failed:
                progress(f"{role} inference component {component} is Failed ({failure_reason(live)}) with "
                         f"{current_copies(live)} copies; updating it again (it is not deleted: its copies may "
                         "still serve)")
            if failed or not same:
                progress(f"inference component {component}: UpdateInferenceComponent to "
                         f"{request['Specification']['ModelName']}")
                update = {k: request[k] for k in ("InferenceComponentName", "Specification", "RuntimeConfig")}
                calls.sm("UpdateInferenceComponent", **update)
        return True

    @staticmethod
    def _component_failure(component: str, answer: dict | None) -> CapacityError | DeployFailed:
        """The error of a component that ended Failed (or Deleting): CapacityError where its reason says capacity,
        DeployFailed otherwise; one that keeps copies of its previous model serving says so."""
        reason, serving = failure_reason(answer), current_copies(answer)
        error = CapacityError if "capacity" in reason.lower() else DeployFailed
        kept = (f"; it keeps {serving} copies of its previous model serving and is kept, not deleted: a rerun "
                "updates it again" if serving else "")
        return error(f"inference component {component} failed: {reason}{kept}",
                     fix="check the copies fit the endpoint's partitions or instances, and the container logs")
