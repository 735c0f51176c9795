"""Hostile input at the HTTP layer of the three servers: the SemIf adapter, the encoder and the router.

Everything is loopback. Each class of protocol fault is sent by hand (methods, request lines,
header blocks, Content-Length spellings, framing), then hypothesis sends generated requests; every
answer must be a JSON error in the server's shape (the router's SageMaker routes: `Message` and
`x-amzn-ErrorType`), never a 500, an HTML page or a silent close, and the server must keep serving.
Slow clients are held to one deadline per request without taking a scoring slot, an idle
connection gives way to a new one, and a connection beyond a limit full of requests gets a 503 at once. `pytest -s`
prints the counts per class.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.contract.conftest import ENCODER_SERVER, REPO, SEMIF_SERVER, start_server_process

READ_DEADLINE_S = 1.5
MAX_CONNECTIONS = 8
ANSWER_TIMEOUT_S = READ_DEADLINE_S + 10
FAKE = REPO / "tests" / "fakes" / "fake_model_server.py"
ROUTER_ENDPOINT = "ep-hostile"
EXPECTED_STATUSES = {200, 400, 401, 404, 405, 408, 411, 413, 414, 415, 417, 424, 431, 503, 505}
COUNTS: dict[str, Counter] = {}


@dataclass
class Target:
    """A server under attack: where it listens and the path its invocations take."""

    name: str
    port: int
    invoke_path: str
    proc: subprocess.Popen


def _wait_listening(proc: subprocess.Popen, port_file: Path | None, log: Path) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        if port_file is not None and port_file.exists():
            return json.loads(port_file.read_text())["port"]
        time.sleep(0.05)
    raise AssertionError(f"not listening within 60 s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def targets(tmp_path_factory, tiny_env) -> Iterator[dict[str, Target]]:
    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_onnx_model_dir

    tmp = tmp_path_factory.mktemp("hostile")
    limits = {"READ_DEADLINE_S": str(READ_DEADLINE_S), "MAX_CONNECTIONS": str(MAX_CONNECTIONS), "MAX_IN_FLIGHT": "1"}
    semif = start_server_process(
        tmp / "semif.log",
        {**tiny_env, **{f"SEMIF_{k}": v for k, v in limits.items()}},
        server=SEMIF_SERVER,
        prefix="SEMIF",
    )
    model_dir = write_tiny_onnx_model_dir(tmp / "encoder-model", seed=0)
    encoder_env = {k: v for k, v in os.environ.items() if not k.startswith("ENCODER_")}
    encoder = start_server_process(
        tmp / "encoder.log",
        {**encoder_env, "ENCODER_MODEL_DIR": str(model_dir), "ENCODER_THREADS": "1",
         **{f"ENCODER_{k}": v for k, v in limits.items()}},
        server=ENCODER_SERVER,
        prefix="ENCODER",
    )
    copy_port = _free_port()
    copy = subprocess.Popen([sys.executable, str(FAKE)], env={**os.environ, "FAKE_PORT": str(copy_port)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state_file, router_log = tmp / "router.json", tmp / "router.log"
    with open(router_log, "wb") as log:
        router = subprocess.Popen(
            [sys.executable, "-m", "shiplift.tasks.backends.local.router", "--name", ROUTER_ENDPOINT, "--port", "0",
             "--state-file", str(state_file), "--read-deadline-s", str(READ_DEADLINE_S),
             "--max-connections", str(MAX_CONNECTIONS), "--max-in-flight", "1"],
            stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
        )
    router_port = _wait_listening(router, state_file, router_log)
    info = json.loads(state_file.read_text())
    _wait_ping(copy_port)
    conn = http.client.HTTPConnection("127.0.0.1", info["admin_port"], timeout=10)
    conn.request("PUT", "/_shiplift/components/echo",
                 body=json.dumps({"copies": [{"url": f"http://127.0.0.1:{copy_port}", "spec_sha256": "0" * 64}]}),
                 headers={"Authorization": f"Bearer {info['admin_token']}", "Content-Type": "application/json"})
    assert conn.getresponse().status == 200
    conn.close()
    found = {
        "semif": Target("semif", semif.client.port, "/invocations", semif.proc),
        "encoder": Target("encoder", encoder.client.port, "/invocations", encoder.proc),
        "router": Target("router", router_port, f"/endpoints/{ROUTER_ENDPOINT}/invocations", router),
    }
    yield found
    for proc in (semif.proc, encoder.proc, router, copy):
        proc.terminate()
    for proc in (semif.proc, encoder.proc, router, copy):
        proc.wait(timeout=10)
    if COUNTS:
        print("\nhostile-input counts (class: sent / answered as expected / anything else)")
        for name, counter in sorted(COUNTS.items()):
            print(f"  {name}: {counter['sent']} / {counter['expected']} / {counter['sent'] - counter['expected']}")


@pytest.fixture(params=["semif", "encoder", "router"])
def target(request, targets) -> Target:
    return targets[request.param]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ping(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/ping")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"port {port} never answered /ping")


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self):
        return json.loads(self.body)


class _KeepOpen:
    """One buffered reader shared by the successive answers on a connection (each HTTPResponse closes its own)."""

    def __init__(self, reader):
        self.reader = reader

    def makefile(self, mode: str):
        return self

    def __getattr__(self, name: str):
        return getattr(self.reader, name)

    def close(self) -> None:
        pass


def _exchange(port: int, data: bytes, *, half_close: bool = True, method: str = "GET") -> list[Answer]:
    """Send raw bytes, (half-)close, and read every answer until the server closes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
    try:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may answer and close before it read everything: its answer still counts
        answers = []
        stream = _KeepOpen(sock.makefile("rb"))
        while True:
            # only the first answer is to the sent method; bytes after it are read as further requests
            # type: ignore[arg-type]
            response = http.client.HTTPResponse(stream, method=method if not answers else "GET")
            try:
                response.begin()
            except http.client.RemoteDisconnected:
                break
            answers.append(Answer(response.status, response.msg, response.read()))
            if response.will_close:
                break
        return answers
    finally:
        sock.close()


def _count(group: str, ok: bool) -> None:
    counter = COUNTS.setdefault(group, Counter())
    counter["sent"] += 1
    counter["expected"] += ok


def _assert_json_error(answer: Answer, status: int | None = None, method: str = "GET") -> None:
    """A JSON error: the container's {"error": ...} or SageMaker's {"Message": ...} with x-amzn-ErrorType."""
    assert answer.headers.get("Content-Type") == "application/json", (answer.status, answer.headers)
    if status is not None:
        assert answer.status == status, (answer.status, answer.body)
    if method == "HEAD":
        assert answer.body == b"", "a HEAD answer carries no body"
        return
    payload = answer.json()
    message = payload.get("error", payload.get("Message"))
    assert isinstance(message, str) and message, payload
    if "Message" in payload:
        assert answer.headers.get("x-amzn-ErrorType"), answer.headers


def _check_class(target: Target, group: str, data: bytes, status: int, needle: str = "", method: str = "GET") -> None:
    answers = _exchange(target.port, data, method=method)
    ok = False
    try:
        assert answers, "the server closed without an answer"
        _assert_json_error(answers[0], status, method)
        if needle:
            assert needle in answers[0].body.decode(), answers[0].body
        ok = True
    finally:
        _count(f"{group} ({target.name})", ok)


def _head(lines: list[str], body: bytes = b"") -> bytes:
    return "".join(f"{line}\r\n" for line in lines).encode("latin-1") + b"\r\n" + body


# -- methods ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["HEAD", "OPTIONS", "TRACE", "CONNECT", "get", "post", "PATCH", "BREW"])
def test_unsupported_methods_get_a_json_405_with_allow(target, method):
    _check_class(target, "methods", _head([f"{method} /ping HTTP/1.1", "Host: x"]), 405, method=method)
    answer = _exchange(target.port, _head([f"{method} /ping HTTP/1.1", "Host: x"]), method=method)[0]
    assert set(answer.headers["Allow"].split(", ")) >= {"GET", "POST"}


# -- request lines ----------------------------------------------------------------------------------
BAD_REQUEST_LINES = {
    "no target": ("GET", 400),
    "no version (HTTP/0.9)": ("GET /ping", 400),
    "extra word": ("GET /ping HTTP/1.1 extra", 400),
    "relative target": ("GET ping HTTP/1.1", 400),
    "lowercase protocol": ("GET /ping http/1.1", 400),
    "two spaces": ("GET  /ping HTTP/1.1", 400),
    "tab separated": ("GET\t/ping\tHTTP/1.1", 400),
    "HTTP/2.0": ("GET /ping HTTP/2.0", 505),
    "HTTP/0.9 spelled": ("GET /ping HTTP/0.9", 505),
    "HTTP/1.2": ("GET /ping HTTP/1.2", 505),
    "empty line": ("", 400),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUEST_LINES))
def test_malformed_request_lines_get_json_errors(target, case):
    line, status = BAD_REQUEST_LINES[case]
    _check_class(target, "request line", _head([line, "Host: x"]), status)


def test_non_ascii_request_line_and_overlong_lines(target):
    _check_class(target, "request line", "GET /pïng HTTP/1.1\r\nHost: x\r\n\r\n".encode(), 400, "ASCII")
    _check_class(target, "request line", _head([f"GET /{'a' * 9000} HTTP/1.1", "Host: x"]), 414)


# -- header blocks ----------------------------------------------------------------------------------
BAD_HEADER_BLOCKS = {
    "space before colon": (["Host : x"], 400),
    "no colon": (["Host x"], 400),
    "empty name": ([": x"], 400),
    "obsolete folding": (["Host: x", " continued"], 400),
    "NUL in a value": (["X-A: a\x00b"], 400),
    "line over 8 KiB": ([f"X-Big: {'b' * 9000}"], 431),
    "101 headers": ([f"X-{i}: v" for i in range(101)], 431),
    "block over 32 KiB": ([f"X-{i}: {'v' * 7000}" for i in range(6)], 431),
}


@pytest.mark.parametrize("case", sorted(BAD_HEADER_BLOCKS))
def test_malformed_or_oversized_header_blocks_get_json_errors(target, case):
    lines, status = BAD_HEADER_BLOCKS[case]
    _check_class(target, "header block", _head(["GET /ping HTTP/1.1", *lines]), status)


# -- Content-Length ---------------------------------------------------------------------------------
BAD_LENGTHS = ["١٠", "²", "1_0", "+10", "-1", "0x10", "1e3", "10, 10", "ten", "1" * 16, ""]


@pytest.mark.parametrize("length", BAD_LENGTHS, ids=[repr(v) for v in BAD_LENGTHS])
def test_content_length_must_be_plain_ascii_digits(target, length):
    data = f"POST {target.invoke_path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n".encode()
    data += b"Content-Length: " + length.encode("utf-8") + b"\r\n\r\n" + b"{}" * 8
    _check_class(target, "content-length", data, 400, "Content-Length")


def test_router_faults_on_its_sagemaker_routes_use_the_sagemaker_shape(targets):
    router = targets["router"]
    data = _head([f"POST {router.invoke_path} HTTP/1.1", "Host: x", "Content-Length: +2"], b"{}")
    answer = _exchange(router.port, data)[0]
    assert answer.status == 400 and answer.headers["x-amzn-ErrorType"] == "ValidationError"
    assert "Content-Length" in answer.json()["Message"]
    _count("sagemaker shape (router)", True)


def test_router_control_json_nesting_is_bounded(targets, tmp_path_factory):
    router = targets["router"]
    info = json.loads((Path(router.proc.args[router.proc.args.index("--state-file") + 1])).read_text())
    conn = http.client.HTTPConnection("127.0.0.1", info["admin_port"], timeout=ANSWER_TIMEOUT_S)
    deep = b"[" * 100_000 + b"]" * 100_000
    conn.request("PUT", "/_shiplift/components/deep", body=deep,
                 headers={"Authorization": f"Bearer {info['admin_token']}", "Content-Type": "application/json"})
    response = conn.getresponse()
    payload = json.loads(response.read())
    conn.close()
    assert response.status == 400 and "nested too deeply" in payload["error"], payload
    _count("control nesting (router)", True)


def test_framing_faults(target):
    post = [f"POST {target.invoke_path} HTTP/1.1", "Host: x", "Content-Type: application/json"]
    _check_class(target, "framing", _head(post + ["Content-Length: 2", "Content-Length: 2"], b"{}"), 400, "once")
    _check_class(target, "framing", _head(post + ["Transfer-Encoding: chunked"], b"2\r\n{}\r\n0\r\n\r\n"), 411)
    _check_class(target, "framing", _head(post + ["Content-Length: 2", "Expect: magic"], b"{}"), 417)
    _check_class(target, "framing", _head(post + ["Content-Length: 50"], b'{"a": 1}'), 400, "ended after 8 of 50")
    _check_class(target, "framing", _head(post + [f"Content-Length: {1 << 40}"]), 413)


def test_a_body_on_a_bodiless_request_is_not_read_as_the_next_request(target):
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    data = _head(["GET /ping HTTP/1.1", "Host: x", f"Content-Length: {len(smuggled)}"], smuggled)
    data += _head(["GET /nope HTTP/1.1", "Host: x", "Connection: close"])
    answers = _exchange(target.port, data)
    assert [a.status for a in answers] == [200, 404], [(a.status, a.body) for a in answers]
    assert b"smuggled" not in answers[1].body and b"/nope" in answers[1].body
    _count(f"pipelining ({target.name})", True)


def test_expect_100_continue_is_honoured(target):
    sock = socket.create_connection(("127.0.0.1", target.port), timeout=ANSWER_TIMEOUT_S)
    try:
        sock.sendall(_head(["GET /ping HTTP/1.1", "Host: x", "Content-Length: 2", "Expect: 100-continue"]))
        assert sock.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(b"{}")
        assert b"200 OK" in sock.recv(4096)
    finally:
        sock.close()


# -- slow clients and connection limits -------------------------------------------------------------
def _trickle(port: int, data: bytes, pause_s: float, stop: threading.Event) -> bytes:
    """Send one byte every `pause_s` until the server answers or `stop`; what the server answered."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_TIMEOUT_S)
    sock.settimeout(pause_s)
    received = b""
    try:
        for byte in data:
            if stop.is_set():
                break
            try:
                sock.sendall(bytes([byte]))
                received += sock.recv(4096)
                if received:
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        sock.settimeout(ANSWER_TIMEOUT_S)
        while not received.endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
        return received
    finally:
        sock.close()


def _invoke_ok(target: Target) -> int:
    body = {"semif": {"decision": {"id": "d", "state": "s", "question": "Which one?",
                                   "options": [{"id": "a", "description": "x"}, {"id": "b", "description": "y"}]}},
            "encoder": {"pairs": [{"premise": "A man plays.", "hypothesis": "A person plays."}]},
            "router": {"x": 1}}[target.name]
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=ANSWER_TIMEOUT_S)
    try:
        conn.request("POST", target.invoke_path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_trickling_clients_get_408_and_never_hold_a_scoring_slot(target):
    """Four clients trickle a body one byte at a time to a server that scores one request at a time."""
    head = _head([f"POST {target.invoke_path} HTTP/1.1", "Host: x", "Content-Type: application/json",
                  "Content-Length: 400"], b"{" + b" " * 398 + b"}")
    stop, results = threading.Event(), []
    started = time.monotonic()
    threads = [threading.Thread(target=lambda: results.append(_trickle(target.port, head, 0.2, stop)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.3)
        statuses = [_invoke_ok(target) for _ in range(3)]  # while all four trickle
        assert statuses == [200, 200, 200], statuses
    finally:
        for thread in threads:
            thread.join(timeout=ANSWER_TIMEOUT_S + 5)
        stop.set()
    elapsed = time.monotonic() - started
    assert len(results) == 4 and all(b" 408 " in r.split(b"\r\n", 1)[0] for r in results), results
    assert all(b"not received in full" in r for r in results)
    assert elapsed < READ_DEADLINE_S + 5, f"the deadline is per request, yet the clients were held {elapsed:.1f}s"
    _count(f"slow clients ({target.name})", True)


def test_trickled_headers_hit_the_same_deadline(target):
    stop = threading.Event()
    answer = _trickle(target.port, _head(["GET /ping HTTP/1.1"] + [f"X-{i}: v" for i in range(50)]), 0.1, stop)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    _count(f"slow clients ({target.name})", True)


def test_connections_over_the_limit_get_503_at_once_then_recover(target):
    """Idle connections give way to a new one; when every one is mid-request, one more gets 503 busy at once."""
    idle = [socket.create_connection(("127.0.0.1", target.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        answers = _exchange(target.port, _head(["GET /ping HTTP/1.1", "Host: x"]))
        assert answers and answers[0].status == 200, [(a.status, a.body) for a in answers]
    finally:
        for sock in idle:
            sock.close()
    busy = [socket.create_connection(("127.0.0.1", target.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in busy:
            sock.sendall(b"GET /ping HTTP/1.1\r\n")  # begun, never finished (until the read deadline)
        answers = _exchange(target.port, _head(["GET /ping HTTP/1.1", "Host: x"]))
        assert answers and answers[0].status == 503, [(a.status, a.body) for a in answers]
        _assert_json_error(answers[0], 503)
        assert answers[0].headers["Retry-After"] == "1", "busy, not dead"
    finally:
        for sock in busy:
            sock.close()
    deadline = time.monotonic() + 10
    while _exchange(target.port, _head(["GET /ping HTTP/1.1", "Host: x"]))[0].status != 200:
        assert time.monotonic() < deadline, "closing the idle connections did not free their slots"
        time.sleep(0.1)
    _count(f"connection limit ({target.name})", True)


# -- generated requests -----------------------------------------------------------------------------
_latin1 = st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=30)
_method = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "get", "POST "]) | st.text(
    st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=8)
_path = st.sampled_from(["/ping", "/invocations", f"/endpoints/{ROUTER_ENDPOINT}/invocations",
                         "/endpoints/x/invocations",
                         "/_shiplift/state", "*", "/%00", "/?a=b"]) | _latin1.map(lambda t: "/" + t)
_version = st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/1.1 ", "http/1.1", ""])
_length = st.one_of(st.integers(0, 300).map(str), st.sampled_from(BAD_LENGTHS), _latin1)
_header = st.one_of(
    st.tuples(st.just("Content-Type"),
              st.sampled_from(["application/json", "text/plain", "application/json; charset=latin-1"])),
    st.tuples(st.just("Content-Length"), _length),
    st.tuples(st.sampled_from(["Transfer-Encoding", "Expect", "Connection", "X-Amzn-SageMaker-Inference-Component",
                               "Authorization"]), _latin1),
    st.tuples(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=0, max_size=12), _latin1),
)
_body = st.one_of(
    st.binary(max_size=200),
    st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=10),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                 max_leaves=10).map(lambda v: json.dumps(v).encode()),
    st.integers(1, 3000).map(lambda depth: b"[" * depth + b"]" * depth),
)


@st.composite
def _requests(draw) -> tuple[bytes, str]:
    if draw(st.booleans()):
        method = draw(_method)
        line = f"{method} {draw(_path)} {draw(_version)}".rstrip(" ")
    else:
        method, line = "GET", draw(_latin1)  # not a request line: whatever comes back is not a HEAD answer
    headers = draw(st.lists(_header, max_size=6))
    eol = draw(st.sampled_from(["\r\n", "\n"]))
    head = line + eol + "".join(f"{name}: {value}{eol}" for name, value in headers) + eol
    return head.encode("utf-8") + draw(_body), method


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(sent=_requests())
@example(sent=(b"HEAD /ping HTTP/1.1\r\n\r\n\x00", "HEAD"))  # a HEAD answer, then a 400 with its body
def test_any_request_gets_json_answers_and_never_a_500(targets, sent):
    data, method = sent
    for target in targets.values():
        answers = _exchange(target.port, data, method=method)
        ok = False
        try:
            assert answers, f"{target.name} closed without an answer"
            for answer in answers:
                assert answer.status in EXPECTED_STATUSES, (target.name, answer.status, answer.body)
                if answer.status >= 400:
                    _assert_json_error(answer, method=method if answer is answers[0] else "GET")
                else:
                    assert answer.headers.get("Content-Type") == "application/json", answer.headers
            ok = True
        finally:
            _count(f"generated ({target.name})", ok)


def test_servers_still_serve_after_the_attack(targets):
    for target in targets.values():
        assert target.proc.poll() is None, f"{target.name} exited"
        assert _invoke_ok(target) == 200
