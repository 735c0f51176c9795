"""The SageMaker container contract shared by the model servers in images/ (DESIGN §6).

A server plugs its model into `ModelService` and calls `serve`: GET /ping (503 loading, then
200), POST /invocations behind admission control, strict body and JSON checks, JSON errors,
the `serve` argument, the `listening on` log line and a clean SIGTERM stop all live here, with
the <PREFIX>_* environment helpers. Standard library only: it is copied into every image.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Mapping, Protocol, TypeVar
from urllib.parse import urlsplit

EXIT_CONFIG, EXIT_MODEL = 2, 3
SOCKET_TIMEOUT_S = 30.0  # a client that stalls while sending its body loses its slot
LINGER_S, LINGER_BYTES = 1.0, 16 << 20  # drain an unread body briefly so the client sees our answer


# --------------------------------------------------------------------------------------
# Configuration


class StartupError(Exception):
    """The server must not start; the message says what is wrong and how to fix it."""

    def __init__(self, message: str, exit_code: int = EXIT_CONFIG):
        super().__init__(message)
        self.exit_code = exit_code


def env_int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """Read an integer variable strictly (digits only) and check its range."""
    raw = env.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
        raise StartupError(f"{name}={raw!r} is not an integer; set it to an integer in [{low}, {high}]")
    value = int(text)
    if not low <= value <= high:
        raise StartupError(f"{name}={value} is out of range; set it to an integer in [{low}, {high}]")
    return value


def env_float(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    """Read a finite float variable and check its range."""
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StartupError(f"{name}={raw!r} is not a number; set it to a number in [{low}, {high}]") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise StartupError(f"{name}={raw!r} is out of range; set it to a number in [{low}, {high}]")
    return value


def env_choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    """Read a variable that must be one of `choices` (exact spelling)."""
    value = env.get(name, default)
    if value not in choices:
        raise StartupError(f"{name}={value!r} is not one of {', '.join(choices)}; set it to one of them")
    return value


def env_bool(env: Mapping[str, str], name: str) -> bool:
    """Read a true/false variable (false when unset)."""
    raw = env.get(name, "false")
    if raw.strip().lower() in ("true", "1"):
        return True
    if raw.strip().lower() in ("false", "0"):
        return False
    raise StartupError(f"{name}={raw!r} is not a boolean; set it to true or false")


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one): the default thread count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class HttpSettings:
    """Address and limits every server reads from <prefix>_* variables; `prefix` names them in errors."""

    prefix: str
    max_body_bytes: int
    max_in_flight: int
    queue_timeout_s: float
    host: str
    port: int


def read_http_settings(env: Mapping[str, str], prefix: str) -> HttpSettings:
    """<prefix>_MAX_BODY_BYTES, _MAX_IN_FLIGHT, _QUEUE_TIMEOUT_S, _PORT and _HOST, checked in that order."""
    max_body = env_int(env, f"{prefix}_MAX_BODY_BYTES", 1 << 20, 1, 1 << 30)
    max_in_flight = env_int(env, f"{prefix}_MAX_IN_FLIGHT", 4, 1, 4096)
    queue_timeout_s = env_float(env, f"{prefix}_QUEUE_TIMEOUT_S", 60.0, 0.001, 3600.0)
    port = env_int(env, f"{prefix}_PORT", 8080, 0, 65535)
    host = env.get(f"{prefix}_HOST", "127.0.0.1")
    if not host.strip() or host != host.strip():
        raise StartupError(f"{prefix}_HOST={host!r} is not a host; set it to an address such as 127.0.0.1")
    return HttpSettings(prefix, max_body, max_in_flight, queue_timeout_s, host, port)


def reject_constant(name: str) -> float:
    """json parse_constant hook: NaN and Infinity are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def read_temperature(path: Path) -> float:
    """Temperature from calibration.json (T = 1 when the file is absent)."""
    if not path.exists():
        return 1.0
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=reject_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StartupError(f"{path}: cannot read calibration JSON ({exc}); fix or remove the file") from None
    temperature = data.get("temperature") if isinstance(data, dict) else None
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise StartupError(
            f"{path}: 'temperature' must be a finite number > 0, got {temperature!r}; "
            'write {"temperature": T} with the fitted T, or remove the file'
        )
    return float(temperature)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (model files are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def to_ms(seconds: float) -> float:
    """Seconds as milliseconds rounded to the microsecond, as every timing field reports them."""
    return round(seconds * 1000.0, 3)


# --------------------------------------------------------------------------------------
# Request validation


class HttpError(Exception):
    """An error answered as JSON with this status."""

    def __init__(self, status: int, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.retryable = retryable


def bad(field: str, rule: str) -> HttpError:
    """A 400 naming the field and the rule it broke."""
    return HttpError(400, f"{field}: {rule}")


def error_payload(error: HttpError) -> dict[str, Any]:
    """The JSON body of an error answer: {"error": message} plus "retryable": true when it is."""
    payload: dict[str, Any] = {"error": str(error)}
    if error.retryable:
        payload["retryable"] = True
    return payload


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a repeated key is an error, never a silent last-wins."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def parse_json_object(body: bytes, *, parse_constant: Callable[[str], Any] = reject_constant) -> dict[str, Any]:
    """Decode the request body into a JSON object (duplicate keys refused; NaN/Infinity per `parse_constant`)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad("body", f"must be UTF-8 encoded JSON ({exc})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=parse_constant)
    except RecursionError:
        raise bad("body", "JSON is nested too deeply") from None
    except ValueError as exc:
        raise bad("body", f"must be valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise bad("body", f"must be a JSON object, got {json_type(value)}")
    return value


def json_string(value: Any, field: str) -> str:
    """A JSON string that is valid Unicode (no unpaired surrogate); blankness is the caller's rule."""
    if not isinstance(value, str):
        raise bad(field, f"must be a string, got {json_type(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(field, "contains an unpaired surrogate; send valid Unicode") from None
    return value


@contextmanager
def model_turn(lock: threading.Lock, http: HttpSettings) -> Iterator[None]:
    """Hold the model's lock, waiting at most <prefix>_QUEUE_TIMEOUT_S (then a retryable 503)."""
    if not lock.acquire(timeout=http.queue_timeout_s):
        raise HttpError(
            503, f"the model stayed busy for {http.queue_timeout_s}s ({http.prefix}_QUEUE_TIMEOUT_S)", retryable=True
        )
    try:
        yield
    finally:
        lock.release()


# --------------------------------------------------------------------------------------
# Server


class ServerSettings(Protocol):
    """What the shared server needs of a server's validated settings."""

    @property
    def http(self) -> HttpSettings: ...

    @property
    def model_path(self) -> Path: ...


SettingsT = TypeVar("SettingsT", bound=ServerSettings)
EngineT = TypeVar("EngineT")


@dataclass(frozen=True)
class ModelService(Generic[SettingsT, EngineT]):
    """A model server's own parts; `serve` runs them behind the SageMaker container contract."""

    name: str  # log prefix and the model-loading thread's name, e.g. "semif"
    prefix: str  # of its environment variables, e.g. "SEMIF"
    server_version: str  # the HTTP Server header
    empty_body: str  # the 400 rule for an empty body: what the body should hold
    load_settings: Callable[[Mapping[str, str]], SettingsT]  # raises StartupError
    load_engine: Callable[[SettingsT], EngineT]  # slow; raises StartupError (exit code) or anything (EXIT_MODEL)
    loaded: Callable[[SettingsT, EngineT, float], str]  # the log line once loaded in that many seconds
    answer: Callable[[SettingsT, EngineT, bytes, float], dict[str, Any]]  # body, perf_counter at receipt


class ModelServer(ThreadingHTTPServer):
    """HTTP server holding the service, its settings, the admission semaphore and (once loaded) the engine."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, service: ModelService[Any, Any], settings: ServerSettings):
        self.service = service
        self.settings = settings
        self.admission = threading.BoundedSemaphore(settings.http.max_in_flight)
        self.engine: Any = None
        self.exit_code = 0
        super().__init__((settings.http.host, settings.http.port), ModelHandler)

    def load(self) -> None:
        """Load the model in the background; on failure stop the server with a clear message."""
        try:
            start = time.perf_counter()
            engine = self.service.load_engine(self.settings)
            self.engine = engine
            line = self.service.loaded(self.settings, engine, time.perf_counter() - start)
            print(f"{self.service.name}: {line}", file=sys.stderr, flush=True)
        except StartupError as exc:
            self._fail(str(exc), exc.exit_code)
        except Exception as exc:  # any load failure must stop the process, not leave it unready forever
            traceback.print_exc(file=sys.stderr)
            self._fail(f"model load failed: {exc}", EXIT_MODEL)

    def _fail(self, message: str, exit_code: int) -> None:
        print(f"{self.service.name}: refusing to start: {message}", file=sys.stderr, flush=True)
        self.exit_code = exit_code
        self.shutdown()


class ModelHandler(BaseHTTPRequestHandler):
    """The SageMaker container contract: GET /ping, POST /invocations; errors are JSON."""

    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S
    server: ModelServer

    def setup(self) -> None:
        """Headers and body are separate writes: without TCP_NODELAY, Nagle plus a keep-alive
        client's delayed ACK add ~40 ms to every answer."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def version_string(self) -> str:
        """The Server header: the service's own name and version, then Python's."""
        return f"{self.server.service.server_version} {self.sys_version}"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.server.service.name}: {self.address_string()} {format % args}\n")

    def _send(self, status: int, payload: dict[str, Any], *, close: bool = False) -> None:
        body = json.dumps(payload, allow_nan=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        try:
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left before reading the answer
            return
        if close:
            self._linger()

    def _linger(self) -> None:
        """Half-close, then discard what the client still sends (bounded), so it reads our answer, not a reset."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_S)
            deadline, drained = time.monotonic() + LINGER_S, 0
            while time.monotonic() < deadline and drained < LINGER_BYTES:
                chunk = self.connection.recv(1 << 16)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass  # the client went away: nothing left to protect

    def _error(self, error: HttpError, *, close: bool = False) -> None:
        self._send(error.status, error_payload(error), close=close)

    def _route(self) -> str:
        return urlsplit(self.path).path

    def do_GET(self) -> None:
        """GET /ping: 200 once the model is loaded, 503 while it loads."""
        route = self._route()
        if route == "/ping":
            if self.server.engine is None:
                self._send(503, {"status": "loading"})
            else:
                self._send(200, {"status": "ok"})
        elif route == "/invocations":
            self._error(HttpError(405, "/invocations accepts POST only"))
        else:
            self._error(HttpError(404, f"no route {route!r}; use GET /ping or POST /invocations"))

    def do_POST(self) -> None:
        """POST /invocations, behind admission control; the body is unread on early errors."""
        route = self._route()
        if route != "/invocations":
            status = 405 if route == "/ping" else 404
            self._error(HttpError(status, f"no POST route {route!r}; use POST /invocations"), close=True)
            return
        received = time.perf_counter()
        if not self.server.admission.acquire(blocking=False):
            http = self.server.settings.http
            self._error(
                HttpError(
                    503,
                    f"overloaded: {http.max_in_flight} requests in flight ({http.prefix}_MAX_IN_FLIGHT); "
                    "retry with backoff",
                    retryable=True,
                ),
                close=True,
            )
            return
        try:  # the slot is released before the answer is written, so a sequential client never races it
            status, payload, close = self._invocation(received)
        finally:
            self.server.admission.release()
        self._send(status, payload, close=close)

    def _method_not_allowed(self) -> None:
        self._error(HttpError(405, f"method {self.command} is not supported"), close=True)

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed

    def _invocation(self, received: float) -> tuple[int, dict[str, Any], bool]:
        """(status, JSON payload, close connection) for one admitted POST /invocations."""
        try:
            body = self._read_body()
        except HttpError as error:
            return error.status, error_payload(error), True
        try:
            engine = self.server.engine
            if engine is None:
                raise HttpError(503, "model is loading; retry when GET /ping returns 200", retryable=True)
            return 200, self.server.service.answer(self.server.settings, engine, body, received), False
        except HttpError as error:
            return error.status, error_payload(error), False
        except Exception as exc:  # the contract answers every failure with JSON
            traceback.print_exc(file=sys.stderr)
            return 500, {"error": f"internal error: {exc}"}, False

    def _read_body(self) -> bytes:
        """Check Content-Type and Content-Length before reading exactly that many bytes."""
        media_type, _, params = (self.headers.get("Content-Type") or "").partition(";")
        if media_type.strip().lower() != "application/json":
            raise HttpError(415, f"Content-Type must be application/json, got {self.headers.get('Content-Type')!r}")
        charset = params.strip().lower()
        if charset and charset.replace(" ", "") not in ("charset=utf-8", 'charset="utf-8"'):
            raise HttpError(415, f"Content-Type charset must be utf-8, got {params.strip()!r}")
        if self.headers.get("Transfer-Encoding") is not None:
            raise bad("Transfer-Encoding", "is not supported; send the body with a Content-Length")
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.strip().isdigit():
            raise bad("Content-Length", f"is required and must be a byte count, got {length_header!r}")
        length = int(length_header)
        http = self.server.settings.http
        if length == 0:
            raise bad("body", self.server.service.empty_body)
        if length > http.max_body_bytes:
            raise HttpError(
                413,
                f"body: {length} bytes is over the limit of {http.max_body_bytes} bytes ({http.prefix}_MAX_BODY_BYTES)",
            )
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            raise bad("body", f"not received within {SOCKET_TIMEOUT_S:.0f}s") from None
        except OSError as exc:
            raise bad("body", f"connection failed while reading it ({exc})") from None
        if len(body) != length:
            raise bad("body", f"ended after {len(body)} of {length} bytes (Content-Length)")
        return body


def serve(service: ModelService[Any, Any], argv: list[str]) -> int:
    """Validate the environment, listen, load the model in the background, serve until stopped; the exit code."""
    name, prefix = service.name, service.prefix
    if argv not in ([], ["serve"]):  # SageMaker starts the container as `<entrypoint> serve`
        print(
            f"{name}: refusing to start: unexpected arguments {argv}; configure with {prefix}_* variables",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        settings = service.load_settings(os.environ)
    except StartupError as exc:
        print(f"{name}: refusing to start: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    try:
        server = ModelServer(service, settings)
    except OSError as exc:
        print(
            f"{name}: refusing to start: cannot listen on {settings.http.host}:{settings.http.port} ({exc}); "
            f"set {prefix}_HOST/{prefix}_PORT to a free address",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_CONFIG
    host, port = server.server_address[:2]
    print(f"{name}: listening on http://{host}:{port} (model {settings.model_path}, loading)", file=sys.stderr, flush=True)
    # SIGTERM (docker stop, SageMaker, the local backend) ends serve_forever cleanly with exit code 0
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    threading.Thread(target=server.load, name=f"{name}-load", daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return server.exit_code
