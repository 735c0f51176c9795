#!/usr/bin/env python3
"""Encoder NLI server: scores (premise, hypothesis) pairs with an ONNX sequence classifier (DESIGN §6.3), run by ONNX
Runtime or, with ``ENCODER_ENGINE=openvino``, by OpenVINO on the IR converted from the same ``model.onnx``.

This file is the container's entrypoint and, unchanged, the local backend's model server.
It speaks the SageMaker container contract (``GET /ping``, ``POST /invocations``) through the
shared ``images/common/sagemaker_http.py``, is configured only by ``ENCODER_*`` environment
variables, and depends on the standard library, numpy, onnxruntime (or openvino) and tokenizers only (it must
not import ``tasks``, ``validation``, transformers or torch).

Model directory (the shared encoder contract): ``model.onnx`` (fp32) and optionally
``model.int8.onnx`` (OpenVINO: ``model.ov.xml`` / ``model.ov.int8.xml`` with their .bin and ``openvino.json``),
``tokenizer.json`` (+ tokenizer_config.json, special_tokens_map.json),
``config.json`` with ``id2label`` {0: entailment, 1: neutral, 2: contradiction} and
``max_position_embeddings``, optional ``calibration.json`` {"temperature": T}, optional ``export.json`` (the
exporter's record: which graph each file is; the answer's ``model.graph`` repeats how the served one was made,
e.g. int8 static QDQ per-channel calibrated on the calibration split).

A batch is tokenized as pairs, padded to its longest pair (or to ``ENCODER_MAX_LEN`` with
``ENCODER_PAD_TO_MAX``) and scored in one ONNX Runtime run (denormal floats flushed to zero: the masked
attention of a padded batch leaves denormals that made ONNX Runtime ~1.5x slower on x86, docs/encoder-speed.md;
``ENCODER_KEEP_DENORMALS=true`` turns that off); ``probabilities =
softmax(logits / T)``. A pair longer than ``ENCODER_MAX_LEN`` is refused, or with
``ENCODER_TRUNCATION=premise_first`` its premise is cut and the result says so.

Exit codes: 0 clean stop, 2 bad configuration (environment, model directory, config.json,
calibration.json), 3 the model or tokenizer could not be loaded or do not fit the contract.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy

# The image copies sagemaker_http.py beside this file; a checkout keeps it in images/common.
_HERE = Path(__file__).resolve().parent
if not (_HERE / "sagemaker_http.py").is_file():
    sys.path.insert(0, str(_HERE.parent / "common"))

from sagemaker_http import (  # noqa: E402 — needs sys.path above
    EXIT_CONFIG,
    EXIT_MODEL,
    HttpError,
    HttpSettings,
    ModelService,
    StartupError,
    available_cpus,
    bad,
    env_bool,
    env_choice,
    env_int,
    json_string,
    json_type,
    model_turn,
    parse_json_object,
    read_http_settings,
    read_temperature,
    reject_constant,
    serve,
    sha256_file,
    to_ms,
)

LABELS = ("entailment", "neutral", "contradiction")
PAIR_KEYS = ("premise", "hypothesis")
VARIANT_FILES = {"fp32": "model.onnx", "int8": "model.int8.onnx"}
ENGINE_FILES = {"onnxruntime": VARIANT_FILES, "openvino": {"fp32": "model.ov.xml", "int8": "model.ov.int8.xml"}}
OV_ELEMENT_TYPES = {"i64": "tensor(int64)", "i32": "tensor(int32)", "f32": "tensor(float)"}  # as ONNX Runtime names
DEVICE_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
TRUNCATION_POLICIES = ("refuse", "premise_first")
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
MIN_MAX_LEN = 8  # room for the special tokens and at least a token of each text
# position-embedding tables of these families keep pad_token_id + 1 rows for padding offsets
OFFSET_POSITION_MODELS = ("roberta", "xlm-roberta", "camembert")


# --------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Settings:
    """Validated ENCODER_* environment plus what start-up read from the model directory."""

    model_dir: Path
    model_path: Path
    engine: str
    variant: str
    device: str
    max_len: int
    max_batch: int
    truncation: str
    pad_to_max: bool
    keep_denormals: bool
    pad_token_id: int | None  # from config.json; None: the tokenizer's pad token
    temperature: float
    threads: int
    http: HttpSettings


def _read_json_object(path: Path, fix: str) -> dict[str, Any]:
    """A JSON object from a model-directory file, or a StartupError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"), parse_constant=reject_constant)
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


def load_settings(env: Mapping[str, str]) -> Settings:
    """Validate the whole ENCODER_* environment and the model directory; raise StartupError on the first problem."""
    threads = env_int(env, "ENCODER_THREADS", available_cpus(), 1, 1024)
    engine = env_choice(env, "ENCODER_ENGINE", "onnxruntime", tuple(ENGINE_FILES))
    variant = env_choice(env, "ENCODER_VARIANT", "fp32", tuple(VARIANT_FILES))
    device = env_choice(env, "ENCODER_DEVICE", "cpu", tuple(DEVICE_PROVIDERS))
    if engine == "openvino" and device != "cpu":
        raise StartupError(f"ENCODER_ENGINE=openvino runs on the CPU, not ENCODER_DEVICE={device}; set "
                           "ENCODER_DEVICE=cpu or ENCODER_ENGINE=onnxruntime")
    truncation = env_choice(env, "ENCODER_TRUNCATION", "refuse", TRUNCATION_POLICIES)
    pad_to_max = env_bool(env, "ENCODER_PAD_TO_MAX")
    keep_denormals = env_bool(env, "ENCODER_KEEP_DENORMALS")
    max_batch = env_int(env, "ENCODER_MAX_BATCH", 32, 1, 4096)
    http = read_http_settings(env, "ENCODER")
    model_dir = Path(env.get("ENCODER_MODEL_DIR", "/opt/ml/model"))
    if not model_dir.is_dir():
        raise StartupError(
            f"ENCODER_MODEL_DIR={str(model_dir)!r} is not a directory; set it to the extracted model.tar.gz"
        )
    model_path = model_dir / ENGINE_FILES[engine][variant]
    if not model_path.is_file():
        raise StartupError(
            f"ENCODER_ENGINE={engine} ENCODER_VARIANT={variant} needs {model_path.name}, which is not in "
            f"ENCODER_MODEL_DIR={str(model_dir)!r}; "
            + ("build the release with image.engine: openvino (or auto), or set ENCODER_ENGINE=onnxruntime"
               if engine == "openvino" else
               "export the int8 model or set ENCODER_VARIANT=fp32" if variant == "int8" else "export the model there")
        )
    if not (model_dir / "tokenizer.json").is_file():
        raise StartupError(
            f"no tokenizer.json in ENCODER_MODEL_DIR={str(model_dir)!r}; ship the fast tokenizer with the model"
        )
    config_path = model_dir / "config.json"
    config = _read_json_object(config_path, "ship the config.json saved with the checkpoint")
    _check_id2label(config, config_path)
    limit = _position_limit(config, config_path)
    max_len = env_int(env, "ENCODER_MAX_LEN", 512, MIN_MAX_LEN, 1 << 20)
    if max_len > limit:
        raise StartupError(
            f"ENCODER_MAX_LEN={max_len} exceeds the model's {limit} positions ({config_path.name}); "
            f"set ENCODER_MAX_LEN to at most {limit}"
        )
    return Settings(
        model_dir=model_dir,
        model_path=model_path,
        engine=engine,
        variant=variant,
        device=device,
        max_len=max_len,
        max_batch=max_batch,
        truncation=truncation,
        pad_to_max=pad_to_max,
        keep_denormals=keep_denormals,
        pad_token_id=_config_pad_token_id(config),
        temperature=read_temperature(model_dir / "calibration.json"),
        threads=threads,
        http=http,
    )


GRAPH_FIELDS = ("method", "format", "per_channel", "reduce_range", "activation_ranges", "weight_type",
                "activation_type")


def graph_record(model_dir: Path, variant: str, engine: str = "onnxruntime") -> dict[str, Any] | None:
    """How the served graph was made, from the exporter's export.json (OpenVINO: the converter's openvino.json; None
    when the folder has none): the engine, the precision and, for int8, the quantization method and its calibration
    data."""
    if engine == "openvino":
        return _openvino_record(model_dir, variant)
    path = model_dir / "export.json"
    if not path.is_file():
        return None
    record = _read_json_object(path, "ship the export.json the exporter wrote, or remove it")
    graph: dict[str, Any] = {"engine": "onnxruntime", "precision": variant, "optimizer": record.get("optimizer")}
    quantization = record.get("quantization") if variant == "int8" else None
    if isinstance(quantization, dict):
        graph.update({key: quantization.get(key) for key in GRAPH_FIELDS})
        calibration = quantization.get("calibration")
        graph["calibration"] = calibration.get("source") if isinstance(calibration, dict) else None
    return graph


def _openvino_record(model_dir: Path, variant: str) -> dict[str, Any] | None:
    """graph_record for OpenVINO's IR, from openvino.json."""
    path = model_dir / "openvino.json"
    if not path.is_file():
        return None
    record = _read_json_object(path, "ship the openvino.json the converter wrote, or remove it")
    graph: dict[str, Any] = {"engine": "openvino", "precision": variant, "converted_from": "model.onnx"}
    int8 = record.get("int8") if variant == "int8" else None
    if isinstance(int8, dict):
        graph.update({key: int8.get(key) for key in ("method", "preset", "calibration")})
    return graph


class OpenVinoSession:
    """An OpenVINO CPU model behind the calls the server makes of an ONNX Runtime session (inputs, outputs, run):
    one stream of ENCODER_THREADS threads, fp32 inference precision (the CPU plugin would pick bf16 on AVX-512 BF16
    and AMX CPUs), denormals flushed to zero unless ENCODER_KEEP_DENORMALS."""

    def __init__(self, settings: Settings):
        import openvino

        config = {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(settings.threads),
                  "INFERENCE_PRECISION_HINT": "f32",
                  "CPU_DENORMALS_OPTIMIZATION": "NO" if settings.keep_denormals else "YES"}
        self.compiled = openvino.Core().compile_model(str(settings.model_path), "CPU", config)
        self.request = self.compiled.create_infer_request()

    @staticmethod
    def _port(port: Any) -> Any:
        shape = port.get_partial_shape()
        return SimpleNamespace(
            name=port.get_any_name(),
            type=OV_ELEMENT_TYPES.get(port.get_element_type().get_type_name(), str(port.get_element_type())),
            shape=[dim.get_length() if dim.is_static else None for dim in shape] if shape.rank.is_static else None,
        )

    def get_inputs(self) -> list[Any]:
        return [self._port(port) for port in self.compiled.inputs]

    def get_outputs(self) -> list[Any]:
        return [self._port(port) for port in self.compiled.outputs]

    def run(self, names: list[str], feeds: dict[str, Any]) -> list[Any]:
        result = self.request.infer(feeds)
        return [result[self.compiled.output(name)] for name in names]


# --------------------------------------------------------------------------------------
# Request validation


def _text(value: Any, field: str) -> str:
    """A non-empty, non-blank string that is valid Unicode."""
    text = json_string(value, field)
    if not text.strip():
        raise bad(field, "must be a non-empty string (not only whitespace)")
    return text


def parse_pairs(request: dict[str, Any], max_batch: int) -> list[tuple[str, str]]:
    """Validate {"pairs": [{"premise", "hypothesis"}, ...]} and return the (premise, hypothesis) list."""
    extra = sorted(set(request) - {"pairs"})
    if extra:
        raise bad("body", f'unexpected keys {extra}; send only {{"pairs": [...]}}')
    if "pairs" not in request:
        raise bad("pairs", 'is required: send {"pairs": [{"premise": ..., "hypothesis": ...}, ...]}')
    pairs = request["pairs"]
    if not isinstance(pairs, list):
        raise bad("pairs", f"must be an array, got {json_type(pairs)}")
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
            raise bad(field, f"must be an object with 'premise' and 'hypothesis', got {json_type(pair)}")
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
    """The tokenizer and the ONNX Runtime session (or OpenVINO's, behind the same calls); `run` is serialized by
    `lock`."""

    def __init__(self, settings: Settings):
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
        self.session = OpenVinoSession(settings) if settings.engine == "openvino" else self._session()
        self.input_names = self._check_graph()
        self.model_info = {
            "file": settings.model_path.name,
            "sha256": sha256_file(settings.model_path),
            "variant": settings.variant,
            "device": settings.device,
            "temperature": settings.temperature,
        }
        graph = graph_record(settings.model_dir, settings.variant, settings.engine)
        if graph is not None:
            self.model_info["graph"] = graph

    def _session(self) -> Any:
        """An ONNX Runtime session on ENCODER_DEVICE (all graph optimizations, ENCODER_THREADS, denormals flushed to
        zero unless kept); never a silent fallback from CUDA to the CPU."""
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.settings.threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        if not self.settings.keep_denormals:
            options.add_session_config_entry("session.set_denormal_as_zero", "1")
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
            for key, text in zip(PAIR_KEYS, pair, strict=True):
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
        for index, (pair, enc) in enumerate(zip(pairs, self.tokenizer.encode_batch(pairs), strict=True)):
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
        for item, row, probs in zip(encoded, logits, probabilities, strict=True):
            out.append(
                {
                    "label": LABELS[int(np.argmax(probs))],
                    "probabilities": {label: float(p) for label, p in zip(LABELS, probs, strict=True)},
                    "logits": [float(x) for x in row],
                    "input_tokens": len(item.ids),
                    "truncated": item.truncation is not None,
                    "truncation": item.truncation,
                }
            )
        return out


# --------------------------------------------------------------------------------------
# Serving


def _loaded(settings: Settings, engine: Engine, seconds: float) -> str:
    """The start-up log line: which model file, variant, device and digest, and the serving limits."""
    info = engine.model_info
    graph = info.get("graph") or {}
    how = f", {graph['method']} {graph.get('format') or graph.get('preset')}" if graph.get("method") else ""
    return (
        f"model {info['file']} ({settings.engine} {info['variant']}{how} on {info['device']}, sha256 "
        f"{info['sha256']}) loaded in "
        f"{seconds:.2f}s; max_len {settings.max_len}, denormals "
        f"{'kept' if settings.keep_denormals else 'flushed to zero'}, truncation {settings.truncation}, temperature "
        f"{settings.temperature}"
    )


def answer(settings: Settings, engine: Engine, body: bytes, received: float) -> dict[str, Any]:
    """Score one POST /invocations body {"pairs": [...]} as a single batch."""
    pairs = parse_pairs(parse_json_object(body), settings.max_batch)
    tokenize_start = time.perf_counter()
    encoded = engine.encode(pairs)
    feeds = engine.feeds(encoded)
    tokenize_s = time.perf_counter() - tokenize_start
    waited = time.perf_counter()
    with model_turn(engine.lock, settings.http):
        forward_start = time.perf_counter()
        logits = engine.run(feeds)
        forward_s = time.perf_counter() - forward_start
    results = engine.results(encoded, logits)
    timing = {
        "tokenize_ms": to_ms(tokenize_s),
        "queue_ms": to_ms(forward_start - waited),
        "forward_ms": to_ms(forward_s),
        "total_ms": to_ms(time.perf_counter() - received),
        "batch_size": len(encoded),
        "padded_len": int(feeds["input_ids"].shape[1]),
    }
    return {"results": results, "timing": timing, "model": engine.model_info}


SERVICE = ModelService(
    name="encoder",
    prefix="ENCODER",
    server_version="shiplift-encoder/1",
    empty_body='is empty; send {"pairs": [{"premise": ..., "hypothesis": ...}, ...]}',
    load_settings=load_settings,
    load_engine=Engine,
    loaded=_loaded,
    answer=answer,
)


if __name__ == "__main__":
    sys.exit(serve(SERVICE, sys.argv[1:]))
