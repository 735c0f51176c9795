"""The one retry policy every shiplift client uses (validation.transport) against a fake clock: the backoff schedule,
the retry deadline shared by a run's workers, the notice a long wait prints, and which answers are retried.

A component scaled to zero answers SageMaker's no-capacity ValidationError until a copy is up; the provisioning "takes
several minutes" and every invocation meanwhile "will produce an error"
(https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html). InvokeEndpoint's
ThrottlingException is retryable too (botocore's sagemaker-runtime service model lists it as a 429 error of
InvokeEndpoint). A runtime channel turns both into `503 {"retryable": true}`; these tests script that answer.
"""

from __future__ import annotations

import dataclasses
import json
import random
from types import SimpleNamespace

import pytest

from shiplift.validation.transport import (
    NO_CAPACITY,
    RetryPolicy,
    post_with_retries,
    run_bounded,
    run_options,
    runtime_error_answer,
    runtime_url,
)

NO_CAPACITY_TEXT = f"Inference Component semif {NO_CAPACITY}. ApplicationAutoScaling may be in-progress."


class FakeClock:
    """A monotonic clock that only the backoff's sleep moves: no real waiting."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class ScaledToZero:
    """A channel whose component answers no-capacity (as a runtime channel unwraps it) until `wakes_at` on the clock,
    then 200; every attempt is logged with the clock's time."""

    def __init__(self, clock: FakeClock, wakes_at: float):
        self.clock, self.wakes_at, self.sent_at = clock, wakes_at, []

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        self.sent_at.append(self.clock())
        if self.clock() < self.wakes_at:
            return runtime_error_answer(400, "ValidationError", {"Message": NO_CAPACITY_TEXT})
        return 200, b'{"ok": true}'

    def close(self) -> None:
        pass


def options(clock: FakeClock, *, retry_deadline_s: float | None, notices: list[str] | None = None, **overrides):
    settings = {"concurrency": 1, "timeout_s": 30.0, "max_attempts": None, "backoff_base_s": 0.5, "backoff_cap_s": 8.0,
                "inference_component": None, "deadline_s": None, "rng": random.Random(11), "sleep": clock.sleep,
                "retry_deadline_s": retry_deadline_s, "notice": None if notices is None else notices.append,
                "clock": clock}
    return run_options("http://127.0.0.1:9/endpoints/ep", **(settings | overrides))


def test_the_backoff_is_capped_exponential_with_full_jitter():
    policy, rng, reference = RetryPolicy(backoff_base_s=0.5, backoff_cap_s=8.0), random.Random(5), random.Random(5)
    delays = [policy.delay(retry, rng) for retry in range(8)]
    assert delays == [reference.uniform(0.0, cap) for cap in (0.5, 1, 2, 4, 8, 8, 8, 8)]
    assert policy.delay(10_000, rng) <= 8.0, "a long wait's retry count cannot overflow the schedule"


def test_a_cold_start_within_the_retry_deadline_is_waited_out_and_answered():
    clock = FakeClock()
    channel = ScaledToZero(clock, wakes_at=clock() + 200)  # a 200 s cold start
    notices: list[str] = []
    exchange = post_with_retries(channel, b"{}", options(clock, retry_deadline_s=600, notices=notices))
    assert (exchange.error, exchange.lost, exchange.data) == (None, False, b'{"ok": true}')
    assert exchange.attempts == len(channel.sent_at) and exchange.retries_503 == exchange.attempts - 1
    reference = random.Random(11)
    assert clock.sleeps[:5] == [reference.uniform(0.0, cap) for cap in (0.5, 1, 2, 4, 8)]
    assert all(0 <= wait <= 8.0 for wait in clock.sleeps)
    # the wait is told: once after WAIT_NOTICE_AFTER_S (5 s), then every 30 s, not once per retry
    assert 6 <= len(notices) <= 8, notices
    assert notices[0].startswith("waiting for the endpoint") and NO_CAPACITY in notices[0]


def test_a_cold_start_longer_than_the_retry_deadline_is_lost_once_the_deadline_passes():
    clock = FakeClock()
    started = clock()
    channel = ScaledToZero(clock, wakes_at=started + 10_000)
    exchange = post_with_retries(channel, b"{}", options(clock, retry_deadline_s=60))
    assert exchange.lost and exchange.data is None
    assert exchange.error.startswith("retry deadline: no answer from the endpoint for 60 s; HTTP 503 (retryable) on ")
    assert NO_CAPACITY in exchange.error
    assert clock() - started < 60, "no retry is sent after the retry deadline"
    assert clock() + 8.0 - started >= 60, "it gave up only when the next retry would have come after the deadline"


def test_one_run_gives_up_once_not_once_per_task():
    """The retry deadline counts from the run's last answer, not from each task's first attempt: the later tasks are
    lost within the same deadline, so a run of N tasks against an endpoint that never wakes ends after one deadline,
    not N."""
    clock = FakeClock()
    started = clock()
    channel = ScaledToZero(clock, wakes_at=started + 10_000)
    opts = dataclasses.replace(options(clock, retry_deadline_s=60), invoker=SimpleNamespace(open=lambda: channel))
    exchanges = run_bounded(list(range(32)), lambda item, connection, o: post_with_retries(connection, b"{}", o), opts,
                            concurrency=1, progress=None, thread_name="test-retry")
    assert all(e.lost for e in exchanges) and len(exchanges) == 32
    assert clock() - started < 60 + 8.0, "one retry deadline for the whole run"
    assert max(channel.sent_at) < started + 60, "nothing is retried after the run's retry deadline"
    assert sum(e.attempts for e in exchanges[1:]) < 3 * 31, "the later tasks are lost after a try or two each"


def test_an_answer_resets_the_retry_deadline_so_a_throttled_run_that_progresses_keeps_retrying():
    clock = FakeClock()
    opts = options(clock, retry_deadline_s=10)
    answers = iter([(503, json.dumps({"error": "ThrottlingException: Rate exceeded", "retryable": True}).encode())] * 3
                   + [(200, b"{}")])

    class Throttled:
        def post(self, body: bytes, timeout_s: float):
            return next(answers)

    clock.now += 9.5  # the run has waited 9.5 s of its 10 since it started, then the endpoint answers a request
    opts.answers.answered()
    exchange = post_with_retries(Throttled(), b"{}", opts)
    assert exchange.error is None and exchange.retries_503 == 3


def test_the_run_deadline_still_bounds_the_retries():
    clock = FakeClock()
    started = clock()
    channel = ScaledToZero(clock, wakes_at=started + 10_000)
    exchange = post_with_retries(channel, b"{}", options(clock, retry_deadline_s=None, deadline_s=30))
    assert exchange.lost and exchange.error.startswith("run deadline exceeded while backing off")
    assert clock() - started < 30


@pytest.mark.parametrize("status, code, message, retried", [
    (400, "ValidationError", NO_CAPACITY_TEXT, True),  # a component at zero copies (the router's and the double's text)
    (429, "ThrottlingException", "Rate exceeded", True),
    (503, "ServiceUnavailable", "Model is not ready or overloaded", True),
    (400, "ValidationError", "Inference Component x not found on endpoint ep.", False),
])
def test_which_runtime_answers_are_retried(status, code, message, retried):
    clock = FakeClock()
    answers = iter([runtime_error_answer(status, code, {"Message": message}), (200, b"{}")])

    class Runtime:
        def post(self, body: bytes, timeout_s: float):
            return next(answers)

    exchange = post_with_retries(Runtime(), b"{}", options(clock, retry_deadline_s=60))
    assert (exchange.error is None) == retried and exchange.lost is False
    assert exchange.retries_503 == (1 if retried else 0)


def test_an_endpoints_url_is_the_runtime_path_wherever_an_invoker_is_built():
    assert runtime_url("http://127.0.0.1:9000/endpoints/ep-a") and runtime_url("http://127.0.0.1:9000/endpoints/ep-a/")
    assert not runtime_url("http://127.0.0.1:9000") and not runtime_url("http://127.0.0.1:9000/")
    assert not runtime_url("http://127.0.0.1:9000/endpoints/ep-a/invocations")
    from shiplift.validation.evaluate import Target

    assert Target.http("http://127.0.0.1:9000/endpoints/ep-a", "c").invoker.runtime is True
    assert Target.http("http://127.0.0.1:9000", "c").invoker.runtime is False
