"""Eval runner: send decision tasks to a live endpoint and collect per-task predictions.

A `Readout` says how a task is asked and its answer read: SemIf's `{"decision": …}` by default, or the chat path's
(`validation.decisions.chat_readout`).

Works against a model server root (`http://127.0.0.1:8080`) or a SageMaker-runtime-shaped
router URL (`http://127.0.0.1:9000/endpoints/NAME`, whose SageMaker-shaped errors are unwrapped): it POSTs the
readout's body to `{endpoint_url}/invocations` through `validation.transport` (a fixed number of workers, each on
one keep-alive connection; `503 {"retryable": true}`, the no-capacity answer of a component at zero copies and
throttling retried with capped exponential backoff and full jitter until the endpoint has answered nothing for the
retry deadline, and counted; other 4xx carried as errors at once; other 5xx and network failures get one more try;
a task that got no answer is `lost`). `Prediction` and its JSONL file are shared with the NLI runner.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, Unpack

from pydantic import BaseModel, ConfigDict, ValidationError

from shiplift.tasks.errors import BadInput, NotFound
from shiplift.validation.decisions.jevbench import JevTask
from shiplift.validation.transport import (
    Connection,
    Malformed,
    Options,
    RequestSettings,
    json_body,
    optional_number,
    optional_numbers,
    post_with_retries,
    run_requests,
)

SERVING_ID = re.compile(r"[0-9a-f]{64}")


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
    model_sha256: str | None = None  # the model file the answering server reports (which copy's model answered)
    generated_token: str | None = None  # chat readout: the one token the model generated
    missing_letters: list[str] | None = None  # chat readout: option letters absent from the top log-probabilities
    lost: bool = False  # no answer came (refused as retryable to the retry deadline, no connection, the run deadline)
    serving_id: str | None = None  # what the answering copy serves (image, artifact, environment), where it echoes it


    def to_dict(self) -> dict[str, Any]:
        """The JSON-able dict written as one line of the predictions file."""
        return self.model_dump()


def _parse_result(task: JevTask, data: bytes) -> dict[str, Any]:
    """The task's Prediction fields from a 200 body; `Malformed` when it is not this task's SemIf result."""
    payload = json_body(data)
    result = payload.get("result") if isinstance(payload, dict) else None
    if not isinstance(result, dict):
        raise Malformed("response has no 'result' object")
    if result.get("id") != task.id:
        raise Malformed(f"result id {result.get('id')!r} does not match the task id {task.id!r}")
    if result.get("option_ids") != list(task.labels):
        raise Malformed(f"result option_ids {result.get('option_ids')!r} differ from the request {list(task.labels)}")
    timings = result.get("timings") or {}
    if not isinstance(timings, dict):
        raise Malformed("result field 'timings' is not an object")
    model = result.get("model")
    model_sha256 = model.get("sha256") if isinstance(model, dict) else None
    return {
        "model_sha256": model_sha256 if isinstance(model_sha256, str) else None,
        "probabilities": optional_numbers(result.get("probabilities"), "probabilities"),
        "option_logits": optional_numbers(result.get("option_logits"), "option_logits"),
        "allowed_token_mass": optional_number(result.get("allowed_token_mass"), "allowed_token_mass"),
        "temperature": optional_number(result.get("temperature"), "temperature"),
        "server_forward_ms": optional_number(timings.get("forward_ms"), "timings.forward_ms"),
        "server_total_ms": optional_number(timings.get("total_ms"), "timings.total_ms"),
    }


EMPTY_RESULT = dict.fromkeys(
    ("model_sha256", "probabilities", "option_logits", "allowed_token_mass", "temperature", "server_forward_ms",
     "server_total_ms", "serving_id")
)


def echoed_serving_id(data: bytes) -> str | None:
    """The serving id the answering copy echoed (`SHIPLIFT_SERVING_ID`, as `tasks.backends.interfaces.ComponentSpec.
    serving_id` derives it): SemIf's in its result's `model`, the chat path's as its `system_fingerprint`; None where
    the server names none (an older image, the DLC on aws), and the answer is attributed by its model's sha256."""
    payload = json_body(data)
    if not isinstance(payload, dict):
        return None
    result = payload.get("result")
    model = result.get("model") if isinstance(result, dict) else None
    found = model.get("serving_id") if isinstance(model, dict) else payload.get("system_fingerprint")
    return found if isinstance(found, str) and SERVING_ID.fullmatch(found) else None


def decision_body(task: JevTask) -> bytes:
    """The request body that scores one task: `{"decision": …}` (what the gate sends, and what a dry run prints)."""
    return json.dumps({"decision": task.to_decision()}, ensure_ascii=False).encode("utf-8")


class Readout(Protocol):
    """How a decision task is asked of a server and its answer read back as option probabilities."""

    name: str

    def body(self, task: JevTask) -> bytes:
        """The request body for one task."""

    def parse(self, task: JevTask, data: bytes) -> dict[str, Any]:
        """A 200 body as Prediction fields; `Malformed` when it is not an answer to this task."""

    def losses(self, rows: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
        """What this readout loses against the model's own distribution, over scored rows (None: nothing)."""


class SemifReadout:
    """The SemIf adapter's: one `{"decision": …}` per task, letter probabilities in its `result`."""

    name = "semif"

    def body(self, task: JevTask) -> bytes:
        return decision_body(task)

    def parse(self, task: JevTask, data: bytes) -> dict[str, Any]:
        return _parse_result(task, data)

    def losses(self, rows: Sequence[dict[str, Any]]) -> None:
        return None  # the adapter reads every option's letter from the full softmax


SEMIF = SemifReadout()


def _run_one(task: JevTask, connection: Connection, opts: Options, *, dataset: str, readout: Readout) -> Prediction:
    """One task through the transport's retry policy; a failed request or malformed answer is its error."""
    started_at = time.time()
    exchange = post_with_retries(connection, readout.body(task), opts)
    fields, error = exchange.parse(lambda data: {**readout.parse(task, data), "serving_id": echoed_serving_id(data)})
    return Prediction(
        id=task.id, dataset=dataset, expected=task.expected_label, option_ids=list(task.labels),
        latency_ms=exchange.latency_ms, attempts=exchange.attempts, retries_503=exchange.retries_503, error=error,
        started_at=started_at, lost=exchange.lost, **(fields or EMPTY_RESULT),
    )


def run_decisions(
    endpoint_url: str,
    tasks: Sequence[JevTask],
    *,
    concurrency: int = 2,
    dataset_name: str = "",
    readout: Readout = SEMIF,
    **settings: Unpack[RequestSettings],
) -> list[Prediction]:
    """Score every task on a live endpoint through `readout` (SemIf's by default); predictions in task order.

    `settings`: the request settings (`validation.transport.RequestSettings`: timeout_s 60, max_attempts None,
    backoff_base_s 0.2, backoff_cap_s 5, retry_deadline_s 600, inference_component, deadline_s, progress counting
    tasks, notice, rng, sleep, clock). Failures are carried in `Prediction.error` (and `lost` when no answer came),
    never raised; tasks not finished by `deadline_s` (seconds from the call) carry a deadline error. `rng`/`sleep`/
    `clock` let tests pin the backoff jitter and observe the waits.
    """
    work = functools.partial(_run_one, dataset=dataset_name, readout=readout)
    return run_requests(endpoint_url, tasks, work, concurrency=concurrency, thread_name="shiplift-eval", **settings)


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
