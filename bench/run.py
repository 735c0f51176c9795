"""`make bench`: speed ratios of the SemIf adapter and the eval runner, measured side by side.

Every ratio compares two ways of doing the same work in one run, alternating rounds and taking
medians, because absolute times drift on shared machines. Uses the real demo model
(Gemma-3-270M Q4_K_M) with 2 threads.

1. shared state: 8 decisions over one ~1,000-token state in one `decisions` request vs 8 single
   `decision` requests (target ≥ 4×);
2. adapter overhead: one decision over HTTP vs llama.cpp evaluating the same tokens in-process
   (target ≤ 15 %);
3. runner overhead: the eval runner's wall time over 120 tasks vs the sum of the server's
   forward time (target ≤ 10 %);
4. orchestration overhead: the demo release (configs/releases/gemma-decision.yaml) as one
   refresh DAG run (`dag.test()` on SQLite) vs the same release through the CLI, each a fresh
   process with fresh state (target ≤ 1.5×);
5. encoder engines (bench/encoder.py): PyTorch eager fp32 vs ONNX Runtime fp32 and the served int8
   graph vs OpenVINO fp32 and NNCF int8 at sequence length 512, each engine in its own process, alternated rounds,
   ratio per round with its spread, the CPU's ISA printed (targets: ORT fp32 ≥ 1.3×, ORT int8 ≥ 2× PyTorch at
   batch 8 with at most 1 point accuracy loss; docs/encoder-speed.md has the roofline that bounds it);
6. the router (bench/router.py): overhead per decision vs calling the copy directly (target ≤ 5 %
   at p50), and throughput during a rolling update vs steady state (target ≥ 0.8);
7. the ledger (bench/ledger.py): append and verify time at 10,000 vs 100,000 records on SQLite and
   PostgreSQL (target: linear), inclusion proofs of at most ceil(log2 n) hashes a record;
8. the chat path (bench/chat_path.py): SemIf vs the DLC's chat path on the same model and 120 public tasks —
   validity, accuracy, label agreement, ECE, p50/p95, each path's value and the ratio (a report, no target);
9. the agent loop (bench/agent_loop.py): 8 requests on the shared state with a new question each, the adapter with
   its prefix cache vs without, each in its own process, alternated (target: >= 0.9 of the token bound; cold vs warm
   option probabilities within 1e-4);
10. the gate wall (bench/gate_wall.py): the demo release's gate with the champion's recorded per-task results reused vs
   scored afresh (`--fresh-champion`), the same model as candidate, each release its own process, alternated (target:
   reuse <= 0.55x of fresh), with the champion requests each made.

`python -m bench.run --sections 5,9,10` (make bench BENCH_ARGS=...) measures only those sections, in one run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.agent_loop import run as bench_agent_loop
from bench.chat_path import run as bench_chat_path
from bench.encoder import run as bench_encoder
from bench.gate_wall import run as bench_gate_wall
from bench.harness import (
    ROOT,
    ROUNDS,
    SERVER,
    SERVER_ENV,
    THREADS,
    adapter,
    bench_tasks,
    decisions,
    gemma_path,
    log,
    post,
    report,
    shared_state,
)
from bench.ledger import run as bench_ledger
from bench.router import run as bench_router
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.validation.runner import run_decisions


def bench_shared_state(url: str) -> dict:
    batch = decisions(shared_state())
    shared_s, single_s, tokens = [], [], None
    for round_no in range(ROUNDS):
        body, seconds = post(url, {"decisions": batch})
        shared_s.append(seconds)
        tokens = body["timing"]["shared_prefix_tokens"]
        start = time.perf_counter()
        for decision in batch:
            post(url, {"decision": decision})
        single_s.append(time.perf_counter() - start)
        log(f"  round {round_no + 1}: shared {shared_s[-1]:.2f}s, 8 singles {single_s[-1]:.2f}s")
    ratio = statistics.median(single_s) / statistics.median(shared_s)
    return {"name": "8 shared decisions vs 8 single requests", "value": ratio, "unit": "x faster",
            "target": ">= 4", "ok": ratio >= 4, "detail": f"shared prefix {tokens} tokens"}


def load_server_module():
    spec = importlib.util.spec_from_file_location("semif_server", SERVER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file executes
    spec.loader.exec_module(module)
    return module


def bench_adapter_overhead(url: str, gguf: Path) -> dict:
    """HTTP round trip of one decision vs `llama.eval` of exactly the tokens the adapter built."""
    import llama_cpp

    server = load_server_module()
    settings = server.load_settings({**SERVER_ENV, "SEMIF_GGUF_PATH": str(gguf)})
    engine = server.Engine(settings)
    decision = decisions(shared_state()[:1200])[2]
    parsed, _ = server.parse_decisions({"decision": decision}, settings.max_shared_decisions)
    prompt = engine.prompts(parsed)[0]
    http_s, direct_s = [], []
    for _ in range(ROUNDS * 3):
        body, seconds = post(url, {"decision": decision})
        assert body["result"]["prompt_sha256"] == prompt.sha256, "adapter and bench built different prompts"
        http_s.append(seconds)
        start = time.perf_counter()
        engine.llm.reset()
        engine.llm.eval(prompt.tokens)
        llama_cpp.llama_get_logits_ith(engine.llm.ctx, -1)
        direct_s.append(time.perf_counter() - start)
    overhead = statistics.median(http_s) / statistics.median(direct_s) - 1
    return {"name": "adapter overhead, one decision vs direct llama.cpp eval", "value": overhead * 100, "unit": "%",
            "target": "<= 15", "ok": overhead <= 0.15,
            "detail": f"{len(prompt.tokens)} tokens; HTTP {statistics.median(http_s) * 1000:.0f} ms vs direct "
                      f"{statistics.median(direct_s) * 1000:.0f} ms"}


def bench_runner_overhead(url: str) -> dict:
    tasks, source = bench_tasks()
    start = time.perf_counter()
    predictions = run_decisions(url, tasks, concurrency=2, timeout_s=120)
    wall = time.perf_counter() - start
    errors = [p for p in predictions if p.error]
    if errors:
        raise RuntimeError(f"{len(errors)} tasks failed, first: {errors[0].error}")
    forward = sum(p.server_forward_ms for p in predictions) / 1000
    overhead = wall / forward - 1
    return {"name": f"eval runner over {len(tasks)} tasks vs server forward time", "value": overhead * 100, "unit": "%",
            "target": "<= 10", "ok": overhead <= 0.10,
            "detail": f"{source}: wall {wall:.1f}s, forward {forward:.1f}s"}


def timed_process(argv: list[str], env: dict, timeout_s: float = 1800) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}… failed ({done.returncode}): {(done.stdout + done.stderr)[-3000:]}")
    return seconds, done


def stop_endpoints(state_dir: Path) -> None:
    if (state_dir / "endpoints").is_dir():
        hosting = ProcessSupervisor(state_dir)
        for endpoint in hosting.list_endpoints():
            hosting.delete_endpoint(endpoint["name"])


def bench_dag_vs_cli() -> dict:
    """The same release twice from nothing: `shiplift release` vs the refresh DAG under `dag.test()`."""
    config = ROOT / "configs" / "releases" / "gemma-decision.yaml"
    work = Path(tempfile.mkdtemp(prefix="shiplift-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    airflow_env = dict(env, AIRFLOW_HOME=str(work / "airflow"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                       AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
                       AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{work / 'airflow' / 'airflow.db'}")
    timed_process([sys.executable, "-m", "airflow", "db", "migrate"], airflow_env, 600)
    try:
        cli_s, _ = timed_process([sys.executable, "-m", "shiplift.tasks.cli.main", "release", str(config), "--set",
                                  f"backend.state_dir={work / 'cli'}"], env)
        log(f"  CLI release {cli_s:.1f}s")
        spec = work / "spec.json"
        spec.write_text(json.dumps({"dags_folder": str(ROOT / "dags"), "runs": [
            {"dag_id": "refresh_gemma_decision", "conf": {"overrides": [f"backend.state_dir={work / 'dag'}"]}}]}))
        dag_s, done = timed_process([sys.executable, str(ROOT / "scripts" / "run_dag.py"), str(spec)], airflow_env)
        run = json.loads(done.stdout.splitlines()[-1].removeprefix("RESULT "))["runs"][0]
        if run.get("state") != "success":
            raise RuntimeError(f"the refresh DAG run did not succeed: {run}")
        log(f"  DAG run {dag_s:.1f}s (dag.test() itself {run['seconds']:.1f}s)")
    finally:
        stop_endpoints(work / "cli")
        stop_endpoints(work / "dag")
    ratio = dag_s / cli_s
    return {"name": "refresh DAG run vs the same release via the CLI", "value": ratio, "unit": "x slower",
            "target": "<= 1.5", "ok": ratio <= 1.5,
            "detail": f"DAG {dag_s:.1f}s (Airflow start-up and parse included) vs CLI {cli_s:.1f}s; state in {work}"}


def adapter_sections(gguf: Path) -> list[dict]:
    """Sections 1-3, on one adapter process."""
    with adapter(gguf) as url:
        log("shared state vs single requests")
        results = [bench_shared_state(url)]
        log("adapter overhead")
        results.append(bench_adapter_overhead(url, gguf))
        log("runner overhead")
        results.append(bench_runner_overhead(url))
    return results


# (first section number, last, what the log says, the measurement): every run measures in this order
SECTIONS = (
    (1, 3, "the adapter: shared state vs single requests, its overhead, the runner's overhead", adapter_sections),
    (4, 4, "orchestration overhead (two full demo releases)", lambda gguf: [bench_dag_vs_cli()]),
    (5, 5, "encoder engines, each in its own process: PyTorch, ONNX Runtime and OpenVINO, fp32 and int8",
     lambda gguf: bench_encoder()),
    (6, 6, "router overhead and throughput during a rolling update", bench_router),
    (7, 7, "the ledger: appends, verify, checkpoints and inclusion proofs at 10k and 100k records",
     lambda gguf: bench_ledger()),
    (8, 8, "the chat path vs SemIf on the same model and tasks", lambda gguf: bench_chat_path()),
    (9, 9, "agent loop: 8 requests on one state with and without prefix reuse, each server in its own process",
     lambda gguf: bench_agent_loop(gguf, decisions(shared_state()))),
    (10, 10, "gate wall: the demo gate with the champion's recorded results reused vs scored afresh, each release "
     "in its own process", lambda gguf: bench_gate_wall()),
)


def chosen_sections(argv: list[str]) -> set[int]:
    """The section numbers `--sections 5,9,10` names (every section without it); SystemExit naming the fix for any
    other argument or number."""
    every = {n for first, last, _, _ in SECTIONS for n in range(first, last + 1)}
    if not argv:
        return every
    if len(argv) != 2 or argv[0] != "--sections":
        raise SystemExit(f"bench.run: unexpected arguments {argv}; run it with no arguments (every section) or "
                         f"--sections N[,N...] (sections 1-{max(every)}, e.g. --sections 5,9,10)")
    try:
        wanted = {int(part) for part in argv[1].split(",")}
    except ValueError:
        wanted = set()
    if not wanted or not wanted <= every:
        raise SystemExit(f"bench.run: --sections {argv[1]!r} is not a comma-separated list of sections 1-{max(every)}")
    return wanted


def main(argv: list[str]) -> int:
    wanted = chosen_sections(argv)
    gguf = gemma_path()
    log(f"bench model: {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB), {THREADS} threads; "
        f"sections {','.join(map(str, sorted(wanted)))}")
    results = []
    for first, last, what, measure in SECTIONS:
        if wanted & set(range(first, last + 1)):
            log(f"{first if first == last else f'{first}-{last}'}/{SECTIONS[-1][1]} {what}")
            results.extend(measure(gguf))
    return report(results)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
