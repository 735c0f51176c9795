"""The gate's cold-vs-warm check of a prefix cache (issue 50): reuse must not change answers.

A sample of the gate's tasks is scored twice on the candidate, one right after the other: cold (the SemIf adapter's
`"prefix_cache": "cold"`: the whole prefix evaluated, no cached state restored, the state kept as usual), then warm
(`"prefix_cache": "warm"`: the state the cold answer kept is restored). The check compares their option probabilities:
the largest absolute difference must be at most `validation.cache_check.tolerance`. An endpoint that keeps no prefixes
(its cache turned off) gives no evidence either way, and the check says skipped and why;
it never passes without a warm answer that restored a cached state.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shiplift.validation.gates import Check
from shiplift.validation.runner import SEMIF
from shiplift.validation.transport import Connection, Malformed, Options, json_body, post_with_retries, run_requests

CHECK_NAME = "prefix_cache_cold_warm"
MODES = ("cold", "warm")


@dataclass(frozen=True)
class Answer:
    """One SemIf answer to a request that asked for its prefix-cache report."""

    probabilities: list[float]
    cache_off: str | None  # why the endpoint keeps no prefixes; None when it keeps them
    reused_tokens: int  # prefix tokens this answer restored from the cache


@dataclass(frozen=True)
class ColdWarm:
    """A task scored cold and then warm; `error` when either got no usable answer (then neither is compared)."""

    id: str
    cold: Answer | None
    warm: Answer | None
    error: str | None = None


def sample_tasks(tasks: Sequence[Any], n: int) -> list[Any]:
    """`n` of the tasks (all of them when there are fewer), spread evenly from the first over the whole list."""
    if n >= len(tasks):
        return list(tasks)
    return [tasks[i * len(tasks) // n] for i in range(n)]


def cache_body(task: Any, mode: str) -> bytes:
    """The SemIf request for `task` that asks for its prefix-cache report, answered `mode` ("cold" or "warm")."""
    return json.dumps({"decision": task.to_decision(), "prefix_cache": mode}, ensure_ascii=False).encode("utf-8")


def parse_answer(task: Any, data: bytes) -> Answer:
    """A 200 body as an `Answer`; `Malformed` when it is not this task's answer or carries no prefix-cache report (an
    adapter that predates the check)."""
    probabilities = SEMIF.parse(task, data)["probabilities"]
    report = json_body(data).get("prefix_cache")
    if not isinstance(report, dict) or not isinstance(report.get("enabled"), bool):
        raise Malformed("the answer carries no prefix_cache report; the endpoint's SemIf adapter predates the "
                        "cold-vs-warm check")
    if probabilities is None:
        raise Malformed("the answer carries no probabilities")
    reused = report.get("reused_prefix_tokens")
    return Answer(probabilities=probabilities,
                  cache_off=None if report["enabled"] else str(report.get("off") or "not said"),
                  reused_tokens=reused if isinstance(reused, int) else 0)


def score_pair(task: Any, connection: Connection, opts: Options) -> ColdWarm:
    """One task cold, then at once warm on the same connection (the warm request restores what the cold one kept)."""
    answers = []
    for mode in MODES:
        answer, error = post_with_retries(connection, cache_body(task, mode), opts).parse(
            lambda data: parse_answer(task, data))
        if error is not None:
            return ColdWarm(task.id, None, None, f"{mode}: {error}")
        answers.append(answer)
        if answer.cache_off is not None:  # nothing to compare: a warm request would answer cold as well
            return ColdWarm(task.id, answer, None)
    return ColdWarm(task.id, *answers)


def score_cold_warm(invoker: Any, tasks: Sequence[Any], settings: Any) -> list[ColdWarm]:
    """The tasks scored cold and warm, one task at a time (`settings`: the gate's `validation.evaluate.RunSettings`);
    only the first task when the endpoint says it keeps no prefix cache."""
    run = {"concurrency": 1, "thread_name": "shiplift-cache-check", **settings.requests()}
    first = run_requests(invoker, tasks[:1], score_pair, **run)
    if not first or first[0].error or first[0].warm is None:
        return first
    return first + run_requests(invoker, tasks[1:], score_pair, **run)


def max_difference(pairs: Sequence[ColdWarm]) -> tuple[float, str | None]:
    """The largest |warm − cold| over every option probability of the pairs, and the task it came from (None when
    every warm answer equals its cold one)."""
    worst, where = 0.0, None
    for pair in pairs:
        difference = max(abs(w - c) for w, c in zip(pair.warm.probabilities, pair.cold.probabilities, strict=True))
        if difference > worst:
            worst, where = difference, pair.id
    return worst, where


def cache_check(pairs: Sequence[ColdWarm], tolerance: float) -> tuple[Check, dict[str, Any]]:
    """The check of the pairs against `tolerance` (absolute, on each option probability), and its evidence for the
    report: pass or fail on the pairs whose warm answer restored a cached state; fail when a request got no answer;
    skipped when the endpoint keeps no prefixes or no warm answer restored one."""
    common = {"name": CHECK_NAME, "threshold": tolerance, "comparator": "<=", "ci": None, "rule": "point"}
    failed = [pair for pair in pairs if pair.error]
    off = next((pair.cold.cache_off for pair in pairs if pair.cold and pair.cold.cache_off), None)
    reused = [pair for pair in pairs if not pair.error and pair.warm and pair.warm.reused_tokens > 0]
    evidence: dict[str, Any] = {"sample": len(pairs), "compared": len(reused), "tolerance": tolerance,
                                "cache": "on" if off is None else f"off: {off}",
                                "max_abs_difference": None, "worst_task": None,
                                "reused_prefix_tokens": sum(pair.warm.reused_tokens for pair in reused)}
    if failed:
        check = Check(**common, status="fail", observed=None, n=len(pairs),
                      reason=f"{len(failed)} of {len(pairs)} cold/warm pairs got no answer ({failed[0].id} "
                             f"{failed[0].error})")
    elif off is not None:
        check = Check(**common, status="skipped", observed=None, n=0,
                      reason=f"skipped: the endpoint keeps no prefix cache ({off})")
    elif not reused:
        check = Check(**common, status="skipped", observed=None, n=0,
                      reason=f"skipped: none of {len(pairs)} warm answers restored a cached prefix (a state over the "
                             "cache's byte bound is not kept), so reuse changed none of them")
    else:
        worst, where = max_difference(reused)
        evidence.update(max_abs_difference=worst, worst_task=where)
        ok = worst <= tolerance
        check = Check(**common, status="pass" if ok else "fail", observed=worst, n=len(reused),
                      reason=f"max |warm − cold| option probability {worst:.3g}{f' (task {where})' if where else ''} "
                             f"over {len(reused)} tasks answered warm from a cached prefix {'<=' if ok else '>'} "
                             f"{tolerance:g}")
    return check, evidence
