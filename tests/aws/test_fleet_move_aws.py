"""A shared endpoint's layout change on the aws backend, against the AWS double (issue 36, item 2): a running
endpoint's instances cannot change under its inference components, so `shiplift fleet move` creates the new layout's
endpoint (`CreateEndpoint`, https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateEndpoint.html), starts
each model's serving release there as its own component (`CreateInferenceComponent`, whose name is unique in the
account and region, https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateInferenceComponent.html, so the
new one is named by the layout too), and only then deletes the old components and endpoint
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DeleteInferenceComponent.html,
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DeleteEndpoint.html)."""

from __future__ import annotations

import botocore.exceptions
import pytest

from shiplift.tasks.config import load_release_config
from shiplift.tasks.pipeline.fleet.move import move_fleet
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint

QUIET = lambda message: None  # noqa: E731


def _placement(aws_release, instances: int) -> dict:
    return {"kind": "instance_pool", "pools": aws_release.POOLS, "provision_timeout_s": 600,
            "instance_count": instances,
            "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1", "endpoint": "fleet"}


@pytest.mark.slow  # ~17 s: make test-slow; make test moves a fleet end to end locally (tests/e2e/test_fleet_move.py)
def test_a_move_starts_every_component_on_the_new_endpoint_before_the_old_one_is_deleted(aws, aws_release, tiny_release,
                                                                                       tmp_path):
    aws_release.prepare_account(aws)
    state = tmp_path / "state"
    old, new = ({name: aws_release.write_aws_config(tiny_release, tmp_path / layout / name, state, name=f"tiny-{name}",
                                                   placement=_placement(aws_release, instances)) for name in ("a", "b")}
                for layout, instances in (("old", 2), ("new", 3)))
    for name in ("a", "b"):
        assert run_release(old[name], progress=QUIET)["status"] == "promoted"
    before = {name: load_release_config(old[name]) for name in old}
    after = {name: load_release_config(new[name]) for name in new}
    old_endpoint, new_endpoint = production_endpoint(before["a"]), production_endpoint(after["a"])
    seen = len(aws.calls)

    moved = move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", retire_old=True,
                       progress=QUIET)

    assert [m["outcome"] for m in moved["models"]] == ["moved", "moved"] and moved["retired"] == [old_endpoint]
    sent = [(c.operation, c.params) for c in aws.calls[seen:] if c.service == "sagemaker"
            and not c.operation.startswith(("Describe", "List"))]
    created = [params["EndpointName"] for op, params in sent if op == "CreateEndpoint"]
    assert created == [new_endpoint], "one new endpoint for the layout"
    joined = [(params["InferenceComponentName"], params["EndpointName"]) for op, params in sent
              if op == "CreateInferenceComponent"]
    assert sorted(joined) == sorted((production_component(after[name]), new_endpoint) for name in ("a", "b"))
    deletions = [i for i, (op, _) in enumerate(sent) if op.startswith("Delete")]
    starts = [i for i, (op, _) in enumerate(sent) if op == "CreateInferenceComponent"]
    assert deletions and max(starts) < min(deletions), "nothing old goes before every model serves on the new endpoint"
    deleted = {params.get("InferenceComponentName") or params.get("EndpointName") for op, params in sent
               if op in ("DeleteInferenceComponent", "DeleteEndpoint")}
    assert {old_endpoint, *(production_component(before[name]) for name in ("a", "b"))} <= deleted
    assert not deleted & {new_endpoint, *(production_component(after[name]) for name in ("a", "b"))}
    sagemaker = aws.client("sagemaker")
    assert sagemaker.describe_endpoint(EndpointName=new_endpoint)["EndpointStatus"] == "InService"
    with pytest.raises(botocore.exceptions.ClientError):
        sagemaker.describe_endpoint(EndpointName=old_endpoint)
    pool = sagemaker.describe_endpoint_config(
        EndpointConfigName=sagemaker.describe_endpoint(EndpointName=new_endpoint)["EndpointConfigName"])
    assert pool["ProductionVariants"][0]["InitialInstanceCount"] == 3, "the new layout's instances"
