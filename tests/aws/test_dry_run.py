"""`shiplift release CONFIG --dry-run` for the production configs: complete request sequences the service model
accepts, placeholders named, nothing sent and no credentials needed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.aws.dryrun import Plan
from tasks.aws.service_model import request_problems
from tasks.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dry_run(config: str) -> tuple[list[dict], str]:
    """The CLI in a subprocess with no credentials and every AWS endpoint pointing at a closed port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{closed_port()}")
    done = subprocess.run([sys.executable, "-m", "tasks.cli", "release", config, "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def operations(lines: list[dict], stage: str) -> list[str]:
    return [line["operation"] for line in lines if line["stage"] == stage]


def test_qwen_on_an_instance_pool():
    lines, stderr = dry_run("configs/releases/qwen35-4b-semif.yaml")
    assert "nothing was sent" in stderr
    for line in lines:
        params = {k: (v.encode() if k == "Body" else v) for k, v in line["params"].items()}
        assert request_problems(line["service"], line["operation"], params) == [], line
    assert operations(lines, "deploy_candidate") == [
        "DescribeModel", "CreateModel", "DescribeEndpointConfig", "CreateEndpointConfig", "DescribeEndpoint", "CreateEndpoint",
        "DescribeEndpoint", "DescribeEndpoint", "DescribeInferenceComponent", "DescribeEndpointConfig", "DescribeModel", "ListTags"]
    config = next(line["params"] for line in lines if line["operation"] == "CreateEndpointConfig" and line["stage"] == "deploy_candidate")
    variant = config["ProductionVariants"][0]
    assert [p["InstanceType"] for p in variant["InstancePools"]] == ["ml.g6e.xlarge", "ml.g6.2xlarge", "ml.g5.2xlarge", "ml.g4dn.2xlarge"]
    assert [p["Priority"] for p in variant["InstancePools"]] == [1, 2, 3, 4] and "InstanceType" not in variant
    assert variant["VariantInstanceProvisionTimeoutInSeconds"] == 1800
    assert variant["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == variant["ModelDataDownloadTimeoutInSeconds"] == 900
    model = next(line for line in lines if line["operation"] == "CreateModel")
    assert model["params"]["EnableNetworkIsolation"] is True
    assert model["placeholders"]["ModelName"].startswith("a name derived from")
    assert "PrimaryContainer.ModelDataUrl" in model["placeholders"] and "PrimaryContainer.Image" in model["placeholders"]
    invocations = [line for line in lines if line["operation"] == "InvokeEndpoint"]
    assert len(invocations) == 111, "one per task of the test split"
    assert all("InferenceComponentName" not in line["params"] for line in invocations), "a single-model candidate"
    assert json.loads(invocations[0]["params"]["Body"])["decision"]["options"]
    production = [line for line in lines if line["stage"] == "promote" and line["operation"] == "CreateInferenceComponent"]
    assert production[0]["params"]["RuntimeConfig"] == {"CopyCount": 2}
    assert production[0]["params"]["Specification"]["ComputeResourceRequirements"]["NumberOfAcceleratorDevicesRequired"] == 1
    assert operations(lines, "image")[:2] == ["DescribeRepositories", "DescribeImages"] and "StartBuild" in operations(lines, "image")
    assert operations(lines, "teardown_candidate")[2] == "DeleteEndpoint"


def test_mdeberta_on_mig_partitions():
    lines, _ = dry_run("configs/releases/mdeberta-nli.yaml")
    configs = [line["params"] for line in lines if line["operation"] == "CreateEndpointConfig"]
    assert len(configs) == 2, "candidate and production are inference-component endpoints"
    for config in configs:
        variant = config["ProductionVariants"][0]
        assert "ModelName" not in variant and config["ExecutionRoleArn"].endswith(":role/shiplift-sagemaker-execution")
        assert variant["AcceleratorPartitionLayouts"] == [{"AcceleratorPartitionTypes": ["mig-1g.10gb", "mig-1g.10gb"]}]
        assert variant["InstanceType"] == "ml.p5.48xlarge"
    candidate = operations(lines, "deploy_candidate")
    assert candidate.index("CreateEndpointConfig") < candidate.index("DescribeEndpointConfig", candidate.index("CreateEndpointConfig"))
    components = [line for line in lines if line["operation"] == "CreateInferenceComponent"]
    for line, copies in zip(components, (1, 2)):
        requirements = line["params"]["Specification"]["ComputeResourceRequirements"]
        assert requirements["AcceleratorPartitionType"] == "mig-1g.10gb" and requirements["NumberOfAcceleratorDevicesRequired"] == 1
        assert line["params"]["RuntimeConfig"]["CopyCount"] == copies
        assert "MinMemoryRequiredInMb" in next(iter(line["placeholders"])) or any(
            "MinMemoryRequiredInMb" in key for key in line["placeholders"])
    invocations = [line for line in lines if line["operation"] == "InvokeEndpoint"]
    assert len(invocations) == 6 and all(line["params"]["InferenceComponentName"] for line in invocations), "90 pairs in batches of 16"


def test_a_local_config_has_no_requests_to_print():
    done = subprocess.run([sys.executable, "-m", "tasks.cli", "release", "configs/releases/gemma-decision.yaml", "--dry-run"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "uses the local backend" in done.stderr and not done.stdout


def test_a_request_the_service_model_refuses_stops_the_plan():
    plan = Plan()
    with pytest.raises(BadInput, match=r"EndpointName: 64 characters, at most 63"):
        plan.add("sagemaker", "CreateEndpoint", EndpointName="e" * 64, EndpointConfigName="c")
    assert plan.requests == []
