"""A chat release (`image.kind: dlc-chat`) on the aws backend: the llama.cpp DLC is adopted, not built. Its tag is
resolved to a digest in the DLC's registry with one ECR BatchGetImage before anything deploys it, a pinned digest the
tag no longer names stops the release, the dry run plans that one request and the SM_LLAMA_CPP_* environment, and the
IAM policies grant reading and pulling the DLC's repository instead of CodeBuild and the config's own repository
(checked with AWS's Service Authorization Reference, as tests/aws/test_iam.py does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from shiplift.tasks.backends.aws.backend import aws_backends
from shiplift.tasks.backends.aws.iam import OPERATIONS, execution_role_policy, pipeline_policy, policies
from shiplift.tasks.cli.main import main
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError, IntegrityError, NotFound
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.orchestrators.dry_run import plan_release
from shiplift.tasks.pipeline.release import begin_orchestrated, run_orchestrated_stage, run_release
from tests.aws.iam_reference import Account, actions_for, allowed, evaluated, privilege, sse_kms
from tests.aws.test_dry_run import assert_valid, dry_run, operations
from tests.aws.test_iam import (
    _parliament,
    _resource_alias_condition,
    account_of,
    conditions_the_reference_lacks,
    only_on_star_what_the_reference_cannot_scope,
)

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "configs" / "releases" / "gemma-chat.yaml"
ACCOUNT = "123456789012"
DLC_ACCOUNT = "763104351884"  # the DLC's registry in us-east-1 (the double's region)
CPU_TAG = "server-sagemaker-cpu-v1"
DLC = f"{DLC_ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/llama-cpp"
DLC_ARN = f"arn:aws:ecr:us-east-1:{DLC_ACCOUNT}:repository/llama-cpp"
QUIET = lambda message: None  # noqa: E731
GPU = {"kind": "instance_type", "instance_type": "ml.g6.xlarge", "max_instance_count": 2,
       "inference_ami_version": "al2023-ami-sagemaker-inference-gpu-4-1"}


def aws_backend(state_dir: Path | str = "/tmp/shiplift-dlc-chat", region: str = "us-east-1") -> dict:
    """The `backend` of tests/aws/aws_release.py's account (the double's), polling fast."""
    return {"kind": "aws", "region": region, "bucket": "shiplift-test-artifacts", "key_prefix": "shiplift",
            "execution_role_arn": f"arn:aws:iam::{ACCOUNT}:role/shiplift-sagemaker-execution",
            "ecr_repository": "shiplift/semif", "codebuild_project": "shiplift-semif-image",
            "codebuild_role_arn": f"arn:aws:iam::{ACCOUNT}:role/shiplift-codebuild",
            "ledger_url": f"sqlite:///{Path(state_dir) / 'ledger.db'}", "state_dir": str(state_dir), "poll_s": 0.05}


def chat_config(*overrides: str, **backend):
    """configs/releases/gemma-chat.yaml as an aws config."""
    return load_release_config(CHAT, overrides=(f"backend={json.dumps(aws_backend(**backend))}", *overrides),
                               environ={})


def resolve(config, tmp_path: Path, said: list[str] | None = None):
    """The aws image builder on the config's image (what the image stage runs)."""
    images = aws_backends(config, state_dir=tmp_path)["images"]
    return images.build(config.image, progress=(said.append if said is not None else QUIET))


def dlc_needs(config, service: str, operation: str, params: dict):
    """What IAM evaluates for one request, from the reference alone: a request naming another registry (registryId)
    is evaluated on that account's repository."""
    own = account_of(config)
    account = Account(own.values["Partition"], own.values["Region"], params.get("registryId", own.values["Account"]),
                      own.kms_aliases)
    return [*(need for action in actions_for(service, operation, params)
              for need in evaluated(account, service, operation, params, action)),
            *sse_kms(account, service, operation, params)]


def assert_dlc_environment(environment: dict, config, *, ctx_size: str) -> None:
    """The container gets the image's SM_LLAMA_CPP_* options and nothing else (no other server's variables) but the
    serving id every copy carries for attribution (SHIPLIFT_SERVING_ID: the DLC ignores it)."""
    environment = {name: value for name, value in environment.items() if name != "SHIPLIFT_SERVING_ID"}
    assert environment == config.image.container_env() and environment["SM_LLAMA_CPP_CTX_SIZE"] == ctx_size
    assert all(name.startswith("SM_LLAMA_CPP_") for name in environment), environment
    assert (environment["SM_LLAMA_CPP_THREADS"], environment["SM_LLAMA_CPP_N_GPU_LAYERS"]) == ("2", "0")


def denied(config, requests) -> list[str]:
    policy = pipeline_policy(config)
    return [f"{service} {operation}: {need}" for service, operation, params in requests
            for need in dlc_needs(config, service, operation, params) if not allowed(policy, need)]


# -- the tag resolved to a digest ---------------------------------------------------------------------------------

def test_the_tag_is_resolved_to_its_digest_with_one_request_and_a_pin_that_matches_is_kept(aws, aws_calls, tmp_path):
    digest = aws.publish_image(DLC_ACCOUNT, "llama-cpp", CPU_TAG, kind="dlc-chat")
    said: list[str] = []
    ref = resolve(chat_config(), tmp_path, said)
    assert (ref.uri, ref.digest, ref.base_image) == (f"{DLC}@{digest}", digest, f"{DLC}:{CPU_TAG}")
    assert (ref.name, ref.files, ref.source_sha256) == ("dlc-chat", 0, None)
    assert [(service, operation) for service, operation,
            _ in aws_calls] == [("ecr", "BatchGetImage")], "no build, no upload"
    params = aws_calls[0][2]
    assert (params["registryId"], params["repositoryName"], params["imageIds"]) == (DLC_ACCOUNT, "llama-cpp",
                                                                                    [{"imageTag": CPU_TAG}])
    assert "application/vnd.oci.image.index.v1+json" in params["acceptedMediaTypes"], \
        "a multi-arch index is returned as stored"
    assert said == [f"image: {DLC}:{CPU_TAG} is {DLC}@{digest}"]

    pinned = resolve(chat_config(f"image.digest={digest}"), tmp_path)
    assert pinned == ref


def test_a_pinned_digest_the_tag_no_longer_names_stops_the_release_before_anything_is_deployed(
        aws, aws_calls, aws_release, tiny_release, tmp_path):
    aws_release.prepare_account(aws)
    reviewed = aws.publish_image(DLC_ACCOUNT, "llama-cpp", CPU_TAG, kind="dlc-chat")
    moved = aws.publish_image(DLC_ACCOUNT, "llama-cpp", CPU_TAG, kind="dlc-chat", content="a later DLC build")
    assert moved != reviewed
    path = chat_release(tiny_release, tmp_path, image__digest=reviewed)
    with pytest.raises(IntegrityError, match="the tag moved") as raised:
        run_release(path, progress=QUIET)
    assert reviewed in str(raised.value) and moved in str(raised.value) and "update image.digest" in str(raised.value)
    assert "CreateModel" not in [call.operation for call in aws.calls], "nothing was deployed"
    assert not [call for call in aws_calls if call[0] in ("sagemaker", "codebuild")]
    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    [release] = {record.release_id for record in ledger.history()}
    assert ReleaseState.load(ledger, release).status == "failed"


def test_an_unknown_tag_an_unpublished_repository_and_a_denied_read_are_said_with_their_fix(aws, tmp_path):
    with pytest.raises(NotFound, match="has no repository llama-cpp in us-east-1"):
        resolve(chat_config(), tmp_path)
    aws.publish_image(DLC_ACCOUNT, "llama-cpp", CPU_TAG)
    with pytest.raises(NotFound, match="has no tag server-sagemaker-cuda-v1") as raised:
        resolve(chat_config("image.tag=server-sagemaker-cuda-v1", f"placement={json.dumps(GPU)}"), tmp_path)
    assert "ImageNotFound" in str(raised.value) and "set image.tag" in raised.value.fix
    aws.reset()
    aws.publish_image(DLC_ACCOUNT, "llama-cpp", CPU_TAG, pull_policy=False)  # a repository other accounts may not read
    with pytest.raises(ConfigError, match="may not read the published image") as denied_read:
        resolve(chat_config(), tmp_path)
    assert denied_read.value.fix == f"grant it ecr:BatchGetImage on {DLC_ARN} (`shiplift iam` writes that statement)"


# -- a whole release on the double ---------------------------------------------------------------------------------

def chat_release(tiny_release, tmp_path: Path, **changes) -> Path:
    """The tiny chat release (tests/tiny_release.py, gemma-chat.yaml with a tiny GGUF) on the double's account."""
    path = tiny_release.write_tiny_chat_config(tmp_path / "configs", tmp_path / "state", **changes)
    tree = yaml.safe_load(path.read_text())
    tree["backend"] = aws_backend(tmp_path / "state")
    path.write_text(yaml.safe_dump(tree))
    return path


def test_a_chat_candidate_is_the_dlc_by_digest_with_its_server_options_and_answers_chat(
        aws, aws_calls, aws_release, tiny_release, tmp_path):
    """The stages up to the deployed candidate (the gate is the family's, the same as on the local backend)."""
    aws_release.prepare_account(aws)
    digest = aws.publish_image(DLC_ACCOUNT, "llama-cpp", CPU_TAG, kind="dlc-chat")
    path = chat_release(tiny_release, tmp_path)
    begun = begin_orchestrated(path, holder="test", progress=QUIET)

    def run(stage):
        return run_orchestrated_stage(begun["release_id"], stage, ledger_url=begun["ledger_url"], progress=QUIET)

    for stage in ("resolve", "build", "package", "image"):
        run(stage)
    deployed = run("deploy_candidate")
    [model] = [call.params for call in aws.calls if call.operation == "CreateModel"]
    assert model["PrimaryContainer"]["Image"] == f"{DLC}@{digest}", "the digest, never the tag"
    assert_dlc_environment(model["PrimaryContainer"]["Environment"], load_release_config(path), ctx_size="1024")
    assert model["EnableNetworkIsolation"] is True
    state = ReleaseState.load(Ledger(begun["ledger_url"]), begun["release_id"])
    assert state.result("image").image_uri == f"{DLC}@{digest}"
    assert state.result("image").base_image == f"{DLC}:{CPU_TAG}", "the ledger records the tag it was resolved from"
    answer = aws.client("sagemaker-runtime").invoke_endpoint(  # a single-model candidate: no component name
        EndpointName=deployed["endpoint"], ContentType="application/json",
        Body=json.dumps({"messages": [{"role": "user", "content": "Say A or B."}], "max_tokens": 1}))
    chat = json.loads(answer["Body"].read())
    assert chat["object"] == "chat.completion" and chat["model"].endswith(".gguf"), "the DLC names the GGUF it serves"
    assert not [call for call in aws_calls if call[0] == "codebuild" or call[1] == "DescribeRepositories"]
    assert {(service, operation) for service, operation, _ in aws_calls} <= set(OPERATIONS)
    assert denied(load_release_config(path), aws_calls) == [], "the pipeline policy allows every call sent"
    run("teardown_candidate")


# -- the dry run -----------------------------------------------------------------------------------------------------

def test_the_dry_run_plans_one_batch_get_image_no_build_and_the_dlc_environment():
    lines, stderr = dry_run("configs/releases/gemma-chat.yaml", f"backend={json.dumps(aws_backend())}")
    assert "nothing was sent" in stderr
    assert_valid(lines)
    assert operations(lines, "image") == ["BatchGetImage"]
    assert not [line for line in lines if line["service"] == "codebuild" or line["operation"] == "DescribeRepositories"]
    [resolved] = [line for line in lines if line["stage"] == "image"]
    assert resolved["params"]["registryId"] == DLC_ACCOUNT and resolved["params"]["imageIds"] == [{"imageTag": CPU_TAG}]
    assert f"{DLC}:{CPU_TAG}" in resolved["note"]
    for model in [line for line in lines if line["operation"] == "CreateModel"]:
        assert model["params"]["PrimaryContainer"]["Image"].startswith(f"{DLC}@sha256:")
        assert "BatchGetImage" in model["placeholders"]["PrimaryContainer.Image"]
        assert_dlc_environment(model["params"]["PrimaryContainer"]["Environment"], chat_config(), ctx_size="2048")
        assert model["params"]["EnableNetworkIsolation"] is True
    components = [line for line in lines if line["operation"] == "CreateInferenceComponent"]
    assert components and all(line["params"]["Specification"]["ModelName"] for line in components)


def test_a_pinned_digest_is_what_the_dry_run_deploys_in_any_region():
    pin = "sha256:" + "ab" * 32
    config = chat_config(f"image.digest={pin}", region="eu-south-1")  # the DLC's registry there is 692866216735
    planned = plan_release(config, config_path=CHAT)
    [resolved] = [r for r in planned if r.stage == "image"]
    assert resolved.params["registryId"] == "692866216735" and "must still be the pinned image.digest" in resolved.note
    images = {r.params["PrimaryContainer"]["Image"] for r in planned if r.operation == "CreateModel"}
    assert images == {f"692866216735.dkr.ecr.eu-south-1.amazonaws.com/llama-cpp@{pin}"}
    assert not [r for r in planned if r.operation == "CreateModel" and "PrimaryContainer.Image" in r.placeholders]


# -- IAM -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_champion", [False, True])
def test_every_dry_run_request_of_a_chat_release_is_allowed_and_nothing_builds(with_champion):
    config = chat_config()
    planned = plan_release(config, config_path=CHAT, with_champion=with_champion)
    assert {(r.service, r.operation) for r in planned} <= set(OPERATIONS)
    assert denied(config, [(r.service, r.operation, r.params) for r in planned]) == []
    assert sorted(policies(config)) == ["pipeline-policy.json", "sagemaker-execution-policy.json",
                                        "sagemaker-execution-trust.json"], "no CodeBuild role: nothing is built"
    for policy in policies(config).values():
        if "Resource" in json.dumps(policy):
            assert only_on_star_what_the_reference_cannot_scope(policy) == []
            assert conditions_the_reference_lacks(policy) == []
            assert all(privilege(action) for s in policy["Statement"] for action in s["Action"]), "every action exists"
    pipeline = pipeline_policy(config)
    granted = {action for statement in pipeline["Statement"] for action in statement["Action"]}
    assert not {a for a in granted if a.startswith("codebuild:")} and not {"ecr:DescribeImages",
                                                                           "ecr:DescribeRepositories"} & granted
    assert [s["Resource"] for s in pipeline["Statement"] if "ecr:BatchGetImage" in s["Action"]] == [[DLC_ARN]]
    passed = [s["Condition"]["StringEquals"]["iam:PassedToService"] for s in pipeline["Statement"]
              if s["Action"] == ["iam:PassRole"]]
    assert passed == ["sagemaker.amazonaws.com"]


def test_the_execution_role_pulls_the_dlc_and_nothing_else():
    config = chat_config()
    statements = {s["Sid"]: s for s in execution_role_policy(config)["Statement"]}
    assert statements["PullServingImage"]["Resource"] == [DLC_ARN]
    assert {"ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"} <= set(statements["PullServingImage"]["Action"])
    assert statements["EcrLogin"] == {"Sid": "EcrLogin", "Effect": "Allow", "Action": ["ecr:GetAuthorizationToken"],
                                      "Resource": ["*"]}
    account = dlc_needs(config, "ecr", "GetDownloadUrlForLayer",
                        {"registryId": DLC_ACCOUNT, "repositoryName": "llama-cpp"})
    policy = execution_role_policy(config)
    assert account and all(allowed(policy, need) for need in account), "the reference's ARN of the DLC's repository"
    other = dlc_needs(config, "ecr", "BatchGetImage", {"registryId": ACCOUNT, "repositoryName": "shiplift/semif"})
    assert not any(allowed(policy, need) for need in other), "not the config's own repository: nothing is pushed there"


def test_the_chat_policies_pass_parliament_and_shiplift_iam_writes_them(tmp_path):
    parliament = _parliament()
    config = chat_config()
    for name, policy in policies(config).items():
        if "trust" not in name:
            findings = parliament.analyze_policy_string(json.dumps(policy)).findings
            serious = [(f.issue, f.detail) for f in findings if f.severity not in ("LOW", "INFO", "MUTE")
                       and not _resource_alias_condition(f)]
            assert serious == [], (name, serious)
    assert main(["iam", str(CHAT), "--set", f"backend={json.dumps(aws_backend())}", "--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(policies(config))
    assert json.loads((tmp_path / "pipeline-policy.json").read_text()) == pipeline_policy(config)


# -- the config ------------------------------------------------------------------------------------------------------

def test_a_model_the_dlc_would_download_is_refused_at_load():
    with pytest.raises(ConfigError, match="network isolation"):
        chat_config("image.server.hf_repo=ggml-org/gemma-3-270m-GGUF")
