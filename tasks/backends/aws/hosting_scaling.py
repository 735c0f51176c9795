"""Copies and instances of SageMaker inference components: scale to zero through Application Auto Scaling (its target,
policies and scale-out alarm, put and removed), setting a component's copy count, and waiting for an endpoint to give
back its instances (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html)."""

from __future__ import annotations

import time

from shiplift.tasks.backends.aws.hosting_calls import (
    COMPONENT_WAIT_S,
    UNSETTLED,
    SageMakerCalls,
    current_copies,
    failure_reason,
)
from shiplift.tasks.backends.aws.hosting_requests import (
    NO_CAPACITY_METRIC,
    NO_CAPACITY_PERIOD_S,
    SCALE_OUT_COPIES,
    component_dimensions,
    is_serverless,
    scale_to_zero_names,
    scale_to_zero_requests,
    scaling_resource_id,
)
from shiplift.tasks.backends.aws.iam import COPY_DIMENSION, SCALING_NAMESPACE
from shiplift.tasks.backends.aws.service_model import request_applied
from shiplift.tasks.backends.interfaces import SCALE_WAIT_S, Progress, ScaleToZeroPlan
from shiplift.tasks.errors import BadInput, CapacityError, DeployFailed, NotFound, NotReady


def holds(live: dict, copies: int) -> bool:
    """Whether a component's description is InService with `copies` copies, desired and current."""
    runtime = live.get("RuntimeConfig") or {}
    return (live.get("InferenceComponentStatus") == "InService" and runtime.get("DesiredCopyCount") == copies
            and current_copies(live) == copies)


class Scaling:
    """Scale to zero, copy counts and the wait for zero instances, over the shared SageMaker calls."""

    def __init__(self, calls: SageMakerCalls):
        self.calls = calls

    def enable_scale_to_zero(self, endpoint: str, component: str, plan: ScaleToZeroPlan, *, progress: Progress) -> None:
        """Register the component's copy count with Application Auto Scaling from 0 to `plan.max_copies`, put the
        target-tracking policy that scales it in and the step policy that scales it out from zero, and the alarm on
        NoCapacityInvocationFailures whose action is the step policy
        (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). Each is read first
        and sent only when missing or different, so a rerun sends nothing; the names are fixed per component, so a
        changed plan replaces its policies and alarm in place. The endpoint gives back its instances only when its
        variant's ManagedInstanceScaling.MinInstanceCount is 0 (placement.min_instance_count)."""
        calls = self.calls
        if calls.inference_component(endpoint, component) is None:
            raise NotFound(f"inference component {component} is not on endpoint {endpoint}",
                           fix="deploy it first; only an endpoint that hosts inference components scales to zero (a "
                               "candidate is one when placement.min_instance_count is 0)")
        wanted = scale_to_zero_requests(endpoint, component, plan)
        where = {key: wanted["target"][key] for key in ("ServiceNamespace", "ResourceId", "ScalableDimension")}
        targets = calls.pages("application-autoscaling", "DescribeScalableTargets", "ScalableTargets",
                              ServiceNamespace=SCALING_NAMESPACE, ResourceIds=[where["ResourceId"]],
                              ScalableDimension=COPY_DIMENSION)
        if not any(t.get("MinCapacity") == 0 and t.get("MaxCapacity") == plan.max_copies for t in targets):
            progress(f"inference component {component}: RegisterScalableTarget, 0..{plan.max_copies} copies")
            calls.call("application-autoscaling", "RegisterScalableTarget", **wanted["target"])
        names = [wanted["tracking"]["PolicyName"], wanted["step"]["PolicyName"]]
        policies = calls.pages("application-autoscaling", "DescribeScalingPolicies", "ScalingPolicies",
                               PolicyNames=names, **where)
        live = {p["PolicyName"]: p for p in policies}
        arns = {}
        for key in ("tracking", "step"):
            request = wanted[key]
            found = live.get(request["PolicyName"])
            compared = {k: v for k, v in request.items() if k == "PolicyType" or k.endswith("PolicyConfiguration")}
            if found is not None and request_applied(found, compared):
                arns[key] = found["PolicyARN"]
                continue
            progress(f"inference component {component}: PutScalingPolicy {request['PolicyName']} "
                     f"({request['PolicyType']})")
            arns[key] = calls.call("application-autoscaling", "PutScalingPolicy", **request)["PolicyARN"]
        alarm = {**wanted["alarm"], "AlarmActions": [arns["step"]]}
        found = calls.call("cloudwatch", "DescribeAlarms", AlarmNames=[alarm["AlarmName"]]).get("MetricAlarms", [])
        if not (found and request_applied(found[0], {k: v for k, v in alarm.items() if k != "Tags"})):
            progress(f"inference component {component}: PutMetricAlarm {alarm['AlarmName']} ({NO_CAPACITY_METRIC} >= "
                     f"1 in {NO_CAPACITY_PERIOD_S}s scales out by {SCALE_OUT_COPIES})")
            calls.call("cloudwatch", "PutMetricAlarm", **alarm)

    def set_copies(self, endpoint: str, component: str, copies: int, *, progress: Progress) -> None:
        """UpdateInferenceComponentRuntimeConfig to `copies` (0 stops every copy: the model allows CopyCount 0, and
        AWS's scale-to-zero post schedules exactly that,
        https://aws.amazon.com/blogs/machine-learning/unlock-cost-savings-with-the-new-scale-down-to-zero-feature-in-amazon-sagemaker-inference/),
        then wait (deadline SCALE_WAIT_S) until the component is InService with that many copies, desired and current.
        A component Creating or Updating is waited for first (SageMaker refuses to update it); nothing is sent when it
        already holds `copies`."""
        calls = self.calls
        if isinstance(copies, bool) or not isinstance(copies, int) or copies < 0:
            raise BadInput(f"copies={copies!r} is not a whole number >= 0",
                           fix="pass the copy count to set (0 stops every copy)")
        live = calls.inference_component(endpoint, component)
        if live is None and is_serverless(calls.config_of(calls.describe_endpoint(endpoint) or {}) or {}):
            raise BadInput(f"{endpoint} is serverless: SageMaker starts and stops its compute itself and has no "
                           "call that sets it",
                           fix="time a serverless endpoint's cold start on its first request after creation")
        if live is None:
            raise NotFound(f"inference component {component} is not on endpoint {endpoint}", fix="deploy it first")
        if live.get("InferenceComponentStatus") in UNSETTLED:
            progress(f"inference component {component} is {live['InferenceComponentStatus']}; waiting for it "
                     "to end first")
            live = calls.settled(component, progress, deadline_s=COMPONENT_WAIT_S)
            if live is None:
                raise NotFound(f"inference component {component} was deleted meanwhile", fix="deploy it again")
        if not holds(live, copies):
            progress(f"inference component {component}: UpdateInferenceComponentRuntimeConfig to {copies} "
                     f"cop{'y' if copies == 1 else 'ies'} (from {current_copies(live)})")
            calls.sm("UpdateInferenceComponentRuntimeConfig", InferenceComponentName=component,
                     DesiredRuntimeConfig={"CopyCount": copies})
        self._wait_for_copies(component, copies, progress)

    def _wait_for_copies(self, component: str, copies: int, progress: Progress) -> None:
        """Wait (deadline SCALE_WAIT_S) until the component holds `copies`; a failure, or a FailureReason while it
        does not, is CapacityError or DeployFailed, and the deadline NotReady."""
        calls = self.calls
        deadline = time.monotonic() + SCALE_WAIT_S
        while True:
            state, answer = calls.wait(component, deadline_s=max(calls.poll_s, deadline - time.monotonic()),
                                       progress=progress)
            answer = answer or {}
            reason = answer.get("FailureReason")
            if state == "failure" or (reason and not holds(answer, copies)):
                error = CapacityError if "capacity" in failure_reason(answer).lower() else DeployFailed
                raise error(f"inference component {component} did not reach {copies} copies: {failure_reason(answer)} "
                            f"(it has {current_copies(answer)})",
                            fix="check the copies fit the endpoint's instances (placement.max_instance_count) and "
                                "the logs")
            if holds(answer, copies):
                return
            if time.monotonic() + calls.poll_s > deadline:
                runtime = answer.get("RuntimeConfig") or {}
                raise NotReady(f"inference component {component} has {current_copies(answer)} copies (desired "
                               f"{runtime.get('DesiredCopyCount')}) after {SCALE_WAIT_S:g}s, not {copies}",
                               fix="rerun the stage; if Application Auto Scaling changed the count meanwhile, that is "
                                   "its scale-to-zero policies acting")
            time.sleep(calls.poll_s)

    def wait_for_zero_instances(self, endpoint: str, *, progress: Progress, deadline_s: float | None = None) -> None:
        """Wait (deadline) until DescribeEndpoint reports CurrentInstanceCount 0 on every variant: the endpoint has
        given back its instances, as ManagedInstanceScaling with MinInstanceCount 0 does once no component has a copy
        (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). The next request
        then starts as users meet a cold start: an instance, then a copy. NotReady when the instances stay past the
        deadline (`backend.instance_release_wait_s` unless given)."""
        calls = self.calls
        deadline_s = calls.backend.instance_release_wait_s if deadline_s is None else deadline_s
        deadline, last = time.monotonic() + deadline_s, None
        while True:
            variants = calls.sm("DescribeEndpoint", EndpointName=endpoint).get("ProductionVariants") or []
            instances = sum(int(v.get("CurrentInstanceCount") or 0) for v in variants)
            if instances != last:
                progress(f"endpoint {endpoint}: {instances} instance{'' if instances == 1 else 's'}"
                         + ("" if instances == 0
                            else "; waiting for SageMaker to give them back (no component has a copy)"))
                last = instances
            if instances == 0:
                return
            if time.monotonic() + calls.poll_s > deadline:
                raise NotReady(f"endpoint {endpoint} still has {instances} instance(s) {deadline_s:g}s after its last "
                               "copy stopped, so a cold start from zero instances cannot be timed",
                               fix="check the endpoint's variant has ManagedInstanceScaling MinInstanceCount 0 "
                                   "(placement.min_instance_count: 0) and that no other component on it has a "
                                   "copy; rerun")
            time.sleep(calls.poll_s)

    def remove_scale_to_zero(self, component: str, progress: Progress) -> None:
        """Before a component goes: its scale-out alarm (the one named for it whose metric is the component's), then
        every scaling policy on its copy count and the scalable target, so nothing scales or bills for a component that
        is gone (SageMaker would deregister the target with the endpoint, but not our alarm:
        https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-delete-with-scaling.html)."""
        calls = self.calls
        alarm = scale_to_zero_names(component)["alarm"]
        for found in calls.call("cloudwatch", "DescribeAlarms", AlarmNames=[alarm]).get("MetricAlarms", []):
            if found.get("Dimensions") == component_dimensions(component):
                calls.call("cloudwatch", "DeleteAlarms", AlarmNames=[found["AlarmName"]])
                progress(f"removed alarm {found['AlarmName']} of inference component {component}")
        resource = scaling_resource_id(component)
        for target in calls.pages("application-autoscaling", "DescribeScalableTargets", "ScalableTargets",
                                  ServiceNamespace=SCALING_NAMESPACE, ResourceIds=[resource]):
            where = {"ServiceNamespace": SCALING_NAMESPACE, "ResourceId": resource,
                     "ScalableDimension": target["ScalableDimension"]}
            for policy in calls.pages("application-autoscaling", "DescribeScalingPolicies", "ScalingPolicies", **where):
                calls.call("application-autoscaling", "DeleteScalingPolicy", PolicyName=policy["PolicyName"], **where)
                progress(f"removed scaling policy {policy['PolicyName']} of inference component {component}")
            calls.call("application-autoscaling", "DeregisterScalableTarget", **where)
            progress(f"removed the scalable target of inference component {component}")
