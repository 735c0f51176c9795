"""Two models on one shared production endpoint on the aws backend, against the AWS double (issue 36, item 1): each is
its own inference component on the endpoint (`CreateInferenceComponent` with the shared `EndpointName`,
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_CreateInferenceComponent.html), created once; a canary of
one (`UpdateInferenceComponent` names one component,
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_UpdateInferenceComponent.html) and its rollback send no
request naming the other's component, whose model and copies stay as they were while its traffic is answered."""

from __future__ import annotations

import json

import pytest

from shiplift.tasks.config import load_release_config
from shiplift.tasks.pipeline.promotion import rollback
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint
from tests.aws.test_rollout_aws import CANARY, runtime_traffic

QUIET = lambda message: None  # noqa: E731


def _placement(aws_release) -> dict:
    """One shared pool of five one-GPU instances: two copies of each model, and a canary's batch beside them."""
    return {"kind": "instance_pool", "pools": aws_release.POOLS, "provision_timeout_s": 600, "instance_count": 5,
            "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1", "endpoint": "fleet"}


@pytest.mark.slow  # ~70 s on 2 cores with the local one: make test-slow (the local one stays in make test)
def test_a_canary_and_a_rollback_of_one_model_send_nothing_to_the_other_s_component(aws, aws_release, tiny_release,
                                                                                     tmp_path):
    aws_release.prepare_account(aws)
    state = tmp_path / "state"
    paths = {name: aws_release.write_aws_config(tiny_release, tmp_path / name, state, name=f"tiny-{name}",
                                                rollout=CANARY, placement=_placement(aws_release))
                                                for name in ("a", "b")}
    a, b = (load_release_config(paths[name]) for name in ("a", "b"))
    endpoint, mine, other = production_endpoint(a), production_component(a), production_component(b)
    assert endpoint == production_endpoint(b) and endpoint.startswith("shiplift-fleet-") and mine != other

    assert run_release(paths["b"], progress=QUIET)["status"] == "promoted"
    first_a = run_release(paths["a"], progress=QUIET)
    assert first_a["status"] == "promoted" and first_a["served_by"] == endpoint
    sagemaker = aws.client("sagemaker")
    created = [c.params for c in aws.calls if c.operation == "CreateEndpoint"]
    assert [c["EndpointName"]
            for c in created].count(endpoint) == 1, "the second model joins the endpoint the first made"
    assert {c.params["InferenceComponentName"]: c.params["EndpointName"] for c in aws.calls
            if c.operation == "CreateInferenceComponent" and c.params["EndpointName"] == endpoint} == {
        other: endpoint, mine: endpoint}
    before = sagemaker.describe_inference_component(InferenceComponentName=other)
    seen = len(aws.calls)

    with runtime_traffic(aws, endpoint, other) as to_b:
        canary = run_release(paths["a"], overrides=("artifact.quantization=F16",), progress=QUIET)
        assert canary["status"] == "promoted" and canary["rollout"]["strategy"] == "canary"
        back = rollback(state, "tiny-a", first_a["release_id"], reason="drill: back to the first", actor="ops")
        assert back["rollback_to"] == first_a["release_id"]

    sent = aws.calls[seen:]
    updates = [c.params["InferenceComponentName"] for c in sent if c.operation == "UpdateInferenceComponent"]
    assert updates == [mine, mine], "A's canary and A's rollback, each one update of A's component"
    touched = [(c.operation, c.params) for c in sent if c.service == "sagemaker" and not c.operation.startswith(
        ("Describe", "List")) and other in json.dumps(c.params, default=str)]
    assert touched == [], "no write to SageMaker names B's component"
    after = sagemaker.describe_inference_component(InferenceComponentName=other)
    assert after["Specification"]["ModelName"] == before["Specification"]["ModelName"]
    assert after["RuntimeConfig"] == before["RuntimeConfig"] and after["InferenceComponentStatus"] == "InService"
    assert to_b.statuses["answered"] > 0 and set(to_b.statuses) == {"answered"}, dict(to_b.statuses)
