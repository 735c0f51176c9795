"""The sweep report (issue 48): sweep-report.json and report.html carry every candidate with its verdict and
intervals, the pick, the rule as written and its sha256; the HTML is well formed, escaped, and draws both Pareto charts
with labelled axes and the champion marked; the same inputs give the same bytes; a pick the rule does not give on the
evidence is refused."""

from __future__ import annotations

import json
import re

import pytest

from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import sha256_bytes, sha256_file
from shiplift.validation.sweep_report import write_sweep_report
from shiplift.validation.sweep_rule import CandidateEvidence, Pick, SelectionRule, choose
from tests.unit.test_report import HOSTILE, StrictParser

RULE = SelectionRule.model_validate({
    "constraints": [{"metric": "accuracy", "not_worse_than_champion_by": 0.02}, {"metric": "p95_ms", "at_most": 800}],
    "objective": [{"metric": "usd_per_1m_decisions", "direction": "min"}, {"metric": "p95_ms", "direction": "min"}],
})


def ev(name, acc, p95, usd, pair=(-0.01, 0.02)):
    return CandidateEvidence(name=name, config_sha256=sha256_bytes(name.encode()),
                             metrics={"accuracy": acc, "p95_ms": p95, "usd_per_1m_decisions": usd, "ece": 0.04},
                             intervals={"accuracy": (acc - 0.04, acc + 0.04), "accuracy_vs_champion": pair})


CANDIDATES = [
    ev("q4_k_m-c7i", 0.77, 500.0, 0.31),
    ev("q8_0-c7i", 0.77, 700.0, 0.52),  # dominated by q4_k_m-c7i
    ev("q8_0-g5", 0.78, 1240.0, 0.5),  # violates the p95 ceiling
    ev("q5_k_m-c7g", 0.79, 300.0, 0.6),  # frontier
    ev(HOSTILE, 0.70, 300.0, 0.1, pair=(-0.09, -0.05)),  # violates the champion margin; its name must be escaped
    CandidateEvidence(name="unmeasured", config_sha256="0" * 64, metrics={"accuracy": None}),
]
CHAMPION = ev("champion-q4", 0.775, 650.0, 0.45, pair=(0.0, 0.0))


def write(tmp_path, candidates=CANDIDATES, champion=CHAMPION, **kwargs):
    pick = choose(RULE, candidates)
    paths = write_sweep_report(tmp_path, RULE, pick, candidates, champion, **kwargs)
    parser = StrictParser()
    parser.feed((tmp_path / "report.html").read_text(encoding="utf-8"))
    parser.close()
    assert parser.stack == [], "every tag is closed"
    return pick, paths, json.loads((tmp_path / "sweep-report.json").read_text(encoding="utf-8")), parser


def test_json_carries_every_candidate_the_pick_and_the_rule_hash(tmp_path):
    pick, paths, report, _ = write(tmp_path, held_out_split="gate-holdout")
    assert report["rule_sha256"] == RULE.sha256() == report["pick"]["rule_sha256"]
    assert report["pick"] == pick.to_json() and report["pick"]["picked"] == "q4_k_m-c7i"
    assert sorted(c["name"] for c in report["candidates"]) == sorted(c.name for c in CANDIDATES)
    assert [CandidateEvidence.from_json(c) for c in report["candidates"]] == sorted(CANDIDATES, key=lambda c: c.name)
    assert CandidateEvidence.from_json(report["champion"]) == CHAMPION
    assert SelectionRule.model_validate(report["rule"]) == RULE
    assert report["held_out_split"] == "gate-holdout"
    assert report["dominance_axes"][-1] == {"metric": "accuracy", "better": "max"}
    assert paths["sweep_report_sha256"] == sha256_file(paths["sweep_report_json"])
    assert paths["report_html_sha256"] == sha256_file(paths["report_html"])


def test_html_has_every_candidate_with_its_verdict_the_pick_and_the_rule(tmp_path):
    pick, _, _, parser = write(tmp_path, held_out_split="gate-holdout")
    rows = parser.tables["candidates"]
    by_name = {row[0]: row for row in rows if row}
    assert set(by_name) == {c.name for c in CANDIDATES} | {"champion-q4"}  # the hostile name survives as text
    for verdict in pick.verdicts:
        assert by_name[verdict.name][1] == verdict.status and verdict.reason in by_name[verdict.name]
    assert by_name["champion-q4"][1] == "champion"
    assert "0.77 [0.73, 0.81]" in by_name["q4_k_m-c7i"]  # the value with its own interval
    assert "[-0.01, 0.02]" in by_name["q4_k_m-c7i"]  # the paired interval against the champion
    assert "not measured" in by_name["unmeasured"]
    assert parser.row_classes["candidates"][1:] == ["champion", *[v.status for v in pick.verdicts]]
    text = "".join(parser.text)
    assert "Picked: q4_k_m-c7i" in " ".join(text.split())
    assert RULE.sha256() in text
    assert "not_worse_than_champion_by: 0.02" in text and "at_most: 800" in text  # the rule as written
    assert "gate-holdout" in text and "which no candidate was measured on" in text


def test_html_draws_both_frontier_charts_with_units_the_champion_and_the_pick(tmp_path):
    _, _, _, parser = write(tmp_path)
    assert parser.svg_classes == ["chart pareto-cost", "chart pareto-latency"]
    html = (tmp_path / "report.html").read_text(encoding="utf-8")
    cost, latency = re.findall(r"<svg.*?</svg>", html, flags=re.S)
    for label in ("accuracy (share of tasks answered correctly)", "champion: champion-q4", "picked",
                  "on the frontier", "dominated", "violates a constraint", "frontier, in x order",
                  "not drawn (a value not measured): unmeasured", "q4_k_m-c7i", "q5_k_m-c7g"):
        assert label in cost and label in latency, label
    assert "cost ($ per 1M decisions, USD)" in cost and "p95 latency (ms, per request)" in latency
    assert not {"script", "img"} & set(parser.tags), "the hostile candidate name stays text"
    assert HOSTILE in "".join(parser.text)
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "ids are unique across the two charts"


def test_a_champion_without_a_value_is_named_under_the_chart_it_is_missing_from(tmp_path):
    unpriced = CandidateEvidence(name="champion-q4", config_sha256="c" * 64,
                                 metrics={**CHAMPION.metrics, "usd_per_1m_decisions": None}, intervals={})
    write(tmp_path, champion=unpriced)
    cost, latency = re.findall(r"<svg.*?</svg>", (tmp_path / "report.html").read_text(encoding="utf-8"), flags=re.S)
    assert "unmeasured, champion: champion-q4" in cost and "champion: champion-q4" not in cost.replace(
        "unmeasured, champion: champion-q4", "")
    assert "champion: champion-q4" in latency and "unmeasured, champion" not in latency


def test_no_pick_is_reported_and_no_held_out_split_is_said(tmp_path):
    slow = [ev("slow-a", 0.8, 900.0, 0.2), ev("slow-b", 0.8, 950.0, 0.1)]
    pick, _, report, parser = write(tmp_path, candidates=slow, champion=None)
    assert pick.picked is None and report["pick"]["picked"] is None and report["champion"] is None
    text = " ".join("".join(parser.text).split())
    assert "no candidate meets the rule: nothing picked" in text
    assert "No held-out split was named" in text
    assert [row[1] for row in parser.tables["candidates"] if row] == ["violates", "violates"]


def test_same_inputs_give_the_same_bytes(tmp_path):
    first = write(tmp_path / "a")[1]
    second = write(tmp_path / "b")[1]
    assert first["report_html_sha256"] == second["report_html_sha256"]
    assert first["sweep_report_sha256"] == second["sweep_report_sha256"]


def test_a_pick_the_rule_does_not_give_is_refused(tmp_path):
    pick = choose(RULE, CANDIDATES)
    edited = Pick(rule_sha256=pick.rule_sha256, picked="q5_k_m-c7g", frontier=pick.frontier, verdicts=pick.verdicts)
    with pytest.raises(BadInput, match="re-derived 'q4_k_m-c7i'"):
        write_sweep_report(tmp_path, RULE, edited, CANDIDATES, CHAMPION)
    other_rule = SelectionRule.model_validate({**RULE.canonical(), "objective": [{"metric": "p95_ms",
                                                                                  "direction": "min"}]})
    with pytest.raises(BadInput, match="not this rule"):
        write_sweep_report(tmp_path, other_rule, pick, CANDIDATES, CHAMPION)
    with pytest.raises(BadInput, match="differs"):  # a candidate left out of the report
        write_sweep_report(tmp_path, RULE, pick, CANDIDATES[:-1], CHAMPION)
    assert not (tmp_path / "report.html").exists()
