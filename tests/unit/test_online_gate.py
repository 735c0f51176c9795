"""The online gate against real SemIf copies of two different tiny models behind one router, mid-canary."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.hashing import sha256_file
from tasks.backends.local.rollout import roll_out
from tasks.backends.local.supervisor import ProcessSupervisor
from tasks.backends.local.hosting import process_spec
from tasks.backends.interfaces import RolloutPlan, RolloutStep
from tasks.artifacts.tiny_gguf import write_tiny_gguf
from validation.gates import ChampionRule, DecisionThresholds
from validation.jevbench import load_jevbench
from validation.online_gate import OnlineGate
from validation.transport import HttpInvoker

DECISIONS = Path(__file__).resolve().parents[2] / "validation" / "data" / "decisions.jsonl"
N_TASKS = 24
RULE = ChampionRule(min_samples=8, n_bootstrap=200, margin=1.0)  # random tiny models: any drop is allowed


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """Two tiny GGUF model folders (seeds 0 and 3): the champion and the candidate."""
    folders = {}
    for name, seed in (("champion", 0), ("candidate", 3)):
        folder = tmp_path_factory.mktemp(name)
        write_tiny_gguf(folder / "model.gguf", seed=seed)
        folders[name] = folder
    return folders


def _spec(folder: Path, version: str):
    return process_spec("semif", folder, {"SEMIF_THREADS": "1", "SEMIF_MAX_TOKENS": "2048"}, copies=2,
                        model_ref={"version": version})


def _tasks():
    return [t for t in load_jevbench(DECISIONS) if t.split == "test"][:N_TASKS]


@pytest.mark.parametrize("thresholds, decision", [
    (DecisionThresholds(min_accuracy=0.0, max_ece=1.0, min_validity=1.0), "pass"),
    (DecisionThresholds(min_accuracy=0.99, max_ece=1.0, min_validity=1.0), "fail"),
])
def test_answers_are_attributed_by_model_and_the_candidate_is_judged_on_its_own(tmp_path, models, thresholds, decision):
    hosting = ProcessSupervisor(tmp_path / "state", stop_grace_s=3)
    candidate_sha = sha256_file(models["candidate"] / "model.gguf")
    champion_sha = sha256_file(models["champion"] / "model.gguf")
    seen: dict = {}
    try:
        hosting.ensure_endpoint("ep-gate")
        hosting.put_component("ep-gate", "semif", _spec(models["champion"], "v1"), ready_timeout_s=60)
        gate = OnlineGate(HttpInvoker(hosting.endpoint_url("ep-gate"), "semif", runtime=True), _tasks(),
                          candidate_model_sha256=candidate_sha, thresholds=thresholds, champion_rule=RULE, rounds=8)

        def bake(step: RolloutStep) -> str | None:
            if step.batch == 1:  # one candidate copy beside one champion copy
                gate.replay()
                seen.update(answers={sha: len(ids) for sha, ids in gate.answers.items()}, alarm=gate.alarm(),
                            report=gate.report(), evidence=gate.evidence())
                return seen["alarm"]
            return None

        result = roll_out(hosting, "ep-gate", "semif", _spec(models["candidate"], "v2"), RolloutPlan(strategy="canary"),
                          bake, ready_timeout_s=60)
    finally:
        hosting.delete_endpoint("ep-gate")
    assert seen["answers"][candidate_sha] == N_TASKS, "every canary task reached a candidate copy within the rounds"
    assert seen["answers"][champion_sha] > 0, "the champion copy answered some of the replays"
    assert set(seen["answers"]) == {candidate_sha, champion_sha}
    assert seen["report"].sample_sizes["candidate"] == N_TASKS
    assert seen["report"].decision == decision
    assert seen["evidence"]["candidate_answers"] == N_TASKS and seen["evidence"]["decision"] == decision
    if decision == "pass":
        assert seen["alarm"] is None and result.status == "succeeded"
    else:
        assert seen["alarm"].startswith(f"online gate failed on {N_TASKS} canary tasks: accuracy")
        assert result.status == "rolled_back" and result.reason == seen["alarm"]
