"""SageMaker's InvokeEndpointWithResponseStream on the local router
(`POST /endpoints/NAME/invocations-response-stream`): an unmodified boto3 `sagemaker-runtime` client pointed at the
router reads the answer with its own event-stream parser, the chunks of a streamed chat answer spell the non-streamed
one, a whole answer comes as payload parts, refusals are InvokeEndpoint's (ValidationError, ModelError with the
model's status), and a copy whose answer breaks off or stalls ends the stream with a ModelStreamError event, as the API
reference lists (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpointWithResponseStream.html);
botocore keeps its Message, not its ErrorCode (tests/unit/test_event_stream.py reads that from the bytes). Real
processes: the router, the dlc-chat front on a tiny GGUF, and loopback copies that break their answer."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from tests.contract.test_chat_stream import ENDPOINT, RouterProcess, chat_server  # noqa: F401 (a fixture)
from tests.contract.test_dlc_chat_contract import HELLO

FIRST = b'data: {"first": true}\n\n'  # what a failing copy writes before it breaks off


class HalfAnswer(BaseHTTPRequestHandler):
    """A copy that answers /ping and starts a server-sent-events answer, then breaks it off (`broken`: closes the
    connection mid-answer) or stalls until the test releases it; it keeps the last request's Accept header."""

    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (stdlib signature)
        """Quiet."""

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.accepted = self.headers.get("Accept")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(FIRST), FIRST))
        self.wfile.flush()
        self.close_connection = True
        if self.server.broken:
            self.connection.shutdown(socket.SHUT_RDWR)
        else:
            self.server.release.wait(30)


def half_answer(broken: bool) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HalfAnswer)
    server.daemon_threads = True
    server.broken, server.release, server.accepted = broken, threading.Event(), None
    server.client = SimpleNamespace(port=server.server_address[1])  # what RouterProcess.register reads
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def routed(tmp_path_factory, chat_server) -> Iterator[RouterProcess]:  # noqa: F811 (the fixture imported above)
    """A router with component `chat` on the dlc-chat front and `broken`, a copy that closes mid-answer."""
    broken = half_answer(broken=True)
    router = RouterProcess(tmp_path_factory.mktemp("stream-route"))
    try:
        router.register("chat", chat_server)
        router.register("broken", broken)
        router.broken = broken
        yield router
    finally:
        router.stop()
        broken.shutdown()


def runtime(port: int):
    import boto3
    from botocore.config import Config

    return boto3.client("sagemaker-runtime", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(retries={"total_max_attempts": 1}, connect_timeout=5, read_timeout=30))


def stream(port: int, body: dict, component: str = "chat", **extra) -> tuple[dict, list[bytes]]:
    """invoke_endpoint_with_response_stream: the answer's headers and its PayloadPart bytes as they were read."""
    answer = runtime(port).invoke_endpoint_with_response_stream(
        EndpointName=ENDPOINT, InferenceComponentName=component, ContentType="application/json",
        Body=json.dumps(body), **extra)
    return answer, [event["PayloadPart"]["Bytes"] for event in answer["Body"]]


def whole(port: int, body: dict) -> dict:
    answer = runtime(port).invoke_endpoint(EndpointName=ENDPOINT, InferenceComponentName="chat",
                                           ContentType="application/json", Body=json.dumps(body))
    return json.loads(answer["Body"].read())


ASK = {"messages": HELLO, "max_tokens": 6, "temperature": 0, "seed": 1}


def test_boto3_reads_a_streamed_chat_answer_whose_chunks_spell_the_whole_one(routed):
    answer, parts = stream(routed.port, {**ASK, "stream": True})
    assert answer["ContentType"].startswith("text/event-stream") and answer["InvokedProductionVariant"] == "AllTraffic"
    assert len(parts) >= 2, "the events come as the model writes them, not as one body"
    events = [line[6:] for line in b"".join(parts).split(b"\n") if line.startswith(b"data: ")]
    assert events[-1].strip() == b"[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    streamed = "".join(choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"])
    assert streamed == whole(routed.port, ASK)["choices"][0]["message"]["content"], "greedy: the same answer"


def test_a_whole_answer_comes_back_as_payload_parts(routed):
    answer, parts = stream(routed.port, ASK)
    assert answer["ContentType"] == "application/json"
    assert json.loads(b"".join(parts))["choices"][0]["message"] == whole(routed.port, ASK)["choices"][0]["message"]


def test_refusals_are_invoke_endpoints_validation_error_and_model_error(routed):
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as refused_by_model:
        stream(routed.port, {**ASK, "stream": True, "n": 2})
    error = refused_by_model.value.response
    assert (error["Error"]["Code"], error["ResponseMetadata"]["HTTPStatusCode"]) == ("ModelError", 424)
    assert error["OriginalStatusCode"] == 400 and "n: must be 1" in error["OriginalMessage"]
    with pytest.raises(ClientError) as unknown:
        stream(routed.port, ASK, component="nope")
    assert unknown.value.response["Error"]["Code"] == "ValidationError"
    assert "Inference Component nope not found" in unknown.value.response["Error"]["Message"]
    with pytest.raises(ClientError) as elsewhere:
        runtime(routed.port).invoke_endpoint_with_response_stream(EndpointName="other", Body=b"{}")
    assert elsewhere.value.response["Error"]["Code"] == "ValidationError"


def test_a_copy_that_breaks_off_ends_the_stream_with_a_model_stream_error(routed):
    from botocore.exceptions import EventStreamError

    answer = runtime(routed.port).invoke_endpoint_with_response_stream(
        EndpointName=ENDPOINT, InferenceComponentName="broken", Body=b"{}", Accept="text/event-stream")
    events = iter(answer["Body"])
    assert next(events)["PayloadPart"]["Bytes"] == FIRST, "what came before the break is delivered"
    with pytest.raises(EventStreamError) as ended:
        next(events)
    assert ended.value.response["Error"]["Code"] == "ModelStreamError"
    assert "The model's answer broke off" in ended.value.response["Error"]["Message"]
    assert routed.broken.accepted == "text/event-stream", "X-Amzn-SageMaker-Accept reaches the copy as Accept"


def test_a_copy_that_stalls_past_the_invocation_timeout_ends_the_stream_with_a_model_stream_error(tmp_path):
    from botocore.exceptions import EventStreamError

    stalled = half_answer(broken=False)
    router = RouterProcess(tmp_path, invoke_timeout_s=1)
    try:
        router.register("stalled", stalled)
        answer = runtime(router.port).invoke_endpoint_with_response_stream(EndpointName=ENDPOINT, Body=b"{}")
        events = iter(answer["Body"])
        assert next(events)["PayloadPart"]["Bytes"] == FIRST
        with pytest.raises(EventStreamError) as ended:
            next(events)
        assert ended.value.response["Error"]["Code"] == "ModelStreamError"
        assert "did not write its answer within 1s" in ended.value.response["Error"]["Message"]
    finally:
        stalled.release.set()
        router.stop()
        stalled.shutdown()
