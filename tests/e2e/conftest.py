"""End-to-end fixtures: tiny-model release configs, `shiplift` as a subprocess, clean-up of endpoints."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def release_config(tmp_path, tiny_release):
    """A factory of tiny-model release configs (gates a random model passes), state in tmp_path/state."""

    def make(name: str = "tiny-decision", **changes) -> Path:
        return tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state", name=name, **changes)

    return make


@pytest.fixture(autouse=True)
def stop_endpoints_afterwards(tmp_path):
    """Releases leave their production endpoint serving: stop whatever a test started."""
    yield
    for state_dir in (tmp_path / "state", tmp_path):
        if (state_dir / "endpoints").is_dir():
            hosting = ProcessSupervisor(state_dir)
            for endpoint in hosting.list_endpoints():
                hosting.delete_endpoint(endpoint["name"])


def shiplift_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", *args], cwd=ROOT, capture_output=True,
                          text=True,
                          timeout=timeout)


@pytest.fixture
def cli():
    """Run `shiplift ARGS...` as a user would, in a subprocess; returns the CompletedProcess."""
    return shiplift_cli


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def serve():
    """Start `shiplift serve IMAGE ARGS...` (as a user would) and return its URL once /ping is 200."""
    processes = []

    def start(image: str, *args: str, ready_timeout_s: float = 120) -> str:
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "shiplift.tasks.cli.main", "serve", image, *args, "--port",
                                    str(port)],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                    if response.status == 200:
                        return url
            except OSError:
                time.sleep(0.2)
        process.kill()
        pytest.fail(f"shiplift serve {image} did not become ready: {process.stderr.read().decode()[-2000:]}")

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def serve_semif(serve):
    """`shiplift serve semif` on a GGUF with limits that fit the tiny models' 2,048-token context."""

    def start(gguf: Path, *, threads: int = 1, ready_timeout_s: float = 120) -> str:
        return serve("semif", "--gguf", str(gguf), "--threads", str(threads), "--max-tokens", "2048",
                     "--max-request-tokens", "1536", ready_timeout_s=ready_timeout_s)

    return start
