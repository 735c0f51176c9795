"""What serves on a SageMaker endpoint, read back: the placement it obtained, the live component (model, image,
artifact, copies, failure) and the runtime invoker that reaches it."""

from __future__ import annotations

from shiplift.images.common.sagemaker_http import SERVING_ID_ENV
from shiplift.tasks.backends.aws.artifact_store import artifact_sha256
from shiplift.tasks.backends.aws.hosting_calls import SageMakerCalls
from shiplift.tasks.backends.aws.hosting_requests import RELEASE_TAG, is_serverless
from shiplift.tasks.backends.aws.invoke import RuntimeInvoker
from shiplift.tasks.backends.interfaces import LiveComponent, ModelRef, PlacementObtained
from shiplift.tasks.backends.placement import gpus_per_instance
from shiplift.tasks.errors import NotFound


def obtained_placement(endpoint: dict, config: dict, own_partition: str | None = None) -> PlacementObtained:
    """What the endpoint got, read from its description and its config: the pool entry with instances,
    the instance type, the MIG layout (the partitions of `own_partition`, the component's type, in a mixed one), or
    the serverless memory and concurrency."""
    variant = (endpoint.get("ProductionVariants") or [{}])[0]
    requested = (config.get("ProductionVariants") or [{}])[0]
    if is_serverless(config):
        asked = requested["ServerlessConfig"]
        return PlacementObtained(kind="serverless",
                                 requested=f"serverless {asked.get('MemorySizeInMB')} MB, max concurrency "
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
        shown = f"{len(layout)} x {layout[0]}" if len(set(layout)) == 1 else " + ".join(layout)  # mixed: each
        return PlacementObtained(kind="mig_partition", requested=f"{shown} per GPU",
                                 instance_type=requested.get("InstanceType"), instance_count=instances,
                                 partition_type=own_partition or layout[0],
                                 partitions=layout.count(own_partition or layout[0]) * (gpus or 1) * instances,
                                 ami_version=ami)
    return PlacementObtained(kind="instance_type", requested=requested.get("InstanceType", "unknown"),
                             instance_type=requested.get("InstanceType"),
                             instance_count=variant.get("CurrentInstanceCount", 0),
                             ami_version=ami)


def describe_component(calls: SageMakerCalls, endpoint: str, component: str) -> LiveComponent | None:
    """What serves, read from the endpoint, its component or variant, the config and the model (with its tags)."""
    try:
        live_endpoint = calls.sm("DescribeEndpoint", EndpointName=endpoint)
    except NotFound:
        return None
    component_live = calls.inference_component(endpoint, component)
    config = calls.config_of(live_endpoint)
    if component_live is not None:
        spec = component_live.get("Specification", {})
        model_name, status = spec.get("ModelName"), component_live.get("InferenceComponentStatus", "Unknown")
        copies = component_live.get("RuntimeConfig", {}).get("CurrentCopyCount", 0)
        resolved = spec.get("Container", {}).get("DeployedImage", {}).get("ResolvedImage")
        failure = component_live.get("FailureReason")
    else:
        variant = next(
            (v for v in live_endpoint.get("ProductionVariants") or [] if v["VariantName"] == component), None)
        requested = next(
            (v for v in (config or {}).get("ProductionVariants", []) if v["VariantName"] == component), None)
        if variant is None and requested is None:
            return None
        model_name, status = (requested or {}).get("ModelName"), live_endpoint["EndpointStatus"]
        copies = (variant or {}).get("CurrentInstanceCount", 0)
        if "ServerlessConfig" in (requested or {}):  # no instances: compute per request, so it serves as one model
            copies = int(status == "InService")
        resolved = ((variant or {}).get("DeployedImages") or [{}])[0].get("ResolvedImage")
        failure = live_endpoint.get("FailureReason")
    model = calls.model(model_name)
    container = (model or {}).get("PrimaryContainer", {})
    image = resolved or container.get("Image")
    digest = image.rpartition("@")[2] if image and "@sha256:" in image else None
    artifact_uri = container.get("ModelDataUrl")
    release = (model or {}).get("tags", {}).get(RELEASE_TAG)
    sha = artifact_sha256(artifact_uri or "")
    ref = ModelRef(release_id=release, artifact_sha256=sha, image_digest=digest) if release and sha and digest else None
    own = ((component_live or {}).get("Specification", {}).get("ComputeResourceRequirements", {})
           .get("AcceleratorPartitionType"))
    placement = obtained_placement(live_endpoint, config or {}, own)
    return LiveComponent(endpoint=endpoint, component=component, status=status, image_digest=digest,
                         artifact_uri=artifact_uri, artifact_sha256=sha, copies=copies,
                         environment={k: v for k, v in container.get("Environment", {}).items() if k != SERVING_ID_ENV},
                         placement=placement, model_ref=ref, failure_reason=failure)


def runtime_invoker(calls: SageMakerCalls, endpoint: str, component: str, *, timeout_s: float):
    """NotFound when the endpoint does not exist; the component is named unless it is the variant of a
    single-model endpoint (then SageMaker refuses the header), so an unknown component is SageMaker's 400."""
    try:
        live = calls.sm("DescribeEndpoint", EndpointName=endpoint)
    except NotFound as exc:
        raise NotFound(f"endpoint {endpoint} does not exist in {calls.backend.region}",
                       fix="deploy it first (the deploy_candidate or promote stage), or check the name") from exc
    variants = {v["VariantName"] for v in live.get("ProductionVariants") or []}
    single_model = component in variants and calls.inference_component(endpoint, component) is None
    return RuntimeInvoker(calls.aws, endpoint, None if single_model else component, timeout_s=timeout_s)
