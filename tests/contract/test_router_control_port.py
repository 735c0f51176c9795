"""The router's control port refuses what would turn it on itself, and its data port hides copy URLs (issue 18).

A real router process on loopback: the control API reads no body before the token is checked,
refuses the router's own ports and URLs with credentials as copies; error bodies on the data
port name the component, never a copy's URL.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.contract.test_connection_flood import _free_port, _request, model_server, router

ANSWER_WITHIN_S = 3.0


@pytest.fixture()
def control(tmp_path: Path) -> Iterator[dict[str, Any]]:
    with router(tmp_path, "--health-interval-s", "0.1") as info:
        yield info


def _put(info: dict[str, Any], *urls: str) -> tuple[int, dict[str, Any]]:
    payload = json.dumps({"copies": [{"url": url, "spec_sha256": "0" * 64} for url in urls]}).encode()
    status, _, body, _ = _request(info["admin_port"], "PUT", "/_shiplift/components/echo", payload,
                                  {"Authorization": f"Bearer {info['admin_token']}",
                                   "Content-Type": "application/json"}, timeout=ANSWER_WITHIN_S)
    return status, json.loads(body)


def _answer_to(port: int, data: bytes) -> bytes:
    """Send `data` and read until the server closes (or ANSWER_WITHIN_S passes: a timeout fails the test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as sock:
        sock.sendall(data)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


@pytest.mark.parametrize("which", ["port", "admin_port"])
def test_the_router_refuses_its_own_ports_as_copies(control, which):
    status, body = _put(control, f"http://127.0.0.1:{control[which]}")
    assert status == 400 and "own port" in body["error"], body


def test_copy_urls_with_credentials_are_refused(control):
    status, body = _put(control, f"http://user:s3cret@127.0.0.1:{_free_port()}")
    assert status == 400 and "credentials" in body["error"] and "s3cret" not in json.dumps(body), body


def test_no_body_is_read_before_the_token_is_checked(control):
    """A request without the token is answered 401 from its headers; the body it announces is never awaited."""
    head = b"PUT /_shiplift/components/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n"
    answer = _answer_to(control["admin_port"], head + b"Content-Type: application/json\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    answer = _answer_to(control["admin_port"], head + b"Expect: 100-continue\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 ") and b" 100 " not in answer.split(b"\r\n", 1)[0], answer[:200]


def test_data_port_errors_never_show_copy_urls(control):
    dead = _free_port()  # nothing listens there: every forward is refused
    with model_server() as copy:
        live = copy.server_address[1]
        assert _put(control, f"http://127.0.0.1:{dead}")[0] == 200
        bodies = []
        for path in ("/endpoints/ep-flood/invocations", "/invocations"):
            status, _, body, _ = _request(control["port"], "POST", path, b'{"q": 1}',
                                          {"Content-Type": "application/json"}, timeout=ANSWER_WITHIN_S)
            assert status == 503, body
            bodies.append(body)
        bodies.append(_request(control["port"], "GET", "/ping", timeout=ANSWER_WITHIN_S)[2])
        assert _put(control, f"http://127.0.0.1:{live}", f"http://127.0.0.1:{dead}")[0] == 200
        bodies.append(_request(control["port"], "GET", "/ping", timeout=ANSWER_WITHIN_S)[2])
    for body in bodies:
        assert b"127.0.0.1" not in body and str(dead).encode() not in body and str(live).encode() not in body, body
    assert b"echo" in bodies[0], "the error still names the component"
