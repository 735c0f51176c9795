"""The online gate against real SemIf copies behind one router, mid-canary: two different tiny models (attributed by
the GGUF's sha256, as servers that echo no serving id are), and one tiny model at two temperatures (the same GGUF: told
apart only by the serving id the hosting hands each copy and the server echoes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.backends.interfaces import ComponentSpec, Compute, ModelRef, RolloutPlan, RolloutStep
from shiplift.tasks.backends.local.hosting import process_spec
from shiplift.tasks.backends.local.rollout import roll_out
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.hashing import sha256_file
from shiplift.validation.decisions.jevbench import load_jevbench
from shiplift.validation.gates import ChampionRule, DecisionThresholds
from shiplift.validation.online_gate import OnlineGate
from shiplift.validation.transport import HttpInvoker

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


def _neutral(artifact_sha256: str, environment: dict[str, str]) -> ComponentSpec:
    """The backend-neutral spec a copy serves (the local hosting keeps it with the process spec)."""
    image = "sha256:" + "1" * 64
    return ComponentSpec(image_uri=f"local/semif@{image}", artifact_uri=f"file:///store/{artifact_sha256}",
                         artifact_sha256=artifact_sha256, environment=environment, copies=2,
                         compute=Compute(memory_mb=512),
                         model_ref=ModelRef(release_id="r", artifact_sha256=artifact_sha256, image_digest=image))


def test_a_canary_that_changes_only_the_temperature_counts_its_own_answers(tmp_path, models):
    """The candidate is the champion's GGUF with a fitted temperature (another artifact): both copies report the same
    model sha256, and the gate still scores the candidate on its own answers by the serving id each copy echoes."""
    gguf = models["champion"] / "model.gguf"
    fitted = tmp_path / "fitted"
    fitted.mkdir()
    (fitted / "model.gguf").write_bytes(gguf.read_bytes())
    (fitted / "calibration.json").write_text('{"temperature": 2.0}')
    env = {"SEMIF_THREADS": "1", "SEMIF_MAX_TOKENS": "2048"}
    champion, candidate = _neutral("2" * 64, env), _neutral("3" * 64, env)
    specs = {name: process_spec("semif", folder, env, copies=2, model_ref={"version": name},
                                neutral=neutral.model_dump(mode="json"))
             for name, folder, neutral in (("v1", models["champion"], champion), ("v2", fitted, candidate))}
    hosting = ProcessSupervisor(tmp_path / "state", stop_grace_s=3)
    seen: dict = {}
    try:
        hosting.ensure_endpoint("ep-temp")
        hosting.put_component("ep-temp", "semif", specs["v1"], ready_timeout_s=60)
        gate = OnlineGate(HttpInvoker(hosting.endpoint_url("ep-temp"), "semif", runtime=True), _tasks(),
                          candidate_model_sha256=sha256_file(gguf), candidate_serving_id=candidate.serving_id(),
                          thresholds=DecisionThresholds(min_accuracy=0.0, max_ece=1.0, min_validity=1.0),
                          champion_rule=RULE, rounds=8)

        def bake(step: RolloutStep) -> str | None:
            if step.batch == 1:  # one candidate copy beside one champion copy
                gate.replay()
                seen.update(answers={who: dict(by_task) for who, by_task in gate.answers.items()}, alarm=gate.alarm())
            return None

        result = roll_out(hosting, "ep-temp", "semif", specs["v2"], RolloutPlan(strategy="canary"), bake,
                          ready_timeout_s=60)
    finally:
        hosting.delete_endpoint("ep-temp")
    assert result.status == "succeeded" and seen["alarm"] is None
    assert set(seen["answers"]) == {candidate.serving_id(), champion.serving_id()}, "one GGUF, two identities"
    mine, theirs = seen["answers"][candidate.serving_id()], seen["answers"][champion.serving_id()]
    assert len(mine) == N_TASKS and theirs, "the champion's copy answered some replays, counted apart"
    assert {a.temperature for a in mine.values()} == {2.0} and {a.temperature for a in theirs.values()} == {1.0}
    assert {a.model_sha256 for a in [*mine.values(), *theirs.values()]} == {sha256_file(gguf)}
