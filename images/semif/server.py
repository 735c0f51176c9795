#!/usr/bin/env python3
"""SemIf decision adapter: scores multiple-choice decisions with a GGUF model (DESIGN §6.1).

This file is the container's entrypoint and, unchanged, the local backend's model server.
It speaks the SageMaker container contract (``GET /ping``, ``POST /invocations``), is
configured only by ``SEMIF_*`` environment variables, and depends on the standard library,
numpy and llama-cpp-python only (it must not import ``tasks`` or ``validation``).

Readout: the options are shown to the model as letters A..P (ids are never shown), the model
runs one forward pass over the prompt with logits for the last position only, and the
letter logits give ``probabilities = softmax(option_logits / T)``. No token is generated.
Shared decisions prefill the common state prefix once and score each decision's suffix
from that KV-cache state.

Exit codes: 0 clean stop, 2 bad configuration (environment, model path, calibration.json),
3 the model could not be loaded or is unsuitable (e.g. a letter is not a single token).
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

PROMPT_VERSION = "semif-prompt-v1"
LETTERS = "ABCDEFGHIJKLMNOP"
MIN_OPTIONS, MAX_OPTIONS = 2, len(LETTERS)
DECISION_KEYS = ("id", "state", "question", "options")
OPTION_KEYS = ("id", "description")
EXIT_CONFIG, EXIT_MODEL = 2, 3
SOCKET_TIMEOUT_S = 30.0  # a client that stalls while sending its body loses its slot
LINGER_S, LINGER_BYTES = 1.0, 16 << 20  # drain an unread body briefly so the client sees our answer
CHAT_MARKER = "\ue000SEMIF-CONTENT\ue000"  # private-use text, split point of the chat template

# Prompt template semif-prompt-v1. The prefix ends with the state (shared by decisions on
# the same state); the suffix carries the question, the lettered options and the cue.
PREFIX_TEMPLATE = (
    "Read the state, then answer the question by choosing exactly one of the options.\n\n"
    "State:\n{state}"
)
SUFFIX_TEMPLATE = (
    "\n\nQuestion:\n{question}\n\nOptions:\n{options}\nAnswer with the letter of the best option."
)
PLAIN_CUE = "\nAnswer:"  # without a chat template the next token is " A".." P"


# --------------------------------------------------------------------------------------
# Configuration


class StartupError(Exception):
    """The server must not start; the message says what is wrong and how to fix it."""

    def __init__(self, message: str, exit_code: int = EXIT_CONFIG):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Settings:
    """Validated SEMIF_* environment."""

    gguf_path: Path
    calibration_path: Path
    temperature: float
    threads: int
    n_gpu_layers: int
    max_tokens: int
    max_request_tokens: int
    max_shared_decisions: int
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


def _find_gguf(env: Mapping[str, str]) -> Path:
    """SEMIF_GGUF_PATH if set, else the first *.gguf (sorted) under SEMIF_MODEL_DIR."""
    explicit = env.get("SEMIF_GGUF_PATH")
    if explicit is not None:
        path = Path(explicit)
        if not explicit.strip() or not path.is_file():
            raise StartupError(f"SEMIF_GGUF_PATH={explicit!r} is not a file; point it at the model's .gguf file")
        return path
    model_dir = Path(env.get("SEMIF_MODEL_DIR", "/opt/ml/model"))
    if not model_dir.is_dir():
        raise StartupError(
            f"SEMIF_MODEL_DIR={str(model_dir)!r} is not a directory; "
            "set SEMIF_MODEL_DIR to the extracted model.tar.gz or SEMIF_GGUF_PATH to the .gguf file"
        )
    found = sorted(p for p in model_dir.rglob("*.gguf") if p.is_file())
    if not found:
        raise StartupError(
            f"no *.gguf file under SEMIF_MODEL_DIR={str(model_dir)!r}; "
            "put the model's .gguf there or set SEMIF_GGUF_PATH"
        )
    return found[0]


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
            "write {\"temperature\": T} with the fitted T, or remove the file"
        )
    return float(temperature)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def load_settings(env: Mapping[str, str]) -> Settings:
    """Validate the whole SEMIF_* environment; raise StartupError on the first bad value."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = _env_int(env, "SEMIF_THREADS", cpus, 1, 1024)
    n_gpu_layers = _env_int(env, "SEMIF_N_GPU_LAYERS", 0, -1, 100_000)
    max_tokens = _env_int(env, "SEMIF_MAX_TOKENS", 4096, 64, 1_048_576)
    max_request_tokens = _env_int(env, "SEMIF_MAX_REQUEST_TOKENS", max_tokens, 1, max_tokens)
    max_shared = _env_int(env, "SEMIF_MAX_SHARED_DECISIONS", 16, 1, 4096)
    max_body = _env_int(env, "SEMIF_MAX_BODY_BYTES", 1 << 20, 1, 1 << 30)
    max_in_flight = _env_int(env, "SEMIF_MAX_IN_FLIGHT", 4, 1, 4096)
    queue_timeout_s = _env_float(env, "SEMIF_QUEUE_TIMEOUT_S", 60.0, 0.001, 3600.0)
    port = _env_int(env, "SEMIF_PORT", 8080, 0, 65535)
    host = env.get("SEMIF_HOST", "127.0.0.1")
    if not host.strip() or host != host.strip():
        raise StartupError(f"SEMIF_HOST={host!r} is not a host; set it to an address such as 127.0.0.1")
    gguf_path = _find_gguf(env)
    calibration_path = gguf_path.parent / "calibration.json"
    if env.get("SEMIF_GGUF_PATH") is None:
        calibration_path = Path(env.get("SEMIF_MODEL_DIR", "/opt/ml/model")) / "calibration.json"
    return Settings(
        gguf_path=gguf_path,
        calibration_path=calibration_path,
        temperature=_read_temperature(calibration_path),
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        max_tokens=max_tokens,
        max_request_tokens=max_request_tokens,
        max_shared_decisions=max_shared,
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


@dataclass(frozen=True)
class Decision:
    """One validated decision; `field` is its path in the request (for error messages)."""

    field: str
    id: str
    state_key: str  # canonical JSON of the raw state, to compare shared states
    state_text: str  # the state as shown to the model
    question: str
    option_ids: tuple[str, ...]
    descriptions: tuple[str, ...]


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json object hook: a repeated key is an error, never a silent last-wins."""
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r} in a JSON object")
        result[key] = value
    return result


def parse_body(body: bytes) -> dict[str, Any]:
    """Decode the request body into a JSON object (NaN parses here and is refused by field)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise bad("body", f"must be UTF-8 encoded JSON ({exc})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=float)
    except RecursionError:
        raise bad("body", "JSON is nested too deeply") from None
    except ValueError as exc:
        raise bad("body", f"must be valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise bad("body", f"must be a JSON object, got {_json_type(value)}")
    return value


def _text(value: Any, field: str, *, allow_empty: bool = False) -> str:
    """A string that is valid Unicode (and non-empty unless allowed)."""
    if not isinstance(value, str):
        raise bad(field, f"must be a string, got {_json_type(value)}")
    if not allow_empty and not value.strip():
        raise bad(field, "must be a non-empty string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(field, "contains an unpaired surrogate; send valid Unicode") from None
    return value


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _check_finite(value: Any, field: str) -> None:
    """Every number inside a structured state must be finite."""
    if isinstance(value, float) and not math.isfinite(value):
        raise bad(field, f"{value} is not a finite number; states may hold finite JSON values only")
    if isinstance(value, str):
        _text(value, field, allow_empty=True)
    elif isinstance(value, dict):
        for key, item in value.items():
            _text(key, f"{field} key {key!r}", allow_empty=True)
            _check_finite(item, f"{field}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_finite(item, f"{field}[{index}]")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _decision(raw: Any, field: str) -> Decision:
    """Validate one decision object against the row rules of §6.1."""
    if not isinstance(raw, dict):
        raise bad(field, f"must be an object, got {_json_type(raw)}")
    for key in raw:
        if key not in DECISION_KEYS:
            raise bad(f"{field}.{key}", f"unknown key; a decision has exactly the keys {list(DECISION_KEYS)}")
    for key in DECISION_KEYS:
        if key not in raw:
            raise bad(f"{field}.{key}", "is required")
    decision_id = _text(raw["id"], f"{field}.id")
    state = raw["state"]
    if isinstance(state, str):
        state_text = _text(state, f"{field}.state")
    elif isinstance(state, (dict, list)):
        if not state:
            raise bad(f"{field}.state", "must not be an empty object or array")
        _check_finite(state, f"{field}.state")
        state_text = _canonical(state)
    else:
        raise bad(f"{field}.state", f"must be a non-empty string, object or array, got {_json_type(state)}")
    question = _text(raw["question"], f"{field}.question")
    options = raw["options"]
    if not isinstance(options, list):
        raise bad(f"{field}.options", f"must be an array, got {_json_type(options)}")
    if not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
        raise bad(f"{field}.options", f"must have {MIN_OPTIONS} to {MAX_OPTIONS} items, got {len(options)}")
    option_ids: list[str] = []
    descriptions: list[str] = []
    for index, option in enumerate(options):
        where = f"{field}.options[{index}]"
        if not isinstance(option, dict):
            raise bad(where, f"must be an object, got {_json_type(option)}")
        for key in option:
            if key not in OPTION_KEYS:
                raise bad(f"{where}.{key}", f"unknown key; an option has exactly the keys {list(OPTION_KEYS)}")
        for key in OPTION_KEYS:
            if key not in option:
                raise bad(f"{where}.{key}", "is required")
        option_id = _text(option["id"], f"{where}.id")
        if option_id in option_ids:
            raise bad(f"{where}.id", f"duplicate option id {option_id!r}; option ids must be unique")
        option_ids.append(option_id)
        descriptions.append(_text(option["description"], f"{where}.description", allow_empty=True))
    return Decision(
        field=field,
        id=decision_id,
        state_key=_canonical(state),
        state_text=state_text,
        question=question,
        option_ids=tuple(option_ids),
        descriptions=tuple(descriptions),
    )


def parse_decisions(payload: dict[str, Any], max_shared: int) -> tuple[list[Decision], bool]:
    """Validate the top level: exactly one of decision / decisions. Returns (decisions, shared)."""
    for key in payload:
        if key not in ("decision", "decisions"):
            raise bad(key, "unknown top-level key; send exactly one of 'decision' or 'decisions'")
    if len(payload) != 1:
        raise bad("body", "must contain exactly one of 'decision' or 'decisions'")
    if "decision" in payload:
        return [_decision(payload["decision"], "decision")], False
    items = payload["decisions"]
    if not isinstance(items, list):
        raise bad("decisions", f"must be an array, got {_json_type(items)}")
    if not 1 <= len(items) <= max_shared:
        raise bad(
            "decisions",
            f"must have 1 to {max_shared} items (SEMIF_MAX_SHARED_DECISIONS), got {len(items)}; split the request",
        )
    decisions = [_decision(item, f"decisions[{index}]") for index, item in enumerate(items)]
    seen: set[str] = set()
    for decision in decisions:
        if decision.id in seen:
            raise bad(f"{decision.field}.id", f"duplicate decision id {decision.id!r}; ids must be unique")
        seen.add(decision.id)
        if decision.state_key != decisions[0].state_key:
            raise bad(
                f"{decision.field}.state",
                "must be identical to decisions[0].state; shared decisions share one state "
                "(send different states as separate requests)",
            )
    return decisions, True


# --------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class Prompt:
    """Token ids of one decision: the shared prefix and its own suffix."""

    prefix: list[int]
    suffix: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prefix + self.suffix

    @property
    def sha256(self) -> str:
        """sha256 of the prompt token ids as a compact JSON array, e.g. "[1,415,29871]"."""
        return hashlib.sha256(json.dumps(self.tokens, separators=(",", ":")).encode()).hexdigest()


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


class Engine:
    """One llama.cpp context with the letter readout; every evaluation holds `lock`."""

    def __init__(self, settings: Settings):
        import llama_cpp
        import numpy as np

        self._np = np
        self._llama_cpp = llama_cpp
        self.settings = settings
        self.lock = threading.Lock()
        self.model_info = {
            "file": settings.gguf_path.name,
            "bytes": settings.gguf_path.stat().st_size,
            "sha256": _sha256_file(settings.gguf_path),
        }
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(settings.gguf_path),
                n_ctx=settings.max_tokens,
                n_threads=settings.threads,
                n_threads_batch=settings.threads,
                n_gpu_layers=settings.n_gpu_layers,
                logits_all=False,  # logits for the last position only
                swa_full=True,  # keep the whole prefix in sliding-window caches so it can be reused
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise StartupError(f"cannot load {settings.gguf_path}: {exc}", EXIT_MODEL) from None
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n_vocab = self.llm.n_vocab()
        n_ctx_train = llama_cpp.llama_model_n_ctx_train(self.llm.model)
        if settings.max_tokens > n_ctx_train:
            raise StartupError(
                f"SEMIF_MAX_TOKENS={settings.max_tokens} exceeds the model's training context "
                f"{n_ctx_train}; set SEMIF_MAX_TOKENS <= {n_ctx_train}",
                EXIT_CONFIG,
            )
        self.head, self.tail, self.letter_texts, self.prompt_format = self._prompt_frame()
        self.letter_ids = self._letter_ids()

    # -- start-up checks ---------------------------------------------------------------

    def _prompt_frame(self) -> tuple[str, str, tuple[str, ...], str]:
        """Text around the user content, the letter texts, and the format name."""
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            return "", PLAIN_CUE, tuple(f" {letter}" for letter in LETTERS), "plain"
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        bos = self._token_text(self.llm.token_bos()) if self.llm.token_bos() >= 0 else ""
        eos = self._token_text(self.llm.token_eos()) if self.llm.token_eos() >= 0 else ""
        try:
            rendered = Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)(
                messages=[{"role": "user", "content": CHAT_MARKER}]
            ).prompt
        except Exception as exc:  # a template is third-party code: report any failure clearly
            raise StartupError(f"the GGUF chat template cannot render a user turn: {exc}", EXIT_MODEL) from None
        if rendered.count(CHAT_MARKER) != 1:
            raise StartupError("the GGUF chat template does not place the user content exactly once", EXIT_MODEL)
        head, tail = rendered.split(CHAT_MARKER)
        if bos and head.startswith(bos) and self._llama_cpp.llama_vocab_get_add_bos(self.vocab):
            head = head[len(bos) :]  # the tokenizer adds BOS itself
        return head, tail, tuple(LETTERS), "chat_template"

    def _letter_ids(self) -> list[int]:
        """The token each letter is emitted as right after the cue; each must be one token."""
        context = self.tokenize(self.tail, add_bos=False)
        ids: list[int] = []
        for letter, text in zip(LETTERS, self.letter_texts):
            tokens = self.tokenize(self.tail + text, add_bos=False)
            if len(tokens) != len(context) + 1 or tokens[: len(context)] != context:
                raise StartupError(
                    f"answer letter {letter!r} is not a single token after the cue {self.tail!r} "
                    f"(it tokenizes as {tokens[len(context):] if tokens[: len(context)] == context else tokens}); "
                    "this model cannot be read out with letters A..P",
                    EXIT_MODEL,
                )
            ids.append(tokens[-1])
        if len(set(ids)) != len(ids):
            raise StartupError(f"answer letters share token ids {ids}; the model cannot tell them apart", EXIT_MODEL)
        return ids

    # -- prompts -----------------------------------------------------------------------

    def _token_text(self, token: int) -> str:
        return self._llama_cpp.llama_vocab_get_text(self.vocab, token).decode("utf-8", errors="replace")

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        """Token ids of `text` (special=True parses control tokens written by the template)."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def check_plain_text(self, text: str, field: str) -> None:
        """Refuse text that the tokenizer would read as special/control tokens."""
        parsed = self.tokenize(text, add_bos=False, special=True)
        if parsed == self.tokenize(text, add_bos=False, special=False):
            return
        control = self._llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | self._llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
        names = [
            self._token_text(token)
            for token in parsed
            if self._llama_cpp.llama_vocab_get_attr(self.vocab, token) & control
        ]
        found = repr(names[0]) if names else "a special token"
        raise bad(field, f"contains the tokenizer's special token {found}; remove control tokens from the text")

    def prompts(self, decisions: list[Decision]) -> list[Prompt]:
        """Validate text and build each decision's prompt; the prefix is tokenized once."""
        first = decisions[0]
        self.check_plain_text(first.state_text, f"{first.field}.state")
        prefix = self.tokenize(self.head + PREFIX_TEMPLATE.format(state=first.state_text), add_bos=True)
        result = []
        for decision in decisions:
            self.check_plain_text(decision.question, f"{decision.field}.question")
            for index, description in enumerate(decision.descriptions):
                self.check_plain_text(description, f"{decision.field}.options[{index}].description")
            options = "".join(
                f"{letter}. {description}\n" for letter, description in zip(LETTERS, decision.descriptions)
            )
            suffix_text = SUFFIX_TEMPLATE.format(question=decision.question, options=options) + self.tail
            prompt = Prompt(prefix=prefix, suffix=self.tokenize(suffix_text, add_bos=False))
            limit = min(self.settings.max_request_tokens, self.settings.max_tokens)
            if len(prompt.tokens) > limit:
                raise bad(
                    decision.field,
                    f"prompt is {len(prompt.tokens)} tokens, over the limit of {limit} tokens "
                    "(SEMIF_MAX_REQUEST_TOKENS / SEMIF_MAX_TOKENS); prompts are never truncated — "
                    "shorten the state, question or option descriptions",
                )
            result.append(prompt)
        return result

    # -- evaluation (caller holds self.lock) ---------------------------------------------

    def _eval(self, tokens: list[int]) -> float:
        """Decode `tokens` after the current position; returns seconds spent in llama.cpp."""
        start = time.perf_counter()
        self.llm.eval(tokens)
        return time.perf_counter() - start

    def _truncate_to(self, n_tokens: int) -> None:
        """Drop every KV-cache cell after the first `n_tokens` positions (the shared prefix)."""
        memory = self._llama_cpp.llama_get_memory(self.llm.ctx)
        if not self._llama_cpp.llama_memory_seq_rm(memory, 0, n_tokens, -1):
            raise RuntimeError("this model's KV cache cannot drop a partial sequence; send decisions one by one")
        if self._llama_cpp.llama_memory_seq_pos_max(memory, 0) != n_tokens - 1:
            raise RuntimeError("the KV cache did not keep exactly the shared prefix")
        self.llm.n_tokens = n_tokens

    def _readout(self, decision: Decision) -> dict[str, Any]:
        """Letter logits at the last position → probabilities and allowed-token mass."""
        np = self._np
        pointer = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        if not pointer:
            raise RuntimeError("llama.cpp returned no logits for the last position")
        logits = np.ctypeslib.as_array(pointer, shape=(self.n_vocab,)).astype(np.float64)
        option_logits = logits[self.letter_ids[: len(decision.option_ids)]]
        if not (np.all(np.isfinite(logits))):
            raise RuntimeError("the model produced non-finite logits")
        scaled = option_logits / self.settings.temperature
        probabilities = np.exp(scaled - _logsumexp(np, scaled))
        mass = math.exp(_logsumexp(np, option_logits) - _logsumexp(np, logits))
        return {
            "option_ids": list(decision.option_ids),
            "probabilities": [float(p) for p in probabilities],
            "option_logits": [float(x) for x in option_logits],
            "allowed_token_mass": mass,
        }

    def score(self, decisions: list[Decision], prompts: list[Prompt], queue_s: float) -> tuple[list[dict], dict]:
        """Prefill the prefix once, then score each decision's suffix; returns results and timing."""
        start = time.perf_counter()
        self.llm.reset()
        prefix = prompts[0].prefix
        prefill_s = self._eval(prefix)
        forward_s = prefill_s
        results = []
        for index, (decision, prompt) in enumerate(zip(decisions, prompts)):
            step_start = time.perf_counter()
            if index:
                self._truncate_to(len(prefix))
            suffix_s = self._eval(prompt.suffix)
            forward_s += suffix_s
            result = {"id": decision.id, **self._readout(decision)}
            result.update(
                input_tokens=len(prompt.tokens),
                prompt_sha256=prompt.sha256,
                prompt_version=PROMPT_VERSION,
                temperature=self.settings.temperature,
                model=self.model_info,
            )
            step_s = time.perf_counter() - step_start
            result["timings"] = {
                "queue_ms": _ms(queue_s),
                "prefill_ms": 0.0,
                "suffix_ms": _ms(step_s),
                "forward_ms": _ms(suffix_s),
                "total_ms": _ms(step_s),
            }
            results.append(result)
        timing = {
            "queue_ms": _ms(queue_s),
            "prefill_ms": _ms(prefill_s),
            "forward_ms": _ms(forward_s),
            "total_ms": _ms(time.perf_counter() - start),
            "shared_prefix_tokens": len(prefix),
        }
        return results, timing


def _logsumexp(np: Any, values: Any) -> float:
    peak = float(np.max(values))
    return peak + math.log(float(np.sum(np.exp(values - peak))))


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --------------------------------------------------------------------------------------
# HTTP


def _error_payload(error: HttpError) -> dict[str, Any]:
    payload: dict[str, Any] = {"error": str(error)}
    if error.retryable:
        payload["retryable"] = True
    return payload


class SemifServer(ThreadingHTTPServer):
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
        """Load the model in the background; on failure stop the server with a clear message."""
        try:
            start = time.perf_counter()
            self.engine = Engine(self.settings)
            calibration = self.settings.calibration_path
            source = f"from {calibration}" if calibration.exists() else "(no calibration.json)"
            print(
                f"semif: model {self.engine.model_info['file']} loaded in {time.perf_counter() - start:.2f}s "
                f"(sha256 {self.engine.model_info['sha256']}, prompt format {self.engine.prompt_format}, "
                f"temperature {self.settings.temperature} {source})",
                file=sys.stderr,
                flush=True,
            )
        except StartupError as exc:
            self._fail(str(exc), exc.exit_code)
        except Exception as exc:  # any load failure must stop the process, not leave it unready forever
            traceback.print_exc(file=sys.stderr)
            self._fail(f"model load failed: {exc}", EXIT_MODEL)

    def _fail(self, message: str, exit_code: int) -> None:
        print(f"semif: refusing to start: {message}", file=sys.stderr, flush=True)
        self.exit_code = exit_code
        self.shutdown()


class Handler(BaseHTTPRequestHandler):
    """The SageMaker container contract: GET /ping, POST /invocations; errors are JSON."""

    protocol_version = "HTTP/1.1"
    server_version = "semif/1"
    timeout = SOCKET_TIMEOUT_S
    server: SemifServer

    def setup(self) -> None:
        """Headers and body are separate writes: without TCP_NODELAY, Nagle plus a keep-alive
        client's delayed ACK add ~40 ms to every answer."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"semif: {self.address_string()} {format % args}\n")

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
                    "(SEMIF_MAX_IN_FLIGHT); retry with backoff",
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
            raise bad("body", "is empty; send a JSON object with 'decision' or 'decisions'")
        if length > limit:
            raise HttpError(413, f"body: {length} bytes is over the limit of {limit} bytes (SEMIF_MAX_BODY_BYTES)")
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
        decisions, shared = parse_decisions(parse_body(body), settings.max_shared_decisions)
        prompts = engine.prompts(decisions)
        waited = time.perf_counter()
        if not engine.lock.acquire(timeout=settings.queue_timeout_s):
            raise HttpError(
                503, f"the model stayed busy for {settings.queue_timeout_s}s (SEMIF_QUEUE_TIMEOUT_S)", retryable=True
            )
        try:
            results, timing = engine.score(decisions, prompts, time.perf_counter() - waited)
        finally:
            engine.lock.release()
        total_ms = _ms(time.perf_counter() - received)
        if shared:
            timing["total_ms"] = total_ms
            return {"results": results, "timing": timing}
        result = results[0]
        result["timings"].update(
            prefill_ms=timing["prefill_ms"],
            forward_ms=timing["forward_ms"],
            total_ms=total_ms,
        )
        return {"result": result}


def main(argv: list[str]) -> int:
    """Validate the environment, listen, load the model in the background, serve until stopped."""
    if argv not in ([], ["serve"]):  # SageMaker starts the container as `<entrypoint> serve`
        print(
            f"semif: refusing to start: unexpected arguments {argv}; configure with SEMIF_* variables",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        settings = load_settings(os.environ)
    except StartupError as exc:
        print(f"semif: refusing to start: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    try:
        server = SemifServer(settings)
    except OSError as exc:
        print(
            f"semif: refusing to start: cannot listen on {settings.host}:{settings.port} ({exc}); "
            "set SEMIF_HOST/SEMIF_PORT to a free address",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_CONFIG
    host, port = server.server_address[:2]
    print(f"semif: listening on http://{host}:{port} (model {settings.gguf_path}, loading)", file=sys.stderr)
    # SIGTERM (docker stop, SageMaker, the local backend) ends serve_forever cleanly with exit code 0
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    threading.Thread(target=server.load, name="semif-load", daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return server.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
