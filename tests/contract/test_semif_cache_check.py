"""The gate's cold-vs-warm check (`validation.cache_check`) against the real SemIf adapter on the tiny GGUF: the wire's
`prefix_cache` mode, the check passing when warm answers equal cold ones, failing when a warm answer is perturbed
(a test seam on the client side: the adapter answers, the seam moves one probability of each warm answer), skipped
with its reason on an adapter that keeps no prefixes, and the GGUF family's gate judging it with its report."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from shiplift.tasks.families.gguf_decisions import DecisionGateConfig, GgufDecisions
from shiplift.validation.cache_check import CHECK_NAME, cache_check, sample_tasks, score_cold_warm
from shiplift.validation.datasets import load_decision_dataset
from shiplift.validation.evaluate import RunSettings, Target
from shiplift.validation.transport import HttpInvoker
from tests.contract.conftest import ServerProcess, start_semif

DECISIONS = Path(__file__).resolve().parents[2] / "validation" / "data" / "decisions.jsonl"
TASKS = load_decision_dataset(DECISIONS, name="decisions", splits=["test"]).tasks
SETTINGS = RunSettings(concurrency=1, timeout_s=30, deadline_s=300)
TOLERANCE = 1e-4


class Perturbing:
    """An invoker that moves the first option probability of every warm answer by `delta`, so that a warm answer
    differs from its cold one as a cache that changed the model's arithmetic would make it (the test seam)."""

    def __init__(self, inner: HttpInvoker, delta: float):
        self.inner, self.delta = inner, delta
        self.bodies: list[dict] = []

    def describe(self) -> dict:
        return self.inner.describe()

    def open(self):
        return PerturbingChannel(self, self.inner.open())


class PerturbingChannel:
    def __init__(self, owner: Perturbing, inner):
        self.owner, self.inner = owner, inner

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        status, data = self.inner.post(body, timeout_s)
        sent = json.loads(body)
        self.owner.bodies.append(sent)
        if status == 200 and sent.get("prefix_cache") == "warm":
            answer = json.loads(data)
            answer["result"]["probabilities"][0] += self.owner.delta
            data = json.dumps(answer).encode()
        return status, data

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_env) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """(cached, uncached): the adapter with its default prefix cache, and with it turned off."""
    folder = tmp_path_factory.mktemp("semif-cache-check")
    cached = start_semif(folder / "cached.log", tiny_env)
    uncached = start_semif(folder / "uncached.log", {**tiny_env, "SEMIF_PREFIX_CACHE_BYTES": "0"})
    yield cached, uncached
    cached.stop()
    uncached.stop()


def test_a_cold_request_restores_nothing_and_the_warm_one_after_it_restores_its_whole_prefix(servers):
    cached, _ = servers
    decision = TASKS[3].to_decision()
    cold = cached.client.invoke({"decision": decision, "prefix_cache": "cold"})
    again = cached.client.invoke({"decision": decision, "prefix_cache": "cold"})  # cached now, still not restored
    warm = cached.client.invoke({"decision": decision, "prefix_cache": "warm"})
    plain = cached.client.invoke({"decision": decision})
    assert {reply.status for reply in (cold, again, warm, plain)} == {200}
    assert cold.body["prefix_cache"] == {"mode": "cold", "enabled": True, "off": None, "reused_prefix_tokens": 0,
                                         "shared_prefix_tokens": cold.body["prefix_cache"]["shared_prefix_tokens"]}
    assert again.body["prefix_cache"]["reused_prefix_tokens"] == 0
    shared = warm.body["prefix_cache"]["shared_prefix_tokens"]
    assert shared > 0 and warm.body["prefix_cache"]["reused_prefix_tokens"] == shared
    assert "prefix_cache" not in plain.body  # a request that names no mode is answered exactly as before
    assert warm.body["result"]["probabilities"] == cold.body["result"]["probabilities"]


@pytest.mark.parametrize("mode", ["hot", True, None])
def test_an_unknown_mode_is_refused_naming_the_field(servers, mode):
    reply = servers[0].client.invoke({"decision": TASKS[0].to_decision(), "prefix_cache": mode})
    assert reply.status == 400 and reply.body["error"].startswith("prefix_cache: must be one of ['cold', 'warm']")


def test_the_check_passes_when_warm_equals_cold_and_fails_when_a_warm_answer_is_perturbed(servers):
    cached, _ = servers
    tasks = sample_tasks(TASKS, 8)
    measured, evidence = cache_check(score_cold_warm(HttpInvoker(cached.client.base), tasks, SETTINGS), TOLERANCE)
    print(f"\ntiny model, {evidence['compared']} tasks: max |warm - cold| = {evidence['max_abs_difference']!r}")
    assert measured.status == "pass" and measured.n == len(tasks) and measured.observed <= TOLERANCE
    assert evidence["reused_prefix_tokens"] > 0

    seam = Perturbing(HttpInvoker(cached.client.base), delta=3e-4)
    perturbed, evidence = cache_check(score_cold_warm(seam, tasks, SETTINGS), TOLERANCE)
    assert perturbed.status == "fail" and perturbed.observed == pytest.approx(3e-4 + measured.observed, abs=1e-6)
    assert evidence["worst_task"] in {task.id for task in tasks}
    assert [body["prefix_cache"] for body in seam.bodies] == ["cold", "warm"] * len(tasks)  # each cold, then warm


def test_an_adapter_without_a_prefix_cache_is_skipped_after_one_request(servers):
    _, uncached = servers
    seam = Perturbing(HttpInvoker(uncached.client.base), delta=0.5)  # would fail any comparison it got to make
    check, evidence = cache_check(score_cold_warm(seam, sample_tasks(TASKS, 8), SETTINGS), TOLERANCE)
    assert check.status == "skipped" and not check.passed
    assert check.reason == ("skipped: the endpoint keeps no prefix cache (SEMIF_PREFIX_CACHE_BYTES or "
                            "SEMIF_PREFIX_CACHE_ENTRIES is 0)")
    assert len(seam.bodies) == 1 and evidence["compared"] == 0


def gate(tmp_path: Path, invoker, name: str):
    """The GGUF family's gate on the shipped decision set's test split, its cache check on 6 tasks."""
    validation = DecisionGateConfig.model_validate({
        "kind": "decisions", "datasets": [{"path": "builtin:decisions", "splits": ["test"]}],
        "thresholds": {"min_accuracy": None, "max_ece": None, "min_validity": 1.0},
        "cache_check": {"sample": 6}})
    return GgufDecisions().evaluate(
        Target(invoker, "candidate"), None, [(DECISIONS, ["test"])], tmp_path / name, validation=validation,
        settings=SETTINGS, progress=None, title=name,
        context=lambda metrics: {"release_id": name, "champion_release": None})


def test_the_family_gate_judges_the_check_and_its_report_shows_the_difference(tmp_path, servers):
    cached, _ = servers
    outcome = gate(tmp_path, HttpInvoker(cached.client.base), "cold-warm")
    [check] = [c for c in outcome.checks if c["name"] == CHECK_NAME]
    assert check["status"] == "pass" and check["n"] == 6 and outcome.decision == "pass"
    report = json.loads(outcome.gate_report_json.read_text())
    assert report["extra"]["release"]["cache_check"]["max_abs_difference"] == check["observed"]
    assert "prefix cache, cold vs warm" in outcome.report_html.read_text()

    failing = gate(tmp_path, Perturbing(HttpInvoker(cached.client.base), delta=0.01), "perturbed")
    [check] = [c for c in failing.checks if c["name"] == CHECK_NAME]
    assert check["status"] == "fail" and failing.decision == "fail"  # the gate's other checks still pass
    assert [c["status"] for c in failing.checks if c["name"] != CHECK_NAME] == ["pass", "skipped"]
