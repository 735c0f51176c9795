"""The local router's two HTTP ports: the invocation port (SageMaker's runtime API, InvokeEndpoint and
InvokeEndpointWithResponseStream, the container contract and, for a chat component, the DLC's `/v1/chat/completions`,
streamed or not) and the control port, which answers only requests with the bearer token of the router's state
file."""

from __future__ import annotations

import hmac
import json
import re
import sys
import urllib.parse
import uuid
from collections.abc import Iterator
from typing import Any

from shiplift.images.common.sagemaker_http import BUSY_HEADER, HttpError, StrictHandler, StrictServer, parse_json_object
from shiplift.tasks.backends.local.event_stream import CONTENT_TYPE as EVENT_STREAM_CONTENT_TYPE
from shiplift.tasks.backends.local.event_stream import payload_events
from shiplift.tasks.backends.local.router_admin_payload import component_payload_problem
from shiplift.tasks.backends.local.router_model import (
    COMPONENT_HEADER,
    CUSTOM_ATTRIBUTES_HEADER,
    Component,
    Rejected,
    Upstream,
    name_problem,
)
from shiplift.tasks.backends.local.router_scaling import NO_CAPACITY_MESSAGE
from shiplift.tasks.backends.local.routing import Router

ADMIN_PREFIX = "/_shiplift/"
ADMIN_MAX_BODY_BYTES = 1 << 20
CHAT_ROUTE = "/v1/chat/completions"  # the llama.cpp DLC's own route, where the openai client posts (base_url …/v1)
# SageMaker's runtime routes (botocore's service model, sagemaker-runtime: each operation's requestUri)
RUNTIME_ROUTE = re.compile(r"/endpoints/([^/]+)/(invocations|invocations-response-stream)")
STREAM_ACTION = "invocations-response-stream"  # InvokeEndpointWithResponseStream
STREAM_ACCEPT_HEADER = "X-Amzn-SageMaker-Accept"  # the stream's Accept (InvokeEndpoint sends a plain Accept)


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
    """The invocation port: SageMaker runtime and the container contract, nothing else. The container's routes pass
    a copy's server-sent events through as they come; SageMaker's InvokeEndpoint answers one body, and
    InvokeEndpointWithResponseStream the copy's answer as event-stream `PayloadPart`s as it comes."""

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
        match = RUNTIME_ROUTE.fullmatch(path)
        if match:
            self._invoke(urllib.parse.unquote(match.group(1)), sagemaker=True, streamed=match.group(2) == STREAM_ACTION)
        elif path in ("/invocations", CHAT_ROUTE):  # a copy that is no chat server answers the chat route 404 itself
            self._invoke(None, sagemaker=False, path=path)
        else:
            runtime = f"POST /endpoints/{self.server.router.name}/invocations"
            self._json(404, {"error": f"no route POST {path}; use POST /invocations, {runtime}, "
                                      f"{runtime}-response-stream or, on a chat component, POST {CHAT_ROUTE}"})

    def _invoke(self, endpoint_name: str | None, sagemaker: bool, path: str = "/invocations",
                streamed: bool = False) -> None:
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
            self._invoke_admitted(router, component, sagemaker, path, streamed)
        finally:
            router.leave(component)

    def _invoke_admitted(self, router: Router, component: Component, sagemaker: bool, path: str,
                         streamed: bool) -> None:
        try:
            refused = router.no_capacity(component)
        except Rejected as exc:
            self._reject(exc, sagemaker)
            return
        if refused:
            self._reject(Rejected(400 if sagemaker else 503, "ValidationError",
                                  NO_CAPACITY_MESSAGE.format(component.name)),
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
        # where a copy's streamed answer goes as it comes: framed as events, relayed as is, or (InvokeEndpoint) nowhere
        sink = self._relay_events if streamed else (None if sagemaker else self._relay)
        try:
            result = router.forward(component, self.body, self._forwarded_headers(streamed), path, sink)
        finally:
            router.in_flight.release()
        if result.streamed:
            return
        if streamed and result.failure is None and result.status == 200:  # a whole answer: its parts at once
            self._relay_events(result.content_type or "application/octet-stream", iter([result.body]),
                               result.custom_attributes)
        elif sagemaker:
            self._answer_sagemaker(component, result)
        else:
            self._answer_container(result)

    def _forwarded_headers(self, streamed: bool) -> dict[str, str]:
        """What the copy gets of the request's headers: its content type, what it accepts (a stream's Accept comes as
        X-Amzn-SageMaker-Accept) and SageMaker's custom attributes."""
        headers = {"Content-Type": self.headers.get("Content-Type", "application/json")}
        accept = self.headers.get(STREAM_ACCEPT_HEADER if streamed else "Accept")
        if accept:
            headers["Accept"] = accept
        if self.headers.get(CUSTOM_ATTRIBUTES_HEADER):
            headers[CUSTOM_ATTRIBUTES_HEADER] = self.headers[CUSTOM_ATTRIBUTES_HEADER]
        return headers

    def _relay(self, content_type: str, pieces: Iterator[bytes]) -> None:
        """A copy's streamed 200 (server-sent events), passed on piece by piece as it comes."""
        self.send_stream(200, pieces, content_type)

    def _relay_events(self, content_type: str, pieces: Iterator[bytes], custom_attributes: str | None = None) -> None:
        """InvokeEndpointWithResponseStream's 200: the copy's answer as event-stream `PayloadPart`s as it comes, its
        content type in X-Amzn-SageMaker-Content-Type (botocore's output shape); an answer that breaks off ends with
        a `ModelStreamError` event (tasks.backends.local.event_stream)."""
        headers = {"x-amzn-RequestId": str(uuid.uuid4()), "X-Amzn-SageMaker-Content-Type": content_type,
                   "x-Amzn-Invoked-Production-Variant": "AllTraffic"}
        if custom_attributes:
            headers[CUSTOM_ATTRIBUTES_HEADER] = custom_attributes
        self.send_stream(200, payload_events(pieces, self.server.router.invoke_timeout_s), EVENT_STREAM_CONTENT_TYPE,
                         headers)

    def _answer_container(self, result: Upstream) -> None:
        """Container contract: the model's answer verbatim; transport failures as JSON."""
        if result.failure is None:  # a full copy's 503 keeps its Retry-After: busy, retry, not dead
            self.send_bytes(result.status, result.body, result.content_type,
                            {BUSY_HEADER: "1"} if result.busy else None)
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
        problem = component_payload_problem(payload)
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
