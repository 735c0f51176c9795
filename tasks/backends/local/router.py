"""The local endpoint process: the SageMaker runtime API in front of model-server copies.

Run as `python -m tasks.backends.local.router --name NAME --port 0 --state-file FILE`. On its
invocation port it serves

- `POST /endpoints/{EndpointName}/invocations` in the shape botocore's `sagemaker-runtime`
  client expects (restjson; errors carry `x-amzn-ErrorType` and a JSON `Message`), honouring
  `X-Amzn-SageMaker-Inference-Component`;
- the container contract directly: `GET /ping`, `POST /invocations` (model answers verbatim).

Control lives on a second loopback port that answers only requests carrying the bearer token
the router writes, with its ports, into the state file (mode 0600, so only the state
directory's user can read it): `PUT|DELETE /_shiplift/components/{name}`, `GET
/_shiplift/state`, `GET /_shiplift/metrics`, `POST /_shiplift/shutdown`. A component is registered as its copies'
URLs and the hash of the spec each runs (two specs during a rolling update); no command or
environment reaches the router. A copy left out of a registration drains: it gets no new
request and stays listed until those in flight finish. Metrics are kept per component and per
spec of the copy that answered, so a canary's errors and latency are its own.

Each request goes to the healthy copy with the fewest outstanding requests. A copy whose
`/ping` fails twice in a row, or that refuses or breaks a forwarded request, leaves rotation
until its `/ping` answers 200 again; `/ping` of the router says so. A copy whose `/ping` answers
503 busy (its connections are full: `Retry-After`) answers, so it stays where it is. The data
port never shows copy URLs (copies are named by their position in the component), and the
control port reads no body before the token is checked and refuses the router's own ports as
copies. A component registered with `scale_to_zero` (`{"idle_s": N}`) scales itself, as Application Auto Scaling
does on SageMaker: idle for N seconds, the router runs `python -m tasks.backends.local.scaler` (with the
`--state-dir` the router was started with) to stop its copies; a request that finds no copy is answered
SageMaker's no-capacity `ValidationError` (callers retry it; on the container route, `503 {"retryable": true}` as every
refusal there that waiting cures), counted as a NoCapacityInvocationFailure, and starts
the scaler for one copy, as the scale-out alarm's step policy does. The router keeps its components in memory only; `tasks.backends.local.supervisor`
persists them, registers them again after a restart and replaces dead copies. Stdlib only (plus `images/common/sagemaker_http.py`, the
HTTP framing every shiplift server shares), so it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import hmac
import http.client
import itertools
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from images.common.sagemaker_http import (BUSY_HEADER, HttpError, StrictHandler, StrictServer, answered_busy,
                                         parse_json_object)
from tasks.atomic import write_json_atomic


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
HEALTH_INTERVAL_S = 1.0
FAILED_CHECKS_TO_DOWN = 2  # consecutive failed /ping checks that take a copy out of rotation
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
EXIT_PORT_TAKEN = 3  # the --port asked for is not free (the supervisor then lets the router pick one)
# SageMaker's answer to an invocation of a component with no copy (scaled to zero), which its scale-out alarm counts
# as NoCapacityInvocationFailures (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html)
NO_CAPACITY_MESSAGE = ("Inference Component {} has no capacity to process this request. ApplicationAutoScaling may be "
                       "in-progress (if configured) or try to increase the capacity by invoking "
                       "UpdateInferenceComponentRuntimeConfig API.")
# A serverless endpoint's answer to a request beyond its MaxConcurrency (a throttle the caller retries), and to one
# whose compute did not start in time (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html)
THROTTLED_MESSAGE = "Endpoint {} is serving its MaxConcurrency of {} requests at once; retry with backoff."
NOT_STARTED_MESSAGE = "Serverless compute for {} did not start within {:g} s; retry."


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


@dataclass
class ComponentMetrics:
    """Counters in the spirit of CloudWatch's endpoint metrics, per component.

    A transport failure (timeout, reset, no copy reachable) counts as a model error and a 5xx.
    """

    invocations: int = 0
    invocation_4xx_errors: int = 0
    invocation_5xx_errors: int = 0
    model_errors: int = 0
    no_capacity_invocation_failures: int = 0  # requests that found a component scaled to zero (not forwarded)
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
            "no_capacity_invocation_failures": self.no_capacity_invocation_failures,
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
    if parts.username is not None or parts.password is not None:
        raise ValueError("a copy URL must not carry credentials; give exactly http://127.0.0.1:PORT")
    if parts.port is None or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"copy URL {url!r} must be exactly http://127.0.0.1:PORT")
    return parts.hostname, parts.port


class Router:
    """In-memory components, health-aware least-outstanding routing, upstream calls and metrics."""

    def __init__(
        self,
        name: str,
        *,
        invoke_timeout_s: float,
        connect_timeout_s: float,
        max_body_bytes: int,
        max_in_flight: int,
        health_interval_s: float = HEALTH_INTERVAL_S,
        state_dir: Path | None = None,
    ):
        self.name = name
        self.state_dir = state_dir  # where the supervisor keeps this endpoint's state: the scaler's argument
        self.port = 0
        self.admin_port = 0
        self.invoke_timeout_s = invoke_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_body_bytes = max_body_bytes
        self.max_in_flight = max_in_flight
        self.health_interval_s = health_interval_s
        self.in_flight = threading.BoundedSemaphore(max_in_flight)
        self.lock = threading.Lock()
        self.copies_changed = threading.Condition(self.lock)  # told when a component's copies change
        self.components: dict[str, Component] = {}
        self.metrics: dict[str, ComponentMetrics] = {}
        self.spec_metrics: dict[str, dict[str, ComponentMetrics]] = {}  # component -> spec sha256 that answered
        self.rejected: dict[str, int] = {}
        self.rotation = itertools.count()
        self.stopping = threading.Event()

    # -- components -------------------------------------------------------------------------
    def put_component(self, name: str, copies: list[dict[str, str]], scale_to_zero: dict | None = None) -> bool:
        """Set a component's copies in rotation ({"url", "spec_sha256"} each) and whether it scales to zero
        (`{"idle_s": N}`; then it may have no copy); True when it existed.

        A copy kept (same URL and spec) keeps its load, health and counters; a copy left out stops
        getting requests at once and drains: it stays listed until its requests in flight finish."""
        if scale_to_zero is not None and self.state_dir is None:
            raise ValueError("this router was started without --state-dir, so it cannot scale a component")
        wanted = []
        for entry in copies:
            host, port = parse_copy_url(entry["url"])
            if port in (self.port, self.admin_port):
                raise ValueError(f"copy URL {entry['url']!r} is this router's own port; give a model server's")
            wanted.append((entry["url"].rstrip("/"), host, port, entry["spec_sha256"]))
        with self.lock:
            component = self.components.get(name)
            existed = component is not None
            if component is None:
                component = self.components[name] = Component(name=name)
                self.metrics.setdefault(name, ComponentMetrics())
            known = {(c.url, c.spec_sha256): c for c in component.copies + component.draining}
            component.copies = [
                known.pop((url, sha), None) or Copy(url=url, host=host, port=port, spec_sha256=sha)
                for url, host, port, sha in wanted
            ]
            component.draining = [c for c in known.values() if c.outstanding > 0]
            if scale_to_zero is None:
                component.scale_to_zero = None
            else:
                settings = {"idle_s": float(scale_to_zero["idle_s"]), "hold_s": scale_to_zero.get("hold_s"),
                            "max_concurrency": scale_to_zero.get("max_concurrency"), "warm": scale_to_zero.get("warm", False)}
                if component.scale_to_zero is None:
                    component.scale_to_zero = ScaleToZero(**settings)
                else:
                    vars(component.scale_to_zero).update(settings)
            self.copies_changed.notify_all()
        return existed

    # -- scale to zero ----------------------------------------------------------------------
    def _run_scaler(self, component: Component, copies: int) -> None:
        """Start the scaler for `copies` copies of the component unless one runs (caller holds the lock)."""
        scaling = component.scale_to_zero
        assert scaling is not None and self.state_dir is not None
        if scaling.scaling():
            return
        sys.stderr.write(f"router {self.name}: scaling {component.name} to {copies} cop{'y' if copies == 1 else 'ies'}\n")
        sys.stderr.flush()
        scaling.scaler = subprocess.Popen(
            [sys.executable, "-m", "tasks.backends.local.scaler", "--state-dir", str(self.state_dir), self.name,
             component.name, str(copies)], stdin=subprocess.DEVNULL, start_new_session=True)

    def no_capacity(self, component: Component) -> bool:
        """For a request to a component scaled to zero: True when it has no copy in rotation, counted as a
        NoCapacityInvocationFailure, and a scaler started for one copy (the scale-out alarm's step). A serverless
        component instead holds the request until its copy is in rotation (False), or raises Rejected when none is
        within `hold_s`."""
        scaling = component.scale_to_zero
        if scaling is None:
            return False
        with self.lock:
            scaling.last_invocation = time.monotonic()
            if any(c.healthy for c in component.copies):
                return False
            if scaling.hold_s is None:
                self.metrics.setdefault(component.name, ComponentMetrics()).no_capacity_invocation_failures += 1
                self._run_scaler(component, 1)
                return True
            deadline = time.monotonic() + scaling.hold_s
            while not (started := any(c.healthy for c in component.copies)) and time.monotonic() < deadline:
                self._run_scaler(component, 1)  # again if a scale-in was running when the request came
                self.copies_changed.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            scaling.last_invocation = time.monotonic()
        if not started:
            raise Rejected(503, "ServiceUnavailable", NOT_STARTED_MESSAGE.format(component.name, scaling.hold_s))
        return False

    def admit(self, component: Component) -> None:
        """Count a request in flight on a serverless component; Rejected (throttled) beyond its max_concurrency."""
        scaling = component.scale_to_zero
        if scaling is None or scaling.max_concurrency is None:
            return
        with self.lock:
            if scaling.active >= scaling.max_concurrency:
                raise Rejected(429, "ThrottlingException", THROTTLED_MESSAGE.format(self.name, scaling.max_concurrency))
            scaling.active += 1

    def leave(self, component: Component) -> None:
        """The admitted request has been answered."""
        scaling = component.scale_to_zero
        if scaling is None or scaling.max_concurrency is None:
            return
        with self.lock:
            scaling.active -= 1

    def scale_in_idle(self) -> None:
        """Stop the copies of every scale-to-zero component idle for its `idle_s` with nothing in flight."""
        now = time.monotonic()
        with self.lock:
            for component in self.components.values():
                scaling = component.scale_to_zero
                busy = any(c.outstanding for c in component.copies + component.draining)
                if (scaling is not None and not scaling.warm and component.copies and not busy and not scaling.scaling()
                        and not scaling.active and now - scaling.last_invocation >= scaling.idle_s):
                    self._run_scaler(component, 0)

    def delete_component(self, name: str) -> bool:
        """Forget a component and its metrics; False when it was not registered."""
        with self.lock:
            self.metrics.pop(name, None)
            self.spec_metrics.pop(name, None)
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

    # -- health -----------------------------------------------------------------------------
    def _mark(self, copy: Copy, answered_ok: bool, problem: str, *, at_once: bool) -> None:
        """Record a check or forward outcome; a copy leaves rotation at once or after repeated failed checks."""
        with self.lock:
            if answered_ok:
                copy.healthy, copy.failed_checks, copy.problem = True, 0, ""
                return
            copy.failed_checks += 1
            if at_once or copy.failed_checks >= FAILED_CHECKS_TO_DOWN:
                if copy.healthy:
                    sys.stderr.write(f"router {self.name}: copy {copy.url} out of rotation: {problem}\n")
                copy.healthy, copy.problem = False, problem

    def check_health(self) -> None:
        """Ping every registered copy once and update its place in rotation."""
        with self.lock:
            copies = [c for comp in self.components.values() for c in comp.copies]
        for copy in copies:
            result = self._call(copy, "GET", "/ping", None, {})
            if result.busy:
                continue  # it answers: full is not dead, and not recovered either
            ok = result.failure is None and result.status == 200
            problem = result.detail if result.failure else f"GET /ping answered {result.status}"
            self._mark(copy, ok, problem, at_once=result.failure == "unreachable")

    def watch_health(self) -> None:
        """Check health every `health_interval_s` until the router stops (runs on its own thread)."""
        while not self.stopping.wait(self.health_interval_s):
            self.check_health()
            self.scale_in_idle()

    def ping_view(self) -> tuple[int, dict[str, Any]]:
        """The router's /ping: 200 while every component has a healthy copy; says which copies are down."""
        with self.lock:
            health = {name: comp.health() for name, comp in sorted(self.components.items())}
            scaled_in = {name for name, comp in self.components.items() if comp.scale_to_zero and not comp.copies}
        if not health:
            return 503, {"status": "unhealthy", "error": "no component is registered"}
        if any(h["healthy"] == 0 for name, h in health.items() if name not in scaled_in):
            return 503, {"status": "unhealthy", "components": health}
        degraded = any(h["healthy"] < h["copies"] for h in health.values())
        return 200, {"status": "degraded" if degraded else "ok", "components": health}

    # -- routing ----------------------------------------------------------------------------
    def _acquire(self, component: Component, tried: set[str]) -> Copy | None:
        """Take the healthy untried copy with the fewest outstanding requests (ties rotate)."""
        with self.lock:
            candidates = [c for c in component.copies if c.healthy and c.url not in tried]
            if not candidates:
                return None
            offset = next(self.rotation)
            n = len(candidates)
            ranked = sorted(range(n), key=lambda i: (candidates[i].outstanding, (i - offset) % n))
            chosen = candidates[ranked[0]]
            chosen.outstanding += 1
            return chosen

    def _release(self, component: Component, copy: Copy, answered: bool) -> None:
        with self.lock:
            copy.outstanding -= 1
            copy.served += answered
            if copy.outstanding == 0 and copy in component.draining:
                component.draining.remove(copy)

    def forward(self, component: Component, body: bytes, headers: dict) -> Upstream:
        """POST one invocation to the least-loaded healthy copy; a refused connection tries the next.
        A copy that refuses or breaks the request leaves rotation until its /ping recovers."""
        tried: set[str] = set()
        started = time.monotonic()
        with self.lock:
            down = [f"copy {i}" for i, c in enumerate(component.copies, 1) if not c.healthy]
        result = Upstream(
            copy_url=None,
            failure="unreachable",
            detail=f"no healthy copy of component {component.name} (out of rotation: {', '.join(down) or 'none'})",
        )
        last: Copy | None = None
        while True:
            copy = self._acquire(component, tried)
            if copy is None:
                break
            last = copy
            tried.add(copy.url)
            try:
                result = self._call(copy, "POST", "/invocations", body, headers)
            finally:
                self._release(component, copy, answered=result.failure is None and result.copy_url == copy.url)
            if result.failure in ("unreachable", "broken"):
                self._mark(copy, False, result.detail, at_once=True)
            if result.failure != "unreachable" and not result.busy:  # a full copy ran nothing: another may take it
                break
        latency_ms = (time.monotonic() - started) * 1000.0
        with self.lock:
            self.metrics.setdefault(component.name, ComponentMetrics()).record(result.status, latency_ms)
            if last is not None:
                by_spec = self.spec_metrics.setdefault(component.name, {})
                by_spec.setdefault(last.spec_sha256, ComponentMetrics()).record(result.status, latency_ms)
        return result

    def _call(self, copy: Copy, method: str, path: str, body: bytes | None, headers: dict) -> Upstream:
        timeout = PING_TIMEOUT_S if method == "GET" else self.invoke_timeout_s
        conn = http.client.HTTPConnection(copy.host, copy.port, timeout=self.connect_timeout_s)
        try:
            try:
                conn.connect()
            except OSError as exc:
                return Upstream(copy.url, failure="unreachable", detail=f"connecting failed: {exc}")
            conn.sock.settimeout(timeout)
            try:
                try:
                    conn.request(method, path, body=body, headers=headers)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a full copy answers 503 busy at once and closes: its answer may still be there to read
                response = conn.getresponse()
                data = response.read(self.max_body_bytes + 1)
            except TimeoutError:
                return Upstream(
                    copy.url,
                    failure="timeout",
                    detail=f"the copy did not answer within {timeout:g}s",
                )
            except (OSError, http.client.HTTPException) as exc:
                return Upstream(copy.url, failure="broken", detail=f"the answer broke off: {exc!r}")
            if len(data) > self.max_body_bytes:
                return Upstream(
                    copy.url,
                    failure="broken",
                    detail=f"the copy answered more than {self.max_body_bytes} bytes",
                )
            return Upstream(
                copy.url,
                status=response.status,
                body=data,
                content_type=response.getheader("Content-Type"),
                custom_attributes=response.getheader(CUSTOM_ATTRIBUTES_HEADER),
                busy=answered_busy(response.status, response.headers),
            )
        finally:
            conn.close()

    # -- views ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """JSON view of the router and its components' copies (spec hashes only, no environment)."""
        with self.lock:
            return {
                "name": self.name,
                "pid": os.getpid(),
                "port": self.port,
                "components": {
                    name: {"copies": [c.view() for c in comp.copies], "draining": [c.view() for c in comp.draining],
                           "scale_to_zero": None if comp.scale_to_zero is None else {
                               "idle_s": comp.scale_to_zero.idle_s, "hold_s": comp.scale_to_zero.hold_s,
                               "max_concurrency": comp.scale_to_zero.max_concurrency, "warm": comp.scale_to_zero.warm,
                               "scaling": comp.scale_to_zero.scaling()}}
                    for name, comp in sorted(self.components.items())
                },
            }

    def metrics_view(self) -> dict[str, Any]:
        """JSON view of every component's counters and latency, in all and by the spec of the copy that answered."""
        with self.lock:
            return {
                "endpoint": self.name,
                "components": {
                    name: {
                        **m.snapshot(),
                        "by_spec": {sha: each.snapshot() for sha, each in sorted(self.spec_metrics.get(name, {}).items())},
                    }
                    for name, m in sorted(self.metrics.items())
                },
                "rejected": dict(sorted(self.rejected.items())),
            }


class RouterServer(StrictServer):
    """A strict HTTP server that carries the Router (the invocation port and the admin port alike)."""

    def __init__(self, address: tuple[str, int], handler: type[StrictHandler], router: Router, **limits: Any):
        self.router = router
        super().__init__(address, handler, **limits)


def _sagemaker_error(rejected: Rejected) -> tuple[bytes, dict[str, str]]:
    return json.dumps({"Message": rejected.message}).encode(), {"x-amzn-ErrorType": rejected.code}


def _as_rejected(error: HttpError) -> Rejected:
    code = "ServiceUnavailable" if error.status == 503 else "ValidationError"
    return Rejected(error.status, code, str(error))


class RouterHandler(StrictHandler):
    """Shared plumbing of the router's two ports."""

    server_version = "shiplift-router/1"
    server: RouterServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        sys.stderr.write(f"{self.log_date_time_string()} {format % args}\n")

    def _json(self, status: int, payload: Any, close: bool = False) -> None:
        self.send_bytes(status, json.dumps(payload).encode(), close=close)

    def _path(self) -> str:
        return urllib.parse.urlsplit(self.path).path


class Handler(RouterHandler):
    """The invocation port: SageMaker runtime and the container contract, nothing else."""

    def max_body_bytes(self) -> int:
        return self.server.router.max_body_bytes

    def body_too_large(self, length: int) -> HttpError:
        return HttpError(413, f"Request body is {length} bytes; this endpoint accepts at most {self.max_body_bytes()}.")

    @classmethod
    def error_answer(cls, error: HttpError, path: str | None) -> tuple[bytes, dict[str, str]]:
        """SageMaker's runtime shape on its routes (and before a route is known), the container's elsewhere."""
        if path is None or path.startswith("/endpoints/"):
            return _sagemaker_error(_as_rejected(error))
        return super().error_answer(error, path)

    def send_error_answer(self, error: HttpError, *, close: bool = False) -> None:
        self.server.router.count_rejection(_as_rejected(error).code)
        super().send_error_answer(error, close=close)

    def _reject(self, rejected: Rejected, sagemaker: bool, close: bool = False) -> None:
        """Answer a router-level refusal in SageMaker's error shape or the container's, where every 503 (no capacity,
        throttled, full, serverless compute not started) is `"retryable": true` as the container contract's
        back-pressure is, and a 4xx is not."""
        self.server.router.count_rejection(rejected.code)
        if sagemaker:
            body, headers = _sagemaker_error(rejected)
            self.send_bytes(rejected.status, body, headers=headers, close=close)
        else:
            self._json(rejected.status, {"error": rejected.message, "retryable": rejected.status == 503}, close=close)

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        path = self._path()
        if path == "/ping":
            self._json(*self.server.router.ping_view())
        else:
            self._json(404, {"error": f"no route GET {path}; use GET /ping or POST /invocations"})

    def do_POST(self) -> None:  # noqa: N802
        path = self._path()
        match = re.fullmatch(r"/endpoints/([^/]+)/invocations", path)
        if match:
            self._invoke(urllib.parse.unquote(match.group(1)), sagemaker=True)
        elif path == "/invocations":
            self._invoke(None, sagemaker=False)
        else:
            self._json(404, {"error": f"no route POST {path}; use POST /invocations"})

    def _invoke(self, endpoint_name: str | None, sagemaker: bool) -> None:
        router = self.server.router
        try:
            if endpoint_name is not None and endpoint_name != router.name:
                raise Rejected(400, "ValidationError", f"Endpoint {endpoint_name} not found.")
            component = router.resolve(self.headers.get(COMPONENT_HEADER))
        except Rejected as exc:
            self._reject(exc, sagemaker)
            return
        try:
            router.admit(component)
        except Rejected as exc:
            self._reject(exc if sagemaker else Rejected(503, exc.code, exc.message), sagemaker)
            return
        try:
            self._invoke_admitted(router, component, sagemaker)
        finally:
            router.leave(component)

    def _invoke_admitted(self, router: Router, component: Component, sagemaker: bool) -> None:
        try:
            refused = router.no_capacity(component)
        except Rejected as exc:
            self._reject(exc, sagemaker)
            return
        if refused:
            self._reject(Rejected(400 if sagemaker else 503, "ValidationError", NO_CAPACITY_MESSAGE.format(component.name)),
                         sagemaker)
            return
        if not router.in_flight.acquire(blocking=False):  # taken only now that the body is read
            self._reject(
                Rejected(
                    503,
                    "ServiceUnavailable",
                    f"Endpoint {router.name} has {router.max_in_flight} requests in flight; retry with backoff.",
                ),
                sagemaker,
            )
            return
        try:
            headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
            for key in ("Accept", CUSTOM_ATTRIBUTES_HEADER):
                if self.headers.get(key):
                    headers[key] = self.headers[key]
            result = router.forward(component, self.body, headers)
        finally:
            router.in_flight.release()
        if sagemaker:
            self._answer_sagemaker(component, result)
        else:
            self._answer_container(result)

    def _answer_container(self, result: Upstream) -> None:
        """Container contract: the model's answer verbatim; transport failures as JSON."""
        if result.failure is None:  # a full copy's 503 keeps its Retry-After: busy, retry, not dead
            self.send_bytes(result.status, result.body, result.content_type, {BUSY_HEADER: "1"} if result.busy else None)
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
            self.send_bytes(200, result.body, result.content_type or "application/octet-stream", headers)
            return
        original = result.body.decode("utf-8", errors="replace")
        where = f"component {component.name}"
        if result.failure == "unreachable" or result.status == 503:
            code, status = "ServiceUnavailable", 503
            if result.busy:
                headers[BUSY_HEADER] = "1"
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
        self.send_bytes(status, json.dumps(payload).encode(), "application/json", headers)


class AdminHandler(RouterHandler):
    """The control port: every request must carry `Authorization: Bearer <token from the state file>`."""

    allowed_methods = ("GET", "PUT", "DELETE", "POST")
    token: str = ""  # set once by main before the admin server starts

    def max_body_bytes(self) -> int:
        return ADMIN_MAX_BODY_BYTES

    def check_headers(self) -> None:
        """The token is checked from the headers alone: no body is read (nor 100 Continue sent) without it."""
        scheme, _, presented = (self.headers.get("Authorization") or "").partition(" ")
        if scheme == "Bearer" and hmac.compare_digest(presented.encode(), self.token.encode()):
            return
        raise HttpError(
            401,
            "the control API needs Authorization: Bearer <admin_token from the router's state file>",
            headers={"WWW-Authenticate": "Bearer"},
        )

    def _route(self, method: str) -> str | None:
        """The admin path below /_shiplift/ (the caller is authorised); None when answered."""
        path = self._path()
        if not path.startswith(ADMIN_PREFIX):
            self._json(404, {"error": f"no route {method} {path}"})
            return None
        return path[len(ADMIN_PREFIX) :]

    def do_GET(self) -> None:  # noqa: N802
        route = self._route("GET")
        if route == "state":
            self._json(200, self.server.router.state())
        elif route == "metrics":
            self._json(200, self.server.router.metrics_view())
        elif route is not None:
            self._json(404, {"error": f"no route GET {ADMIN_PREFIX}{route}"})

    def do_POST(self) -> None:  # noqa: N802
        route = self._route("POST")
        if route == "shutdown":
            self._json(200, {"stopping": self.server.router.name}, close=True)
            self.server.router.stopping.set()
        elif route is not None:
            self._json(404, {"error": f"no route POST {ADMIN_PREFIX}{route}"})

    def do_PUT(self) -> None:  # noqa: N802
        name = self._component_name("PUT")
        if name is None:
            return
        try:
            payload = parse_json_object(self.body)
        except HttpError as exc:
            self._json(exc.status, {"error": str(exc)})
            return
        problem = _component_payload_problem(payload)
        if problem:
            self._json(400, {"error": problem})
            return
        try:
            replaced = self.server.router.put_component(name, payload["copies"], payload.get("scale_to_zero"))
        except ValueError as exc:
            self._json(400, {"error": str(exc)})
            return
        self._json(200, {"component": name, "copies": len(payload["copies"]), "replaced": replaced})

    def do_DELETE(self) -> None:  # noqa: N802
        name = self._component_name("DELETE")
        if name is None:
            return
        if self.server.router.delete_component(name):
            self._json(200, {"deleted": name})
        else:
            self._json(404, {"error": f"component {name} is not registered"})

    def _component_name(self, method: str) -> str | None:
        route = self._route(method)
        if route is None:
            return None
        if not route.startswith("components/"):
            self._json(404, {"error": f"no route {method} {ADMIN_PREFIX}{route}"})
            return None
        name = urllib.parse.unquote(route.removeprefix("components/"))
        problem = name_problem(name)
        if problem:
            self._json(400, {"error": problem})
            return None
        return name


def _component_payload_problem(payload: dict[str, Any]) -> str | None:
    """Why an admin PUT body is not `{"copies": [{"url": URL, "spec_sha256": HEX}, ...]}` (plus `"scale_to_zero":
    {"idle_s": N}`, with which copies may be empty; a serverless component's also names `hold_s`, `max_concurrency`
    and `warm`), or None."""
    if "copies" not in payload or set(payload) - {"copies", "scale_to_zero"}:
        return f"body keys must be exactly copies, and scale_to_zero if it scales (got {sorted(payload)})"
    scaling = payload.get("scale_to_zero")
    problem = None if scaling is None else _scaling_problem(scaling)
    if problem:
        return problem
    copies = payload["copies"]
    if not isinstance(copies, list) or not (copies or scaling is not None):
        return ('copies must be a list of {"url": "http://127.0.0.1:PORT", "spec_sha256": HEX}, non-empty unless the '
                "component scales to zero")
    for index, entry in enumerate(copies):
        if not isinstance(entry, dict) or set(entry) != {"url", "spec_sha256"}:
            return f'copies[{index}] must be exactly {{"url": ..., "spec_sha256": ...}}'
        if not isinstance(entry["url"], str):
            return f"copies[{index}].url must be a string"
        if not isinstance(entry["spec_sha256"], str) or not SHA256_HEX.fullmatch(entry["spec_sha256"]):
            return f"copies[{index}].spec_sha256 must be 64 lowercase hex characters"
    if len({entry["url"].rstrip("/") for entry in copies}) != len(copies):
        return "copies must not repeat a URL"
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _scaling_problem(scaling: Any) -> str | None:
    """Why a scale_to_zero registration is not `{"idle_s": s}` or, serverless, `{"idle_s": s, "hold_s": s,
    "max_concurrency": n, "warm": bool}`, or None."""
    serverless = {"idle_s", "hold_s", "max_concurrency", "warm"}
    if not isinstance(scaling, dict) or set(scaling) not in ({"idle_s"}, serverless) or not _positive(scaling["idle_s"]):
        return ('scale_to_zero must be {"idle_s": seconds > 0}, or for a serverless component also "hold_s" (seconds > 0), '
                '"max_concurrency" (an integer > 0) and "warm" (true or false)')
    if set(scaling) == serverless and not (_positive(scaling["hold_s"]) and isinstance(scaling["max_concurrency"], int)
                                           and _positive(scaling["max_concurrency"]) and isinstance(scaling["warm"], bool)):
        return 'a serverless scale_to_zero needs "hold_s" > 0, an integer "max_concurrency" > 0 and a boolean "warm"'
    return None


def main(argv: list[str] | None = None) -> int:
    """Serve one endpoint until POST /_shiplift/shutdown (control port) or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m tasks.backends.local.router")
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True, help="0 picks a free port")
    parser.add_argument("--state-file", type=Path, required=True)
    parser.add_argument("--invoke-timeout-s", type=float, default=60.0)
    parser.add_argument("--connect-timeout-s", type=float, default=2.0)
    parser.add_argument("--max-body-bytes", type=int, default=6 * 1024 * 1024)
    parser.add_argument("--max-in-flight", type=int, default=128)
    parser.add_argument("--read-deadline-s", type=float, default=30.0, help="seconds a client has to send a request")
    parser.add_argument("--max-connections", type=int, default=512)
    parser.add_argument("--max-connections-per-client", type=int, default=256)
    parser.add_argument("--health-interval-s", type=float, default=HEALTH_INTERVAL_S)
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="the supervisor's state folder: what the scaler of a scale-to-zero component is run with")
    args = parser.parse_args(argv)
    problem = name_problem(args.name)
    if problem:
        parser.error(problem)
    for flag in (
        "invoke_timeout_s",
        "connect_timeout_s",
        "max_body_bytes",
        "max_in_flight",
        "read_deadline_s",
        "max_connections",
        "max_connections_per_client",
        "health_interval_s",
    ):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be > 0")
    router = Router(
        args.name,
        invoke_timeout_s=args.invoke_timeout_s,
        connect_timeout_s=args.connect_timeout_s,
        max_body_bytes=args.max_body_bytes,
        max_in_flight=args.max_in_flight,
        health_interval_s=args.health_interval_s,
        state_dir=args.state_dir,
    )
    limits = {
        "read_deadline_s": args.read_deadline_s,
        "max_connections": args.max_connections,
        "max_connections_per_client": args.max_connections_per_client,
    }
    try:
        server = RouterServer(("127.0.0.1", args.port), Handler, router, **limits)
    except OSError as exc:
        sys.stderr.write(f"router {args.name}: cannot listen on 127.0.0.1:{args.port} ({exc})\n")
        return EXIT_PORT_TAKEN
    AdminHandler.token = secrets.token_urlsafe(32)
    admin = RouterServer(("127.0.0.1", 0), AdminHandler, router, **limits)
    router.port, router.admin_port = server.server_address[1], admin.server_address[1]

    def stop(*_: Any) -> None:
        router.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    workers = [
        threading.Thread(target=target, name=name, daemon=True)
        for name, target in (
            ("invocations", lambda: server.serve_forever(poll_interval=0.2)),
            ("control", lambda: admin.serve_forever(poll_interval=0.2)),
            ("health", router.watch_health),
        )
    ]
    for worker in workers:
        worker.start()
    write_json_atomic(
        args.state_file,
        {
            "name": args.name,
            "pid": os.getpid(),
            "port": router.port,
            "admin_port": admin.server_address[1],
            "admin_token": AdminHandler.token,
            "started_at": time.time(),
        },
        mode=0o600,
    )
    sys.stderr.write(f"router {args.name} listening on 127.0.0.1:{router.port}\n")
    sys.stderr.flush()
    try:
        while not router.stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        for each in (server, admin):
            each.shutdown()
            each.server_close()
    sys.stderr.write(f"router {args.name} stopped\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
