"""The event-stream encoding the local router writes for InvokeEndpointWithResponseStream
(tasks/backends/local/event_stream.py), decoded by botocore's own parser (EventStreamBuffer checks both CRCs): each
piece a `PayloadPart`, a long piece split below botocore's payload limit, a failed or stalled read a final
`ModelStreamError` with its ErrorCode, and the pieces closed however the stream ends."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

from shiplift.tasks.backends.local.event_stream import MAX_PART_BYTES, message, payload_events


def decoded(data: bytes) -> list:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return list(buffer)


def test_each_piece_is_a_payload_part_and_a_long_one_is_split():
    pieces = [b"data: one\n\n", b"x" * (MAX_PART_BYTES + 5)]
    messages = decoded(b"".join(payload_events(iter(pieces), 5)))
    assert [m.headers for m in messages] == [{":event-type": "PayloadPart", ":content-type": "application/octet-stream",
                                             ":message-type": "event"}] * 3
    assert [len(m.payload) for m in messages] == [len(pieces[0]), MAX_PART_BYTES, 5]
    assert b"".join(m.payload for m in messages) == b"".join(pieces)


def test_a_flipped_bit_fails_botocores_checksum():
    encoded = bytearray(message({":message-type": "event"}, b"payload"))
    encoded[-6] ^= 1
    with pytest.raises(ChecksumMismatch):
        decoded(bytes(encoded))
    assert int.from_bytes(encoded[8:12], "big") == zlib.crc32(bytes(encoded[:8])), "the prelude's CRC is untouched"


def failing(error: Exception, closed: list[bool]) -> Iterator[bytes]:
    try:
        yield b"data: first\n\n"
        raise error
    finally:
        closed.append(True)


@pytest.mark.parametrize("error, code, words", [
    (TimeoutError("timed out"), "ModelInvocationTimeExceeded", "within 3s"),
    (ConnectionResetError("reset"), "StreamBroken", "broke off"),
])
def test_a_read_that_fails_ends_the_stream_with_a_model_stream_error(error, code, words):
    closed: list[bool] = []
    first, last = decoded(b"".join(payload_events(failing(error, closed), 3)))
    assert first.payload == b"data: first\n\n"
    assert last.headers == {":exception-type": "ModelStreamError", ":content-type": "application/json",
                            ":message-type": "exception"}
    body = json.loads(last.payload)
    assert body["ErrorCode"] == code and words in body["Message"]
    assert closed == [True]


def test_a_client_that_leaves_closes_the_pieces():
    closed: list[bool] = []
    events = payload_events(failing(TimeoutError(), closed), 3)
    next(events)
    events.close()
    assert closed == [True], "the copy's answer is let go"
