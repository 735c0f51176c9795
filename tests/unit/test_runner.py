"""Eval runner against an in-process fake SemIf server on 127.0.0.1:0."""

from __future__ import annotations

import collections
import json
import random
import socket
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shiplift.tasks.errors import BadInput
from shiplift.validation.decisions.jevbench import JevTask
from shiplift.validation.runner import Prediction, read_predictions, run_decisions, write_predictions
from shiplift.validation.transport import IC_HEADER


def make_task(i: int) -> JevTask:
    return JevTask.model_validate({
        "id": f"t{i}", "family": "f", "group": None, "split": "test", "state": f"state {i}",
        "question": {"type": "choice", "instructions": "Pick one", "criteria": None},
        "labels": ["b", "a", "c"], "expected": "a",
    })


class FakeSemIf:
    """A tiny SemIf look-alike: records concurrency, connections, paths and headers."""

    def __init__(self):
        self.sleep_s: dict[str, float] = {}
        self.default_sleep_s = 0.0
        self.fail_503: dict[str, int] = {}  # id -> how many first attempts answer 503 retryable
        self.fail_500: dict[str, int] = {}
        self.bad_ids: set[str] = set()
        self.wrong_options: set[str] = set()
        self.drop_connections = False  # close after each response without telling the client
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.calls: collections.Counter[str] = collections.Counter()
        self.peers: set[tuple[str, int]] = set()
        self.paths: list[str] = []
        self.components: list[str | None] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()  # headers and body go out in two writes: avoid the Nagle/delayed-ACK stall
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self):
                begin = time.perf_counter()
                with fake.lock:
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                    fake.peers.add(self.client_address)
                    fake.paths.append(self.path)
                    fake.components.append(self.headers.get(IC_HEADER))
                try:
                    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                    self.reply(*fake.answer(body["decision"], begin))
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

            def reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                if fake.drop_connections:
                    self.close_connection = True

        class Server(ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that timed out and hung up
                    super().handle_error(request, client_address)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def answer(self, decision: dict, begin: float) -> tuple[int, dict]:
        """The status and body that answer `decision`: its scripted failures first, then a result after its sleep."""
        task_id = decision["id"]
        with self.lock:
            self.calls[task_id] += 1
            call = self.calls[task_id]
        if task_id in self.bad_ids:
            return 400, {"error": f"option ids of {task_id} are invalid"}
        if call <= self.fail_503.get(task_id, 0):
            return 503, {"error": "server busy", "retryable": True}
        if call <= self.fail_500.get(task_id, 0):
            return 500, {"error": "internal"}
        time.sleep(self.sleep_s.get(task_id, self.default_sleep_s))
        ids = [o["id"] for o in decision["options"]]
        if task_id in self.wrong_options:
            ids = ids[::-1]
        total_ms = (time.perf_counter() - begin) * 1000
        return 200, {"result": {
            "id": task_id, "option_ids": ids, "probabilities": [0.2, 0.7, 0.1],
            "option_logits": [1.0, 2.25, 0.5], "allowed_token_mass": 0.9, "temperature": 1.0,
            "timings": {"forward_ms": total_ms * 0.8, "total_ms": total_ms}}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeSemIf()
    yield server
    server.close()


def test_results_parsed_in_task_order_with_progress(fake):
    tasks = [make_task(i) for i in range(10)]
    for i in range(10):  # early tasks are slowest, so completion order differs from task order
        fake.sleep_s[f"t{i}"] = 0.002 * (10 - i)
    seen = []
    predictions = run_decisions(fake.url, tasks, concurrency=3, dataset_name="demo",
                                progress=lambda done, total: seen.append((done, total)))
    assert [p.id for p in predictions] == [t.id for t in tasks]
    assert seen == [(i, 10) for i in range(1, 11)]
    first = predictions[0]
    assert first.error is None and first.attempts == 1 and first.retries_503 == 0
    assert first.dataset == "demo" and first.expected == "a" and first.option_ids == ["b", "a", "c"]
    assert first.probabilities == [0.2, 0.7, 0.1] and first.option_logits == [1.0, 2.25, 0.5]
    assert first.allowed_token_mass == 0.9 and first.temperature == 1.0
    assert first.server_total_ms is not None and first.server_forward_ms == pytest.approx(0.8 * first.server_total_ms)
    assert first.latency_ms >= first.server_total_ms
    assert abs(first.started_at - time.time()) < 60
    assert set(fake.paths) == {"/invocations"} and set(fake.components) == {None}


def test_concurrency_is_bounded_and_connections_kept_alive(fake):
    fake.default_sleep_s = 0.03
    predictions = run_decisions(fake.url, [make_task(i) for i in range(12)], concurrency=3)
    assert all(p.error is None for p in predictions)
    assert 2 <= fake.max_in_flight <= 3
    assert len(fake.peers) <= 3  # one keep-alive connection per worker


def test_runner_overhead_is_small_against_server_time(fake):
    fake.default_sleep_s = 0.04
    predictions = run_decisions(fake.url, [make_task(i) for i in range(16)], concurrency=2)
    overhead = statistics.median(p.latency_ms - p.server_total_ms for p in predictions)
    server = statistics.median(p.server_total_ms for p in predictions)
    assert overhead < 0.1 * server, (overhead, server)


def test_503_retryable_backoff_is_capped_jittered_and_counted(fake):
    fake.fail_503 = {"t0": 2, "t1": 9}
    waits: list[float] = []
    predictions = run_decisions(fake.url, [make_task(0), make_task(1), make_task(2)], concurrency=1,
                                max_attempts=4, backoff_base_s=0.01, backoff_cap_s=0.03,
                                rng=random.Random(7), sleep=waits.append)
    ok, exhausted, plain = predictions
    assert (ok.error, ok.attempts, ok.retries_503) == (None, 3, 2)
    assert exhausted.attempts == 4 and exhausted.retries_503 == 3
    assert exhausted.error.startswith("HTTP 503 (retryable) on all 4 attempts") and exhausted.probabilities is None
    assert (plain.attempts, plain.retries_503) == (1, 0)
    reference = random.Random(7)
    caps = [0.01, 0.02, 0.01, 0.02, 0.03]  # t0: retries 0,1; t1: retries 0,1,2 (2 is capped)
    assert waits == [reference.uniform(0.0, cap) for cap in caps]
    assert fake.calls["t1"] == 4


def test_4xx_is_carried_without_retry_and_5xx_retried_once(fake):
    fake.bad_ids = {"t1"}
    fake.fail_500 = {"t2": 1, "t3": 99}
    predictions = run_decisions(fake.url, [make_task(i) for i in range(4)], concurrency=2)
    assert predictions[0].error is None
    bad = predictions[1]
    assert bad.error == "HTTP 400: option ids of t1 are invalid" and bad.attempts == 1
    assert bad.probabilities is None and bad.server_total_ms is None and bad.option_ids == ["b", "a", "c"]
    assert (predictions[2].error, predictions[2].attempts) == (None, 2)
    assert predictions[3].error == "HTTP 500: internal" and predictions[3].attempts == 2
    assert fake.calls["t1"] == 1 and fake.calls["t3"] == 2


def test_deadline_is_honoured(fake):
    fake.default_sleep_s = 0.3
    begin = time.monotonic()
    predictions = run_decisions(fake.url, [make_task(i) for i in range(6)], concurrency=1, deadline_s=0.5)
    elapsed = time.monotonic() - begin
    assert elapsed < 1.0  # all six would take 1.8 s
    assert predictions[0].error is None
    assert all("deadline exceeded" in p.error for p in predictions[1:])
    assert sum(p.attempts == 0 for p in predictions) >= 4  # never sent
    assert len(predictions) == 6


def test_deadline_stops_backoff_early(fake):
    fake.fail_503 = {"t0": 99}
    begin = time.monotonic()
    (prediction,) = run_decisions(fake.url, [make_task(0)], backoff_base_s=50, backoff_cap_s=50,
                                  rng=random.Random(1), deadline_s=0.3)
    assert time.monotonic() - begin < 0.3
    assert "deadline exceeded while backing off" in prediction.error and prediction.retries_503 == 0


def test_router_url_and_inference_component_header(fake):
    predictions = run_decisions(f"{fake.url}/endpoints/my-ep/", [make_task(0)], inference_component="ic-a")
    assert predictions[0].error is None
    assert fake.paths == ["/endpoints/my-ep/invocations"] and fake.components == ["ic-a"]


def test_result_that_does_not_match_request_is_an_error(fake):
    fake.wrong_options = {"t0"}
    (prediction,) = run_decisions(fake.url, [make_task(0)])
    assert prediction.error.startswith("malformed response: result option_ids")
    assert prediction.attempts == 1


def test_server_closing_idle_connections_is_not_an_attempt(fake):
    fake.drop_connections = True
    predictions = run_decisions(fake.url, [make_task(i) for i in range(5)], concurrency=1)
    assert [(p.error, p.attempts) for p in predictions] == [(None, 1)] * 5


def test_unreachable_server_is_an_error_after_one_retry():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (prediction,) = run_decisions(f"http://127.0.0.1:{port}", [make_task(0)], timeout_s=2)
    assert prediction.error.startswith("request failed after 2 attempt(s): ConnectionRefusedError")


@pytest.mark.parametrize(
    ("url", "kwargs", "needle"),
    [
        ("ftp://127.0.0.1:1", {}, "not an http(s) URL"),
        ("http://127.0.0.1:1?x=1", {}, "without query"),
        ("http://127.0.0.1:1", {"concurrency": 0}, "concurrency=0"),
        ("http://127.0.0.1:1", {"timeout_s": 0}, "timeout_s=0"),
        ("http://127.0.0.1:1", {"max_attempts": 0}, "max_attempts=0"),
        ("http://127.0.0.1:1", {"backoff_cap_s": 0.1}, "backoff_cap_s=0.1"),
        ("http://127.0.0.1:1", {"deadline_s": -1}, "deadline_s=-1"),
        ("http://127.0.0.1:1", {"inference_component": " "}, "inference_component is empty"),
    ],
)
def test_bad_settings_are_refused(url, kwargs, needle):
    with pytest.raises(BadInput) as info:
        run_decisions(url, [make_task(0)], **kwargs)
    assert needle in str(info.value)


def test_predictions_file_round_trip_and_errors(tmp_path):
    prediction = Prediction(
        id="t0", dataset="d", expected="a", option_ids=["b", "a"], probabilities=[0.4, 0.6],
        option_logits=[0.0, 0.4], allowed_token_mass=0.8, temperature=None, latency_ms=12.5,
        server_forward_ms=8.0, server_total_ms=10.0, attempts=2, retries_503=1, error=None, started_at=1.5e9,
    )
    failed = prediction.model_copy(update={"id": "t1", "probabilities": None, "error": "HTTP 400: x"})
    path = tmp_path / "out" / "predictions.jsonl"
    write_predictions(path, [prediction, failed])
    assert read_predictions(path) == [prediction, failed]
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == [
        "id", "dataset", "expected", "option_ids", "probabilities", "option_logits", "allowed_token_mass",
        "temperature", "latency_ms", "server_forward_ms", "server_total_ms", "attempts", "retries_503",
        "error", "started_at", "model_sha256", "generated_token", "missing_letters", "lost", "serving_id"]
    later = ("model_sha256", "generated_token", "missing_letters", "lost")
    older = {k: v for k, v in first.items() if k not in later}  # a predictions file written before they existed
    path.write_text(json.dumps(older) + "\n")
    assert read_predictions(path) == [prediction]
    write_predictions(path, [prediction, failed])
    broken = dict(first)
    del broken["attempts"]
    path.write_text(json.dumps(first) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(BadInput, match=r"predictions.jsonl:2: field 'attempts'"):
        read_predictions(path)
