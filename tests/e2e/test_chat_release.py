"""Issue 19 end to end on the local backend: a GGUF released on the DLC's default chat path.

The tiny GGUF carries a chat template and leans to the answer letters (`write_tiny_gguf(letters_first=True)`), so the
chat readout sees every letter among the top log-probabilities; the stand-in of the DLC (`images/dlc-chat`) serves it
with the real llama-cpp-python server. The release is gated by the chat readout, promoted, and then answers an
unmodified boto3 `sagemaker-runtime` client through the local router (with and without the component name) and an
unmodified `openai` client at the copy itself.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import run_release
from tests.tiny_release import stop_endpoints, write_tiny_chat_config

QUIET = lambda message: None  # noqa: E731
CHAT = {"messages": [{"role": "user", "content": "Pick A or B."}], "max_tokens": 1, "temperature": 0,
        "logprobs": True, "top_logprobs": 5}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    root = tmp_path_factory.mktemp("chat")
    config = write_tiny_chat_config(root / "configs", root / "state")
    summary = run_release(config, progress=QUIET)
    yield {"summary": summary, "state_dir": root / "state", "config": config}
    stop_endpoints(root / "state")


def test_a_chat_release_is_gated_by_the_chat_readout_and_promoted(released):
    summary, state_dir = released["summary"], released["state_dir"]
    assert summary["status"] == "promoted", summary
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    state = ReleaseState.load(ledger, summary["release_id"])
    image = state.result("image")
    assert image.image_uri.startswith("local/dlc-chat@sha256:")
    assert image.base_image == "llama-cpp:server-sagemaker-cpu-v1"
    built = state.result("build")
    report = json.loads(Path(summary["report"]).with_name("gate-report.json").read_text())
    readout = report["metrics"]["readout"]
    assert readout["name"] == "chat" and readout["answered"] == report["metrics"]["n"] == 32
    assert readout["missing_letter_share"] == 0.0 and 0.0 <= readout["non_letter_generated_share"] <= 1.0
    rows = [json.loads(line)
            for line in Path(summary["report"]).with_name("predictions.jsonl").read_text().splitlines()]
    # the DLC reports the model file it serves, which the package names by its sha256: the answer says which model
    assert {row["model_sha256"] for row in rows} == {built.model_sha256}
    assert all(row["generated_token"] is not None and row["missing_letters"] == [] for row in rows)
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-6 for row in rows)
    assert ledger.verify().ok


def test_boto3_sagemaker_runtime_sends_a_chat_body_through_the_router(released):
    import boto3
    from botocore.config import Config

    hosting = ProcessSupervisor(released["state_dir"])
    [endpoint] = [e for e in hosting.list_endpoints() if e["name"].endswith("-prod")]
    client = boto3.client("sagemaker-runtime", endpoint_url=endpoint["url"].split("/endpoints/")[0],
                          region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x",
                          config=Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=60))
    [component] = hosting.describe_endpoint(endpoint["name"])["components"]
    for extra in ({}, {"InferenceComponentName": component}):
        response = client.invoke_endpoint(EndpointName=endpoint["name"], Body=json.dumps(CHAT),
                                          ContentType="application/json", **extra)
        answer = json.loads(response["Body"].read())
        [choice] = answer["choices"]
        assert choice["message"]["role"] == "assistant"
        assert len(choice["logprobs"]["content"][0]["top_logprobs"]) >= 5
        assert answer["model"].endswith(".gguf")


def test_an_unmodified_openai_client_talks_to_the_copy(released):
    import openai

    hosting = ProcessSupervisor(released["state_dir"])
    [endpoint] = [e for e in hosting.list_endpoints() if e["name"].endswith("-prod")]
    [component] = hosting.describe_endpoint(endpoint["name"])["components"].values()
    copy_url = component["copies"][0]["url"]
    client = openai.OpenAI(base_url=f"{copy_url}/v1", api_key="unused", timeout=60, max_retries=0)
    reply = client.chat.completions.create(model="any", messages=CHAT["messages"], max_tokens=1, temperature=0,
                                           logprobs=True, top_logprobs=5)
    assert reply.choices[0].logprobs.content[0].top_logprobs and reply.usage.completion_tokens == 1


def test_eval_chat_scores_a_live_chat_endpoint_and_reports_what_the_readout_lost(released, tmp_path):
    import subprocess
    import sys

    import yaml

    hosting = ProcessSupervisor(released["state_dir"])
    [endpoint] = [e for e in hosting.list_endpoints() if e["name"].endswith("-prod")]
    data = yaml.safe_load(released["config"].read_text())["validation"]["datasets"][0]["path"]
    command = [sys.executable, "-m", "shiplift.tasks.cli.main", "eval", "chat", "--endpoint", endpoint["url"],
               "--data", data,
               "--out", str(tmp_path / "eval"), "--shots", "1", "--bootstrap", "100", "--min-validity", "0", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:]
    summary = json.loads(done.stdout)
    assert summary["n"] == 32 and summary["readout"]["shots"] == 1 and summary["readout"]["answered"] == 32
    sent = json.loads((tmp_path / "eval" / "predictions.jsonl").read_text().splitlines()[0])
    assert sent["generated_token"] is not None
    assert summary["validity"]["value"] == 1 - summary["readout"]["missing_letter_share"]  # a missing letter is invalid
    refused = subprocess.run([*command, "--shots", "9"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--shots 9 is outside 0..3" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_serve_chat_refuses_a_missing_model_file_without_a_traceback(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "serve", "chat", "--gguf",
                           str(tmp_path / "no.gguf")], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "does not exist" in done.stderr and "Traceback" not in done.stderr


def test_a_gguf_without_a_chat_template_is_refused_at_build_unless_the_config_names_one(tmp_path):
    """The chat path formats messages with the GGUF's template; without one llama.cpp falls back to a format the
    model never saw, so the build refuses it with the fix (and nothing is deployed)."""
    import yaml

    from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
    from shiplift.tasks.errors import ConfigError
    from shiplift.tasks.hashing import sha256_file

    config = write_tiny_chat_config(tmp_path / "configs", tmp_path / "state", name="bare-chat")
    bare = write_tiny_gguf(tmp_path / "bare.gguf", seed=1)
    tree = yaml.safe_load(config.read_text())
    tree["artifact"]["source"] = {"kind": "path", "path": str(bare), "sha256": sha256_file(bare)}
    config.write_text(yaml.safe_dump(tree))
    with pytest.raises(ConfigError) as refused:
        run_release(config, progress=QUIET)
    assert "has no tokenizer.chat_template" in str(refused.value) and "image.server.chat_template" in refused.value.fix
    assert ProcessSupervisor(tmp_path / "state").list_endpoints() == []
