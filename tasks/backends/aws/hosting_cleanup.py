"""Deleting what shiplift hosts on SageMaker: a component (its scaling first), an endpoint with its components, configs
and models, and cleanup's list of everything under a prefix with shiplift's tag, deleted one resource at a time."""

from __future__ import annotations

import re

from shiplift.tasks.backends.aws.hosting_calls import DELETE_WAIT_S, SageMakerCalls, failure_reason
from shiplift.tasks.backends.aws.hosting_requests import ENDPOINT_TAG, name_base
from shiplift.tasks.backends.aws.hosting_scaling import Scaling
from shiplift.tasks.backends.aws.iam import MANAGED
from shiplift.tasks.backends.aws.waiters import wait_for
from shiplift.tasks.backends.interfaces import ManagedResource, Progress
from shiplift.tasks.errors import DeployFailed, NotFound


class Cleanup:
    """Deletes components, endpoints and shiplift's tagged resources; a component's scaling goes first (`scaling`)."""

    def __init__(self, calls: SageMakerCalls, scaling: Scaling):
        self.calls, self.scaling = calls, scaling

    def delete_endpoint_only(self, endpoint: str, progress: Progress) -> bool:
        """DeleteEndpoint and wait until it is gone; False when there was none."""
        calls = self.calls
        try:
            calls.sm("DeleteEndpoint", EndpointName=endpoint)
        except NotFound:
            return False
        progress(f"deleting endpoint {endpoint}")
        state, answer = wait_for(calls.aws, "EndpointDeleted", {"EndpointName": endpoint}, deadline_s=DELETE_WAIT_S,
                                 poll_s=calls.poll_s, progress=progress, what=f"endpoint {endpoint}")
        if state == "failure":  # Failed during its deletion: botocore's EndpointDeleted waiter fails on it too
            raise DeployFailed(f"endpoint {endpoint} is Failed while being deleted: {failure_reason(answer)}",
                               fix="rerun the teardown (DeleteEndpoint is what a Failed endpoint accepts); if it fails "
                                   "again, read the FailureReason and the endpoint's CloudWatch logs")
        return True

    def delete_endpoint(self, endpoint: str, *, progress: Progress) -> bool:
        """Components (each with its scale-to-zero alarm, policies and target first; waited), the endpoint (waited),
        then its configs and models, found by name and tag."""
        existed = False
        for component in self._components_of(endpoint):
            existed = True
            self.delete_inference_component(component, progress)
        if self.calls.describe_endpoint(endpoint) is not None:
            existed = self.delete_endpoint_only(endpoint, progress) or existed
        for kind in ("EndpointConfig", "Model"):
            for name in self._named_for(kind, endpoint):
                existed = True
                self._delete_named(kind, name, progress)
        return existed

    def _components_of(self, endpoint: str) -> list[str]:
        """The names of the inference components on `endpoint`."""
        found = self.calls.sm_list("ListInferenceComponents", "InferenceComponents", EndpointNameEquals=endpoint)
        return [c["InferenceComponentName"] for c in found]

    def delete_component(self, endpoint: str, component: str, *, progress: Progress) -> bool:
        """Take a component out of service (a first release that failed its bake): its scaling, then the component,
        waited; the endpoint and its other components stay. False when it is not on `endpoint`."""
        if self.calls.inference_component(endpoint, component) is None:
            return False
        return self.delete_inference_component(component, progress)

    def delete_inference_component(self, component: str, progress: Progress) -> bool:
        """Its scale-to-zero alarm, policies and target first (`Scaling.remove_scale_to_zero`), then the component
        (waited); False when it was already gone."""
        calls = self.calls
        self.scaling.remove_scale_to_zero(component, progress)
        try:
            calls.sm("DeleteInferenceComponent", InferenceComponentName=component)
        except NotFound:
            return False
        progress(f"deleting inference component {component}")
        wait_for(calls.aws, "InferenceComponentDeleted", {"InferenceComponentName": component},
                 deadline_s=DELETE_WAIT_S, poll_s=calls.poll_s, progress=progress,
                 what=f"inference component {component}")
        return True

    def _delete_named(self, kind: str, name: str, progress: Progress) -> bool:
        """Delete a model or endpoint config; False when it was already gone."""
        try:
            self.calls.sm(f"Delete{kind}", **{f"{kind}Name": name})
        except NotFound:
            return False
        progress(f"deleted {kind} {name}")
        return True

    def _named_for(self, kind: str, endpoint: str) -> list[str]:
        """Configs and models shiplift made for `endpoint`: named `<endpoint[:52]>-<hash>` and tagged with it."""
        items = self.calls.sm_list(f"List{kind}s", f"{kind}s", NameContains=name_base(endpoint))
        names = []
        for item in items:
            name, arn = item[f"{kind}Name"], item[f"{kind}Arn"]
            if re.fullmatch(re.escape(name_base(endpoint)) + r"-[0-9a-f]{10}", name) and \
                    self.calls.tags(arn).get(ENDPOINT_TAG) == endpoint:
                names.append(name)
        return names

    def managed_resources(self, prefix: str) -> list[ManagedResource]:
        """Everything named with `prefix` and carrying shiplift's tag, in the order it must be deleted: scaling
        policies, scalable targets, alarms, inference components, endpoints, endpoint configs, models."""
        found = self._scaling(prefix) + self._alarms(prefix)
        kinds = (("inference-component", "ListInferenceComponents", "InferenceComponents", "InferenceComponent"),
                 ("endpoint", "ListEndpoints", "Endpoints", "Endpoint"),
                 ("endpoint-config", "ListEndpointConfigs", "EndpointConfigs", "EndpointConfig"),
                 ("model", "ListModels", "Models", "Model"))
        for kind, operation, key, field in kinds:
            for item in self.calls.sm_list(operation, key, NameContains=prefix):
                name = item[f"{field}Name"]
                resource_tags = self.calls.tags(item[f"{field}Arn"]) if name.startswith(prefix) else {}
                if resource_tags.get(MANAGED) == "true":
                    found.append(ManagedResource(kind=kind, name=name, tags=resource_tags))
        return found

    def _scaling(self, prefix: str) -> list[ManagedResource]:
        """Scaling policies, then scalable targets, on endpoints and components named with the prefix and tagged by
        shiplift (a target belongs to the resource it scales, so the resource's tag decides)."""
        calls = self.calls
        targets = calls.pages("application-autoscaling", "DescribeScalableTargets", "ScalableTargets",
                              ServiceNamespace="sagemaker")
        policies, found = [], []
        for target in targets:
            resource_id = target["ResourceId"]  # endpoint/<name>/variant/<v> or inference-component/<name>
            kind, _, rest = resource_id.partition("/")
            name = rest.split("/")[0]
            if not name.startswith(prefix) or kind not in ("endpoint", "inference-component"):
                continue
            try:
                arn = calls.sm("DescribeEndpoint", EndpointName=name)["EndpointArn"] if kind == "endpoint" else \
                    calls.sm("DescribeInferenceComponent", InferenceComponentName=name)["InferenceComponentArn"]
            except NotFound:
                continue  # a target on a resource that is gone; not provably shiplift's
            if calls.tags(arn).get(MANAGED) != "true":
                continue
            for policy in calls.pages("application-autoscaling", "DescribeScalingPolicies", "ScalingPolicies",
                                      ServiceNamespace="sagemaker", ResourceId=resource_id):
                policies.append(ManagedResource(kind="scaling-policy", name=policy["PolicyName"],
                                                tags={"resource_id": resource_id,
                                                      "dimension": policy["ScalableDimension"]}))
            found.append(ManagedResource(kind="scalable-target", name=resource_id,
                                         tags={"dimension": target["ScalableDimension"]}))
        return policies + found

    def _alarms(self, prefix: str) -> list[ManagedResource]:
        """CloudWatch alarms named with the prefix and tagged by shiplift (the canary's bake alarms, scale to zero's
        scale-out alarms)."""
        alarms = self.calls.pages("cloudwatch", "DescribeAlarms", "MetricAlarms", AlarmNamePrefix=prefix)
        found = []
        for alarm in alarms:
            alarm_tags = {t["Key"]: t["Value"] for t in
                          self.calls.call("cloudwatch", "ListTagsForResource",
                                          ResourceARN=alarm["AlarmArn"]).get("Tags", [])}
            if alarm_tags.get(MANAGED) == "true":
                found.append(ManagedResource(kind="alarm", name=alarm["AlarmName"], tags=alarm_tags))
        return found

    def delete_resource(self, resource: ManagedResource, *, progress: Progress) -> None:
        """Delete one resource `managed_resources` listed (endpoints with everything on them, waited)."""
        calls = self.calls
        if resource.kind == "scaling-policy":
            calls.call("application-autoscaling", "DeleteScalingPolicy", PolicyName=resource.name,
                       ServiceNamespace="sagemaker", ResourceId=resource.tags["resource_id"],
                       ScalableDimension=resource.tags["dimension"])
        elif resource.kind == "scalable-target":
            calls.call("application-autoscaling", "DeregisterScalableTarget", ServiceNamespace="sagemaker",
                       ResourceId=resource.name, ScalableDimension=resource.tags["dimension"])
        elif resource.kind == "alarm":
            calls.call("cloudwatch", "DeleteAlarms", AlarmNames=[resource.name])
        elif resource.kind == "inference-component":
            self.delete_inference_component(resource.name, progress)
        elif resource.kind == "endpoint":
            self.delete_endpoint(resource.name, progress=progress)
        else:  # a config or model (one its endpoint's deletion took along is said to be gone, not deleted twice)
            if not self._delete_named({"endpoint-config": "EndpointConfig", "model": "Model"}[resource.kind],
                                      resource.name, progress):
                progress(f"{resource.kind} {resource.name} was already gone")
            return
        progress(f"deleted {resource.kind} {resource.name}")
