"""Transport shared by the eval runners: options, one channel per worker, retries, a bounded pool.

A runner hands its items and its `work(item, channel, opts)` to `run_requests`, with its request settings
(`RequestSettings`, the keyword arguments every runner takes): `run_options` validates and resolves the settings, then
`run_bounded` hands each item to its work on a fixed number of workers, each with one channel opened by the
run's invoker: `HttpInvoker` (a keep-alive `Connection` to `{endpoint_url}/invocations`, used
for loopback servers and routers) or whatever the hosting backend hands out (SageMaker's
`InvokeEndpoint` on aws). A channel answers `(status, body)` exactly like HTTP. `post_with_retries` applies the one
retry policy of every shiplift client (`RetryPolicy`): `503 {"retryable": true}` (what a runtime channel makes of
SageMaker's no-capacity ValidationError, of throttling and of a model not ready) is infrastructure back-pressure, not
a wrong answer, so it is retried with capped exponential backoff and full jitter, and counted, until the endpoint has
answered nothing for the policy's `retry_deadline_s` (a cold start from zero takes minutes); other 4xx end the
request at once; other 5xx and network failures get one more try. A request that ends without an answer from the
model (refused to the end, no connection, the run's deadline) is `lost`. A runner turns a 200 body into its results
with `Exchange.parse`, its parser raising `Malformed` (with `json_body`, `optional_number` and
`optional_numbers` to read fields) when the body breaks the wire contract.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict, TypeVar
from urllib.parse import urlsplit

from shiplift.tasks.errors import BadInput
from shiplift.validation.retry_policy import DEFAULT_POLICY, DEFAULT_RETRY_DEADLINE_S, RetryPolicy

IC_HEADER = "X-Amzn-SageMaker-Inference-Component"
ERROR_BODY_CHARS = 500
# a run waiting that long on retryable answers says so, then as often
WAIT_NOTICE_AFTER_S, WAIT_NOTICE_EVERY_S = 5.0, 30.0
RUNTIME_PATH = re.compile(r"/endpoints/[^/]+/?")  # the SageMaker runtime's invoke path: /endpoints/{EndpointName}
_RECONNECTABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)

Item = TypeVar("Item")
Outcome = TypeVar("Outcome")


@dataclass(frozen=True)
class Target:
    """Where requests go: scheme, host, port and the `/invocations` path."""

    https: bool
    host: str
    port: int | None
    path: str


class AnswerClock:
    """When a run's endpoint last answered (shared by its workers): retries stop once it has answered nothing for the
    policy's retry deadline, so a run against an endpoint that never wakes gives up once, not once per request; and
    a run that has waited WAIT_NOTICE_AFTER_S on retryable answers says so (`notice`), then every
    WAIT_NOTICE_EVERY_S."""

    def __init__(self, retry_deadline_s: float | None, clock: Callable[[], float],
                 notice: Callable[[str], None] | None):
        self.retry_deadline_s, self.clock, self.notice = retry_deadline_s, clock, notice
        self._lock = threading.Lock()
        self.last_answer = clock()
        self._next_notice = self.last_answer + WAIT_NOTICE_AFTER_S

    def answered(self) -> None:
        """The endpoint answered a request (not with a retryable refusal)."""
        with self._lock:
            self.last_answer = self.clock()
            self._next_notice = self.last_answer + WAIT_NOTICE_AFTER_S

    def gives_up_by(self, moment: float) -> bool:
        """Whether a retry at `moment` would come after the retry deadline."""
        with self._lock:
            return self.retry_deadline_s is not None and moment - self.last_answer >= self.retry_deadline_s

    def waiting(self, message: str) -> None:
        """A request is backing off after the retryable answer `message`: tell the run's notice when it is time."""
        with self._lock:
            now = self.clock()
            if self.notice is None or now < self._next_notice:
                return
            self._next_notice = now + WAIT_NOTICE_EVERY_S
            waited = now - self.last_answer
            bound = ("" if self.retry_deadline_s is None else
                     f", retrying until {max(0.0, self.retry_deadline_s - waited):.0f} s more pass without an answer")
        self.notice(f"waiting for the endpoint (a cold start, throttling or a busy model): no answer for {waited:.0f} s"
                    f"{bound}; it said: {message}")


@dataclass(frozen=True)
class Options:
    """A run's resolved settings, shared read-only by every request (build it with `run_options`)."""

    invoker: Any  # tasks.backends.interfaces.Invoker
    timeout_s: float
    retry: RetryPolicy
    deadline: float | None  # a `clock()` value
    rng: random.Random
    sleep: Callable[[float], None]
    clock: Callable[[], float]
    answers: AnswerClock


class Malformed(Exception):
    """The server answered 200 with a body that breaks the wire contract for the request."""


def _parse_endpoint(endpoint_url: str) -> Target:
    parts = urlsplit(endpoint_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise BadInput(
            f"endpoint URL {endpoint_url!r} is not an http(s) URL without query or fragment",
            fix="pass e.g. http://127.0.0.1:8080 or http://127.0.0.1:9000/endpoints/NAME",
        )
    try:
        port = parts.port
    except ValueError:
        raise BadInput(f"endpoint URL {endpoint_url!r} has an invalid port", fix="use host:port with 1-65535") from None
    return Target(parts.scheme == "https", parts.hostname, port, parts.path.rstrip("/") + "/invocations")


class Connection:
    """One keep-alive HTTP connection owned by one worker thread."""

    def __init__(self, target: Target, headers: dict[str, str]):
        self._target = target
        self._headers = headers
        self._conn: http.client.HTTPConnection | None = None
        self._served = False
        self.sent_status: int | None = None  # the status the server sent to the last `post` (None: no answer came)

    def close(self) -> None:
        """Drop the socket; the next `post` opens a fresh one."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._served = False

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST body; a keep-alive connection the server already closed is reopened once."""
        self.sent_status = None
        while True:
            if self._conn is None:
                cls = http.client.HTTPSConnection if self._target.https else http.client.HTTPConnection
                self._conn = cls(self._target.host, self._target.port, timeout=timeout_s)
            else:
                self._conn.timeout = timeout_s
                if self._conn.sock is not None:
                    self._conn.sock.settimeout(timeout_s)
            reused = self._served
            try:
                self._conn.request("POST", self._target.path, body=body, headers=self._headers)
                response = self._conn.getresponse()
                data = response.read()
            except _RECONNECTABLE:
                self.close()
                if reused:
                    continue
                raise
            except BaseException:
                self.close()
                raise
            self._served = True
            self.sent_status = response.status
            if response.status != 200:  # the server may not have read the body: start clean
                self.close()
            return response.status, data


RUNTIME_RETRYABLE = {"ThrottlingException", "ServiceUnavailable", "ModelNotReadyException",
                     "InternalDependencyException",
                     "InternalFailure", "ModelStreamError"}
# A component scaled to zero answers its first requests with this ValidationError until a copy is up again; the
# scale-out alarm counts them (NoCapacityInvocationFailures), so they are retried, never dropped
# (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html).
NO_CAPACITY = "has no capacity to process this request"


def no_capacity(code: str, message: str) -> bool:
    """True for the runtime's answer to a request that found the component scaled to zero."""
    return code == "ValidationError" and NO_CAPACITY in message


def runtime_error_answer(status: int, code: str, fields: dict[str, Any]) -> tuple[int, bytes]:
    """A SageMaker-runtime error turned back into the container's answer, the same on both backends: a model's
    own error (`ModelError` with `OriginalStatusCode`) is its status and body; throttling, a model not ready,
    a component scaled to zero and service trouble are `503 {"retryable": true}`; anything else keeps its status with
    the message."""
    message = str(fields.get("Message") or fields.get("message") or "")
    if code == "ModelError" and "OriginalStatusCode" in fields:
        original = fields.get("OriginalMessage")
        return int(fields["OriginalStatusCode"]), (message if original is None else str(original)).encode("utf-8")
    if code == "ModelError":  # the model failed without answering (broken connection, timeout)
        return 500, json.dumps({"error": message, "retryable": False}).encode()
    retryable = code in RUNTIME_RETRYABLE or status >= 500 or no_capacity(code, message)
    return (503 if retryable else status
            or 400), json.dumps({"error": f"{code}: {message}", "retryable": retryable}).encode()


class RuntimeHttpChannel:
    """A keep-alive `Connection` to a SageMaker-runtime-shaped endpoint (the local router), its error answers
    unwrapped."""

    ERROR_CODES = {424: "ModelError", 503: "ServiceUnavailable", 429: "ThrottlingException"}

    def __init__(self, connection: Connection):
        self.connection = connection

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        status, data = self.connection.post(body, timeout_s)
        if status == 200:
            return status, data
        try:
            fields = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            fields = {"Message": data.decode("utf-8", "replace")}
        return runtime_error_answer(status, self.ERROR_CODES.get(status, "ValidationError"), fields
                                    if isinstance(fields, dict) else {})

    @property
    def sent_status(self) -> int | None:
        """The runtime's own status of the last answer, before it was unwrapped (None: no answer came)."""
        return self.connection.sent_status

    def close(self) -> None:
        self.connection.close()


def json_body(data: bytes) -> Any:
    """A 200 body decoded as JSON; `Malformed` when it is not JSON."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Malformed(f"response body is not JSON: {exc}") from None


def optional_number(value: Any, field: str) -> float | None:
    """A result field that must be a number or null, as float or None; `Malformed` naming the field otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Malformed(f"result field '{field}' is {value!r}, expected a number or null")
    return float(value)


def optional_numbers(value: Any, field: str) -> list[float] | None:
    """A result field that must be a list of numbers or null; `Malformed` naming the field or item otherwise."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise Malformed(f"result field '{field}' is {type(value).__name__}, expected a list of numbers or null")
    return [optional_number(item, f"{field}[{i}]") for i, item in enumerate(value)]  # type: ignore[misc]


def _error_text(data: bytes) -> tuple[str, bool]:
    """The server's error message and whether it declared itself retryable."""
    try:
        payload = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        return payload["error"], payload.get("retryable") is True
    text = data.decode("utf-8", "replace")
    if len(text) > ERROR_BODY_CHARS:
        text = f"{text[:ERROR_BODY_CHARS]}… ({len(data)} bytes in all)"
    return text, False


@dataclass(frozen=True)
class Exchange:
    """One request under the retry policy: the 200 body, or the error that ended it, and what it took; `lost` when
    no answer came from the model (refused with retryable answers to the end, no connection, the run's deadline)."""

    data: bytes | None
    error: str | None
    attempts: int
    retries_503: int
    latency_ms: float
    lost: bool = False

    def parse(self, parser: Callable[[bytes], Outcome]) -> tuple[Outcome | None, str | None]:
        """`(parser(body), None)` for a 200, else `(None, error)`; a body the parser finds
        `Malformed` is the error `malformed response: ...`."""
        if self.data is None:
            return None, self.error
        try:
            return parser(self.data), None
        except Malformed as exc:
            return None, f"malformed response: {exc}"


def post_with_retries(connection: Connection, body: bytes, opts: Options) -> Exchange:
    """POST until a 200, a final error or a deadline: a retryable 503 backs off (`opts.retry`) until the run's
    endpoint has answered nothing for the retry deadline; a network error or other 5xx gets `error_retries` more tries
    (one by default); latency is that of the final attempt."""
    attempts = retries_503 = extra_tries = 0
    latency_ms = 0.0
    policy = opts.retry

    def done(error: str | None, data: bytes | None = None, *, lost: bool = False) -> Exchange:
        return Exchange(data=data, error=error, attempts=attempts, retries_503=retries_503, latency_ms=latency_ms,
                        lost=lost)

    while (timeout_s := _attempt_timeout(opts)) is not None:
        attempts += 1
        begin = time.perf_counter()
        try:
            status, data = connection.post(body, timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            latency_ms = (time.perf_counter() - begin) * 1000.0
            if opts.deadline is not None and opts.clock() >= opts.deadline:
                return done(f"run deadline exceeded during attempt {attempts}: {type(exc).__name__}: {exc}", lost=True)
            if extra_tries < policy.error_retries and policy.attempts_left(attempts):
                extra_tries += 1
                continue
            return done(f"request failed after {attempts} attempt(s): {type(exc).__name__}: {exc}", lost=True)
        latency_ms = (time.perf_counter() - begin) * 1000.0
        message, retryable = (None, False) if status == 200 else _error_text(data)
        if status == 503 and retryable:
            ended = _back_off(opts, attempts, retries_503, message)
            if ended is not None:
                return done(ended, lost=True)
            retries_503 += 1
            continue
        opts.answers.answered()
        if status == 200:
            return done(None, data)
        if status >= 500 and extra_tries < policy.error_retries and policy.attempts_left(attempts):
            extra_tries += 1
            continue
        return done(f"HTTP {status}: {message}")
    return done(f"run deadline exceeded after {attempts} attempt(s)", lost=True)


def _attempt_timeout(opts: Options) -> float | None:
    """One attempt's timeout: `opts.timeout_s`, cut to what is left of the run's deadline; None once that has passed."""
    if opts.deadline is None:
        return opts.timeout_s
    remaining = opts.deadline - opts.clock()
    return min(opts.timeout_s, remaining) if remaining > 0 else None


def _back_off(opts: Options, attempts: int, retries_503: int, message: str | None) -> str | None:
    """Wait out a retryable 503 (the `retries_503`-th) before the next attempt; instead the error that ends the
    request, without waiting, when no attempt is left or the wait would pass the run's or the retry deadline."""
    policy = opts.retry
    if not policy.attempts_left(attempts):
        return f"HTTP 503 (retryable) on all {attempts} attempts: {message}"
    delay = policy.delay(retries_503, opts.rng)
    wake = opts.clock() + delay
    if opts.deadline is not None and wake >= opts.deadline:
        return f"run deadline exceeded while backing off after HTTP 503 (retryable): {message}"
    if opts.answers.gives_up_by(wake):
        return (f"retry deadline: no answer from the endpoint for {policy.retry_deadline_s:g} s; HTTP 503 "
                f"(retryable) on {attempts} attempt(s): {message}")
    opts.answers.waiting(message)
    opts.sleep(delay)
    return None


def _check_args(concurrency: int, timeout_s: float, max_attempts: int | None, backoff_base_s: float,
                backoff_cap_s: float, deadline_s: float | None, retry_deadline_s: float | None) -> None:
    problems = []
    if concurrency < 1:
        problems.append(f"concurrency={concurrency} (need >= 1)")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        problems.append(f"timeout_s={timeout_s} (need a finite number > 0)")
    if max_attempts is not None and max_attempts < 1:
        problems.append(f"max_attempts={max_attempts} (need >= 1, or None)")
    if not (math.isfinite(backoff_base_s) and backoff_base_s >= 0):
        problems.append(f"backoff_base_s={backoff_base_s} (need >= 0)")
    if not (math.isfinite(backoff_cap_s) and backoff_cap_s >= backoff_base_s):
        problems.append(f"backoff_cap_s={backoff_cap_s} (need >= backoff_base_s)")
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        problems.append(f"deadline_s={deadline_s} (need a finite number > 0, or None)")
    if retry_deadline_s is not None and not (math.isfinite(retry_deadline_s) and retry_deadline_s > 0):
        problems.append(f"retry_deadline_s={retry_deadline_s} (need a finite number > 0, or None)")
    if problems:
        raise BadInput("invalid runner settings: " + "; ".join(problems), fix="correct the listed settings")


def runtime_url(endpoint_url: str) -> bool:
    """Whether a URL is a SageMaker-runtime-shaped endpoint (`…/endpoints/NAME`: the local router's runtime route)
    rather than a model server's or router's container root."""
    return RUNTIME_PATH.fullmatch(urlsplit(endpoint_url).path) is not None


class HttpInvoker:
    """Invoke a model over HTTP: a server root, or a SageMaker-runtime-shaped endpoint URL (`runtime`, by default
    whether the URL is `…/endpoints/NAME`) whose error answers are unwrapped to the container's, plus the component
    header."""

    def __init__(self, endpoint_url: str, component: str | None = None, *, runtime: bool | None = None):
        if component is not None and not component.strip():
            raise BadInput("inference_component is empty", fix="pass the component name, or None")
        self._target = _parse_endpoint(endpoint_url)
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if component is not None:
            self._headers[IC_HEADER] = component
        self.url, self.component = endpoint_url, component
        self.runtime = runtime_url(endpoint_url) if runtime is None else runtime

    def describe(self) -> dict[str, Any]:
        return {"url": self.url, "component": self.component}

    def open(self) -> Connection | RuntimeHttpChannel:
        connection = Connection(self._target, self._headers)
        return RuntimeHttpChannel(connection) if self.runtime else connection


def run_options(endpoint: Any, *, concurrency: int, timeout_s: float, max_attempts: int | None, backoff_base_s: float,
                backoff_cap_s: float, inference_component: str | None, deadline_s: float | None,
                rng: random.Random | None, sleep: Callable[[float], None],
                retry_deadline_s: float | None = None, notice: Callable[[str], None] | None = None,
                clock: Callable[[], float] = time.monotonic, error_retries: int = 1) -> Options:
    """Validate a runner's settings and resolve them into the options every request uses; `endpoint`
    is a URL (with `inference_component`) or an invoker from the hosting backend; `deadline_s`
    counts from this call, and so does the retry deadline until the endpoint first answers."""
    _check_args(concurrency, timeout_s, max_attempts, backoff_base_s, backoff_cap_s, deadline_s, retry_deadline_s)
    if isinstance(endpoint, str):
        invoker = HttpInvoker(endpoint, inference_component)
    elif inference_component is not None:
        raise BadInput("inference_component is given with an invoker", fix="the invoker already names its component")
    else:
        invoker = endpoint
    return Options(
        invoker=invoker, timeout_s=float(timeout_s),
        retry=RetryPolicy(backoff_base_s=float(backoff_base_s), backoff_cap_s=float(backoff_cap_s),
                          retry_deadline_s=retry_deadline_s, max_attempts=max_attempts, error_retries=error_retries),
        deadline=None if deadline_s is None else clock() + deadline_s,
        rng=rng or random.Random(), sleep=sleep, clock=clock, answers=AnswerClock(retry_deadline_s, clock, notice),
    )


def post_alone(invoker: HttpInvoker, body: bytes, *, timeout_s: float, deadline_s: float | None,
               retry_deadline_s: float | None = DEFAULT_RETRY_DEADLINE_S, error_retries: int = 1,
               ) -> tuple[Exchange, int | None]:
    """One request on a channel of its own under the retry policy (clients that send one at a time: the demo's
    traffic, bench): the exchange, and the status the endpoint itself sent last (before a runtime channel unwraps
    it; None when no answer came). `error_retries` 0 keeps a model's own 5xx as its answer (traffic that counts
    them)."""
    opts = run_options(invoker, concurrency=1, timeout_s=timeout_s, max_attempts=None,
                       backoff_base_s=DEFAULT_POLICY.backoff_base_s, backoff_cap_s=DEFAULT_POLICY.backoff_cap_s,
                       inference_component=None, deadline_s=deadline_s, rng=None, sleep=time.sleep,
                       retry_deadline_s=retry_deadline_s, error_retries=error_retries)
    channel = opts.invoker.open()
    try:
        return post_with_retries(channel, body, opts), channel.sent_status
    finally:
        channel.close()


class RequestSettings(TypedDict, total=False):
    """The request settings a runner takes as keyword arguments beside its own (`validation.runner.run_decisions`,
    `validation.nli.runner.run_pairs`); a setting left out takes `run_requests`' default."""

    timeout_s: float  # one attempt's timeout
    max_attempts: int | None  # attempts per request, 503 retries included (None: the retry deadline bounds them)
    backoff_base_s: float  # the 503 backoff: capped exponential, full jitter
    backoff_cap_s: float
    retry_deadline_s: float | None  # retryable answers are retried until the endpoint answered nothing this long
    inference_component: str | None  # the component a URL endpoint's requests name (an invoker names its own)
    deadline_s: float | None  # seconds from the call; items not done by then carry a deadline error
    progress: Callable[[int, int], None] | None  # (done, total), in the runner's weight
    notice: Callable[[str], None] | None  # a line while the run waits on retryable answers (a cold start)
    rng: random.Random | None  # pins the backoff jitter (tests)
    sleep: Callable[[float], None]  # the backoff's wait (tests observe it)
    clock: Callable[[], float]  # the deadlines' clock (tests pass a fake one with a sleep that advances it)


def run_requests(endpoint: Any, items: Sequence[Item], work: Callable[[Item, Connection, Options], Outcome], *,
                 concurrency: int, thread_name: str, weight: Callable[[Item], int] = lambda item: 1,
                 timeout_s: float = 60, max_attempts: int | None = None,
                 backoff_base_s: float = DEFAULT_POLICY.backoff_base_s,
                 backoff_cap_s: float = DEFAULT_POLICY.backoff_cap_s,
                 retry_deadline_s: float | None = DEFAULT_POLICY.retry_deadline_s,
                 inference_component: str | None = None, deadline_s: float | None = None,
                 progress: Callable[[int, int], None] | None = None, notice: Callable[[str], None] | None = None,
                 rng: random.Random | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """A runner's request loop: validate and resolve the settings (`run_options`; the deadlines count from here), then
    run `work` over the items on `concurrency` workers (`run_bounded`); outcomes in item order."""
    opts = run_options(
        endpoint, concurrency=concurrency, timeout_s=timeout_s, max_attempts=max_attempts,
        backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s, inference_component=inference_component,
        deadline_s=deadline_s, rng=rng, sleep=sleep, retry_deadline_s=retry_deadline_s, notice=notice, clock=clock,
    )
    return run_bounded(items, work, opts, concurrency=concurrency, progress=progress, thread_name=thread_name,
                       weight=weight)


def run_bounded(items: Sequence[Item], work: Callable[[Item, Connection, Options], Outcome], opts: Options, *,
                concurrency: int, progress: Callable[[int, int], None] | None, thread_name: str,
                weight: Callable[[Item], int] = lambda item: 1) -> list[Outcome]:
    """Run `work(item, connection, opts)` over items with at most `concurrency` workers, each on its own
    keep-alive connection, taking items in order (no queue); results in item order. `progress`
    receives the summed `weight` of finished items and of all items."""
    total = sum(weight(item) for item in items)
    results: list[Any] = [None] * len(items)
    lock = threading.Lock()
    cursor = iter(range(len(items)))
    stop = threading.Event()
    done = 0

    def worker() -> None:
        nonlocal done
        connection = opts.invoker.open()
        try:
            while not stop.is_set():
                with lock:
                    index = next(cursor, None)
                if index is None:
                    return
                outcome = work(items[index], connection, opts)
                with lock:
                    results[index] = outcome
                    done += weight(items[index])
                    if progress is not None:
                        progress(done, total)
        except BaseException:
            stop.set()
            raise
        finally:
            connection.close()

    workers = min(concurrency, len(items))
    if workers:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=thread_name) as pool:
            for future in [pool.submit(worker) for _ in range(workers)]:
                future.result()
    return [r for r in results if r is not None]
