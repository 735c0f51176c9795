"""Eval runner: send decision tasks to a live SemIf endpoint and collect per-task predictions.

Works against a model server root (`http://127.0.0.1:8080`) or a SageMaker-runtime-shaped
router URL (`http://127.0.0.1:9000/endpoints/NAME`): it POSTs `{"decision": ...}` to
`{endpoint_url}/invocations`. A fixed number of workers each keep one keep-alive connection.
`503 {"retryable": true}` answers are infrastructure back-pressure, not wrong answers: they
are retried with capped exponential backoff and full jitter, and counted. Other 4xx are
carried as errors at once; other 5xx and network failures get one more try.
"""

from __future__ import annotations

import http.client
import json
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, ValidationError

from tasks.errors import BadInput, NotFound
from validation.jevbench import JevTask

IC_HEADER = "X-Amzn-SageMaker-Inference-Component"
ERROR_BODY_CHARS = 500
_RECONNECTABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class Prediction(BaseModel):
    """One task's outcome; `to_dict()` is the line format of the predictions file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    dataset: str
    expected: str
    option_ids: list[str]
    probabilities: list[float] | None
    option_logits: list[float] | None
    allowed_token_mass: float | None
    temperature: float | None
    latency_ms: float
    server_forward_ms: float | None
    server_total_ms: float | None
    attempts: int
    retries_503: int
    error: str | None
    started_at: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict written as one line of the predictions file."""
        return self.model_dump()


@dataclass(frozen=True)
class _Target:
    https: bool
    host: str
    port: int | None
    path: str


@dataclass(frozen=True)
class _Options:
    target: _Target
    headers: dict[str, str]
    timeout_s: float
    max_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    deadline: float | None  # time.monotonic() value
    dataset: str
    rng: random.Random
    sleep: Callable[[float], None]


class _Malformed(Exception):
    """The server answered 200 with a body that is not a valid SemIf result for the task."""


def _parse_endpoint(endpoint_url: str) -> _Target:
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
    return _Target(parts.scheme == "https", parts.hostname, port, parts.path.rstrip("/") + "/invocations")


class _Connection:
    """One keep-alive HTTP connection owned by one worker thread."""

    def __init__(self, target: _Target, headers: dict[str, str]):
        self._target = target
        self._headers = headers
        self._conn: http.client.HTTPConnection | None = None
        self._served = False

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None
        self._served = False

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """POST body; a keep-alive connection the server already closed is reopened once."""
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
            if response.status != 200:  # the server may not have read the body: start clean
                self.close()
            return response.status, data


def _number(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Malformed(f"result field '{field}' is {value!r}, expected a number or null")
    return float(value)


def _numbers(value: Any, field: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _Malformed(f"result field '{field}' is {type(value).__name__}, expected a list of numbers or null")
    return [_number(item, f"{field}[{i}]") for i, item in enumerate(value)]  # type: ignore[misc]


def _parse_result(task: JevTask, data: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _Malformed(f"response body is not JSON: {exc}") from None
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, dict):
        raise _Malformed("response has no 'result' object")
    if result.get("id") != task.id:
        raise _Malformed(f"result id {result.get('id')!r} does not match the task id {task.id!r}")
    if result.get("option_ids") != list(task.labels):
        raise _Malformed(f"result option_ids {result.get('option_ids')!r} differ from the request {list(task.labels)}")
    timings = result.get("timings") or {}
    if not isinstance(timings, dict):
        raise _Malformed("result field 'timings' is not an object")
    return {
        "probabilities": _numbers(result.get("probabilities"), "probabilities"),
        "option_logits": _numbers(result.get("option_logits"), "option_logits"),
        "allowed_token_mass": _number(result.get("allowed_token_mass"), "allowed_token_mass"),
        "temperature": _number(result.get("temperature"), "temperature"),
        "server_forward_ms": _number(timings.get("forward_ms"), "timings.forward_ms"),
        "server_total_ms": _number(timings.get("total_ms"), "timings.total_ms"),
    }


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


EMPTY_RESULT = dict.fromkeys(
    ("probabilities", "option_logits", "allowed_token_mass", "temperature", "server_forward_ms", "server_total_ms")
)


@dataclass(frozen=True)
class Exchange:
    """One request under the retry policy: the 200 body, or the error that ended it, and what it took."""

    data: bytes | None
    error: str | None
    attempts: int
    retries_503: int
    latency_ms: float


def post_with_retries(connection: _Connection, body: bytes, opts: _Options) -> Exchange:
    """POST until a 200, a final error or the deadline: 503-retryable backs off (capped, full jitter);
    a network error or other 5xx gets one more try; latency is that of the final attempt."""
    attempts = retries_503 = extra_tries = 0
    latency_ms = 0.0

    def done(error: str | None, data: bytes | None = None) -> Exchange:
        return Exchange(data=data, error=error, attempts=attempts, retries_503=retries_503, latency_ms=latency_ms)

    while True:
        timeout_s = opts.timeout_s
        if opts.deadline is not None:
            remaining = opts.deadline - time.monotonic()
            if remaining <= 0:
                return done(f"run deadline exceeded after {attempts} attempt(s)")
            timeout_s = min(timeout_s, remaining)
        attempts += 1
        begin = time.perf_counter()
        try:
            status, data = connection.post(body, timeout_s)
        except (OSError, http.client.HTTPException) as exc:
            latency_ms = (time.perf_counter() - begin) * 1000.0
            if opts.deadline is not None and time.monotonic() >= opts.deadline:
                return done(f"run deadline exceeded during attempt {attempts}: {type(exc).__name__}: {exc}")
            if extra_tries == 0 and attempts < opts.max_attempts:
                extra_tries += 1
                continue
            return done(f"request failed after {attempts} attempt(s): {type(exc).__name__}: {exc}")
        latency_ms = (time.perf_counter() - begin) * 1000.0
        if status == 200:
            return done(None, data)
        message, retryable = _error_text(data)
        if status == 503 and retryable:
            if attempts >= opts.max_attempts:
                return done(f"HTTP 503 (retryable) on all {attempts} attempts: {message}")
            delay = opts.rng.uniform(0.0, min(opts.backoff_cap_s, opts.backoff_base_s * 2**retries_503))
            if opts.deadline is not None and time.monotonic() + delay >= opts.deadline:
                return done(f"run deadline exceeded while backing off after HTTP 503 (retryable): {message}")
            retries_503 += 1
            opts.sleep(delay)
            continue
        if status >= 500 and extra_tries == 0 and attempts < opts.max_attempts:
            extra_tries += 1
            continue
        return done(f"HTTP {status}: {message}")


def _run_one(task: JevTask, connection: _Connection, opts: _Options) -> Prediction:
    started_at = time.time()
    body = json.dumps({"decision": task.to_decision()}, ensure_ascii=False).encode("utf-8")
    exchange = post_with_retries(connection, body, opts)
    fields, error = None, exchange.error
    if error is None:
        try:
            fields = _parse_result(task, exchange.data)
        except _Malformed as exc:
            error = f"malformed response: {exc}"
    return Prediction(
        id=task.id, dataset=opts.dataset, expected=task.expected_label, option_ids=list(task.labels),
        latency_ms=exchange.latency_ms, attempts=exchange.attempts, retries_503=exchange.retries_503, error=error,
        started_at=started_at, **(fields or EMPTY_RESULT),
    )


def _check_args(concurrency: int, timeout_s: float, max_attempts: int, backoff_base_s: float,
                backoff_cap_s: float, deadline_s: float | None) -> None:
    problems = []
    if concurrency < 1:
        problems.append(f"concurrency={concurrency} (need >= 1)")
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        problems.append(f"timeout_s={timeout_s} (need a finite number > 0)")
    if max_attempts < 1:
        problems.append(f"max_attempts={max_attempts} (need >= 1)")
    if not (math.isfinite(backoff_base_s) and backoff_base_s >= 0):
        problems.append(f"backoff_base_s={backoff_base_s} (need >= 0)")
    if not (math.isfinite(backoff_cap_s) and backoff_cap_s >= backoff_base_s):
        problems.append(f"backoff_cap_s={backoff_cap_s} (need >= backoff_base_s)")
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        problems.append(f"deadline_s={deadline_s} (need a finite number > 0, or None)")
    if problems:
        raise BadInput("invalid runner settings: " + "; ".join(problems), fix="correct the listed settings")


def run_decisions(
    endpoint_url: str,
    tasks: Sequence[JevTask],
    *,
    concurrency: int = 2,
    timeout_s: float = 60,
    max_attempts: int = 6,
    backoff_base_s: float = 0.2,
    backoff_cap_s: float = 5,
    inference_component: str | None = None,
    deadline_s: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    dataset_name: str = "",
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[Prediction]:
    """Score every task on a live SemIf endpoint; predictions come back in task order.

    Failures are carried in `Prediction.error`, never raised; tasks not finished by
    `deadline_s` (seconds from the call) carry a deadline error. `rng`/`sleep` let tests
    pin the backoff jitter and observe the waits.
    """
    opts = run_options(
        endpoint_url, concurrency=concurrency, timeout_s=timeout_s, max_attempts=max_attempts,
        backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s, inference_component=inference_component,
        deadline_s=deadline_s, dataset_name=dataset_name, rng=rng, sleep=sleep,
    )
    return run_bounded(tasks, _run_one, opts, concurrency=concurrency, progress=progress, thread_name="shiplift-eval")


def run_options(endpoint_url: str, *, concurrency: int, timeout_s: float, max_attempts: int, backoff_base_s: float,
                backoff_cap_s: float, inference_component: str | None, deadline_s: float | None, dataset_name: str,
                rng: random.Random | None, sleep: Callable[[float], None]) -> _Options:
    """Validate a runner's settings and resolve them into the options every request uses."""
    _check_args(concurrency, timeout_s, max_attempts, backoff_base_s, backoff_cap_s, deadline_s)
    target = _parse_endpoint(endpoint_url)
    if inference_component is not None and not inference_component.strip():
        raise BadInput("inference_component is empty", fix="pass the component name, or None")
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if inference_component is not None:
        headers[IC_HEADER] = inference_component
    return _Options(
        target=target, headers=headers, timeout_s=float(timeout_s), max_attempts=max_attempts,
        backoff_base_s=float(backoff_base_s), backoff_cap_s=float(backoff_cap_s),
        deadline=None if deadline_s is None else time.monotonic() + deadline_s,
        dataset=dataset_name, rng=rng or random.Random(), sleep=sleep,
    )


def run_bounded(items: Sequence[Any], work: Callable[[Any, _Connection, _Options], Any], opts: _Options, *,
                concurrency: int, progress: Callable[[int, int], None] | None, thread_name: str,
                weight: Callable[[Any], int] = lambda item: 1) -> list[Any]:
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
        connection = _Connection(opts.target, opts.headers)
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


def write_predictions(path: str | Path, predictions: Sequence[Prediction]) -> None:
    """Write predictions as JSONL (one `to_dict()` per line), atomically via a temp file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for prediction in predictions:
            handle.write(json.dumps(prediction.to_dict(), ensure_ascii=False) + "\n")
    tmp.replace(path)


def read_predictions(path: str | Path) -> list[Prediction]:
    """Read a predictions JSONL file; errors name the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"predictions file {path} does not exist", fix="run the evaluation first")
    predictions = []
    with open(path, encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                predictions.append(Prediction.model_validate(json.loads(line)))
            except json.JSONDecodeError as exc:
                raise BadInput(f"{path}:{lineno}: invalid JSON ({exc.msg})", fix="regenerate the file") from None
            except ValidationError as exc:
                fields = "; ".join(
                    f"field '{'.'.join(map(str, e['loc'])) or '<record>'}': {e['msg']}" for e in exc.errors()
                )
                raise BadInput(f"{path}:{lineno}: {fields}", fix="regenerate the file") from None
    return predictions
