"""`InvokeEndpointWithResponseStream` through tasks/backends/aws/invoke.py against the AWS double: the container's
answer comes back as the event stream's PayloadPart bytes, the same answer `InvokeEndpoint` gives, and a refusal is
the same error answer. The double's encoding is checked with botocore's own decoder: pieces as the container wrote
them, and a stream that breaks off ends with a ModelStreamError event
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpointWithResponseStream.html)."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from botocore.eventstream import EventStreamBuffer

from shiplift.tasks.artifacts.packaging import package_gguf
from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.backends.aws.invoke import RuntimeChannel
from shiplift.tasks.backends.aws.session import Aws
from tests.aws.test_double import DECISION, _variant, create_endpoint, create_model, publish_image, wait_until_settled


@pytest.fixture(scope="module")
def semif_archive(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stream-model")
    gguf = write_tiny_gguf(folder / "tiny.gguf", seed=3)
    return package_gguf(gguf, folder / "package", manifest={"source": "tinymodel seed 3"}).path


def test_a_streamed_invocation_gives_the_containers_answer_in_payload_parts(aws, semif_archive):
    image, data_url = publish_image(aws, semif_archive)
    create_model(aws, "tiny", image, data_url)
    create_endpoint(aws, "tiny", _variant(ModelName="tiny"))
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="tiny")
    assert described["EndpointStatus"] == "InService", described.get("FailureReason")
    channel = RuntimeChannel(Aws(region="us-east-1"), "tiny", None, timeout_s=30)

    status, parts = channel.stream(json.dumps(DECISION).encode(), 30)
    whole = channel.post(json.dumps(DECISION).encode(), 30)
    streamed, answered = json.loads(b"".join(parts))["result"], json.loads(whole[1])["result"]
    assert status == 200 and whole[0] == 200
    assert (streamed["id"], streamed["option_ids"], streamed["probabilities"]) == (
        answered["id"], answered["option_ids"], answered["probabilities"]), "the same answer (timings aside)"
    assert [call.operation for call in aws.calls][-2:] == ["InvokeEndpointWithResponseStream", "InvokeEndpoint"]

    refused_stream = channel.stream(b'{"decision": 1, "extra": 2}', 30)
    refused = channel.post(b'{"decision": 1, "extra": 2}', 30)
    assert refused[0] == 400 and (refused_stream[0], b"".join(refused_stream[1])) == refused, "a ModelError, as ever"


def pieces_server(pieces: list[bytes], pause_s: float) -> tuple[int, threading.Thread]:
    """A container on a free port that answers one request 200 chunked with `pieces`, pausing between them, then
    resets the connection before the last chunk (a stream that breaks off)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        connection, _ = listener.accept()
        with connection, listener:
            connection.recv(1 << 16)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               b"Transfer-Encoding: chunked\r\n\r\n")
            for piece in pieces:
                connection.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                time.sleep(pause_s)
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def test_the_doubles_event_stream_is_what_botocore_decodes_and_a_break_is_a_model_stream_error(aws_double_module):
    pieces = [b"data: {\"n\": 1}\n\n", b"data: {\"n\": 2}\n\n", b"data: {\"n\": 3}\n\n"]
    port, thread = pieces_server(pieces, pause_s=0.1)
    ended = []
    connection, response = aws_double_module.open_invocation(port, {"Body": b"{}", "ContentType": "application/json"})
    buffer, messages = EventStreamBuffer(), []
    for encoded in aws_double_module.stream_events(response, lambda: (ended.append(True), connection.close())):
        buffer.add_data(encoded)
        messages.extend(buffer)
    thread.join(timeout=5)
    headers = [message.headers for message in messages]
    assert [message.payload for message in messages[:-1]] == pieces, "each piece its own PayloadPart, in order"
    assert all(h[":event-type"] == "PayloadPart" and h[":message-type"] == "event" for h in headers[:-1])
    assert headers[-1][":message-type"] == "exception" and headers[-1][":exception-type"] == "ModelStreamError"
    assert json.loads(messages[-1].payload)["ErrorCode"] == "StreamBroken"
    assert ended == [True], "the copy is released once, when the stream ends"


def test_a_chat_endpoint_streams_server_sent_events_through_invoke_endpoint_with_response_stream(aws, tmp_path):
    """The DLC (its local stand-in) on the double, asked `stream: true`: the events arrive in several PayloadParts."""
    from shiplift.tasks.artifacts.tiny_gguf import CHAT_TEMPLATES
    from tests.aws.test_double import BUCKET, ROLE, ensure_bucket

    gguf = write_tiny_gguf(tmp_path / "chat.gguf", seed=0, chat_template=CHAT_TEMPLATES["turns"])
    archive = package_gguf(gguf, tmp_path / "package", manifest={"source": "tiny chat"}).path
    ensure_bucket(aws)
    aws.client("s3").upload_file(str(archive), BUCKET, "models/chat/model.tar.gz")
    digest = aws.publish_image("763104351884", "llama-cpp", "server-sagemaker-cpu-v1", kind="dlc-chat")
    container = {"Image": f"763104351884.dkr.ecr.us-east-1.amazonaws.com/llama-cpp@{digest}",
                 "ModelDataUrl": f"s3://{BUCKET}/models/chat/model.tar.gz",
                 "Environment": {"SM_LLAMA_CPP_THREADS": "1", "SM_LLAMA_CPP_CTX_SIZE": "512"}}
    aws.client("sagemaker").create_model(ModelName="chat", ExecutionRoleArn=ROLE, EnableNetworkIsolation=True,
                                         PrimaryContainer=container)
    create_endpoint(aws, "chat", _variant(ModelName="chat"))
    described, _ = wait_until_settled(aws.client("sagemaker").describe_endpoint, "EndpointStatus", EndpointName="chat")
    assert described["EndpointStatus"] == "InService", described.get("FailureReason")
    channel = RuntimeChannel(Aws(region="us-east-1"), "chat", None, timeout_s=30)
    body = {"messages": [{"role": "user", "content": "Which letter?"}], "max_tokens": 5, "stream": True}
    status, parts = channel.stream(json.dumps(body).encode(), 30)
    parts = list(parts)
    events = [line for line in b"".join(parts).split(b"\n") if line.startswith(b"data: ")]
    assert status == 200 and len(parts) > 1, "the events come as the model writes them, not as one body"
    assert events[-1].strip() == b"data: [DONE]"
    assert {json.loads(line[6:])["object"] for line in events[:-1]} == {"chat.completion.chunk"}
