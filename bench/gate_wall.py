"""`make bench` section 10 (issue 50, item 3): the gate's wall time with the champion's recorded per-task results
reused vs the champion scored afresh (`--fresh-champion`), the same model as candidate in both, alternated rounds.

A champion is released first (a real local release, promoted; its gate records its per-task results). Each round then
releases the same model twice, as `shiplift release` processes of their own, once reusing and once with
`--fresh-champion`, the order alternated. A release id derives from its config, so the releases differ only in their
`description`: what serves (artifact, image, environment) and the gate's tasks stay the same, so every gate measures
afresh against a champion of the same identity. The gate wall is the validate stage's seconds in the ledger; champion
requests are the tasks the champion answered live (its gate files). Prints min/median of each arm, the ratio
reuse/fresh of the medians (target <= 0.55) and the request bound (the ratio if wall time followed requests).
Alone: `python -m bench.gate_wall [--rounds N] [--tasks N] [--tiny]` (the demo Gemma unless --tiny or its package is
missing; --tasks: the first N test tasks of the decision set, default the config's own, 111, and all 111 on --tiny).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.harness import ROOT, ROUNDS, gemma_path, log, report
from shiplift.tasks.errors import NotFound
from shiplift.tasks.ledger.events import SUCCEEDED, VALIDATE
from shiplift.tasks.ledger.records import stage_payload
from shiplift.tasks.ledger.stage_results import ValidateResult
from shiplift.tasks.ledger.store import Ledger
from shiplift.validation.champion_reuse import CHAMPION_LATENCY
from tests.tiny_release import DECISIONS, write_tiny_config

ARMS = ("reuse", "fresh")
TARGET = 0.55  # issue 50: the demo's Gemma gate wall at most 0.55x of today's
GEMMA_CONFIG = ROOT / "configs" / "releases" / "gemma-decision.yaml"
CLI = [sys.executable, "-m", "shiplift.tasks.cli.main"]
RELEASE_TIMEOUT_S = 3600


@dataclass(frozen=True)
class Gate:
    """One measured gate: the validate stage's seconds, the tasks the champion answered live, the gate's tasks."""

    seconds: float
    champion_requests: int
    tasks: int


def summary(gates: dict[str, list[Gate]]) -> dict:
    """The section's row (bench.harness.report): the median gate wall reusing / scoring afresh, each arm's min and
    median and its champion requests, each round's ratio (its spread on a loaded machine) and the request bound
    (candidate and champion requests, reuse / fresh)."""
    walls = {arm: [g.seconds for g in gates[arm]] for arm in ARMS}
    median = {arm: statistics.median(w) for arm, w in walls.items()}
    requests = {arm: statistics.median(g.champion_requests for g in gates[arm]) for arm in ARMS}
    tasks = gates["fresh"][0].tasks
    ratio = median["reuse"] / median["fresh"]
    bound = (tasks + requests["reuse"]) / (tasks + requests["fresh"])
    arms = "; ".join(f"{arm} min {min(walls[arm]):.1f}s median {median[arm]:.1f}s, {requests[arm]:g} champion requests"
                     for arm in ARMS)
    return {"name": f"gate wall, champion evidence reused vs fresh ({tasks} tasks)", "value": ratio,
            "unit": "x of fresh", "target": f"<= {TARGET}", "ok": ratio <= TARGET,
            "detail": f"{arms}; request bound {bound:.2f}x; per round " +
                      ", ".join(f"{r / f:.2f}" for r, f in zip(walls["reuse"], walls["fresh"], strict=True))}


def base_config(work: Path, tiny: bool, tasks: int | None) -> dict:
    """The release config every release of the bench shares (state under `work`): the demo's, or the tiny model's
    (tests/tiny_release.py); on `tasks`, its gate reads the decision set's first `tasks` test tasks."""
    state = work / "state"
    if tiny:
        tree = yaml.safe_load(write_tiny_config(work / "tiny", state).read_text())
    else:
        tree = yaml.safe_load(GEMMA_CONFIG.read_text())
        tree["backend"] = {**tree["backend"], "state_dir": str(state)}
    if tasks is not None:
        rows = [line for line in DECISIONS.read_text().splitlines() if json.loads(line)["split"] == "test"]
        if not 0 < tasks <= len(rows):
            raise SystemExit(f"--tasks {tasks}: the decision set has {len(rows)} test tasks")
        dataset = work / f"decisions-test-{tasks}.jsonl"
        dataset.write_text("\n".join(rows[:tasks]) + "\n")
        tree["validation"]["datasets"] = [{"path": str(dataset), "splits": ["test"]}]
    return tree


def release(work: Path, tree: dict, label: str, *, fresh: bool) -> tuple[Gate, dict]:
    """`shiplift release` of `tree` described as `label` (a release of its own), in its own process: its gate, and
    the champion evidence its validate record names (None for the first release, which has no champion)."""
    config = work / "configs" / f"{label}.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump({**tree, "description": f"make bench gate wall: {label}"}))
    argv = [*CLI, "release", str(config), *(["--fresh-champion"] if fresh else [])]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=RELEASE_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"shiplift release {label} failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr)[-3000:]}")
    with Ledger(f"sqlite:///{work / 'state' / 'ledger.db'}", read_only=True) as ledger:
        record = ledger.events(VALIDATE, SUCCEEDED)[-1]
    gate = stage_payload(record, ValidateResult)
    evidence = gate.champion_evidence or {}
    live = Path(gate.report_json).parent / (CHAMPION_LATENCY if evidence.get("reused") else
                                            "champion-predictions.jsonl")
    answered = len(live.read_text().splitlines()) if live.is_file() else 0
    return Gate(record.payload["seconds"], answered, gate.metrics["n"]), evidence


def measure(work: Path, tree: dict, rounds: int) -> dict[str, list[Gate]]:
    """The champion's release, then `rounds` rounds of a reusing and a fresh gate, the order alternated; raises when a
    gate did not do what its arm stands for (reused, or scored the champion because it was asked to)."""
    first, _ = release(work, tree, "champion", fresh=False)
    log(f"  champion released: its gate {first.seconds:.1f}s on {first.tasks} tasks")
    gates: dict[str, list[Gate]] = {arm: [] for arm in ARMS}
    for round_no in range(rounds):
        for arm in ARMS if round_no % 2 == 0 else ARMS[::-1]:
            gate, evidence = release(work, tree, f"round{round_no + 1}-{arm}", fresh=arm == "fresh")
            if evidence.get("reused") is not (arm == "reuse"):
                raise RuntimeError(f"the {arm} gate of round {round_no + 1} recorded champion evidence {evidence}")
            gates[arm].append(gate)
            log(f"  round {round_no + 1}: {arm} gate {gate.seconds:.1f}s, champion answered "
                f"{gate.champion_requests} of {gate.tasks} tasks live")
    return gates


def run(tiny: bool = False, rounds: int = ROUNDS, tasks: int | None = None) -> list[dict]:
    """The section on the demo Gemma (or the tiny model), endpoints stopped afterwards."""
    work = Path(tempfile.mkdtemp(prefix="shiplift-bench-gate-wall-"))
    try:
        gates = measure(work, base_config(work, tiny, tasks), rounds)
    finally:
        subprocess.run([*CLI, "endpoints", "stop", "--all", "--state-dir", str(work / "state")], cwd=ROOT,
                       capture_output=True, timeout=300)
    return [summary(gates)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds of a reusing and a fresh gate")
    parser.add_argument("--tasks", type=int, help="the gate's tasks: the decision set's first N test tasks")
    parser.add_argument("--tiny", action="store_true", help="the tiny generated model instead of the demo Gemma")
    args = parser.parse_args(argv)
    tiny, tasks = args.tiny, args.tasks
    if not tiny:
        try:
            gemma_path()
        except NotFound as exc:  # the demo package is optional here: say so and use the tiny model
            log(f"the demo Gemma is not available ({exc}); using the tiny model")
            tiny = True
    if tiny and tasks is None:  # the demo gate's size: every test task, not the tiny release's 32
        tasks = sum(json.loads(line)["split"] == "test" for line in DECISIONS.read_text().splitlines())
    log(f"gate wall on {'the tiny model' if tiny else 'the demo Gemma'}, {args.rounds} rounds")
    return report(run(tiny, args.rounds, tasks))


if __name__ == "__main__":
    sys.exit(main())
