"""The local router's core: its components' copies in memory, health-aware least-outstanding routing of each
invocation, the calls to the copies, metrics and the JSON views of its control API."""

from __future__ import annotations

import http.client
import itertools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shiplift.images.common.sagemaker_http import answered_busy
from shiplift.tasks.backends.local.router_metrics import ComponentMetrics
from shiplift.tasks.backends.local.router_model import (
    COMPONENT_HEADER,
    CUSTOM_ATTRIBUTES_HEADER,
    Component,
    Copy,
    Rejected,
    ScaleToZero,
    Sink,
    Upstream,
    answer_pieces,
    parse_copy_url,
)
from shiplift.tasks.backends.local.router_scaling import ScaleToZeroRouting

PING_TIMEOUT_S = 2.0
HEALTH_INTERVAL_S = 1.0
FAILED_CHECKS_TO_DOWN = 2  # consecutive failed /ping checks that take a copy out of rotation


class Router(ScaleToZeroRouting):
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
                            "max_concurrency": scale_to_zero.get("max_concurrency"),
                            "warm": scale_to_zero.get("warm", False)}
                if component.scale_to_zero is None:
                    component.scale_to_zero = ScaleToZero(**settings)
                else:
                    vars(component.scale_to_zero).update(settings)
            self.copies_changed.notify_all()
        return existed

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

    def forward(self, component: Component, body: bytes, headers: dict, path: str = "/invocations",
                sink: Sink | None = None) -> Upstream:
        """POST one invocation to `path` of the least-loaded healthy copy; a refused connection tries the next.
        A copy that refuses or breaks the request leaves rotation until its /ping recovers. With a `sink`, a 200
        answer of server-sent events is handed to it as it comes (the copy stays taken until it ends)."""
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
                result = self._call(copy, "POST", path, body, headers, sink)
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

    def _call(self, copy: Copy, method: str, path: str, body: bytes | None, headers: dict,
              sink: Sink | None = None) -> Upstream:
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
                content_type = response.getheader("Content-Type") or ""
                if sink is not None and response.status == 200 and content_type.startswith("text/event-stream"):
                    sink(content_type, answer_pieces(response))  # each read waits at most the invocation timeout
                    return Upstream(copy.url, status=200, content_type=content_type, streamed=True)
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
                        "by_spec": {sha: each.snapshot() for sha,
                                    each in sorted(self.spec_metrics.get(name, {}).items())},
                    }
                    for name, m in sorted(self.metrics.items())
                },
                "rejected": dict(sorted(self.rejected.items())),
            }
