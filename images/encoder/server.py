#!/usr/bin/env python3
"""Encoder NLI server: scores (premise, hypothesis) pairs with an ONNX sequence classifier (DESIGN §6.3).

This file is the container's entrypoint and, unchanged, the local backend's model server.
It speaks the SageMaker container contract (``GET /ping``, ``POST /invocations``), is
configured only by ``ENCODER_*`` environment variables, and depends on the standard library,
numpy, onnxruntime and tokenizers only (it must not import ``tasks``, ``validation``,
transformers or torch).

Model directory (the shared encoder contract): ``model.onnx`` (fp32) and optionally
``model.int8.onnx``, ``tokenizer.json`` (+ tokenizer_config.json, special_tokens_map.json),
``config.json`` with ``id2label`` {0: entailment, 1: neutral, 2: contradiction} and
``max_position_embeddings``, optional ``calibration.json`` {"temperature": T}.

A batch is tokenized as pairs, padded to its longest pair (or to ``ENCODER_MAX_LEN`` with
``ENCODER_PAD_TO_MAX``) and scored in one ONNX Runtime run; ``probabilities =
softmax(logits / T)``. A pair longer than ``ENCODER_MAX_LEN`` is refused, or with
``ENCODER_TRUNCATION=premise_first`` its premise is cut and the result says so.

Exit codes: 0 clean stop, 2 bad configuration (environment, model directory, config.json,
calibration.json), 3 the model or tokenizer could not be loaded or do not fit the contract.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

LABELS = ("entailment", "neutral", "contradiction")
PAIR_KEYS = ("premise", "hypothesis")
VARIANT_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
DEVICE_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
TRUNCATION_POLICIES = ("refuse", "premise_first")
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
EXIT_CONFIG, EXIT_MODEL = 2, 3
MIN_MAX_LEN = 8  # room for the special tokens and at least a token of each text
SOCKET_TIMEOUT_S = 30.0  # a client that stalls while sending its body loses its slot
LINGER_S, LINGER_BYTES = 1.0, 16 << 20  # drain an unread body briefly so the client sees our answer
# position-embedding tables of these families keep pad_token_id + 1 rows for padding offsets
OFFSET_POSITION_MODELS = ("roberta", "xlm-roberta", "camembert")


# --------------------------------------------------------------------------------------
# Configuration


class StartupError(Exception):
    """The server must not start; the message says what is wrong and how to fix it."""

    def __init__(self, message: str, exit_code: int = EXIT_CONFIG):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Settings:
    """Validated ENCODER_* environment plus what start-up read from the model directory."""

    model_dir: Path
    model_path: Path
    variant: str
    device: str
    max_len: int
    max_batch: int
    truncation: str
    pad_to_max: bool
    pad_token_id: int | None  # from config.json; None: the tokenizer's pad token
    temperature: float
    threads: int
    max_body_bytes: int
    max_in_flight: int
    queue_timeout_s: float
    host: str
    port: int


def _env_int(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    """Read an integer variable strictly (digits only) and check its range."""
    raw = env.get(name)
    if raw is None:
        return default
    text = raw.strip()
    if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
        raise StartupError(f"{name}={raw!r} is not an integer; set it to an integer in [{low}, {high}]")
    value = int(text)
    if not low <= value <= high:
        raise StartupError(f"{name}={value} is out of range; set it to an integer in [{low}, {high}]")
    return value


def _env_float(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    """Read a finite float variable and check its range."""
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise StartupError(f"{name}={raw!r} is not a number; set it to a number in [{low}, {high}]") from None
    if not (math.isfinite(value) and low <= value <= high):
        raise StartupError(f"{name}={raw!r} is out of range; set it to a number in [{low}, {high}]")
    return value


def _env_choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    """Read a variable that must be one of `choices` (exact spelling)."""
    value = env.get(name, default)
    if value not in choices:
        raise StartupError(f"{name}={value!r} is not one of {', '.join(choices)}; set it to one of them")
    return value


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    """Read a true/false variable (false when unset)."""
    raw = env.get(name, "false")
    if raw.strip().lower() in ("true", "1"):
        return True
    if raw.strip().lower() in ("false", "0"):
        return False
    raise StartupError(f"{name}={raw!r} is not a boolean; set it to true or false")


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def _read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON object from a model-directory file, or a StartupError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StartupError(f"{path}: cannot read JSON ({exc}); {fix}") from None
    if not isinstance(data, dict):
        raise StartupError(f"{path}: must be a JSON object; {fix}")
    return data


def _check_id2label(config: dict[str, Any], path: Path) -> None:
    """config.json must map 0, 1, 2 to entailment, neutral, contradiction exactly."""
    raw = config.get("id2label")
    expected = {str(i): label for i, label in enumerate(LABELS)}
    got = {str(k): v for k, v in raw.items()} if isinstance(raw, dict) else raw
    if got != expected:
        raise StartupError(
            f"{path}: id2label must be {expected}, got {raw!r}; "
            "export the model with the project's label order (entailment, neutral, contradiction)"
        )


def _position_limit(config: dict[str, Any], path: Path) -> int:
    """The longest sequence the model's position embeddings allow."""
    positions = config.get("max_position_embeddings")
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        raise StartupError(
            f"{path}: max_position_embeddings must be a positive integer, got {positions!r}; "
            "use the config.json saved with the checkpoint"
        )
    pad = _config_pad_token_id(config)
    if config.get("model_type") in OFFSET_POSITION_MODELS and pad is not None:
        return positions - pad - 1
    return positions


def _config_pad_token_id(config: dict[str, Any]) -> int | None:
    """config.json's pad_token_id when it is a valid id (else the tokenizer's pad token is used)."""
    pad = config.get("pad_token_id")
    return pad if isinstance(pad, int) and not isinstance(pad, bool) and pad >= 0 else None


def _read_temperature(path: Path) -> float:
    """Temperature from calibration.json (T = 1 when the file is absent)."""
    if not path.exists():
        return 1.0
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StartupError(f"{path}: cannot read calibration JSON ({exc}); fix or remove the file") from None
    temperature = data.get("temperature") if isinstance(data, dict) else None
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise StartupError(
            f"{path}: 'temperature' must be a finite number > 0, got {temperature!r}; "
            'write {"temperature": T} with the fitted T, or remove the file'
        )
    return float(temperature)


def load_settings(env: Mapping[str, str]) -> Settings:
    """Validate the whole ENCODER_* environment and the model directory; raise StartupError on the first problem."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = _env_int(env, "ENCODER_THREADS", cpus, 1, 1024)
    variant = _env_choice(env, "ENCODER_VARIANT", "fp32", tuple(VARIANT_FILES))
    device = _env_choice(env, "ENCODER_DEVICE", "cpu", tuple(DEVICE_PROVIDERS))
    truncation = _env_choice(env, "ENCODER_TRUNCATION", "refuse", TRUNCATION_POLICIES)
    pad_to_max = _env_bool(env, "ENCODER_PAD_TO_MAX")
    max_batch = _env_int(env, "ENCODER_MAX_BATCH", 32, 1, 4096)
    max_body = _env_int(env, "ENCODER_MAX_BODY_BYTES", 1 << 20, 1, 1 << 30)
    max_in_flight = _env_int(env, "ENCODER_MAX_IN_FLIGHT", 4, 1, 4096)
    queue_timeout_s = _env_float(env, "ENCODER_QUEUE_TIMEOUT_S", 60.0, 0.001, 3600.0)
    port = _env_int(env, "ENCODER_PORT", 8080, 0, 65535)
    host = env.get("ENCODER_HOST", "127.0.0.1")
    if not host.strip() or host != host.strip():
        raise StartupError(f"ENCODER_HOST={host!r} is not a host; set it to an address such as 127.0.0.1")
    model_dir = Path(env.get("ENCODER_MODEL_DIR", "/opt/ml/model"))
    if not model_dir.is_dir():
        raise StartupError(
            f"ENCODER_MODEL_DIR={str(model_dir)!r} is not a directory; set it to the extracted model.tar.gz"
        )
    model_path = model_dir / VARIANT_FILES[variant]
    if not model_path.is_file():
        raise StartupError(
            f"ENCODER_VARIANT={variant} needs {model_path.name}, which is not in ENCODER_MODEL_DIR={str(model_dir)!r}; "
            + ("export the int8 model or set ENCODER_VARIANT=fp32" if variant == "int8" else "export the model there")
        )
    if not (model_dir / "tokenizer.json").is_file():
        raise StartupError(
            f"no tokenizer.json in ENCODER_MODEL_DIR={str(model_dir)!r}; ship the fast tokenizer with the model"
        )
    config_path = model_dir / "config.json"
    config = _read_json_object(config_path, "ship the config.json saved with the checkpoint")
    _check_id2label(config, config_path)
    limit = _position_limit(config, config_path)
    max_len = _env_int(env, "ENCODER_MAX_LEN", 512, MIN_MAX_LEN, 1 << 20)
    if max_len > limit:
        raise StartupError(
            f"ENCODER_MAX_LEN={max_len} exceeds the model's {limit} positions ({config_path.name}); "
            f"set ENCODER_MAX_LEN to at most {limit}"
        )
    return Settings(
        model_dir=model_dir,
        model_path=model_path,
        variant=variant,
        device=device,
        max_len=max_len,
        max_batch=max_batch,
        truncation=truncation,
        pad_to_max=pad_to_max,
        pad_token_id=_config_pad_token_id(config),
        temperature=_read_temperature(model_dir / "calibration.json"),
        threads=threads,
        max_body_bytes=max_body,
        max_in_flight=max_in_flight,
        queue_timeout_s=queue_timeout_s,
        host=host,
        port=port,
    )


# --------------------------------------------------------------------------------------
# Request validation


class HttpError(Exception):
    """An error answered as JSON with this status."""

    def __init__(self, status: int, message: str, *, retryable: bool = False):
        super().__init__(message)
        self.status = status
        self.retryable = retryable


def bad(field: str, rule: str) -> HttpError:
    """A 400 naming the field and the rule it broke."""
    return HttpError(400, f"{field}: {rule}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a repeated key is an error, never a silent last-wins."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def parse_body(body: bytes) -> dict[str, Any]:
    """Decode the request body into a JSON object."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad("body", f"must be UTF-8 encoded JSON ({exc})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
    except RecursionError:
        raise bad("body", "JSON is nested too deeply") from None
    except ValueError as exc:
        raise bad("body", f"must be valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise bad("body", f"must be a JSON object, got {_json_type(value)}")
    return value


def _text(value: Any, field: str) -> str:
    """A non-empty, non-blank string that is valid Unicode."""
    if not isinstance(value, str):
        raise bad(field, f"must be a string, got {_json_type(value)}")
    if not value.strip():
        raise bad(field, "must be a non-empty string (not only whitespace)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(field, "contains an unpaired surrogate; send valid Unicode") from None
    return value


def parse_pairs(request: dict[str, Any], max_batch: int) -> list[tuple[str, str]]:
    """Validate {"pairs": [{"premise", "hypothesis"}, ...]} and return the (premise, hypothesis) list."""
    extra = sorted(set(request) - {"pairs"})
    if extra:
        raise bad("body", f'unexpected keys {extra}; send only {{"pairs": [...]}}')
    if "pairs" not in request:
        raise bad("pairs", 'is required: send {"pairs": [{"premise": ..., "hypothesis": ...}, ...]}')
    pairs = request["pairs"]
    if not isinstance(pairs, list):
        raise bad("pairs", f"must be an array, got {_json_type(pairs)}")
    if not pairs:
        raise bad("pairs", f"is empty; send 1 to {max_batch} pairs")
    if len(pairs) > max_batch:
        raise HttpError(
            413,
            f"pairs: {len(pairs)} pairs is over the batch limit of {max_batch} (ENCODER_MAX_BATCH); split the request",
        )
    parsed = []
    for index, pair in enumerate(pairs):
        field = f"pairs[{index}]"
        if not isinstance(pair, dict):
            raise bad(field, f"must be an object with 'premise' and 'hypothesis', got {_json_type(pair)}")
        missing = [key for key in PAIR_KEYS if key not in pair]
        if missing:
            raise bad(field, f"missing {missing}; each pair needs 'premise' and 'hypothesis'")
        extra = sorted(set(pair) - set(PAIR_KEYS))
        if extra:
            raise bad(field, f"unexpected keys {extra}; each pair has only 'premise' and 'hypothesis'")
        parsed.append((_text(pair["premise"], f"{field}.premise"), _text(pair["hypothesis"], f"{field}.hypothesis")))
    return parsed


# --------------------------------------------------------------------------------------
# Model


@dataclass(frozen=True)
class Encoded:
    """One tokenized pair as fed to the model, with its truncation record (None when not cut)."""

    ids: list[int]
    type_ids: list[int]
    truncation: dict[str, Any] | None


class Engine:
    """The tokenizer and the ONNX Runtime session; `run` is serialized by `lock`."""

    def __init__(self, settings: Settings):
        import numpy
        import onnxruntime
        from tokenizers import Tokenizer

        self.settings = settings
        self._np = numpy
        self.lock = threading.Lock()
        try:
            tokenizer = Tokenizer.from_file(str(settings.model_dir / "tokenizer.json"))
        except Exception as exc:
            raise StartupError(f"tokenizer.json cannot be loaded ({exc}); ship a fast tokenizer", EXIT_MODEL) from None
        tokenizer.no_truncation()  # the server decides on truncation and reports it
        tokenizer.no_padding()  # and pads whole batches itself
        self.tokenizer = tokenizer
        self.pair_specials = tokenizer.num_special_tokens_to_add(is_pair=True)
        if settings.max_len < self.pair_specials + 2:
            raise StartupError(
                f"ENCODER_MAX_LEN={settings.max_len} leaves no room for text next to "
                f"{self.pair_specials} special tokens; raise ENCODER_MAX_LEN",
                EXIT_CONFIG,
            )
        self.pad_token_id = self._pad_token_id()
        self.special_tokens = sorted(
            {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special and t.content.strip()}
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = settings.threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = self._session(options)
        self.input_names = self._check_graph()
        self.model_info = {
            "file": settings.model_path.name,
            "sha256": _sha256_file(settings.model_path),
            "variant": settings.variant,
            "device": settings.device,
            "temperature": settings.temperature,
        }

    def _session(self, options: Any) -> Any:
        """An ONNX Runtime session on ENCODER_DEVICE; never a silent fallback from CUDA to the CPU."""
        import onnxruntime

        provider = DEVICE_PROVIDERS[self.settings.device]
        available = onnxruntime.get_available_providers()
        if provider not in available:
            raise StartupError(
                f"ENCODER_DEVICE={self.settings.device} needs {provider}, but this onnxruntime "
                f"({onnxruntime.__version__}) offers {available}; build the image with "
                "ORT_PACKAGE=onnxruntime-gpu on a CUDA base, or set ENCODER_DEVICE=cpu",
                EXIT_CONFIG,
            )
        session = onnxruntime.InferenceSession(
            str(self.settings.model_path), sess_options=options, providers=[provider]
        )
        if session.get_providers()[0] != provider:
            raise StartupError(
                f"ONNX Runtime did not place the model on {provider} (it runs on "
                f"{session.get_providers()}); check the CUDA/cuDNN libraries and the GPU "
                "(nvidia-smi) in the container",
                EXIT_MODEL,
            )
        return session

    def _pad_token_id(self) -> int:
        """config.json's pad_token_id, else the id of the pad_token named in special_tokens_map.json."""
        if self.settings.pad_token_id is not None:
            return self.settings.pad_token_id
        path = self.settings.model_dir / "special_tokens_map.json"
        token = _read_json_object(path, "ship special_tokens_map.json").get("pad_token") if path.is_file() else None
        token = token.get("content") if isinstance(token, dict) else token
        token_id = self.tokenizer.token_to_id(token) if isinstance(token, str) else None
        if token_id is None:
            raise StartupError(
                "config.json has no pad_token_id and special_tokens_map.json names no pad_token known to "
                "tokenizer.json; save the checkpoint with its tokenizer's pad token",
                EXIT_MODEL,
            )
        return token_id

    def _check_graph(self) -> tuple[str, ...]:
        """Inputs input_ids/attention_mask (/token_type_ids) as int64, an output 'logits' of 3 columns."""
        inputs = {i.name: i for i in self.session.get_inputs()}
        unknown = sorted(set(inputs) - set(GRAPH_INPUTS))
        required = {"input_ids", "attention_mask"} - set(inputs)
        if unknown or required:
            raise StartupError(
                f"{self.settings.model_path.name}: graph inputs {sorted(inputs)} are not input_ids, attention_mask "
                "(and token_type_ids); export the model with the project's exporter",
                EXIT_MODEL,
            )
        for name, node in inputs.items():
            if node.type != "tensor(int64)":
                raise StartupError(
                    f"{self.settings.model_path.name}: input {name} is {node.type}, not int64", EXIT_MODEL
                )
        outputs = {o.name: o for o in self.session.get_outputs()}
        if "logits" not in outputs:
            raise StartupError(
                f"{self.settings.model_path.name}: no output named 'logits' (outputs {sorted(outputs)})", EXIT_MODEL
            )
        width = outputs["logits"].shape[-1] if outputs["logits"].shape else None
        if isinstance(width, int) and width != len(LABELS):
            raise StartupError(
                f"{self.settings.model_path.name}: logits have {width} columns, not {len(LABELS)}", EXIT_MODEL
            )
        return tuple(name for name in GRAPH_INPUTS if name in inputs)

    def _check_special(self, pairs: list[tuple[str, str]]) -> None:
        """Text that the tokenizer would read as a special token ([SEP], <s>, ...) is refused."""
        for index, pair in enumerate(pairs):
            for key, text in zip(PAIR_KEYS, pair):
                for token in self.special_tokens:
                    if token in text:
                        raise bad(
                            f"pairs[{index}].{key}",
                            f"contains the tokenizer's special token {token!r}; remove it from the text",
                        )

    def encode(self, pairs: list[tuple[str, str]]) -> list[Encoded]:
        """Tokenize the pairs; an over-long pair is refused or has its premise cut, per ENCODER_TRUNCATION."""
        self._check_special(pairs)
        max_len = self.settings.max_len
        encoded = []
        for index, (pair, enc) in enumerate(zip(pairs, self.tokenizer.encode_batch(pairs))):
            for sequence, key in enumerate(PAIR_KEYS):
                if sequence not in enc.sequence_ids:
                    raise bad(
                        f"pairs[{index}].{key}",
                        "gives no tokens (only characters the tokenizer drops, such as control or zero-width "
                        "characters); send readable text",
                    )
            n_tokens = len(enc.ids)
            if n_tokens <= max_len:
                encoded.append(Encoded(list(enc.ids), list(enc.type_ids), None))
                continue
            if self.settings.truncation == "refuse":
                raise bad(
                    f"pairs[{index}]",
                    f"is {n_tokens} tokens (premise + hypothesis + special tokens), over the limit of {max_len} "
                    "(ENCODER_MAX_LEN); shorten the premise, or serve with ENCODER_TRUNCATION=premise_first",
                )
            encoded.append(self._cut_premise(index, pair, n_tokens))
        return encoded

    def _cut_premise(self, index: int, pair: tuple[str, str], n_tokens: int) -> Encoded:
        """premise_first: keep the whole hypothesis and as much of the premise's start as fits."""
        premise = self.tokenizer.encode(pair[0], add_special_tokens=False)
        hypothesis = self.tokenizer.encode(pair[1], add_special_tokens=False)
        keep = self.settings.max_len - self.pair_specials - len(hypothesis.ids)
        if keep < 1:
            raise bad(
                f"pairs[{index}].hypothesis",
                f"is {len(hypothesis.ids)} tokens; with {self.pair_specials} special tokens it leaves no room for the "
                f"premise within {self.settings.max_len} (ENCODER_MAX_LEN); shorten the hypothesis",
            )
        premise.truncate(keep, direction="right")
        merged = self.tokenizer.post_process(premise, hypothesis, add_special_tokens=True)
        truncation = {"policy": "premise_first", "original_tokens": n_tokens, "kept_tokens": len(merged.ids)}
        return Encoded(list(merged.ids), list(merged.type_ids), truncation)

    def feeds(self, encoded: list[Encoded]) -> dict[str, Any]:
        """Right-padded int64 arrays for one batch (to the longest pair, or to max_len)."""
        np = self._np
        width = self.settings.max_len if self.settings.pad_to_max else max(len(e.ids) for e in encoded)
        input_ids = np.full((len(encoded), width), self.pad_token_id, dtype=np.int64)
        attention = np.zeros((len(encoded), width), dtype=np.int64)
        type_ids = np.zeros((len(encoded), width), dtype=np.int64)
        for row, item in enumerate(encoded):
            n = len(item.ids)
            input_ids[row, :n] = item.ids
            attention[row, :n] = 1
            type_ids[row, :n] = item.type_ids
        arrays = {"input_ids": input_ids, "attention_mask": attention, "token_type_ids": type_ids}
        return {name: arrays[name] for name in self.input_names}

    def run(self, feeds: dict[str, Any]) -> Any:
        """One ONNX Runtime run; the logits as float64 [batch, 3]."""
        np = self._np
        (logits,) = self.session.run(["logits"], feeds)
        logits = np.asarray(logits, dtype=np.float64)
        batch = feeds["input_ids"].shape[0]
        if logits.shape != (batch, len(LABELS)):
            raise RuntimeError(f"the model returned logits of shape {logits.shape}, expected {(batch, len(LABELS))}")
        if not np.all(np.isfinite(logits)):
            raise RuntimeError("the model produced non-finite logits")
        return logits

    def results(self, encoded: list[Encoded], logits: Any) -> list[dict[str, Any]]:
        """Per pair: label, tempered probabilities, raw logits, tokens fed and the truncation record."""
        np = self._np
        scaled = logits / self.settings.temperature
        scaled = scaled - scaled.max(axis=1, keepdims=True)
        probabilities = np.exp(scaled)
        probabilities /= probabilities.sum(axis=1, keepdims=True)
        out = []
        for item, row, probs in zip(encoded, logits, probabilities):
            out.append(
                {
                    "label": LABELS[int(np.argmax(probs))],
                    "probabilities": {label: float(p) for label, p in zip(LABELS, probs)},
                    "logits": [float(x) for x in row],
                    "input_tokens": len(item.ids),
                    "truncated": item.truncation is not None,
                    "truncation": item.truncation,
                }
            )
        return out


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


# --------------------------------------------------------------------------------------
# HTTP


def _error_payload(error: HttpError) -> dict[str, Any]:
    payload: dict[str, Any] = {"error": str(error)}
    if error.retryable:
        payload["retryable"] = True
    return payload


class EncoderServer(ThreadingHTTPServer):
    """HTTP server holding the settings, the admission semaphore and (once loaded) the engine."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(self, settings: Settings):
        self.settings = settings
        self.admission = threading.BoundedSemaphore(settings.max_in_flight)
        self.engine: Engine | None = None
        self.exit_code = 0
        super().__init__((settings.host, settings.port), Handler)

    def load(self) -> None:
        """Load the tokenizer and the model in the background; on failure stop the server with a clear message."""
        try:
            start = time.perf_counter()
            self.engine = Engine(self.settings)
            info = self.engine.model_info
            print(
                f"encoder: model {info['file']} ({info['variant']} on {info['device']}, sha256 {info['sha256']}) loaded in "
                f"{time.perf_counter() - start:.2f}s; max_len {self.settings.max_len}, "
                f"truncation {self.settings.truncation}, temperature {self.settings.temperature}",
                file=sys.stderr,
                flush=True,
            )
        except StartupError as exc:
            self._fail(str(exc), exc.exit_code)
        except Exception as exc:  # any load failure must stop the process, not leave it unready forever
            traceback.print_exc(file=sys.stderr)
            self._fail(f"model load failed: {exc}", EXIT_MODEL)

    def _fail(self, message: str, exit_code: int) -> None:
        print(f"encoder: refusing to start: {message}", file=sys.stderr, flush=True)
        self.exit_code = exit_code
        self.shutdown()


class Handler(BaseHTTPRequestHandler):
    """The SageMaker container contract: GET /ping, POST /invocations; errors are JSON."""

    protocol_version = "HTTP/1.1"
    server_version = "shiplift-encoder/1"
    timeout = SOCKET_TIMEOUT_S
    server: EncoderServer

    def setup(self) -> None:
        """Headers and body are separate writes: without TCP_NODELAY, Nagle plus a keep-alive
        client's delayed ACK add ~40 ms to every answer."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"encoder: {self.address_string()} {format % args}\n")

    def _send(self, status: int, payload: dict[str, Any], *, close: bool = False) -> None:
        body = json.dumps(payload, allow_nan=False).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        try:
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left before reading the answer
            return
        if close:
            self._linger()

    def _linger(self) -> None:
        """Half-close, then discard what the client still sends (bounded), so it reads our answer, not a reset."""
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_S)
            deadline, drained = time.monotonic() + LINGER_S, 0
            while time.monotonic() < deadline and drained < LINGER_BYTES:
                chunk = self.connection.recv(1 << 16)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass  # the client went away: nothing left to protect

    def _error(self, error: HttpError, *, close: bool = False) -> None:
        self._send(error.status, _error_payload(error), close=close)

    def _route(self) -> str:
        return urlsplit(self.path).path

    def do_GET(self) -> None:
        """GET /ping: 200 once the model is loaded, 503 while it loads."""
        route = self._route()
        if route == "/ping":
            if self.server.engine is None:
                self._send(503, {"status": "loading"})
            else:
                self._send(200, {"status": "ok"})
        elif route == "/invocations":
            self._error(HttpError(405, "/invocations accepts POST only"))
        else:
            self._error(HttpError(404, f"no route {route!r}; use GET /ping or POST /invocations"))

    def do_POST(self) -> None:
        """POST /invocations, behind admission control; the body is unread on early errors."""
        route = self._route()
        if route != "/invocations":
            status = 405 if route == "/ping" else 404
            self._error(HttpError(status, f"no POST route {route!r}; use POST /invocations"), close=True)
            return
        received = time.perf_counter()
        if not self.server.admission.acquire(blocking=False):
            self._error(
                HttpError(
                    503,
                    f"overloaded: {self.server.settings.max_in_flight} requests in flight "
                    "(ENCODER_MAX_IN_FLIGHT); retry with backoff",
                    retryable=True,
                ),
                close=True,
            )
            return
        try:  # the slot is released before the answer is written, so a sequential client never races it
            status, payload, close = self._invocation(received)
        finally:
            self.server.admission.release()
        self._send(status, payload, close=close)

    def _method_not_allowed(self) -> None:
        self._error(HttpError(405, f"method {self.command} is not supported"), close=True)

    do_PUT = do_DELETE = do_PATCH = _method_not_allowed

    def _invocation(self, received: float) -> tuple[int, dict[str, Any], bool]:
        """(status, JSON payload, close connection) for one admitted POST /invocations."""
        try:
            body = self._read_body()
        except HttpError as error:
            return error.status, _error_payload(error), True
        try:
            return 200, self._answer(body, received), False
        except HttpError as error:
            return error.status, _error_payload(error), False
        except Exception as exc:  # the contract answers every failure with JSON
            traceback.print_exc(file=sys.stderr)
            return 500, {"error": f"internal error: {exc}"}, False

    def _read_body(self) -> bytes:
        """Check Content-Type and Content-Length before reading exactly that many bytes."""
        media_type, _, params = (self.headers.get("Content-Type") or "").partition(";")
        if media_type.strip().lower() != "application/json":
            raise HttpError(415, f"Content-Type must be application/json, got {self.headers.get('Content-Type')!r}")
        charset = params.strip().lower()
        if charset and charset.replace(" ", "") not in ("charset=utf-8", 'charset="utf-8"'):
            raise HttpError(415, f"Content-Type charset must be utf-8, got {params.strip()!r}")
        if self.headers.get("Transfer-Encoding") is not None:
            raise bad("Transfer-Encoding", "is not supported; send the body with a Content-Length")
        length_header = self.headers.get("Content-Length")
        if length_header is None or not length_header.strip().isdigit():
            raise bad("Content-Length", f"is required and must be a byte count, got {length_header!r}")
        length = int(length_header)
        limit = self.server.settings.max_body_bytes
        if length == 0:
            raise bad("body", 'is empty; send {"pairs": [{"premise": ..., "hypothesis": ...}, ...]}')
        if length > limit:
            raise HttpError(413, f"body: {length} bytes is over the limit of {limit} bytes (ENCODER_MAX_BODY_BYTES)")
        try:
            body = self.rfile.read(length)
        except TimeoutError:
            raise bad("body", f"not received within {SOCKET_TIMEOUT_S:.0f}s") from None
        except OSError as exc:
            raise bad("body", f"connection failed while reading it ({exc})") from None
        if len(body) != length:
            raise bad("body", f"ended after {len(body)} of {length} bytes (Content-Length)")
        return body

    def _answer(self, body: bytes, received: float) -> dict[str, Any]:
        engine = self.server.engine
        if engine is None:
            raise HttpError(503, "model is loading; retry when GET /ping returns 200", retryable=True)
        settings = self.server.settings
        pairs = parse_pairs(parse_body(body), settings.max_batch)
        tokenize_start = time.perf_counter()
        encoded = engine.encode(pairs)
        feeds = engine.feeds(encoded)
        tokenize_s = time.perf_counter() - tokenize_start
        waited = time.perf_counter()
        if not engine.lock.acquire(timeout=settings.queue_timeout_s):
            raise HttpError(
                503, f"the model stayed busy for {settings.queue_timeout_s}s (ENCODER_QUEUE_TIMEOUT_S)", retryable=True
            )
        try:
            forward_start = time.perf_counter()
            logits = engine.run(feeds)
            forward_s = time.perf_counter() - forward_start
        finally:
            engine.lock.release()
        results = engine.results(encoded, logits)
        timing = {
            "tokenize_ms": _ms(tokenize_s),
            "queue_ms": _ms(forward_start - waited),
            "forward_ms": _ms(forward_s),
            "total_ms": _ms(time.perf_counter() - received),
            "batch_size": len(encoded),
            "padded_len": int(feeds["input_ids"].shape[1]),
        }
        return {"results": results, "timing": timing, "model": engine.model_info}


def main(argv: list[str]) -> int:
    """Validate the environment, listen, load the model in the background, serve until stopped."""
    if argv not in ([], ["serve"]):  # SageMaker starts the container as `<entrypoint> serve`
        print(
            f"encoder: refusing to start: unexpected arguments {argv}; configure with ENCODER_* variables",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        settings = load_settings(os.environ)
    except StartupError as exc:
        print(f"encoder: refusing to start: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    try:
        server = EncoderServer(settings)
    except OSError as exc:
        print(
            f"encoder: refusing to start: cannot listen on {settings.host}:{settings.port} ({exc}); "
            "set ENCODER_HOST/ENCODER_PORT to a free address",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_CONFIG
    host, port = server.server_address[:2]
    print(
        f"encoder: listening on http://{host}:{port} (model {settings.model_path}, loading)",
        file=sys.stderr,
        flush=True,
    )
    # SIGTERM (docker stop, SageMaker, the local backend) ends serve_forever cleanly with exit code 0
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    threading.Thread(target=server.load, name="encoder-load", daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return server.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
