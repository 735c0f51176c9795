"""The gate's cold-vs-warm check of a prefix cache (`validation.cache_check`) without a model: the comparison against
hand-computed differences, the sample, the answers it reads, and its config (`validation.cache_check`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from shiplift.tasks.families.gguf_decisions import DecisionGateConfig
from shiplift.validation.cache_check import Answer, ColdWarm, cache_check, parse_answer, sample_tasks
from shiplift.validation.decisions.jevbench import load_jevbench
from shiplift.validation.thresholds import CacheCheckRule
from shiplift.validation.transport import Malformed

DECISIONS = Path(__file__).resolve().parents[2] / "validation" / "data" / "decisions.jsonl"


def pair(task: str, cold: list[float], warm: list[float], reused: int = 40) -> ColdWarm:
    return ColdWarm(task, Answer(cold, None, 0), Answer(warm, None, reused))


def test_the_largest_option_difference_over_every_pair_is_judged_against_the_tolerance():
    pairs = [pair("t1", [0.5, 0.5], [0.50002, 0.49998]),  # |diff| 2e-5 on both options
             pair("t2", [0.1, 0.2, 0.7], [0.1, 0.20007, 0.69993]),  # 7e-5: the largest
             pair("t3", [0.9, 0.1], [0.9, 0.1])]
    check, evidence = cache_check(pairs, 1e-4)
    assert check.status == "pass" and check.n == 3 and check.threshold == 1e-4
    assert check.observed == pytest.approx(7e-5, abs=1e-12)
    assert evidence["worst_task"] == "t2" and evidence["max_abs_difference"] == pytest.approx(7e-5, abs=1e-12)
    assert evidence["reused_prefix_tokens"] == 120 and evidence["cache"] == "on"

    check, _ = cache_check(pairs, 5e-5)  # the same evidence, a tighter tolerance
    assert check.status == "fail" and "t2" in check.reason and "> 5e-05" in check.reason


def test_identical_answers_pass_a_zero_tolerance_and_any_change_fails_it():
    check, evidence = cache_check([pair("t1", [0.25, 0.75], [0.25, 0.75])], 0.0)
    assert check.status == "pass" and check.observed == 0.0 and evidence["worst_task"] is None
    check, _ = cache_check([pair("t1", [0.25, 0.75], [0.25 + 2 ** -40, 0.75])], 0.0)
    assert check.status == "fail" and check.observed == 2 ** -40


def test_an_endpoint_without_a_prefix_cache_is_skipped_with_its_reason_never_passed():
    off = ColdWarm("t1", Answer([0.5, 0.5], "SEMIF_PREFIX_CACHE_BYTES or SEMIF_PREFIX_CACHE_ENTRIES is 0", 0), None)
    check, evidence = cache_check([off], 1e-4)
    assert check.status == "skipped" and check.observed is None and check.n == 0
    assert check.reason == ("skipped: the endpoint keeps no prefix cache (SEMIF_PREFIX_CACHE_BYTES or "
                            "SEMIF_PREFIX_CACHE_ENTRIES is 0)")
    assert evidence["cache"].startswith("off: SEMIF_PREFIX_CACHE_BYTES") and evidence["max_abs_difference"] is None


def test_warm_answers_that_restored_nothing_are_no_evidence():
    check, evidence = cache_check([pair("t1", [0.5, 0.5], [0.4, 0.6], reused=0)], 1e-4)
    assert check.status == "skipped" and "none of 1 warm answers restored a cached prefix" in check.reason
    assert evidence["compared"] == 0
    # only the pairs that restored a state are compared
    check, _ = cache_check([pair("t1", [0.5, 0.5], [0.4, 0.6], reused=0), pair("t2", [0.5, 0.5], [0.5, 0.5])], 1e-4)
    assert check.status == "pass" and check.n == 1


def test_a_pair_without_an_answer_fails_the_check():
    pairs = [pair("t1", [0.5, 0.5], [0.5, 0.5]), ColdWarm("t2", None, None, "warm: HTTP 500: boom")]
    check, _ = cache_check(pairs, 1e-4)
    assert check.status == "fail" and check.reason == "1 of 2 cold/warm pairs got no answer (t2 warm: HTTP 500: boom)"


def test_the_sample_spreads_over_every_task():
    assert sample_tasks(list(range(10)), 4) == [0, 2, 5, 7]
    assert sample_tasks(list(range(3)), 20) == [0, 1, 2]
    assert sample_tasks(list(range(111)), 20)[-1] == 105


TASK = load_jevbench(DECISIONS)[0]
EVEN = [1 / len(TASK.labels)] * len(TASK.labels)


def answer_body(report: dict | None, task_id: str = TASK.id) -> bytes:
    body = {"result": {"id": task_id, "option_ids": list(TASK.labels), "probabilities": EVEN,
                       "option_logits": [0.0] * len(EVEN), "allowed_token_mass": 0.5, "temperature": 1.0,
                       "timings": {}}}
    return json.dumps(body | ({"prefix_cache": report} if report is not None else {})).encode()


def test_an_answer_is_read_with_its_prefix_cache_report():
    warm = parse_answer(TASK, answer_body({"mode": "warm", "enabled": True, "off": None, "reused_prefix_tokens": 31,
                                           "shared_prefix_tokens": 31}))
    assert warm == Answer(EVEN, None, 31)
    off = parse_answer(TASK, answer_body({"mode": "cold", "enabled": False, "off": "SEMIF_PREFIX_CACHE_BYTES or "
                                          "SEMIF_PREFIX_CACHE_ENTRIES is 0", "reused_prefix_tokens": 0}))
    assert off.cache_off.startswith("SEMIF_PREFIX_CACHE_BYTES")
    with pytest.raises(Malformed, match="predates the cold-vs-warm check"):
        parse_answer(TASK, answer_body(None))
    with pytest.raises(Malformed, match="does not match the task id"):
        parse_answer(TASK, answer_body({"enabled": True}, task_id="other"))


GATE = {"kind": "decisions", "datasets": [{"path": "builtin:decisions"}],
        "thresholds": {"min_accuracy": 0.5, "max_ece": None}}


def test_the_config_defaults_and_is_dumped_only_when_it_is_not_the_default():
    default = DecisionGateConfig.model_validate(GATE)
    assert default.cache_check == CacheCheckRule(sample=20, tolerance=1e-4)
    assert "cache_check" not in default.model_dump(mode="json")  # a release id stays what it was before the check
    stated = DecisionGateConfig.model_validate({**GATE, "cache_check": {"sample": 8, "tolerance": 0}})
    assert stated.model_dump(mode="json")["cache_check"] == {"sample": 8, "tolerance": 0.0}
    assert "inconclusive" not in stated.model_dump(mode="json")  # GateConfig's own default stays unwritten
    assert DecisionGateConfig.model_validate(stated.model_dump(mode="json")) == stated


@pytest.mark.parametrize("bad", [{"sample": 0}, {"tolerance": -1e-4}, {"tolerance": 2.0}, {"samples": 3},
                                 {"tolerance": "1e-4"}])
def test_the_config_refuses_what_it_cannot_judge_with(bad):
    with pytest.raises(ValidationError):
        DecisionGateConfig.model_validate({**GATE, "cache_check": bad})
