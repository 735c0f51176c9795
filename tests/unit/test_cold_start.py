"""The cold-start gate: its percentile against numpy's, its check, how it joins a family's gate, and the runtime's
no-capacity answer being retryable."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from shiplift.validation.cold_start import CHECK_NAME, ColdStart, cold_start_check, first_answer, nearest_rank
from shiplift.validation.gates import with_release_checks
from shiplift.validation.transport import runtime_error_answer

NO_CAPACITY_TEXT = ("Inference Component c has no capacity to process this request. ApplicationAutoScaling may be "
                    "in-progress (if configured) or try to increase the capacity by invoking "
                    "UpdateInferenceComponentRuntimeConfig API.")


@pytest.mark.parametrize("values", [[3.0], [1.0, 9.0, 4.0], list(range(1, 21)), list(range(1, 22)),
                                    [random.Random(seed).uniform(0, 100) for seed in range(37)]])
def test_nearest_rank_matches_numpy_s_inverted_cdf(values):
    # numpy's "inverted_cdf" method is the nearest-rank definition (Hyndman & Fan type 1)
    assert nearest_rank(values, 0.95) == pytest.approx(np.percentile(values, 95, method="inverted_cdf"))


def test_nearest_rank_by_hand():
    assert nearest_rank(list(range(1, 21)), 0.95) == 19  # ceil(0.95 * 20) = 19th
    assert nearest_rank([5.0, 1.0, 3.0], 0.95) == 5.0  # three starts: the slowest
    with pytest.raises(ValueError):
        nearest_rank([], 0.95)


def start(seconds: float, error: str | None = None) -> ColdStart:
    return ColdStart(seconds=seconds, attempts=3, error=error)


def test_the_check_passes_at_the_bound_and_fails_above_it_or_on_a_start_with_no_answer():
    passed = cold_start_check([start(1.0), start(2.0), start(4.0)], 4.0)
    assert (passed["name"], passed["status"], passed["observed"], passed["threshold"],
            passed["n"]) == (CHECK_NAME, "pass", 4.0, 4.0, 3)
    assert passed["passed"] is True and passed["rule"] == "point"
    assert cold_start_check([start(1.0), start(4.5)], 4.0)["status"] == "fail"
    lost = cold_start_check([start(1.0), start(8.0, "run deadline exceeded after 40 attempt(s)")], 100.0)
    assert lost["status"] == "fail" and "1 of 2 starts got no answer" in lost["reason"]


def report(decision: str, *statuses: str) -> dict:
    checks = [{"name": f"c{i}", "status": status, "observed": 1.0, "threshold": 1.0, "comparator": ">=", "ci": None,
               "n": 10, "reason": "", "rule": "bound", "passed": status == "pass"} for i, status in enumerate(statuses)]
    return {"decision": decision, "checks": checks, "metrics": {}}


def test_release_checks_join_the_gate_s_decision():
    cold_pass = cold_start_check([start(1.0)], 2.0)
    cold_fail = cold_start_check([start(3.0)], 2.0)
    assert with_release_checks(report("pass", "pass"), {"checks": [cold_fail]})["decision"] == "fail"
    joined = with_release_checks(report("pass", "pass"), {"checks": [cold_pass]})
    assert joined["decision"] == "pass" and [c["name"] for c in joined["checks"]] == ["c0", CHECK_NAME]
    assert with_release_checks(report("inconclusive", "inconclusive"),
                               {"checks": [cold_pass]})["decision"] == "inconclusive"
    # a gate without thresholds judged nothing: a passing cold start does not make it a pass
    assert with_release_checks(report("not_gated", "skipped"), {"checks": [cold_pass]})["decision"] == "not_gated"
    assert with_release_checks(report("not_gated", "skipped"), {"checks": [cold_fail]})["decision"] == "fail"
    unchanged = report("pass", "pass")
    assert with_release_checks(unchanged, None) is unchanged and with_release_checks(unchanged,
                                                                                     {"cost": {}}) is unchanged


def test_the_runtime_s_no_capacity_answer_is_retryable_and_other_validation_errors_are_not():
    status, body = runtime_error_answer(400, "ValidationError", {"Message": NO_CAPACITY_TEXT})
    assert status == 503 and json.loads(body)["retryable"] is True
    status, body = runtime_error_answer(400, "ValidationError", {"Message": "Inference Component x not found."})
    assert status == 400 and json.loads(body)["retryable"] is False


class ScaledToZero:
    """An invoker whose component answers no-capacity `failures` times, then 200 (what a scale-out looks like)."""

    def __init__(self, failures: int):
        self.failures, self.sent = failures, 0

    def describe(self) -> dict:
        return {"kind": "scripted"}

    def open(self):
        invoker = self

        class Channel:
            def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
                invoker.sent += 1
                if invoker.sent <= invoker.failures:
                    return runtime_error_answer(400, "ValidationError", {"Message": NO_CAPACITY_TEXT})
                return 200, b"{}"

            def close(self) -> None:
                pass

        return Channel()


def test_first_answer_retries_every_no_capacity_answer_until_the_copy_answers():
    invoker = ScaledToZero(failures=7)
    measured = first_answer(invoker, b"{}", timeout_s=1, deadline_s=10, rng=random.Random(0))
    assert (measured.error, measured.attempts, invoker.sent) == (None, 8, 8)


def test_first_answer_without_an_answer_before_its_deadline_says_so():
    measured = first_answer(ScaledToZero(failures=10**9), b"{}", timeout_s=1, deadline_s=0.5, rng=random.Random(0))
    assert measured.error and "deadline" in measured.error and measured.seconds < 2
