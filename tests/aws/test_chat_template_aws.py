"""A chat release on aws of a GGUF without `tokenizer.chat_template`: the build infers the template from its
`general.architecture` with the function the local stand-in uses (`images.common.chat_templates`), records it and where
it came from (the build record, the package's manifest), and the endpoint's container gets it as
SM_LLAMA_CPP_CHAT_TEMPLATE, since the DLC's llama-server would otherwise format Gemma's turns as ChatML. A GGUF whose
architecture implies none is refused naming it and the config key. The stages run on the AWS double up to the image;
the component they deploy is `component_spec`'s (its GGUF is a tiny llama relabelled gemma3: no server can run it)."""

from __future__ import annotations

import io
import json
import tarfile

import pytest
import yaml

from shiplift.images.common.chat_templates import inferred_template
from shiplift.tasks.artifacts.packaging import MANIFEST_NAME
from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.hashing import sha256_file
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import begin_orchestrated, reopen_release, run_orchestrated_stage
from shiplift.tasks.pipeline.stages.common import component_spec
from tests.aws.test_dlc_chat_aws import CPU_TAG, DLC_ACCOUNT, QUIET, chat_release


def release_of(tiny_release, tmp_path, architecture: str) -> dict:
    """The tiny chat release on the double, its GGUF a template-less tiny model whose header says `architecture`,
    begun."""
    gguf = write_tiny_gguf(tmp_path / f"{architecture}.gguf", seed=3, letters_first=True, architecture=architecture)
    path = chat_release(tiny_release, tmp_path)
    tree = yaml.safe_load(path.read_text())
    tree["artifact"]["source"] = {"kind": "path", "path": gguf.name, "sha256": sha256_file(gguf)}
    (tmp_path / "configs" / gguf.name).write_bytes(gguf.read_bytes())
    path.write_text(yaml.safe_dump(tree))
    return begin_orchestrated(path, holder="test", progress=QUIET)


def run(begun: dict, *stages: str) -> None:
    for stage in stages:
        run_orchestrated_stage(begun["release_id"], stage, ledger_url=begun["ledger_url"], progress=QUIET)


def test_the_template_a_gemma_architecture_implies_reaches_the_endpoints_environment(aws, aws_release, tiny_release,
                                                                                      tmp_path):
    aws_release.prepare_account(aws)
    aws.publish_image(DLC_ACCOUNT, "llama-cpp", CPU_TAG, kind="dlc-chat")
    begun = release_of(tiny_release, tmp_path, "gemma3")
    run(begun, "resolve", "build", "package", "image")
    state = ReleaseState.load(Ledger(begun["ledger_url"]), begun["release_id"])
    build = state.result("build")
    assert build.info["has_chat_template"] is False and build.info["architecture"] == "gemma3"
    assert build.chat_template == {"name": "gemma", "from": "general.architecture gemma3"}
    assert build.container_env == {"SM_LLAMA_CPP_CHAT_TEMPLATE": "gemma"}
    bucket, key = state.result("package").artifact_uri.removeprefix("s3://").split("/", 1)
    stored = aws.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(stored)) as tar:
        manifest = json.load(tar.extractfile(MANIFEST_NAME))
    assert manifest["build"]["chat_template"] == {"name": "gemma", "from": "general.architecture gemma3"}
    ctx = reopen_release(begun["release_id"], ledger_url=begun["ledger_url"], actor="test", progress=QUIET)
    environment = component_spec(ctx, ctx.config, copies=1).environment
    assert environment == {**ctx.config.image.container_env(), "SM_LLAMA_CPP_CHAT_TEMPLATE": "gemma"}


def test_an_architecture_that_implies_no_template_is_refused_at_build_naming_it(aws, aws_release, tiny_release,
                                                                                tmp_path):
    aws_release.prepare_account(aws)
    begun = release_of(tiny_release, tmp_path, "llama")  # Llama 2's SentencePiece vocabulary: its format is not guessed
    run(begun, "resolve")
    with pytest.raises(ConfigError) as refused:
        run(begun, "build")
    assert "general.architecture (llama, tokenizer llama) implies none" in str(refused.value)
    assert "set image.server.chat_template" in refused.value.fix


@pytest.mark.parametrize("architecture, vocabulary, template", [
    ("gemma", "llama", "gemma"), ("gemma3", "llama", "gemma"), ("qwen3", "gpt2", "chatml"), ("llama", "gpt2", "llama3"),
    ("llama", "llama", None), ("phi3", "llama", None)])
def test_the_inference_table(architecture, vocabulary, template):
    """The shared table (the stand-in's own tests run it through its start-up: tests/unit/test_dlc_chat_template.py)."""
    assert inferred_template({"general.architecture": architecture, "tokenizer.ggml.model": vocabulary}) == template
