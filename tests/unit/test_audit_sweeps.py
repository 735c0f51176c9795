"""Sweeps in the audit (issue 48 item 3): the report shows each sweep's opening with the rule's sha256 (recorded before
any candidate ran), every candidate's evidence and verdict, the pick and the frontier, from the ledger's records alone;
`audit` re-derives every recorded pick and refuses one its rule does not give."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.audit_report import render
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.sweeps.records import open_sweep
from shiplift.tasks.sweeps.run import record_pick
from shiplift.validation.sweep_rule import CandidateEvidence
from tests.e2e.test_sweep_run import write_sweep


def quiet(message: str) -> None:
    """Progress lines are not what this test reads."""


def test_the_audit_report_shows_a_sweep_s_rule_hash_evidence_and_pick(tmp_path, tiny_release):
    from shiplift.tasks.sweeps.config import load_sweep

    base = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state")
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, n_tasks=12,
                                   constraints=[{"metric": "valid_rate", "at_least": 1.0}]))
    ledger = Ledger.for_sqlite(tmp_path / "ledger.db")
    open_sweep(ledger, sweep, actor="alice")
    # Q8_0 is cheaper per decision at the same accuracy, so the rule (cheapest first) picks it; F16 is dominated
    measured = {"Q8_0": {"accuracy": 0.75, "valid_rate": 1.0, "usd_per_1m_decisions": 0.5, "p95_ms": 40.0},
                "F16": {"accuracy": 0.75, "valid_rate": 1.0, "usd_per_1m_decisions": 0.9, "p95_ms": 60.0}}
    for candidate in sweep.candidates:
        evidence = CandidateEvidence(candidate.name, candidate.config_sha256, measured[candidate.name],
                                     {"accuracy": (0.6, 0.9)})
        ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.EVALUATED,
                      payload={"candidate": candidate.name, "release_id": candidate.release_id,
                               "config_sha256": candidate.config_sha256, "evidence": evidence.to_json(),
                               "champion": None}, actor="alice")
    record_pick(ledger, sweep.sweep_id, actor="alice", progress=quiet)

    page = render(ledger, {"ok": True, "n_records": len(ledger.history()), "head_hash": ledger.head().record_hash,
                           "checked_against": None, "problems": []})
    section = re.search(r'<details class="sweep" data-sweep="([^"]+)" open>(.*?)</details>', page, re.S)
    assert section and section[1] == sweep.sweep_id
    body = section[2]
    rule_hash = hashlib.sha256(json.dumps(sweep.config.rule.canonical(), sort_keys=True,
                                          separators=(",", ":")).encode()).hexdigest()
    assert f'<code class="rule-sha256">{rule_hash}</code>' in body  # the hash, recomputed from the rule as written
    assert "picked Q8_0" in body and "frontier: Q8_0" in body and "decisions-small.jsonl" in body
    verdicts = {name: status for status, name in re.findall(r'<tr class="([a-z]+)"><td>(Q8_0|F16)</td>', body)}
    assert verdicts == {"Q8_0": "picked", "F16": "dominated"}
    for candidate in sweep.candidates:
        assert candidate.release_id in body and candidate.config_sha256 in body
    ledger.close()


def test_the_audit_re_derives_every_sweep_s_pick_and_refuses_a_pick_its_rule_does_not_give(tmp_path, tiny_release):
    from shiplift.tasks.errors import IntegrityError
    from shiplift.tasks.pipeline.audit import audit
    from shiplift.tasks.sweeps.config import load_sweep

    base = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state")
    sweep = load_sweep(write_sweep(tmp_path / "sweeps", base, n_tasks=12,
                                   constraints=[{"metric": "valid_rate", "at_least": 1.0}]))
    ledger = Ledger.for_sqlite(tmp_path / "state" / "ledger.db")
    open_sweep(ledger, sweep, actor="alice")
    assert audit(tmp_path / "state")["sweeps"][sweep.sweep_id] == {
        "rule_sha256": sweep.config.rule.sha256(), "evaluated": 0, "candidates": 2, "picked": None}
    for candidate, cost in zip(sweep.candidates, (0.5, 0.9), strict=True):
        metrics = {"accuracy": 0.75, "valid_rate": 1.0, "usd_per_1m_decisions": cost, "p95_ms": 40.0}
        evidence = CandidateEvidence(candidate.name, candidate.config_sha256, metrics)
        ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.EVALUATED,
                      payload={"candidate": candidate.name, "release_id": candidate.release_id,
                               "evidence": evidence.to_json()}, actor="alice")
    summary = record_pick(ledger, sweep.sweep_id, actor="alice", progress=quiet)
    cheapest = sweep.candidates[0].name
    assert summary["picked"] == cheapest
    assert audit(tmp_path / "state")["sweeps"][sweep.sweep_id]["picked"] == cheapest
    picked = ledger.release(sweep.sweep_id)[-1].payload
    other = sweep.candidates[1].name
    ledger.append(release_id=sweep.sweep_id, model=sweep.base.name, stage=events.SWEEP, event=events.PICKED,
                  payload={**picked, "pick": {**picked["pick"], "picked": other}, "picked": other}, actor="mallory")
    with pytest.raises(IntegrityError, match=f"recorded the pick '{other}', but its rule gives '{cheapest}'"):
        audit(tmp_path / "state")
    ledger.close()
