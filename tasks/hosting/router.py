"""The local endpoint process: the SageMaker runtime API in front of model-server copies.

Run as `python -m tasks.hosting.router --name NAME --port 0 --state-file FILE`. It serves

- `POST /endpoints/{EndpointName}/invocations` in the shape botocore's `sagemaker-runtime`
  client expects (restjson; errors carry `x-amzn-ErrorType` and a JSON `Message`), honouring
  `X-Amzn-SageMaker-Inference-Component`;
- the container contract directly: `GET /ping`, `POST /invocations` (model answers verbatim);
- a loopback admin API under `/_shiplift/`: `PUT|DELETE components/{name}`, `GET state`,
  `GET metrics`, `POST shutdown`.

Each request goes to the copy of the component with the fewest outstanding requests. The
router keeps its components in memory only; `tasks.hosting.local` persists them and registers
them again after a restart. Stdlib only, so it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tasks.atomic import write_json_atomic
from typing import Any

COMPONENT_HEADER = "X-Amzn-SageMaker-Inference-Component"
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
ADMIN_PREFIX = "/_shiplift/"
NAME_MAX_CHARS = 63
# SageMaker's EndpointName / InferenceComponentName pattern: letters, digits, inner hyphens.
NAME_PATTERN = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
LATENCY_BUCKETS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
LATENCY_WINDOW = 4096
ADMIN_MAX_BODY_BYTES = 1 << 20
PING_TIMEOUT_S = 2.0


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
    """One running model-server copy and its live load."""

    url: str
    host: str
    port: int
    outstanding: int = 0
    served: int = 0


@dataclass
class Component:
    """An inference component: its spec (opaque here) and its copies."""

    name: str
    spec: dict[str, Any]
    copies: list[Copy]


@dataclass
class Upstream:
    """What came back from a copy: a status and body, or a transport failure."""

    copy_url: str | None
    status: int | None = None
    body: bytes = b""
    content_type: str | None = None
    custom_attributes: str | None = None
    failure: str | None = None  # "timeout" | "unreachable" | "broken"
    detail: str = ""


@dataclass
class ComponentMetrics:
    """Counters in the spirit of CloudWatch's endpoint metrics, per component.

    A transport failure (timeout, reset, no copy reachable) counts as a model error and a 5xx.
    """

    invocations: int = 0
    invocation_4xx_errors: int = 0
    invocation_5xx_errors: int = 0
    model_errors: int = 0
    histogram: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    recent_ms: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def record(self, status: int | None, latency_ms: float) -> None:
        """Count one forwarded request (caller holds the router lock)."""
        self.invocations += 1
        if status is None or status >= 500:
            self.invocation_5xx_errors += 1
        elif status >= 400:
            self.invocation_4xx_errors += 1
        if status is None or not 200 <= status < 300:
            self.model_errors += 1
        bucket = next(
            (i for i, edge in enumerate(LATENCY_BUCKETS_MS) if latency_ms <= edge),
            len(LATENCY_BUCKETS_MS),
        )
        self.histogram[bucket] += 1
        self.recent_ms.append(latency_ms)

    def snapshot(self) -> dict[str, Any]:
        """JSON view: counters, the histogram and percentiles of the recent window."""
        ordered = sorted(self.recent_ms)

        def percentile(q: float) -> float | None:
            if not ordered:
                return None
            return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)

        edges = [f"le_{edge}" for edge in LATENCY_BUCKETS_MS] + ["gt_60000"]
        return {
            "invocations": self.invocations,
            "invocation_4xx_errors": self.invocation_4xx_errors,
            "invocation_5xx_errors": self.invocation_5xx_errors,
            "model_errors": self.model_errors,
            "latency_ms": {
                "histogram": dict(zip(edges, self.histogram)),
                "window": len(ordered),
                "p50": percentile(0.50),
                "p95": percentile(0.95),
                "p99": percentile(0.99),
            },
        }


def parse_copy_url(url: object) -> tuple[str, int]:
    """Host and port of a loopback `http://127.0.0.1:PORT` copy URL; ValueError otherwise."""
    if not isinstance(url, str):
        raise ValueError(f"copy URL must be a string, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in ("127.0.0.1", "localhost"):
        raise ValueError(f"copy URL {url!r} must be http://127.0.0.1:PORT (loopback only)")
    if parts.port is None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"copy URL {url!r} must be exactly http://127.0.0.1:PORT")
    return parts.hostname, parts.port


class Router:
    """In-memory components, least-outstanding routing, upstream calls and metrics."""

    def __init__(
        self,
        name: str,
        *,
        invoke_timeout_s: float,
        connect_timeout_s: float,
        max_body_bytes: int,
        max_in_flight: int,
    ):
        self.name = name
        self.port = 0
        self.invoke_timeout_s = invoke_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.in_flight = threading.BoundedSemaphore(max_in_flight)
        self.lock = threading.Lock()
        self.components: dict[str, Component] = {}
        self.metrics: dict[str, ComponentMetrics] = {}
        self.rejected: dict[str, int] = {}
        self.rotation = itertools.count()

    # -- components -------------------------------------------------------------------------
    def put_component(self, name: str, spec: dict[str, Any], urls: list[str]) -> bool:
        """Register or replace a component's copies at once; True when it replaced one."""
        copies = []
        for url in urls:
            host, port = parse_copy_url(url)
            copies.append(Copy(url=url.rstrip("/"), host=host, port=port))
        with self.lock:
            replaced = name in self.components
            self.components[name] = Component(name=name, spec=spec, copies=copies)
            self.metrics.setdefault(name, ComponentMetrics())
        return replaced

    def delete_component(self, name: str) -> bool:
        """Forget a component and its metrics; False when it was not registered."""
        with self.lock:
            self.metrics.pop(name, None)
            return self.components.pop(name, None) is not None

    def resolve(self, header_value: str | None) -> Component:
        """The component a request targets: named by the header, or the only one."""
        with self.lock:
            if header_value:
                component = self.components.get(header_value)
                if component is None:
                    known = ", ".join(sorted(self.components)) or "none"
                    raise Rejected(
                        400,
                        "ValidationError",
                        f"Inference Component {header_value} not found on endpoint "
                        f"{self.name} (components: {known}).",
                    )
                return component
            if len(self.components) == 1:
                return next(iter(self.components.values()))
            if not self.components:
                raise Rejected(
                    400,
                    "ValidationError",
                    f"Endpoint {self.name} has no inference component yet; create one first.",
                )
            raise Rejected(
                400,
                "ValidationError",
                f"Endpoint {self.name} hosts {len(self.components)} inference components "
                f"({', '.join(sorted(self.components))}); name one with InferenceComponentName "
                f"(header {COMPONENT_HEADER}).",
            )

    def count_rejection(self, code: str) -> None:
        """Count a request the router refused before it reached a copy."""
        with self.lock:
            self.rejected[code] = self.rejected.get(code, 0) + 1

    # -- routing ----------------------------------------------------------------------------
    def _acquire(self, component: Component, tried: set[str]) -> Copy | None:
        """Take the untried copy with the fewest outstanding requests (ties rotate)."""
        with self.lock:
            candidates = [c for c in component.copies if c.url not in tried]
            if not candidates:
                return None
            offset = next(self.rotation)
            n = len(candidates)
            ranked = sorted(range(n), key=lambda i: (candidates[i].outstanding, (i - offset) % n))
            chosen = candidates[ranked[0]]
            chosen.outstanding += 1
            return chosen

    def _release(self, copy: Copy, served: bool) -> None:
        with self.lock:
            copy.outstanding -= 1
            copy.served += served

    def forward(
        self, component: Component, method: str, path: str, body: bytes | None, headers: dict
    ) -> Upstream:
        """Send one request to the least-loaded copy; a refused connection tries the next."""
        tried: set[str] = set()
        started = time.monotonic()
        result = Upstream(copy_url=None, failure="unreachable", detail="no copy is registered")
        while True:
            copy = self._acquire(component, tried)
            if copy is None:
                break
            tried.add(copy.url)
            try:
                result = self._call(copy, method, path, body, headers)
            finally:
                self._release(copy, served=method == "POST")
            if result.failure != "unreachable":
                break
        if method == "POST":
            with self.lock:
                self.metrics.setdefault(component.name, ComponentMetrics()).record(
                    result.status, (time.monotonic() - started) * 1000.0
                )
        return result

    def _call(
        self, copy: Copy, method: str, path: str, body: bytes | None, headers: dict
    ) -> Upstream:
        timeout = PING_TIMEOUT_S if method == "GET" else self.invoke_timeout_s
        conn = http.client.HTTPConnection(copy.host, copy.port, timeout=self.connect_timeout_s)
        try:
            try:
                conn.connect()
            except OSError as exc:
                return Upstream(copy.url, failure="unreachable", detail=f"{copy.url}: {exc}")
            conn.sock.settimeout(timeout)
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read(self.max_body_bytes + 1)
            except TimeoutError:
                return Upstream(
                    copy.url,
                    failure="timeout",
                    detail=f"{copy.url} did not answer within {timeout:g}s",
                )
            except (OSError, http.client.HTTPException) as exc:
                return Upstream(copy.url, failure="broken", detail=f"{copy.url}: {exc!r}")
            if len(data) > self.max_body_bytes:
                return Upstream(
                    copy.url,
                    failure="broken",
                    detail=f"{copy.url} answered more than {self.max_body_bytes} bytes",
                )
            return Upstream(
                copy.url,
                status=response.status,
                body=data,
                content_type=response.getheader("Content-Type"),
                custom_attributes=response.getheader(CUSTOM_ATTRIBUTES_HEADER),
            )
        finally:
            conn.close()

    # -- views ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON view of the router and its components' copies."""
        with self.lock:
            return {
                "name": self.name,
                "pid": os.getpid(),
                "port": self.port,
                "components": {
                    name: {
                        "spec": comp.spec,
                        "copies": [
                            {"url": c.url, "outstanding": c.outstanding, "served": c.served}
                            for c in comp.copies
                        ],
                    }
                    for name, comp in sorted(self.components.items())
                },
            }

    def metrics_view(self) -> dict[str, Any]:
        """JSON view of every component's counters and latency."""
        with self.lock:
            return {
                "endpoint": self.name,
                "components": {name: m.snapshot() for name, m in sorted(self.metrics.items())},
                "rejected": dict(sorted(self.rejected.items())),
            }


class RouterServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that carries the Router and a generous listen backlog."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], router: Router):
        self.router = router
        super().__init__(address, Handler)


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 front door: SageMaker runtime, container contract and admin routes."""

    protocol_version = "HTTP/1.1"
    server_version = "shiplift-router/1"
    timeout = 120  # seconds a client may idle or trickle before its connection is closed
    server: RouterServer

    # -- plumbing ---------------------------------------------------------------------------
    def setup(self) -> None:
        """Headers and body go out in separate writes: without TCP_NODELAY, Nagle plus the client's
        delayed ACK stall every keep-alive response by ~40 ms."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        sys.stderr.write(f"{self.log_date_time_string()} {format % args}\n")

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str | None = "application/json",
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, payload: Any, close: bool = False) -> None:
        self._send(status, json.dumps(payload).encode(), close=close)

    def _reject(self, rejected: Rejected, sagemaker: bool, close: bool = False) -> None:
        """Answer a router-level refusal in SageMaker's error shape or the container's."""
        self.server.router.count_rejection(rejected.code)
        if sagemaker:
            self._send(
                rejected.status,
                json.dumps({"Message": rejected.message}).encode(),
                headers={"x-amzn-ErrorType": rejected.code},
                close=close,
            )
        else:
            self._json(rejected.status, {"error": rejected.message}, close=close)

    def _read_body(self, limit: int) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            raise Rejected(411, "ValidationError", "Send the body with a Content-Length header.")
        raw = self.headers.get("Content-Length", "0")
        try:
            length = int(raw)
        except ValueError:
            raise Rejected(400, "ValidationError", f"Content-Length {raw!r} is not a number.")
        if length < 0 or length > limit:
            raise Rejected(
                413,
                "ValidationError",
                f"Request body is {length} bytes; this endpoint accepts at most {limit}.",
            )
        return self.rfile.read(length)

    def _path(self) -> str:
        return urllib.parse.urlsplit(self.path).path

    # -- verbs ------------------------------------------------------------------------------
    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        path = self._path()
        if path == "/ping":
            self._ping()
        elif path == ADMIN_PREFIX + "state":
            self._json(200, self.server.router.state())
        elif path == ADMIN_PREFIX + "metrics":
            self._json(200, self.server.router.metrics_view())
        else:
            self._json(404, {"error": f"no route GET {path}"})

    def do_POST(self) -> None:  # noqa: N802
        path = self._path()
        match = re.fullmatch(r"/endpoints/([^/]+)/invocations", path)
        if match:
            self._invoke(urllib.parse.unquote(match.group(1)), sagemaker=True)
        elif path == "/invocations":
            self._invoke(None, sagemaker=False)
        elif path == ADMIN_PREFIX + "shutdown":
            self._json(200, {"stopping": self.server.router.name}, close=True)
            threading.Thread(target=self.server.shutdown, daemon=True).start()
        else:
            self._json(404, {"error": f"no route POST {path}"}, close=True)

    def do_PUT(self) -> None:  # noqa: N802
        path = self._path()
        name = self._admin_component_name(path)
        if name is None:
            return
        try:
            payload = json.loads(self._read_body(ADMIN_MAX_BODY_BYTES) or b"null")
        except Rejected as exc:
            self._json(exc.status, {"error": exc.message}, close=True)
            return
        except ValueError as exc:
            self._json(400, {"error": f"body is not JSON: {exc}"})
            return
        problem = _component_payload_problem(payload)
        if problem:
            self._json(400, {"error": problem})
            return
        try:
            replaced = self.server.router.put_component(name, payload["spec"], payload["copies"])
        except ValueError as exc:
            self._json(400, {"error": str(exc)})
            return
        self._json(200, {"component": name, "copies": len(payload["copies"]), "replaced": replaced})

    def do_DELETE(self) -> None:  # noqa: N802
        path = self._path()
        name = self._admin_component_name(path)
        if name is None:
            return
        if self.server.router.delete_component(name):
            self._json(200, {"deleted": name})
        else:
            self._json(404, {"error": f"component {name} is not registered"})

    # -- handlers ---------------------------------------------------------------------------
    def _admin_component_name(self, path: str) -> str | None:
        prefix = ADMIN_PREFIX + "components/"
        if not path.startswith(prefix):
            self._json(404, {"error": f"no route {self.command} {path}"}, close=True)
            return None
        name = urllib.parse.unquote(path[len(prefix) :])
        problem = name_problem(name)
        if problem:
            self._json(400, {"error": problem}, close=True)
            return None
        return name

    def _ping(self) -> None:
        router = self.server.router
        with router.lock:
            components = list(router.components.values())
        if not components:
            self._json(503, {"status": "unhealthy", "error": "no component is registered"})
            return
        health = {}
        for component in components:
            result = router.forward(component, "GET", "/ping", None, {})
            health[component.name] = result.status == 200
        ok = all(health.values())
        self._json(
            200 if ok else 503, {"status": "ok" if ok else "unhealthy", "components": health}
        )

    def _invoke(self, endpoint_name: str | None, sagemaker: bool) -> None:
        router = self.server.router
        if not router.in_flight.acquire(blocking=False):
            self._reject(
                Rejected(
                    503,
                    "ServiceUnavailable",
                    f"Endpoint {router.name} has {router.max_in_flight} requests in flight; "
                    "retry with backoff.",
                ),
                sagemaker,
                close=True,
            )
            return
        try:
            try:
                if endpoint_name is not None and endpoint_name != router.name:
                    raise Rejected(400, "ValidationError", f"Endpoint {endpoint_name} not found.")
                body = self._read_body(router.max_body_bytes)
                component = router.resolve(self.headers.get(COMPONENT_HEADER))
            except Rejected as exc:
                self._reject(exc, sagemaker, close=True)
                return
            headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
            for key in ("Accept", CUSTOM_ATTRIBUTES_HEADER):
                if self.headers.get(key):
                    headers[key] = self.headers[key]
            result = router.forward(component, "POST", "/invocations", body, headers)
            if sagemaker:
                self._answer_sagemaker(component, result)
            else:
                self._answer_container(result)
        finally:
            router.in_flight.release()

    def _answer_container(self, result: Upstream) -> None:
        """Container contract: the model's answer verbatim; transport failures as JSON."""
        if result.failure is None:
            self._send(result.status, result.body, result.content_type)
            return
        status = {"timeout": 504, "unreachable": 503, "broken": 502}[result.failure]
        self._json(status, {"error": result.detail, "retryable": result.failure == "unreachable"})

    def _answer_sagemaker(self, component: Component, result: Upstream) -> None:
        """SageMaker runtime shape: 200 with the body, or ModelError / ServiceUnavailable."""
        request_id = str(uuid.uuid4())
        headers = {"x-amzn-RequestId": request_id}
        if result.failure is None and 200 <= result.status < 300:
            headers["x-Amzn-Invoked-Production-Variant"] = "AllTraffic"
            if result.custom_attributes:
                headers[CUSTOM_ATTRIBUTES_HEADER] = result.custom_attributes
            self._send(200, result.body, result.content_type or "application/octet-stream", headers)
            return
        original = result.body.decode("utf-8", errors="replace")
        where = f"component {component.name} copy {result.copy_url}"
        if result.failure == "unreachable" or result.status == 503:
            code, status = "ServiceUnavailable", 503
            reason = result.detail if result.failure else f"503 with message {original!r}"
            payload: dict[str, Any] = {
                "Message": f"Model is not ready or overloaded ({where}): {reason}. Retry."
            }
        elif result.failure is not None:
            code, status = "ModelError", 424
            payload = {
                "ErrorCode": "MODEL_INVOCATION_FAILED",
                "Message": f"Invocation of {where} failed: {result.detail}.",
            }
        else:
            kind = "client" if result.status < 500 else "server"
            code, status = "ModelError", 424
            payload = {
                "ErrorCode": f"{kind.upper()}_ERROR_FROM_MODEL",
                "Message": (
                    f"Received {kind} error ({result.status}) from {where} with message "
                    f"{original!r}."
                ),
                "OriginalStatusCode": result.status,
                "OriginalMessage": original,
            }
        headers["x-amzn-ErrorType"] = code
        self._send(status, json.dumps(payload).encode(), "application/json", headers)


def _component_payload_problem(payload: Any) -> str | None:
    """Why an admin PUT body is not `{"spec": {...}, "copies": [url, ...]}`, or None."""
    if not isinstance(payload, dict):
        return 'body must be a JSON object {"spec": {...}, "copies": ["http://127.0.0.1:PORT"]}'
    extra = sorted(set(payload) - {"spec", "copies"})
    missing = sorted({"spec", "copies"} - set(payload))
    if extra or missing:
        return f"body keys must be exactly spec and copies (extra: {extra}, missing: {missing})"
    if not isinstance(payload["spec"], dict):
        return "spec must be a JSON object"
    copies = payload["copies"]
    if not isinstance(copies, list) or not copies:
        return "copies must be a non-empty list of copy URLs"
    if len(set(map(str, copies))) != len(copies):
        return "copies must not repeat a URL"
    return None


def main(argv: list[str] | None = None) -> int:
    """Serve one endpoint until POST /_shiplift/shutdown or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m tasks.hosting.router")
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--state-file", type=Path, required=True)
    parser.add_argument("--invoke-timeout-s", type=float, default=60.0)
    parser.add_argument("--connect-timeout-s", type=float, default=2.0)
    parser.add_argument("--max-body-bytes", type=int, default=6 * 1024 * 1024)
    parser.add_argument("--max-in-flight", type=int, default=128)
    args = parser.parse_args(argv)
    problem = name_problem(args.name)
    if problem:
        parser.error(problem)
    for flag in ("invoke_timeout_s", "connect_timeout_s", "max_body_bytes", "max_in_flight"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be > 0")
    router = Router(
        args.name,
        invoke_timeout_s=args.invoke_timeout_s,
        connect_timeout_s=args.connect_timeout_s,
        max_body_bytes=args.max_body_bytes,
        max_in_flight=args.max_in_flight,
    )
    server = RouterServer(("127.0.0.1", args.port), router)
    router.port = server.server_address[1]
    signal.signal(
        signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start()
    )
    write_json_atomic(
        args.state_file,
        {"name": args.name, "pid": os.getpid(), "port": router.port, "started_at": time.time()},
    )
    sys.stderr.write(f"router {args.name} listening on 127.0.0.1:{router.port}\n")
    sys.stderr.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    sys.stderr.write(f"router {args.name} stopped\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
