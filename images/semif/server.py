#!/usr/bin/env python3
"""SemIf decision adapter: scores multiple-choice decisions with a GGUF model (DESIGN §6.1).

This file is the container's entrypoint and, unchanged, the local backend's model server.
It speaks the SageMaker container contract (``GET /ping``, ``POST /invocations``) through the
shared ``images/common/sagemaker_http.py``, is configured only by ``SEMIF_*`` environment
variables, and depends on the standard library, numpy and llama-cpp-python only (it must not
import ``tasks`` or ``validation``).

Readout: the options are shown to the model as letters A..P (ids are never shown), the model
runs one forward pass over the prompt with logits for the last position only, and the
letter logits give ``probabilities = softmax(option_logits / T)``. No token is generated.
Shared decisions prefill the common state prefix once and score each decision's suffix
from that KV-cache state; across requests a bounded prefix cache (prefix_cache.py) keeps evaluated
prefixes, so a request whose state shares one restores it and evaluates only its new tokens.

Exit codes: 0 clean stop, 2 bad configuration (environment, model path, calibration.json),
3 the model could not be loaded or is unsuitable (e.g. a letter is not a single token).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# The image copies sagemaker_http.py and decision_prompt.py beside this file; a checkout keeps them in images/common.
# prefix_cache.py is beside it in both; a process that loads this file by path (bench, tests) has this folder to add.
_HERE = Path(__file__).resolve().parent
if not (_HERE / "sagemaker_http.py").is_file():
    sys.path.insert(0, str(_HERE.parent / "common"))
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from decision_prompt import LETTERS, PROMPT_VERSION, canonical_json, prefix_text, suffix_text  # noqa: E402 — needs sys.path above
from prefix_cache import PrefixCache  # noqa: E402 — needs sys.path above
from sagemaker_http import (  # noqa: E402 — needs sys.path above
    EXIT_CONFIG,
    EXIT_MODEL,
    HttpSettings,
    ModelService,
    StartupError,
    available_cpus,
    bad,
    env_int,
    json_string,
    json_type,
    model_turn,
    parse_json_object,
    read_http_settings,
    read_serving_id,
    read_temperature,
    serve,
    sha256_file,
    to_ms,
)

MIN_OPTIONS, MAX_OPTIONS = 2, len(LETTERS)
DECISION_KEYS = ("id", "state", "question", "options")
OPTION_KEYS = ("id", "description")
# the optional top-level key that asks for a request's prefix-cache report (the gate's cold-vs-warm check): `cold`
# evaluates the whole prefix without restoring a cached state (and keeps it as usual), `warm` uses the cache as usual
PREFIX_CACHE_KEY, PREFIX_CACHE_MODES = "prefix_cache", ("cold", "warm")
CHAT_MARKER = "\ue000SEMIF-CONTENT\ue000"  # private-use text, split point of the chat template
PLAIN_CUE = "\nAnswer:"  # without a chat template the next token is " A".." P"
# llama.cpp's batch sizes (llama-cpp-python's defaults, stated so the determinism profile can name them): logits can
# differ in the last bits between batch shapes, so they are part of what produced a release's numbers
N_BATCH = N_UBATCH = 512
# The prefix cache's default bounds: gemma-3-270m's state of a 1,114-token prefix is 11.3 MB, so 16 such states fit in
# 256 MiB; a model whose single state is larger skips the cache (today's cost), never fails
PREFIX_CACHE_BYTES = 256 << 20
PREFIX_CACHE_ENTRIES = 16


# --------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Settings:
    """Validated SEMIF_* environment."""

    model_path: Path  # the .gguf file
    calibration_path: Path
    temperature: float
    threads: int
    n_gpu_layers: int
    max_tokens: int
    max_request_tokens: int
    max_shared_decisions: int
    prefix_cache_bytes: int  # 0: no prefix cache
    prefix_cache_entries: int
    http: HttpSettings
    serving_id: str | None = None  # echoed in every result's `model` (SHIPLIFT_SERVING_ID)


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


def load_settings(env: Mapping[str, str]) -> Settings:
    """Validate the whole SEMIF_* environment; raise StartupError on the first bad value."""
    threads = env_int(env, "SEMIF_THREADS", available_cpus(), 1, 1024)
    n_gpu_layers = env_int(env, "SEMIF_N_GPU_LAYERS", 0, -1, 100_000)
    max_tokens = env_int(env, "SEMIF_MAX_TOKENS", 4096, 64, 1_048_576)
    max_request_tokens = env_int(env, "SEMIF_MAX_REQUEST_TOKENS", max_tokens, 1, max_tokens)
    max_shared = env_int(env, "SEMIF_MAX_SHARED_DECISIONS", 16, 1, 4096)
    cache_bytes = env_int(env, "SEMIF_PREFIX_CACHE_BYTES", PREFIX_CACHE_BYTES, 0, 1 << 40)
    cache_entries = env_int(env, "SEMIF_PREFIX_CACHE_ENTRIES", PREFIX_CACHE_ENTRIES, 0, 4096)
    http = read_http_settings(env, "SEMIF")
    model_path = _find_gguf(env)
    calibration_path = model_path.parent / "calibration.json"
    if env.get("SEMIF_GGUF_PATH") is None:
        calibration_path = Path(env.get("SEMIF_MODEL_DIR", "/opt/ml/model")) / "calibration.json"
    return Settings(
        model_path=model_path,
        calibration_path=calibration_path,
        temperature=read_temperature(calibration_path),
        threads=threads,
        n_gpu_layers=n_gpu_layers,
        max_tokens=max_tokens,
        max_request_tokens=max_request_tokens,
        max_shared_decisions=max_shared,
        prefix_cache_bytes=cache_bytes,
        prefix_cache_entries=cache_entries,
        http=http,
        serving_id=read_serving_id(env),
    )


# --------------------------------------------------------------------------------------
# Request validation


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


def _text(value: Any, field: str, *, allow_empty: bool = False) -> str:
    """A string that is valid Unicode (and non-empty unless allowed)."""
    text = json_string(value, field)
    if not allow_empty and not text.strip():
        raise bad(field, "must be a non-empty string")
    return text


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


def _exact_keys(raw: dict, keys: tuple[str, ...], field: str, noun: str) -> None:
    """Reject an unknown or a missing key of a request object (`noun`: "a decision", "an option")."""
    for key in raw:
        if key not in keys:
            raise bad(f"{field}.{key}", f"unknown key; {noun} has exactly the keys {list(keys)}")
    for key in keys:
        if key not in raw:
            raise bad(f"{field}.{key}", "is required")


def _state_text(state: Any, field: str) -> str:
    """The state as the prompt shows it: a non-empty string as is, a non-empty object or array as canonical JSON."""
    if isinstance(state, str):
        return _text(state, field)
    if not isinstance(state, (dict, list)):
        raise bad(field, f"must be a non-empty string, object or array, got {json_type(state)}")
    if not state:
        raise bad(field, "must not be an empty object or array")
    _check_finite(state, field)
    return canonical_json(state)


def _options(options: Any, field: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Validate a decision's options: their ids (unique) and their descriptions, in order."""
    if not isinstance(options, list):
        raise bad(field, f"must be an array, got {json_type(options)}")
    if not MIN_OPTIONS <= len(options) <= MAX_OPTIONS:
        raise bad(field, f"must have {MIN_OPTIONS} to {MAX_OPTIONS} items, got {len(options)}")
    option_ids: list[str] = []
    descriptions: list[str] = []
    for index, option in enumerate(options):
        where = f"{field}[{index}]"
        if not isinstance(option, dict):
            raise bad(where, f"must be an object, got {json_type(option)}")
        _exact_keys(option, OPTION_KEYS, where, "an option")
        option_id = _text(option["id"], f"{where}.id")
        if option_id in option_ids:
            raise bad(f"{where}.id", f"duplicate option id {option_id!r}; option ids must be unique")
        option_ids.append(option_id)
        descriptions.append(_text(option["description"], f"{where}.description", allow_empty=True))
    return tuple(option_ids), tuple(descriptions)


def _decision(raw: Any, field: str) -> Decision:
    """Validate one decision object against the row rules of §6.1."""
    if not isinstance(raw, dict):
        raise bad(field, f"must be an object, got {json_type(raw)}")
    _exact_keys(raw, DECISION_KEYS, field, "a decision")
    decision_id = _text(raw["id"], f"{field}.id")
    state_text = _state_text(raw["state"], f"{field}.state")
    question = _text(raw["question"], f"{field}.question")
    option_ids, descriptions = _options(raw["options"], f"{field}.options")
    return Decision(
        field=field,
        id=decision_id,
        state_key=canonical_json(raw["state"]),
        state_text=state_text,
        question=question,
        option_ids=option_ids,
        descriptions=descriptions,
    )


def parse_decisions(payload: dict[str, Any], max_shared: int) -> tuple[list[Decision], bool]:
    """Validate the top level: exactly one of decision / decisions (beside an optional `prefix_cache`, read by
    `prefix_cache_mode`). Returns (decisions, shared)."""
    for key in payload:
        if key not in ("decision", "decisions", PREFIX_CACHE_KEY):
            raise bad(key, f"unknown top-level key; send exactly one of 'decision' or 'decisions' (and optionally "
                           f"'{PREFIX_CACHE_KEY}')")
    if ("decision" in payload) == ("decisions" in payload):
        raise bad("body", "must contain exactly one of 'decision' or 'decisions'")
    if "decision" in payload:
        return [_decision(payload["decision"], "decision")], False
    items = payload["decisions"]
    if not isinstance(items, list):
        raise bad("decisions", f"must be an array, got {json_type(items)}")
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


def prefix_cache_mode(payload: dict[str, Any]) -> str | None:
    """The request's `prefix_cache` ("cold" or "warm"), or None when it names none (no prefix-cache report)."""
    if PREFIX_CACHE_KEY not in payload:
        return None
    mode = payload[PREFIX_CACHE_KEY]
    if mode not in PREFIX_CACHE_MODES:
        raise bad(PREFIX_CACHE_KEY, f"must be one of {list(PREFIX_CACHE_MODES)}, got {json.dumps(mode)}")
    return mode


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


class Engine:
    """One llama.cpp context with the letter readout; every evaluation holds `lock`."""

    def __init__(self, settings: Settings):
        import llama_cpp

        self._np = np
        self._llama_cpp = llama_cpp
        self.settings = settings
        self.lock = threading.Lock()
        self.model_info = {
            "file": settings.model_path.name,
            "bytes": settings.model_path.stat().st_size,
            "sha256": sha256_file(settings.model_path),
            **({"serving_id": settings.serving_id} if settings.serving_id else {}),
        }
        try:
            self.llm = llama_cpp.Llama(
                model_path=str(settings.model_path),
                n_ctx=settings.max_tokens,
                n_threads=settings.threads,
                n_threads_batch=settings.threads,
                n_gpu_layers=settings.n_gpu_layers,
                n_batch=N_BATCH,
                n_ubatch=N_UBATCH,
                logits_all=False,  # logits for the last position only
                swa_full=True,  # keep the whole prefix in sliding-window caches so it can be reused
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise StartupError(f"cannot load {settings.model_path}: {exc}", EXIT_MODEL) from None
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
        self.profile = determinism_profile(settings)
        self.tokens_evaluated = 0  # by llama.cpp since start-up (the prefix cache's saving shows against it)
        # A sliding-window model (Gemma 3): llama.cpp writes a state without the window's masked cells, so a restored
        # prefix lies in the KV cache in another layout than one just evaluated, and its suffix's option logits differed
        # (by up to 0.40 on Gemma-3-270M's 1,114-token agent state; the model's logits move that much with any change
        # of evaluation order). Every prefix such a model evaluates is therefore written and read back before its
        # suffix (`_read_back`), so cached or not each suffix sees one layout and answers bit for bit alike; and its
        # cache reuses a state only for exactly the same prefix (cut back, a state lacks the window's earlier cells;
        # grown, its new tokens would be evaluated in another layout: 0.2 logits off).
        self.sliding_window = llama_cpp.llama_model_n_swa(self.llm.model) > 0
        # reusing a state is worth it only when it holds some of the state, not just the prompt's fixed opening
        self.cache = PrefixCache(settings.prefix_cache_bytes, settings.prefix_cache_entries,
                                 min_shared=len(self.tokenize(self.head + prefix_text(""), add_bos=True)),
                                 exact_only=self.sliding_window)
        self.cache_off = None if self.cache.enabled else "SEMIF_PREFIX_CACHE_BYTES or SEMIF_PREFIX_CACHE_ENTRIES is 0"

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
        for letter, text in zip(LETTERS, self.letter_texts, strict=True):
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
        prefix = self.tokenize(self.head + prefix_text(first.state_text), add_bos=True)
        result = []
        for decision in decisions:
            self.check_plain_text(decision.question, f"{decision.field}.question")
            for index, description in enumerate(decision.descriptions):
                self.check_plain_text(description, f"{decision.field}.options[{index}].description")
            suffix = suffix_text(decision.question, decision.descriptions) + self.tail
            prompt = Prompt(prefix=prefix, suffix=self.tokenize(suffix, add_bos=False))
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
        self.tokens_evaluated += len(tokens)
        return time.perf_counter() - start

    def _memory(self) -> Any:
        return self._llama_cpp.llama_get_memory(self.llm.ctx)

    def _prefill(self, prefix: list[int], *, cold: bool = False) -> tuple[float, int]:
        """Bring the context to exactly `prefix`: restore the cached state sharing most of it (unless `cold`), evaluate
        the rest, and keep the result for later requests; (seconds, tokens reused from the cache)."""
        start = time.perf_counter()
        self.llm.reset()
        reused = 0
        if self.cache.enabled and not cold:
            reused = self._restore(prefix)
            self.cache.count(reused)
        if reused < len(prefix):
            self._eval(prefix[reused:])
            state = self._read_back() if self.sliding_window else None
            if self.cache.enabled:
                self._keep(prefix, state)
        return time.perf_counter() - start, reused

    def _restore(self, prefix: list[int]) -> int:
        """Load the cached state sharing the longest prefix with `prefix`, cut to what they share; the tokens it
        holds (0 when nothing is cached or the state cannot be loaded: the request then pays the whole prefix)."""
        found = self.cache.lookup(prefix)
        if found is None:
            return 0
        try:
            self._load_state(found.state, len(found.tokens), "the cached state")
            if found.shared < len(found.tokens):
                self._truncate_to(found.shared)
        except RuntimeError:  # a state this context cannot take back: pay the prefix as if nothing was cached
            self._llama_cpp.llama_memory_clear(self._memory(), True)
            self.llm.reset()
            return 0
        self.llm.input_ids[: found.shared] = prefix[: found.shared]
        return found.shared

    def _state(self) -> bytes:
        """A copy of sequence 0's KV state as llama.cpp writes it."""
        llama_cpp = self._llama_cpp
        size = llama_cpp.llama_state_seq_get_size(self.llm.ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self.llm.ctx, buffer, size, 0)
        return ctypes.string_at(buffer, written)

    def _read_back(self) -> bytes:
        """Write the context's state and load it again, so that the KV cache holds it in the layout a restored state
        has (a sliding-window model's masked cells dropped, the rest in position order); the state written."""
        state, n_tokens = self._state(), self.llm.n_tokens
        self._llama_cpp.llama_memory_clear(self._memory(), True)
        self._load_state(state, n_tokens, "back the state it wrote")
        return state

    def _load_state(self, state: bytes, n_tokens: int, what: str) -> None:
        """Load `state` (as `_state` wrote it, holding `n_tokens`) into sequence 0; RuntimeError naming `what` when
        llama.cpp does not take all of it."""
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if self._llama_cpp.llama_state_seq_set_data(self.llm.ctx, buffer, len(state), 0) != len(state):
            raise RuntimeError(f"llama.cpp did not load {what}")
        self.llm.n_tokens = n_tokens

    def _keep(self, prefix: list[int], state: bytes | None) -> None:
        """Keep the state of exactly `prefix` (`state`, when already written) in the cache, unless it is over the
        cache's byte bound."""
        size = len(state) if state is not None else self._llama_cpp.llama_state_seq_get_size(self.llm.ctx, 0)
        if not self.cache.admits(size) or self.cache.holds(prefix):
            return
        self.cache.store(prefix, state if state is not None else self._state())

    def _truncate_to(self, n_tokens: int) -> None:
        """Drop every KV-cache cell after the first `n_tokens` positions (the shared prefix)."""
        memory = self._memory()
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

    def score(self, decisions: list[Decision], prompts: list[Prompt], queue_s: float, *,
              cold: bool = False) -> tuple[list[dict], dict]:
        """Prefill the prefix once (`cold`: evaluated whole, no cached state restored), then score each decision's
        suffix; returns results and timing."""
        start = time.perf_counter()
        prefix = prompts[0].prefix
        prefill_s, reused = self._prefill(prefix, cold=cold)
        forward_s = prefill_s
        results = []
        for index, (decision, prompt) in enumerate(zip(decisions, prompts, strict=True)):
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
                "queue_ms": to_ms(queue_s),
                "prefill_ms": 0.0,
                "suffix_ms": to_ms(step_s),
                "forward_ms": to_ms(suffix_s),
                "total_ms": to_ms(step_s),
            }
            results.append(result)
        timing = {
            "queue_ms": to_ms(queue_s),
            "prefill_ms": to_ms(prefill_s),
            "forward_ms": to_ms(forward_s),
            "total_ms": to_ms(time.perf_counter() - start),
            "shared_prefix_tokens": len(prefix),
            "reused_prefix_tokens": reused,
        }
        return results, timing


def determinism_profile(settings: Settings) -> dict[str, Any]:
    """What shapes this server's arithmetic besides the model: llama.cpp's build (version and the CPU features it
    uses), threads, batch sizes, offload, context and the prefix cache; a release records it (the GGUF family's
    `determinism_profile`), `/metrics` shows it as `semif_build_info`."""
    import llama_cpp

    return {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip(),
        "threads": settings.threads,
        "n_batch": N_BATCH,
        "n_ubatch": N_UBATCH,
        "n_gpu_layers": settings.n_gpu_layers,
        "n_ctx": settings.max_tokens,
        "prefix_cache_bytes": settings.prefix_cache_bytes,
        "prefix_cache_entries": settings.prefix_cache_entries,
        # a sliding-window model's prefix is written and read back before its suffix (one KV layout, cached or not)
        "sliding_window_prefix": "read_back",
    }


def _logsumexp(np: Any, values: Any) -> float:
    peak = float(np.max(values))
    return peak + math.log(float(np.sum(np.exp(values - peak))))


# --------------------------------------------------------------------------------------
# Serving


def _loaded(settings: Settings, engine: Engine, seconds: float) -> str:
    """The start-up log line: which model, its digest, prompt format and temperature source."""
    calibration = settings.calibration_path
    source = f"from {calibration}" if calibration.exists() else "(no calibration.json)"
    cache = engine.cache
    reuse = (f"prefix cache {cache.max_bytes} bytes, {cache.max_entries} entries" if cache.enabled else
             f"prefix cache off ({engine.cache_off})")
    return (
        f"model {engine.model_info['file']} loaded in {seconds:.2f}s "
        f"(sha256 {engine.model_info['sha256']}, prompt format {engine.prompt_format}, "
        f"temperature {settings.temperature} {source}; {reuse})"
    )


def answer(settings: Settings, engine: Engine, body: bytes, received: float) -> dict[str, Any]:
    """Score one POST /invocations body: {"result": ...} for a decision, {"results", "timing"} for shared ones, and
    {"prefix_cache": ...} beside them when the request names a `prefix_cache` mode."""
    # NaN parses here and is refused by field, naming where it stands
    payload = parse_json_object(body, parse_constant=float)
    decisions, shared = parse_decisions(payload, settings.max_shared_decisions)
    mode = prefix_cache_mode(payload)
    prompts = engine.prompts(decisions)
    waited = time.perf_counter()
    with model_turn(engine.lock, settings.http):
        results, timing = engine.score(decisions, prompts, time.perf_counter() - waited, cold=mode == "cold")
    total_ms = to_ms(time.perf_counter() - received)
    # asked for: whether the endpoint keeps prefixes (why not, when it does not) and what this request restored
    report = {} if mode is None else {PREFIX_CACHE_KEY: {
        "mode": mode, "enabled": engine.cache.enabled, "off": engine.cache_off,
        "reused_prefix_tokens": timing["reused_prefix_tokens"], "shared_prefix_tokens": timing["shared_prefix_tokens"]}}
    if shared:
        timing["total_ms"] = total_ms
        return {"results": results, "timing": timing, **report}
    result = results[0]
    result["timings"].update(
        prefill_ms=timing["prefill_ms"],
        forward_ms=timing["forward_ms"],
        total_ms=total_ms,
    )
    return {"result": result, **report}


CACHE_METRICS = (  # (the cache's stats key, metric name, type, help)
    ("bytes", "semif_prefix_cache_bytes", "gauge", "Bytes of evaluated states the prefix cache holds."),
    ("max_bytes", "semif_prefix_cache_max_bytes", "gauge", "The prefix cache's byte bound (SEMIF_PREFIX_CACHE_BYTES)."),
    ("entries", "semif_prefix_cache_entries", "gauge", "Evaluated states the prefix cache holds."),
    ("max_entries", "semif_prefix_cache_max_entries", "gauge",
     "The prefix cache's entry bound (SEMIF_PREFIX_CACHE_ENTRIES)."),
    ("hits", "semif_prefix_cache_hits_total", "counter", "Requests that restored a cached prefix."),
    ("misses", "semif_prefix_cache_misses_total", "counter", "Requests that found no cached prefix to reuse."),
    ("tokens_saved", "semif_prefix_cache_tokens_saved_total", "counter",
     "Prompt tokens restored from the cache instead of evaluated."),
    ("evictions", "semif_prefix_cache_evictions_total", "counter", "States dropped to keep the cache within bounds."),
    ("too_large", "semif_prefix_cache_too_large_total", "counter",
     "States not cached because one alone exceeds the byte bound."),
)


def _label(value: Any) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metrics(settings: Settings, engine: Engine) -> str:
    """`GET /metrics` in the Prometheus text format: the prefix cache, tokens evaluated, the determinism profile."""
    stats = engine.cache.stats()
    lines = []
    for key, name, kind, text in CACHE_METRICS:
        lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", f"{name} {stats[key]}"]
    lines += ["# HELP semif_tokens_evaluated_total Prompt tokens llama.cpp evaluated since start-up.",
              "# TYPE semif_tokens_evaluated_total counter", f"semif_tokens_evaluated_total {engine.tokens_evaluated}"]
    labels = ",".join(f'{key}="{_label(value)}"' for key, value in engine.profile.items())
    lines += ["# HELP semif_build_info What produced these numbers: llama.cpp build, threads, batch sizes, cache.",
              "# TYPE semif_build_info gauge", f"semif_build_info{{{labels}}} 1"]
    return "\n".join(lines) + "\n"


SERVICE = ModelService(
    name="semif",
    prefix="SEMIF",
    server_version="semif/1",
    empty_body="is empty; send a JSON object with 'decision' or 'decisions'",
    load_settings=load_settings,
    load_engine=Engine,
    loaded=_loaded,
    answer=answer,
    metrics=metrics,
)


if __name__ == "__main__":
    sys.exit(serve(SERVICE, sys.argv[1:]))
