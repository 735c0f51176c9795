"""The sweep's selection rule (issue 48): constraints (absolute, and champion-relative on the paired interval's worse
end), missing evidence that never passes, the Pareto frontier on the dominance axes checked against an independent
brute-force implementation on seeded random sweeps, the lexicographic pick and its tie-break, the rule's hash, and
the evidence's JSON round trip."""

from __future__ import annotations

import itertools
import random

import pytest
import yaml
from pydantic import ValidationError

from shiplift.tasks.errors import BadInput
from shiplift.validation.sweep_rule import CandidateEvidence, Constraint, Objective, SelectionRule, choose

HIGHER_BETTER = {"accuracy", "valid_rate"}  # the test's own table of directions (every other metric: lower better)
RULE = {
    "constraints": [{"metric": "accuracy", "not_worse_than_champion_by": 0.02}, {"metric": "p95_ms", "at_most": 800}],
    "objective": [{"metric": "usd_per_1m_decisions", "direction": "min"}, {"metric": "p95_ms", "direction": "min"}],
}
NEAR = {"accuracy_vs_champion": (-0.01, 0.02)}  # a paired interval that meets a 0.02 margin


def ev(name, *, acc=0.77, p95=500.0, usd=0.3, intervals=None, **more):
    return CandidateEvidence(name=name, config_sha256=f"{name}-sha",
                             metrics={"accuracy": acc, "p95_ms": p95, "usd_per_1m_decisions": usd, **more},
                             intervals=NEAR if intervals is None else intervals)


def statuses(pick):
    return {v.name: v.status for v in pick.verdicts}


def reasons(pick):
    return {v.name: v.reason for v in pick.verdicts}


def test_hand_made_sweep_gives_the_frontier_the_pick_and_a_reason_for_every_loser():
    rule = SelectionRule.model_validate(RULE)
    pick = choose(rule, [
        ev("q4-c7i", usd=0.3, p95=500),
        ev("q8-c7i", usd=0.5, p95=700),  # dearer, slower, as accurate: dominated by q4-c7i
        ev("q8-g5", usd=0.5, p95=1240, acc=0.78),  # breaks the p95 ceiling
        ev("q2", usd=0.1, p95=300, acc=0.70, intervals={"accuracy_vs_champion": (-0.09, -0.05)}),
        ev("q5", usd=0.6, p95=300, acc=0.79),  # dearer but faster and more accurate: on the frontier
    ])
    assert pick.picked == "q4-c7i"
    assert pick.frontier == ["q4-c7i", "q5"]
    assert statuses(pick) == {"q4-c7i": "picked", "q5": "frontier", "q8-c7i": "dominated", "q8-g5": "violates",
                              "q2": "violates"}
    why = reasons(pick)
    assert why["q8-g5"] == "violates p95_ms <= 800 (measured 1,240)"
    assert why["q8-c7i"] == "dominated by q4-c7i (cheaper per decision, faster at p95, as accurate)"
    assert "worse end -0.09" in why["q2"]
    assert "q4-c7i is better on min usd_per_1m_decisions (0.3 vs 0.6)" in why["q5"]
    assert [v.name for v in pick.verdicts] == sorted(why)
    assert pick.rule_sha256 == rule.sha256()


@pytest.mark.parametrize("missing, needed_by", [
    ("p95_ms", "violates p95_ms <= 800 (not measured)"),  # a constraint's metric
    ("usd_per_1m_decisions", "usd_per_1m_decisions not measured, which the objective needs"),
    ("accuracy", "accuracy not measured, which dominance needs"),  # only a champion constraint and the axis need it
])
def test_a_missing_metric_violates_and_says_what_is_missing(missing, needed_by):
    lacking = ev("lacking")
    lacking.metrics[missing] = None
    pick = choose(SelectionRule.model_validate(RULE), [lacking, ev("measured", usd=9.0, p95=799)])
    assert statuses(pick) == {"lacking": "violates", "measured": "picked"}
    assert needed_by in reasons(pick)["lacking"]


def test_a_missing_champion_interval_violates_a_champion_relative_constraint():
    pick = choose(SelectionRule.model_validate(RULE), [ev("no-pair", intervals={})])
    assert pick.picked is None and pick.frontier == []
    assert "no paired interval against the champion" in reasons(pick)["no-pair"]


@pytest.mark.parametrize("metric, interval, ok", [
    ("accuracy", (-0.03, 0.05), False),  # centre +0.01, but the low (worse) end is below -0.02
    ("accuracy", (-0.02, -0.01), True),  # wholly below zero, yet not worse by more than the margin
    ("accuracy", (-0.019, 0.5), True),
    ("ece", (-0.05, 0.03), False),  # lower is better: the high end is the worse one
    ("ece", (-0.5, 0.02), True),
])
def test_champion_relative_constraint_judges_the_worse_end_of_the_paired_interval(metric, interval, ok):
    rule = SelectionRule(constraints=[Constraint(metric=metric, not_worse_than_champion_by=0.02)],
                         objective=[Objective(metric="usd_per_1m_decisions", direction="min")])
    pick = choose(rule, [ev("c", ece=0.05, intervals={f"{metric}_vs_champion": interval})])
    assert (pick.picked == "c") is ok
    if not ok:
        worse = interval[0] if metric == "accuracy" else interval[1]
        assert f"worse end {worse:.4g}" in reasons(pick)["c"]


def test_a_tie_at_every_key_goes_to_the_name_sorting_first_whatever_the_input_order():
    rule = SelectionRule.model_validate(RULE)
    twins = [ev("zeta"), ev("alpha"), ev("mid")]
    picks = [choose(rule, order) for order in itertools.permutations(twins)]
    assert all(p == picks[0] for p in picks)
    pick = picks[0]
    assert pick.picked == "alpha" and pick.frontier == ["alpha", "mid", "zeta"]
    assert "ties mid, zeta on every objective key and sorts first by name" in reasons(pick)["alpha"]
    assert reasons(pick)["zeta"] == ("on the frontier; ties alpha on every objective key, and alpha sorts first by "
                                     "name")


def test_accuracy_is_a_dominance_axis_even_when_only_a_constraint_uses_it():
    rule = SelectionRule.model_validate(RULE)
    pick = choose(rule, [ev("cheap", usd=0.3, acc=0.70), ev("accurate", usd=0.4, acc=0.80)])
    assert pick.picked == "cheap" and pick.frontier == ["cheap", "accurate"]  # not dominated: more accurate
    pick = choose(rule, [ev("cheap", acc=0.70), ev("same-but-better", acc=0.80)])  # ties on the objective
    assert pick.picked == "same-but-better"
    assert reasons(pick)["cheap"] == ("dominated by same-but-better (as cheap per decision, as fast at p95, more "
                                      "accurate)")


def test_no_candidate_meeting_the_rule_picks_nothing_and_every_verdict_says_why():
    pick = choose(SelectionRule.model_validate(RULE), [ev("slow", p95=900), ev("worse", intervals={
        "accuracy_vs_champion": (-0.1, 0.0)})])
    assert pick.picked is None and pick.frontier == []
    assert statuses(pick) == {"slow": "violates", "worse": "violates"}
    assert all(v.reason.startswith("violates ") for v in pick.verdicts)


def test_repeated_candidate_names_are_refused():
    with pytest.raises(BadInput, match="more than once"):
        choose(SelectionRule.model_validate(RULE), [ev("a"), ev("a")])


# ------------------------------------------------------------------------------------------------------------------
# Against a brute-force implementation written from the semantics, on seeded random sweeps

GRID = {"accuracy": (0.6, 0.7, 0.8), "ece": (0.02, 0.05, 0.1), "valid_rate": (0.98, 1.0),
        "p95_ms": (200.0, 400.0, 800.0), "usd_per_1m_decisions": (0.1, 0.2, 0.4), "usd_per_hour": (0.5, 1.0)}


def random_rule(rng):
    pool = [{"metric": "p95_ms", "at_most": 400.0}, {"metric": "ece", "at_most": 0.05},
            {"metric": "valid_rate", "at_least": 1.0}, {"metric": "accuracy", "at_least": 0.7},
            {"metric": "accuracy", "not_worse_than_champion_by": 0.02},
            {"metric": "ece", "not_worse_than_champion_by": 0.01}]
    keys = rng.sample(["usd_per_1m_decisions", "p95_ms", "accuracy", "ece", "usd_per_hour"], rng.randint(1, 3))
    return SelectionRule.model_validate({
        "constraints": rng.sample(pool, rng.randint(0, 3)),
        "objective": [{"metric": k, "direction": "max" if k in HIGHER_BETTER else "min"} for k in keys]})


def random_candidate(rng, i):
    metrics = {m: (None if rng.random() < 0.05 else rng.choice(values)) for m, values in GRID.items()}
    intervals = {}
    for key in ("accuracy_vs_champion", "ece_vs_champion"):
        if rng.random() < 0.9:
            low = rng.choice((-0.05, -0.02, -0.01, 0.0))
            intervals[key] = (low, low + rng.choice((0.0, 0.01, 0.03)))
    return CandidateEvidence(name=f"c{i:02d}", config_sha256=str(i), metrics=metrics, intervals=intervals)


def brute_force(rule, candidates):
    """The semantics written out plainly: eligibility, then every pair compared, then the best by sort."""
    def meets(c, con):
        if con.not_worse_than_champion_by is not None:
            pair = c.intervals.get(con.metric + "_vs_champion")
            if pair is None:
                return False
            return (pair[0] >= -con.not_worse_than_champion_by if con.metric in HIGHER_BETTER
                    else pair[1] <= con.not_worse_than_champion_by)
        v = c.metrics.get(con.metric)
        return v is not None and (v <= con.at_most if con.at_most is not None else v >= con.at_least)

    axes = list(dict.fromkeys([o.metric for o in rule.objective] + ["accuracy"]))
    eligible = [c for c in candidates
                if all(meets(c, con) for con in rule.constraints) and all(c.metrics.get(a) is not None for a in axes)]

    def good(c):  # bigger is better on every axis
        return [c.metrics[a] if a in HIGHER_BETTER else -c.metrics[a] for a in axes]

    def beats(a, b):
        return all(x >= y for x, y in zip(good(a), good(b), strict=True)) and good(a) != good(b)

    frontier = {c.name for c in eligible if not any(beats(o, c) for o in eligible)}
    ranked = sorted((c for c in eligible if c.name in frontier),
                    key=lambda c: ([-(c.metrics[o.metric] if o.metric in HIGHER_BETTER else -c.metrics[o.metric])
                                    for o in rule.objective], c.name))
    picked = ranked[0].name if ranked else None
    status = {c.name: "violates" for c in candidates}
    status.update({c.name: "dominated" for c in eligible})
    status.update({n: "frontier" for n in frontier})
    if picked:
        status[picked] = "picked"
    return picked, frontier, status, beats, {c.name: c for c in candidates}


def test_frontier_and_pick_agree_with_a_brute_force_implementation_on_random_sweeps():
    rng = random.Random(48)
    seen = set()
    for trial in range(400):
        rule = random_rule(rng)
        candidates = [random_candidate(rng, i) for i in range(rng.randint(1, 9))]
        pick = choose(rule, candidates)
        picked, frontier, status, beats, by_name = brute_force(rule, candidates)
        assert (pick.picked, set(pick.frontier), statuses(pick)) == (picked, frontier, status), f"trial {trial}"
        assert pick.frontier[:1] == ([picked] if picked else [])
        assert choose(rule, list(reversed(candidates))) == pick
        for verdict in pick.verdicts:
            seen.add(verdict.status)
            if verdict.status == "dominated":  # the one it names is on the frontier and does dominate it
                winner = verdict.reason.removeprefix("dominated by ").split(" (")[0]
                assert winner in frontier and beats(by_name[winner], by_name[verdict.name])
    assert seen == {"picked", "frontier", "dominated", "violates"}  # the random sweeps reach every verdict


# ------------------------------------------------------------------------------------------------------------------
# The rule: validation and hash


def test_rule_hash_ignores_key_order_and_yaml_layout():
    reordered = {"objective": [{"direction": d["direction"], "metric": d["metric"]} for d in RULE["objective"]],
                 "constraints": [dict(reversed(list(c.items()))) for c in RULE["constraints"]]}
    text = yaml.safe_dump(reordered, sort_keys=True, default_flow_style=True)
    hashes = {SelectionRule.model_validate(RULE).sha256(), SelectionRule.model_validate(reordered).sha256(),
              SelectionRule.model_validate(yaml.safe_load(text)).sha256(),
              SelectionRule.model_validate(yaml.safe_load(text.replace("800", "800.0"))).sha256()}  # 800 is 800.0
    assert len(hashes) == 1
    assert SelectionRule.model_validate({**RULE, "constraints": [{"metric": "p95_ms", "at_most": 800}, RULE[
        "constraints"][0]]}).sha256() != hashes.pop()  # the order of the list as written is part of the rule


@pytest.mark.parametrize("change", [
    lambda r: r["constraints"][0].update(not_worse_than_champion_by=0.03),
    lambda r: r["constraints"][1].update(at_most=801),
    lambda r: r["constraints"][1].update(metric="p99_ms"),
    lambda r: r["constraints"][1].update(at_most=None, at_least=800),
    lambda r: r["constraints"].pop(),
    lambda r: r["constraints"].append({"metric": "ece", "at_most": 0.1}),
    lambda r: r["objective"].reverse(),
    lambda r: r["objective"].pop(),
    lambda r: r["objective"][1].update(metric="accuracy", direction="max"),
])
def test_rule_hash_changes_with_any_field(change):
    changed = {"constraints": [dict(c) for c in RULE["constraints"]], "objective": [dict(o) for o in RULE["objective"]]}
    change(changed)
    assert SelectionRule.model_validate(changed).sha256() != SelectionRule.model_validate(RULE).sha256()


@pytest.mark.parametrize("bad, says", [
    ({**RULE, "objective": []}, "at least 1"),
    ({**RULE, "constraints": [{"metric": "p95_ms", "at_most": 800, "at_least": 100}]}, "set exactly one"),
    ({**RULE, "constraints": [{"metric": "p95_ms"}]}, "no bound"),
    ({**RULE, "objective": [{"metric": "accuracy", "direction": "min"}]}, "write direction: max"),
    ({**RULE, "objective": [{"metric": "p95_ms", "direction": "min"}] * 2}, "more than once"),
    ({**RULE, "constraints": [{"metric": "p95_ms", "at_most": 8, "typo": 1}]}, "Extra inputs are not permitted"),
    ({**RULE, "constraints": [{"metric": "p42_ms", "at_most": 8}]}, "p95_ms"),
    ({**RULE, "constraints": [{"metric": "accuracy", "not_worse_than_champion_by": -0.1}]}, "greater than or equal"),
    ({**RULE, "constraints": [{"metric": "p95_ms", "at_most": float("nan")}]}, "finite"),
])
def test_bad_rules_are_refused_with_the_fix(bad, says):
    with pytest.raises(ValidationError, match=says):
        SelectionRule.model_validate(bad)


# ------------------------------------------------------------------------------------------------------------------
# Evidence


def test_candidate_evidence_round_trips_through_json():
    evidence = ev("q4", intervals={"accuracy_vs_champion": (-0.01, 0.02), "accuracy": (0.7, 0.8)}, ece=None)
    assert CandidateEvidence.from_json(evidence.to_json()) == evidence
    assert evidence.to_json()["intervals"]["accuracy"] == [0.7, 0.8]


@pytest.mark.parametrize("data, says", [
    ({"name": "a", "config_sha256": "x", "metrics": {"accuracy": float("nan")}}, "not a finite number"),
    ({"name": "a", "config_sha256": "x", "metrics": {"accuracy": True}}, "not a finite number"),
    ({"name": "a", "config_sha256": "x", "metrics": {"acc": 0.5}}, "unknown metric"),
    ({"name": "a", "config_sha256": "x", "metrics": {}, "intervals": {"accuracy": [0.9, 0.1]}}, "low above high"),
    ({"name": "a", "config_sha256": "x", "metrics": {}, "intervals": {"accuracy": [0.1]}}, "not \\[low, high\\]"),
    ({"name": "a", "config_sha256": "x", "metrics": {}, "intervals": {"accuracy": 0.1}}, "not \\[low, high\\]"),
    ({"name": "", "config_sha256": "x", "metrics": {}}, "empty"),
    ({"name": "a", "metrics": {}}, "missing \\['config_sha256'\\]"),
    ({"name": "a", "config_sha256": "x", "metrics": {}, "extra": 1}, "unknown \\['extra'\\]"),
])
def test_malformed_evidence_is_refused(data, says):
    with pytest.raises(BadInput, match=says):
        CandidateEvidence.from_json(data)
