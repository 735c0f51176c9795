"""Fixtures for the serving-image contract tests: real server processes and a urllib client.

Each server is `python images/<name>/server.py` (semif or encoder), configured only by its
SEMIF_* / ENCODER_* environment variables exactly as the local backend and the container run
it. Servers listen on port 0 (the kernel picks a free port) and the test reads the bound port
from the server's log.
"""

from __future__ import annotations

import ast
import functools
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SEMIF_SERVER = REPO / "images" / "semif" / "server.py"
ENCODER_SERVER = REPO / "images" / "encoder" / "server.py"
COMMON_HTTP = REPO / "images" / "common" / "sagemaker_http.py"
START_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 30.0
LISTENING = re.compile(r"listening on http://([0-9.]+):(\d+)")


def semif_env(**overrides: str) -> dict[str, str]:
    """The parent environment without any SEMIF_* variable, plus `overrides`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SEMIF_")}
    env.update(overrides)
    return env


@dataclass
class Reply:
    """One HTTP answer: status, parsed JSON body (None if not JSON) and headers."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


class ContractClient:
    """A tiny boto3-free client for the SageMaker container contract, built on urllib."""

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.base = f"http://{host}:{port}"

    def request(
        self, method: str, path: str, body: bytes | None = None, content_type: str | None = "application/json"
    ) -> Reply:
        """Send one request; HTTP error statuses are returned, not raised."""
        headers = {"Content-Type": content_type} if content_type else {}
        req = urllib.request.Request(self.base + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                return Reply(resp.status, _json_or_none(resp.read()), dict(resp.headers))
        except urllib.error.HTTPError as err:
            return Reply(err.code, _json_or_none(err.read()), dict(err.headers))

    def ping(self) -> Reply:
        return self.request("GET", "/ping", content_type=None)

    def invoke(self, payload: Any) -> Reply:
        """POST /invocations with `payload` as JSON."""
        return self.request("POST", "/invocations", json.dumps(payload).encode("utf-8"))

    def open_raw(self, head: list[str], body: bytes = b"") -> socket.socket:
        """Open a connection and send hand-written request header lines (and maybe part of a body)."""
        sock = socket.create_connection((self.host, self.port), timeout=REQUEST_TIMEOUT_S)
        sock.sendall("".join(f"{line}\r\n" for line in head).encode("latin-1") + b"\r\n" + body)
        return sock

    def raw(self, head: list[str], body: bytes = b"") -> Reply:
        """Send hand-written header lines (and maybe a partial body); read the answer."""
        sock = self.open_raw(head, body)
        try:
            resp = http.client.HTTPResponse(sock, method=head[0].split()[0])
            resp.begin()
            return Reply(resp.status, _json_or_none(resp.read()), dict(resp.headers))
        finally:
            sock.close()


def invoke_until_overloaded(client: ContractClient, payload: Any, *, workers: int = 8,
                            deadline_s: float = 60.0) -> tuple[Reply, dict[int, int]]:
    """Send `workers` invocations at once, round after round, until one is refused with 503: that reply and
    the statuses seen (each scoring takes milliseconds, so a server admitting one at a time refuses soon)."""
    from concurrent.futures import ThreadPoolExecutor

    seen: dict[int, int] = {}
    deadline = time.monotonic() + deadline_s
    with ThreadPoolExecutor(workers) as pool:
        while time.monotonic() < deadline:
            replies = list(pool.map(lambda _: client.invoke(payload), range(workers)))
            for reply in replies:
                seen[reply.status] = seen.get(reply.status, 0) + 1
            refused = [reply for reply in replies if reply.status == 503]
            if refused:
                return refused[0], seen
    raise AssertionError(f"{workers} concurrent invocations never overloaded the server: {seen}")


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


@dataclass
class ServerProcess:
    """A running server process with its log, client and the /ping statuses seen while starting."""

    proc: subprocess.Popen
    log_path: Path
    client: ContractClient
    ping_history: list[tuple[int, Any]]
    early_reply: Reply | None = None  # the answer to `probe`, sent as soon as the port was bound

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not end within 10 s."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_server_process(
    log_path: Path, env: dict[str, str], args: tuple[str, ...] = (), probe: Any = None, *, server: Path, prefix: str
) -> ServerProcess:
    """Start `server` on port 0 (`<prefix>_HOST`/`<prefix>_PORT`), wait (with a deadline) until /ping
    says ok, recording every ping.

    With `probe`, POST it to /invocations once, right after the port is bound (while the model loads).
    """
    name = server.parent.name
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(server), *args],
            env={**env, f"{prefix}_HOST": "127.0.0.1", f"{prefix}_PORT": "0"},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    deadline = time.monotonic() + START_DEADLINE_S
    client, early = None, None
    history: list[tuple[int, Any]] = []
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_path.read_text()}")
            if client is None:
                match = LISTENING.search(log_path.read_text(encoding="utf-8", errors="replace"))
                if match:
                    client = ContractClient(match.group(1), int(match.group(2)))
                    early = client.invoke(probe) if probe is not None else None
            if client is not None:
                reply = client.ping()
                history.append((reply.status, reply.body))
                if reply.status == 200:
                    return ServerProcess(proc, log_path, client, history, early)
            time.sleep(0.005)
        raise RuntimeError(f"{name} not ready within {START_DEADLINE_S}s:\n{log_path.read_text()}")
    except BaseException:
        proc.kill()
        proc.wait(timeout=10)
        raise


def run_server_to_exit(
    env: dict[str, str], args: tuple[str, ...] = (), *, server: Path, prefix: str, timeout: float = 60.0
) -> subprocess.CompletedProcess:
    """Run `server` expecting it to refuse to start (on port 0 unless `env` says otherwise); returns the finished
    process."""
    return subprocess.run(
        [sys.executable, str(server), *args],
        env={f"{prefix}_HOST": "127.0.0.1", f"{prefix}_PORT": "0", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def start_semif(
    log_path: Path, env: dict[str, str], args: tuple[str, ...] = (), probe: Any = None, server: Path = SEMIF_SERVER
) -> ServerProcess:
    """start_server_process for the SemIf adapter (the checkout's, or `server`)."""
    return start_server_process(log_path, env, args, probe, server=server, prefix="SEMIF")


def start_encoder(
    log_path: Path, env: dict[str, str], args: tuple[str, ...] = (), probe: Any = None, server: Path = ENCODER_SERVER
) -> ServerProcess:
    """start_server_process for the encoder NLI server (the checkout's, or `server`)."""
    return start_server_process(log_path, env, args, probe, server=server, prefix="ENCODER")


def non_stdlib_imports(path: Path) -> set[str]:
    """Top-level names a Python file imports that are not in the standard library."""
    nodes = list(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
    roots = {alias.name.split(".")[0] for node in nodes if isinstance(node, ast.Import) for alias in node.names}
    roots |= {node.module.split(".")[0] for node in nodes if isinstance(node, ast.ImportFrom) and node.module}
    return roots - set(sys.stdlib_module_names)


@pytest.fixture(scope="session")
def imports_outside_stdlib() -> Callable[[Path], set[str]]:
    """non_stdlib_imports as a fixture: the non-stdlib top-level imports of a file (images must stay lean)."""
    return non_stdlib_imports


@pytest.fixture(scope="session")
def container_layout(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Lay out an image's app folder as its Dockerfile does: the files its COPY line names (server.py and the shared
    modules from common/) side by side, no ../common."""

    def layout(name: str) -> Path:
        app = tmp_path_factory.mktemp(f"{name}-image") / "app"
        app.mkdir()
        dockerfile = (REPO / "images" / name / "Dockerfile").read_text(encoding="utf-8")
        [copy] = [line.split()[1:-1] for line in dockerfile.splitlines() if line.startswith(f"COPY {name}/server.py")]
        for source in copy:
            shutil.copyfile(REPO / "images" / source, app / Path(source).name)
        return app / "server.py"

    return layout


SOURCE_LAYOUTS = {
    "repository root": {"images/{name}": "{name}", "images/common": "common"},
    "images folder": {"{name}": "{name}", "common": "common"},
    # refused: the shared module is missing
    "repository root without common": {"images/{name}": "{name}"},
    "image folder only": {".": "{name}"},  # the source layout before the shared module
}


def copy_build_source(source: Path, name: str, layout: str) -> None:
    """Fill a CodeBuild source folder with image `name` laid out as SOURCE_LAYOUTS[layout] says."""
    for target, folder in SOURCE_LAYOUTS[layout].items():
        shutil.copytree(
            REPO / "images" / folder.format(name=name),
            source / target.format(name=name),
            ignore=shutil.ignore_patterns("__pycache__"),
            dirs_exist_ok=True,
        )


def run_buildspec_stubbed(
    tmp_path: Path, name: str, repo: str, digest: str, layout: str = "repository root", **env: str
) -> subprocess.CompletedProcess:
    """Run every phase of images/<name>/buildspec.yml from tmp_path/src (laid out as `layout`) with stub
    `aws` and `docker` that push to `repo` and report `digest`; docker calls go to tmp_path/docker.log.

    The buildspec's own env variables are the defaults, as CodeBuild sets them; `env` overrides them.
    """
    import yaml

    source = tmp_path / "src"
    copy_build_source(source, name, layout)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "aws").write_text(
        '#!/bin/bash\ncase "$*" in *get-login-password*) echo token;; '
        f"*describe-images*) echo {digest};; *) exit 3;; esac\n"
    )
    (stubs / "docker").write_text(
        '#!/bin/bash\necho "docker $*" >> "$DOCKER_LOG"\n'
        f'case "$1" in login) cat >/dev/null;; inspect) echo {repo}@{digest};; esac\n'
    )
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    spec = yaml.safe_load((REPO / "images" / name / "buildspec.yml").read_text())
    assert spec["version"] == 0.2 and spec["artifacts"]["files"] == ["image-detail.json"]
    phases = ("pre_build", "build", "post_build")
    script = "\n".join(command for phase in phases for command in spec["phases"][phase]["commands"])
    base_env = {
        **spec["env"].get("variables", {}),
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "ECR_REPOSITORY_URI": repo,
        "IMAGE_TAG": "c97b315c4728",
        "CODEBUILD_BUILD_SUCCEEDING": "1",
        "DOCKER_LOG": str(tmp_path / "docker.log"),
    }
    return subprocess.run(
        ["bash", "-c", script], env={**base_env, **env}, cwd=source, capture_output=True, text=True, timeout=30
    )


@pytest.fixture(scope="session")
def run_buildspec() -> Callable[..., subprocess.CompletedProcess]:
    """run_buildspec_stubbed as a fixture: a stubbed CodeBuild run of an image's buildspec."""
    return run_buildspec_stubbed


@pytest.fixture(scope="session")
def clean_env() -> Callable[..., dict[str, str]]:
    """semif_env as a fixture: the environment without SEMIF_* plus the given variables."""
    return semif_env


@pytest.fixture(scope="session")
def start_server() -> Callable[..., ServerProcess]:
    """start_semif as a fixture: start a server and wait until it is ready (the caller stops it)."""
    return start_semif


@pytest.fixture(scope="session")
def run_refusal() -> Callable[..., subprocess.CompletedProcess]:
    """Run the SemIf adapter expecting it to refuse to start."""
    return functools.partial(run_server_to_exit, server=SEMIF_SERVER, prefix="SEMIF")


@pytest.fixture(scope="session")
def start_encoder_server() -> Callable[..., ServerProcess]:
    """start_encoder as a fixture: start an encoder server and wait until it is ready (the caller stops it)."""
    return start_encoder


@pytest.fixture(scope="session")
def run_encoder_refusal() -> Callable[..., subprocess.CompletedProcess]:
    """Run the encoder server expecting it to refuse to start."""
    return functools.partial(run_server_to_exit, server=ENCODER_SERVER, prefix="ENCODER")


@pytest.fixture(scope="session")
def calibrated_temperature() -> float:
    """The temperature written into the calibrated server's calibration.json."""
    return CALIBRATED_T


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's tiny random llama GGUF (seed 0, 2048-token context, no chat template)."""
    from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("semif-model") / "tiny.gguf", seed=0)


@pytest.fixture(scope="session")
def tiny_env(tiny_gguf: Path) -> dict[str, str]:
    """Environment for the tiny model: one thread, its full 2048-token context."""
    return semif_env(SEMIF_GGUF_PATH=str(tiny_gguf), SEMIF_THREADS="1", SEMIF_MAX_TOKENS="2048")


@pytest.fixture(scope="module")
def semif(tmp_path_factory: pytest.TempPathFactory, tiny_env: dict[str, str]) -> Iterator[ServerProcess]:
    """The server with default limits; one decision was sent to it while its model loaded."""
    probe = {
        "decision": {
            "id": "early",
            "state": "s",
            "question": "q",
            "options": [{"id": "a", "description": "x"}, {"id": "b", "description": "y"}],
        }
    }
    server = start_semif(tmp_path_factory.mktemp("semif") / "server.log", tiny_env, probe=probe)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def semif_limits(tmp_path_factory: pytest.TempPathFactory, tiny_env: dict[str, str]) -> Iterator[ServerProcess]:
    """The server with small limits: 600-token prompts, 3 shared decisions, 8 KiB bodies, 1 in flight."""
    env = {
        **tiny_env,
        "SEMIF_MAX_REQUEST_TOKENS": "600",
        "SEMIF_MAX_SHARED_DECISIONS": "3",
        "SEMIF_MAX_BODY_BYTES": "8192",
        "SEMIF_MAX_IN_FLIGHT": "1",
    }
    server = start_semif(tmp_path_factory.mktemp("semif-limits") / "server.log", env)
    yield server
    server.stop()


CALIBRATED_T = 2.5
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] | trim }}</s>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="module")
def semif_chat(
    tmp_path_factory: pytest.TempPathFactory, tiny_env: dict[str, str], tiny_gguf: Path
) -> Iterator[ServerProcess]:
    """The server on a copy of the tiny model that carries a chat template (tokenizer.chat_template)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    chat_gguf = tmp_path_factory.mktemp("semif-chat-model") / "tiny-chat.gguf"
    reader = gguf.GGUFReader(tiny_gguf)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(chat_gguf, arch=arch, endianess=reader.endianess)
    template = MetadataDetails(gguf.GGUFValueType.STRING, CHAT_TEMPLATE)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: template}, [])
    env = {**tiny_env, "SEMIF_GGUF_PATH": str(chat_gguf)}
    server = start_semif(tmp_path_factory.mktemp("semif-chat") / "server.log", env)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def semif_calibrated(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[ServerProcess]:
    """The server on a model directory (two *.gguf, the first sorted is the model) with calibration.json T = 2.5."""
    model_dir = tmp_path_factory.mktemp("semif-calibrated-model")
    shutil.copyfile(tiny_gguf, model_dir / "model.gguf")
    (model_dir / "zz-not-a-model.gguf").write_bytes(b"")  # sorts after model.gguf: must not be picked
    (model_dir / "calibration.json").write_text(json.dumps({"temperature": CALIBRATED_T, "method": "nll"}))
    env = semif_env(SEMIF_MODEL_DIR=str(model_dir), SEMIF_THREADS="1", SEMIF_MAX_TOKENS="2048")
    server = start_semif(tmp_path_factory.mktemp("semif-calibrated") / "server.log", env)
    yield server
    server.stop()
