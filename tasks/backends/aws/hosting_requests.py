"""The requests of SageMaker hosting, built purely from specs, placements and plans (the dry run prints the same ones),
and the names, tags and metric dimensions they carry: models, endpoint configs and their variant, inference components,
the rolling update with its rollback alarms and gate datum, the update that puts a previous spec back, and scale to
zero's target, policies and alarm."""

from __future__ import annotations

from shiplift.images.common.sagemaker_http import SERVING_ID_ENV
from shiplift.tasks.backends.aws.iam import COPY_DIMENSION, GATE_NAMESPACE, MANAGED, SCALING_NAMESPACE
from shiplift.tasks.backends.interfaces import ComponentSpec, RolloutPlan, ScaleToZeroPlan
from shiplift.tasks.hashing import sha256_json

VARIANT = "AllTraffic"  # the capacity variant of inference-component endpoints
ENDPOINT_TAG, RELEASE_TAG = "shiplift:endpoint", "shiplift:release"  # and iam's MANAGED
STARTUP_TIMEOUT_S = 900  # container start and model download of multi-GB models (DESIGN §7)
ROUTING = {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
SAGEMAKER_PERIOD_S = 60  # SageMaker publishes invocation metrics per minute
GATE_METRIC = "OnlineGateFailed"
GATE_PERIOD_S = 10  # the gate's verdict is a high-resolution metric, so its alarm can judge every 10 s
# Scale to zero (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html): the metrics
# (per copy; when a request finds no copy) and the step policy's values; what Application Auto Scaling scales is iam's
# (COPY_DIMENSION, SCALING_NAMESPACE), whose grant is conditioned on it.
# The alarm judges 30 s periods (Statistic Maximum, GreaterThanOrEqualToThreshold 1, TreatMissingData missing), exactly
# as AWS's scale-to-zero blog post's put_metric_alarm does
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
    return [{"Key": MANAGED, "Value": "true"},
            *({"Key": f"shiplift:{k}", "Value": v} for k, v in sorted(values.items()))]


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


def is_serverless(config: dict) -> bool:
    """Whether an endpoint config's variant is serverless."""
    return "ServerlessConfig" in (config.get("ProductionVariants") or [{}])[0]


def single_model(placement, role: str) -> bool:
    """Candidates on instance pools or one instance type are single-model endpoints; MIG and production use components,
    and so does a candidate whose placement lets the endpoint go to zero instances (`min_instance_count: 0`): only an
    endpoint that hosts inference components can scale to and from zero
    (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). A serverless
    endpoint is always single-model: it cannot host inference components."""
    return placement.kind == "serverless" or (role == "candidate" and placement.kind != "mig_partition"
                                              and getattr(placement, "min_instance_count", None) != 0)


def model_request(component: str, spec: ComponentSpec, endpoint: str, placement=None, *, role_arn: str) -> dict:
    """CreateModel for a spec, run as `role_arn`: named by component, container and release; the container's environment
    carries the spec's serving id (SHIPLIFT_SERVING_ID: our servers echo it with each answer, so the online gate tells
    the candidate's answers from the champion's; `describe` leaves it out); network isolation on, except for a
    serverless placement, which does not support it
    (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html,
    "Feature exclusions")."""
    container = {"Image": spec.image_uri, "ModelDataUrl": spec.artifact_uri,
                 "Environment": {**spec.environment, SERVING_ID_ENV: spec.serving_id()}}
    isolated = placement is None or placement.kind != "serverless"
    name = content_name(component, {"container": container, "release": spec.model_ref.release_id,
                                    **({} if isolated else {"isolated": False})})
    return {"ModelName": name, "PrimaryContainer": container, "ExecutionRoleArn": role_arn,
            "EnableNetworkIsolation": isolated,
            "Tags": tags(endpoint=endpoint, release=spec.model_ref.release_id,
                         **{"artifact-sha256": spec.artifact_sha256})}


def variant(placement, *, model_name: str | None, variant_name: str, on_gpu: bool, role: str = "production") -> dict:
    """One production variant: with a model (a single-model candidate on one instance) or without (inference
    components: production gets `placement.instance_count` instances, a candidate the one instance its one copy
    needs, which ManagedInstanceScaling may give back and add to as production's may)."""
    if placement.kind == "serverless":
        serverless = {"MemorySizeInMB": placement.memory_size_mb, "MaxConcurrency": placement.max_concurrency}
        if placement.provisioned_concurrency:
            serverless["ProvisionedConcurrency"] = placement.provisioned_concurrency
        return {"VariantName": variant_name, "ModelName": model_name, "ServerlessConfig": serverless}
    count = getattr(placement, "instance_count", 1) if role == "production" and not model_name else 1
    built: dict = {"VariantName": variant_name, "RoutingConfig": dict(ROUTING)}
    if model_name:
        built.update(ModelName=model_name, ContainerStartupHealthCheckTimeoutInSeconds=STARTUP_TIMEOUT_S,
                     ModelDataDownloadTimeoutInSeconds=STARTUP_TIMEOUT_S)
    if placement.kind == "instance_pool":
        built.update(InitialInstanceCount=count,
                     InstancePools=[{"InstanceType": p.instance_type, "Priority": p.priority}
                                    for p in sorted(placement.pools, key=lambda p: p.priority)],
                     VariantInstanceProvisionTimeoutInSeconds=placement.provision_timeout_s)
    elif placement.kind == "mig_partition":
        layout = {"AcceleratorPartitionTypes": list(placement.profiles)}  # mixed, or one profile repeated
        built.update(InstanceType=placement.instance_type, InitialInstanceCount=1, AcceleratorPartitionLayouts=[layout])
    else:
        built.update(InstanceType=placement.instance_type, InitialInstanceCount=count)
    least = getattr(placement, "min_instance_count", None)
    # a MIG endpoint runs one instance (InitialInstanceCount 1): MinInstanceCount 0 lets it go, MaxInstanceCount 1
    # keeps it at one (inference-components-accelerator-partitioning-manage.html scales copies, never the layout)
    most = getattr(placement, "max_instance_count", None) or (
        1 if placement.kind == "mig_partition" and least == 0 else None)
    if most and not model_name:  # room for updates (tasks.backends.capacity); components only, as SageMaker allows
        # MinInstanceCount 0 lets SageMaker give back every instance while no component has a copy (scale to zero:
        # https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html)
        built["ManagedInstanceScaling"] = {"Status": "ENABLED", "MinInstanceCount": count if least is None else least,
                                           "MaxInstanceCount": most}
    if on_gpu and placement.inference_ami_version:
        built["InferenceAmiVersion"] = placement.inference_ami_version
    return built


def endpoint_config_request(endpoint: str, placement, *, model_name: str | None, variant_name: str, on_gpu: bool,
                            release_id: str, role_arn: str, role: str = "production") -> dict:
    """CreateEndpointConfig: one variant; inference-component endpoints carry the execution role `role_arn`."""
    request: dict = {"ProductionVariants": [variant(placement, model_name=model_name, variant_name=variant_name,
                                                    on_gpu=on_gpu, role=role)]}
    if model_name is None:
        request["ExecutionRoleArn"] = role_arn
    return {"EndpointConfigName": content_name(endpoint, request), **request,
            "Tags": tags(endpoint=endpoint, release=release_id)}


def component_request(component: str, endpoint: str, spec: ComponentSpec, model_name: str) -> dict:
    """CreateInferenceComponent: the model, its compute (MIG partition, GPUs or cores, memory) and copies."""
    requirements: dict = {"MinMemoryRequiredInMb": spec.compute.memory_mb}
    if spec.compute.accelerator_partition:
        requirements.update(AcceleratorPartitionType=spec.compute.accelerator_partition,
                            NumberOfAcceleratorDevicesRequired=1)
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


def alarm_requests(endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan) -> list[dict]:
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
                     "Expression": f"IF(invocations >= {rules.min_invocations}, "
                                   "MAX([errors5xx, modelerrors]) / invocations, 0)"}],
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


def rolling_update_request(component: str, endpoint: str, spec: ComponentSpec, model_name: str, plan: RolloutPlan,
                           alarms: list[str]) -> dict:
    """UpdateInferenceComponent to the candidate's model (its whole specification, compute included) in batches
    of copies, rolled back by the alarms, `rollback_batch_size(plan)` at a time."""
    policy: dict = {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": plan.batch_copies},
                    "WaitIntervalInSeconds": int(plan.wait_interval_s),
                    "MaximumExecutionTimeoutInSeconds": int(plan.max_execution_s),
                    "RollbackMaximumBatchSize": rollback_batch_size(plan)}
    return {"InferenceComponentName": component,
            "Specification": component_request(component, endpoint, spec, model_name)["Specification"],
            "RuntimeConfig": {"CopyCount": spec.copies},
            "DeploymentConfig": {"RollingUpdatePolicy": policy,
                                 "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": name} for name in alarms]}}}


# what a described InferenceComponentSpecification gives back to UpdateInferenceComponent as it is (the input and
# output shapes share these members; Container differs, and shiplift's components name a model, never a container)
RESTORED_SPEC = ("ModelName", "ComputeResourceRequirements", "StartupParameters")


def restore_request(component: str, previous: dict, plan: RolloutPlan) -> dict:
    """UpdateInferenceComponent back to what `previous` (the component described before a rollout's update) ran: its
    model, compute and startup parameters, and its copy count. SageMaker's automatic rollback acts only while the
    update runs ("If any of your alarms trip during the specified monitoring period, SageMaker AI initiates a complete
    rollback", https://docs.aws.amazon.com/sagemaker/latest/dg/deployment-guardrails-configuration.html), so once the
    update has ended the spec is put back by another update, as `shiplift rollback` does. It moves the release's
    rollback batch at a time where that is a MaximumBatchSize SageMaker takes (5-50 % of the copies,
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html), with no
    alarms and no bake; else every copy at once (no DeploymentConfig), the peak SageMaker's own rollback at 100 % holds
    (`tasks.backends.capacity.rollback_room` counts both)."""
    described = previous.get("Specification") or {}
    copies = int((previous.get("RuntimeConfig") or {}).get("DesiredCopyCount") or 0)
    request: dict = {"InferenceComponentName": component,
                     "Specification": {key: described[key] for key in RESTORED_SPEC if key in described},
                     "RuntimeConfig": {"CopyCount": copies}}
    batch = plan.rollback_batch_copies
    if batch is not None and copies * 0.05 <= batch <= copies * 0.5:
        request["DeploymentConfig"] = {"RollingUpdatePolicy": {
            "MaximumBatchSize": {"Type": "COPY_COUNT", "Value": batch}, "WaitIntervalInSeconds": 0,
            "MaximumExecutionTimeoutInSeconds": int(plan.max_execution_s)}}
    return request


def gate_datum(component: str, *, failed: bool) -> dict:
    """PutMetricData of the online gate's verdict (1: the candidate fails), at one-second resolution."""
    return {"Namespace": GATE_NAMESPACE, "MetricData": [{
        "MetricName": GATE_METRIC, "Dimensions": component_dimensions(component),
        "Value": 1.0 if failed else 0.0, "Unit": "Count", "StorageResolution": 1}]}


def scale_to_zero_requests(endpoint: str, component: str, plan: ScaleToZeroPlan) -> dict[str, dict]:
    """The requests of https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html for
    one component: `target` (RegisterScalableTarget, 0..max_copies copies, tagged as shiplift tags what it creates),
    `tracking` (PutScalingPolicy, target tracking on invocations per copy: it scales in, after `idle_s` of cooldown),
    `step` (PutScalingPolicy, step scaling: one more copy when its alarm fires) and `alarm` (PutMetricAlarm on the
    component's NoCapacityInvocationFailures, Maximum over 30 s >= 1, as AWS's post; its AlarmActions, the step policy's
    ARN, are added once Application Auto Scaling has named it)."""
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
