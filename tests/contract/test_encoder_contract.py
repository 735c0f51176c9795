"""Contract tests of the encoder NLI server (DESIGN §6.3) against real server processes.

Each server is `python images/encoder/server.py` on the project's tiny random ONNX encoder
(`tasks.artifacts.tiny_encoder`, seed 0) and its OpenVINO IR (fp32 and NNCF int8, converted from the same model.onnx),
configured only by ENCODER_* variables, on port 0 (the bound port is read from the server's log line). Every server
fixture runs once per engine (ENCODER_ENGINE onnxruntime and openvino): the contract is the same for both.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from shiplift.tasks.hashing import sha256_file
from tests.contract.conftest import invoke_until_overloaded

REPO = Path(__file__).resolve().parents[2]
LABELS = ["entailment", "neutral", "contradiction"]
MAX_LEN = 32  # small, so over-long pairs are cheap to build
MAX_BATCH = 4
MAX_BODY = 4096
PAD_LEN = 64
TEMPERATURE = 2.5
PAIRS = [
    {"premise": "A man is playing a guitar on the stage.", "hypothesis": "A person plays music."},
    {"premise": "The cat sleeps on the red sofa.", "hypothesis": "A dog is barking."},
    {"premise": "Two children run in the park.", "hypothesis": "Kids are outside."},
]
ENGINES = ("onnxruntime", "openvino")
ENGINE_FILES = {"onnxruntime": {"fp32": "model.onnx", "int8": "model.int8.onnx"},
                "openvino": {"fp32": "model.ov.xml", "int8": "model.ov.int8.xml"}}


# ---------------------------------------------------------------------------------------
# helpers (the client and server processes are tests/contract/conftest.py's)


def encoder_env(model_dir: Path, **overrides: str) -> dict[str, str]:
    """The parent environment without ENCODER_* plus one thread, the tiny test limits and `overrides`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ENCODER_")}
    env.update(
        ENCODER_MODEL_DIR=str(model_dir),
        ENCODER_THREADS="1",
        ENCODER_MAX_LEN=str(MAX_LEN),
        ENCODER_MAX_BATCH=str(MAX_BATCH),
        ENCODER_MAX_BODY_BYTES=str(MAX_BODY),
    )
    env.update(overrides)
    return env


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


def probs(result: dict) -> list[float]:
    return [result["probabilities"][label] for label in LABELS]


# ---------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random encoder directory (seed 0) with an int8 model next to the fp32 one, and both as OpenVINO IR."""
    from shiplift.tasks.artifacts.onnx_export import builtin_calibration
    from shiplift.tasks.artifacts.openvino_build import convert_and_check
    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_onnx_model_dir

    path = tmp_path_factory.mktemp("encoder-model") / "model"
    write_tiny_onnx_model_dir(path, seed=0)
    convert_and_check(path, int8=True, calibration=builtin_calibration(), keep_fp32=("pooler", "classifier"),
                      threads=1)  # in a child, as the build converts: OpenVINO in this process would flush denormals
    assert all((path / name).is_file() for files in ENGINE_FILES.values() for name in files.values())
    return path


@pytest.fixture(scope="module", params=ENGINES)
def engine(request) -> str:
    """The engine every server fixture of this module runs (the module's tests run once per engine)."""
    return request.param


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return tok


@pytest.fixture(scope="module")
def serve(tmp_path_factory, start_encoder_server) -> Callable[..., Iterator[Any]]:
    """Start a module's encoder server under tmp/<name> and stop it when the fixture using it ends."""

    def serve_encoder(name: str, env: dict[str, str], probe: Any = None) -> Iterator[Any]:
        server = start_encoder_server(tmp_path_factory.mktemp(name) / "server.log", env, probe=probe)
        yield server
        server.stop()

    return serve_encoder


@pytest.fixture(scope="module")
def encoder(serve, model_dir, engine) -> Iterator[Any]:
    """fp32, refuse policy; one request was sent to it while its model loaded."""
    yield from serve("encoder", encoder_env(model_dir, ENCODER_ENGINE=engine), probe={"pairs": PAIRS[:1]})


@pytest.fixture(scope="module")
def encoder_limits(serve, model_dir, engine) -> Iterator[Any]:
    """premise_first truncation and one request in flight."""
    env = encoder_env(model_dir, ENCODER_TRUNCATION="premise_first", ENCODER_MAX_IN_FLIGHT="1", ENCODER_ENGINE=engine)
    yield from serve("encoder-limits", env)


@pytest.fixture(scope="module")
def encoder_int8(serve, model_dir, engine) -> Iterator[Any]:
    yield from serve("encoder-int8", encoder_env(model_dir, ENCODER_VARIANT="int8", ENCODER_ENGINE=engine))


@pytest.fixture(scope="module")
def encoder_padded(serve, model_dir, engine) -> Iterator[Any]:
    env = encoder_env(model_dir, ENCODER_MAX_LEN=str(PAD_LEN), ENCODER_PAD_TO_MAX="true", ENCODER_ENGINE=engine)
    yield from serve("encoder-padded", env)


@pytest.fixture(scope="module")
def encoder_calibrated(serve, tmp_path_factory, model_dir, engine) -> Iterator[Any]:
    calibrated = tmp_path_factory.mktemp("encoder-calibrated-model") / "model"
    shutil.copytree(model_dir, calibrated)
    (calibrated / "calibration.json").write_text(json.dumps({"temperature": TEMPERATURE, "method": "nll"}))
    yield from serve("encoder-calibrated", encoder_env(calibrated, ENCODER_ENGINE=engine))


def single_token_words(tokenizer, count: int) -> list[str]:
    """`count` distinct lowercase words that the tokenizer keeps as exactly one token each."""
    vocab = tokenizer.get_vocab()
    words = [
        w
        for w in sorted(vocab)
        if w.isalpha() and w.islower() and tokenizer.encode(w, add_special_tokens=False).ids == [vocab[w]]
    ]
    assert len(words) >= count, "the tiny tokenizer has too few whole-word tokens for this test"
    return words[:count]


# ---------------------------------------------------------------------------------------
# readiness and routing


def test_ping_is_503_loading_then_200_and_early_requests_are_retryable(encoder):
    assert encoder.ping_history[0] == (503, {"status": "loading"})
    assert all(reply == (503, {"status": "loading"}) for reply in encoder.ping_history[:-1])
    assert encoder.ping_history[-1] == (200, {"status": "ok"})
    assert_error(encoder.early_reply, 503, "loading")
    assert encoder.early_reply.body["retryable"] is True


def test_unknown_paths_and_methods_get_json_errors(encoder):
    assert_error(encoder.client.request("GET", "/nope", content_type=None), 404, "/nope")
    assert_error(encoder.client.request("POST", "/nope", b"{}"), 404, "/nope")
    assert_error(encoder.client.request("GET", "/invocations", content_type=None), 405)


# ---------------------------------------------------------------------------------------
# valid batches


def test_batch_results_follow_the_contract(encoder, model_dir, engine):
    reply = encoder.client.invoke({"pairs": PAIRS})
    assert reply.status == 200, reply.body
    assert reply.headers["Content-Type"] == "application/json"
    assert set(reply.body) == {"results", "timing", "model"}
    results = reply.body["results"]
    assert len(results) == len(PAIRS)
    for result in results:
        assert set(result) == {"label", "probabilities", "logits", "input_tokens", "truncated", "truncation"}
        assert list(result["probabilities"]) == LABELS
        assert abs(sum(probs(result)) - 1.0) < 1e-9
        assert result["label"] == LABELS[max(range(3), key=lambda i: probs(result)[i])]
        assert_close(probs(result), softmax(result["logits"]), 1e-9)
        assert result["truncated"] is False and result["truncation"] is None
        assert 0 < result["input_tokens"] <= MAX_LEN
    timing = reply.body["timing"]
    assert {"tokenize_ms", "forward_ms", "total_ms", "batch_size", "padded_len"} <= set(timing)
    assert timing["batch_size"] == 3
    assert timing["padded_len"] == max(r["input_tokens"] for r in results)  # padded to the longest pair
    assert timing["forward_ms"] > 0 and timing["total_ms"] >= timing["forward_ms"]
    export = json.loads((model_dir / "export.json").read_text())
    served = ENGINE_FILES[engine]["fp32"]
    assert reply.body["model"] == {
        "file": served,
        "sha256": sha256_file(model_dir / served),
        "variant": "fp32",
        "device": "cpu",
        "temperature": 1.0,
        "graph": {"engine": "onnxruntime", "precision": "fp32", "optimizer": export["optimizer"]}
        if engine == "onnxruntime" else {"engine": "openvino", "precision": "fp32", "converted_from": "model.onnx"},
    }


def test_both_engines_give_the_same_fp32_logits(serve, model_dir):
    """OpenVINO's IR is converted from the same model.onnx: its fp32 logits are ONNX Runtime's, within 1e-4."""
    servers = [serve(f"encoder-{name}", encoder_env(model_dir, ENCODER_ENGINE=name)) for name in ENGINES]
    try:
        ort, ov = (next(server).client.invoke({"pairs": PAIRS}).body for server in servers)
        assert (ort["model"]["graph"]["engine"], ov["model"]["graph"]["engine"]) == ENGINES
        assert len({tuple(r["logits"]) for r in ov["results"]}) == len(PAIRS)
        for a, b in zip(ort["results"], ov["results"], strict=True):
            assert_close(a["logits"], b["logits"], 1e-4)
            assert a["label"] == b["label"]
    finally:
        for server in servers:
            next(server, None)


def test_batch_keeps_request_order_and_matches_single_pairs(encoder):
    forward = encoder.client.invoke({"pairs": PAIRS}).body["results"]
    backward = encoder.client.invoke({"pairs": PAIRS[::-1]}).body["results"]
    singles = [encoder.client.invoke({"pairs": [pair]}).body["results"][0] for pair in PAIRS]
    assert len({tuple(r["logits"]) for r in singles}) == len(PAIRS)  # the pairs are distinguishable
    for batched, reversed_, single in zip(forward, backward[::-1], singles, strict=True):
        assert batched["input_tokens"] == single["input_tokens"] == reversed_["input_tokens"]
        assert_close(batched["logits"], single["logits"], 1e-4)  # padding inside a batch changes nothing
        assert_close(reversed_["logits"], single["logits"], 1e-4)


def test_int8_variant_answers_with_its_own_model(encoder_int8, model_dir, engine):
    reply = encoder_int8.client.invoke({"pairs": PAIRS})
    assert reply.status == 200, reply.body
    served = ENGINE_FILES[engine]["int8"]
    assert reply.body["model"]["file"] == served
    assert reply.body["model"]["variant"] == "int8"
    assert reply.body["model"]["sha256"] == sha256_file(model_dir / served)
    # which graph answered: the exporter's default int8, static QDQ calibrated on the project's calibration split, or
    # NNCF's post-training int8 of the same model.onnx on the same split
    assert reply.body["model"]["graph"] == ({
        "engine": "onnxruntime", "precision": "int8", "optimizer": "onnxruntime.transformers.optimizer(bert)",
        "method": "static_qdq", "format": "QDQ", "per_channel": True, "reduce_range": False,
        "activation_ranges": "static", "weight_type": "QInt8", "activation_type": "QUInt8",
        "calibration": "builtin:nli[calibration]",
    } if engine == "onnxruntime" else {
        "engine": "openvino", "precision": "int8", "converted_from": "model.onnx", "method": "nncf_ptq",
        "preset": "mixed", "calibration": "builtin:nli[calibration]",
    })
    for result in reply.body["results"]:
        assert abs(sum(probs(result)) - 1.0) < 1e-9
        assert_close(probs(result), softmax(result["logits"]), 1e-9)


def test_static_int8_scores_a_pair_the_same_whatever_its_batch(encoder_int8):
    """Static activation ranges: a pair's logits do not depend on its batch neighbours (dynamic int8's did)."""
    batched = encoder_int8.client.invoke({"pairs": PAIRS}).body["results"]
    singles = [encoder_int8.client.invoke({"pairs": [pair]}).body["results"][0] for pair in PAIRS]
    for together, alone in zip(batched, singles, strict=True):
        assert_close(together["logits"], alone["logits"], 1e-4)


def test_pad_to_max_gives_the_same_probabilities(encoder, encoder_padded):
    plain = encoder.client.invoke({"pairs": PAIRS}).body
    padded = encoder_padded.client.invoke({"pairs": PAIRS}).body
    assert padded["timing"]["padded_len"] == PAD_LEN
    assert plain["timing"]["padded_len"] < PAD_LEN
    for a, b in zip(plain["results"], padded["results"], strict=True):
        assert_close(probs(a), probs(b), 1e-4)
        assert a["label"] == b["label"] and a["input_tokens"] == b["input_tokens"]


def test_temperature_changes_probabilities_not_the_label(encoder, encoder_calibrated):
    plain = encoder.client.invoke({"pairs": PAIRS}).body["results"]
    reply = encoder_calibrated.client.invoke({"pairs": PAIRS}).body
    assert reply["model"]["temperature"] == TEMPERATURE
    for a, b in zip(plain, reply["results"], strict=True):
        assert_close(a["logits"], b["logits"], 1e-6)  # raw logits are reported unscaled
        assert_close(probs(b), softmax(b["logits"], TEMPERATURE), 1e-9)
        assert max(abs(x - y) for x, y in zip(probs(a), probs(b), strict=True)) > 1e-6
        assert a["label"] == b["label"]


# ---------------------------------------------------------------------------------------
# bad requests


def test_batch_size_limits(encoder):
    assert encoder.client.invoke({"pairs": [PAIRS[0]] * MAX_BATCH}).status == 200
    assert_error(
        encoder.client.invoke({"pairs": [PAIRS[0]] * (MAX_BATCH + 1)}),
        413,
        "5 pairs",
        f"limit of {MAX_BATCH}",
        "ENCODER_MAX_BATCH",
    )
    assert_error(encoder.client.invoke({"pairs": []}), 400, "pairs", "empty", f"1 to {MAX_BATCH}")


BAD_PAIRS = {
    "missing hypothesis": ([PAIRS[0], {"premise": "p"}], "pairs[1]", "hypothesis"),
    "empty premise": ([{"premise": "", "hypothesis": "h"}], "pairs[0].premise", "non-empty"),
    "whitespace hypothesis": (
        [PAIRS[0], PAIRS[1], {"premise": "p", "hypothesis": " \n\t"}],
        "pairs[2].hypothesis",
        "non-empty",
    ),
    "extra field": ([{"premise": "p", "hypothesis": "h", "label": "neutral"}], "pairs[0]", "'label'"),
    "number premise": ([{"premise": 3, "hypothesis": "h"}], "pairs[0].premise", "string"),
    "pair not an object": (["p"], "pairs[0]", "object"),
    "special token in text": ([{"premise": "p [SEP] q", "hypothesis": "h"}], "pairs[0].premise", "'[SEP]'"),
    "text without tokens": (
        [PAIRS[0], {"premise": "p", "hypothesis": "\u200b\x00"}],
        "pairs[1].hypothesis",
        "no tokens",
    ),
}


@pytest.mark.parametrize("pairs, field_name, rule", BAD_PAIRS.values(), ids=list(BAD_PAIRS))
def test_bad_pairs_are_refused_naming_index_and_field(encoder, pairs, field_name, rule):
    assert_error(encoder.client.invoke({"pairs": pairs}), 400, field_name, rule)


BAD_BODIES = {
    "extra top-level key": ({"pairs": PAIRS[:1], "top_k": 1}, "'top_k'"),
    "no pairs": ({"inputs": "x"}, "'inputs'"),
    "pairs missing": ({}, "pairs"),
    "pairs not a list": ({"pairs": PAIRS[0]}, "array"),
    "body not an object": ([PAIRS[0]], "JSON object"),
}


@pytest.mark.parametrize("payload, needle", BAD_BODIES.values(), ids=list(BAD_BODIES))
def test_bad_bodies_are_refused(encoder, payload, needle):
    assert_error(encoder.client.invoke(payload), 400, needle)


def test_bad_encoding_json_and_headers(encoder):
    client = encoder.client
    assert_error(client.request("POST", "/invocations", b'{"pairs": [', "application/json"), 400, "valid JSON")
    assert_error(client.request("POST", "/invocations", b'{"pairs": [], "pairs": []}'), 400, "duplicate key")
    assert_error(
        client.request("POST", "/invocations", json.dumps({"pairs": PAIRS}).encode(), "text/plain"),
        415,
        "application/json",
    )
    assert_error(
        client.request("POST", "/invocations", b'{"pairs": []}', "application/json; charset=latin-1"), 415, "utf-8"
    )
    head = ["POST /invocations HTTP/1.1", "Host: x", "Content-Type: application/json"]
    assert_error(client.raw(head), 400, "Content-Length")


def test_oversized_body_is_413_before_it_is_read(encoder):
    big = {"pairs": [{"premise": "word " * 1000, "hypothesis": "h"}]}
    assert_error(encoder.client.invoke(big), 413, str(MAX_BODY), "ENCODER_MAX_BODY_BYTES")


def test_over_long_pair_is_refused_with_its_token_count(encoder, tokenizer):
    long_pair = {"premise": " ".join(single_token_words(tokenizer, 40)), "hypothesis": "h"}
    n_tokens = len(tokenizer.encode(long_pair["premise"], long_pair["hypothesis"]).ids)
    reply = encoder.client.invoke({"pairs": [PAIRS[0], long_pair]})
    assert_error(
        reply, 400, "pairs[1]", f"is {n_tokens} tokens", f"limit of {MAX_LEN}", "ENCODER_TRUNCATION=premise_first"
    )


# ---------------------------------------------------------------------------------------
# premise_first truncation


def test_premise_first_cuts_the_premise_end_and_reports_it(encoder_limits, tokenizer):
    words = single_token_words(tokenizer, 40)
    hypothesis = " ".join(words[-3:])
    long_pair = {"premise": " ".join(words), "hypothesis": hypothesis}
    original = len(tokenizer.encode(long_pair["premise"], hypothesis).ids)
    specials = tokenizer.num_special_tokens_to_add(is_pair=True)
    keep = MAX_LEN - specials - len(tokenizer.encode(hypothesis, add_special_tokens=False).ids)
    cut_pair = {"premise": " ".join(words[:keep]), "hypothesis": hypothesis}

    reply = encoder_limits.client.invoke({"pairs": [PAIRS[0], long_pair, cut_pair]})
    assert reply.status == 200, reply.body
    short, truncated, by_hand = reply.body["results"]
    assert short["truncated"] is False and short["truncation"] is None
    assert truncated["truncated"] is True
    assert truncated["truncation"] == {"policy": "premise_first", "original_tokens": original, "kept_tokens": MAX_LEN}
    assert truncated["input_tokens"] == MAX_LEN == by_hand["input_tokens"]
    assert by_hand["truncated"] is False
    assert_close(truncated["logits"], by_hand["logits"], 1e-5)  # the premise's start was kept, the hypothesis whole


def test_premise_first_refuses_a_hypothesis_that_does_not_fit(encoder_limits, tokenizer):
    words = single_token_words(tokenizer, 40)
    reply = encoder_limits.client.invoke({"pairs": [{"premise": "p", "hypothesis": " ".join(words)}]})
    assert_error(reply, 400, "pairs[0].hypothesis", "is 40 tokens", f"within {MAX_LEN}")


# ---------------------------------------------------------------------------------------
# admission control and process lifecycle


def test_a_stalled_body_holds_no_slot_and_overload_is_503_retryable(encoder_limits):
    client = encoder_limits.client
    head = ["POST /invocations HTTP/1.1", "Host: x", "Content-Type: application/json", "Content-Length: 100"]
    holder = client.open_raw(head)  # stalls mid-body: it is read under the request deadline, outside admission
    try:
        assert client.invoke({"pairs": PAIRS[:1]}).status == 200
    finally:
        holder.close()
    refused, seen = invoke_until_overloaded(client, {"pairs": PAIRS})  # one slot (MAX_IN_FLIGHT=1), eight at once
    assert set(seen) == {200, 503}, seen
    assert refused.body["retryable"] is True and "ENCODER_MAX_IN_FLIGHT" in refused.body["error"]
    assert client.invoke({"pairs": PAIRS[:1]}).status == 200, "the slot was not released"
    assert "Traceback" not in encoder_limits.log()


def test_sagemaker_serve_argument_and_sigterm_stop_cleanly(start_encoder_server, model_dir, tmp_path):
    server = start_encoder_server(tmp_path / "server.log", encoder_env(model_dir), args=("serve",))
    try:
        assert server.client.invoke({"pairs": PAIRS[:1]}).status == 200
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log()
    assert "Traceback" not in server.log()


BAD_ENV = {
    "variant": ({"ENCODER_VARIANT": "fp16"}, "ENCODER_VARIANT"),
    "device": ({"ENCODER_DEVICE": "tpu"}, "ENCODER_DEVICE"),
    "max len over positions": ({"ENCODER_MAX_LEN": "100000"}, "ENCODER_MAX_LEN=100000 exceeds the model's"),
    "max len not a number": ({"ENCODER_MAX_LEN": "long"}, "ENCODER_MAX_LEN"),
    "max batch zero": ({"ENCODER_MAX_BATCH": "0"}, "ENCODER_MAX_BATCH"),
    "truncation": ({"ENCODER_TRUNCATION": "longest_first"}, "ENCODER_TRUNCATION"),
    "pad to max": ({"ENCODER_PAD_TO_MAX": "yes"}, "ENCODER_PAD_TO_MAX"),
    "threads": ({"ENCODER_THREADS": "0"}, "ENCODER_THREADS"),
    "in flight": ({"ENCODER_MAX_IN_FLIGHT": "-1"}, "ENCODER_MAX_IN_FLIGHT"),
    "body bytes": ({"ENCODER_MAX_BODY_BYTES": ""}, "ENCODER_MAX_BODY_BYTES"),
    "model dir": ({"ENCODER_MODEL_DIR": "/nonexistent/model"}, "ENCODER_MODEL_DIR"),
}


@pytest.mark.parametrize("overrides, needle", BAD_ENV.values(), ids=list(BAD_ENV))
def test_bad_environment_stops_startup_with_exit_2(run_encoder_refusal, model_dir, overrides, needle):
    done = run_encoder_refusal(encoder_env(model_dir, **overrides))
    assert done.returncode == 2, done.stderr
    assert "refusing to start" in done.stderr and needle in done.stderr, done.stderr


def _model_copy(model_dir: Path, target: Path) -> Path:
    shutil.copytree(model_dir, target)
    return target


def test_cuda_device_without_the_gpu_runtime_refuses_to_start_instead_of_using_the_cpu(run_encoder_refusal, model_dir):
    import onnxruntime

    assert "CUDAExecutionProvider" not in onnxruntime.get_available_providers(), "the project pins the CPU onnxruntime"
    done = run_encoder_refusal(encoder_env(model_dir, ENCODER_DEVICE="cuda"))
    assert done.returncode == 2, done.stderr
    assert "ENCODER_DEVICE=cuda needs CUDAExecutionProvider" in done.stderr
    assert "onnxruntime-gpu" in done.stderr, done.stderr


def test_int8_without_its_file_refuses_to_start(run_encoder_refusal, model_dir, tmp_path):
    copy = _model_copy(model_dir, tmp_path / "model")
    (copy / "model.int8.onnx").unlink()
    done = run_encoder_refusal(encoder_env(copy, ENCODER_VARIANT="int8"))
    assert done.returncode == 2, done.stderr
    assert "model.int8.onnx" in done.stderr and "ENCODER_VARIANT=fp32" in done.stderr


def test_openvino_without_its_ir_or_on_cuda_refuses_to_start(run_encoder_refusal, model_dir, tmp_path):
    copy = _model_copy(model_dir, tmp_path / "model")
    (copy / "model.ov.xml").unlink()
    done = run_encoder_refusal(encoder_env(copy, ENCODER_ENGINE="openvino"))
    assert done.returncode == 2, done.stderr
    assert "model.ov.xml" in done.stderr and "image.engine: openvino" in done.stderr, done.stderr
    done = run_encoder_refusal(encoder_env(model_dir, ENCODER_ENGINE="openvino", ENCODER_DEVICE="cuda"))
    assert done.returncode == 2 and "ENCODER_ENGINE=openvino runs on the CPU" in done.stderr, done.stderr
    done = run_encoder_refusal(encoder_env(model_dir, ENCODER_ENGINE="tensorrt"))
    assert done.returncode == 2 and "ENCODER_ENGINE" in done.stderr, done.stderr


def test_unloadable_openvino_ir_exits_3(run_encoder_refusal, model_dir, tmp_path):
    copy = _model_copy(model_dir, tmp_path / "model")
    (copy / "model.ov.xml").write_text("<net>not an IR</net>")
    done = run_encoder_refusal(encoder_env(copy, ENCODER_ENGINE="openvino"))
    assert done.returncode == 3, done.stderr
    assert "refusing to start: model load failed" in done.stderr


BAD_MODEL_FILES = {
    "calibration zero": ("calibration.json", '{"temperature": 0}', "finite number > 0"),
    "calibration NaN": ("calibration.json", '{"temperature": NaN}', "calibration JSON"),
    "label order": ("config.json", None, "id2label"),
}


@pytest.mark.parametrize("name, text, needle", BAD_MODEL_FILES.values(), ids=list(BAD_MODEL_FILES))
def test_bad_model_directory_files_refuse_to_start(run_encoder_refusal, model_dir, tmp_path, name, text, needle):
    copy = _model_copy(model_dir, tmp_path / "model")
    if text is None:  # swap two labels in config.json
        config = json.loads((copy / name).read_text())
        config["id2label"] = {"0": "neutral", "1": "entailment", "2": "contradiction"}
        text = json.dumps(config)
    (copy / name).write_text(text)
    done = run_encoder_refusal(encoder_env(copy))
    assert done.returncode == 2, done.stderr
    assert name in done.stderr and needle in done.stderr, done.stderr


def test_unloadable_model_exits_3_and_unexpected_arguments_exit_2(run_encoder_refusal, model_dir, tmp_path):
    copy = _model_copy(model_dir, tmp_path / "model")
    (copy / "model.onnx").write_bytes(b"not an onnx model")
    done = run_encoder_refusal(encoder_env(copy))
    assert done.returncode == 3, done.stderr
    assert "refusing to start: model load failed" in done.stderr
    done = run_encoder_refusal(encoder_env(model_dir), args=("train",))
    assert done.returncode == 2 and "unexpected arguments" in done.stderr


# ---------------------------------------------------------------------------------------
# image and build definition (no Docker engine here: static checks and a stubbed build)

IMAGE_DIR = REPO / "images" / "encoder"
COMMON_HTTP = REPO / "images" / "common" / "sagemaker_http.py"
PYTHON_BASE = "python@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7"
ECR_REPO = "123456789012.dkr.ecr.us-east-1.amazonaws.com/encoder"
FAKE_DIGEST = "sha256:" + "ab" * 32


def test_server_imports_only_the_stdlib_numpy_the_engines_tokenizers_and_the_stdlib_shared_module(
    imports_outside_stdlib,
):
    assert imports_outside_stdlib(IMAGE_DIR / "server.py") == {"numpy", "onnxruntime", "openvino", "tokenizers",
                                                                 "sagemaker_http"}
    assert imports_outside_stdlib(COMMON_HTTP) == set()


def test_the_image_layout_serves_with_the_shared_module_beside_the_server(
    start_encoder_server, container_layout, model_dir, tmp_path
):
    server_path = container_layout("encoder")
    assert not (server_path.parent.parent / "common").exists()
    server = start_encoder_server(tmp_path / "server.log", encoder_env(model_dir), args=("serve",), server=server_path)
    try:
        reply = server.client.invoke({"pairs": PAIRS[:1]})
        assert reply.status == 200, reply.body
        assert [r["label"] in LABELS for r in reply.body["results"]] == [True]
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log()


def test_dockerfile_pins_the_base_by_digest_and_runs_the_server_as_non_root():
    from shiplift.tasks.backends.image_source import dockerfile_base_images

    dockerfile = IMAGE_DIR / "Dockerfile"
    text = dockerfile.read_text()
    assert dockerfile_base_images(dockerfile) == [PYTHON_BASE]
    for pin in ("ONNXRUNTIME_VERSION=1.32.0", "TOKENIZERS_VERSION=0.23.3", "NUMPY_VERSION=2.4.6"):
        assert f"ARG {pin}\n" in text
    # the CPU image's OpenVINO is the one the build converted and tested the IR with (the [openvino] extra here)
    assert f"ARG OPENVINO_VERSION={metadata.version('openvino')}\n" in text
    assert f"ARG OPENVINO_TELEMETRY_VERSION={metadata.version('openvino-telemetry')}\n" in text
    assert "transformers==" not in text and "torch==" not in text
    users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0")
    assert "EXPOSE 8080\n" in text and "ENCODER_HOST=0.0.0.0" in text
    assert 'ENTRYPOINT ["/opt/encoder/venv/bin/python", "/opt/encoder/server.py"]' in text
    assert "COPY encoder/server.py common/sagemaker_http.py /opt/encoder/\n" in text
    assert "py_compile /opt/encoder/server.py /opt/encoder/sagemaker_http.py" in text


@pytest.mark.parametrize(
    "layout, dockerfile, context",
    [("repository root", "images/encoder/Dockerfile", "images"), ("images folder", "./encoder/Dockerfile", ".")],
)
def test_buildspec_builds_from_the_pinned_base_and_writes_the_pushed_digest(
    tmp_path, run_buildspec, layout, dockerfile, context
):
    done = run_buildspec(tmp_path, "encoder", ECR_REPO, FAKE_DIGEST, layout)
    assert done.returncode == 0, done.stderr
    detail = json.loads((tmp_path / "src" / "image-detail.json").read_text())
    assert detail == {"ImageURI": f"{ECR_REPO}@{FAKE_DIGEST}"}
    docker_log = (tmp_path / "docker.log").read_text()
    assert f"--build-arg BASE_IMAGE={PYTHON_BASE}" in docker_log
    assert "--build-arg ORT_PACKAGE=onnxruntime " in docker_log
    assert f" -f {dockerfile} {context}\n" in docker_log  # the context holds common/ as well
    assert f"docker push {ECR_REPO}:c97b315c4728" in docker_log


@pytest.mark.parametrize(
    "layout, missing",
    [("repository root without common", "common/sagemaker_http.py"), ("image folder only", "encoder/Dockerfile")],
)
def test_buildspec_refuses_a_source_without_the_shared_module(tmp_path, run_buildspec, layout, missing):
    done = run_buildspec(tmp_path, "encoder", ECR_REPO, FAKE_DIGEST, layout)
    assert done.returncode != 0
    assert f"no {missing} under images/" in done.stderr and "repository root" in done.stderr, done.stderr
    assert not (tmp_path / "docker.log").exists()


def test_buildspec_builds_the_gpu_variant_from_a_cuda_base(tmp_path, run_buildspec):
    cuda_base = "nvidia/cuda@sha256:" + "cd" * 32
    done = run_buildspec(tmp_path, "encoder", ECR_REPO, FAKE_DIGEST, BASE_IMAGE=cuda_base,
                         ORT_PACKAGE="onnxruntime-gpu")
    assert done.returncode == 0, done.stderr
    docker_log = (tmp_path / "docker.log").read_text()
    assert f"--build-arg BASE_IMAGE={cuda_base}" in docker_log
    assert "--build-arg ORT_PACKAGE=onnxruntime-gpu " in docker_log


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"BASE_IMAGE": "python:3.11-slim"}, "not pinned by digest"),
        ({"IMAGE_TAG": "latest"}, "IMAGE_TAG=latest"),
        ({"CODEBUILD_BUILD_SUCCEEDING": "0"}, "nothing pushed"),
        ({"ORT_PACKAGE": "onnxruntime-directml"}, "ORT_PACKAGE=onnxruntime-directml"),
    ],
    ids=["tag base", "latest tag", "failed build", "unknown runtime package"],
)
def test_buildspec_refuses_unpinned_or_mutable_builds(tmp_path, run_buildspec, env, needle):
    done = run_buildspec(tmp_path, "encoder", ECR_REPO, FAKE_DIGEST, **env)
    assert done.returncode != 0
    assert needle in done.stderr, done.stderr
    assert not (tmp_path / "src" / "image-detail.json").exists()
