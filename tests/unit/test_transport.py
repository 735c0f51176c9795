"""Shared eval transport: retry policy on a scripted connection, body parsing helpers, options, worker pool."""

from __future__ import annotations

import json
import random
import threading
import time

import pytest

from shiplift.tasks.errors import BadInput
from shiplift.validation.transport import (
    ERROR_BODY_CHARS,
    IC_HEADER,
    Exchange,
    Malformed,
    RuntimeHttpChannel,
    json_body,
    optional_number,
    optional_numbers,
    post_with_retries,
    run_bounded,
    run_options,
)

BUSY = json.dumps({"error": "server busy", "retryable": True}).encode()


class ScriptedConnection:
    """Stands in for `Connection`: each `post` returns the next scripted (status, body) or raises it."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.timeouts: list[float] = []

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        self.timeouts.append(timeout_s)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


def options(**overrides):
    settings = {
        "concurrency": 1, "timeout_s": 5.0, "max_attempts": 6, "backoff_base_s": 0.1, "backoff_cap_s": 0.3,
        "inference_component": None, "deadline_s": None, "rng": random.Random(3), "sleep": lambda s: None,
    }
    return run_options("http://127.0.0.1:9", **(settings | overrides))


def test_503_retryable_backs_off_with_capped_full_jitter_until_200():
    waits: list[float] = []
    connection = ScriptedConnection((503, BUSY), (503, BUSY), (503, BUSY), (200, b"{}"))
    exchange = post_with_retries(connection, b"{}", options(sleep=waits.append))
    assert (exchange.data, exchange.error, exchange.attempts, exchange.retries_503) == (b"{}", None, 4, 3)
    reference = random.Random(3)
    assert waits == [reference.uniform(0.0, cap) for cap in (0.1, 0.2, 0.3)]  # the third is capped
    assert connection.timeouts == [5.0] * 4


def test_503_retryable_on_every_attempt_is_an_error():
    connection = ScriptedConnection(*[(503, BUSY)] * 3)
    exchange = post_with_retries(connection, b"{}", options(max_attempts=3))
    assert exchange.error == "HTTP 503 (retryable) on all 3 attempts: server busy"
    assert (exchange.data, exchange.attempts, exchange.retries_503) == (None, 3, 2)


def test_network_error_and_other_5xx_share_one_extra_try():
    connection = ScriptedConnection(ConnectionRefusedError("refused"), (502, b'{"error": "bad gateway"}'), (200, b""))
    exchange = post_with_retries(connection, b"{}", options())
    assert (exchange.error, exchange.attempts) == ("HTTP 502: bad gateway", 2)
    assert connection.answers == [(200, b"")]


def test_503_without_retryable_flag_is_a_plain_5xx():
    connection = ScriptedConnection((503, b'{"error": "down"}'), (503, b'{"error": "down"}'))
    exchange = post_with_retries(connection, b"{}", options())
    assert (exchange.error, exchange.attempts, exchange.retries_503) == ("HTTP 503: down", 2, 0)


def test_4xx_ends_at_once_and_a_long_plain_body_is_cut():
    body = b"x" * (ERROR_BODY_CHARS + 100)
    exchange = post_with_retries(ScriptedConnection((400, body)), b"{}", options())
    assert exchange.error == f"HTTP 400: {'x' * ERROR_BODY_CHARS}… ({len(body)} bytes in all)"
    assert exchange.attempts == 1


def test_passed_deadline_sends_nothing():
    connection = ScriptedConnection()
    opts = options(deadline_s=0.001)
    time.sleep(0.01)
    exchange = post_with_retries(connection, b"{}", opts)
    assert (exchange.error, exchange.attempts) == ("run deadline exceeded after 0 attempt(s)", 0)
    assert connection.timeouts == []


def test_exchange_parse_gives_the_value_the_error_or_a_malformed_error():
    ok = Exchange(data=b'{"a": 1}', error=None, attempts=1, retries_503=0, latency_ms=1.0)
    failed = Exchange(data=None, error="HTTP 400: no", attempts=1, retries_503=0, latency_ms=1.0)
    assert ok.parse(json_body) == ({"a": 1}, None)
    assert failed.parse(json_body) == (None, "HTTP 400: no")

    def strict(data: bytes) -> dict:
        raise Malformed("response has no 'result' object")

    assert ok.parse(strict) == (None, "malformed response: response has no 'result' object")


def test_body_and_number_parsers_name_the_field():
    with pytest.raises(Malformed, match="response body is not JSON"):
        json_body(b"\xff")
    assert optional_number(None, "t") is None and optional_number(2, "t") == 2.0
    with pytest.raises(Malformed, match=r"result field 'temperature' is True, expected a number or null"):
        optional_number(True, "temperature")
    assert optional_numbers(None, "p") is None and optional_numbers([1, 0.5], "p") == [1.0, 0.5]
    with pytest.raises(Malformed, match=r"result field 'p\[1\]' is 'x'"):
        optional_numbers([1, "x"], "p")
    with pytest.raises(Malformed, match=r"result field 'p' is dict, expected a list of numbers or null"):
        optional_numbers({}, "p")


def test_run_options_resolves_target_headers_and_deadline():
    opts = run_options("https://example.test:8443/endpoints/ep/", concurrency=1, timeout_s=3, max_attempts=2,
                       backoff_base_s=0, backoff_cap_s=0, inference_component="ic-a", deadline_s=None,
                       rng=None, sleep=time.sleep)
    channel = opts.invoker.open()
    assert isinstance(channel, RuntimeHttpChannel), "an /endpoints/NAME URL is the runtime's: its errors unwrapped"
    connection = channel.connection
    assert (connection._target.https, connection._target.host, connection._target.port) == (True, "example.test", 8443)
    assert connection._target.path == "/endpoints/ep/invocations" and connection._headers[IC_HEADER] == "ic-a"
    assert opts.invoker.describe() == {"url": "https://example.test:8443/endpoints/ep/", "component": "ic-a"}
    assert opts.deadline is None and opts.timeout_s == 3.0


@pytest.mark.parametrize(
    ("url", "overrides", "needle"),
    [
        ("http://127.0.0.1:99999", {}, "has an invalid port"),
        ("http://127.0.0.1:9", {"timeout_s": float("inf"), "backoff_base_s": -1},
         "timeout_s=inf .*; backoff_base_s=-1"),
    ],
)
def test_run_options_refuses_bad_settings(url, overrides, needle):
    settings = {"concurrency": 1, "timeout_s": 5.0, "max_attempts": 1, "backoff_base_s": 0, "backoff_cap_s": 0,
                "inference_component": None, "deadline_s": None, "rng": None, "sleep": time.sleep}
    with pytest.raises(BadInput, match=needle):
        run_options(url, **(settings | overrides))


def test_run_bounded_keeps_item_order_bounds_workers_and_weights_progress():
    lock = threading.Lock()
    in_flight = peak = 0
    connections: dict[str, set[int]] = {}
    seen: list[tuple[int, int]] = []

    def work(item: str, connection, opts) -> str:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
            connections.setdefault(threading.current_thread().name, set()).add(id(connection))
        time.sleep(0.01 * (5 - len(item)))  # early items are slowest
        with lock:
            in_flight -= 1
        return item.upper()

    items = ["a", "bb", "ccc", "dddd", "e", "ff"]
    results = run_bounded(items, work, options(), concurrency=2, progress=lambda d, t: seen.append((d, t)),
                          thread_name="test-pool", weight=len)
    assert results == [item.upper() for item in items]
    assert peak == 2 and all(len(ids) == 1 for ids in connections.values()) and len(connections) == 2
    done = [d for d, _ in seen]
    assert len(seen) == 6 and done == sorted(done) and seen[-1] == (13, 13)  # 13 = summed lengths


def test_run_bounded_stops_and_raises_when_work_fails():
    calls: list[int] = []

    def work(item: int, connection, opts) -> int:
        calls.append(item)
        if item == 1:
            raise RuntimeError("boom")
        return item

    with pytest.raises(RuntimeError, match="boom"):
        run_bounded(list(range(50)), work, options(), concurrency=1, progress=None, thread_name="test-pool")
    assert calls == [0, 1]
