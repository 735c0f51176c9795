"""AWS's event-stream encoding (`application/vnd.amazon.eventstream`): the body of SageMaker's
InvokeEndpointWithResponseStream, which the local router writes so that an unmodified boto3 `sagemaker-runtime` client
reads a local endpoint's stream with its own event-stream parser.

Each message is a prelude (total length, headers length, the prelude's CRC32), headers (a byte of name length, the
name, value type 7 = string, two bytes of value length, the value), the payload and the whole message's CRC32, all
big-endian (https://docs.aws.amazon.com/AmazonS3/latest/API/RESTSelectObjectAppendix.html). The operation's stream
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpointWithResponseStream.html) carries
`PayloadPart` events whose payload is the container's bytes as it writes them, and ends on a `ModelStreamError`
exception (ErrorCode `ModelInvocationTimeExceeded` or `StreamBroken`) when the container's answer breaks off; botocore's
service model names the same shapes (ResponseStream: PayloadPart with `Bytes` as the event payload, ModelStreamError
with Message and ErrorCode).
"""

from __future__ import annotations

import http.client
import json
import struct
import zlib
from collections.abc import Iterator

CONTENT_TYPE = "application/vnd.amazon.eventstream"
STRING_HEADER = 7  # the header value type of a string (the encoding's table of value types)
MAX_PART_BYTES = 1 << 20  # a longer piece goes out as several parts (botocore refuses a payload over 24 MiB)
PAYLOAD_PART = {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"}


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One encoded message: prelude and its CRC32, string headers, payload, the message's CRC32."""
    encoded = b"".join(struct.pack(">B", len(name.encode())) + name.encode() + struct.pack(">BH", STRING_HEADER,
                                                                                          len(value.encode()))
                       + value.encode() for name, value in headers.items())
    prelude = struct.pack(">II", 12 + len(encoded) + len(payload) + 4, len(encoded))
    body = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return body + struct.pack(">I", zlib.crc32(body))


def model_stream_error(error_code: str, text: str) -> bytes:
    """The exception message that ends a stream whose model broke off (botocore raises it as an EventStreamError)."""
    headers = {":exception-type": "ModelStreamError", ":content-type": "application/json", ":message-type": "exception"}
    return message(headers, json.dumps({"Message": text, "ErrorCode": error_code}).encode())


def payload_events(pieces: Iterator[bytes], timeout_s: float) -> Iterator[bytes]:
    """The container's answer as `PayloadPart` messages, each piece as it comes; a read that waits past `timeout_s`
    (`ModelInvocationTimeExceeded`) or fails (`StreamBroken`) ends the stream with a `ModelStreamError`, since the 200
    is already sent. Closing this closes `pieces`, so the copy's connection is let go when the client leaves."""
    try:
        while True:
            try:
                piece = next(pieces, None)
            except TimeoutError:
                yield model_stream_error("ModelInvocationTimeExceeded",
                                         f"The model did not write its answer within {timeout_s:g}s.")
                return
            except (OSError, http.client.HTTPException) as exc:
                yield model_stream_error("StreamBroken", f"The model's answer broke off ({exc!r}).")
                return
            if piece is None:
                return
            for start in range(0, len(piece), MAX_PART_BYTES):
                yield message(PAYLOAD_PART, piece[start:start + MAX_PART_BYTES])
    finally:
        close = getattr(pieces, "close", None)
        if close is not None:
            close()
