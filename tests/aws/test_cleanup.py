"""`shiplift cleanup --list | --delete-all`: only what carries the prefix *and* shiplift's tag goes, in dependency
order."""

from __future__ import annotations

import json

from shiplift.tasks.cli.main import main
from shiplift.tasks.pipeline.release import run_release

QUIET = lambda message: None  # noqa: E731


def test_cleanup_lists_and_deletes_only_shiplifts_resources(aws, aws_release, tiny_release, tmp_path, capsys):
    aws_release.prepare_account(aws)
    config = aws_release.write_aws_config(tiny_release, tmp_path / "configs", tmp_path / "state")
    summary = run_release(config, keep_candidate=True, progress=QUIET)
    assert summary["status"] == "promoted"
    sagemaker, cloudwatch = aws.client("sagemaker"), aws.client("cloudwatch")
    production = sagemaker.describe_inference_component(InferenceComponentName=summary["component"])
    model = sagemaker.describe_model(ModelName=production["Specification"]["ModelName"])
    container = {k: model["PrimaryContainer"][k] for k in ("Image", "ModelDataUrl")}
    role = model["ExecutionRoleArn"]
    # prefix, no tag
    sagemaker.create_model(ModelName="shiplift-hand-made", PrimaryContainer=container, ExecutionRoleArn=role)
    sagemaker.create_model(ModelName="payments-model", PrimaryContainer=container, ExecutionRoleArn=role,
                           Tags=[{"Key": "shiplift:managed", "Value": "true"}])  # tag, no prefix
    alarm = dict(MetricName="Invocation5XXErrors", Namespace="AWS/SageMaker", Statistic="Sum", Period=60,
                 EvaluationPeriods=1, Threshold=1.0, ComparisonOperator="GreaterThanOrEqualToThreshold")
    cloudwatch.put_metric_alarm(AlarmName="shiplift-tiny-aws-5xx", Tags=[{"Key": "shiplift:managed", "Value": "true"}],
                                **alarm)
    cloudwatch.put_metric_alarm(AlarmName="shiplift-someone-elses", **alarm)
    autoscaling = aws.client("application-autoscaling")
    target = dict(ServiceNamespace="sagemaker", ResourceId=f"endpoint/{summary['served_by']}/variant/AllTraffic",
                  ScalableDimension="sagemaker:variant:DesiredInstanceCount")
    autoscaling.register_scalable_target(MinCapacity=1, MaxCapacity=2, Tags={"shiplift:managed": "true"}, **target)
    autoscaling.put_scaling_policy(PolicyName="shiplift-tiny-aws-steps", PolicyType="TargetTrackingScaling", **target,
                                   TargetTrackingScalingPolicyConfiguration={
                                       "TargetValue": 10.0, "PredefinedMetricSpecification": {
                                           "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}})

    assert main(["cleanup", str(config), "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    kinds = [r["kind"] for r in listed]
    assert kinds == sorted(kinds, key=["scaling-policy", "scalable-target", "alarm", "inference-component", "endpoint",
                                       "endpoint-config", "model"].index), "listed in the order they must be deleted"
    names = {r["name"] for r in listed}
    assert {summary["served_by"], summary["component"], "shiplift-tiny-aws-5xx", "shiplift-tiny-aws-steps"} <= names
    assert sum(1 for r in listed if r["kind"] == "endpoint") == 2, "production and the kept candidate"
    assert not names & {"shiplift-hand-made", "payments-model", "shiplift-someone-elses"}

    assert main(["cleanup", str(config), "--delete-all"]) == 0
    said = capsys.readouterr().err.splitlines()
    times = {r["name"]: sum(1 for line in said if line.startswith("deleted ") and line.endswith(f" {r['name']}"))
             for r in listed}
    assert set(times.values()) == {1}, ("each resource is reported deleted once (a config its endpoint took with it is "
                                       "'already gone')", times)
    assert sagemaker.list_endpoints()["Endpoints"] == []
    assert sagemaker.list_inference_components()["InferenceComponents"] == []
    assert sorted(m["ModelName"] for m in sagemaker.list_models()["Models"]) == ["payments-model", "shiplift-hand-made"]
    assert [a["AlarmName"] for a in cloudwatch.describe_alarms()["MetricAlarms"]] == ["shiplift-someone-elses"]
    assert autoscaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"] == []
    assert main(["cleanup", str(config), "--list"]) == 0
    assert "0 resources named shiplift*" in capsys.readouterr().err
