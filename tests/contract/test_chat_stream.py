"""Streamed chat completions (`stream: true`) on the local chat path: the dlc-chat front passes llama-cpp-python's
server-sent events through as they come, with the same request checks as a whole answer, and the local router passes
them through from a chat component's `/v1/chat/completions`; the unmodified `openai` client reads both, streamed and
not. A component that is not a chat component answers that route 404 naming the routes it has. Real processes on a
tiny GGUF (tasks.artifacts.tiny_gguf)."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from shiplift.tasks.artifacts.tiny_gguf import CHAT_TEMPLATES, write_tiny_gguf
from tests.contract.conftest import ServerProcess, start_semif
from tests.contract.test_dlc_chat_contract import HELLO, dlc_env, start_dlc

ENDPOINT = "chat-ep"
SERVING_ID = "ab" * 32  # SHIPLIFT_SERVING_ID: a sha256, as the hosting sets it


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The dlc-chat front on a tiny chat GGUF, one request in flight, with a serving id."""
    folder = tmp_path_factory.mktemp("stream-model")
    gguf = write_tiny_gguf(folder / "chat.gguf", seed=0, chat_template=CHAT_TEMPLATES["turns"])
    env = dlc_env(DLC_CHAT_GGUF_PATH=str(gguf), DLC_CHAT_MAX_IN_FLIGHT="1", SM_LLAMA_CPP_CTX_SIZE="512",
                  SM_LLAMA_CPP_THREADS="1", SHIPLIFT_SERVING_ID=SERVING_ID)
    server = start_dlc(folder / "server.log", env)
    yield server
    server.stop()


def openai_client(port: int, path: str = "/v1"):
    import openai

    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}{path}", api_key="x", timeout=30, max_retries=0)


def test_the_openai_client_gets_a_streamed_completion_chunk_by_chunk(chat_server):
    chunks = list(openai_client(chat_server.client.port).chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=6, temperature=0, seed=1, stream=True))
    assert len(chunks) >= 2, "a role chunk, then the tokens, each its own event"
    assert {chunk.object for chunk in chunks} == {"chat.completion.chunk"}
    assert {chunk.system_fingerprint for chunk in chunks} == {SERVING_ID}, "every chunk says which copy answered"
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")
    whole = openai_client(chat_server.client.port).chat.completions.create(
        model="tiny", messages=HELLO, max_tokens=6, temperature=0, seed=1)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert streamed == whole.choices[0].message.content, "greedy: the stream spells the whole answer"


def raw_stream(port: int, body: dict, path: str = "/invocations") -> tuple[int, dict, list[bytes]]:
    """POST `body`; the status, headers and the answer's pieces as they were read."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        pieces = []
        while piece := response.read1(1 << 16):
            pieces.append(piece)
        return response.status, dict(response.getheaders()), pieces
    finally:
        connection.close()


def test_invocations_streams_server_sent_events_ending_with_done(chat_server):
    status, headers, pieces = raw_stream(chat_server.client.port, {"messages": HELLO, "max_tokens": 4,
                                                                   "stream": True})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert headers["Transfer-Encoding"] == "chunked"
    events = [line for line in b"".join(pieces).split(b"\n") if line.startswith(b"data: ")]
    assert events[-1].strip() == b"data: [DONE]"
    assert all(json.loads(line[6:])["object"] == "chat.completion.chunk" for line in events[:-1])


@pytest.mark.parametrize("body, needle", [
    ({"messages": HELLO, "stream": "yes"}, "stream: must be true or false"),
    ({"messages": HELLO, "stream": True, "n": 2}, "n: must be 1"),
    ({"messages": HELLO, "stream": True, "max_tokens": 100_000}, "max_tokens"),
])
def test_a_streamed_request_is_checked_like_any_other_and_refused_as_json(chat_server, body, needle):
    status, headers, pieces = raw_stream(chat_server.client.port, body)
    assert status == 400 and headers["Content-Type"] == "application/json"
    assert needle in json.loads(b"".join(pieces))["error"]


def test_a_client_that_leaves_mid_stream_frees_its_slot(chat_server):
    """One request in flight: a stream abandoned after its first event must not hold the slot for ever."""
    connection = http.client.HTTPConnection("127.0.0.1", chat_server.client.port, timeout=30)
    connection.request("POST", "/invocations", headers={"Content-Type": "application/json"},
                       body=json.dumps({"messages": HELLO, "max_tokens": 400, "stream": True}))
    response = connection.getresponse()
    assert response.status == 200 and response.readline().startswith(b"data: ")
    connection.sock.close()  # leave without reading the rest
    connection.close()
    deadline, status = time.monotonic() + 60, None
    while time.monotonic() < deadline:
        status, _, _ = raw_stream(chat_server.client.port, {"messages": HELLO, "max_tokens": 1})
        if status == 200:
            break
        assert status == 503, status  # the slot is still taken while the child finishes writing
        time.sleep(0.2)
    assert status == 200


# ---------------------------------------------------------------------------------------
# through the local router


class RouterProcess:
    """`python -m shiplift.tasks.backends.local.router` on free ports, its state file read for the ports and the
    token."""

    def __init__(self, folder: Path, invoke_timeout_s: float = 30):
        state_file = folder / "router.json"
        self.proc = subprocess.Popen([sys.executable, "-m", "shiplift.tasks.backends.local.router", "--name", ENDPOINT,
                                      "--port", "0", "--state-file", str(state_file), "--invoke-timeout-s",
                                      str(invoke_timeout_s)],
                                     stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while not state_file.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the router did not start"
            time.sleep(0.05)
        info = json.loads(state_file.read_text())
        self.port, self.admin_port, self.token = info["port"], info["admin_port"], info["admin_token"]

    def register(self, component: str, server: ServerProcess) -> None:
        copy = {"url": f"http://127.0.0.1:{server.client.port}", "spec_sha256": "a" * 64}
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.admin_port}/_shiplift/components/{component}", method="PUT",
            data=json.dumps({"copies": [copy]}).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def routed(tmp_path_factory, chat_server, tiny_env) -> Iterator[RouterProcess]:
    """One router: component `chat` on the dlc-chat front, component `decide` on a SemIf server."""
    folder = tmp_path_factory.mktemp("chat-router")
    semif = start_semif(folder / "semif.log", tiny_env)
    router = RouterProcess(folder)
    try:
        router.register("chat", chat_server)
        router.register("decide", semif)
        yield router
    finally:
        router.stop()
        semif.stop()


def test_the_openai_client_through_the_router_streamed_and_not(routed):
    """The openai client, unmodified but for base_url and the component header an endpoint of several needs."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{routed.port}/v1", api_key="x", timeout=30, max_retries=0,
                           default_headers={"X-Amzn-SageMaker-Inference-Component": "chat"})
    whole = client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5, temperature=0, seed=1)
    chunks = list(client.chat.completions.create(model="tiny", messages=HELLO, max_tokens=5, temperature=0, seed=1,
                                                 stream=True))
    assert whole.object == "chat.completion" and whole.system_fingerprint == SERVING_ID
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


def test_the_router_relays_a_stream_as_it_comes(routed):
    connection = http.client.HTTPConnection("127.0.0.1", routed.port, timeout=30)
    try:
        connection.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": HELLO, "max_tokens": 4, "stream": True}), headers={
            "Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": "chat"})
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("Transfer-Encoding") == "chunked"
        assert response.getheader("Content-Type").startswith("text/event-stream")
        body = response.read()
    finally:
        connection.close()
    assert body.rstrip().endswith(b"data: [DONE]")


def test_a_component_that_is_no_chat_server_answers_the_chat_route_404_naming_its_routes(routed):
    connection = http.client.HTTPConnection("127.0.0.1", routed.port, timeout=30)
    try:
        for component, path in (("decide", "/v1/chat/completions"), ("chat", "/v1/completions")):
            connection.request("POST", path, body=json.dumps({"messages": HELLO}), headers={
                "Content-Type": "application/json", "X-Amzn-SageMaker-Inference-Component": component})
            response = connection.getresponse()
            error = json.loads(response.read())["error"]
            assert response.status == 404, error
            assert "POST /invocations" in error, error
    finally:
        connection.close()
