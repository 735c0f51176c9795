"""No evidence is not a pass (issue 45 item 5): the online gate against an in-process router of fake SemIf copies whose
routing the test sets, so how many answers the candidate gets is known. Too few answers is inconclusive and follows
`validation.inconclusive.choice` (block and ask raise the alarm that rolls back, extend replays more rounds until the
gate decides, within its budget), also where SageMaker's update has ended with the gate undecided (`BakeWatch`);
answers are attributed by the serving id a copy echoes, so a candidate that changes only the temperature counts its
own answers apart from the champion's; answers that carry none stay readable."""

from __future__ import annotations

import itertools
import json
import math
import threading
from dataclasses import dataclass

import pytest

from shiplift.tasks.backends.interfaces import BakeAlarms, RolloutStep
from shiplift.tasks.pipeline.bake import BakeWatch
from shiplift.validation.decisions.jevbench import JevTask
from shiplift.validation.gates import ChampionRule, DecisionThresholds
from shiplift.validation.online_gate import OnlineGate
from shiplift.validation.runner import Prediction, echoed_serving_id

N_TASKS = 24
RULE = ChampionRule(min_samples=8, n_bootstrap=200, margin=1.0)
LENIENT = DecisionThresholds(min_accuracy=0.0, max_ece=1.0, min_validity=1.0)
GGUF_SHA = "a" * 64  # both copies run the same GGUF
CHAMPION_ID, CANDIDATE_ID = "c" * 64, "d" * 64


def _task(i: int) -> JevTask:
    return JevTask.model_validate({
        "id": f"t{i}", "family": "f", "group": None, "split": "test", "state": f"state {i}",
        "question": {"type": "choice", "instructions": "Pick one", "criteria": None},
        "labels": ["a", "b"], "expected": "a",
    })


TASKS = [_task(i) for i in range(N_TASKS)]


@dataclass(frozen=True)
class Copy:
    """One fake SemIf copy: the GGUF it runs, the serving id it echoes (None: an older image) and its temperature."""

    model_sha256: str
    serving_id: str | None
    temperature: float

    def answer(self, decision: dict) -> bytes:
        logits = [2.0, 0.0]  # the expected option first: the temperature changes the probabilities, not the answer
        weights = [math.exp(x / self.temperature) for x in logits]
        model = {"sha256": self.model_sha256, **({"serving_id": self.serving_id} if self.serving_id else {})}
        return json.dumps({"result": {
            "id": decision["id"], "option_ids": [o["id"] for o in decision["options"]],
            "probabilities": [w / sum(weights) for w in weights], "option_logits": logits, "allowed_token_mass": 1.0,
            "temperature": self.temperature, "model": model, "timings": {"forward_ms": 1.0, "total_ms": 1.0}}}).encode()


class Router:
    """An invoker whose requests go to `copies[route[n % len(route)]]` for the n-th request: the test decides which
    copy answers each request, as the least-busy router would."""

    def __init__(self, copies: list[Copy], route: list[int]):
        self.copies, self.route = copies, itertools.cycle(route)
        self.lock, self.requests = threading.Lock(), 0

    def describe(self) -> dict:
        return {"router": "in-process"}

    def open(self) -> Router:
        return self

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        with self.lock:
            self.requests += 1
            copy = self.copies[next(self.route)]
        return 200, copy.answer(json.loads(body)["decision"])

    def close(self) -> None:
        pass


ONE_IN_FIVE = [1, 0, 0, 0, 0]
CHAMPION = Copy(GGUF_SHA, CHAMPION_ID, temperature=1.0)
CANDIDATE = Copy(GGUF_SHA, CANDIDATE_ID, temperature=2.0)  # the same GGUF at another temperature


def _gate(router: Router, **settings) -> OnlineGate:
    return OnlineGate(router, TASKS, candidate_model_sha256=GGUF_SHA, candidate_serving_id=CANDIDATE_ID,
                      thresholds=LENIENT, champion_rule=RULE, concurrency=1, **settings)


@pytest.mark.parametrize("choice", ["block", "ask"])
def test_too_few_answers_is_inconclusive_and_blocks(choice):
    # one request in five reaches the candidate's copy: one round gives it 5 answers, below min_samples 8
    gate = _gate(Router([CHAMPION, CANDIDATE], ONE_IN_FIVE), rounds=1, inconclusive=choice)
    gate.replay()
    assert gate.report() is None and gate.decision() == "inconclusive"
    alarm = gate.alarm()
    assert alarm is not None and alarm.startswith("online gate inconclusive: 5 of 8 answers"), alarm
    assert "Fix:" in alarm and "validation.inconclusive.choice: extend" in alarm
    if choice == "ask":
        assert "cannot hold production mid-rollout waiting for a person" in alarm
    evidence = gate.evidence()
    assert (evidence["decision"], evidence["candidate_answers"], evidence["min_samples"]) == ("inconclusive", 5, 8)
    assert evidence["inconclusive_choice"] == choice and evidence["extended_rounds"] == 0


def test_extend_replays_more_rounds_until_the_gate_decides():
    router = Router([CHAMPION, CANDIDATE], ONE_IN_FIVE)
    gate = _gate(router, rounds=1, inconclusive="extend", extend_rounds=8)
    gate.replay()
    # round 1: requests 0, 5, …, 20 of 24 reach the candidate (5 answers); extension 1 resends all 24 (the candidate
    # lacks 19, the champion the other 5): requests 25, 30, …, 45 bring it 5 tasks it had not answered, 10 in all
    assert gate.extended == 1 and len(gate.answers[CANDIDATE_ID]) == 10
    assert router.requests == 2 * N_TASKS
    assert gate.decision() == "pass" and gate.alarm() is None
    assert gate.evidence()["extended_rounds"] == 1


def test_extend_is_bounded_and_stops_when_a_round_brings_nothing_new():
    budget = _gate(Router([CHAMPION, CANDIDATE], [1] + [0] * 24), rounds=1, inconclusive="extend", extend_rounds=2)
    budget.replay()  # one request in 25 reaches the candidate: a new task each round, 3 after the budget's 2 rounds
    assert budget.extended == 2 and len(budget.answers[CANDIDATE_ID]) == 3
    assert budget.alarm().startswith("online gate inconclusive: 3 of 8 answers") and "2 extra rounds" in budget.alarm()

    stuck = Router([CHAMPION, CANDIDATE], [0])  # no request ever reaches the candidate (its copies refuse, or none)
    gate = _gate(stuck, rounds=1, inconclusive="extend", extend_rounds=8)
    gate.replay()
    assert gate.extended == 1 and stuck.requests == 2 * N_TASKS, "the round that brought nothing new ended it"
    assert gate.alarm().startswith("online gate inconclusive: 0 of 8 answers")


def test_a_canary_that_changes_only_the_temperature_counts_its_own_answers():
    router = Router([CHAMPION, CANDIDATE], [0, 1])  # the router alternates between the two copies
    gate = _gate(router, rounds=8)
    gate.replay()
    assert set(gate.answers) == {CANDIDATE_ID, CHAMPION_ID}, "one GGUF, two serving ids: two identities"
    assert len(gate.answers[CANDIDATE_ID]) == N_TASKS
    assert {a.temperature for a in gate.answers[CANDIDATE_ID].values()} == {2.0}
    assert {a.temperature for a in gate.answers[CHAMPION_ID].values()} == {1.0}
    assert gate.report().sample_sizes["candidate"] == N_TASKS
    evidence = gate.evidence()
    assert evidence["attributed_by"] == "serving_id" and evidence["candidate"] == CANDIDATE_ID[:12]
    assert evidence["answers"] == {CANDIDATE_ID[:12]: N_TASKS, CHAMPION_ID[:12]: len(gate.answers[CHAMPION_ID])}

    by_sha = OnlineGate(Router([CHAMPION, CANDIDATE], [0, 1]), TASKS, candidate_model_sha256=GGUF_SHA,
                        thresholds=LENIENT, champion_rule=RULE, concurrency=1, rounds=8)
    by_sha.replay()  # without the candidate's serving id, the GGUF's sha256 counts every answer as the candidate's
    assert set(by_sha.answers) == {GGUF_SHA}
    assert {a.temperature for a in by_sha.answers[GGUF_SHA].values()} == {1.0, 2.0}


def test_answers_without_a_serving_id_stay_readable_and_are_attributed_by_sha():
    old_champion = Copy("b" * 64, None, temperature=1.0)  # an older image: no serving id in its answers
    old_candidate = Copy(GGUF_SHA, None, temperature=2.0)
    gate = _gate(Router([old_champion, old_candidate], [0, 1]), rounds=8)
    gate.replay()
    assert set(gate.answers) == {CANDIDATE_ID, "b" * 64}, "the candidate's GGUF answers are its own"
    assert len(gate.answers[CANDIDATE_ID]) == N_TASKS and gate.unattributed == 0

    line = gate.answers[CANDIDATE_ID]["t0"].to_dict()
    del line["serving_id"]  # a predictions line written before answers carried one
    assert Prediction.model_validate(line).serving_id is None


def test_the_serving_id_is_read_from_semif_and_chat_answers():
    assert echoed_serving_id(CANDIDATE.answer(TASKS[0].to_decision())) == CANDIDATE_ID
    assert echoed_serving_id(Copy(GGUF_SHA, None, 1.0).answer(TASKS[0].to_decision())) is None
    chat = {"model": f"/opt/ml/model/{GGUF_SHA}.gguf", "system_fingerprint": CANDIDATE_ID, "choices": []}
    assert echoed_serving_id(json.dumps(chat).encode()) == CANDIDATE_ID
    assert echoed_serving_id(json.dumps({**chat, "system_fingerprint": "fp_llama"}).encode()) is None


class SageMakerMetrics:
    """Metrics that do not split by spec, as CloudWatch's do not: the bake is the gate's round alone."""

    per_spec = False


MID_UPDATE = RolloutStep(phase="rollout", check=1, batches=2, copies=2, new_spec_sha256="e" * 64)
UPDATE_ENDED = RolloutStep(phase="rollout", check=2, batches=2, copies=2, old_copies=0, new_copies=2,
                           new_spec_sha256="e" * 64)


@pytest.mark.parametrize("choice", ["block", "ask"])
def test_on_sagemaker_an_undecided_gate_is_recorded_mid_update_and_raised_once_the_update_ended(choice):
    router = Router([CHAMPION, CANDIDATE], ONE_IN_FIVE)
    bake = BakeWatch(SageMakerMetrics(), "ep", "ic", "e" * 64, BakeAlarms(), 0.0,
                     online_gate=_gate(router, rounds=1, inconclusive=choice))
    assert bake(MID_UPDATE) is None, "SageMaker's batches still bake: only recorded"
    assert bake.evidence[MID_UPDATE.key()]["online_gate"]["decision"] == "inconclusive"
    assert router.requests == N_TASKS
    alarm = bake(UPDATE_ENDED)
    assert alarm is not None and alarm.startswith("online gate inconclusive: 5 of 8 answers"), alarm
    assert router.requests == N_TASKS, f"the bake is over: {choice} sends no new round"
    assert bake.evidence[UPDATE_ENDED.key()]["online_gate"]["candidate_answers"] == 5


def test_on_sagemaker_extend_gathers_its_rounds_once_the_update_ended_and_passes_on_them():
    router = Router([CHAMPION, CANDIDATE], ONE_IN_FIVE)
    bake = BakeWatch(SageMakerMetrics(), "ep", "ic", "e" * 64, BakeAlarms(), 0.0,
                     online_gate=_gate(router, rounds=1, inconclusive="extend", extend_rounds=1))
    router.route = itertools.cycle([0])  # mid-update every canary task lands on a champion copy
    assert bake(MID_UPDATE.model_copy(update={"check": 1})) is None
    assert bake.online_gate.decision() == "inconclusive" and bake.online_gate.extended == 1
    router.route = itertools.cycle([1])  # the update ended: every copy is the candidate's
    assert bake(UPDATE_ENDED) is None, "the extension's round decided it"
    gate = bake.evidence[UPDATE_ENDED.key()]["online_gate"]
    assert (gate["decision"], gate["candidate_answers"], gate["extended_rounds"]) == ("pass", N_TASKS, 2)
