"""What the local router holds in memory and answers with: the names it accepts (SageMaker's), a component and its
copies with their load and health, a copy's answer, and a refusal of the router's own."""

from __future__ import annotations

import http.client
import re
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

COMPONENT_HEADER = "X-Amzn-SageMaker-Inference-Component"
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
NAME_MAX_CHARS = 63
# SageMaker's EndpointName / InferenceComponentName pattern: letters, digits, inner hyphens.
NAME_PATTERN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")


def name_problem(name: object) -> str | None:
    """Why `name` is not a valid endpoint/component name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "a name must be a non-empty string"
    if len(name) > NAME_MAX_CHARS:
        return f"name {name!r} has {len(name)} characters; at most {NAME_MAX_CHARS} are allowed"
    if not NAME_PATTERN.fullmatch(name):
        return (
            f"name {name!r} may contain only letters, digits and inner hyphens "
            f"(pattern {NAME_PATTERN.pattern})"
        )
    return None


class Rejected(Exception):
    """A request the router refuses itself, with its HTTP status and SageMaker error code."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


@dataclass
class Copy:
    """One running model-server copy, its live load and its health."""

    url: str
    host: str
    port: int
    spec_sha256: str  # what it runs: during a rolling update a component's copies run two specs
    outstanding: int = 0
    served: int = 0
    healthy: bool = True
    failed_checks: int = 0
    problem: str = ""  # why it is out of rotation

    def view(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "spec_sha256": self.spec_sha256,
            "outstanding": self.outstanding,
            "served": self.served,
            "healthy": self.healthy,
            "problem": self.problem,
        }


@dataclass
class ScaleToZero:
    """A component that scales in to zero copies after `idle_s` without an invocation and out on the first request
    that finds none; `scaler` is the scaling process running now (one at a time).

    A serverless one (`hold_s` set) emulates SageMaker Serverless Inference: a request that finds no copy waits up to
    `hold_s` for the copy it starts instead of failing, requests beyond `max_concurrency` in flight are throttled,
    and a `warm` one (provisioned concurrency) keeps its copy through idle time."""

    idle_s: float
    hold_s: float | None = None
    max_concurrency: int | None = None
    warm: bool = False
    active: int = 0  # requests of this component in flight (admitted, not yet answered)
    last_invocation: float = field(default_factory=time.monotonic)
    scaler: subprocess.Popen | None = None

    def scaling(self) -> bool:
        """True while a scaler runs (reaps it when it has ended)."""
        if self.scaler is not None and self.scaler.poll() is not None:
            self.scaler = None
        return self.scaler is not None


@dataclass
class Component:
    """An inference component: the copies in rotation, and removed copies still finishing requests."""

    name: str
    copies: list[Copy] = field(default_factory=list)
    draining: list[Copy] = field(default_factory=list)
    scale_to_zero: ScaleToZero | None = None

    def health(self) -> dict[str, Any]:
        return {
            "healthy": sum(c.healthy for c in self.copies),
            "copies": len(self.copies),
            "down": {f"copy {i}": c.problem for i, c in enumerate(self.copies, 1) if not c.healthy},
        }


@dataclass
class Upstream:
    """What came back from a copy: a status and body, or a transport failure."""

    copy_url: str | None
    status: int | None = None
    body: bytes = b""
    content_type: str | None = None
    custom_attributes: str | None = None
    failure: str | None = None  # "timeout" | "unreachable" | "broken"
    detail: str = ""  # what went wrong, without the copy's URL (it may reach a client)
    busy: bool = False  # a 503 saying the copy is full (BUSY_HEADER): alive, just not taking more now
    streamed: bool = False  # the answer went to the request's sink as it came: nothing is left to send


# Where a copy's streamed answer (server-sent events) goes as it comes: (content type, its pieces).
Sink = Callable[[str, Iterator[bytes]], None]


def answer_pieces(response: http.client.HTTPResponse) -> Iterator[bytes]:
    """A response's body as it arrives (each read bounded by the socket's timeout; a failed read raises)."""
    while piece := response.read1(1 << 16):
        yield piece


def parse_copy_url(url: object) -> tuple[str, int]:
    """Host and port of a loopback `http://127.0.0.1:PORT` copy URL; ValueError otherwise."""
    if not isinstance(url, str):
        raise ValueError(f"copy URL must be a string, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"copy URL {url!r} must be http://127.0.0.1:PORT (loopback only)")
    if parts.username is not None or parts.password is not None:
        raise ValueError("a copy URL must not carry credentials; give exactly http://127.0.0.1:PORT")
    if parts.port is None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"copy URL {url!r} must be exactly http://127.0.0.1:PORT")
    return parts.hostname, parts.port
