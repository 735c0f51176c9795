"""The SageMaker container contract shared by the model servers in images/ (DESIGN §6).

A server plugs its model into `ModelService` and calls `serve`: GET /ping (503 loading, then
200), POST /invocations behind admission control, strict body and JSON checks, JSON errors,
the `serve` argument, the `listening on` log line and a clean SIGTERM stop all live here, with
the <PREFIX>_* environment helpers. Standard library only: it is copied into every image.

`StrictHandler` and `StrictServer` are the HTTP/1.1 framing every shiplift server shares (the
local router too): a request is read whole (line, headers, body) under one deadline before any
admission slot is taken, parsed strictly, and every fault is answered as JSON, never by the
standard library's HTML pages or a silent close. Open connections are capped in all and per
client address; an idle one (no request begun) gives way to a new one, so only connections
mid-request can fill the server, and its 503 then carries `Retry-After` (busy, not dead).
"""

from __future__ import annotations

import fcntl
import hashlib
import http.client
import io
import json
import math
import os
import re
import signal
import socket
import struct
import sys
import termios
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

EXIT_CONFIG, EXIT_MODEL = 2, 3
LINGER_S, LINGER_BYTES = 1.0, 16 << 20  # drain an unread body briefly so the client sees our answer
MAX_REQUEST_LINE_BYTES = 8 << 10  # 414 beyond
MAX_HEADER_LINE_BYTES = 8 << 10  # 431 beyond, as for the whole block and the count
MAX_HEADER_BLOCK_BYTES = 32 << 10
MAX_HEADER_COUNT = 100
FIRST_BYTE_TIMEOUT_S = 2.0  # a new connection that has sent nothing by then is closed
IDLE_TIMEOUT_S = 30.0  # a kept-alive connection may wait this long for its next request
WRITE_TIMEOUT_S = 30.0  # a client that does not read our answer is dropped after this
DEFAULT_READ_DEADLINE_S = 30.0  # from a request's first byte to its last
DEFAULT_MAX_CONNECTIONS = 256
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 128
SERVING_ID_ENV = "SHIPLIFT_SERVING_ID"  # what the copy serves, as the hosting names it (echoed with every answer)
BUSY_HEADER = "Retry-After"  # on a 503 that means "full, retry", never "not ready" or "broken"
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
REQUEST_LINE = re.compile(rf"({_TOKEN}) ([!-~]+) HTTP/([0-9])\.([0-9])")
HEADER_LINE = re.compile(rf"({_TOKEN}):[ \t]*(.*?)[ \t]*")
FORBIDDEN_IN_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
CONTENT_LENGTH = re.compile(r"[0-9]{1,15}")


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
    read_deadline_s: float = DEFAULT_READ_DEADLINE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT


def read_http_settings(env: Mapping[str, str], prefix: str) -> HttpSettings:
    """<prefix>_MAX_BODY_BYTES, _MAX_IN_FLIGHT, _QUEUE_TIMEOUT_S, _PORT, _HOST, _READ_DEADLINE_S,
    _MAX_CONNECTIONS and _MAX_CONNECTIONS_PER_CLIENT, checked in that order."""
    max_body = env_int(env, f"{prefix}_MAX_BODY_BYTES", 1 << 20, 1, 1 << 30)
    max_in_flight = env_int(env, f"{prefix}_MAX_IN_FLIGHT", 4, 1, 4096)
    queue_timeout_s = env_float(env, f"{prefix}_QUEUE_TIMEOUT_S", 60.0, 0.001, 3600.0)
    port = env_int(env, f"{prefix}_PORT", 8080, 0, 65535)
    host = env.get(f"{prefix}_HOST", "127.0.0.1")
    if not host.strip() or host != host.strip():
        raise StartupError(f"{prefix}_HOST={host!r} is not a host; set it to an address such as 127.0.0.1")
    read_deadline_s = env_float(env, f"{prefix}_READ_DEADLINE_S", DEFAULT_READ_DEADLINE_S, 0.1, 3600.0)
    max_connections = env_int(env, f"{prefix}_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS, 1, 65536)
    per_client = env_int(env, f"{prefix}_MAX_CONNECTIONS_PER_CLIENT", DEFAULT_MAX_CONNECTIONS_PER_CLIENT, 1, 65536)
    return HttpSettings(
        prefix, max_body, max_in_flight, queue_timeout_s, host, port, read_deadline_s, max_connections, per_client
    )


def answered_busy(status: int, headers: Mapping[str, str] | http.client.HTTPMessage) -> bool:
    """True for a 503 that says the server is full (it carries BUSY_HEADER): it answers, so it is alive."""
    return status == 503 and headers.get(BUSY_HEADER) is not None


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


def read_serving_id(env: Mapping[str, str]) -> str | None:
    """The serving id the hosting hands this copy (a hash of its image, artifact and environment), which the server
    echoes with every answer so live answers are told apart by what serves them; None when run without one."""
    value = env.get(SERVING_ID_ENV, "").strip()
    if value and not re.fullmatch(r"[0-9a-f]{64}", value):
        raise StartupError(f"{SERVING_ID_ENV}={value!r} is not a sha256 hex digest; "
                           "leave it to the hosting that sets it")
    return value or None


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
    """An error answered as JSON with this status (and these extra headers, such as Allow)."""

    def __init__(self, status: int, message: str, *, retryable: bool = False, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.headers = dict(headers or {})


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
# HTTP/1.1 framing: one deadline per request, strict parsing, JSON for every fault


class DeadlineReader(io.RawIOBase):
    """Socket reads bounded by one deadline for the whole request, or by the idle timeout before one begins.

    While it waits for a request to begin, the connection is idle in `connections` and may give way to a
    new one; it turns busy before a byte of the request is consumed, so none gives way mid-request."""

    def __init__(self, sock: socket.socket, idle_timeout_s: float, connections: ConnectionTable):
        self.sock = sock
        self.idle_timeout_s = idle_timeout_s
        self.connections = connections
        self.deadline: float | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is None:
            self.connections.set_idle(self.sock)
            self.sock.settimeout(self.idle_timeout_s)
            if not self.sock.recv(1, socket.MSG_PEEK) or not self.connections.set_busy(self.sock):
                return 0  # the client closed, or the connection gave way to a new one
        else:
            timeout = self.deadline - time.monotonic()
            if timeout <= 0:
                raise TimeoutError("the request deadline passed")
            self.sock.settimeout(timeout)
        return self.sock.recv_into(buffer)


def _line_text(line: bytes, what: str, encoding: str) -> str:
    """A request or header line without its line break; a line cut short or undecodable is a 400."""
    if not line.endswith(b"\n"):
        raise HttpError(400, f"the {what} ended without a line break (the connection closed mid-request)")
    try:
        return line.removesuffix(b"\n").removesuffix(b"\r").decode(encoding)
    except UnicodeDecodeError:
        raise HttpError(400, f"the {what} is not {encoding.upper()}; send ASCII") from None


def _length_shown(raw: str) -> str:
    return repr(raw) if len(raw) <= 40 else f"a value of {len(raw)} characters"


def _has_pending_bytes(sock: socket.socket) -> bool:
    """True when the client has sent bytes nobody has read yet (its request is about to start); a client
    that closed has none. Asked of the kernel (FIONREAD): a recv would wait out the socket's timeout."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0] > 0
    except (OSError, ValueError):
        return False  # closed already


class ConnectionTable:
    """Open connections, in all and per client address, each idle (no request begun) or busy.

    Idle connections never hold a slot against a newcomer: over a cap, the oldest idle connection
    (of the newcomer's address for the per-address cap, else of the address holding the most) is
    shut down to make room. Only when every candidate is mid-request is the newcomer refused."""

    def __init__(self, total: int, per_client: int):
        self.total = total
        self.per_client = min(per_client, total)
        self.lock = threading.Lock()
        self.address: dict[socket.socket, str] = {}  # every open connection
        self.idle: dict[socket.socket, None] = {}  # oldest first
        self.by_address: Counter[str] = Counter()

    def admit(self, sock: socket.socket, address: str) -> bool:
        """Count a new connection (idle until its first byte); False when no slot can be freed for it."""
        with self.lock:
            if self.by_address[address] >= self.per_client:
                if not self._evict([s for s in self.idle if self.address[s] == address]):
                    return False
            elif len(self.address) >= self.total:
                if not self._evict(sorted(self.idle, key=lambda s: -self.by_address[self.address[s]])):
                    return False
            self.address[sock] = address
            self.by_address[address] += 1
            self.idle[sock] = None
            return True

    def _evict(self, candidates: list[socket.socket]) -> bool:
        """Shut down the first candidate with nothing unread (caller holds the lock); False when none."""
        for sock in candidates:
            if _has_pending_bytes(sock):
                continue
            self._forget(sock)
            try:
                sock.shutdown(socket.SHUT_RDWR)  # its handler's wait for a first byte ends with EOF
            except OSError:
                pass  # already gone
            return True
        return False

    def set_idle(self, sock: socket.socket) -> None:
        """The connection waits for a request to begin: it may give way to a newcomer."""
        with self.lock:
            if sock in self.address:
                self.idle[sock] = None

    def set_busy(self, sock: socket.socket) -> bool:
        """A request has arrived, still unread; False when the connection gave way first (then close it)."""
        with self.lock:
            self.idle.pop(sock, None)
            return sock in self.address

    def release(self, sock: socket.socket) -> None:
        """The connection closed (a no-op for one already evicted)."""
        with self.lock:
            if sock in self.address:
                self._forget(sock)

    def _forget(self, sock: socket.socket) -> None:
        address = self.address.pop(sock)
        self.idle.pop(sock, None)
        self.by_address[address] -= 1
        if not self.by_address[address]:
            del self.by_address[address]

    def counts(self, address: str) -> tuple[int, int]:
        """(open connections, of which from `address`)."""
        with self.lock:
            return len(self.address), self.by_address[address]


class StrictServer(ThreadingHTTPServer):
    """A threading HTTP server with caps on open connections (in all and per client address); idle
    connections give way to new ones, and each handler reads under its deadlines."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[StrictHandler],
        *,
        read_deadline_s: float = DEFAULT_READ_DEADLINE_S,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
        first_byte_timeout_s: float = FIRST_BYTE_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ):
        self.read_deadline_s = read_deadline_s
        self.first_byte_timeout_s = first_byte_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self.connections = ConnectionTable(max_connections, max_connections_per_client)
        super().__init__(address, handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on its own thread, or answer 503 at once when no slot can be freed."""
        if not self.connections.admit(request, client_address[0]):
            self._refuse(request, client_address[0])
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.connections.release(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release(request)

    def _refuse(self, request: socket.socket, address: str) -> None:
        total, mine = self.connections.counts(address)
        error = HttpError(
            503,
            f"{total} connections are open ({mine} from {address}, at most {self.connections.per_client} per client) "
            "and every one that could make room is mid-request; retry with backoff",
            retryable=True,
            headers={BUSY_HEADER: "1"},
        )
        body, headers = self.RequestHandlerClass.error_answer(error, None)
        headers = {**headers, **error.headers}
        head = "".join(f"{key}: {value}\r\n" for key, value in headers.items())
        try:
            request.settimeout(1.0)
            request.sendall(
                f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"{head}Connection: close\r\n\r\n".encode("latin-1")
                + body
            )
        except OSError:
            pass  # the client is gone or not reading: nothing to protect
        self.shutdown_request(request)


class StrictHandler(BaseHTTPRequestHandler):
    """Reads each request whole (line, headers, Content-Length body) under the server's deadline, then
    dispatches to `do_<METHOD>` for the methods in `allowed_methods`. Subclasses give `max_body_bytes`
    and the error shape (`error_answer`)."""

    protocol_version = "HTTP/1.1"
    allowed_methods: tuple[str, ...] = ("GET", "POST")
    server: StrictServer
    body: bytes = b""
    declared_length: int | None = None  # Content-Length as sent; None when the request had none

    def setup(self) -> None:
        """Headers and body are separate writes: without TCP_NODELAY, Nagle plus a keep-alive
        client's delayed ACK add ~40 ms to every answer."""
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = DeadlineReader(self.connection, self.server.first_byte_timeout_s, self.server.connections)
        self.rfile = io.BufferedReader(self.reader, 64 << 10)

    # -- what subclasses decide ---------------------------------------------------------------
    def max_body_bytes(self) -> int:
        """The largest body this server reads."""
        raise NotImplementedError

    def body_too_large(self, length: int) -> HttpError:
        return HttpError(413, f"body: {length} bytes is over the limit of {self.max_body_bytes()} bytes")

    def check_headers(self) -> None:
        """Refuse a request (raise HttpError) from its line and headers, before its body is read."""

    @classmethod
    def error_answer(cls, error: HttpError, path: str | None) -> tuple[bytes, dict[str, str]]:
        """(JSON body, extra headers) of an error answer; `path` is None when no request line was read."""
        return json.dumps(error_payload(error)).encode("utf-8"), {}

    # -- answers -----------------------------------------------------------------------------
    def send_bytes(
        self,
        status: int,
        body: bytes,
        content_type: str | None = "application/json",
        headers: Mapping[str, str] | None = None,
        *,
        close: bool = False,
    ) -> None:
        """One whole answer; on `close` the connection ends after it (an unread body is drained briefly)."""
        self.send_response(status)
        if content_type:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        try:
            self.end_headers()
            # a HEAD answer has headers only, or the client reads the body as the next answer
            if self.command != "HEAD":
                self.wfile.write(body)
        except OSError:  # the client left, or stopped reading, before it had the answer
            self.close_connection = True
            return
        if close:
            self._linger()

    def send_stream(self, status: int, chunks: Iterator[bytes], content_type: str,
                    headers: Mapping[str, str] | None = None) -> None:
        """An answer written piece by piece as `chunks` gives them (chunked transfer coding, each piece sent at once),
        such as server-sent events. A client that goes away, or stops reading for WRITE_TIMEOUT_S, ends the answer and
        the connection; `chunks` is closed however it ends, so whatever produces them stops too."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        try:
            self.end_headers()
            for chunk in chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client left or stopped reading: nobody to finish the answer for
            self.close_connection = True
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def send_error_answer(self, error: HttpError, *, close: bool = False) -> None:
        """Answer `error` in this server's JSON shape."""
        path = urlsplit(self.path).path if self.command else None
        body, headers = self.error_answer(error, path)
        self.send_bytes(error.status, body, headers={**headers, **error.headers}, close=close)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own faults are answered as JSON too, never as an HTML page."""
        self.send_error_answer(HttpError(code, message or self.responses.get(code, ("error",))[0]), close=True)

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

    # -- reading -----------------------------------------------------------------------------
    def handle_one_request(self) -> None:
        """Wait (first-byte, then idle timeout) for a request, read it whole (deadline), then dispatch it."""
        self.command, self.path, self.request_version, self.requestline = None, "", "HTTP/1.1", ""
        self.body, self.declared_length = b"", None
        self.reader.deadline = None
        try:
            if not self.rfile.peek(1):
                self.close_connection = True  # the client closed an idle connection, or it gave way to a new one
                return
        except OSError:
            self.close_connection = True  # idle too long, or reset
            return
        self.reader.idle_timeout_s = self.server.idle_timeout_s
        deadline_s = self.server.read_deadline_s
        self.reader.deadline = time.monotonic() + deadline_s
        try:
            self._read_request()
        except HttpError as error:
            self.send_error_answer(error, close=True)
            return
        except TimeoutError:
            self.send_error_answer(
                HttpError(408, f"the request was not received in full within {deadline_s:g}s; send it without pauses"),
                close=True,
            )
            return
        except OSError:
            self.close_connection = True  # reset mid-request: nobody to answer
            return
        finally:
            self.reader.deadline = None
            self.connection.settimeout(WRITE_TIMEOUT_S)
        handler = getattr(self, f"do_{self.command}", None) if self.command in self.allowed_methods else None
        if handler is None:
            allowed = ", ".join(self.allowed_methods)
            self.send_error_answer(
                HttpError(405, f"method {self.command} is not supported; use {allowed}", headers={"Allow": allowed})
            )
            return
        handler()
        self.wfile.flush()

    def _read_request(self) -> None:
        line = self.rfile.readline(MAX_REQUEST_LINE_BYTES + 1)
        if len(line) > MAX_REQUEST_LINE_BYTES:
            raise HttpError(414, f"the request line is longer than {MAX_REQUEST_LINE_BYTES} bytes; shorten the path")
        self.raw_requestline = line
        self.requestline = _line_text(line, "request line", "ascii")
        match = REQUEST_LINE.fullmatch(self.requestline)
        if match is None or not match.group(2).startswith("/"):
            raise HttpError(400, "malformed request line; send `METHOD /path HTTP/1.1`")
        method, target, major, minor = match.groups()
        if (major, minor) not in (("1", "0"), ("1", "1")):
            raise HttpError(505, f"HTTP/{major}.{minor} is not supported; use HTTP/1.1")
        self.command, self.path, self.request_version = method, target, f"HTTP/{major}.{minor}"
        self.headers = self._read_headers()
        tokens = {t.strip().lower() for v in self.headers.get_all("Connection", []) for t in v.split(",")}
        self.close_connection = "close" in tokens or (minor == "0" and "keep-alive" not in tokens)
        self.check_headers()
        self.body = self._read_body()

    def _read_headers(self) -> http.client.HTTPMessage:
        headers, total = http.client.HTTPMessage(), 0
        while True:
            line = self.rfile.readline(MAX_HEADER_LINE_BYTES + 1)
            total += len(line)
            if len(line) > MAX_HEADER_LINE_BYTES or total > MAX_HEADER_BLOCK_BYTES:
                raise HttpError(
                    431,
                    f"request headers are too large (at most {MAX_HEADER_LINE_BYTES} bytes a line, "
                    f"{MAX_HEADER_BLOCK_BYTES} in all); send fewer or shorter headers",
                )
            if line in (b"\r\n", b"\n"):
                return headers
            text = _line_text(line, "header block", "latin-1")
            if len(headers) >= MAX_HEADER_COUNT:
                raise HttpError(431, f"more than {MAX_HEADER_COUNT} request headers; send fewer")
            match = HEADER_LINE.fullmatch(text)
            if match is None or FORBIDDEN_IN_VALUE.search(match.group(2)):
                raise HttpError(400, f"request header {len(headers) + 1} is malformed; send `Name: value` lines")
            headers[match.group(1)] = match.group(2)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding") is not None:
            raise HttpError(411, "Transfer-Encoding is not supported; send the body with a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            return b""
        if len(lengths) > 1:
            raise HttpError(400, f"Content-Length appears {len(lengths)} times; send it once")
        if not CONTENT_LENGTH.fullmatch(lengths[0]):
            raise HttpError(400, "Content-Length must be a byte count in ASCII digits, "
                                 f"got {_length_shown(lengths[0])}")
        length = int(lengths[0])
        if length > self.max_body_bytes():
            raise self.body_too_large(length)
        expect = self.headers.get("Expect")
        if expect is not None:
            if expect.lower() != "100-continue" or self.request_version == "HTTP/1.0":
                raise HttpError(417, "Expect: only 100-continue (HTTP/1.1) is supported")
            self.send_response_only(100)
            self.end_headers()
        body = self.rfile.read(length) if length else b""
        if len(body) != length:
            raise HttpError(400, f"body ended after {len(body)} of {length} bytes (Content-Length)")
        self.declared_length = length
        return body


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
class Streamed:
    """An answer of `ModelService.answer` written as it is produced (`StrictHandler.send_stream`), e.g. a chat
    completion's server-sent events; the admission slot is held until it ends."""

    chunks: Iterator[bytes]
    content_type: str = "text/event-stream"


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
    answer: Callable[[SettingsT, EngineT, bytes, float], dict[str, Any] | Streamed]  # body, perf_counter at receipt
    post_routes: tuple[str, ...] = ("/invocations",)  # the paths POST answers with `answer`
    # Optional: blocks (on the loading thread) while the loaded engine works; returns None when it ended
    # because the server is stopping, else why the engine failed: then /ping turns 503 and the server
    # stops with EXIT_MODEL (for an engine in another process, which can die while this one runs).
    watch: Callable[[SettingsT, EngineT], str | None] | None = None
    # Optional: `GET /metrics` answers this Prometheus text of the loaded engine (503 while it loads)
    metrics: Callable[[SettingsT, EngineT], str] | None = None


class ModelServer(StrictServer):
    """HTTP server holding the service, its settings, the admission semaphore and (once loaded) the engine."""

    def __init__(self, service: ModelService[Any, Any], settings: ServerSettings):
        self.service = service
        self.settings = settings
        self.admission = threading.BoundedSemaphore(settings.http.max_in_flight)
        self.engine: Any = None
        self.exit_code = 0
        limits = settings.http
        super().__init__(
            (limits.host, limits.port),
            ModelHandler,
            read_deadline_s=limits.read_deadline_s,
            max_connections=limits.max_connections,
            max_connections_per_client=limits.max_connections_per_client,
        )

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
        else:
            self._watch(engine)

    def _watch(self, engine: Any) -> None:
        """Run the service's watch, if it has one; a failure it reports ends the server with EXIT_MODEL."""
        if self.service.watch is None:
            return
        reason = self.service.watch(self.settings, engine)
        if reason is None:
            return
        self.engine = None  # /ping answers 503 from now on
        print(f"{self.service.name}: stopping: {reason}", file=sys.stderr, flush=True)
        self.exit_code = EXIT_MODEL
        self.shutdown()

    def _fail(self, message: str, exit_code: int) -> None:
        print(f"{self.service.name}: refusing to start: {message}", file=sys.stderr, flush=True)
        self.exit_code = exit_code
        self.shutdown()


class ModelHandler(StrictHandler):
    """The SageMaker container contract: GET /ping, POST /invocations; errors are JSON."""

    server: ModelServer

    def version_string(self) -> str:
        """The Server header: the service's own name and version, then Python's."""
        return f"{self.server.service.server_version} {self.sys_version}"

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.server.service.name}: {self.address_string()} {format % args}\n")

    def max_body_bytes(self) -> int:
        return self.server.settings.http.max_body_bytes

    def body_too_large(self, length: int) -> HttpError:
        limits = self.server.settings.http
        return HttpError(
            413,
            f"body: {length} bytes is over the limit of {limits.max_body_bytes} bytes ({limits.prefix}_MAX_BODY_BYTES)",
        )

    def _send(self, status: int, payload: dict[str, Any], *, close: bool = False) -> None:
        self.send_bytes(status, json.dumps(payload, allow_nan=False).encode("utf-8"), close=close)

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
        elif route == "/metrics" and self.server.service.metrics is not None:
            self._send_metrics()
        elif route in self.server.service.post_routes:
            self.send_error_answer(HttpError(405, f"{route} accepts POST only", headers={"Allow": "POST"}))
        else:
            self.send_error_answer(HttpError(404, f"no route {route!r}; use GET /ping or {self._post_routes_text()}"))

    def _send_metrics(self) -> None:
        """GET /metrics: the service's Prometheus text once the model is loaded, 503 while it loads."""
        engine = self.server.engine
        if engine is None:
            self._send(503, {"status": "loading"})
            return
        text = self.server.service.metrics(self.server.settings, engine)
        self.send_bytes(200, text.encode("utf-8"), "text/plain; version=0.0.4; charset=utf-8")

    def _post_routes_text(self) -> str:
        return " or ".join(f"POST {route}" for route in self.server.service.post_routes)

    def do_POST(self) -> None:
        """POST /invocations (and the service's other post_routes), behind admission control, which is
        taken only once the body is read."""
        route = self._route()
        if route not in self.server.service.post_routes:
            status = 405 if route == "/ping" else 404
            self.send_error_answer(HttpError(status, f"no POST route {route!r}; use {self._post_routes_text()}"))
            return
        received = time.perf_counter()
        try:
            self._check_body()
        except HttpError as error:
            self.send_error_answer(error)
            return
        if not self.server.admission.acquire(blocking=False):
            limits = self.server.settings.http
            self.send_error_answer(
                HttpError(
                    503,
                    f"overloaded: {limits.max_in_flight} requests in flight ({limits.prefix}_MAX_IN_FLIGHT); "
                    "retry with backoff",
                    retryable=True,
                )
            )
            return
        try:  # the slot is released before a whole answer is written, so a sequential client never races it
            status, payload = self._invocation(received)
            if isinstance(payload, Streamed):  # the model works while it is written: the slot is held until the end
                self.send_stream(status, payload.chunks, payload.content_type)
                return
        finally:
            self.server.admission.release()
        self._send(status, payload)

    def _invocation(self, received: float) -> tuple[int, dict[str, Any] | Streamed]:
        """(status, JSON payload) for one admitted POST /invocations."""
        try:
            engine = self.server.engine
            if engine is None:
                raise HttpError(503, "model is loading; retry when GET /ping returns 200", retryable=True)
            return 200, self.server.service.answer(self.server.settings, engine, self.body, received)
        except HttpError as error:
            return error.status, error_payload(error)
        except Exception as exc:  # the contract answers every failure with JSON
            traceback.print_exc(file=sys.stderr)
            return 500, {"error": f"internal error: {exc}"}

    def _check_body(self) -> None:
        """The body was read under the framing rules; here: its media type, and that there is one."""
        media_type, _, params = (self.headers.get("Content-Type") or "").partition(";")
        if media_type.strip().lower() != "application/json":
            raise HttpError(415, f"Content-Type must be application/json, got {self.headers.get('Content-Type')!r}")
        charset = params.strip().lower()
        if charset and charset.replace(" ", "") not in ("charset=utf-8", 'charset="utf-8"'):
            raise HttpError(415, f"Content-Type charset must be utf-8, got {params.strip()!r}")
        if self.declared_length is None:
            raise bad("Content-Length", "is required and must be a byte count, got None")
        if self.declared_length == 0:
            raise bad("body", self.server.service.empty_body)


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
    print(f"{name}: listening on http://{host}:{port} (model {settings.model_path}, loading)",
          file=sys.stderr, flush=True)
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
