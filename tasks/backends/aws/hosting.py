"""SageMaker hosting (DESIGN §7): candidates on instance pools or MIG partitions, production as an
inference-component endpoint, invocation through `sagemaker-runtime`, teardown and cleanup.

- A **candidate** on an instance pool (or one instance type) is a single-model endpoint: `CreateModel`
  (network isolation on) → `CreateEndpointConfig` with `InstancePools`, the provision timeout,
  `InferenceAmiVersion`, least-outstanding-requests routing and the startup/download timeouts →
  `CreateEndpoint`. The pool entry that provisioned (`CurrentInstanceCount > 0`) is recorded.
- A candidate on a **MIG partition**, and **production** always, is an inference-component endpoint:
  a variant without a model (the config carries `ExecutionRoleArn`; for MIG exactly one
  `AcceleratorPartitionLayouts` entry, read back after creation), then `Create/UpdateInferenceComponent`.
- Every name derives from content and every create is preceded by a describe, so a rerun after a
  crash finds what exists and never duplicates it; an existing resource with other content is a
  Conflict. A Failed endpoint or candidate component an earlier attempt left is replaced; a Failed production
  component is updated again, never deleted (its copies may still serve the champion); a component Creating or
  Updating is waited for before it is updated (SageMaker refuses that). Waits use `waiters.json` (every non-success
  terminal status fails) with deadlines, and capture `FailureReason` at once. Success is judged by the caller on
  the typed `describe`: an update that ends InService on the old spec shows as differences, never as success.
- **Scale to zero** (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html) needs an
  inference-component endpoint whose variant has `ManagedInstanceScaling.MinInstanceCount` 0 (a candidate whose
  placement asks for that is a component endpoint too), and per component: an Application Auto Scaling target on
  `sagemaker:inference-component:DesiredCopyCount` from 0 copies, a target-tracking policy on invocations per copy that
  scales in, and a step-scaling policy on a CloudWatch alarm on `NoCapacityInvocationFailures` that adds a copy when a
  request finds none (`enable_scale_to_zero`). Deleting an endpoint removes each component's alarm, policies and target
  first, so a torn-down candidate leaves none behind. A MIG endpoint runs one instance (MinInstanceCount 0,
  MaxInstanceCount 1). The gate's cold start waits for the endpoint to give back its instances once its copies are gone
  (`wait_for_zero_instances`), so it is timed from zero instances, as users meet it.
- A **serverless** placement (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html) makes a
  single-model endpoint for candidate and production alike, its variant a `ServerlessConfig` (memory, max concurrency,
  provisioned concurrency) with no instances: serverless endpoints host no inference components. A release updates
  production with `UpdateEndpoint` to its own endpoint config (all at once; SageMaker does no rolling deployment of a
  serverless endpoint, deployment-guardrails-exclusions.html), and an instance-based production endpoint is never
  turned serverless in place (the page: that conversion is refused).

The parts, composed over one call wrapper (`hosting_calls.SageMakerCalls`): `hosting_requests` (the pure requests, names
and tags), `hosting_deploy` (model, config, endpoint, component), `hosting_rollout` (rolling update, bake, rollback
reason), `hosting_scaling` (scale to zero, copies, zero instances), `hosting_cleanup` (deletes and cleanup's list) and
`hosting_describe` (what serves, the invoker).
"""

from __future__ import annotations

from shiplift.tasks.backends.aws import hosting_requests
from shiplift.tasks.backends.aws.backend_config import AwsBackend
from shiplift.tasks.backends.aws.hosting_calls import SageMakerCalls
from shiplift.tasks.backends.aws.hosting_cleanup import Cleanup
from shiplift.tasks.backends.aws.hosting_deploy import Deployer
from shiplift.tasks.backends.aws.hosting_describe import describe_component, runtime_invoker
from shiplift.tasks.backends.aws.hosting_rollout import Rollout
from shiplift.tasks.backends.aws.hosting_scaling import Scaling
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.backends.interfaces import (
    Bake,
    ComponentSpec,
    DeployPoll,
    Invoker,
    KeepReplaced,
    LiveComponent,
    ManagedResource,
    OnStep,
    Progress,
    RolloutPlan,
    RolloutResult,
    ScaleToZeroPlan,
)


class SageMakerHosting:
    """The aws backend's hosting (the `Hosting` protocol): SageMaker models, endpoint configs, endpoints and inference
    components, each concern delegated to its part."""

    kind = "aws"

    def __init__(self, aws: Aws, backend: AwsBackend, *, poll_s: float):
        self.calls = SageMakerCalls(aws, backend, poll_s=poll_s)
        self.scaling = Scaling(self.calls)
        self.cleanup = Cleanup(self.calls, self.scaling)
        self.deployer = Deployer(self.calls, self.cleanup)
        self.rollout = Rollout(self.calls, self.deployer)

    # -- requests (pure; the dry run prints the same ones) ----------------------------------------
    variant = staticmethod(hosting_requests.variant)
    single_model = staticmethod(hosting_requests.single_model)
    component_request = staticmethod(hosting_requests.component_request)
    rolling_update_request = staticmethod(hosting_requests.rolling_update_request)
    scale_to_zero_requests = staticmethod(hosting_requests.scale_to_zero_requests)

    def model_request(self, component: str, spec: ComponentSpec, endpoint: str, placement=None) -> dict:
        """CreateModel for a spec, run as this backend's execution role (`hosting_requests.model_request`)."""
        return hosting_requests.model_request(component, spec, endpoint, placement,
                                              role_arn=self.calls.backend.execution_role_arn)

    def endpoint_config_request(self, endpoint: str, placement, *, model_name: str | None, variant_name: str,
                                on_gpu: bool, release_id: str, role: str = "production") -> dict:
        """CreateEndpointConfig under this backend's execution role (`hosting_requests.endpoint_config_request`)."""
        return hosting_requests.endpoint_config_request(endpoint, placement, model_name=model_name,
                                                        variant_name=variant_name, on_gpu=on_gpu, release_id=release_id,
                                                        role_arn=self.calls.backend.execution_role_arn, role=role)

    # -- the Hosting protocol ----------------------------------------------------------------------
    def deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
               progress: Progress) -> LiveComponent:
        """`Deployer.deploy`: model, endpoint config, endpoint and (except single-model candidates) the component."""
        return self.deployer.deploy(endpoint, component, spec, placement, role=role, progress=progress)

    def start_deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
                     progress: Progress) -> None:
        """`Deployer.start`: what `deploy` creates, without its waits."""
        self.deployer.start(endpoint, component, spec, placement, role=role, progress=progress)

    def poll_deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
                    progress: Progress) -> DeployPoll:
        """`Deployer.poll`: one look at the endpoint and its component (created once the endpoint is up)."""
        return self.deployer.poll(endpoint, component, spec, placement, role=role, progress=progress)

    def roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement, plan: RolloutPlan, bake: Bake, *,
                 progress: Progress, on_step: OnStep | None = None, previous: dict | None = None,
                 keep: KeepReplaced | None = None) -> RolloutResult:
        """`Rollout.roll_out`: SageMaker's rolling update with the release's alarms, followed and baked."""
        return self.rollout.roll_out(endpoint, component, spec, placement, plan, bake, progress=progress,
                                     on_step=on_step, previous=previous, keep=keep)

    def start_roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement, plan: RolloutPlan, *,
                       progress: Progress, keep: KeepReplaced) -> bool:
        """`Rollout.start`: the rolling update sent, not waited for."""
        return self.rollout.start(endpoint, component, spec, plan, progress=progress, keep=keep)

    def poll_roll_out(self, endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan, bake: Bake, *,
                      progress: Progress, on_step: OnStep | None = None) -> DeployPoll:
        """`Rollout.poll`: one describe, and one check while the update runs."""
        return self.rollout.poll(endpoint, component, spec, plan, bake, progress=progress, on_step=on_step)

    def describe(self, endpoint: str, component: str) -> LiveComponent | None:
        """`describe_component`: what serves, or None."""
        return describe_component(self.calls, endpoint, component)

    def enable_scale_to_zero(self, endpoint: str, component: str, plan: ScaleToZeroPlan, *, progress: Progress) -> None:
        """`Scaling.enable_scale_to_zero`: target, policies and scale-out alarm, sent only when missing or different."""
        self.scaling.enable_scale_to_zero(endpoint, component, plan, progress=progress)

    def set_copies(self, endpoint: str, component: str, copies: int, *, progress: Progress) -> None:
        """`Scaling.set_copies`: the component's copy count, waited for."""
        self.scaling.set_copies(endpoint, component, copies, progress=progress)

    def delete_component(self, endpoint: str, component: str, *, progress: Progress) -> bool:
        """`Cleanup.delete_component`: its scaling, then the component; False when it is not on `endpoint`."""
        return self.cleanup.delete_component(endpoint, component, progress=progress)

    def delete_endpoint(self, endpoint: str, *, progress: Progress) -> bool:
        """`Cleanup.delete_endpoint`: components, endpoint, configs and models; False when none existed."""
        return self.cleanup.delete_endpoint(endpoint, progress=progress)

    def invoker(self, endpoint: str, component: str, *, timeout_s: float) -> Invoker:
        """`runtime_invoker`: the component's (or single-model variant's) invoker through `sagemaker-runtime`."""
        return runtime_invoker(self.calls, endpoint, component, timeout_s=timeout_s)

    def managed_resources(self, prefix: str) -> list[ManagedResource]:
        """`Cleanup.managed_resources`: everything under `prefix` with shiplift's tag, in deletion order."""
        return self.cleanup.managed_resources(prefix)

    def delete_resource(self, resource: ManagedResource, *, progress: Progress) -> None:
        """`Cleanup.delete_resource`: one resource `managed_resources` listed."""
        self.cleanup.delete_resource(resource, progress=progress)

    # -- beyond the protocol: the gate's cold start and the metrics' dimensions ---------------------
    def wait_for_zero_instances(self, endpoint: str, *, progress: Progress, deadline_s: float | None = None) -> None:
        """`Scaling.wait_for_zero_instances`: until the endpoint has given back its instances."""
        self.scaling.wait_for_zero_instances(endpoint, progress=progress, deadline_s=deadline_s)

    def inference_component(self, endpoint: str, component: str) -> dict | None:
        """The component's description when it runs on `endpoint`; None for a single-model endpoint's variant."""
        return self.calls.inference_component(endpoint, component)
