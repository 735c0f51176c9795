"""JSON requests to processes on 127.0.0.1: the router's control API and the copies' `GET /ping`, with a busy answer
(503 with Retry-After: alive but full) told apart from a dead process; and free ports for new copies."""

from __future__ import annotations

import http.client
import json
import socket
from typing import Any

from shiplift.images.common.sagemaker_http import answered_busy
from shiplift.tasks.hashing import canonical_json

ADMIN_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 1.0


class Busy(http.client.HTTPException):
    """A server answered 503 with Retry-After: it is alive but full; ask again later, never replace it."""


def free_port() -> int:
    """A loopback port no socket holds now (a copy is started on it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def request_json(
    port: int,
    method: str,
    path: str,
    payload: Any = None,
    timeout: float = ADMIN_TIMEOUT_S,
    token: str | None = None,
) -> tuple[int, Any]:
    """One JSON request to 127.0.0.1:port (with a bearer token for a control port); raises
    OSError/HTTPException when unreachable, Busy when it answers that it is full."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        body = canonical_json(payload) if payload is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        if answered_busy(response.status, response.headers):
            raise Busy(f"127.0.0.1:{port} answered 503 busy: {data[:300].decode('utf-8', errors='replace')}")
        try:
            return response.status, json.loads(data) if data else None
        except ValueError:
            return response.status, data.decode("utf-8", errors="replace")
    finally:
        conn.close()


def _probe(port: int) -> tuple[int | None, bool]:
    """(status of GET /ping on a copy, whether it was a busy 503); (None, False) when it does not answer in time."""
    try:
        return request_json(port, "GET", "/ping", timeout=PING_TIMEOUT_S)[0], False
    except Busy:
        return 503, True
    except (OSError, http.client.HTTPException):
        return None, False


def ping_status(port: int) -> int | None:
    """Status of GET /ping on a copy, or None when it does not answer in time."""
    return _probe(port)[0]


def answers_ping(port: int) -> bool:
    """True when a copy's /ping says ready, or busy (full, yet alive): heal leaves it running."""
    status, busy = _probe(port)
    return status == 200 or busy
