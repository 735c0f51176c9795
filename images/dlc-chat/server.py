#!/usr/bin/env python3
"""Local stand-in of the llama.cpp DLC's default chat path (DESIGN §6.2).

On AWS this path has no image of ours: the llama.cpp Deep Learning Container starts
llama-server on the first ``*.gguf`` under /opt/ml/model, configured by ``SM_LLAMA_CPP_*``
variables, and forwards ``POST /invocations`` to its OpenAI-compatible
``/v1/chat/completions``. Locally shiplift runs this file instead, so the same request reaches
the same kind of server without a container: a front process speaks the SageMaker container
contract through the shared ``images/common/sagemaker_http.py`` (``GET /ping``, bounded
admission, strict framing, JSON errors, SIGTERM) and forwards each checked request to one
child, llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``) on a free
loopback port. The child answers ``/v1/chat/completions`` for real (chat template from the
GGUF, sampling, ``top_logprobs``), which is what lets the unmodified ``openai`` client and the
gate (letters' ``top_logprobs`` of one generated token) run against it.

Why a front at all: llama-cpp-python's server is not llama-server. It accepts fields and
values that llama-server or SageMaker would treat differently (``n`` is silently dropped,
``max_tokens`` past the context is silently cut), and it has no ``/ping`` or ``/invocations``.
The front refuses those requests with a 400 that names the field, so a request that works here
works on the endpoint. ``stream: true`` is passed through as the child's server-sent events
(``InvokeEndpointWithResponseStream`` on the endpoint).

Differences from llama-server that the front makes up for:

- ``--logits_all True`` is always passed: llama-cpp-python needs every position's logits to
  return logprobs, llama-server does not.
- A GGUF without ``tokenizer.chat_template`` and no ``SM_LLAMA_CPP_CHAT_TEMPLATE`` is refused:
  llama-cpp-python would silently fall back to the llama-2 format (Gemma then answers with
  empty text); llama-server names its built-in templates differently, so the supported names
  are mapped to llama-cpp-python's ``chat_format`` names (``CHAT_TEMPLATES``).
- ``SM_LLAMA_CPP_HF_REPO``/``HF_FILE`` are refused: the stand-in never uses the network, and
  shiplift's SageMaker models run with EnableNetworkIsolation.

If the child dies after it was ready, the front stops too (exit 3; ``/ping`` answers 503 until
it is gone): the local supervisor restarts dead copies, and a front that stayed up would only
answer 502s. The child runs in its own process group and gets SIGTERM if the front dies; SIGTERM
to the front stops the child (terminate, wait, kill) and exits 0.

Standard library only (it must not import ``tasks`` or ``validation``); llama-cpp-python is
needed in the child and its settings model is read once to keep the child's environment clean.

Exit codes: 0 clean stop, 2 bad configuration (environment, model path, not a GGUF file),
3 the model cannot be served (no chat template, the child failed or was not ready in time,
or it died later).
"""

from __future__ import annotations

import collections
import ctypes
import http.client
import json
import math
import mmap
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The image copies sagemaker_http.py and chat_templates.py beside this file; a checkout keeps them in images/common.
_HERE = Path(__file__).resolve().parent
if not (_HERE / "sagemaker_http.py").is_file():
    sys.path.insert(0, str(_HERE.parent / "common"))

from chat_templates import inferred_template  # noqa: E402 — needs sys.path above (the architecture's template)
from sagemaker_http import (  # noqa: E402 — needs sys.path above
    EXIT_MODEL,
    HttpError,
    HttpSettings,
    ModelService,
    StartupError,
    Streamed,
    bad,
    env_float,
    json_string,
    json_type,
    parse_json_object,
    read_http_settings,
    read_serving_id,
    serve,
)

NAME = "dlc-chat"
PREFIX = "DLC_CHAT"
SM_PREFIX = "SM_LLAMA_CPP_"
CHILD_HOST = "127.0.0.1"
DEFAULT_CTX_SIZE = 4096  # llama-server's default --ctx-size; set SM_LLAMA_CPP_CTX_SIZE to match the endpoint
INT_MAX = 2**31 - 1
STOP_DEADLINE_S = 5.0  # SIGTERM to the child, then SIGKILL after this
READY_PROBE_TIMEOUT_S = 2.0  # one GET /v1/models while waiting for the child
READY_POLL_S = 0.05
TAIL_LINES = 40  # of the child's output, quoted when it fails to start
MAX_EVENT_LINE_BYTES = 1 << 20  # one server-sent event line of the child's stream (a chunk with its top_logprobs)

# llama-server's built-in template names (--chat-template) → llama-cpp-python's chat_format names.
CHAT_TEMPLATES = {
    "chatml": "chatml",
    "gemma": "gemma",
    "llama2": "llama-2",
    "llama3": "llama-3",
    "mistral-v1": "mistral-instruct",
    "zephyr": "zephyr",
    "vicuna": "vicuna",
    "openchat": "openchat",
}
TEMPLATE_KEYS = ("tokenizer.chat_template", "general.architecture", "tokenizer.ggml.model")
FLASH_ATTN = {"on": True, "off": False, "auto": False}  # auto: off on this CPU build (logged)

# The SM_LLAMA_CPP_* variables the stand-in supports, as the DLC gets them:
# variable → (llama_cpp.server setting(s) it sets, kind of value).
OPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "SM_LLAMA_CPP_CTX_SIZE": (("n_ctx",), "int>=1"),
    "SM_LLAMA_CPP_THREADS": (("n_threads", "n_threads_batch"), "int>=1"),
    "SM_LLAMA_CPP_N_GPU_LAYERS": (("n_gpu_layers",), "int>=-1"),
    "SM_LLAMA_CPP_BATCH_SIZE": (("n_batch",), "int>=1"),
    "SM_LLAMA_CPP_UBATCH_SIZE": (("n_ubatch",), "int>=1"),
    "SM_LLAMA_CPP_FLASH_ATTN": (("flash_attn",), "on|off|auto"),
    "SM_LLAMA_CPP_CHAT_TEMPLATE": (("chat_format",), "chat-template"),
    "SM_LLAMA_CPP_ALIAS": (("model_alias",), "string"),
}
KINDS = {
    "int>=1": f"an integer in [1, {INT_MAX}]",
    "int>=-1": f"an integer in [-1, {INT_MAX}] (-1 = all layers)",
    "on|off|auto": "one of on, off, auto",
    "chat-template": f"one of llama-server's template names {', '.join(CHAT_TEMPLATES)}",
    "string": "a non-empty string without surrounding spaces",
}
NETWORK_OPTIONS = ("SM_LLAMA_CPP_HF_REPO", "SM_LLAMA_CPP_HF_FILE")

# The request body: top-level keys forwarded to the child; anything else is refused by name.
REQUEST_KEYS = (
    "model", "messages", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "logprobs",
    "top_logprobs", "seed", "stream", "presence_penalty", "frequency_penalty", "repeat_penalty", "response_format",
)
MESSAGE_KEYS = ("role", "content")
ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 256
MAX_STOP = 4  # as the OpenAI API
MAX_TOP_LOGPROBS = 20
# The sampling settings and the range each must lie in: (key, low, high).
SAMPLING_NUMBERS = (
    ("temperature", 0.0, 1e6),
    ("top_p", 0.0, 1.0),
    ("min_p", 0.0, 1.0),
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
    ("repeat_penalty", 0.0, 1e6),
)
SAMPLING_INTEGERS = (("top_k", 0, INT_MAX), ("seed", 0, 2**32 - 1))
RESPONSE_FORMATS = ("text", "json_object")


# --------------------------------------------------------------------------------------
# GGUF header (standard library only: the key/value block before the tensors)

GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """The file's GGUF header cannot be read."""


def read_gguf_metadata(path: Path, wanted: Callable[[str], bool]) -> dict[str, Any]:
    """The scalar and string metadata values whose key `wanted` accepts (arrays are skipped, never decoded).

    Raises StartupError (EXIT_CONFIG) for a file that is not GGUF, GgufError for a broken header."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
        if magic != GGUF_MAGIC:
            raise StartupError(
                f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); "
                "the model must be a llama.cpp .gguf file"
            )
        handle.seek(0)
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                return _parse_gguf(data, wanted)
            except struct.error as exc:
                raise GgufError(f"the header ends early ({exc})") from None


class _GgufReader:
    """Reads a GGUF header's values in `order` (struct's byte-order prefix) from `offset` on, or skips them."""

    def __init__(self, data: Any, order: str, offset: int):
        self.data, self.order, self.offset = data, order, offset

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(self.order + fmt, self.data, self.offset)[0]
        self.offset += struct.calcsize(self.order + fmt)
        return value

    def string(self) -> bytes:
        length = self.take("Q")
        if self.offset + length > len(self.data):
            raise GgufError("a string runs past the end of the file")
        value = self.data[self.offset : self.offset + length]
        self.offset += length
        return value

    def skip(self, kind: int) -> None:
        if kind in _SCALARS:
            self.offset += struct.calcsize(self.order + _SCALARS[kind])
        elif kind == _STRING:
            length = self.take("Q")  # (not `self.offset += self.take(...)`: it adds to the offset before the read)
            self.offset += length
        elif kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            if item in _SCALARS:
                self.offset += count * struct.calcsize(self.order + _SCALARS[item])
            else:
                for _ in range(count):
                    self.skip(item)
        else:
            raise GgufError(f"unknown metadata value type {kind}")
        if self.offset > len(self.data):
            raise GgufError("the metadata runs past the end of the file")


def _parse_gguf(data: Any, wanted: Callable[[str], bool]) -> dict[str, Any]:
    (version,) = struct.unpack_from("<I", data, 4)
    order = "<"
    if version > 0xFFFF:  # a big-endian file
        order = ">"
        (version,) = struct.unpack_from(">I", data, 4)
    if version not in (2, 3):
        raise GgufError(f"GGUF version {version} is not supported (llama.cpp reads versions 2 and 3)")
    _, kv_count = struct.unpack_from(order + "QQ", data, 8)
    reader, found = _GgufReader(data, order, offset=24), {}
    try:
        for _ in range(kv_count):
            key = reader.string().decode("utf-8", errors="replace")
            kind = reader.take("I")
            if wanted(key) and kind in _SCALARS:
                found[key] = reader.take(_SCALARS[kind])
            elif wanted(key) and kind == _STRING:
                found[key] = reader.string().decode("utf-8", errors="replace")
            else:
                reader.skip(kind)
    except struct.error as exc:
        raise GgufError(f"the header ends early ({exc})") from None
    return found


# --------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Settings:
    """Validated DLC_CHAT_* and SM_LLAMA_CPP_* environment."""

    model_path: Path  # the .gguf file
    http: HttpSettings
    request_timeout_s: float
    start_timeout_s: float
    child_settings: dict[str, str]  # llama_cpp.server setting → its command-line value
    ctx_size: int
    chat_source: str  # where the chat template comes from, for the log
    notes: tuple[str, ...] = field(default=())  # logged once the child is ready
    serving_id: str | None = None  # echoed as every answer's `system_fingerprint` (SHIPLIFT_SERVING_ID)


def _find_gguf(env: Mapping[str, str]) -> Path:
    """DLC_CHAT_GGUF_PATH if set, else the first *.gguf (sorted) directly under DLC_CHAT_MODEL_DIR, as the DLC."""
    explicit = env.get(f"{PREFIX}_GGUF_PATH")
    if explicit is not None:
        path = Path(explicit)
        if not explicit.strip() or not path.is_file():
            raise StartupError(f"{PREFIX}_GGUF_PATH={explicit!r} is not a file; point it at the model's .gguf file")
        return path
    model_dir = Path(env.get(f"{PREFIX}_MODEL_DIR", "/opt/ml/model"))
    if not model_dir.is_dir():
        raise StartupError(
            f"{PREFIX}_MODEL_DIR={str(model_dir)!r} is not a directory; set it to the extracted "
            f"model.tar.gz or {PREFIX}_GGUF_PATH to the .gguf file"
        )
    found = sorted(p for p in model_dir.glob("*.gguf") if p.is_file())
    if not found:
        raise StartupError(
            f"no *.gguf file directly under {PREFIX}_MODEL_DIR={str(model_dir)!r}; "
            f"put the model's .gguf there (the DLC does not search subfolders) or set {PREFIX}_GGUF_PATH"
        )
    return found[0]


def _option_value(name: str, raw: str, kind: str) -> str:
    """The command-line value of one SM_LLAMA_CPP_* variable, checked against its kind."""
    expected = KINDS[kind]

    def wrong() -> StartupError:
        return StartupError(f"{name}={raw!r} is not {expected}; set it to {expected}")

    if kind.startswith("int"):
        text = raw.strip()
        if not text or not (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
            raise wrong()
        value = int(text)
        if not (-1 if kind == "int>=-1" else 1) <= value <= INT_MAX:
            raise wrong()
        return str(value)
    if kind == "on|off|auto":
        if raw.strip().lower() not in FLASH_ATTN:
            raise wrong()
        return str(FLASH_ATTN[raw.strip().lower()])
    if kind == "chat-template":
        if raw not in CHAT_TEMPLATES:
            raise wrong()
        return CHAT_TEMPLATES[raw]
    if not raw or raw != raw.strip():
        raise wrong()
    return raw


def read_llama_options(env: Mapping[str, str]) -> dict[str, str]:
    """The SM_LLAMA_CPP_* variables as llama_cpp.server settings; StartupError for one that is refused."""
    given = sorted(key for key in env if key.startswith(SM_PREFIX))
    for name in NETWORK_OPTIONS:
        if name in env:
            raise StartupError(
                f"{name} is set, but the local stand-in never uses the network, and shiplift's SageMaker "
                "models run with EnableNetworkIsolation; the model comes from the release's artifact "
                f"(unset {' and '.join(NETWORK_OPTIONS)})"
            )
    unknown = [name for name in given if name not in OPTIONS]
    if unknown:
        raise StartupError(
            f"{', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} not supported by the local stand-in; "
            f"unset {'it' if len(unknown) == 1 else 'them'} (supported: {', '.join(OPTIONS)})"
        )
    settings: dict[str, str] = {}
    for name in given:
        targets, kind = OPTIONS[name]
        value = _option_value(name, env[name], kind)
        for target in targets:
            settings[target] = value
    return settings


def _chat_template_source(env: Mapping[str, str], child: dict[str, str], metadata: Mapping[str, Any],
                          model_path: Path) -> str:
    """Where the chat template comes from: SM_LLAMA_CPP_CHAT_TEMPLATE if set (as --chat-template wins in
    llama-server), else the GGUF's own, else the one its architecture implies (set as the child's chat_format);
    StartupError when none applies, since llama-cpp-python would silently fall back to the llama-2 format."""
    template_name = env.get("SM_LLAMA_CPP_CHAT_TEMPLATE")
    if template_name is not None:
        return f"SM_LLAMA_CPP_CHAT_TEMPLATE={template_name} (chat_format {child['chat_format']})"
    if metadata.get("tokenizer.chat_template"):
        return "the GGUF's tokenizer.chat_template"
    inferred = inferred_template(metadata)
    if inferred is not None:
        child["chat_format"] = CHAT_TEMPLATES[inferred]
        return f"{inferred}, inferred from general.architecture {metadata['general.architecture']}"
    architecture = metadata.get("general.architecture", "none")
    raise StartupError(
        f"{model_path.name} has no tokenizer.chat_template and its general.architecture ({architecture}) implies "
        "none, and llama-cpp-python would silently fall back to the llama-2 format; name the template with "
        "`shiplift serve chat --chat-template NAME`, image.server.chat_template in the release config, or "
        f"SM_LLAMA_CPP_CHAT_TEMPLATE (NAME one of {', '.join(CHAT_TEMPLATES)}), or use a GGUF that carries its "
        "template",
        EXIT_MODEL,
    )


def load_settings(env: Mapping[str, str]) -> Settings:
    """Validate the whole environment and the model file; raise StartupError on the first problem."""
    http = read_http_settings(env, PREFIX)
    request_timeout_s = env_float(env, f"{PREFIX}_REQUEST_TIMEOUT_S", 120.0, 0.001, 86400.0)
    start_timeout_s = env_float(env, f"{PREFIX}_START_TIMEOUT_S", 300.0, 1.0, 86400.0)
    child = read_llama_options(env)
    model_path = _find_gguf(env)
    try:
        metadata = read_gguf_metadata(model_path, TEMPLATE_KEYS.__contains__)
    except GgufError as exc:
        raise StartupError(f"cannot read the GGUF header of {model_path}: {exc}", EXIT_MODEL) from None
    except OSError as exc:
        raise StartupError(f"cannot read {model_path}: {exc}") from None
    notes: list[str] = []
    chat_source = _chat_template_source(env, child, metadata, model_path)
    if env.get("SM_LLAMA_CPP_FLASH_ATTN", "").strip().lower() == "auto":
        notes.append(
            "SM_LLAMA_CPP_FLASH_ATTN=auto: llama-server decides per backend; "
            "this CPU stand-in turns flash attention off"
        )
    ctx_size = int(child.get("n_ctx", DEFAULT_CTX_SIZE))
    child.setdefault("n_ctx", str(ctx_size))
    return Settings(
        model_path=model_path,
        http=http,
        request_timeout_s=request_timeout_s,
        start_timeout_s=start_timeout_s,
        child_settings=child,
        ctx_size=ctx_size,
        chat_source=chat_source,
        notes=tuple(notes),
        serving_id=read_serving_id(env),
    )


# --------------------------------------------------------------------------------------
# The child: llama_cpp.server on a free loopback port


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((CHILD_HOST, 0))
        return sock.getsockname()[1]


def _child_environment() -> dict[str, str]:
    """Our environment without what llama_cpp.server would read as its own settings.

    Its settings are pydantic BaseSettings (any variable named like a field, case-insensitive, e.g.
    API_KEY, N_CTX, CHAT_FORMAT), and its main() reads CONFIG_FILE, HOST and PORT itself; the command
    line must be the whole configuration."""
    try:
        from llama_cpp.server.settings import ConfigFileSettings
        from llama_cpp.server.settings import Settings as ChildSettings
    except ImportError as exc:
        raise StartupError(
            f"llama-cpp-python's server is not installed ({exc}); install llama-cpp-python[server]", EXIT_MODEL
        ) from None
    names = {name.lower() for model in (ChildSettings, ConfigFileSettings) for name in model.model_fields}
    names |= {"config_file", "host", "port"}
    return {key: value for key, value in os.environ.items() if key.lower() not in names}


def _die_with_parent() -> Callable[[], None] | None:
    """preexec_fn giving the child SIGTERM when the thread that started it ends (Linux), or None.

    That thread (the loading thread) lives until the child exits: it waits in `watch`. prctl is
    looked up here, before the fork, so the forked child only makes one foreign call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)
    return lambda: prctl(pr_set_pdeathsig, sigterm)


class Child:
    """The llama_cpp.server process: started, awaited until /v1/models answers, watched, stopped."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.port = _free_port()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.stopping = False
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.output: threading.Thread | None = None
        options = {
            "model": str(settings.model_path),
            "host": CHILD_HOST,
            "port": str(self.port),
            "logits_all": "True",  # llama-cpp-python needs it for logprobs; llama-server does not
            "verbose": "False",
            **settings.child_settings,
        }
        self.command = [sys.executable, "-m", "llama_cpp.server"]
        for key, value in options.items():
            self.command += [f"--{key}", value]

    def start(self) -> None:
        """Start the child in its own process group, its output copied to our stderr (prefixed)."""
        env = _child_environment()
        with self.lock:
            if self.stopping:
                raise StartupError("stopped before the model server started", EXIT_MODEL)
            _CHILDREN.append(self)
            self.proc = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent(),
            )
        command = " ".join(self.command)
        print(f"{NAME}: started llama_cpp.server (pid {self.proc.pid}): {command}", file=sys.stderr, flush=True)
        self.output = threading.Thread(target=self._copy_output, name=f"{NAME}-child-output", daemon=True)
        self.output.start()

    def _copy_output(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            self.tail.append(line)
            sys.stderr.write(f"{NAME}: [llama_cpp.server] {line}\n")
            sys.stderr.flush()

    def tail_text(self) -> str:
        """The child's last lines (once its output has ended, or after a second)."""
        if self.output is not None:
            self.output.join(timeout=1.0)
        return "\n".join(self.tail) or "(no output)"

    def wait_ready(self) -> None:
        """Poll GET /v1/models until 200, the child's exit, or DLC_CHAT_START_TIMEOUT_S (then stop it)."""
        assert self.proc is not None
        deadline = time.monotonic() + self.settings.start_timeout_s
        while True:
            if self.proc.poll() is not None:
                if self.stopping:
                    raise StartupError("stopped before the model server was ready", EXIT_MODEL)
                raise StartupError(
                    f"llama_cpp.server exited with code {self.proc.returncode} before it was ready; "
                    f"its last output:\n{self.tail_text()}",
                    EXIT_MODEL,
                )
            if self._models_answer():
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise StartupError(
                    f"llama_cpp.server was not ready within {self.settings.start_timeout_s:g}s "
                    f"({PREFIX}_START_TIMEOUT_S); its last output:\n{self.tail_text()}",
                    EXIT_MODEL,
                )
            try:
                self.proc.wait(timeout=READY_POLL_S)
            except subprocess.TimeoutExpired:
                pass

    def _models_answer(self) -> bool:
        connection = http.client.HTTPConnection(CHILD_HOST, self.port, timeout=READY_PROBE_TIMEOUT_S)
        try:
            connection.request("GET", "/v1/models")
            response = connection.getresponse()
            response.read()
            return response.status == 200
        except (OSError, http.client.HTTPException):
            return False  # not listening yet (it binds once the model is loaded)
        finally:
            connection.close()

    def watch(self) -> str | None:
        """Block until the child exits; None when we stopped it, else why it died."""
        assert self.proc is not None
        code = self.proc.wait()
        if self.stopping:
            return None
        return f"llama_cpp.server (pid {self.proc.pid}) exited with code {code}; its last output:\n{self.tail_text()}"

    def stop(self) -> None:
        """SIGTERM to the child's process group, SIGKILL after STOP_DEADLINE_S."""
        with self.lock:
            self.stopping = True
            proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, STOP_DEADLINE_S), (signal.SIGKILL, STOP_DEADLINE_S)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue


_CHILDREN: list[Child] = []


def stop_children() -> None:
    for child in list(_CHILDREN):
        child.stop()


def start_child(settings: Settings) -> Child:
    """load_engine: start the child and wait until it serves."""
    child = Child(settings)
    try:
        child.start()
        child.wait_ready()
    except BaseException:
        child.stop()
        raise
    return child


def _loaded(settings: Settings, child: Child, seconds: float) -> str:
    for note in settings.notes:
        print(f"{NAME}: {note}", file=sys.stderr, flush=True)
    return (
        f"model {settings.model_path.name} served by llama_cpp.server on {CHILD_HOST}:{child.port} after "
        f"{seconds:.2f}s (n_ctx {settings.ctx_size}, chat template from {settings.chat_source})"
    )


def _watch(settings: Settings, child: Child) -> str | None:
    return child.watch()


# --------------------------------------------------------------------------------------
# Request validation


def _number(payload: dict[str, Any], key: str, low: float, high: float) -> None:
    value = payload[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(key, f"must be a number, got {json_type(value)}")
    if not math.isfinite(value):
        raise bad(key, f"{value} is not a finite number")
    if not low <= value <= high:
        raise bad(key, f"must be in [{low:g}, {high:g}], got {value}")


def _integer(payload: dict[str, Any], key: str, low: int, high: int, limit: str = "") -> int:
    value = payload[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(key, f"must be an integer, got {json_type(value) if not isinstance(value, float) else value}")
    if not low <= value <= high:
        raise bad(key, f"must be an integer in [{low}, {high}]{limit}, got {value}")
    return value


def _boolean(payload: dict[str, Any], key: str) -> bool:
    value = payload[key]
    if not isinstance(value, bool):
        raise bad(key, f"must be true or false, got {json_type(value)}")
    return value


def _messages(value: Any) -> None:
    if not isinstance(value, list):
        raise bad("messages", f"must be an array of messages, got {json_type(value)}")
    if not 1 <= len(value) <= MAX_MESSAGES:
        raise bad("messages", f"must have 1 to {MAX_MESSAGES} messages, got {len(value)}")
    for index, message in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise bad(where, f"must be an object with 'role' and 'content', got {json_type(message)}")
        for key in message:
            if key not in MESSAGE_KEYS:
                raise bad(f"{where}.{key}", f"unknown key; a message has exactly the keys {list(MESSAGE_KEYS)}")
        for key in MESSAGE_KEYS:
            if key not in message:
                raise bad(f"{where}.{key}", "is required")
        role = message["role"]
        if role not in ROLES:
            shown = role if isinstance(role, str) else json_type(role)
            raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {shown!r}")
        json_string(message["content"], f"{where}.content")


def check_request(payload: dict[str, Any], ctx_size: int) -> None:
    """Refuse (HttpError 400) a chat request the endpoint would not answer the same way; never changes it."""
    unknown = [key for key in payload if key not in REQUEST_KEYS]
    if unknown:
        raise bad(
            ", ".join(unknown),
            f"unknown top-level key{'s' if len(unknown) > 1 else ''}; the keys accepted are {', '.join(REQUEST_KEYS)}",
        )
    if "messages" not in payload:
        raise bad("messages", "is required")
    _messages(payload["messages"])
    if "model" in payload:
        json_string(payload["model"], "model")
    if "stream" in payload:
        _boolean(payload, "stream")
    # llama-cpp-python's server silently drops n (one choice whatever is asked): refuse anything else
    if "n" in payload and _integer(payload, "n", 0, INT_MAX) != 1:
        raise bad("n", f"must be 1, got {payload['n']}: one choice per request (send one request per choice)")
    if "max_tokens" in payload:
        _integer(payload, "max_tokens", 1, ctx_size, f" (the context size, SM_LLAMA_CPP_CTX_SIZE={ctx_size})")
    _sampling(payload)
    _logprobs(payload)
    if "stop" in payload:
        _stop(payload["stop"])
    if "response_format" in payload:
        _response_format(payload["response_format"])


def _sampling(payload: dict[str, Any]) -> None:
    for key, low, high in SAMPLING_NUMBERS:
        if key in payload:
            _number(payload, key, low, high)
    for key, low, high in SAMPLING_INTEGERS:
        if key in payload:
            _integer(payload, key, low, high)


def _logprobs(payload: dict[str, Any]) -> None:
    logprobs = _boolean(payload, "logprobs") if "logprobs" in payload else False
    if "top_logprobs" in payload:
        _integer(payload, "top_logprobs", 0, MAX_TOP_LOGPROBS)
        if not logprobs:
            raise bad("top_logprobs", "needs logprobs true")


def _stop(value: Any) -> None:
    if isinstance(value, list):
        if len(value) > MAX_STOP:
            raise bad("stop", f"must have at most {MAX_STOP} sequences, got {len(value)}")
        for index, item in enumerate(value):
            json_string(item, f"stop[{index}]")
    elif not isinstance(value, str):
        raise bad("stop", f"must be a string or an array of strings, got {json_type(value)}")
    else:
        json_string(value, "stop")


def _response_format(value: Any) -> None:
    if not isinstance(value, dict):
        raise bad("response_format", f"must be an object, got {json_type(value)}")
    for key in value:
        if key not in ("type", "schema"):
            raise bad(f"response_format.{key}", "unknown key; use 'type' (and 'schema' with json_object)")
    kind = value.get("type")
    if kind not in RESPONSE_FORMATS:
        raise bad("response_format.type", f"must be one of {', '.join(RESPONSE_FORMATS)}, got {kind!r}")
    if "schema" in value and (kind != "json_object" or not isinstance(value["schema"], dict)):
        raise bad("response_format.schema", "must be a JSON schema object, with type json_object")


# --------------------------------------------------------------------------------------
# Forwarding


def _child_message(status: int, body: bytes) -> str:
    """The error message in the child's answer (OpenAI's {"error": {"message"}}, FastAPI's {"detail"})."""
    try:
        data = json.loads(body)
    except ValueError:
        text = body.decode("utf-8", errors="replace").strip()
        return text[:2000] or f"HTTP {status} with an empty body"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        if isinstance(error, str):
            return error
        if "detail" in data:
            return json.dumps(data["detail"], ensure_ascii=False)[:2000]
    return json.dumps(data, ensure_ascii=False)[:2000]


def _post(child: Child, body: bytes, timeout_s: float) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """POST the checked body, unchanged, to the child's /v1/chat/completions; the connection and its response, whose
    every read waits at most `timeout_s`. A status other than 200 is read and raised as HttpError."""
    connection = http.client.HTTPConnection(CHILD_HOST, child.port, timeout=timeout_s)
    try:
        connection.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            _raise_child_error(response.status, response.read())
        return connection, response
    except (OSError, http.client.HTTPException) as exc:
        connection.close()
        raise _transport_error(exc, timeout_s) from None
    except BaseException:
        connection.close()
        raise


def _transport_error(exc: BaseException, timeout_s: float) -> HttpError:
    if isinstance(exc, TimeoutError):  # the child keeps working on it (a non-streamed completion cannot be cancelled)
        return HttpError(
            504,
            f"the model did not answer within {timeout_s:g}s ({PREFIX}_REQUEST_TIMEOUT_S); "
            "ask for fewer max_tokens or retry later",
            retryable=True,
        )
    return HttpError(502, f"the model server (llama_cpp.server) failed: {exc!r}")


def _raise_child_error(status: int, data: bytes) -> None:
    message = _child_message(status, data)
    if 400 <= status < 500:
        raise HttpError(status, message)
    raise HttpError(502, f"the model server (llama_cpp.server) answered {status}: {message}")


def forward(child: Child, body: bytes, timeout_s: float) -> dict[str, Any]:
    """The child's 200 JSON answer to the checked body, or HttpError."""
    connection, response = _post(child, body, timeout_s)
    try:
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise _transport_error(exc, timeout_s) from None
    finally:
        connection.close()
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise HttpError(502, "the model server (llama_cpp.server) answered 200 without a JSON object")
    return answer


def forward_stream(child: Child, body: bytes, timeout_s: float, serving_id: str | None) -> Iterator[bytes]:
    """The child's server-sent events for a `stream: true` request, event by event as they come (each read waits at
    most `timeout_s`), each chunk with the serving id as its `system_fingerprint` when there is one. A stream that
    breaks off ends with an OpenAI-shaped error event (`data: {"error": ...}`, no `[DONE]`): the 200 is already
    sent. Closing the iterator (the client went away) closes the child's connection, which stops its completion."""
    connection, response = _post(child, body, timeout_s)

    def events() -> Iterator[bytes]:
        try:
            while True:
                line = response.readline(MAX_EVENT_LINE_BYTES + 1)
                if not line:
                    return
                if len(line) > MAX_EVENT_LINE_BYTES:
                    raise HttpError(502, f"the model server sent an event line over {MAX_EVENT_LINE_BYTES} bytes")
                yield _fingerprinted(line, serving_id)
        except (OSError, http.client.HTTPException, HttpError) as exc:
            error = exc if isinstance(exc, HttpError) else _transport_error(exc, timeout_s)
            yield b"data: " + json.dumps({"error": {"message": str(error), "type": "server_error",
                                                    "code": error.status}}).encode() + b"\n\n"
        finally:
            connection.close()

    return events()


def _fingerprinted(line: bytes, serving_id: str | None) -> bytes:
    """One SSE line; a chunk's `data:` line with the serving id as its system_fingerprint (as whole answers get)."""
    if serving_id is None or not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
        return line
    try:
        chunk = json.loads(line[len(b"data: "):])
    except ValueError:
        return line
    if not isinstance(chunk, dict):
        return line
    return b"data: " + json.dumps({**chunk, "system_fingerprint": serving_id}).encode() + b"\n"


def answer(settings: Settings, child: Child, body: bytes, received: float) -> dict[str, Any] | Streamed:
    """One POST /invocations or /v1/chat/completions: check the body, forward it, pass the answer back (server-sent
    events as they come for `stream: true`), with the copy's serving id as its `system_fingerprint` (OpenAI's field
    for the configuration that answered) when the hosting named one, so live answers are told apart by what serves
    them."""
    payload = parse_json_object(body, parse_constant=float)  # NaN parses here and is refused by field
    check_request(payload, settings.ctx_size)
    if payload.get("stream") is True:
        return Streamed(forward_stream(child, body, settings.request_timeout_s, settings.serving_id))
    answered = forward(child, body, settings.request_timeout_s)
    return {**answered, "system_fingerprint": settings.serving_id} if settings.serving_id else answered


SERVICE = ModelService(
    name=NAME,
    prefix=PREFIX,
    server_version="dlc-chat/1",
    empty_body="is empty; send a chat completion request, a JSON object with 'messages'",
    load_settings=load_settings,
    load_engine=start_child,
    loaded=_loaded,
    answer=answer,
    post_routes=("/invocations", "/v1/chat/completions"),
    watch=_watch,
)


def main(argv: list[str]) -> int:
    try:
        return serve(SERVICE, argv)
    finally:
        stop_children()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
