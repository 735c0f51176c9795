"""Router benchmarks, measured side by side in one run (`make bench` calls `run`).

1. router overhead: one decision through the local router vs straight to the same SemIf server
   (Gemma-3-270M, 2 threads), requests alternated one by one, p50 of each (target ≤ 5 %);
2. throughput during a rolling update vs steady state: the same closed-loop load (8 clients) on a
   3-copy component of fake copies that answer in 20 ms, requests per second while a linear
   rollout replaces every copy vs while nothing changes, alternated (target ≥ 0.8).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.harness import SERVER, SERVER_ENV
from shiplift.tasks.backends.interfaces import RolloutPlan
from shiplift.tasks.backends.local.endpoint_state import ProcessSpec
from shiplift.tasks.backends.local.rollout import roll_out
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.validation.transport import HttpInvoker, post_alone

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fakes" / "fake_model_server.py"
DECISION = {"id": "q", "state": "The parcel was scanned in the regional depot on day 4 and has not moved since.",
            "question": "Is a delivery problem mentioned?",
            "options": [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]}
OVERHEAD_REQUESTS = 60
LOAD_CLIENTS, LOAD_ROUNDS = 8, 3


def _post(url: str, payload: dict) -> float:
    """Seconds one request to `url` (a server root or a router's `…/endpoints/NAME`) took, retried as every shiplift
    client retries (no capacity, throttling, busy); OSError when it got no answer or an error."""
    start = time.perf_counter()
    exchange, _ = post_alone(HttpInvoker(url), json.dumps(payload).encode(), timeout_s=300, deadline_s=None)
    if exchange.error is not None:
        raise OSError(f"POST {url}/invocations: {exchange.error}")
    return time.perf_counter() - start


def bench_router_overhead(gguf: Path) -> dict:
    """The same decision alternately straight to a SemIf copy and through the router in front of it."""
    spec = ProcessSpec(command=[sys.executable, str(SERVER)], env={**SERVER_ENV, "SEMIF_GGUF_PATH": str(gguf)},
                       copies=1, port_env="SEMIF_PORT", model_ref={"bench": "router overhead"})
    with tempfile.TemporaryDirectory() as tmp:
        hosting = ProcessSupervisor(Path(tmp) / "state")
        hosting.ensure_endpoint("bench-router")
        server_url = hosting.put_component("bench-router", "model", spec, ready_timeout_s=180).copies[0].url
        router_url = hosting.endpoint_url("bench-router")
        try:
            direct, routed = [], []
            for _ in range(3):  # warm both paths
                _post(server_url, {"decision": DECISION})
                _post(router_url, {"decision": DECISION})
            for _ in range(OVERHEAD_REQUESTS):
                direct.append(_post(server_url, {"decision": DECISION}))
                routed.append(_post(router_url, {"decision": DECISION}))
        finally:
            hosting.delete_endpoint("bench-router")
    overhead = statistics.median(routed) / statistics.median(direct) - 1
    return {"name": "router overhead, one decision via the router vs direct (p50)", "value": overhead * 100,
            "unit": "%", "target": "<= 5", "ok": overhead <= 0.05,
            "detail": f"p50 routed {statistics.median(routed) * 1000:.1f} ms vs direct "
                      f"{statistics.median(direct) * 1000:.1f} ms, {OVERHEAD_REQUESTS} each"}


def _spec(version: str):
    return ProcessSpec(command=[sys.executable, str(FAKE)], env={"FAKE_PORT_ENV": "COPY_PORT", "FAKE_DELAY_S": "0.02"},
                       copies=3, port_env="COPY_PORT", model_ref={"version": version})


def _closed_loop(url: str, stop: threading.Event) -> tuple[dict[str, int], list[threading.Thread], float]:
    """Start LOAD_CLIENTS clients, each sending back to back until `stop`: (their counts, the threads, start time)."""
    counts = {"ok": 0, "failed": 0}
    lock = threading.Lock()

    def client() -> None:
        while not stop.is_set():
            try:
                _post(url, {"q": 1})
                outcome = "ok"
            except OSError:
                outcome = "failed"
            with lock:
                counts[outcome] += 1

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(LOAD_CLIENTS)]
    for thread in threads:
        thread.start()
    return counts, threads, started


def bench_rollout_throughput() -> dict:
    """Requests per second of one load while a linear rollout runs vs for as long with nothing changing."""
    with tempfile.TemporaryDirectory() as tmp:
        hosting = ProcessSupervisor(Path(tmp) / "state")
        hosting.ensure_endpoint("bench-rollout")
        hosting.put_component("bench-rollout", "fake", _spec("v0"), ready_timeout_s=60)
        url = hosting.endpoint_url("bench-rollout")
        rolling, steady, failures = [], [], 0
        try:
            for round_no in range(1, LOAD_ROUNDS + 1):
                stop = threading.Event()
                counts, threads, started = _closed_loop(url, stop)
                roll_out(hosting, "bench-rollout", "fake", _spec(f"v{round_no}"), RolloutPlan(strategy="linear"),
                         lambda step: None, ready_timeout_s=60)
                seconds = time.perf_counter() - started
                stop.set()
                for thread in threads:
                    thread.join()
                rolling.append(counts["ok"] / seconds)
                failures += counts["failed"]
                stop = threading.Event()
                counts, threads, started = _closed_loop(url, stop)
                time.sleep(seconds)
                stop.set()
                for thread in threads:
                    thread.join()
                steady.append(counts["ok"] / (time.perf_counter() - started))
                failures += counts["failed"]
                print(f"  round {round_no}: {rolling[-1]:.0f} req/s rolling ({seconds:.1f} s) "
                      f"vs {steady[-1]:.0f} steady", file=sys.stderr, flush=True)
        finally:
            hosting.delete_endpoint("bench-rollout")
    ratio = statistics.median(rolling) / statistics.median(steady)
    return {"name": "throughput during a rolling update vs steady state", "value": ratio, "unit": "x",
            "target": ">= 0.8", "ok": ratio >= 0.8 and failures == 0,
            "detail": f"{LOAD_CLIENTS} clients, 3 copies x 20 ms, linear batches of 1; {failures} failed requests"}


def run(gguf: Path) -> list[dict]:
    """Both router measurements; `gguf` is the bench model."""
    return [bench_router_overhead(gguf), bench_rollout_throughput()]


if __name__ == "__main__":
    from bench.harness import gemma_path

    for result in run(gemma_path()):
        print(json.dumps(result))
