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
"""

from __future__ import annotations

import re
import time

from tasks.backends.aws.iam import COPY_DIMENSION, GATE_NAMESPACE, MANAGED, SCALING_NAMESPACE
from tasks.backends.aws.service_model import request_applied
from tasks.backends.aws.artifact_store import artifact_sha256
from tasks.backends.aws.waiters import wait_for
from tasks.backends.placement import gpus_per_instance
from tasks.errors import BadInput, CapacityError, Conflict, DeployFailed, IntegrityError, NotFound, NotReady
from tasks.hashing import sha256_json
from images.common.sagemaker_http import SERVING_ID_ENV
from tasks.backends.interfaces import (
    DEPLOY_WAIT_S,
    SCALE_WAIT_S,
    TEARDOWN_WAIT_S,
    Bake,
    OnStep,
    ComponentSpec,
    LiveComponent,
    ManagedResource,
    ModelRef,
    PlacementObtained,
    Progress,
    RolloutPlan,
    RolloutResult,
    RolloutStep,
    ScaleToZeroPlan,
)

VARIANT = "AllTraffic"  # the capacity variant of inference-component endpoints
ENDPOINT_TAG, RELEASE_TAG = "shiplift:endpoint", "shiplift:release"  # and iam's MANAGED
STARTUP_TIMEOUT_S = 900  # container start and model download of multi-GB models (DESIGN §7)
ENDPOINT_WAIT_S = DEPLOY_WAIT_S // 2  # on top of the pool's provision timeout; with the component's: the stage table's
COMPONENT_WAIT_S = DEPLOY_WAIT_S // 2
DELETE_WAIT_S = TEARDOWN_WAIT_S // 2  # a component, then the endpoint
# CreateEndpoint/UpdateEndpoint read a new endpoint config eventually consistently (API_CreateEndpoint): retried with
# backoff from min(poll_s, CONFIG_RETRY_S), doubling up to CONFIG_RETRY_MAX_S, until CONFIG_VISIBLE_S
CONFIG_RETRY_S, CONFIG_RETRY_MAX_S, CONFIG_VISIBLE_S = 1.0, 8.0, 60.0
UNSETTLED = ("Creating", "Updating")  # SageMaker refuses UpdateInferenceComponent in these (reported, not on its API page)
ROUTING = {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
SAGEMAKER_PERIOD_S = 60  # SageMaker publishes invocation metrics per minute
GATE_METRIC = "OnlineGateFailed"
GATE_PERIOD_S = 10  # the gate's verdict is a high-resolution metric, so its alarm can judge every 10 s
# Scale to zero (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html): the metrics
# (per copy; when a request finds no copy) and the step policy's values; what Application Auto Scaling scales is iam's
# (COPY_DIMENSION, SCALING_NAMESPACE), whose grant is conditioned on it.
# The alarm judges 30 s periods (Statistic Maximum, GreaterThanOrEqualToThreshold 1, TreatMissingData missing), exactly as
# AWS's scale-to-zero blog post's put_metric_alarm does
# (https://aws.amazon.com/blogs/machine-learning/unlock-cost-savings-with-the-new-scale-down-to-zero-feature-in-amazon-sagemaker-inference/):
# one failed request in the period fires it (each failure is a datum of 1); the user guide page's example uses 60 s and
# GreaterThanThreshold 1, which needs a second failure in the minute.
PER_COPY_METRIC = "SageMakerInferenceComponentInvocationsPerCopy"
NO_CAPACITY_METRIC = "NoCapacityInvocationFailures"
NO_CAPACITY_PERIOD_S = 30
NO_CAPACITY_STATISTIC = "Maximum"
SCALE_OUT_COOLDOWN_S = 60  # the page's step policy: Cooldown 60, one copy when the alarm fires
SCALE_OUT_COPIES = 1


def name_base(name: str) -> str:
    """The first 52 characters of a name (no trailing hyphen): what its configs and models are named after."""
    return name[:52].rstrip("-")


def content_name(base: str, content: dict) -> str:
    """`<base, cut to 52>-<10 hex of base and content>`: at most 63 characters, unique per base and content."""
    return f"{name_base(base)}-{sha256_json({'base': base, 'content': content})[:10]}"


def tags(**values: str) -> list[dict]:
    """shiplift's tags: `shiplift:managed=true` (what cleanup looks for) and `shiplift:<key>` for each value."""
    return [{"Key": MANAGED, "Value": "true"}, *({"Key": f"shiplift:{k}", "Value": v} for k, v in sorted(values.items()))]


def component_dimensions(component: str) -> list[dict]:
    """The CloudWatch dimensions of an inference component's metrics (SageMaker's and the online gate's)."""
    return [{"Name": "InferenceComponentName", "Value": component}]


def scaling_resource_id(component: str) -> str:
    """Application Auto Scaling's ResourceId of an inference component's copy count."""
    return f"inference-component/{component}"


def scale_to_zero_names(component: str) -> dict[str, str]:
    """The names of a component's scale-to-zero resources: its own name plus a fixed suffix (at most 63 + 25
    characters, within PolicyName's 256 and AlarmName's 255). Not content-derived, unlike models and rollout alarms:
    PutScalingPolicy and PutMetricAlarm replace what has the same name, so a changed plan replaces its policies in
    place, where a new name would leave the old policy scaling too. Prefixed by the component, so cleanup finds them."""
    return {"tracking": f"{component}-invocations-per-copy", "step": f"{component}-scale-out-from-zero",
            "alarm": f"{component}-no-capacity"}


def rollback_batch_size(plan: RolloutPlan) -> dict:
    """RollbackMaximumBatchSize, always sent so the request states the rollback peak that `fleet plan` and the config
    check count (`capacity.rollback_room`): `rollout.rollback_batch` copies, else 100 % of them at once, which is also
    what SageMaker does when it is left out
    (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html)."""
    if plan.rollback_batch_copies is None:
        return {"Type": "CAPACITY_PERCENT", "Value": 100}
    return {"Type": "COPY_COUNT", "Value": plan.rollback_batch_copies}


def failure_reason(answer: dict | None) -> str:
    """SageMaker's FailureReason of a describe answer, or a note that it gave none."""
    return (answer or {}).get("FailureReason") or "(SageMaker gave no FailureReason)"


def is_serverless(config: dict) -> bool:
    """Whether an endpoint config's variant is serverless."""
    return "ServerlessConfig" in (config.get("ProductionVariants") or [{}])[0]


def obtained_placement(endpoint: dict, config: dict) -> PlacementObtained:
    """What the endpoint got, read from its description and its config: the pool entry with instances,
    the instance type, the MIG layout, or the serverless memory and concurrency."""
    variant = (endpoint.get("ProductionVariants") or [{}])[0]
    requested = (config.get("ProductionVariants") or [{}])[0]
    if is_serverless(config):
        asked = requested["ServerlessConfig"]
        return PlacementObtained(kind="serverless", requested=f"serverless {asked.get('MemorySizeInMB')} MB, max concurrency "
                                 f"{asked.get('MaxConcurrency')}, provisioned {asked.get('ProvisionedConcurrency', 0)}")
    ami = requested.get("InferenceAmiVersion")
    if requested.get("InstancePools"):
        order = [p["InstanceType"] for p in sorted(requested["InstancePools"], key=lambda p: p["Priority"])]
        counts = {p["InstanceType"]: p.get("CurrentInstanceCount", 0) for p in variant.get("InstancePools") or []}
        got = next((t for t in order if counts.get(t, 0) > 0), None)
        return PlacementObtained(kind="instance_pool", requested=",".join(order), instance_type=got,
                                 instance_count=counts.get(got, 0) if got else 0,
                                 tried=tuple(order[:order.index(got)] if got else order), ami_version=ami)
    layout = (requested.get("AcceleratorPartitionLayouts") or [{}])[0].get("AcceleratorPartitionTypes", [])
    if layout:
        instances = variant.get("CurrentInstanceCount", 0)  # the layout is carved on every GPU of every instance
        gpus = gpus_per_instance(requested["InstanceType"]) if requested.get("InstanceType") else None
        return PlacementObtained(kind="mig_partition", requested=f"{len(layout)} x {layout[0]} per GPU",
                                 instance_type=requested.get("InstanceType"), instance_count=instances, partition_type=layout[0],
                                 partitions=len(layout) * (gpus or 1) * instances, ami_version=ami)
    return PlacementObtained(kind="instance_type", requested=requested.get("InstanceType", "unknown"),
                             instance_type=requested.get("InstanceType"), instance_count=variant.get("CurrentInstanceCount", 0),
                             ami_version=ami)


class SageMakerHosting:
    """The aws backend's hosting: SageMaker models, endpoint configs, endpoints and inference components."""

    kind = "aws"

    def __init__(self, aws, backend, *, poll_s: float):
        self.aws, self.backend, self.poll_s = aws, backend, poll_s

    def _sm(self, operation: str, **params) -> dict:
        return self.aws.call("sagemaker", operation, **params)

    # -- requests (pure; the dry run prints the same ones) ----------------------------------------
    def model_request(self, component: str, spec: ComponentSpec, endpoint: str, placement=None) -> dict:
        """CreateModel for a spec: named by component, container and release; the container's environment carries
        the spec's serving id (SHIPLIFT_SERVING_ID: our servers echo it with each answer, so the online gate tells the
        candidate's answers from the champion's; `describe` leaves it out); network isolation on, except for a
        serverless placement, which does not support it (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html,
        "Feature exclusions")."""
        container = {"Image": spec.image_uri, "ModelDataUrl": spec.artifact_uri,
                     "Environment": {**spec.environment, SERVING_ID_ENV: spec.serving_id()}}
        isolated = placement is None or placement.kind != "serverless"
        name = content_name(component, {"container": container, "release": spec.model_ref.release_id,
                                        **({} if isolated else {"isolated": False})})
        return {"ModelName": name, "PrimaryContainer": container, "ExecutionRoleArn": self.backend.execution_role_arn,
                "EnableNetworkIsolation": isolated,
                "Tags": tags(endpoint=endpoint, release=spec.model_ref.release_id, **{"artifact-sha256": spec.artifact_sha256})}

    def variant(self, placement, *, model_name: str | None, variant_name: str, on_gpu: bool,
                role: str = "production") -> dict:
        """One production variant: with a model (a single-model candidate on one instance) or without (inference
        components: production gets `placement.instance_count` instances, a candidate the one instance its one copy
        needs, which ManagedInstanceScaling may give back and add to as production's may)."""
        if placement.kind == "serverless":
            serverless = {"MemorySizeInMB": placement.memory_size_mb, "MaxConcurrency": placement.max_concurrency}
            if placement.provisioned_concurrency:
                serverless["ProvisionedConcurrency"] = placement.provisioned_concurrency
            return {"VariantName": variant_name, "ModelName": model_name, "ServerlessConfig": serverless}
        count = getattr(placement, "instance_count", 1) if role == "production" and not model_name else 1
        variant: dict = {"VariantName": variant_name, "RoutingConfig": dict(ROUTING)}
        if model_name:
            variant.update(ModelName=model_name, ContainerStartupHealthCheckTimeoutInSeconds=STARTUP_TIMEOUT_S,
                           ModelDataDownloadTimeoutInSeconds=STARTUP_TIMEOUT_S)
        if placement.kind == "instance_pool":
            variant.update(InitialInstanceCount=count,
                           InstancePools=[{"InstanceType": p.instance_type, "Priority": p.priority}
                                          for p in sorted(placement.pools, key=lambda p: p.priority)],
                           VariantInstanceProvisionTimeoutInSeconds=placement.provision_timeout_s)
        elif placement.kind == "mig_partition":
            variant.update(InstanceType=placement.instance_type, InitialInstanceCount=1,
                           AcceleratorPartitionLayouts=[{"AcceleratorPartitionTypes": [placement.partition_type] * placement.partitions}])
        else:
            variant.update(InstanceType=placement.instance_type, InitialInstanceCount=count)
        least = getattr(placement, "min_instance_count", None)
        # a MIG endpoint runs one instance (InitialInstanceCount 1): MinInstanceCount 0 lets it go, MaxInstanceCount 1
        # keeps it at one (inference-components-accelerator-partitioning-manage.html scales copies, never the layout)
        most = getattr(placement, "max_instance_count", None) or (1 if placement.kind == "mig_partition" and least == 0 else None)
        if most and not model_name:  # room for updates (tasks.backends.capacity); components only, as SageMaker allows
            # MinInstanceCount 0 lets SageMaker give back every instance while no component has a copy (scale to zero:
            # https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html)
            variant["ManagedInstanceScaling"] = {"Status": "ENABLED", "MinInstanceCount": count if least is None else least,
                                                 "MaxInstanceCount": most}
        if on_gpu and placement.inference_ami_version:
            variant["InferenceAmiVersion"] = placement.inference_ami_version
        return variant

    def endpoint_config_request(self, endpoint: str, placement, *, model_name: str | None, variant_name: str,
                                on_gpu: bool, release_id: str, role: str = "production") -> dict:
        """CreateEndpointConfig: one variant; inference-component endpoints carry the execution role."""
        request: dict = {"ProductionVariants": [self.variant(placement, model_name=model_name, variant_name=variant_name,
                                                             on_gpu=on_gpu, role=role)]}
        if model_name is None:
            request["ExecutionRoleArn"] = self.backend.execution_role_arn
        return {"EndpointConfigName": content_name(endpoint, request), **request,
                "Tags": tags(endpoint=endpoint, release=release_id)}

    def component_request(self, component: str, endpoint: str, spec: ComponentSpec, model_name: str) -> dict:
        """CreateInferenceComponent: the model, its compute (MIG partition, GPUs or cores, memory) and copies."""
        requirements: dict = {"MinMemoryRequiredInMb": spec.compute.memory_mb}
        if spec.compute.accelerator_partition:
            requirements.update(AcceleratorPartitionType=spec.compute.accelerator_partition, NumberOfAcceleratorDevicesRequired=1)
        elif spec.compute.accelerators:
            requirements["NumberOfAcceleratorDevicesRequired"] = spec.compute.accelerators
        if spec.compute.cpu_cores:
            requirements["NumberOfCpuCoresRequired"] = spec.compute.cpu_cores
        return {"InferenceComponentName": component, "EndpointName": endpoint, "VariantName": VARIANT,
                "Specification": {"ModelName": model_name, "ComputeResourceRequirements": requirements,
                                  "StartupParameters": {"ModelDataDownloadTimeoutInSeconds": STARTUP_TIMEOUT_S,
                                                        "ContainerStartupHealthCheckTimeoutInSeconds": STARTUP_TIMEOUT_S}},
                "RuntimeConfig": {"CopyCount": spec.copies},
                "Tags": tags(endpoint=endpoint, release=spec.model_ref.release_id)}

    @staticmethod
    def single_model(placement, role: str) -> bool:
        """Candidates on instance pools or one instance type are single-model endpoints; MIG and production use components,
        and so does a candidate whose placement lets the endpoint go to zero instances (`min_instance_count: 0`): only an
        endpoint that hosts inference components can scale to and from zero
        (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). A serverless
        endpoint is always single-model: it cannot host inference components."""
        return placement.kind == "serverless" or (role == "candidate" and placement.kind != "mig_partition"
                                                  and getattr(placement, "min_instance_count", None) != 0)

    # -- deploy ------------------------------------------------------------------------------
    def alarm_requests(self, endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan) -> list[dict]:
        """PutMetricAlarm for each rule of the plan's BakeAlarms on the component's own metrics, and for the online
        gate's verdict when there is one: what SageMaker's rolling update watches to roll back. Named after the
        component, release and rules, so a rerun finds the same alarms."""
        rules = plan.alarms
        base = content_name(component, {"release": spec.model_ref.release_id, "alarms": rules.model_dump(),
                                        "online_gate": plan.online_gate})
        dimensions = component_dimensions(component)
        common = {"EvaluationPeriods": 1, "DatapointsToAlarm": 1, "ComparisonOperator": "GreaterThanThreshold",
                  "TreatMissingData": "notBreaching", "Tags": tags(endpoint=endpoint, release=spec.model_ref.release_id)}

        def summed(metric_id: str, metric: str) -> dict:
            return {"Id": metric_id, "ReturnData": False, "MetricStat": {
                "Metric": {"Namespace": "AWS/SageMaker", "MetricName": metric, "Dimensions": dimensions},
                "Period": SAGEMAKER_PERIOD_S, "Stat": "Sum"}}

        requests = [{
            "AlarmName": f"{base}-error-rate", **common, "Threshold": rules.max_error_rate,
            "AlarmDescription": f"rollout.alarms.max_error_rate of {component}: (5xx or model errors) / invocations, "
                                f"judged from {rules.min_invocations} invocations a minute",
            "Metrics": [summed("errors5xx", "Invocation5XXErrors"), summed("modelerrors", "InvocationModelErrors"),
                        summed("invocations", "Invocations"),
                        {"Id": "errorrate", "Label": "error rate", "ReturnData": True,
                         "Expression": f"IF(invocations >= {rules.min_invocations}, MAX([errors5xx, modelerrors]) / invocations, 0)"}],
        }]
        if rules.max_latency_p99_ms is not None:
            requests.append({
                "AlarmName": f"{base}-latency-p99", **common, "Threshold": rules.max_latency_p99_ms * 1000.0,
                "AlarmDescription": f"rollout.alarms.max_latency_p99_ms of {component} ({rules.max_latency_p99_ms:g} ms; "
                                    "ModelLatency is in microseconds)",
                "Namespace": "AWS/SageMaker", "MetricName": "ModelLatency", "Dimensions": dimensions,
                "ExtendedStatistic": "p99", "Period": SAGEMAKER_PERIOD_S,
            })
        if plan.online_gate:
            requests.append({
                "AlarmName": f"{base}-online-gate", **common, "Threshold": 0.0,
                "AlarmDescription": f"rollout.online_gate of {component}: 1 when the candidate fails the gate on its own "
                                    "answers to the canary set (published by shiplift during the bake)",
                "Namespace": GATE_NAMESPACE, "MetricName": GATE_METRIC, "Dimensions": dimensions,
                "Statistic": "Maximum", "Period": GATE_PERIOD_S,
            })
        return requests

    def rolling_update_request(self, component: str, endpoint: str, spec: ComponentSpec, model_name: str,
                               plan: RolloutPlan, alarms: list[str]) -> dict:
        """UpdateInferenceComponent to the candidate's model (its whole specification, compute included) in batches
        of copies, rolled back by the alarms, `rollback_batch_size(plan)` at a time."""
        policy: dict = {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": plan.batch_copies},
                        "WaitIntervalInSeconds": int(plan.wait_interval_s),
                        "MaximumExecutionTimeoutInSeconds": int(plan.max_execution_s),
                        "RollbackMaximumBatchSize": rollback_batch_size(plan)}
        return {"InferenceComponentName": component,
                "Specification": self.component_request(component, endpoint, spec, model_name)["Specification"],
                "RuntimeConfig": {"CopyCount": spec.copies},
                "DeploymentConfig": {"RollingUpdatePolicy": policy,
                                     "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": name} for name in alarms]}}}

    def gate_datum(self, component: str, *, failed: bool) -> dict:
        """PutMetricData of the online gate's verdict (1: the candidate fails), at one-second resolution."""
        return {"Namespace": GATE_NAMESPACE, "MetricData": [{
            "MetricName": GATE_METRIC, "Dimensions": component_dimensions(component),
            "Value": 1.0 if failed else 0.0, "Unit": "Count", "StorageResolution": 1}]}

    def roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement, plan: RolloutPlan, bake: Bake, *,
                 progress: Progress, on_step: OnStep | None = None) -> RolloutResult:
        """SageMaker's rolling update: create the release's alarms, send UpdateInferenceComponent with the
        RollingUpdatePolicy and the alarms, and follow it, calling `bake` every `check_interval_s` (the online gate
        replays there and its verdict is published for its alarm). SageMaker ends a rolled-back update InService
        on the old spec with no rollback status, so success is the candidate's model serving on every copy and
        anything else is the rollback it is, with the alarm seen firing. This rollout's own update (its
        LastDeploymentConfig names this rollout's alarms), still Updating or ended after a crash, is followed, not
        sent again; a component Creating, or Updating for another cause, is waited for first (SageMaker refuses
        UpdateInferenceComponent then). A Failed component is updated again, never deleted: its copies may still serve
        the champion. The alarms are removed once the update has ended (a crashed watcher leaves them to SageMaker,
        and its rerun, which names the same alarms, removes them). `on_step` hears of every check as it is seen (shifted)
        and judged (baked), and of the last observation, once the update has ended, as the step it is (rollout, or the
        rollback SageMaker made)."""
        tell = on_step or (lambda kind, step: None)
        live = self.inference_component(endpoint, component)
        if live is None:
            self.deploy(endpoint, component, spec, placement, role="production", progress=progress)
            return RolloutResult(status="created")
        model = self.model_request(component, spec, endpoint)
        self._ensure("Model", model["ModelName"], model, ("PrimaryContainer", "ExecutionRoleArn", "EnableNetworkIsolation"))
        alarms = self.alarm_requests(endpoint, component, spec, plan)
        names = [alarm["AlarmName"] for alarm in alarms]
        status, ours = live.get("InferenceComponentStatus"), self._our_update(live, names)
        if status in UNSETTLED and not (ours and status == "Updating"):
            progress(f"inference component {component} is {status} (not this rollout's update); waiting for it to end "
                     "before updating it")
            live = self._settled(component, progress, deadline_s=plan.max_execution_s + COMPONENT_WAIT_S)
            if live is None:
                self.deploy(endpoint, component, spec, placement, role="production", progress=progress)
                return RolloutResult(status="created")
            status, ours = live.get("InferenceComponentStatus"), self._our_update(live, names)
        if status == "InService" and self._runs(live, model["ModelName"], spec.copies):
            return RolloutResult(status="unchanged")
        for alarm in alarms:
            self.aws.call("cloudwatch", "PutMetricAlarm", **alarm)
        if ours and status in ("Updating", "InService"):
            progress(f"inference component {component}: this rollout's update (an earlier attempt's) is {status}; "
                     "following it, not sending it again")
        else:
            if status == "Failed":
                progress(f"inference component {component} is Failed ({failure_reason(live)}) with "
                         f"{self._copies(live)} copies; updating it again (it is never deleted: its copies may still serve)")
            progress(f"inference component {component}: rolling update to {model['ModelName']} in batches of "
                     f"{plan.batch_copies}, {plan.wait_interval_s:g}s bake, alarms {', '.join(names)}")
            self._sm("UpdateInferenceComponent",
                     **self.rolling_update_request(component, endpoint, spec, model["ModelName"], plan, names))
        steps, final, fired = self._follow(component, spec, plan, bake, names, progress, tell)
        if final.get("InferenceComponentStatus") == "Failed" or self._runs(final, model["ModelName"], spec.copies):
            tell("shifted", steps[-1])  # the update ended on the new spec, or Failed; a rollback is told below
        else:
            reason = self._rollback_reason(final, steps, fired, plan)
            steps[-1] = steps[-1].model_copy(update={"phase": "rollback", "alarm": reason})
            tell("shifted", steps[-1])
        self.aws.call("cloudwatch", "DeleteAlarms", AlarmNames=names)  # kept while an update may still need them
        if final.get("InferenceComponentStatus") == "Failed":
            serving = self._copies(final)
            raise DeployFailed(
                f"inference component {component} failed during its rolling update: {failure_reason(final)}"
                + (f"; {serving} copies of the previous model still serve on it" if serving else ""),
                fix="read the FailureReason and the container logs, fix the cause and rerun promote: it updates the same "
                    "component again (a Failed production component is never deleted)"
                    + ("" if serving else "; no copy serves now"))
        if self._runs(final, model["ModelName"], spec.copies):
            return RolloutResult(status="succeeded", steps=tuple(steps))
        reason = steps[-1].alarm
        progress(f"inference component {component}: rolled back: {reason}")
        return RolloutResult(status="rolled_back", reason=reason, steps=tuple(steps))

    @staticmethod
    def _copies(live: dict | None) -> int:
        """The copies a component's description says are deployed now (CurrentCopyCount)."""
        return int(((live or {}).get("RuntimeConfig") or {}).get("CurrentCopyCount") or 0)

    @staticmethod
    def _our_update(live: dict, alarms: list[str]) -> bool:
        """Whether the component's last deployment is this rollout's rolling update: its rollback alarms are the ones
        this rollout names (they derive from the component, the release and the rules)."""
        config = (live.get("LastDeploymentConfig") or {}).get("AutoRollbackConfiguration") or {}
        named = [alarm.get("AlarmName") for alarm in config.get("Alarms") or []]
        return bool(named) and named == alarms

    def _settled(self, component: str, progress: Progress, *, deadline_s: float) -> dict | None:
        """Wait (deadline) until the component is neither Creating nor Updating, which SageMaker refuses to update (a
        reported behaviour that API_UpdateInferenceComponent does not state; waiting is right either way): its
        description, or None once a deletion in progress removed it."""
        _, answer = wait_for(self.aws, "InferenceComponentInService", {"InferenceComponentName": component},
                             deadline_s=deadline_s, poll_s=self.poll_s, progress=progress,
                             what=f"inference component {component}")
        if (answer or {}).get("InferenceComponentStatus") == "Deleting":
            wait_for(self.aws, "InferenceComponentDeleted", {"InferenceComponentName": component}, deadline_s=DELETE_WAIT_S,
                     poll_s=self.poll_s, progress=progress, what=f"inference component {component}")
            return None
        return answer

    @staticmethod
    def _runs(live: dict, model_name: str, copies: int) -> bool:
        """Whether a component's description shows `model_name` on `copies` copies."""
        runtime = live.get("RuntimeConfig", {})
        return (live.get("Specification", {}).get("ModelName") == model_name
                and runtime.get("DesiredCopyCount") == copies == runtime.get("CurrentCopyCount"))

    def _follow(self, component: str, spec: ComponentSpec, plan: RolloutPlan, bake: Bake, alarms: list[str],
                progress: Progress, tell: OnStep) -> tuple[list[RolloutStep], dict, dict[str, str]]:
        """Poll the update until it ends; every check interval read the alarms' states and run the bake, telling each
        check as it is seen and judged. Returns the steps (the last one, not told yet: the component and its alarms once
        the update ended), the last description and every alarm seen in ALARM with its StateReason."""
        steps: list[RolloutStep] = []
        fired: dict[str, str] = {}
        spec_sha256, batches = spec.sha256(), len(plan.targets(spec.copies))
        next_check = 0.0

        def observed(answer: dict) -> RolloutStep:
            """The component's copy count in this description and every alarm's state now."""
            found = self.aws.call("cloudwatch", "DescribeAlarms", AlarmNames=alarms).get("MetricAlarms", [])
            fired.update({a["AlarmName"]: a.get("StateReason", "") for a in found if a.get("StateValue") == "ALARM"})
            return RolloutStep(phase="rollout", check=len(steps) + 1, batches=batches, new_spec_sha256=spec_sha256,
                               copies=answer.get("RuntimeConfig", {}).get("CurrentCopyCount"),
                               alarm_states={a["AlarmName"]: a.get("StateValue", "INSUFFICIENT_DATA") for a in found})

        def check(answer: dict) -> None:
            nonlocal next_check
            if time.monotonic() < next_check:
                return
            next_check = time.monotonic() + plan.alarms.check_interval_s
            step = observed(answer)
            tell("shifted", step)
            alarm = bake(step)
            if plan.online_gate:
                self.aws.call("cloudwatch", "PutMetricData", **self.gate_datum(component, failed=alarm is not None))
            steps.append(step.model_copy(update={"alarm": alarm}))
            tell("baked", steps[-1])  # after the gate's datum: SageMaker's alarm on it must not wait for the ledger
            in_alarm = [name for name, state in step.alarm_states.items() if state == "ALARM"]
            progress(f"inference component {component}: check {len(steps)}: {step.copies} copies; "
                     + (f"in ALARM: {', '.join(in_alarm)}" if in_alarm else "no alarm")
                     + (f"; {alarm}" if alarm else ""))

        _, final = wait_for(self.aws, "InferenceComponentInService", {"InferenceComponentName": component},
                            deadline_s=plan.max_execution_s + COMPONENT_WAIT_S, poll_s=self.poll_s,
                            progress=progress, what=f"inference component {component}", on_poll=check)
        final = final or {}
        steps.append(observed(final))
        return steps, final, fired

    @staticmethod
    def _rollback_reason(final: dict, steps: list[RolloutStep], fired: dict[str, str], plan: RolloutPlan) -> str:
        """Why SageMaker ended the update on the old spec: the alarms seen in ALARM, the online gate's verdict, the
        update's FailureReason, or (none of them seen) its maximum execution time."""
        if fired:
            return "; ".join(f"alarm {name} fired" + (f": {reason}" if reason else "") for name, reason in fired.items())
        gate = next((step.alarm for step in steps if step.alarm), None)
        if gate:
            return gate
        if final.get("FailureReason"):
            return f"the update failed: {final['FailureReason']}"
        return ("SageMaker ended the update on the previous model with no alarm seen in ALARM: it passed "
                f"MaximumExecutionTimeoutInSeconds ({plan.max_execution_s:g}s) or an alarm fired between two checks")

    def deploy(self, endpoint: str, component: str, spec: ComponentSpec, placement, *, role: str,
               progress: Progress) -> LiveComponent:
        """Model, endpoint config (MIG layout read back), endpoint and, except for single-model candidates, the component."""
        on_gpu = bool(spec.compute.accelerators or spec.compute.accelerator_partition)
        model = self.model_request(component, spec, endpoint, placement)
        self._ensure("Model", model["ModelName"], model, ("PrimaryContainer", "ExecutionRoleArn", "EnableNetworkIsolation"))
        single = self.single_model(placement, role)
        config = self.endpoint_config_request(endpoint, placement, model_name=model["ModelName"] if single else None,
                                              variant_name=component if single else VARIANT, on_gpu=on_gpu,
                                              release_id=spec.model_ref.release_id, role=role)
        self._ensure("EndpointConfig", config["EndpointConfigName"], config, ("ProductionVariants", "ExecutionRoleArn"))
        if placement.kind == "mig_partition":
            self._check_layout(config)
        self._ensure_endpoint(endpoint, config, placement, role=role, release_id=spec.model_ref.release_id, progress=progress)
        if not single:
            self._ensure_component(self.component_request(component, endpoint, spec, model["ModelName"]), progress, role=role)
        live = self.describe(endpoint, component)
        if live is None:
            raise NotFound(f"{endpoint}/{component} vanished right after its deploy", fix="rerun the stage")
        return live

    def _ensure(self, kind: str, name: str, request: dict, compared: tuple[str, ...]) -> None:
        """Create a model or endpoint config unless it exists; an existing one must hold the same content."""
        key = f"{kind}Name"
        try:
            live = self._sm(f"Describe{kind}", **{key: name})
        except NotFound:
            self._sm(f"Create{kind}", **request)
            return
        differs = [field for field in compared if field in request and not request_applied(live.get(field), request[field])]
        if differs:
            raise Conflict(f"SageMaker {kind} {name} exists with other {', '.join(differs)} than this release asks for",
                           fix=f"its name derives from content, so someone changed it by hand: delete {name} and rerun")

    def _check_layout(self, config: dict) -> None:
        """A MIG layout SageMaker dropped would place copies on whole GPUs: read the config back and refuse that."""
        sent = config["ProductionVariants"][0]["AcceleratorPartitionLayouts"]
        live = self._sm("DescribeEndpointConfig", EndpointConfigName=config["EndpointConfigName"])
        got = (live.get("ProductionVariants") or [{}])[0].get("AcceleratorPartitionLayouts")
        if got != sent:
            raise IntegrityError(
                f"endpoint config {config['EndpointConfigName']} reads back AcceleratorPartitionLayouts {got!r}, "
                f"not the {sent!r} sent: the partition layout was dropped",
                fix="upgrade botocore (>= 1.44 knows the MIG fields) and check the region supports MIG partitions; "
                    f"delete {config['EndpointConfigName']} before rerunning")

    def _ensure_endpoint(self, endpoint: str, config: dict, placement, *, role: str, release_id: str, progress: Progress) -> None:
        """Create the endpoint (or find it by name), replace it when an earlier attempt left it Failed, and wait."""
        name = config["EndpointConfigName"]
        live = self._describe_endpoint(endpoint)
        if live is not None and live.get("EndpointStatus") == "Failed":
            progress(f"{role} {endpoint} is Failed from an earlier attempt ({failure_reason(live)}); replacing it")
            self._delete_endpoint_only(endpoint, progress)
            live = None
        if live is None:
            progress(f"{role} {endpoint}: CreateEndpoint ({placement.kind})")
            self._with_config("CreateEndpoint", progress, EndpointName=endpoint, EndpointConfigName=name,
                              Tags=tags(endpoint=endpoint, release=release_id, role=role))
        elif live.get("EndpointConfigName") != name:
            if role == "production" and placement.kind == "serverless":
                self._check_stays_serverless(endpoint, live)
            elif role == "production":
                raise Conflict(f"production {endpoint} runs endpoint config {live.get('EndpointConfigName')}, not {name}: "
                               "its placement changed, and a MIG layout cannot change on a running endpoint",
                               fix="keep the production placement, or move production to a new endpoint (a new resource_prefix)")
            if live.get("EndpointStatus") == "InService":
                self._with_config("UpdateEndpoint", progress, EndpointName=endpoint, EndpointConfigName=name)
        deadline = getattr(placement, "provision_timeout_s", 0) + ENDPOINT_WAIT_S
        state, answer = wait_for(self.aws, "EndpointInService", {"EndpointName": endpoint}, deadline_s=deadline,
                                 poll_s=self.poll_s, progress=progress, what=f"endpoint {endpoint}")
        if state == "failure":
            reason = failure_reason(answer)
            if placement.kind == "instance_pool" and "capacity" in reason.lower():
                tried = [p.instance_type for p in sorted(placement.pools, key=lambda p: p.priority)]
                raise CapacityError(f"endpoint {endpoint}: no capacity in any instance pool; tried {', '.join(tried)}: {reason}",
                                    fix="add instance types to placement.pools, raise provision_timeout_s, or retry later")
            raise DeployFailed(f"endpoint {endpoint} is {(answer or {}).get('EndpointStatus')}: {reason}",
                               fix="read the FailureReason and the endpoint's CloudWatch logs; teardown removes it, then rerun")

    def _check_stays_serverless(self, endpoint: str, live: dict) -> None:
        """A serverless release's new endpoint config may replace a serverless one (UpdateEndpoint), never an
        instance-based one: SageMaker refuses to convert an instance-based endpoint to serverless
        (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html)."""
        if not is_serverless(self._config_of(live) or {}):
            raise Conflict(f"production {endpoint} is instance-based (endpoint config {live.get('EndpointConfigName')}), and "
                           "SageMaker cannot turn an instance-based endpoint serverless",
                           fix="keep the instance placement, or release under a new name (a new endpoint) and delete "
                               f"{endpoint} once callers have moved")

    def _with_config(self, operation: str, progress: Progress, **params) -> dict:
        """CreateEndpoint or UpdateEndpoint, retried while SageMaker does not see the endpoint config just created yet:
        it reads configs eventually consistently and answers ValidationException "Could not find endpoint
        configuration" (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateEndpoint.html says to
        retry). Backoff doubles up to CONFIG_RETRY_MAX_S; NotReady (retryable) once CONFIG_VISIBLE_S have passed."""
        name = params["EndpointConfigName"]
        deadline, delay = time.monotonic() + CONFIG_VISIBLE_S, min(self.poll_s, CONFIG_RETRY_S)
        while True:
            try:
                return self._sm(operation, **params)
            except NotFound as exc:
                if "Could not find endpoint configuration" not in exc.problem:
                    raise
                if time.monotonic() + delay > deadline:
                    raise NotReady(f"SageMaker {operation} of {params['EndpointName']} still does not find endpoint config "
                                   f"{name} after {CONFIG_VISIBLE_S:g}s: {exc.problem}",
                                   fix=f"rerun the stage; if it persists, check that {name} exists in {self.backend.region}") from exc
                progress(f"{operation}: endpoint config {name} is not visible to SageMaker yet; retrying in {delay:g}s")
                time.sleep(delay)
                delay = min(delay * 2, CONFIG_RETRY_MAX_S)

    def _ensure_component(self, request: dict, progress: Progress, *, role: str) -> None:
        """Create or update the component to this request and wait. One Creating or Updating is waited for first
        (SageMaker refuses to update it). One an earlier attempt left Failed is deleted and created again only when it
        is a candidate's with no copy; production's (whose copies may still serve the champion after a failed update)
        is updated again, never deleted."""
        component = request["InferenceComponentName"]
        try:
            live = self._sm("DescribeInferenceComponent", InferenceComponentName=component)
        except NotFound:
            live = None
        if live is not None and live["EndpointName"] != request["EndpointName"]:
            raise Conflict(f"inference component {component} already runs on endpoint {live['EndpointName']}",
                           fix="component names are global to the account and region: delete it or change resource_prefix")
        if live is not None and live.get("InferenceComponentStatus") in UNSETTLED:
            progress(f"inference component {component} is {live['InferenceComponentStatus']}; waiting for it to end first")
            live = self._settled(component, progress, deadline_s=COMPONENT_WAIT_S)
        failed = live is not None and live.get("InferenceComponentStatus") == "Failed"
        if failed and role == "candidate" and not self._copies(live):
            progress(f"inference component {component} is Failed from an earlier attempt ({failure_reason(live)}); replacing it")
            self._delete_component(component, progress)
            live = failed = None
        if live is None:
            progress(f"inference component {component}: CreateInferenceComponent ({request['RuntimeConfig']['CopyCount']} copies)")
            self._sm("CreateInferenceComponent", **request)
        else:
            same = (live.get("Specification", {}).get("ModelName") == request["Specification"]["ModelName"]
                    and live.get("RuntimeConfig", {}).get("DesiredCopyCount") == request["RuntimeConfig"]["CopyCount"])
            if failed:
                progress(f"{role} inference component {component} is Failed ({failure_reason(live)}) with {self._copies(live)} "
                         "copies; updating it again (it is not deleted: its copies may still serve)")
            if failed or not same:
                progress(f"inference component {component}: UpdateInferenceComponent to {request['Specification']['ModelName']}")
                update = {k: request[k] for k in ("InferenceComponentName", "Specification", "RuntimeConfig")}
                self._sm("UpdateInferenceComponent", **update)
        state, answer = wait_for(self.aws, "InferenceComponentInService", {"InferenceComponentName": component},
                                 deadline_s=COMPONENT_WAIT_S, poll_s=self.poll_s, progress=progress,
                                 what=f"inference component {component}")
        if state == "failure":
            reason, serving = failure_reason(answer), self._copies(answer)
            error = CapacityError if "capacity" in reason.lower() else DeployFailed
            kept = (f"; it keeps {serving} copies of its previous model serving and is kept, not deleted: a rerun updates it "
                    "again" if serving else "")
            raise error(f"inference component {component} failed: {reason}{kept}",
                        fix="check the copies fit the endpoint's partitions or instances, and the container logs")

    # -- scale to zero ---------------------------------------------------------------------------
    def scale_to_zero_requests(self, endpoint: str, component: str, plan: ScaleToZeroPlan) -> dict[str, dict]:
        """The requests of https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html for
        one component: `target` (RegisterScalableTarget, 0..max_copies copies, tagged as shiplift tags what it creates),
        `tracking` (PutScalingPolicy, target tracking on invocations per copy: it scales in, after `idle_s` of cooldown),
        `step` (PutScalingPolicy, step scaling: one more copy when its alarm fires) and `alarm` (PutMetricAlarm on the
        component's NoCapacityInvocationFailures, Maximum over 30 s >= 1, as AWS's post; its AlarmActions, the step policy's ARN, are added
        once Application Auto Scaling has named it)."""
        names = scale_to_zero_names(component)
        target = {"ServiceNamespace": SCALING_NAMESPACE, "ResourceId": scaling_resource_id(component),
                  "ScalableDimension": COPY_DIMENSION}
        return {
            "target": {**target, "MinCapacity": 0, "MaxCapacity": plan.max_copies,
                       "Tags": {tag["Key"]: tag["Value"] for tag in tags(endpoint=endpoint)}},
            "tracking": {"PolicyName": names["tracking"], **target, "PolicyType": "TargetTrackingScaling",
                         "TargetTrackingScalingPolicyConfiguration": {
                             "TargetValue": float(plan.invocations_per_copy),
                             "PredefinedMetricSpecification": {"PredefinedMetricType": PER_COPY_METRIC},
                             "ScaleInCooldown": plan.idle_s}},
            "step": {"PolicyName": names["step"], **target, "PolicyType": "StepScaling",
                     "StepScalingPolicyConfiguration": {
                         "AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Maximum",
                         "Cooldown": SCALE_OUT_COOLDOWN_S,
                         "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": SCALE_OUT_COPIES}]}},
            "alarm": {"AlarmName": names["alarm"],
                      "AlarmDescription": f"scale_to_zero of {component}: a request found no copy; the step policy "
                                          f"{names['step']} starts {SCALE_OUT_COPIES} (up to {plan.max_copies})",
                      "Namespace": "AWS/SageMaker", "MetricName": NO_CAPACITY_METRIC,
                      "Dimensions": component_dimensions(component), "Statistic": NO_CAPACITY_STATISTIC,
                      "Period": NO_CAPACITY_PERIOD_S,
                      "EvaluationPeriods": 1, "DatapointsToAlarm": 1, "Threshold": 1.0,
                      "ComparisonOperator": "GreaterThanOrEqualToThreshold", "TreatMissingData": "missing",
                      "Tags": tags(endpoint=endpoint)},
        }

    def enable_scale_to_zero(self, endpoint: str, component: str, plan: ScaleToZeroPlan, *, progress: Progress) -> None:
        """Register the component's copy count with Application Auto Scaling from 0 to `plan.max_copies`, put the
        target-tracking policy that scales it in and the step policy that scales it out from zero, and the alarm on
        NoCapacityInvocationFailures whose action is the step policy
        (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). Each is read first
        and sent only when missing or different, so a rerun sends nothing; the names are fixed per component, so a
        changed plan replaces its policies and alarm in place. The endpoint gives back its instances only when its
        variant's ManagedInstanceScaling.MinInstanceCount is 0 (placement.min_instance_count)."""
        if self.inference_component(endpoint, component) is None:
            raise NotFound(f"inference component {component} is not on endpoint {endpoint}",
                           fix="deploy it first; only an endpoint that hosts inference components scales to zero (a candidate "
                               "is one when placement.min_instance_count is 0)")
        wanted = self.scale_to_zero_requests(endpoint, component, plan)
        where = {key: wanted["target"][key] for key in ("ServiceNamespace", "ResourceId", "ScalableDimension")}
        targets = self._pages("application-autoscaling", "DescribeScalableTargets", "ScalableTargets",
                              ServiceNamespace=SCALING_NAMESPACE, ResourceIds=[where["ResourceId"]], ScalableDimension=COPY_DIMENSION)
        if not any(t.get("MinCapacity") == 0 and t.get("MaxCapacity") == plan.max_copies for t in targets):
            progress(f"inference component {component}: RegisterScalableTarget, 0..{plan.max_copies} copies")
            self.aws.call("application-autoscaling", "RegisterScalableTarget", **wanted["target"])
        names = [wanted["tracking"]["PolicyName"], wanted["step"]["PolicyName"]]
        live = {p["PolicyName"]: p for p in self._pages("application-autoscaling", "DescribeScalingPolicies", "ScalingPolicies",
                                                         PolicyNames=names, **where)}
        arns = {}
        for key in ("tracking", "step"):
            request = wanted[key]
            found = live.get(request["PolicyName"])
            compared = {k: v for k, v in request.items() if k == "PolicyType" or k.endswith("PolicyConfiguration")}
            if found is not None and request_applied(found, compared):
                arns[key] = found["PolicyARN"]
                continue
            progress(f"inference component {component}: PutScalingPolicy {request['PolicyName']} ({request['PolicyType']})")
            arns[key] = self.aws.call("application-autoscaling", "PutScalingPolicy", **request)["PolicyARN"]
        alarm = {**wanted["alarm"], "AlarmActions": [arns["step"]]}
        found = self.aws.call("cloudwatch", "DescribeAlarms", AlarmNames=[alarm["AlarmName"]]).get("MetricAlarms", [])
        if not (found and request_applied(found[0], {k: v for k, v in alarm.items() if k != "Tags"})):
            progress(f"inference component {component}: PutMetricAlarm {alarm['AlarmName']} ({NO_CAPACITY_METRIC} >= 1 in "
                     f"{NO_CAPACITY_PERIOD_S}s scales out by {SCALE_OUT_COPIES})")
            self.aws.call("cloudwatch", "PutMetricAlarm", **alarm)

    def set_copies(self, endpoint: str, component: str, copies: int, *, progress: Progress) -> None:
        """UpdateInferenceComponentRuntimeConfig to `copies` (0 stops every copy: the model allows CopyCount 0, and AWS's
        scale-to-zero post schedules exactly that,
        https://aws.amazon.com/blogs/machine-learning/unlock-cost-savings-with-the-new-scale-down-to-zero-feature-in-amazon-sagemaker-inference/),
        then wait (deadline SCALE_WAIT_S) until the component is InService with that many copies, desired and current.
        A component Creating or Updating is waited for first (SageMaker refuses to update it); nothing is sent when it
        already holds `copies`."""
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
            raise BadInput(f"copies={copies!r} is not a whole number >= 0", fix="pass the copy count to set (0 stops every copy)")
        live = self.inference_component(endpoint, component)
        if live is None and is_serverless(self._config_of(self._describe_endpoint(endpoint) or {}) or {}):
            raise BadInput(f"{endpoint} is serverless: SageMaker starts and stops its compute itself and has no call that "
                           "sets it", fix="time a serverless endpoint's cold start on its first request after creation")
        if live is None:
            raise NotFound(f"inference component {component} is not on endpoint {endpoint}", fix="deploy it first")
        if live.get("InferenceComponentStatus") in UNSETTLED:
            progress(f"inference component {component} is {live['InferenceComponentStatus']}; waiting for it to end first")
            live = self._settled(component, progress, deadline_s=COMPONENT_WAIT_S)
            if live is None:
                raise NotFound(f"inference component {component} was deleted meanwhile", fix="deploy it again")
        if not self._holds(live, copies):
            progress(f"inference component {component}: UpdateInferenceComponentRuntimeConfig to {copies} "
                     f"cop{'y' if copies == 1 else 'ies'} (from {self._copies(live)})")
            self._sm("UpdateInferenceComponentRuntimeConfig", InferenceComponentName=component,
                     DesiredRuntimeConfig={"CopyCount": copies})
        deadline = time.monotonic() + SCALE_WAIT_S
        while True:
            state, answer = wait_for(self.aws, "InferenceComponentInService", {"InferenceComponentName": component},
                                     deadline_s=max(self.poll_s, deadline - time.monotonic()), poll_s=self.poll_s,
                                     progress=progress, what=f"inference component {component}")
            answer = answer or {}
            reason = answer.get("FailureReason")
            if state == "failure" or (reason and not self._holds(answer, copies)):
                error = CapacityError if "capacity" in failure_reason(answer).lower() else DeployFailed
                raise error(f"inference component {component} did not reach {copies} copies: {failure_reason(answer)} "
                            f"(it has {self._copies(answer)})",
                            fix="check the copies fit the endpoint's instances (placement.max_instance_count) and the logs")
            if self._holds(answer, copies):
                return
            if time.monotonic() + self.poll_s > deadline:
                runtime = answer.get("RuntimeConfig") or {}
                raise NotReady(f"inference component {component} has {self._copies(answer)} copies (desired "
                               f"{runtime.get('DesiredCopyCount')}) after {SCALE_WAIT_S:g}s, not {copies}",
                               fix="rerun the stage; if Application Auto Scaling changed the count meanwhile, that is "
                                   "its scale-to-zero policies acting")
            time.sleep(self.poll_s)

    def wait_for_zero_instances(self, endpoint: str, *, progress: Progress, deadline_s: float | None = None) -> None:
        """Wait (deadline) until DescribeEndpoint reports CurrentInstanceCount 0 on every variant: the endpoint has given
        back its instances, as ManagedInstanceScaling with MinInstanceCount 0 does once no component has a copy
        (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). The next request then
        starts as users meet a cold start: an instance, then a copy. NotReady when the instances stay past the deadline
        (`backend.instance_release_wait_s` unless given)."""
        deadline_s = self.backend.instance_release_wait_s if deadline_s is None else deadline_s
        deadline, last = time.monotonic() + deadline_s, None
        while True:
            variants = self._sm("DescribeEndpoint", EndpointName=endpoint).get("ProductionVariants") or []
            instances = sum(int(v.get("CurrentInstanceCount") or 0) for v in variants)
            if instances != last:
                progress(f"endpoint {endpoint}: {instances} instance{'' if instances == 1 else 's'}"
                         + ("" if instances == 0 else "; waiting for SageMaker to give them back (no component has a copy)"))
                last = instances
            if instances == 0:
                return
            if time.monotonic() + self.poll_s > deadline:
                raise NotReady(f"endpoint {endpoint} still has {instances} instance(s) {deadline_s:g}s after its last copy "
                               "stopped, so a cold start from zero instances cannot be timed",
                               fix="check the endpoint's variant has ManagedInstanceScaling MinInstanceCount 0 "
                                   "(placement.min_instance_count: 0) and that no other component on it has a copy; rerun")
            time.sleep(self.poll_s)

    def _holds(self, live: dict, copies: int) -> bool:
        """Whether a component's description is InService with `copies` copies, desired and current."""
        runtime = live.get("RuntimeConfig") or {}
        return (live.get("InferenceComponentStatus") == "InService" and runtime.get("DesiredCopyCount") == copies
                and self._copies(live) == copies)

    def _remove_scale_to_zero(self, component: str, progress: Progress) -> None:
        """Before a component goes: its scale-out alarm (the one named for it whose metric is the component's), then every
        scaling policy on its copy count and the scalable target, so nothing scales or bills for a component that is
        gone (SageMaker would deregister the target with the endpoint, but not our alarm:
        https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-delete-with-scaling.html)."""
        alarm = scale_to_zero_names(component)["alarm"]
        for found in self.aws.call("cloudwatch", "DescribeAlarms", AlarmNames=[alarm]).get("MetricAlarms", []):
            if found.get("Dimensions") == component_dimensions(component):
                self.aws.call("cloudwatch", "DeleteAlarms", AlarmNames=[found["AlarmName"]])
                progress(f"removed alarm {found['AlarmName']} of inference component {component}")
        resource = scaling_resource_id(component)
        for target in self._pages("application-autoscaling", "DescribeScalableTargets", "ScalableTargets",
                                  ServiceNamespace=SCALING_NAMESPACE, ResourceIds=[resource]):
            where = {"ServiceNamespace": SCALING_NAMESPACE, "ResourceId": resource, "ScalableDimension": target["ScalableDimension"]}
            for policy in self._pages("application-autoscaling", "DescribeScalingPolicies", "ScalingPolicies", **where):
                self.aws.call("application-autoscaling", "DeleteScalingPolicy", PolicyName=policy["PolicyName"], **where)
                progress(f"removed scaling policy {policy['PolicyName']} of inference component {component}")
            self.aws.call("application-autoscaling", "DeregisterScalableTarget", **where)
            progress(f"removed the scalable target of inference component {component}")

    # -- describe ----------------------------------------------------------------------------
    def describe(self, endpoint: str, component: str) -> LiveComponent | None:
        """What serves, read from the endpoint, its component or variant, the config and the model (with its tags)."""
        try:
            live_endpoint = self._sm("DescribeEndpoint", EndpointName=endpoint)
        except NotFound:
            return None
        component_live = self.inference_component(endpoint, component)
        config = self._config_of(live_endpoint)
        if component_live is not None:
            spec = component_live.get("Specification", {})
            model_name, status = spec.get("ModelName"), component_live.get("InferenceComponentStatus", "Unknown")
            copies = component_live.get("RuntimeConfig", {}).get("CurrentCopyCount", 0)
            resolved = spec.get("Container", {}).get("DeployedImage", {}).get("ResolvedImage")
            failure = component_live.get("FailureReason")
        else:
            variant = next((v for v in live_endpoint.get("ProductionVariants") or [] if v["VariantName"] == component), None)
            requested = next((v for v in (config or {}).get("ProductionVariants", []) if v["VariantName"] == component), None)
            if variant is None and requested is None:
                return None
            model_name, status = (requested or {}).get("ModelName"), live_endpoint["EndpointStatus"]
            copies = (variant or {}).get("CurrentInstanceCount", 0)
            if "ServerlessConfig" in (requested or {}):  # no instances: compute per request, so it serves as one model
                copies = int(status == "InService")
            resolved = ((variant or {}).get("DeployedImages") or [{}])[0].get("ResolvedImage")
            failure = live_endpoint.get("FailureReason")
        model = self._model(model_name)
        container = (model or {}).get("PrimaryContainer", {})
        image = resolved or container.get("Image")
        digest = image.rpartition("@")[2] if image and "@sha256:" in image else None
        artifact_uri = container.get("ModelDataUrl")
        release = (model or {}).get("tags", {}).get(RELEASE_TAG)
        sha = artifact_sha256(artifact_uri or "")
        ref = ModelRef(release_id=release, artifact_sha256=sha, image_digest=digest) if release and sha and digest else None
        placement = obtained_placement(live_endpoint, config or {})
        return LiveComponent(endpoint=endpoint, component=component, status=status, image_digest=digest, artifact_uri=artifact_uri,
                             artifact_sha256=sha, copies=copies,
                             environment={k: v for k, v in container.get("Environment", {}).items() if k != SERVING_ID_ENV},
                             placement=placement, model_ref=ref, failure_reason=failure)

    def inference_component(self, endpoint: str, component: str) -> dict | None:
        """The component's description when it runs on `endpoint`; None for a single-model endpoint's variant."""
        try:
            live = self._sm("DescribeInferenceComponent", InferenceComponentName=component)
        except NotFound:
            return None
        return live if live.get("EndpointName") == endpoint else None

    def _config_of(self, live_endpoint: dict) -> dict | None:
        try:
            return self._sm("DescribeEndpointConfig", EndpointConfigName=live_endpoint["EndpointConfigName"])
        except (NotFound, KeyError):
            return None

    def _model(self, name: str | None) -> dict | None:
        if not name:
            return None
        try:
            model = self._sm("DescribeModel", ModelName=name)
        except NotFound:
            return None
        found = self._sm("ListTags", ResourceArn=model["ModelArn"]).get("Tags", [])
        return {**model, "tags": {t["Key"]: t["Value"] for t in found}}

    # -- invoke ------------------------------------------------------------------------------
    def invoker(self, endpoint: str, component: str, *, timeout_s: float):
        """NotFound when the endpoint does not exist; the component is named unless it is the variant of a
        single-model endpoint (then SageMaker refuses the header), so an unknown component is SageMaker's 400."""
        from tasks.backends.aws.invoke import RuntimeInvoker

        try:
            live = self._sm("DescribeEndpoint", EndpointName=endpoint)
        except NotFound as exc:
            raise NotFound(f"endpoint {endpoint} does not exist in {self.backend.region}",
                           fix="deploy it first (the deploy_candidate or promote stage), or check the name") from exc
        variants = {v["VariantName"] for v in live.get("ProductionVariants") or []}
        single_model = component in variants and self.inference_component(endpoint, component) is None
        return RuntimeInvoker(self.aws, endpoint, None if single_model else component, timeout_s=timeout_s)

    # -- delete ------------------------------------------------------------------------------
    def _describe_endpoint(self, endpoint: str) -> dict | None:
        try:
            return self._sm("DescribeEndpoint", EndpointName=endpoint)
        except NotFound:
            return None

    def _delete_endpoint_only(self, endpoint: str, progress: Progress) -> bool:
        """DeleteEndpoint and wait until it is gone; False when there was none."""
        try:
            self._sm("DeleteEndpoint", EndpointName=endpoint)
        except NotFound:
            return False
        progress(f"deleting endpoint {endpoint}")
        state, answer = wait_for(self.aws, "EndpointDeleted", {"EndpointName": endpoint}, deadline_s=DELETE_WAIT_S,
                                 poll_s=self.poll_s, progress=progress, what=f"endpoint {endpoint}")
        if state == "failure":  # Failed during its deletion: botocore's EndpointDeleted waiter fails on it too
            raise DeployFailed(f"endpoint {endpoint} is Failed while being deleted: {failure_reason(answer)}",
                               fix="rerun the teardown (DeleteEndpoint is what a Failed endpoint accepts); if it fails "
                                   "again, read the FailureReason and the endpoint's CloudWatch logs")
        return True

    def delete_endpoint(self, endpoint: str, *, progress: Progress) -> bool:
        """Components (each with its scale-to-zero alarm, policies and target first; waited), the endpoint (waited), then
        its configs and models, found by name and tag."""
        existed = False
        for component in self._components_of(endpoint):
            existed = True
            self._delete_component(component, progress)
        if self._describe_endpoint(endpoint) is not None:
            existed = self._delete_endpoint_only(endpoint, progress) or existed
        for kind in ("EndpointConfig", "Model"):
            for name in self._named_for(kind, endpoint):
                existed = True
                self._delete_named(kind, name, progress)
        return existed

    def _components_of(self, endpoint: str) -> list[str]:
        found = self._list("ListInferenceComponents", "InferenceComponents", EndpointNameEquals=endpoint)
        return [c["InferenceComponentName"] for c in found]

    def delete_component(self, endpoint: str, component: str, *, progress: Progress) -> bool:
        """Take a component out of service (a first release that failed its bake): its scaling, then the component,
        waited; the endpoint and its other components stay. False when it is not on `endpoint`."""
        if self.inference_component(endpoint, component) is None:
            return False
        return self._delete_component(component, progress)

    def _delete_component(self, component: str, progress: Progress) -> bool:
        """Its scale-to-zero alarm, policies and target first (`_remove_scale_to_zero`), then the component (waited);
        False when it was already gone."""
        self._remove_scale_to_zero(component, progress)
        try:
            self._sm("DeleteInferenceComponent", InferenceComponentName=component)
        except NotFound:
            return False
        progress(f"deleting inference component {component}")
        wait_for(self.aws, "InferenceComponentDeleted", {"InferenceComponentName": component}, deadline_s=DELETE_WAIT_S,
                 poll_s=self.poll_s, progress=progress, what=f"inference component {component}")
        return True

    def _delete_named(self, kind: str, name: str, progress: Progress) -> bool:
        """Delete a model or endpoint config; False when it was already gone."""
        try:
            self._sm(f"Delete{kind}", **{f"{kind}Name": name})
        except NotFound:
            return False
        progress(f"deleted {kind} {name}")
        return True

    def _named_for(self, kind: str, endpoint: str) -> list[str]:
        """Configs and models shiplift made for `endpoint`: named `<endpoint[:52]>-<hash>` and tagged with it."""
        items = self._list(f"List{kind}s", f"{kind}s", NameContains=name_base(endpoint))
        names = []
        for item in items:
            name, arn = item[f"{kind}Name"], item[f"{kind}Arn"]
            if re.fullmatch(re.escape(name_base(endpoint)) + r"-[0-9a-f]{10}", name) and \
                    self._tags(arn).get(ENDPOINT_TAG) == endpoint:
                names.append(name)
        return names

    def _list(self, operation: str, key: str, **params) -> list[dict]:
        """Every item of a paged SageMaker list call."""
        return self._pages("sagemaker", operation, key, **params)

    def _pages(self, service: str, operation: str, key: str, **params) -> list[dict]:
        """Every item of a call paged with NextToken (SageMaker, Application Auto Scaling, CloudWatch)."""
        items, token = [], None
        while True:
            page = self.aws.call(service, operation, **params, **({"NextToken": token} if token else {}))
            items.extend(page.get(key, []))
            token = page.get("NextToken")
            if not token:
                return items

    def _tags(self, arn: str) -> dict[str, str]:
        return {t["Key"]: t["Value"] for t in self._sm("ListTags", ResourceArn=arn).get("Tags", [])}

    # -- cleanup ---------------------------------------------------------------------------
    def managed_resources(self, prefix: str) -> list[ManagedResource]:
        """Everything named with `prefix` and carrying shiplift's tag, in the order it must be deleted: scaling
        policies, scalable targets, alarms, inference components, endpoints, endpoint configs, models."""
        found = self._scaling(prefix) + self._alarms(prefix)
        kinds = (("inference-component", "ListInferenceComponents", "InferenceComponents", "InferenceComponent"),
                 ("endpoint", "ListEndpoints", "Endpoints", "Endpoint"),
                 ("endpoint-config", "ListEndpointConfigs", "EndpointConfigs", "EndpointConfig"),
                 ("model", "ListModels", "Models", "Model"))
        for kind, operation, key, field in kinds:
            for item in self._list(operation, key, NameContains=prefix):
                name = item[f"{field}Name"]
                resource_tags = self._tags(item[f"{field}Arn"]) if name.startswith(prefix) else {}
                if resource_tags.get(MANAGED) == "true":
                    found.append(ManagedResource(kind=kind, name=name, tags=resource_tags))
        return found

    def _scaling(self, prefix: str) -> list[ManagedResource]:
        """Scaling policies, then scalable targets, on endpoints and components named with the prefix and tagged by
        shiplift (a target belongs to the resource it scales, so the resource's tag decides)."""
        targets = self._pages("application-autoscaling", "DescribeScalableTargets", "ScalableTargets", ServiceNamespace="sagemaker")
        policies, found = [], []
        for target in targets:
            resource_id = target["ResourceId"]  # endpoint/<name>/variant/<v> or inference-component/<name>
            kind, _, rest = resource_id.partition("/")
            name = rest.split("/")[0]
            if not name.startswith(prefix) or kind not in ("endpoint", "inference-component"):
                continue
            try:
                arn = self._sm("DescribeEndpoint", EndpointName=name)["EndpointArn"] if kind == "endpoint" else \
                    self._sm("DescribeInferenceComponent", InferenceComponentName=name)["InferenceComponentArn"]
            except NotFound:
                continue  # a target on a resource that is gone; not provably shiplift's
            if self._tags(arn).get(MANAGED) != "true":
                continue
            for policy in self._pages("application-autoscaling", "DescribeScalingPolicies", "ScalingPolicies",
                                      ServiceNamespace="sagemaker", ResourceId=resource_id):
                policies.append(ManagedResource(kind="scaling-policy", name=policy["PolicyName"],
                                                tags={"resource_id": resource_id, "dimension": policy["ScalableDimension"]}))
            found.append(ManagedResource(kind="scalable-target", name=resource_id, tags={"dimension": target["ScalableDimension"]}))
        return policies + found

    def _alarms(self, prefix: str) -> list[ManagedResource]:
        """CloudWatch alarms named with the prefix and tagged by shiplift (the canary's bake alarms, scale to zero's
        scale-out alarms)."""
        alarms = self._pages("cloudwatch", "DescribeAlarms", "MetricAlarms", AlarmNamePrefix=prefix)
        found = []
        for alarm in alarms:
            alarm_tags = {t["Key"]: t["Value"] for t in
                          self.aws.call("cloudwatch", "ListTagsForResource", ResourceARN=alarm["AlarmArn"]).get("Tags", [])}
            if alarm_tags.get(MANAGED) == "true":
                found.append(ManagedResource(kind="alarm", name=alarm["AlarmName"], tags=alarm_tags))
        return found

    def delete_resource(self, resource: ManagedResource, *, progress: Progress) -> None:
        """Delete one resource `managed_resources` listed (endpoints with everything on them, waited)."""
        if resource.kind == "scaling-policy":
            self.aws.call("application-autoscaling", "DeleteScalingPolicy", PolicyName=resource.name, ServiceNamespace="sagemaker",
                          ResourceId=resource.tags["resource_id"], ScalableDimension=resource.tags["dimension"])
        elif resource.kind == "scalable-target":
            self.aws.call("application-autoscaling", "DeregisterScalableTarget", ServiceNamespace="sagemaker",
                          ResourceId=resource.name, ScalableDimension=resource.tags["dimension"])
        elif resource.kind == "alarm":
            self.aws.call("cloudwatch", "DeleteAlarms", AlarmNames=[resource.name])
        elif resource.kind == "inference-component":
            self._delete_component(resource.name, progress)
        elif resource.kind == "endpoint":
            self.delete_endpoint(resource.name, progress=progress)
        else:  # a config or model (one its endpoint's deletion took along is said to be gone, not deleted twice)
            if not self._delete_named({"endpoint-config": "EndpointConfig", "model": "Model"}[resource.kind], resource.name,
                                      progress):
                progress(f"{resource.kind} {resource.name} was already gone")
            return
        progress(f"deleted {resource.kind} {resource.name}")
