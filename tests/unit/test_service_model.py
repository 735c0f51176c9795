"""shiplift.tasks.backends.aws.service_model: every request is checked against the whole botocore model (lengths,
counts, maximums, enums, Java patterns), not only what botocore's ParamValidator checks."""

from __future__ import annotations

import copy

import pytest
from botocore.validate import ParamValidator

from shiplift.tasks.backends.aws.service_model import (
    operation_name,
    request_problems,
    service_model,
    validate_request,
)
from shiplift.tasks.errors import BadInput

POOLS = [{"InstanceType": "ml.g6e.xlarge", "Priority": 1}, {"InstanceType": "ml.g6.2xlarge", "Priority": 2},
         {"InstanceType": "ml.g5.2xlarge", "Priority": 3}]
VALID = {
    "EndpointConfigName": "shiplift-tiny-aws-cand-0123456789",
    "ProductionVariants": [{
        "VariantName": "shiplift-tiny-aws-cand", "ModelName": "shiplift-tiny-aws-cand-abcdef0123",
        "InitialInstanceCount": 1, "InstancePools": POOLS, "VariantInstanceProvisionTimeoutInSeconds": 1800,
        "InferenceAmiVersion": "al2023-ami-sagemaker-inference-gpu-4-1",
        "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
        "ContainerStartupHealthCheckTimeoutInSeconds": 900, "ModelDataDownloadTimeoutInSeconds": 900,
    }],
    "Tags": [{"Key": "shiplift:managed", "Value": "true"},
             {"Key": "shiplift:release", "Value": "tiny-aws-0123abcd4567"}],
}


def changed(path: str, value, request: dict = VALID) -> dict:
    """A deep copy of `request` with the dotted `path` (list indexes as numbers) set to `value`."""
    request = copy.deepcopy(request)
    *parents, leaf = [int(part) if part.isdigit() else part for part in path.split(".")]
    node = request
    for key in parents:
        node = node[key]
    node[leaf] = value
    return request


def test_a_complete_create_endpoint_config_with_instance_pools_passes():
    assert request_problems("sagemaker", "CreateEndpointConfig", VALID) == []
    validate_request("sagemaker", "CreateEndpointConfig", VALID)  # quietly


@pytest.mark.parametrize("path, value, expected", [
    ("EndpointConfigName", "e" * 64, "EndpointConfigName: 64 characters, at most 63 allowed"),
    ("EndpointConfigName", "shiplift_tiny", "EndpointConfigName: 'shiplift_tiny' does not match the pattern"),
    ("ProductionVariants.0.InstancePools.1.InstanceType", "ml.g99.xlarge",
     "ProductionVariants[0].InstancePools[1].InstanceType: 'ml.g99.xlarge' is not one of the allowed values"),
    ("ProductionVariants.0.InstancePools", POOLS + [{"InstanceType": t, "Priority": p} for t, p in
                                                     (("ml.g6e.2xlarge", 4), ("ml.g5.4xlarge", 5),
                                                      ("ml.g6.4xlarge", 5))],
     "ProductionVariants[0].InstancePools: 6 items, at most 5 allowed"),
    ("ProductionVariants.0.InstancePools.0.Priority", 6,
     "ProductionVariants[0].InstancePools[0].Priority: 6 is above the maximum 5"),
    ("ProductionVariants.0.VariantInstanceProvisionTimeoutInSeconds", 200,
     "Invalid value for parameter ProductionVariants[0].VariantInstanceProvisionTimeoutInSeconds, value: 200, valid "
     "min value: 300"),
    ("ProductionVariants.0.VariantInstanceProvisionTimeoutInSeconds", 3601,
     "ProductionVariants[0].VariantInstanceProvisionTimeoutInSeconds: 3601 is above the maximum 3600"),
    ("ProductionVariants.0.Colour", "blue", 'Unknown parameter in ProductionVariants[0]: "Colour"'),
    ("ProductionVariants.0.InitialInstanceCount", "1",
     "Invalid type for parameter ProductionVariants[0].InitialInstanceCount, value: 1, type: <class 'str'>"),
    ("Tags.1.Value", "tiny!", "Tags[1].Value: 'tiny!' does not match the pattern ([\\p{L}\\p{Z}\\p{N}_.:/=+\\-@]*)"),
    ("ProductionVariants.0.InferenceAmiVersion", "al2023-ami-sagemaker-inference-gpu-9",
     "ProductionVariants[0].InferenceAmiVersion: 'al2023-ami-sagemaker-inference-gpu-9' is not one of the allowed "
     "values"),
])
def test_each_problem_is_reported_with_its_parameter_path(path, value, expected):
    problems = request_problems("sagemaker", "CreateEndpointConfig", changed(path, value))
    assert any(expected in problem for problem in problems), problems
    with pytest.raises(BadInput) as caught:
        validate_request("sagemaker", "CreateEndpointConfig", changed(path, value))
    assert "sagemaker CreateEndpointConfig would be refused by the service model" in str(caught.value)
    assert expected in str(caught.value) and "correct the config values" in caught.value.fix


def test_a_missing_required_member_is_reported():
    request = {k: v for k, v in VALID.items() if k != "ProductionVariants"}
    assert request_problems("sagemaker", "CreateEndpointConfig", request) == [
        'Missing required parameter in input: "ProductionVariants"']


def test_every_problem_of_one_request_is_reported_once():
    """ParamValidator's problems (a wrong type) and the model walk's (a maximum, a pattern) together, none twice."""
    request = changed("ProductionVariants.0.InstancePools.0.Priority", 6, changed("Tags.1.Value", "a!b"))
    request = changed("ProductionVariants.0.InitialInstanceCount", "1", request)
    problems = request_problems("sagemaker", "CreateEndpointConfig", request)
    assert len(problems) == len(set(problems)) == 3, problems
    assert problems[0].startswith("Invalid type for parameter ProductionVariants[0].InitialInstanceCount"), problems


def test_tag_patterns_are_unicode_classes():
    """`\\p{L}` and `\\p{Z}` are Unicode letters and separators: a Tag value in another script is fine, `!` is not."""
    assert request_problems("sagemaker", "CreateEndpointConfig", changed("Tags.1.Value", "Zürich Ωmega 東京")) == []
    assert request_problems("sagemaker", "CreateEndpointConfig", changed("Tags.1.Value", "a!b"))


def test_an_environment_map_with_101_entries_is_refused():
    container = {"Image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/shiplift/semif@sha256:" + "0" * 64,
                 "Environment": {f"SEMIF_VAR_{i}": "1" for i in range(100)}}
    request = {"ModelName": "m", "PrimaryContainer": container, "ExecutionRoleArn": "arn:aws:iam::123456789012:role/r"}
    assert request_problems("sagemaker", "CreateModel", request) == []
    container["Environment"]["ONE_TOO_MANY"] = "1"
    assert request_problems("sagemaker", "CreateModel", request) == [
        "PrimaryContainer.Environment: 101 entries, at most 100 allowed"]


def test_an_environment_key_that_is_no_variable_name_is_refused():
    request = {"ModelName": "m", "PrimaryContainer": {"Image": "i", "Environment": {"1-BAD": "x"}},
               "ExecutionRoleArn": "arn:aws:iam::123456789012:role/r"}
    problems = request_problems("sagemaker", "CreateModel", request)
    assert any(problem.startswith("PrimaryContainer.Environment key '1-BAD': '1-BAD' does not match")
               for problem in problems)


def test_custom_attributes_must_be_ascii_on_invoke_endpoint():
    """sagemaker-runtime's CustomAttributes pattern is Java's `\\p{ASCII}*`, which Python's re does not know."""
    request = {"EndpointName": "shiplift-tiny", "Body": b"{}", "CustomAttributes": "trace=abc-123"}
    assert request_problems("sagemaker-runtime", "InvokeEndpoint", request) == []
    problems = request_problems("sagemaker-runtime", "InvokeEndpoint", {**request, "CustomAttributes": "trace=café"})
    assert problems == ["CustomAttributes: 'trace=café' does not match the pattern \\p{ASCII}*"]


def test_param_validator_alone_accepts_what_this_refuses():
    shape = service_model("sagemaker").operation_model("CreateEndpointConfig").input_shape
    for request in (changed("EndpointConfigName", "e" * 64),
                    changed("ProductionVariants.0.InstancePools.0.Priority", 6),
                    changed("ProductionVariants.0.InstancePools.1.InstanceType", "ml.g99.xlarge")):
        assert not ParamValidator().validate(request, shape).has_errors(), "botocore would send it"
        assert request_problems("sagemaker", "CreateEndpointConfig", request), "shiplift refuses it before sending"


@pytest.mark.parametrize("given", ["CreateEndpointConfig", "create_endpoint_config"])
def test_snake_case_and_pascal_case_operation_names_both_work(given):
    assert operation_name("sagemaker", given) == "CreateEndpointConfig"
    assert request_problems("sagemaker", given, VALID) == []
    assert request_problems("sagemaker", given, changed("EndpointConfigName", "e" * 64))


def test_acronyms_in_snake_case_resolve():
    assert operation_name("sts", "get_caller_identity") == "GetCallerIdentity"
    assert operation_name("s3", "head_object") == "HeadObject"
    assert operation_name("sagemaker-runtime", "invoke_endpoint") == "InvokeEndpoint"


def test_an_unknown_operation_is_bad_input():
    with pytest.raises(BadInput) as caught:
        request_problems("sagemaker", "CreateEndpointConfiguration", VALID)
    assert "sagemaker has no operation 'CreateEndpointConfiguration'" in str(caught.value)
    with pytest.raises(BadInput):
        validate_request("sagemaker", "launch_rocket", {})


def test_an_unknown_service_is_bad_input():
    with pytest.raises(BadInput) as caught:
        request_problems("sagemakerz", "CreateEndpoint", {})
    assert "botocore has no service 'sagemakerz'" in str(caught.value)


def test_an_operation_without_input_takes_no_parameters():
    assert request_problems("sts", "GetCallerIdentity", {}) == []
