"""`shiplift release CONFIG --dry-run` for the production configs: complete request sequences the service model
accepts, placeholders named, nothing sent and no credentials needed; the real backend run stage by stage against the
recording session, which refuses what the service model refuses, answers as the service model says, opens no
connection, never waits and leaves no file behind."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from shiplift.tasks.backends.aws.recording_session import FreshAccount, recording_session
from shiplift.tasks.backends.aws.service_model import request_problems
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import BadInput
from shiplift.tasks.orchestrators.dry_run import Plan, champion_line, plan_release
from shiplift.tasks.pipeline.stages.common import production_endpoint
from shiplift.tasks.pipeline.table import STAGE_NAMES
from shiplift.validation.champion_reuse import latency_turns
from shiplift.validation.evaluate import TURN_PER_WORKER

ROOT = Path(__file__).resolve().parents[2]
RELEASES = ROOT / "configs" / "releases"
CANARY = ("rollout.strategy=canary", "rollout.copies=2", "rollout.online_gate.split=test",
          "rollout.alarms.max_latency_p99_ms=1500")
CHECKPOINTS = ("backend.kms_key_id=alias/shiplift",
               "backend.checkpoints={key_ref: shiplift/ledger-checkpoint-key, bucket: my-ledger-checkpoints, "
               "retention_days: 30}")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def dry_run(config: str, *overrides: str, flags: tuple[str, ...] = ()) -> tuple[list[dict], str]:
    """The CLI in a subprocess with no credentials and every AWS endpoint pointing at a closed port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true",
               AWS_ENDPOINT_URL=f"http://127.0.0.1:{closed_port()}")
    sets = [arg for override in overrides for arg in ("--set", override)]
    done = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "release", config, "--dry-run", *flags,
                           *sets],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def operations(lines: list[dict], stage: str) -> list[str]:
    return [line["operation"] for line in lines if line["stage"] == stage]


def assert_valid(lines: list[dict]) -> None:
    """Every printed request, read back as printed (bodies as text, times as ISO 8601), fits the service model."""
    for line in lines:
        params = {k: (v.encode() if k == "Body" else v) for k, v in line["params"].items()}
        assert request_problems(line["service"], line["operation"], params) == [], line


def test_qwen_on_an_instance_pool():
    lines, stderr = dry_run("configs/releases/qwen35-4b-semif.yaml")
    assert "nothing was sent" in stderr
    power = [line for line in stderr.splitlines() if line.startswith("gate power: champion_accuracy")]
    assert len(power) == 1 and "on 111 tasks" in power[0] and "an inconclusive gate will" in power[0], stderr
    assert_valid(lines)
    assert operations(lines, "deploy_candidate") == [
        "DescribeModel", "CreateModel", "DescribeEndpointConfig", "CreateEndpointConfig", "DescribeEndpoint",
        "CreateEndpoint",
        "DescribeEndpoint", "DescribeEndpoint", "DescribeInferenceComponent", "DescribeEndpointConfig",
        "DescribeModel", "ListTags"]
    config = next(line["params"] for line in lines if line["operation"] == "CreateEndpointConfig"
                  and line["stage"] == "deploy_candidate")
    variant = config["ProductionVariants"][0]
    assert [p["InstanceType"] for p in variant["InstancePools"]] == ["ml.g6e.xlarge", "ml.g6.2xlarge", "ml.g5.2xlarge",
                                                                     "ml.g4dn.2xlarge"]
    assert [p["Priority"] for p in variant["InstancePools"]] == [1, 2, 3, 4] and "InstanceType" not in variant
    assert variant["VariantInstanceProvisionTimeoutInSeconds"] == 1800
    assert variant["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert variant["RoutingConfig"] == {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"}
    assert variant["ContainerStartupHealthCheckTimeoutInSeconds"] == variant["ModelDataDownloadTimeoutInSeconds"] == 900
    model = next(line for line in lines if line["operation"] == "CreateModel")
    assert model["params"]["EnableNetworkIsolation"] is True
    assert model["placeholders"]["ModelName"].startswith("a name derived from")
    assert "PrimaryContainer.ModelDataUrl" in model["placeholders"]
    assert "PrimaryContainer.Image" in model["placeholders"]
    invocations = [line for line in lines if line["operation"] == "InvokeEndpoint"]
    assert len(invocations) == 111, "one per task of the test split"
    assert all("InferenceComponentName" not in line["params"] for line in invocations), "a single-model candidate"
    assert json.loads(invocations[0]["params"]["Body"])["decision"]["options"]
    production = [line for line in lines if line["stage"] == "promote"
                  and line["operation"] == "CreateInferenceComponent"]
    assert production[0]["params"]["RuntimeConfig"] == {"CopyCount": 2}
    assert production[0]["params"]["Specification"]["ComputeResourceRequirements"][
        "NumberOfAcceleratorDevicesRequired"] == 1
    assert operations(lines, "image")[:2] == ["DescribeRepositories",
                                              "DescribeImages"] and "StartBuild" in operations(lines, "image")
    assert operations(lines, "teardown_candidate")[2] == "DeleteEndpoint"


def test_mdeberta_on_mig_partitions():
    lines, _ = dry_run("configs/releases/mdeberta-nli.yaml")
    configs = [line["params"] for line in lines if line["operation"] == "CreateEndpointConfig"]
    assert len(configs) == 2, "candidate and production are inference-component endpoints"
    for config in configs:
        variant = config["ProductionVariants"][0]
        assert "ModelName" not in variant and config["ExecutionRoleArn"].endswith(":role/shiplift-sagemaker-execution")
        assert variant["AcceleratorPartitionLayouts"] == [{"AcceleratorPartitionTypes": ["mig-1g.10gb"] * 7}]
        assert variant["InstanceType"] == "ml.p5.4xlarge", "one H100: the layout is carved on every GPU of the instance"
    candidate = operations(lines, "deploy_candidate")
    assert candidate.index("CreateEndpointConfig") < candidate.index("DescribeEndpointConfig",
                                                                     candidate.index("CreateEndpointConfig"))
    components = [line for line in lines if line["operation"] == "CreateInferenceComponent"]
    for line, copies in zip(components, (1, 2), strict=True):
        requirements = line["params"]["Specification"]["ComputeResourceRequirements"]
        assert requirements["AcceleratorPartitionType"] == "mig-1g.10gb"
        assert requirements["NumberOfAcceleratorDevicesRequired"] == 1
        assert line["params"]["RuntimeConfig"]["CopyCount"] == copies
        assert "MinMemoryRequiredInMb" in next(iter(line["placeholders"])) or any(
            "MinMemoryRequiredInMb" in key for key in line["placeholders"])
    invocations = [line for line in lines if line["operation"] == "InvokeEndpoint"]
    assert len(invocations) == 6 and all(line["params"]["InferenceComponentName"]
                                         for line in invocations), "90 pairs in batches of 16"


# ~24 s: make test-slow; make test runs a second aws release against its champion (tests/aws/test_release_aws.py)
@pytest.mark.slow
def test_a_later_release_scores_the_champion_and_updates_production_where_its_copies_fit():
    first, _ = dry_run("configs/releases/qwen35-4b-semif.yaml")
    lines, stderr = dry_run("configs/releases/qwen35-4b-semif.yaml", flags=("--with-champion",))
    assert_valid(lines)
    invocations = [line["params"] for line in lines if line["operation"] == "InvokeEndpoint"]
    champion = [params for params in invocations if params["EndpointName"] == "shiplift-qwen35-4b-semif-prod"]
    assert len(champion) < len(invocations) - len(champion) == 111, "the champion answers its latency sample"
    assert f"the gate's champion requests: {len(champion)}, the champion's live latency sample" in stderr
    assert all(params["InferenceComponentName"] == "shiplift-qwen35-4b-semif" for params in champion)
    fresh, stderr_fresh = dry_run("configs/releases/qwen35-4b-semif.yaml", flags=("--with-champion",
                                                                                   "--fresh-champion"))
    assert len(fresh) == len(lines) - len(champion) + 111, "--fresh-champion: the champion answers every task"
    assert "the gate's champion requests: 111, the champion on every task (111 requests): --fresh-champion" in \
        stderr_fresh
    promote = [line for line in lines if line["stage"] == "promote"]
    ops = [line["operation"] for line in promote]
    assert "CreateEndpoint" not in ops and "CreateInferenceComponent" not in ops and "CreateEndpointConfig" not in ops
    [update] = [line for line in promote if line["operation"] == "UpdateInferenceComponent"]
    assert "DeploymentConfig" not in update["params"] and update["params"]["RuntimeConfig"] == {"CopyCount": 2}
    fit = ("an update without DeploymentConfig starts all 2 new copies beside the old ones (4 at once); the endpoint "
           "grows to 4 x ml.g6e.xlarge = 4 GPUs (ManagedInstanceScaling): fits")
    assert fit in update["note"] and f"this release's update of production: {fit}" in stderr
    assert [line["operation"] for line in first if line["stage"] == "promote"].count("CreateInferenceComponent") == 1
    assert len(lines) == len(first) + len(champion) + 4 + 1 - 2 + 1, (
        "the champion's answers, its describe past the DescribeEndpoint a first release sends too (4 requests) and its "
        "channel's DescribeEndpoint, less production's CreateEndpointConfig and CreateEndpoint, and the registry view "
        "looking up the champion's version, which the promotion supersedes")
    superseded = [line for line in lines if line["stage"] == "model_registry"
                  and line["operation"] == "ListModelPackages"]
    assert len(superseded) == 3, "registered? (after validate, after promote), then the superseded champion's version"


def test_with_champion_goes_only_with_dry_run():
    done = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "release",
                           "configs/releases/qwen35-4b-semif.yaml",
                           "--with-champion"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "only goes with --dry-run" in done.stderr and "Traceback" not in done.stderr


def test_checkpoints_are_checked_in_preflight_and_signed_into_the_object_lock_bucket_at_the_end():
    lines, _ = dry_run("configs/releases/mdeberta-nli.yaml", "backend.kms_key_id=alias/shiplift", "backend.checkpoints="
                       "{key_ref: shiplift/ledger-checkpoint-key, bucket: my-ledger-checkpoints, retention_days: 30}")
    assert_valid(lines)
    checks = ["HeadBucket", "GetObjectLockConfiguration", "GetSecretValue"]
    assert operations(lines, "preflight") == ["GetCallerIdentity", "HeadBucket", "DescribeKey", *checks]
    describe_key = next(line for line in lines if line["operation"] == "DescribeKey")
    assert describe_key["params"] == {"KeyId": "alias/shiplift"}, \
        "the alias is resolved to the key it names before anything"
    assert operations(lines, "release") == [*checks, "ListObjectVersions", "PutObject"], (
        "a fresh account holds no earlier checkpoint to read back and verify (a later release sends a GetObject of "
        "each)")
    assert lines.index(next(line for line in lines if line["stage"] == "release")) > max(
        index for index, line in enumerate(lines) if line["stage"] == "teardown_candidate"), "signed after teardown"
    ends = [line for line in lines if line["stage"] == "release"]
    assert {line["params"].get("Bucket") for line in ends if line["service"] == "s3"} == {"my-ledger-checkpoints"}
    assert ends[2]["params"] == {"SecretId": "shiplift/ledger-checkpoint-key"}
    assert ends[3]["params"]["Prefix"] == "shiplift/ledger-checkpoints/"
    assert "GetObject" in ends[3]["note"] and "position 1" in ends[3]["note"]
    put = ends[4]["params"]
    assert put["Key"] == "shiplift/ledger-checkpoints/000000000001.json" and put["IfNoneMatch"] == "*"
    assert (put["ObjectLockMode"], put["ChecksumAlgorithm"], put["ServerSideEncryption"], put["SSEKMSKeyId"]) == (
        "COMPLIANCE", "SHA256", "aws:kms", "alias/shiplift")
    until = datetime.fromisoformat(put["ObjectLockRetainUntilDate"])
    assert abs(until - datetime.now(UTC) - timedelta(days=30)) < timedelta(minutes=5)
    assert set(json.loads(put["Body"])) == {"version", "seq", "head_hash", "merkle_root", "signed_at", "key_id",
                                            "signature"}
    assert {"Body", "ChecksumSHA256", "Metadata.seq", "Metadata.head-hash", "ObjectLockRetainUntilDate"} <= set(
        ends[4]["placeholders"]), "what only the release's end knows is named"


def test_a_later_release_reads_back_and_verifies_the_champion_s_checkpoint_before_it_signs_the_next():
    lines = planned("mdeberta-nli.yaml", *CHECKPOINTS, with_champion=True)
    ends = [r for r in lines if r.stage == "release"]
    assert [r.operation for r in ends][-3:] == ["ListObjectVersions", "GetObject", "PutObject"]
    assert ends[-2].params["Key"] == "shiplift/ledger-checkpoints/000000000001.json" and ends[-2].params["VersionId"]
    assert ends[-1].params["Key"] == "shiplift/ledger-checkpoints/000000000002.json", "the next position"


def test_a_local_config_has_no_requests_to_print():
    done = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "release",
                           "configs/releases/gemma-decision.yaml",
                           "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "uses the local backend" in done.stderr and not done.stdout


def test_a_request_the_service_model_refuses_stops_the_plan():
    plan = Plan()
    with pytest.raises(BadInput, match=r"EndpointName: 64 characters, at most 63"):
        plan.add("sagemaker", "CreateEndpoint", EndpointName="e" * 64, EndpointConfigName="c")
    assert plan.requests == []


def test_a_canary_prints_the_rolling_update_and_the_alarms_it_is_rolled_back_by():
    lines, _ = dry_run("configs/releases/qwen35-4b-semif.yaml", "rollout.strategy=canary", "rollout.copies=2",
                       "rollout.wait_interval_s=120", "rollout.online_gate.split=test",
                       "rollout.alarms.max_latency_p99_ms=1500",
                       flags=("--with-champion",))  # a first release deploys production whole; a later one rolls
    promote = [line for line in lines if line["stage"] == "promote"]
    ops = [line["operation"] for line in promote]
    first_update = ops.index("UpdateInferenceComponent")
    assert ops[first_update - 3: first_update] == ["PutMetricAlarm"] * 3
    assert ops.index("DeleteAlarms") > max(i for i, op in enumerate(ops)
                                           if op in ("DescribeAlarms", "PutMetricData")), (
        "the alarms go once the update has ended")
    alarms = {line["params"]["AlarmName"].rsplit("-", 2)[-2:][-1]: line["params"] for line in promote
              if line["operation"] == "PutMetricAlarm"}
    assert sorted(alarms) == ["gate", "p99", "rate"]
    rate = alarms["rate"]
    expression = next(m for m in rate["Metrics"] if "Expression" in m)
    assert expression["Expression"] == "IF(invocations >= 1, MAX([errors5xx, modelerrors]) / invocations, 0)"
    assert {m["MetricStat"]["Metric"]["MetricName"] for m in rate["Metrics"] if "MetricStat" in m} == {
        "Invocation5XXErrors", "InvocationModelErrors", "Invocations"}
    assert all(m["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "InferenceComponentName",
                                                            "Value": "shiplift-qwen35-4b-semif"}]
               for m in rate["Metrics"] if "MetricStat" in m)
    assert (alarms["p99"]["MetricName"], alarms["p99"]["ExtendedStatistic"],
            alarms["p99"]["Threshold"]) == ("ModelLatency", "p99", 1_500_000)
    assert (alarms["gate"]["Namespace"], alarms["gate"]["MetricName"]) == ("shiplift/Rollout", "OnlineGateFailed")
    update = promote[first_update]["params"]
    assert update["DeploymentConfig"]["RollingUpdatePolicy"] == {
        "MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1}, "WaitIntervalInSeconds": 120,
        "MaximumExecutionTimeoutInSeconds": 3600,
        "RollbackMaximumBatchSize": {"Type": "CAPACITY_PERCENT", "Value": 100}}
    assert [a["AlarmName"] for a in update["DeploymentConfig"]["AutoRollbackConfiguration"]["Alarms"]] == [
        line["params"]["AlarmName"] for line in promote if line["operation"] == "PutMetricAlarm"]
    assert "PutMetricData" in ops, "the online gate's verdict is published for its alarm"


def test_a_canary_sagemaker_cannot_send_is_refused_with_the_reason():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "release",
                           "configs/releases/qwen35-4b-semif.yaml",
                           "--dry-run",
                           "--set", "rollout.strategy=canary", "--set", "rollout.copies=4"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "moves equal batches" in done.stderr
    assert "use a batch of 2 (half of 4) or strategy linear" in done.stderr
    assert "Traceback" not in done.stderr


def planned(name: str, *overrides: str, with_champion: bool = False, fresh_champion: bool = False):
    config = load_release_config(RELEASES / name, overrides=overrides, environ={})
    return plan_release(config, config_path=RELEASES / name, with_champion=with_champion,
                        fresh_champion=fresh_champion)


def gate_requests(requests, production: str) -> tuple[list, list]:
    """The gate's InvokeEndpoint requests: (the candidate's, the champion's), each in the order sent."""
    sent = [r for r in requests if (r.stage, r.operation) == ("validate", "InvokeEndpoint")]
    return ([r for r in sent if r.params["EndpointName"] != production],
            [r for r in sent if r.params["EndpointName"] == production])


def test_a_later_gate_sends_the_champion_its_latency_sample_and_every_task_only_when_asked_to_score_it_afresh():
    """Reuse allowed (the default): the champion answers only the turns of its live latency sample, the turns the gate
    picks (`latency_turns` over its turns of TURN_PER_WORKER x concurrency tasks), alternated with the candidate (A B,
    then B A), each request and the printed line saying that a champion without recorded results is scored on every
    task. `--fresh-champion`, or `validation.champion.reuse: fresh`, sends it every task."""
    config = load_release_config(RELEASES / "qwen35-4b-semif.yaml", environ={})
    production, size = production_endpoint(config), TURN_PER_WORKER * config.validation.concurrency
    requests = planned("qwen35-4b-semif.yaml", with_champion=True)
    candidate, champion = gate_requests(requests, production)
    turns = [candidate[first:first + size] for first in range(0, len(candidate), size)]
    sample = sorted(latency_turns([len(turn) for turn in turns], config.validation.champion.latency_sample))
    assert len(candidate) == 111 and config.validation.champion.latency_sample <= len(champion) < len(candidate)
    assert [r.params["Body"] for r in champion] == [r.params["Body"] for i in sample for r in turns[i]]
    position = {id(r): n for n, r in enumerate(requests)}
    champion_first = [position[id(champion[sum(len(turns[j]) for j in sample[:k])])] < position[id(turns[i][0])]
                      for k, i in enumerate(sample)]
    assert champion_first == [k % 2 == 1 for k in range(len(sample))], "A B, then B A, on the sampled turns"
    assert {r.note for r in champion} == {champion[0].note} and "scores it on every task (111 requests)" in \
        champion[0].note and not any(r.note for r in candidate)
    assert champion_line(requests, config).startswith(f"the gate's champion requests: {len(champion)}, the champion's "
                                                      "live latency sample")
    for why, plan in (("--fresh-champion", planned("qwen35-4b-semif.yaml", with_champion=True, fresh_champion=True)),
                      ("validation.champion.reuse is fresh",
                       planned("qwen35-4b-semif.yaml", "validation.champion.reuse=fresh", with_champion=True))):
        candidate, champion = gate_requests(plan, production)
        assert [r.params["Body"] for r in champion] == [r.params["Body"] for r in candidate] and len(champion) == 111
        assert champion[0].note == f"the champion on every task (111 requests): {why}"
        assert champion_line(plan, config) == f"the gate's champion requests: 111, {champion[0].note}"


def test_the_stages_are_run_in_the_order_of_the_stage_table():
    stages = [request.stage for request in planned("mdeberta-nli.yaml", *CHECKPOINTS)]
    runs = [stage for index, stage in enumerate(stages) if index == 0 or stages[index - 1] != stage]
    assert [stage for stage in runs if stage in STAGE_NAMES] == list(STAGE_NAMES), "each stage once, in STAGES order"
    assert runs[0] == "preflight" and runs[-1] == "release", "opened before the stages, signed after them"
    assert {stage for stage in runs if stage not in STAGE_NAMES} == {"preflight", "model_registry", "release"}
    assert [runs[index - 1] for index, stage in enumerate(runs) if stage == "model_registry"] == ["validate",
                                                                                                  "promote"], (
        "the registry view follows the gate's decision and the promotion")


def test_the_dry_run_runs_each_stage_function_of_the_stage_table_once_in_order(monkeypatch):
    """No copy of a stage: what the table names (`module:function`) is what runs, so a change to a stage is planned."""
    import importlib

    from shiplift.tasks.pipeline.table import STAGES

    ran = []
    for step in STAGES:
        module_name, _, attribute = step.function.partition(":")
        module = importlib.import_module(module_name)
        real = getattr(module, attribute)
        monkeypatch.setattr(module, attribute, lambda ctx, real=real, name=step.name: ran.append(name) or real(ctx))
    planned("qwen35-4b-semif.yaml", *CANARY, with_champion=True)
    assert ran == list(STAGE_NAMES)


def test_the_recording_session_refuses_what_the_service_model_refuses_and_answers_the_rest():
    config = load_release_config(RELEASES / "qwen35-4b-semif.yaml", environ={})
    plan = Plan()
    account = FreshAccount(config.backend, plan.stand_in, release_id="r")
    sagemaker = recording_session(plan, account).client("sagemaker")
    with pytest.raises(BadInput, match=r"EndpointName: 64 characters, at most 63"):
        sagemaker.create_endpoint(EndpointName="e" * 64, EndpointConfigName="c")
    assert plan.requests == [] and account.hosting["Endpoint"] == {}, "nothing recorded, nothing created"
    with pytest.raises(ClientError, match='Could not find endpoint "e"'):
        sagemaker.describe_endpoint(EndpointName="e")
    assert [(r.stage, r.service, r.operation, r.params) for r in plan.requests] == [
        ("preflight", "sagemaker", "DescribeEndpoint", {"EndpointName": "e"})]


def test_a_dry_run_opens_no_connection_and_never_waits(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the dry run opened a connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    lines = planned("qwen35-4b-semif.yaml", *CANARY, with_champion=True)
    assert "UpdateInferenceComponent" in [r.operation for r in lines] and not [s for s in slept if s > 0], slept


def test_a_dry_run_leaves_no_file_behind(tmp_path, monkeypatch):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    lines = planned("qwen35-4b-semif.yaml", f"backend.state_dir={tmp_path / 'state'}")
    assert lines and not (tmp_path / "state").exists() and list(scratch.iterdir()) == []


def test_every_answer_of_the_recording_account_fits_the_service_model(monkeypatch):
    """Each success answer against botocore's output shape (required members, types; lengths, enums and patterns)."""
    from botocore.validate import ParamValidator

    from shiplift.tasks.backends.aws.service_model import _walk, service_model

    answers = []
    answer = FreshAccount.answer

    def kept(self, service, operation, params):
        answers.append((service, operation, answer(self, service, operation, params)))
        return answers[-1][2]

    monkeypatch.setattr(FreshAccount, "answer", kept)
    from tests.aws.test_dlc_chat_aws import CHAT, chat_config  # it imports this module: not at the top

    planned("qwen35-4b-semif.yaml", *CANARY, with_champion=True)
    planned("mdeberta-nli.yaml", *CHECKPOINTS)
    plan_release(chat_config(), config_path=CHAT)
    problems = []
    for service, operation, found in answers:
        if found.status < 300:
            shape = service_model(service).operation_model(operation).output_shape
            if shape is None:
                problems += [f"{service} {operation} answers nothing, not {found.parsed}"] if found.parsed else []
                continue
            report = ParamValidator().validate(found.parsed, shape)
            problems += [f"{service} {operation}: {line}"
                         for line in report.generate_report().splitlines()] if report.has_errors() else []
            walked: list[str] = []
            _walk(shape, found.parsed, "", walked)  # the checks ParamValidator leaves out
            problems += [f"{service} {operation}: {problem}" for problem in walked]
    assert len({(service, operation) for service, operation, _ in answers}) > 40 and problems == []


SERVERLESS = ("image.device=cpu", "rollout.copies=1",
              "placement={kind: serverless, memory_size_mb: 6144, max_concurrency: 4, provisioned_concurrency: 1, "
              "cold_starts: 1, max_cold_start_p95_s: 120}")


# ~17 s: make test-slow; make test releases a serverless encoder locally (tests/e2e/test_serverless_release.py)
@pytest.mark.slow
def test_a_serverless_encoder_is_a_single_model_endpoint_updated_in_place():
    """Serverless placement (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html): candidate and
    production are single-model endpoints whose variant is a ServerlessConfig (no instances, no inference component,
    no network isolation, which serverless does not support); a later release updates production with UpdateEndpoint."""
    lines, stderr = dry_run("configs/releases/mdeberta-nli.yaml", *SERVERLESS)
    assert_valid(lines)
    configs = [line["params"] for line in lines if line["operation"] == "CreateEndpointConfig"]
    assert len(configs) == 2
    for config in configs:
        [variant] = config["ProductionVariants"]
        assert variant["ServerlessConfig"] == {"MemorySizeInMB": 6144, "MaxConcurrency": 4, "ProvisionedConcurrency": 1}
        assert "InstanceType" not in variant and "InitialInstanceCount" not in variant
        assert "ExecutionRoleArn" not in config
    assert all(line["params"]["EnableNetworkIsolation"] is False for line in lines
               if line["operation"] == "CreateModel")
    ops = [line["operation"] for line in lines]
    assert "CreateInferenceComponent" not in ops and "UpdateInferenceComponentRuntimeConfig" not in ops
    assert all("InferenceComponentName" not in line["params"] for line in lines
               if line["operation"] == "InvokeEndpoint")
    assert "serverless bills per request" in stderr

    later, _ = dry_run("configs/releases/mdeberta-nli.yaml", *SERVERLESS, flags=("--with-champion",))
    assert_valid(later)
    promote = [line for line in later if line["stage"] == "promote"]
    [update] = [line["params"] for line in promote if line["operation"] == "UpdateEndpoint"]
    assert update["EndpointName"] == "shiplift-mdeberta-nli-prod"
    assert "CreateEndpoint" not in [line["operation"] for line in promote]


@pytest.mark.parametrize("overrides, refusal", [
    (("rollout.copies=1",
      "placement={kind: serverless, memory_size_mb: 6144, max_concurrency: 4, max_cold_start_p95_s: 120}"),
     "SageMaker Serverless Inference has no GPUs"),
    (SERVERLESS[:2]
     + ("placement={kind: serverless, memory_size_mb: 6144, max_concurrency: 4, max_cold_start_p95_s: 120}",),
     "set placement.cold_starts: 1"),
    (SERVERLESS[:2] + ("placement={kind: serverless, memory_size_mb: 5000, max_concurrency: 4, cold_starts: 1, "
                       "max_cold_start_p95_s: 120}",), "1 GB steps up to 6 GB"),
    (SERVERLESS[:2]
     + ("placement={kind: serverless, memory_size_mb: 2048, max_concurrency: 2, provisioned_concurrency: 3, "
                       "cold_starts: 1, max_cold_start_p95_s: 120}",), "is above placement.max_concurrency"),
    (SERVERLESS[:2] + ("placement={kind: serverless, endpoint: shared-cpu, memory_size_mb: 2048, max_concurrency: 2, "
                       "cold_starts: 1, max_cold_start_p95_s: 120}",), "cannot be the shared endpoint"),
    (SERVERLESS + ("rollout={strategy: canary, copies: 2}",), "use rollout.strategy: all_at_once"),
    (SERVERLESS + ("scale_to_zero={max_cold_start_p95_s: 60}",), "scales to zero by itself"),
])
def test_what_serverless_cannot_host_is_refused_with_the_fix(overrides, refusal):
    with pytest.raises(Exception, match=re.escape(refusal)):
        load_release_config(RELEASES / "mdeberta-nli.yaml", overrides=overrides, environ={})
