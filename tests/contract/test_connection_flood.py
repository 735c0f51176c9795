"""Endpoints under connection floods (issue 18, items 7 and 8), on real loopback sockets.

One local process holding every connection slot (idle, or mid-request) must not make normal
requests fail, take a copy out of rotation, or make `endpoints heal` replace a router that
answers. Model servers run in-process (the shared `ModelServer`, a stub model); routers are
real `tasks.backends.local.router` processes, started directly or by the `ProcessSupervisor`.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from shiplift.images.common.sagemaker_http import HttpSettings, ModelServer, ModelService
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import NotReady

REPO = Path(__file__).resolve().parents[2]
FAKE = REPO / "tests" / "fakes" / "fake_model_server.py"
ANSWER_WITHIN_S = 2.0  # a normal request under a flood must be answered this fast
PARTIAL_REQUEST = b"GET /ping HTTP/1.1\r\n"  # a request begun and never finished: the connection is busy


@dataclass(frozen=True)
class _StubSettings:
    http: HttpSettings
    model_path: Path


def _stub_service(entered: threading.Event | None, gate: threading.Event | None) -> ModelService[Any, Any]:
    """A model that answers {"ok": true}; given events, it sets `entered` and waits for `gate` first."""

    def answer(settings: Any, engine: Any, body: bytes, received: float) -> dict[str, Any]:
        if entered is not None and gate is not None:
            entered.set()
            assert gate.wait(10), "the test never opened the gate"
        return {"ok": True}

    return ModelService(
        name="stub", prefix="STUB", server_version="stub/1", empty_body="send a JSON object",
        load_settings=lambda env: None, load_engine=lambda settings: object(),
        loaded=lambda settings, engine, seconds: "loaded", answer=answer,
    )


@contextmanager
def model_server(entered: threading.Event | None = None, gate: threading.Event | None = None,
                 **limits: Any) -> Iterator[ModelServer]:
    """The shared model server on a free loopback port with its default limits (or `limits`), loaded."""
    settings = HttpSettings(prefix="STUB", max_body_bytes=1 << 20, max_in_flight=4, queue_timeout_s=5.0,
                            host="127.0.0.1", port=0, **limits)
    server = ModelServer(_stub_service(entered, gate), _StubSettings(settings, Path("/nonexistent")))
    server.engine = object()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _hold(port: int, count: int, first: bytes = b"", source: str = "127.0.0.1") -> list[socket.socket]:
    """`count` connections to `port`, each having sent `first` (nothing: idle)."""
    held = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
            held.append(sock)
            if first:
                sock.sendall(first)
    except BaseException:
        _release(held)
        raise
    return held


def _release(held: list[socket.socket]) -> None:
    for sock in held:
        sock.close()


def _request(port: int, method: str, path: str, body: bytes | None = None, headers: dict | None = None,
             timeout: float = ANSWER_WITHIN_S) -> tuple[int, dict[str, str], bytes, float]:
    """(status, headers, body, seconds taken) of one request."""
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), data, time.monotonic() - started
    finally:
        conn.close()


def _invoke(port: int, path: str = "/invocations") -> tuple[int, dict[str, str], bytes, float]:
    return _request(port, "POST", path, b'{"q": 1}', {"Content-Type": "application/json"})


# -- the model server ----------------------------------------------------------------------------
def test_model_server_serves_while_one_process_holds_every_connection_idle():
    """Item 7: 256 idle connections (the default limit) used to make every request 503 for ~55 s."""
    with model_server() as server:
        port = server.server_address[1]
        held = _hold(port, server.max_connections)
        try:
            status, _, body, took = _invoke(port)
            assert status == 200 and json.loads(body) == {"ok": True}, (status, body)
            assert took < ANSWER_WITHIN_S
            assert _request(port, "GET", "/ping")[0] == 200
        finally:
            _release(held)


def test_a_connection_that_sends_nothing_is_closed_after_the_first_byte_deadline():
    """It used to idle 30 s before its first byte (then had 30 s more for the request)."""
    with model_server() as server:
        sock = _hold(server.server_address[1], 1)[0]
        try:
            started = time.monotonic()
            sock.settimeout(server.first_byte_timeout_s + 3)
            assert sock.recv(1) == b"", "the server closes a silent connection without an answer"
            assert time.monotonic() - started < server.first_byte_timeout_s + 2
        finally:
            sock.close()


def test_admitted_requests_are_never_evicted_by_a_flood_of_new_connections():
    """A request being scored keeps its connection while idle connections come and go over the limit."""
    entered, gate = threading.Event(), threading.Event()
    with model_server(entered, gate, max_connections=8) as server:
        port = server.server_address[1]
        results: list[tuple[int, bytes]] = []
        worker = threading.Thread(target=lambda: results.append(_invoke(port, "/invocations")[::2]))
        worker.start()
        assert entered.wait(5), "the request was never admitted"
        held = _hold(port, 3 * server.max_connections)  # each over the limit evicts an idle one
        try:
            assert _request(port, "GET", "/ping")[0] == 200
            gate.set()
            worker.join(timeout=5)
            assert results == [(200, b'{"ok": true}')], results
        finally:
            gate.set()
            _release(held)


def test_busy_connections_are_capped_per_client_address():
    """One address cannot take every slot with requests it never finishes; another address still gets in."""
    with model_server(max_connections=8, max_connections_per_client=4) as server:
        port = server.server_address[1]
        held = _hold(port, 4, PARTIAL_REQUEST, source="127.0.0.2")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0)) as extra:
                extra.sendall(b"GET /ping HTTP/1.1\r\n\r\n")
                assert extra.recv(4096).startswith(b"HTTP/1.1 503 "), "a fifth busy connection from one address"
            assert _request(port, "GET", "/ping")[0] == 200  # from 127.0.0.1
        finally:
            _release(held)


# -- the router ----------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s}s"
        time.sleep(0.02)


@contextmanager
def router(tmp: Path, *args: str) -> Iterator[dict[str, Any]]:
    """A router process with its default limits (plus `args`); yields its state file's content."""
    state_file = tmp / "router.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "shiplift.tasks.backends.local.router", "--name", "ep-flood", "--port", "0",
         "--state-file", str(state_file), *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait(lambda: state_file.exists() or proc.poll() is not None, 15, "the router wrote its state file")
        assert proc.poll() is None, "the router exited while starting"
        yield json.loads(state_file.read_text())
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _register(info: dict[str, Any], *urls: str) -> None:
    payload = json.dumps({"copies": [{"url": url, "spec_sha256": "0" * 64} for url in urls]}).encode()
    status, _, body, _ = _request(info["admin_port"], "PUT", "/_shiplift/components/echo", payload,
                                  {"Authorization": f"Bearer {info['admin_token']}",
                                   "Content-Type": "application/json"}, timeout=5)
    assert status == 200, body


def _copy_views(info: dict[str, Any]) -> list[dict[str, Any]]:
    body = _request(info["admin_port"], "GET", "/_shiplift/state",
                    headers={"Authorization": f"Bearer {info['admin_token']}"}, timeout=5)[2]
    return json.loads(body)["components"]["echo"]["copies"]


def test_router_serves_while_one_process_holds_every_connection_idle(tmp_path):
    """Item 7: 512 idle connections (the router's default limit) used to make every invocation 503."""
    with model_server() as copy, router(tmp_path) as info:
        _register(info, f"http://127.0.0.1:{copy.server_address[1]}")
        held = _hold(info["port"], 512)
        try:
            status, _, body, took = _invoke(info["port"], "/endpoints/ep-flood/invocations")
            assert status == 200 and json.loads(body) == {"ok": True}, (status, body)
            assert took < ANSWER_WITHIN_S
        finally:
            _release(held)


def test_a_copy_with_every_slot_busy_stays_in_rotation(tmp_path):
    """Item 7: a copy whose connection slots are full answers 503 busy; that is not death (it left rotation in 1.5
    s)."""
    with model_server(max_connections=4) as copy, router(tmp_path, "--health-interval-s", "0.1") as info:
        port = copy.server_address[1]
        _register(info, f"http://127.0.0.1:{port}")
        held = _hold(port, 4, PARTIAL_REQUEST)
        try:
            status, headers, _, _ = _request(port, "GET", "/ping")
            assert status == 503, "every slot of the copy is mid-request"
            checks_end = time.monotonic() + 1.5  # fifteen health checks of the full copy
            while time.monotonic() < checks_end:
                views = _copy_views(info)
                assert views[0]["healthy"], \
                    f"the busy copy left rotation after {1.5 - (checks_end - time.monotonic()):.1f}s"
                time.sleep(0.1)
            assert headers.get("Retry-After") == "1", "the full copy says it is busy"
        finally:
            _release(held)


def test_a_full_copy_hands_the_request_to_another_and_says_busy_when_all_are_full(tmp_path):
    """A copy answering 503 busy ran nothing, so the router tries the next copy; when every copy is full, the caller
    gets the 503 with Retry-After (busy, retry) on both the container and the SageMaker-shaped routes."""
    with model_server(max_connections=4) as full, model_server(max_connections=4) as free, router(tmp_path) as info:
        ports = [full.server_address[1], free.server_address[1]]
        _register(info, *(f"http://127.0.0.1:{port}" for port in ports))
        held = _hold(ports[0], 4, PARTIAL_REQUEST)
        try:
            for _ in range(4):  # whichever copy the router picks first, the free one answers
                status, _, body, _ = _invoke(info["port"], "/endpoints/ep-flood/invocations")
                assert status == 200 and json.loads(body) == {"ok": True}, (status, body)
            held += _hold(ports[1], 4, PARTIAL_REQUEST)
            for path in ("/invocations", "/endpoints/ep-flood/invocations"):
                status, headers, body, _ = _invoke(info["port"], path)
                assert (status, headers.get("Retry-After")) == (503, "1"), (path, status, body)
        finally:
            _release(held)


# -- heal ----------------------------------------------------------------------------------------
@pytest.fixture()
def supervisor(tmp_path) -> Iterator[ProcessSupervisor]:
    hosting = ProcessSupervisor(tmp_path / "state", router_start_timeout_s=15, stop_grace_s=5)
    yield hosting
    hosting.delete_endpoint("ep-heal")


def _router_answers(port: int) -> bool:
    try:
        return _request(port, "GET", "/ping", timeout=5)[0] in (200, 503)
    except OSError:
        return False


def test_heal_leaves_a_router_with_a_flooded_control_port_running_on_its_port(supervisor):
    """Item 8: 512 idle connections on the control port made heal restart a healthy router on a new port."""
    before = supervisor.ensure_endpoint("ep-heal")
    admin_port = supervisor._load("ep-heal").router.admin_port
    held = _hold(admin_port, 512)
    try:
        after = supervisor.ensure_endpoint("ep-heal")
        assert (after.status, after.pid, after.port) == ("running", before.pid, before.port)
    finally:
        _release(held)
    assert _router_answers(before.port)


def test_heal_never_replaces_a_router_whose_control_port_answers_busy(supervisor):
    """Item 8: a control port full of unfinished requests answers 503 busy; heal says so and leaves the router be."""
    before = supervisor.ensure_endpoint("ep-heal")
    admin_port = supervisor._load("ep-heal").router.admin_port
    held = _hold(admin_port, 512, PARTIAL_REQUEST)
    try:
        with pytest.raises(NotReady, match="busy"):
            supervisor.ensure_endpoint("ep-heal")
        router = supervisor._load("ep-heal").router
        assert (router.pid, router.port) == (before.pid, before.port)
    finally:
        _release(held)
    assert _router_answers(before.port)
    assert supervisor.ensure_endpoint("ep-heal").status == "running"


def test_a_dead_router_comes_back_on_its_port(supervisor):
    """Heal replaces a router whose process is gone, and its URL stays the same."""
    before = supervisor.ensure_endpoint("ep-heal")
    os.kill(before.pid, signal.SIGKILL)
    _wait(lambda: not _router_answers(before.port), 5, "the killed router stopped answering")
    after = supervisor.ensure_endpoint("ep-heal")
    assert after.status == "restarted" and after.pid != before.pid
    assert (after.port, after.url) == (before.port, before.url)
    assert _router_answers(after.port)


def test_a_dead_routers_port_taken_meanwhile_moves_the_router_to_a_free_one(supervisor):
    before = supervisor.ensure_endpoint("ep-heal")
    os.kill(before.pid, signal.SIGKILL)
    _wait(lambda: not _router_answers(before.port), 5, "the killed router stopped answering")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", before.port))
        squatter.listen()
        after = supervisor.ensure_endpoint("ep-heal")
    assert after.status == "restarted" and after.port != before.port
    assert _router_answers(after.port)
