"""Contract tests of the local stand-in of the llama.cpp DLC's default chat path (DESIGN §6.2).

Real processes only: `python images/dlc-chat/server.py` (the front) and its child,
llama-cpp-python's OpenAI-compatible server, on tiny random GGUF models. Two servers run for
the whole module (the main one, and a template-less GGUF served with SM_LLAMA_CPP_CHAT_TEMPLATE
from a model directory); refusals are runs to exit.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from shiplift.tasks.artifacts.tiny_gguf import CHAT_TEMPLATES, write_tiny_gguf
from tests.contract.conftest import (
    REPO,
    Reply,
    ServerProcess,
    non_stdlib_imports,
    run_server_to_exit,
    start_server_process,
)

DLC_SERVER = REPO / "images" / "dlc-chat" / "server.py"
PREFIX = "DLC_CHAT"
CTX_SIZE = 1024
MAX_BODY_BYTES = 16384
HELLO = [{"role": "user", "content": "Which letter is the answer?"}]
LONG_TEXT = "the answer " * 120  # about 300 tokens: leaves room for 200 generated ones in CTX_SIZE


def dlc_env(**overrides: str) -> dict[str, str]:
    """The parent environment without any DLC_CHAT_* or SM_LLAMA_CPP_* variable, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith((f"{PREFIX}_", "SM_LLAMA_CPP_"))}
    env.update(overrides)
    return env


def start_dlc(log_path: Path, env: dict[str, str], probe: Any = None) -> ServerProcess:
    return start_server_process(log_path, env, (), probe, server=DLC_SERVER, prefix=PREFIX)


def refusal(env: dict[str, str]):
    return run_server_to_exit(env, server=DLC_SERVER, prefix=PREFIX, timeout=60)


def assert_error(reply: Reply, status: int, *needles: str) -> None:
    """The reply has `status`, a JSON {"error": "..."} body, and mentions every needle."""
    assert reply.status == status, (reply.status, reply.body)
    assert isinstance(reply.body, dict) and isinstance(reply.body.get("error"), str), reply.body
    for needle in needles:
        assert needle in reply.body["error"], (needle, reply.body["error"])


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": HELLO, "max_tokens": 1, **fields}


# ---------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """chat: a tiny GGUF with a chat template; plain: the same without one; text: not a GGUF at all;
    broken: a GGUF whose header is whole but whose tensors are cut off (llama.cpp cannot load it)."""
    folder = tmp_path_factory.mktemp("dlc-models")
    chat_gguf = write_tiny_gguf(folder / "chat.gguf", seed=0, chat_template=CHAT_TEMPLATES["turns"])
    plain = write_tiny_gguf(folder / "plain.gguf", seed=0)
    text = folder / "text.gguf"
    text.write_text("not a model\n")
    broken = folder / "broken.gguf"
    broken.write_bytes(chat_gguf.read_bytes()[: 200_000])
    return {"chat": chat_gguf, "plain": plain, "text": text, "broken": broken}


@pytest.fixture(scope="module")
def dlc(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Iterator[ServerProcess]:
    """The main server: context 1024, one request in flight, 16 KiB bodies; one chat request was sent
    while the child was still loading."""
    env = dlc_env(
        DLC_CHAT_GGUF_PATH=str(models["chat"]),
        DLC_CHAT_MAX_IN_FLIGHT="1",
        DLC_CHAT_MAX_BODY_BYTES=str(MAX_BODY_BYTES),
        SM_LLAMA_CPP_CTX_SIZE=str(CTX_SIZE),
        SM_LLAMA_CPP_THREADS="1",
    )
    server = start_dlc(tmp_path_factory.mktemp("dlc") / "server.log", env, probe=chat())
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dlc_gemma(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Iterator[ServerProcess]:
    """The template-less GGUF as the first *.gguf of a model directory, with SM_LLAMA_CPP_CHAT_TEMPLATE=gemma."""
    model_dir = tmp_path_factory.mktemp("dlc-gemma-model")
    shutil.copyfile(models["plain"], model_dir / "a-model.gguf")
    (model_dir / "z-not-a-model.gguf").write_text("sorts after a-model.gguf: must not be picked\n")
    env = dlc_env(
        DLC_CHAT_MODEL_DIR=str(model_dir),
        SM_LLAMA_CPP_CHAT_TEMPLATE="gemma",
        SM_LLAMA_CPP_FLASH_ATTN="auto",
        SM_LLAMA_CPP_CTX_SIZE="256",
        SM_LLAMA_CPP_THREADS="1",
    )
    server = start_dlc(tmp_path_factory.mktemp("dlc-gemma") / "server.log", env)
    yield server
    server.stop()


# ---------------------------------------------------------------------------------------
# readiness, routes, the module itself


def test_ping_is_503_loading_until_the_child_serves_then_200(dlc):
    assert dlc.ping_history[0] == (503, {"status": "loading"})
    assert all(reply == (503, {"status": "loading"}) for reply in dlc.ping_history[:-1])
    assert dlc.ping_history[-1] == (200, {"status": "ok"})
    assert_error(dlc.early_reply, 503, "loading")
    assert dlc.early_reply.body["retryable"] is True
    assert "served by llama_cpp.server" in dlc.log() and "--logits_all True" in dlc.log()


def test_unknown_routes_and_methods_get_json_errors(dlc):
    assert_error(dlc.client.request("GET", "/nope", content_type=None), 404, "/nope")
    assert_error(dlc.client.request("POST", "/v1/models", json.dumps(chat()).encode()), 404, "/v1/chat/completions")
    assert_error(dlc.client.request("GET", "/v1/chat/completions", content_type=None), 405)
    assert_error(dlc.client.request("GET", "/invocations", content_type=None), 405)


def test_server_imports_only_stdlib_and_llama_cpp():
    assert non_stdlib_imports(DLC_SERVER) <= {"sagemaker_http", "chat_templates", "llama_cpp"}


def test_options_name_real_llama_cpp_settings_and_chat_formats():
    """OPTIONS and CHAT_TEMPLATES, read from the module in a fresh interpreter (it is not a package)."""
    script = (
        "import json, runpy, sys; m = runpy.run_path(sys.argv[1]); "
        "print(json.dumps({k: m[k] for k in ('OPTIONS', 'KINDS', 'CHAT_TEMPLATES')}))"
    )
    result = subprocess.run([sys.executable, "-c", script, str(DLC_SERVER)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    tables = json.loads(result.stdout)
    from llama_cpp.llama_chat_format import get_chat_completion_handler
    from llama_cpp.server.settings import Settings

    assert tables["OPTIONS"], tables
    for name, (targets, kind) in tables["OPTIONS"].items():
        assert name.startswith("SM_LLAMA_CPP_") and kind in tables["KINDS"]
        assert set(targets) <= set(Settings.model_fields), name
    for chat_format in tables["CHAT_TEMPLATES"].values():
        assert get_chat_completion_handler(chat_format) is not None


# ---------------------------------------------------------------------------------------
# valid requests


def test_unmodified_openai_client_gets_top_logprobs(dlc):
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{dlc.client.port}/v1", api_key="unused", timeout=30)
    completion = client.chat.completions.create(
        model="chat.gguf", messages=HELLO, max_tokens=1, logprobs=True, top_logprobs=5
    )
    assert completion.object == "chat.completion"
    assert completion.model == "chat.gguf"  # the request's model name comes back
    (choice,) = completion.choices
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    (token,) = choice.logprobs.content
    assert len(token.top_logprobs) >= 5
    assert all(entry.logprob <= 0.0 and isinstance(entry.token, str) for entry in token.top_logprobs)
    assert completion.usage.completion_tokens == 1


def test_invocations_gives_the_same_shape_and_the_gguf_path_as_model(dlc, models):
    reply = dlc.client.invoke(chat(logprobs=True, top_logprobs=5, temperature=0))
    assert reply.status == 200, reply.body
    body = reply.body
    assert body["object"] == "chat.completion"
    assert body["model"] == str(models["chat"])  # no model named: the child reports the GGUF path
    (choice,) = body["choices"]
    (token,) = choice["logprobs"]["content"]
    assert len(token["top_logprobs"]) >= 5
    assert set(body["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    again = json.dumps(chat(logprobs=True, top_logprobs=5, temperature=0)).encode()
    same = dlc.client.request("POST", "/v1/chat/completions", again)
    assert same.status == 200 and same.body["choices"][0]["logprobs"] == choice["logprobs"]


# ---------------------------------------------------------------------------------------
# bad input: a 4xx JSON error naming the problem, never forwarded


@pytest.mark.parametrize(
    "body, needles",
    [
        (chat(stream="yes"), ("stream", "must be true or false")),
        (chat(n=2), ("n:", "must be 1")),
        (chat(tools=[]), ("tools", "unknown top-level key")),
        ({"max_tokens": 1}, ("messages", "required")),
        (chat(messages=[]), ("messages", "1 to 256")),
        (chat(messages="hi"), ("messages", "array")),
        (chat(messages=[{"role": "user", "content": "x"}] * 257), ("messages", "1 to 256")),
        (chat(messages=[{"role": "robot", "content": "x"}]), ("messages[0].role", "system, user, assistant")),
        (chat(messages=[{"role": "user"}]), ("messages[0].content", "required")),
        (chat(messages=[{"role": "user", "content": "x", "name": "a"}]), ("messages[0].name", "unknown key")),
        (chat(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}]}]),
         ("messages[0].content", "string")),
        (chat(messages=["hi"]), ("messages[0]", "object")),
        (chat(max_tokens=CTX_SIZE + 1), ("max_tokens", str(CTX_SIZE), "SM_LLAMA_CPP_CTX_SIZE")),
        (chat(max_tokens=0), ("max_tokens",)),
        (chat(max_tokens=1.5), ("max_tokens", "integer")),
        (chat(logprobs=True, top_logprobs=21), ("top_logprobs", "[0, 20]")),
        (chat(top_logprobs=5), ("top_logprobs", "logprobs true")),
        (chat(logprobs="yes"), ("logprobs", "true or false")),
        (chat(temperature=float("nan")), ("temperature", "finite")),
        (chat(temperature="hot"), ("temperature", "number")),
        (chat(top_p=1.5), ("top_p", "[0, 1]")),
        (chat(stop=["a", "b", "c", "d", "e"]), ("stop", "at most 4")),
        (chat(seed=-1), ("seed",)),
        (chat(response_format={"type": "json_schema"}), ("response_format.type",)),
        ([chat()], ("body", "JSON object")),
    ],
    ids=lambda value: None if isinstance(value, (dict, list)) else value[0],
)
def test_bad_bodies_are_400_naming_the_field(dlc, body, needles):
    assert_error(dlc.client.invoke(body), 400, *needles)


def test_protocol_faults_are_json_errors(dlc):
    assert_error(dlc.client.request("POST", "/invocations", b"{not json"), 400, "body", "valid JSON")
    assert_error(dlc.client.request("POST", "/invocations", b'{"messages": [], "messages": []}'), 400, "duplicate")
    text_plain = dlc.client.request("POST", "/invocations", json.dumps(chat()).encode(), "text/plain")
    assert_error(text_plain, 415, "Content-Type")
    assert_error(dlc.client.request("POST", "/invocations", b""), 400, "body", "messages")
    oversize = json.dumps(chat(messages=[{"role": "user", "content": "x" * MAX_BODY_BYTES}])).encode()
    assert_error(dlc.client.request("POST", "/invocations", oversize), 413, "DLC_CHAT_MAX_BODY_BYTES")


def test_prompt_longer_than_the_context_is_400_with_the_child_message(dlc):
    body = chat(messages=[{"role": "user", "content": "the answer " * 600}])  # about 1,200 tokens
    assert len(json.dumps(body)) < MAX_BODY_BYTES
    reply = dlc.client.invoke(body)
    assert_error(reply, 400, "maximum context length is 1024 tokens")
    assert_error(dlc.client.request("POST", "/v1/chat/completions", json.dumps(body).encode()), 400, "1024")


# ---------------------------------------------------------------------------------------
# admission


def test_a_second_request_while_one_is_in_flight_gets_503_retryable(dlc):
    slow = chat(messages=[{"role": "user", "content": LONG_TEXT}], max_tokens=200, temperature=0)
    outcome: dict[str, Reply] = {}
    done = threading.Event()

    def send_slow() -> None:  # retried while one of the probes below holds the only slot
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                reply = dlc.client.invoke(slow)
                if reply.status != 503:
                    outcome["slow"] = reply
                    return
        finally:
            done.set()

    thread = threading.Thread(target=send_slow)
    thread.start()
    refused = None
    try:
        while not done.is_set():  # handshake: probe until the server says it is full
            reply = dlc.client.invoke(chat())
            if reply.status == 503:
                refused = reply
                break
    finally:
        thread.join(timeout=60)
    assert refused is not None, f"no probe was refused while the slow request ran: {outcome}"
    assert_error(refused, 503, "DLC_CHAT_MAX_IN_FLIGHT")
    assert refused.body["retryable"] is True
    assert outcome["slow"].status == 200, outcome["slow"].body
    assert outcome["slow"].body["usage"]["completion_tokens"] >= 2
    assert dlc.client.invoke(chat()).status == 200  # the slot is free again


# ---------------------------------------------------------------------------------------
# start-up refusals


@pytest.mark.parametrize(
    "case, code, needles",
    [
        ("unknown option", 2, ("SM_LLAMA_CPP_FOO", "not supported", "SM_LLAMA_CPP_CTX_SIZE")),
        ("ctx not an integer", 2, ("SM_LLAMA_CPP_CTX_SIZE='abc'", "an integer")),
        ("gpu layers too low", 2, ("SM_LLAMA_CPP_N_GPU_LAYERS", "[-1,")),
        ("unknown template", 2, ("SM_LLAMA_CPP_CHAT_TEMPLATE", "chatml")),
        ("flash attn", 2, ("SM_LLAMA_CPP_FLASH_ATTN", "on, off, auto")),
        ("hf repo", 2, ("SM_LLAMA_CPP_HF_REPO", "never uses the network", "EnableNetworkIsolation")),
        ("not gguf", 2, ("text.gguf", "not a GGUF file")),
        ("empty model dir", 2, ("no *.gguf", "DLC_CHAT_MODEL_DIR")),
        ("bad timeout", 2, ("DLC_CHAT_REQUEST_TIMEOUT_S",)),
        ("no chat template", 3,
         ("tokenizer.chat_template", "SM_LLAMA_CPP_CHAT_TEMPLATE", "image.server.chat_template", "gemma")),
        ("child fails to load", 3, ("llama_cpp.server exited with code", "last output")),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_start_up_refusals(case, code, needles, models, tmp_path):
    chat_model = {"DLC_CHAT_GGUF_PATH": str(models["chat"])}
    env = {
        "unknown option": {**chat_model, "SM_LLAMA_CPP_FOO": "1"},
        "ctx not an integer": {**chat_model, "SM_LLAMA_CPP_CTX_SIZE": "abc"},
        "gpu layers too low": {**chat_model, "SM_LLAMA_CPP_N_GPU_LAYERS": "-2"},
        "unknown template": {**chat_model, "SM_LLAMA_CPP_CHAT_TEMPLATE": "gemma3"},
        "flash attn": {**chat_model, "SM_LLAMA_CPP_FLASH_ATTN": "maybe"},
        "hf repo": {**chat_model, "SM_LLAMA_CPP_HF_REPO": "org/model", "SM_LLAMA_CPP_HF_FILE": "m.gguf"},
        "not gguf": {"DLC_CHAT_GGUF_PATH": str(models["text"])},
        "empty model dir": {"DLC_CHAT_MODEL_DIR": str(tmp_path)},
        "bad timeout": {**chat_model, "DLC_CHAT_REQUEST_TIMEOUT_S": "soon"},
        "no chat template": {"DLC_CHAT_GGUF_PATH": str(models["plain"])},
        "child fails to load": {"DLC_CHAT_GGUF_PATH": str(models["broken"]), "SM_LLAMA_CPP_THREADS": "1"},
    }[case]
    result = refusal(dlc_env(**env))
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "dlc-chat: refusing to start:" in result.stderr, result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


# ---------------------------------------------------------------------------------------
# the template-less model with SM_LLAMA_CPP_CHAT_TEMPLATE, child death, SIGTERM


def test_template_less_gguf_serves_with_chat_template_gemma(dlc_gemma):
    log = dlc_gemma.log()
    assert "a-model.gguf" in log and "z-not-a-model" not in log.split("listening on", 1)[1].split("\n", 1)[0]
    assert "--chat_format gemma" in log and "--flash_attn False" in log
    assert "SM_LLAMA_CPP_FLASH_ATTN=auto" in log and "turns flash attention off" in log
    reply = dlc_gemma.client.invoke(chat(logprobs=True, top_logprobs=3))
    assert reply.status == 200, reply.body
    assert reply.body["model"].endswith("a-model.gguf")
    assert len(reply.body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) >= 3


def test_sigterm_stops_the_front_and_the_child(dlc_gemma):
    front = psutil.Process(dlc_gemma.proc.pid)
    children = front.children(recursive=True)
    assert any("llama_cpp.server" in " ".join(child.cmdline()) for child in children), children
    dlc_gemma.proc.send_signal(signal.SIGTERM)
    assert dlc_gemma.proc.wait(timeout=20) == 0, dlc_gemma.log()
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive


def test_a_slow_answer_is_504_retryable_and_a_child_that_dies_stops_the_front_with_exit_3(tmp_path, models):
    env = dlc_env(
        DLC_CHAT_GGUF_PATH=str(models["chat"]),
        DLC_CHAT_REQUEST_TIMEOUT_S="0.001",
        SM_LLAMA_CPP_CTX_SIZE="512",
        SM_LLAMA_CPP_THREADS="1",
    )
    server = start_dlc(tmp_path / "server.log", env)
    try:
        reply = server.client.invoke(chat(messages=[{"role": "user", "content": LONG_TEXT}], max_tokens=100))
        assert_error(reply, 504, "DLC_CHAT_REQUEST_TIMEOUT_S")
        assert reply.body["retryable"] is True
        children = psutil.Process(server.proc.pid).children()
        (child,) = [c for c in children if "llama_cpp.server" in " ".join(c.cmdline())]
        child.kill()
        assert server.proc.wait(timeout=20) == 3, server.log()
        assert "dlc-chat: stopping: llama_cpp.server" in server.log() and "exited with code -9" in server.log()
    finally:
        server.stop()
