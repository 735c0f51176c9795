"""NLI runner against an in-process fake encoder server on 127.0.0.1:0 (DESIGN §6.3 wire contract)."""

from __future__ import annotations

import collections
import json
import math
import random
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from shiplift.tasks.errors import BadInput
from shiplift.validation.nli.pairs import LABELS, NliPair
from shiplift.validation.nli.runner import run_pairs
from shiplift.validation.runner import read_predictions, write_predictions
from shiplift.validation.transport import IC_HEADER


def make_pairs(n: int) -> list[NliPair]:
    return [NliPair(id=f"p{i}", premise=f"premise {i}", hypothesis=f"hypothesis {i}", label=LABELS[i % 3])
            for i in range(n)]


def key(pair: NliPair) -> tuple[str, str]:
    return pair.premise, pair.hypothesis


class FakeEncoder:
    """An encoder-server look-alike keyed by (premise, hypothesis): answers `answers[key]` (else the first
    label) with p=0.8, reports `truncated` for keys in `truncate`, and injects 503/400/malformed answers."""

    def __init__(self):
        self.answers: dict[tuple[str, str], str] = {}
        self.truncate: set[tuple[str, str]] = set()
        self.fail_503: dict[tuple[str, str], int] = {}  # key -> how many first calls of its batch answer 503
        self.reject: set[tuple[str, str]] = set()  # a batch holding one of these gets 400
        self.short: set[tuple[str, str]] = set()  # a batch holding one of these gets one result too few
        self.lock = threading.Lock()
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.batch_sizes: list[int] = []
        self.paths: list[str] = []
        self.components: list[str | None] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                pairs = body.get("pairs")
                if set(body) != {"pairs"} or any(set(p) != {"premise", "hypothesis"} for p in pairs):
                    return self.reply(400, {"error": f"bad request keys: {sorted(body)}"})
                hypotheses = [(p["premise"], p["hypothesis"]) for p in pairs]
                key = hypotheses[0]
                with fake.lock:
                    fake.calls[key] += 1
                    call = fake.calls[key]
                    fake.paths.append(self.path)
                    fake.components.append(self.headers.get(IC_HEADER))
                if any(h in fake.reject for h in hypotheses):
                    return self.reply(400, {"error": "pair 2: hypothesis is empty", "retryable": False})
                if any(call <= fake.fail_503.get(h, 0) for h in hypotheses):
                    return self.reply(503, {"error": "batch queue full", "retryable": True})
                with fake.lock:
                    fake.batch_sizes.append(len(pairs))
                results = [fake.result(h) for h in hypotheses]
                if any(h in fake.short for h in hypotheses):
                    results = results[:-1]
                n = len(pairs)
                self.reply(200, {"results": results, "timing": {"forward_ms": 8.0 * n, "total_ms": 10.0 * n},
                                 "model": {"file": "model.onnx", "temperature": 1.5}})

            def reply(self, status, payload):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def result(self, hypothesis: tuple[str, str]) -> dict:
        label = self.answers.get(hypothesis, LABELS[0])
        probs = {name: (0.8 if name == label else 0.1) for name in reversed(LABELS)}  # key order must not matter
        truncated = hypothesis in self.truncate
        return {
            "label": label, "probabilities": probs, "logits": [math.log(probs[name]) for name in LABELS],
            "input_tokens": 512 if truncated else 17, "truncated": truncated,
            "truncation": {"policy": "only_first", "removed_tokens": 40} if truncated else None,
        }

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    server = FakeEncoder()
    yield server
    server.close()


def test_batches_in_pair_order_with_decision_shaped_predictions(fake, tmp_path):
    pairs = make_pairs(20)
    fake.answers = {key(p): LABELS[(i + 1) % 3] for i, p in enumerate(pairs)}
    seen = []
    run = run_pairs(fake.url, pairs, batch_size=8, dataset_name="nli",
                    progress=lambda done, total: seen.append((done, total)))
    assert fake.batch_sizes == [8, 8, 4] and set(fake.paths) == {"/invocations"}
    assert seen == [(8, 20), (16, 20), (20, 20)]
    assert [p.id for p in run.predictions] == [p.id for p in pairs]
    first = run.predictions[1]
    assert first.option_ids == list(LABELS) and first.expected == "neutral" and first.dataset == "nli"
    assert first.probabilities == pytest.approx([0.1, 0.1, 0.8])  # in label order, whatever the server's key order
    assert first.option_logits == pytest.approx([math.log(0.1), math.log(0.1), math.log(0.8)])
    assert first.allowed_token_mass is None and first.temperature == 1.5 and first.error is None
    assert first.server_forward_ms == pytest.approx(8.0) and first.server_total_ms == pytest.approx(10.0)
    assert run.predictions[19].server_forward_ms == pytest.approx(8.0)  # batch of 4: 32 ms / 4
    batch_one = run.predictions[:8]
    assert len({p.started_at for p in batch_one}) == 1 and len({p.latency_ms for p in batch_one}) == 1
    assert run.predictions[8].started_at >= run.predictions[0].started_at
    write_predictions(tmp_path / "p.jsonl", run.predictions)
    assert read_predictions(tmp_path / "p.jsonl") == run.predictions  # the decision predictions file, unchanged


def test_truncation_is_reported_per_pair(fake):
    pairs = make_pairs(5)
    fake.truncate = {key(pairs[3])}
    run = run_pairs(fake.url, pairs, batch_size=2)
    assert run.n_truncated == 1
    assert [d.truncated for d in run.details] == [False, False, False, True, False]
    assert run.details[3].input_tokens == 512 and run.details[0].input_tokens == 17
    summary = run.truncation_summary()
    assert summary["n_pairs"] == 5 and summary["n_reported"] == 5 and summary["n_truncated"] == 1
    assert summary["truncated"][0]["id"] == "p3" and summary["truncated"][0]["truncation"]["removed_tokens"] == 40


def test_503_retryable_is_retried_with_capped_jittered_backoff(fake):
    pairs = make_pairs(6)
    fake.fail_503 = {key(pairs[2]): 3}  # batch p2,p3 answers 503 three times
    waits = []
    run = run_pairs(fake.url, pairs, batch_size=2, backoff_base_s=0.5, backoff_cap_s=1.0,
                    rng=random.Random(1), sleep=waits.append)
    assert all(p.error is None for p in run.predictions)
    assert [p.retries_503 for p in run.predictions] == [0, 0, 3, 3, 0, 0]
    assert [p.attempts for p in run.predictions] == [1, 1, 4, 4, 1, 1]
    assert len(waits) == 3 and all(0 <= w <= cap for w, cap in zip(waits, [0.5, 1.0, 1.0], strict=True))


def test_503_on_every_attempt_becomes_an_error(fake):
    pairs = make_pairs(2)
    fake.fail_503 = {key(pairs[0]): 99}
    run = run_pairs(fake.url, pairs, batch_size=2, max_attempts=3, sleep=lambda s: None)
    assert all(p.error.startswith("HTTP 503 (retryable) on all 3 attempts") for p in run.predictions)
    assert all(p.probabilities is None for p in run.predictions) and run.details[0].truncated is None


def test_400_fails_only_its_batch_and_is_not_retried(fake):
    pairs = make_pairs(6)
    fake.reject = {key(pairs[3])}
    run = run_pairs(fake.url, pairs, batch_size=2)
    errors = [p.error for p in run.predictions]
    assert errors[:2] == [None, None] and errors[4:] == [None, None]
    assert errors[2] == errors[3] == "HTTP 400: pair 2: hypothesis is empty"
    assert fake.calls[key(pairs[2])] == 1 and run.predictions[2].attempts == 1
    assert run.predictions[2].expected == pairs[2].label and run.predictions[2].option_ids == list(LABELS)


def test_malformed_answer_is_an_error_not_a_guess(fake):
    pairs = make_pairs(4)
    fake.short = {key(pairs[0])}
    run = run_pairs(fake.url, pairs, batch_size=2)
    assert run.predictions[0].error == "malformed response: response has 1 'results' for a batch of 2 pairs"
    assert run.predictions[1].error == run.predictions[0].error and run.predictions[2].error is None


def test_component_header_and_concurrency(fake):
    pairs = make_pairs(9)
    run = run_pairs(fake.url + "/", pairs, batch_size=3, concurrency=3, inference_component="nli-candidate")
    assert [p.id for p in run.predictions] == [p.id for p in pairs]
    assert set(fake.components) == {"nli-candidate"} and sorted(fake.batch_sizes) == [3, 3, 3]


def test_unreachable_endpoint_is_carried_as_errors():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = run_pairs(f"http://127.0.0.1:{port}", make_pairs(3), batch_size=2, timeout_s=2)
    assert all(p.error and p.error.startswith("request failed after 2 attempt(s)") for p in run.predictions)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"batch_size": 0}, "batch_size=0"),
        ({"batch_size": 1000}, "batch_size=1000"),
        ({"concurrency": 0}, "concurrency=0"),
        ({"inference_component": " "}, "inference_component is empty"),
    ],
)
def test_bad_settings_are_refused(kwargs, needle):
    with pytest.raises(BadInput, match=needle):
        run_pairs("http://127.0.0.1:9", make_pairs(1), **kwargs)


def test_bad_url_is_refused():
    with pytest.raises(BadInput, match="not an http"):
        run_pairs("ftp://host/x", make_pairs(1))
