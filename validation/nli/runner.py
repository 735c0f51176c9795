"""NLI runner: send premise/hypothesis batches to an encoder endpoint and collect per-pair predictions.

POSTs `{"pairs": [{"premise", "hypothesis"}, ...]}` to `{endpoint_url}/invocations` (DESIGN §6.3)
with the connection handling and retry policy the decision runner uses (validation.transport): 503
`{"retryable": true}` (no capacity, throttling) is retried with capped exponential backoff and full jitter until
the retry deadline; other 4xx fail the batch at once; other 5xx and network failures get one more try. A failed
batch gives every pair in it that error (and `lost` when no answer came). Each pair becomes a decision-shaped
`Prediction` (options entailment, neutral, contradiction) so the decision metrics, gates and report apply unchanged:
`probabilities` are the server's (tempered) probabilities in that order, `option_logits` its raw
logits, `temperature` the one the server reports in `model.temperature` (None when absent).

Latency: one batch is one request. `NliRun.requests` holds each request's own timing (start, client
latency, pairs, server times, error): the latency distribution is counted over those. On each pair,
`latency_ms`, `server_forward_ms` and `server_total_ms` are the batch's value divided by the number
of pairs in the batch (the per-pair share, a cost per item, not a single-pair latency); `started_at`
is the batch's start. Truncation is never hidden: every pair's `truncated` flag, input token
count and the server's truncation report come back in `NliRun.details`.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Unpack

from shiplift.tasks.errors import BadInput
from shiplift.validation.nli.pairs import LABELS, NliPair
from shiplift.validation.runner import EMPTY_RESULT, Prediction
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

MAX_BATCH_SIZE = 256


@dataclass(frozen=True)
class PairDetail:
    """What the server said about one pair's input: token count and truncation (None when the batch failed)."""

    id: str
    input_tokens: int | None
    truncated: bool | None
    truncation: dict | None


@dataclass(frozen=True)
class RequestTiming:
    """One request (a batch of pairs) as the client timed it: the unit the latency distribution counts."""

    id: str  # `<dataset>#<batch number>`, from 1
    dataset: str
    pairs: int
    started_at: float  # epoch seconds
    latency_ms: float  # client latency of the whole request, retries included
    attempts: int
    retries_503: int
    error: str | None
    server_forward_ms: float | None = None  # the server's own times for the whole batch (None when it sent none)
    server_total_ms: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class NliRun:
    """Predictions in pair order, each pair's input details, each request's timing and the truncation count."""

    predictions: list[Prediction]
    details: list[PairDetail]
    requests: list[RequestTiming] = field(default_factory=list)

    @property
    def n_truncated(self) -> int:
        """How many pairs the server reported as truncated."""
        return sum(1 for d in self.details if d.truncated)

    def truncation_summary(self) -> dict:
        """A JSON-able count and list of the truncated pairs (for gate evidence)."""
        truncated = [asdict(d) for d in self.details if d.truncated]
        return {
            "n_pairs": len(self.details),
            "n_reported": sum(1 for d in self.details if d.truncated is not None),
            "n_truncated": len(truncated),
            "truncated": truncated,
        }


def _parse_results(batch: Sequence[NliPair], data: bytes) -> tuple[list[dict], list[PairDetail]]:
    """Per-pair Prediction fields and details from a 200 body; `Malformed` when it breaks the contract."""
    payload = json_body(data)
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, list) or len(results) != len(batch):
        got = len(results) if isinstance(results, list) else "no"
        raise Malformed(f"response has {got} 'results' for a batch of {len(batch)} pairs")
    timing = payload.get("timing") or {}
    if not isinstance(timing, dict):
        raise Malformed("response field 'timing' is not an object")
    model = payload.get("model") or {}
    if not isinstance(model, dict):
        raise Malformed("response field 'model' is not an object")
    temperature = optional_number(model.get("temperature"), "model.temperature")
    forward = optional_number(timing.get("forward_ms"), "timing.forward_ms")
    total = optional_number(timing.get("total_ms"), "timing.total_ms")
    share = len(batch)
    fields, details = [], []
    for pair, result in zip(batch, results, strict=True):
        if not isinstance(result, dict):
            raise Malformed(f"result for pair {pair.id!r} is not an object")
        probs = result.get("probabilities")
        if not isinstance(probs, dict) or sorted(probs) != sorted(LABELS):
            raise Malformed(f"result for pair {pair.id!r}: probabilities must map exactly {list(LABELS)}")
        logits = optional_numbers(result.get("logits"), "logits")
        if logits is not None and len(logits) != len(LABELS):
            raise Malformed(f"result for pair {pair.id!r}: {len(logits)} logits, expected {len(LABELS)}")
        detail = _pair_detail(pair, result)
        fields.append({
            "probabilities": [optional_number(probs[label], f"probabilities.{label}") for label in LABELS],
            "option_logits": logits,
            "allowed_token_mass": None,
            "temperature": temperature,
            "server_forward_ms": None if forward is None else forward / share,
            "server_total_ms": None if total is None else total / share,
        })
        details.append(detail)
    return fields, details


def _pair_detail(pair: NliPair, result: dict) -> PairDetail:
    """What one result says of its pair's input (tokens, truncated, how); `Malformed` when a field breaks the
    contract."""
    truncated, tokens, truncation = result.get("truncated"), result.get("input_tokens"), result.get("truncation")
    if not isinstance(truncated, bool):
        raise Malformed(f"result for pair {pair.id!r}: 'truncated' is {truncated!r}, expected true/false")
    if isinstance(tokens, bool) or not isinstance(tokens, int):
        raise Malformed(f"result for pair {pair.id!r}: 'input_tokens' is {tokens!r}, expected an integer")
    if truncation is not None and not isinstance(truncation, dict):
        raise Malformed(f"result for pair {pair.id!r}: 'truncation' is not an object or null")
    return PairDetail(pair.id, tokens, truncated, truncation)


def pairs_body(batch: Sequence[NliPair]) -> bytes:
    """The request body that scores one batch: `{"pairs": […]}` (what the gate sends, and what a dry run prints)."""
    return json.dumps({"pairs": [{"premise": p.premise, "hypothesis": p.hypothesis} for p in batch]},
                      ensure_ascii=False).encode("utf-8")


def batches_of(pairs: Sequence[NliPair], batch_size: int) -> list[Sequence[NliPair]]:
    return [pairs[i : i + batch_size] for i in range(0, len(pairs), batch_size)]


def _run_batch(
    numbered: tuple[int, Sequence[NliPair]], connection: Connection, opts: Options, *, dataset: str
) -> tuple[list[Prediction], list[PairDetail], RequestTiming]:
    """One batch (its number from 1, its pairs) through the transport's retry policy; failures land on every pair of
    the batch."""
    number, batch = numbered
    started_at = time.time()
    body = pairs_body(batch)
    exchange = post_with_retries(connection, body, opts)
    parsed, error = exchange.parse(functools.partial(_parse_results, batch))
    fields, details = parsed or (None, None)
    share = [(f["server_forward_ms"], f["server_total_ms"]) for f in fields or []]
    forward, total = share[0] if share else (None, None)
    timing = RequestTiming(
        id=f"{dataset}#{number}", dataset=dataset, pairs=len(batch), started_at=started_at,
        latency_ms=exchange.latency_ms, attempts=exchange.attempts, retries_503=exchange.retries_503, error=error,
        server_forward_ms=None if forward is None else forward * len(batch),
        server_total_ms=None if total is None else total * len(batch),
    )
    predictions = [
        Prediction(
            id=pair.id, dataset=dataset, expected=pair.label, option_ids=list(LABELS),
            latency_ms=exchange.latency_ms / len(batch), attempts=exchange.attempts, retries_503=exchange.retries_503,
            error=error, started_at=started_at, lost=exchange.lost, **(fields[i] if fields else EMPTY_RESULT),
        )
        for i, pair in enumerate(batch)
    ]
    return predictions, details or [PairDetail(pair.id, None, None, None) for pair in batch], timing


def run_pairs(
    endpoint_url: str,
    pairs: Sequence[NliPair],
    *,
    batch_size: int = 8,
    concurrency: int = 1,
    dataset_name: str = "",
    **settings: Unpack[RequestSettings],
) -> NliRun:
    """Score every pair on a live encoder endpoint in batches; predictions and details in pair order.

    `settings`: the request settings, as the decision runner takes them (`validation.transport.RequestSettings`).
    Failures are carried in `Prediction.error`, never raised; `progress(done, total)` counts pairs.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise BadInput(f"batch_size={batch_size!r} is not an integer in 1..{MAX_BATCH_SIZE}",
                       fix="use e.g. 8, and no more than the server's batch limit")
    batches = list(enumerate(batches_of(pairs, batch_size), start=1))
    work = functools.partial(_run_batch, dataset=dataset_name)
    results = run_requests(endpoint_url, batches, work, concurrency=concurrency, thread_name="shiplift-nli",
                           weight=lambda numbered: len(numbered[1]), **settings)
    return NliRun(
        predictions=[p for outcome in results if outcome for p in outcome[0]],
        details=[d for outcome in results if outcome for d in outcome[1]],
        requests=[outcome[2] for outcome in results if outcome],
    )
