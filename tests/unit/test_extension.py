"""validation.extension and the validate stage's choice for an inconclusive gate (`validation.inconclusive`).

The gate's first look is the real paired interval (validation.gates.evaluate_gates) on synthetic prediction rows; the
reserve is scored by fake scorers whose answers are drawn per task with a seed (a known true accuracy difference),
so each test knows what the extension must conclude. The config refusals go through the real config loader.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families.base import GateConfig
from shiplift.tasks.ledger.stage_results import ValidateResult
from shiplift.tasks.pipeline.approval import awaits_person
from shiplift.tasks.pipeline.approval_steps import approval_prompt
from shiplift.tasks.pipeline.stages import validate as validate_stage
from shiplift.validation.decisions.evaluate import DECISION_REPORT
from shiplift.validation.evaluate import GateOutcome, Target
from shiplift.validation.extension import Budget, Reserve, extend_champion_check
from shiplift.validation.gates import evaluate_gates
from shiplift.validation.metrics import paired_latency_ratio
from shiplift.validation.thresholds import ChampionRule

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "configs" / "releases" / "gemma-decision.yaml"
RULE = ChampionRule(margin=0.05, min_samples=30, n_bootstrap=500)
EXTEND = ('validation.inconclusive.extend={"datasets": [{"path": "builtin:decisions", "splits": ["calibration"]}], '
          '"batch": 50, "max_tasks": 1500}')
APPROVERS = ('promotion.approval={"required": true, "approvers": ["alice"]}',)  # choice ask needs someone to ask
PLAIN = ('validation.inconclusive={"choice": "block"}',)  # the shipped config extends; these tests start from block


def without_a_choice(folder: Path) -> Path:
    """gemma-decision.yaml as a config that names no inconclusive choice (the shipped one extends)."""
    tree = yaml.safe_load(GEMMA.read_text())
    tree["validation"].pop("inconclusive")
    path = folder / "gemma-decision.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def row(ident: str, right: bool, latency_ms: float = 10.0) -> dict:
    """A valid prediction row answering A (expected A when `right`, else expected B), one request of `latency_ms`."""
    return {"id": ident, "dataset": "d", "expected": "A" if right else "B", "option_ids": ["A", "B"],
            "probabilities": [0.8, 0.2], "option_logits": None, "allowed_token_mass": 0.99, "temperature": 1.0,
            "latency_ms": latency_ms, "server_forward_ms": None, "server_total_ms": None, "attempts": 1,
            "retries_503": 0, "error": None, "started_at": 0.0}


class Truth:
    """Per task, whether the champion and the candidate are right: the champion at 0.775, the two disagreeing on
    `disagreement` of the tasks, the candidate better by `difference` on average (drawn once per task, seeded)."""

    def __init__(self, *, disagreement: float, difference: float, seed: int):
        self.rng, self.q, self.delta, self.known = np.random.default_rng(seed), disagreement, difference, {}

    def __call__(self, ident: str) -> tuple[bool, bool]:
        if ident not in self.known:
            champion = bool(self.rng.random() < 0.775)
            differs = self.rng.random() < self.q
            if differs:  # only one of them right: the candidate with probability (q + delta)/(2q)
                candidate_right = self.rng.random() < (self.q + self.delta) / (2 * self.q)
                self.known[ident] = (candidate_right, not candidate_right)
            else:
                self.known[ident] = (champion, champion)
        return self.known[ident]


class Slowness:
    """Per request, each side's latency in ms: log-normal around 100 ms with log-spread `spread` (a busy machine), the
    candidate's scaled by `ratio` (so its true p95 over the champion's is `ratio`), drawn once per request, seeded."""

    def __init__(self, *, ratio: float, spread: float, seed: int):
        self.rng, self.ratio, self.spread, self.known = np.random.default_rng(seed), ratio, spread, {}

    def __call__(self, ident: str) -> tuple[float, float]:
        if ident not in self.known:
            mine, theirs = 100.0 * np.exp(self.spread * self.rng.normal(size=2))
            self.known[ident] = (self.ratio * float(mine), float(theirs))
        return self.known[ident]


def steady(ident: str) -> tuple[float, float]:
    """Both sides 10 ms on every request: a latency ratio of exactly 1."""
    return 10.0, 10.0


def rows_of(ids, truth: Truth, slowness, side: int) -> list[dict]:
    """One side's prediction rows (0: the candidate, 1: the champion) of `ids`."""
    return [row(i, truth(i)[side], slowness(i)[side]) for i in ids]


def first_gate(out_dir: Path, truth: Truth, n: int, rule: ChampionRule = RULE, slowness=steady) -> GateOutcome:
    """The gate's first look written as evaluate_decisions writes it (gate-report.json and the predictions files)."""
    ids = [f"gate-{i}" for i in range(n)]
    candidate, champion = rows_of(ids, truth, slowness, 0), rows_of(ids, truth, slowness, 1)
    report = evaluate_gates(candidate, thresholds=None, champion_preds=champion, champion_rule=rule).to_dict()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gate-report.json").write_text(json.dumps(report))
    for name, rows in (("predictions.jsonl", candidate), ("champion-predictions.jsonl", champion)):
        (out_dir / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out_dir / "report.html").write_text("<html></html>")
    return GateOutcome(decision=report["decision"], checks=report["checks"], thresholds=None, metrics=report["metrics"],
                       datasets=[], gate_report_json=out_dir / "gate-report.json", report_html=out_dir / "report.html")


def reserve_of(truth: Truth, size: int, calls: list | None = None, slowness=steady) -> Reserve:
    tasks = [SimpleNamespace(id=f"reserve-{i}") for i in range(size)]

    def score(target: Target, batch: list) -> list[dict]:
        if calls is not None:
            calls.append((target.label, len(batch)))
        return rows_of([task.id for task in batch], truth, slowness, 0 if target.label == "candidate" else 1)

    return Reserve(tasks=tasks, score=score, datasets=[{"name": "reserve0", "n": size}], parts=DECISION_REPORT)


CANDIDATE, CHAMPION = Target(None, "candidate"), Target(None, "champion")


def inconclusive_seed(n: int, rule: ChampionRule = RULE, slowness: dict | None = None,
                      inconclusive: set[str] | None = None, **truth) -> int:
    """A seed whose first look of `n` tasks is inconclusive (found, not assumed): on exactly the checks named in
    `inconclusive` when given; with latencies drawn by `Slowness(**slowness)` when given."""
    for seed in range(50):
        t = Truth(seed=seed, **truth)
        slow = steady if slowness is None else Slowness(seed=seed, **slowness)
        ids = [f"gate-{i}" for i in range(n)]
        report = evaluate_gates(rows_of(ids, t, slow, 0), thresholds=None, champion_preds=rows_of(ids, t, slow, 1),
                                champion_rule=rule)
        undecided = {check.name for check in report.checks if check.status == "inconclusive"}
        if report.decision == "inconclusive" and inconclusive in (None, undecided):
            return seed
    raise AssertionError("no inconclusive first look in 50 seeds")


def test_an_equal_candidate_left_inconclusive_is_passed_by_the_extension(tmp_path):
    seed = inconclusive_seed(111, disagreement=0.15, difference=0.0)
    truth = Truth(disagreement=0.15, difference=0.0, seed=seed)
    gate = first_gate(tmp_path, truth, 111)
    assert gate.decision == "inconclusive"
    calls: list = []
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                     reserve=reserve_of(truth, 1500, calls),
                                     rule=RULE, budget=Budget(batch=50, max_tasks=1500, deadline_s=600))
    assert (evidence["status"], evidence["decision"], evidence["stopped"]) == ("pass", "pass", "decided")
    assert evidence["looks"][0]["method"].startswith("Tango score") and evidence["looks"][-1]["status"] == "pass"
    assert evidence["n"] == 111 + evidence["reserve_tasks_scored"]
    assert evidence["extended"]["champion_accuracy"]["ci"][0] > -0.05 and set(evidence["extended"]) == {
        "champion_accuracy"}
    # alternating: the candidate answers first on odd looks, the champion on even ones
    assert [label for label, _ in calls[:4]] == ["candidate", "champion", "champion", "candidate"]
    written = json.loads((tmp_path / "extension.json").read_text())
    assert written["decision"] == "pass" and len(written["looks"]) == len(evidence["looks"])
    # the gate report a person opens shows the final decision, the first look kept beside it, and every look
    report = json.loads((tmp_path / "gate-report.json").read_text())
    assert report["decision"] == "pass" and report["first_look"]["decision"] == "inconclusive"
    assert next(c for c in report["checks"] if c["name"] == "champion_accuracy")["status"] == "pass"
    assert len(report["extension"]["looks"]) == len(evidence["looks"])
    page = (tmp_path / "report.html").read_text()
    assert 'id="decision">pass<' in page and "<h2>Extension</h2>" in page
    assert page.count("betting confidence sequence") == len(evidence["looks"]) - 1
    added = (tmp_path / "extension-predictions.jsonl").read_text().splitlines()
    champion_added = (tmp_path / "champion-extension-predictions.jsonl").read_text().splitlines()
    assert len(added) == evidence["reserve_tasks_scored"] == len(champion_added)
    check = next(c for c in evidence["checks"] if c["name"] == "champion_accuracy")
    assert check["status"] == "pass" and check["reason"].startswith("extended")


def test_a_candidate_worse_than_the_margin_is_failed_by_the_extension(tmp_path):
    seed = inconclusive_seed(40, disagreement=0.25, difference=-0.15)
    truth = Truth(disagreement=0.25, difference=-0.15, seed=seed)
    assert first_gate(tmp_path, truth, 40).decision == "inconclusive"
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                     reserve=reserve_of(truth, 1000),
                                     rule=RULE, budget=Budget(batch=50, max_tasks=1000, deadline_s=600))
    assert (evidence["status"], evidence["decision"]) == ("fail", "fail")
    assert evidence["extended"]["champion_accuracy"]["ci"][1] < -0.05


def test_a_spent_budget_leaves_it_inconclusive(tmp_path):
    seed = inconclusive_seed(111, disagreement=0.15, difference=0.0)
    truth = Truth(disagreement=0.15, difference=0.0, seed=seed)
    first_gate(tmp_path, truth, 111)
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                     reserve=reserve_of(truth, 20),
                                     rule=RULE, budget=Budget(batch=10, max_tasks=1000, deadline_s=600))
    assert (evidence["status"], evidence["decision"], evidence["stopped"],
            evidence["n"]) == ("inconclusive", "inconclusive", "tasks", 131)
    ticks = iter([0.0, 0.0, 11.0, 11.0, 11.0])  # start, first look at 0 s, the second one after the 10 s deadline
    timed = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                  reserve=reserve_of(truth, 1000),
                                  rule=RULE, budget=Budget(batch=10, max_tasks=1000, deadline_s=10),
                                  clock=lambda: next(ticks))
    assert (timed["stopped"], timed["reserve_tasks_scored"], timed["status"]) == ("time", 10, "inconclusive")


def test_no_look_is_taken_before_min_samples_paired_tasks(tmp_path):
    truth = Truth(disagreement=0.0, difference=0.0, seed=2)  # identical answers: the sequence passes once it may look
    gate = first_gate(tmp_path, truth, 20)  # 20 gate tasks, min_samples 30: the first look refuses to decide
    assert gate.decision == "inconclusive" and "min_samples=30" in gate.checks[0]["reason"]
    calls: list = []
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                     reserve=reserve_of(truth, 1000, calls),
                                     rule=RULE, budget=Budget(batch=4, max_tasks=1000, deadline_s=600))
    assert [look["n"] for look in evidence["looks"][:2]] == [20, 32]  # not 24 nor 28: fewer than min_samples
    assert calls[:2] == [("candidate", 12), ("champion", 12)] and evidence["status"] == "pass"
    short = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                  reserve=reserve_of(truth, 6),
                                  rule=RULE, budget=Budget(batch=4, max_tasks=1000, deadline_s=600))
    assert (short["status"], short["reserve_tasks_scored"], len(short["looks"])) == ("inconclusive", 0, 1)
    assert "26 paired tasks are fewer than min_samples=30" in short["reason"]


def test_the_ece_check_is_judged_again_at_the_end(tmp_path):
    rule = RULE.model_copy(update={"also_ece_margin": 0.5})
    seed = inconclusive_seed(111, disagreement=0.15, difference=0.0)
    truth = Truth(disagreement=0.15, difference=0.0, seed=seed)
    first_gate(tmp_path, truth, 111, rule)
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                     reserve=reserve_of(truth, 1500),
                                     rule=rule, budget=Budget(batch=50, max_tasks=1500, deadline_s=600))
    ece = next(c for c in evidence["checks"] if c["name"] == "champion_ece")
    assert ece["n"] == evidence["n"] and "after the extension" in ece["reason"]


def test_reserve_tasks_the_gate_already_read_are_refused(tmp_path):
    truth = Truth(disagreement=0.15, difference=0.0, seed=0)
    first_gate(tmp_path, truth, 40)
    overlapping = Reserve(tasks=[SimpleNamespace(id="gate-3")], score=lambda target, batch: [], datasets=[],
                          parts=DECISION_REPORT)
    with pytest.raises(ConfigError, match="also gate tasks"):
        extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION, reserve=overlapping,
                              rule=RULE, budget=Budget(batch=10, max_tasks=10, deadline_s=60))


# --- the latency ratio, extended --------------------------------------------------------------------------------

RATIO_RULE = RULE.model_copy(update={"max_p95_ratio": 2.0})
FIVE_LOOKS = Budget(batch=300, max_tasks=1500, deadline_s=600)  # planned before the first look: 5, Bonferroni over 5


def ratio_case(tmp_path: Path, *, ratio: float, disagreement: float, inconclusive: set[str]):
    """A first look inconclusive on exactly `inconclusive`, candidate latencies `ratio` times the champion's on a busy
    machine (log-spread 0.8), answers as equally good as the champion's at `disagreement`; and its reserve."""
    slowness = {"ratio": ratio, "spread": 0.8}
    seed = inconclusive_seed(111, RATIO_RULE, slowness, inconclusive, disagreement=disagreement, difference=0.0)
    truth, slow = Truth(disagreement=disagreement, difference=0.0, seed=seed), Slowness(seed=seed, **slowness)
    gate = first_gate(tmp_path, truth, 111, RATIO_RULE, slow)
    assert {c["name"] for c in gate.checks if c["status"] == "inconclusive"} == inconclusive
    return gate, reserve_of(truth, 1500, slowness=slow)


def all_rows(out_dir: Path, side: str) -> list[dict]:
    """The gate's and the extension's rows of one side, as written beside the report."""
    prefix = "" if side == "candidate" else "champion-"
    return [json.loads(line) for name in (f"{prefix}predictions.jsonl", f"{prefix}extension-predictions.jsonl")
            for line in (out_dir / name).read_text().splitlines()]


@pytest.mark.parametrize("ratio, decided", [(1.3, "pass"), (3.0, "fail")])
def test_an_inconclusive_latency_ratio_alone_is_decided_by_the_extension(tmp_path, ratio, decided):
    _, reserve = ratio_case(tmp_path, ratio=ratio, disagreement=0.0, inconclusive={"champion_p95_ratio"})
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION, reserve=reserve,
                                     rule=RATIO_RULE, budget=FIVE_LOOKS)
    assert (evidence["status"], evidence["decision"], evidence["stopped"]) == (decided, decided, "decided")
    assert set(evidence["extended"]) == {"champion_p95_ratio"} and evidence["planned_looks"][-1] == 111 + 1500
    assert {look["check"] for look in evidence["looks"]} == {"champion_p95_ratio"}
    assert evidence["looks"][-1]["method"] == "paired bootstrap of the p95 ratio, Bonferroni over 5 looks"
    final = next(c for c in evidence["checks"] if c["name"] == "champion_p95_ratio")
    assert final["status"] == decided and final["reason"].startswith(f"extended: look {len(evidence['looks']) - 1} "
                                                                     "of 5, interval at 0.99 (Bonferroni")
    low, high = final["ci"]
    assert high <= 2.0 if decided == "pass" else low > 2.0
    # judged on ALL paired requests so far (the gate's and the reserve's; each side's first, cold one left out) ...
    candidate_rows, champion_rows = all_rows(tmp_path, "candidate"), all_rows(tmp_path, "champion")
    assert final["n"] == 111 + evidence["reserve_tasks_scored"] - 1 == len(candidate_rows) - 1
    # ... at the per-look confidence 0.99: wider than the plain 95 % interval of the same requests, around it
    plain = paired_latency_ratio(candidate_rows, champion_rows, n_bootstrap=2000, seed=0, confidence=0.95)
    assert low < plain["ci"][0] <= plain["ci"][1] < high and final["observed"] == pytest.approx(plain["ratio"])
    accuracy = next(c for c in evidence["checks"] if c["name"] == "champion_accuracy")
    assert accuracy["status"] == "pass" and accuracy["n"] == 111  # decided at the first look: not judged again
    page = (tmp_path / "report.html").read_text()
    assert f'id="decision">{decided}<' in page and page.count("Bonferroni over 5 looks") == len(evidence["looks"]) - 1


def test_an_inconclusive_accuracy_and_ratio_are_both_judged_until_both_decide(tmp_path):
    _, reserve = ratio_case(tmp_path, ratio=1.3, disagreement=0.15,
                            inconclusive={"champion_accuracy", "champion_p95_ratio"})
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION, reserve=reserve,
                                     rule=RATIO_RULE, budget=FIVE_LOOKS)
    assert (evidence["decision"], evidence["stopped"]) == ("pass", "decided")
    assert {name: check["status"] for name, check in evidence["extended"].items()} == {
        "champion_accuracy": "pass", "champion_p95_ratio": "pass"}
    by_check = {name: [look for look in evidence["looks"] if look["check"] == name] for name in evidence["extended"]}
    last = max(look["look"] for look in evidence["looks"])
    # the extension stopped at the look where the later of the two decided; the earlier was not judged after it
    assert last == max(looks[-1]["look"] for looks in by_check.values())
    assert all(look["status"] == "inconclusive" for looks in by_check.values() for look in looks[:-1])


def test_a_ratio_still_inconclusive_when_the_reserve_runs_out_blocks(tmp_path):
    truth = Truth(disagreement=0.0, difference=0.0, seed=0)
    slowness = {"ratio": 2.0, "spread": 0.8}  # exactly at the threshold: no number of requests decides it
    seed = inconclusive_seed(111, RATIO_RULE, slowness, {"champion_p95_ratio"}, disagreement=0.0, difference=0.0)
    slow = Slowness(seed=seed, **slowness)
    first_gate(tmp_path, truth, 111, RATIO_RULE, slow)
    evidence = extend_champion_check(tmp_path, title="t", candidate=CANDIDATE, champion=CHAMPION,
                                     reserve=reserve_of(truth, 200, slowness=slow), rule=RATIO_RULE,
                                     budget=Budget(batch=100, max_tasks=1000, deadline_s=600))
    assert (evidence["decision"], evidence["stopped"], evidence["reserve_tasks_scored"]) == ("inconclusive", "tasks",
                                                                                             200)
    assert [look["look"] for look in evidence["looks"]] == [0, 1, 2]


# --- the config -------------------------------------------------------------------------------------------------

def test_the_choice_defaults_to_block_and_leaves_the_config_hash_alone(tmp_path):
    unnamed = without_a_choice(tmp_path)
    plain = load_release_config(unnamed, environ={})
    blocked = load_release_config(unnamed, overrides=("validation.inconclusive.choice=block",), environ={})
    assert plain.validation.inconclusive.choice == "block"
    assert plain.config_hash() == blocked.config_hash()
    assert "inconclusive" not in plain.model_dump(mode="json")["validation"]
    extended = load_release_config(unnamed, overrides=("validation.inconclusive.choice=extend", EXTEND), environ={})
    assert extended.validation.inconclusive.extend.batch == 50 and extended.config_hash() != plain.config_hash()


@pytest.mark.parametrize("overrides, says", [
    (("validation.inconclusive.choice=extend",), "needs validation.inconclusive.extend"),
    (("validation.inconclusive.choice=ask", EXTEND), "would never be used"),
    (("validation.inconclusive.choice=ask",), "promotion.approval names nobody"),
    (("validation.inconclusive.choice=maybe",), "'block', 'extend' or 'ask'"),
    (("validation.inconclusive.choice=extend", 'validation.inconclusive.extend={"datasets": []}'), "at least 1 item"),
    (("validation.inconclusive.choice=extend", EXTEND, "validation.inconclusive.extend.batch=0"),
     "greater than or equal to 1"),
    (("validation.inconclusive.when=now",), "unknown key"),
])
def test_bad_choices_are_refused(overrides, says):
    with pytest.raises(ConfigError, match=says):
        load_release_config(GEMMA, overrides=(*PLAIN, *overrides), environ={})


def test_a_family_that_cannot_extend_is_refused():
    extend = {"choice": "extend", "extend": {"datasets": [{"path": "x.jsonl"}]}}
    with pytest.raises(ValidationError, match="parity gates cannot yet"):  # a gate config that is not extendable
        GateConfig(kind="parity", datasets=[{"path": "x.jsonl"}], thresholds=None, inconclusive=extend)


def test_the_decision_family_loads_its_reserve():
    config = load_release_config(GEMMA, overrides=("validation.inconclusive.choice=extend", EXTEND), environ={})
    reserve = config.family.reserve(config.validation, GEMMA.parent, validate_stage.run_settings(config.validation))
    assert len(reserve.tasks) == 71 and reserve.datasets[0]["n"] == 71


# --- the validate stage's choice --------------------------------------------------------------------------------

def stage_ctx(overrides: tuple[str, ...], truth: Truth, said: list, *, slowness=steady, items_per_request: int = 1):
    """The validate stage's context for `follow_choice`: gemma-decision.yaml (margin 0.05, its max_p95_ratio 2) with
    `overrides`, and a family whose reserve `reserve_of` scores and whose requests hold `items_per_request` items."""
    config = load_release_config(GEMMA,
                                 overrides=(*PLAIN, "validation.champion.margin=0.05",
                                            "validation.champion.n_bootstrap=500", *overrides), environ={})
    family = SimpleNamespace(
        reserve=lambda validation, config_dir, settings, progress: reserve_of(truth, 1500, slowness=slowness),
        items_per_request=lambda validation: items_per_request)
    return SimpleNamespace(config=config, config_dir=GEMMA.parent, say=said.append, family=family, release_id="r-test")


@pytest.mark.parametrize("choice", ["block", "ask", "extend"])
def test_an_inconclusive_gate_follows_its_choice(tmp_path, choice):
    seed = inconclusive_seed(111, disagreement=0.15, difference=0.0)
    truth = Truth(disagreement=0.15, difference=0.0, seed=seed)
    gate = first_gate(tmp_path, truth, 111)
    said: list = []
    overrides = {"block": (), "ask": ("validation.inconclusive.choice=ask", *APPROVERS),
                 "extend": ("validation.inconclusive.choice=extend", EXTEND)}[choice]
    decision, checks, record = validate_stage.follow_choice(stage_ctx(overrides, truth, said), gate, CANDIDATE,
                                                            CHAMPION)
    assert record["choice"] == choice and record["first_look"]["decision"] == "inconclusive"
    if choice == "block":
        assert (decision, record["outcome"], checks) == ("inconclusive", "blocked", gate.checks)
        assert not (tmp_path / "extension.json").exists()
    if choice == "ask":
        assert (decision, record["outcome"]) == ("inconclusive", "asked")
        assert record["interval"] == next(c["ci"] for c in gate.checks if c["name"] == "champion_accuracy")
        assert record["power"][0]["check"] == "champion_accuracy" and 0.0 <= record["power"][0]["equal_passes"] <= 1.0
        assert record["power"][0]["spread"]["source"].startswith("ledger")  # the gate's own disagreement, counted
    if choice == "extend":
        assert (decision, record["outcome"]) == ("pass", "extended: pass")
        assert record["extension"]["looks"][-1]["status"] == "pass" and (tmp_path / "extension.json").is_file()
        assert next(c for c in checks if c["name"] == "champion_accuracy")["status"] == "pass"


FIVE_LOOKS_EXTEND = EXTEND.replace('"batch": 50', '"batch": 300')


@pytest.mark.parametrize("items_per_request", [1, 8])
def test_an_inconclusive_latency_ratio_alone_is_extended_where_a_row_is_a_request(tmp_path, items_per_request):
    gate, reserve = ratio_case(tmp_path, ratio=1.3, disagreement=0.0, inconclusive={"champion_p95_ratio"})
    assert gate.decision == "inconclusive"
    said: list = []
    ctx = stage_ctx(("validation.inconclusive.choice=extend", FIVE_LOOKS_EXTEND), Truth(disagreement=0.0,
                    difference=0.0, seed=0), said, items_per_request=items_per_request)
    ctx.family.reserve = lambda validation, config_dir, settings, progress: reserve
    assert ctx.config.validation.champion.max_p95_ratio == RATIO_RULE.max_p95_ratio
    decision, checks, record = validate_stage.follow_choice(ctx, gate, CANDIDATE, CHAMPION)
    if items_per_request == 1:  # the old code blocked here: only an inconclusive champion_accuracy was extended
        assert (decision, record["outcome"]) == ("pass", "extended: pass")
        assert next(c for c in checks if c["name"] == "champion_p95_ratio")["status"] == "pass"
        assert record["extension"]["looks"][-1]["check"] == "champion_p95_ratio"
    else:  # a request holds a batch of items (NLI): the reserve's rows are not requests, so the ratio is not extended
        assert (decision, record["outcome"], checks) == ("inconclusive", "blocked", gate.checks)
        assert "inconclusive here: champion_p95_ratio" in record["why"] and not (tmp_path / "extension.json").exists()


@pytest.mark.parametrize("undecided, choice, ratio_per_request, allowed", [
    ({"champion_accuracy"}, "extend", True, True),
    ({"champion_p95_ratio", "champion_ece"}, "extend", True, True),
    ({"champion_accuracy", "champion_p95_ratio", "champion_ece"}, "ask", False, True),
    ({"champion_ece"}, "extend", True, False),  # ECE alone: nothing judged sequentially, so it blocks
    ({"champion_accuracy", "accuracy"}, "extend", True, False),  # an absolute check no extension can change
    ({"champion_accuracy", "champion_p95_ratio"}, "extend", False, False),
])
def test_which_inconclusive_checks_an_escape_takes(undecided, choice, ratio_per_request, allowed):
    why = validate_stage.escape_refused(choice, undecided, ratio_per_request=ratio_per_request)
    assert (why is None) == allowed
    if why:
        assert why.endswith(f"inconclusive here: {', '.join(sorted(undecided))}")


def test_a_decided_gate_records_no_choice(tmp_path):
    truth = Truth(disagreement=0.0, difference=0.0, seed=1)  # identical answers: the interval is [0, 0], a pass
    gate = first_gate(tmp_path, truth, 111)
    decision, checks, record = validate_stage.follow_choice(stage_ctx(("validation.inconclusive.choice=ask",
                                                                       *APPROVERS), truth, []),
                                                            gate, CANDIDATE, CHAMPION)
    assert (decision, record) == ("pass", None)


def validate_result(decision: str, inconclusive: dict | None) -> ValidateResult:
    extra = {} if inconclusive is None else {"inconclusive": inconclusive}
    return ValidateResult(decision=decision, metrics={}, checks=[], not_passed=[], thresholds={}, datasets=[],
                          report_json="r.json", report_html="r.html", evidence={}, **extra)


def test_only_an_asked_inconclusive_gate_with_approvers_goes_to_a_person():
    with_people = load_release_config(GEMMA, overrides=(*PLAIN, *APPROVERS), environ={})
    nobody = load_release_config(GEMMA, overrides=PLAIN, environ={})
    asked = validate_result("inconclusive", {"choice": "ask", "outcome": "asked"})
    assert awaits_person(asked, with_people)
    assert not awaits_person(asked, nobody)  # no approver could answer: it blocks
    assert not awaits_person(validate_result("inconclusive", {"choice": "block", "outcome": "blocked"}), with_people)
    assert awaits_person(validate_result("pass", None), with_people)


def test_the_approvers_prompt_shows_the_interval_and_the_power():
    request = {"gate": {"decision": "inconclusive", "not_passed": [], "report_html": "r.html", "report_sha256": "ab"},
               "champion_release": "r0", "opened_by": "bob", "four_eyes": True, "approvers": ["alice"],
               "deadline": "2026-12-09T00:00:00+00:00", "candidate_kept": False,
               "inconclusive": {"choice": "ask", "interval": [-0.07, 0.03], "n": 111, "margin": 0.05,
                                "power_text": ["champion_accuracy: an equally good candidate passes with probability "
                                               "0.43"]}}
    _, body = approval_prompt("r1", "gemma", request, {"result": {"checks": []}})
    assert "inconclusive gate" in body and "[-0.07, 0.03]" in body and "probability 0.43" in body
