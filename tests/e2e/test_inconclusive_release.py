"""An inconclusive release decided end to end (issue 45 item 2): extend, ask, block, on the local backend.

The pair of scripts/inconclusive_demo.py: a first release of the tiny model is promoted (no champion); later releases
serve the same GGUF, so their answers are the champion's, task for task, and only the gate's size stands in the way:
its 32 tasks are fewer than the champion rule's min_samples of 40, so the first look is inconclusive (the rule refuses
to decide; the paired interval itself is [0, 0]). Each later release names what an inconclusive gate does:
- extend: reserve tasks (the decision set's test rows the gate does not read) are scored on both, 16 per look, until
  the confidence sequence decides; with every difference 0 it clears margin 0.07 after 73 paired tasks, at the look of
  80 (validation.sequential);
- ask: the release waits for an approver with the interval and the power in its request; an approval promotes it, a
  rejection leaves the champion serving;
- block (no choice named): the release ends without promoting.
Every release here needs `validation.inconclusive`, so each test fails without it (the config would be refused).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shiplift.tasks.backends.registry import open_ledger
from shiplift.tasks.console import EXIT_REJECTED
from shiplift.tasks.errors import GateFailed
from shiplift.tasks.hashing import sha256_file
from shiplift.tasks.ledger.events import AWAITING_APPROVAL
from shiplift.tasks.ledger.views import serving_status
from shiplift.tasks.pipeline.promotion import promote
from shiplift.tasks.pipeline.release import run_release
from tests.conftest import load_by_path

ROOT = Path(__file__).resolve().parents[2]
demo = load_by_path("shiplift_inconclusive_demo", ROOT / "scripts" / "inconclusive_demo.py")
QUIET = lambda message: None  # noqa: E731
APPROVERS = ("alice", "bob")


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    """The first release, promoted: the champion every later release of the module is compared with."""
    from tests.tiny_release import stop_endpoints

    root = tmp_path_factory.mktemp("inconclusive")
    state = root / "state"
    config, reserve = demo.write_pair(root / "configs", state)
    first = run_release(config, progress=QUIET)
    assert first["status"] == "promoted"
    yield {"state": state, "config": config, "reserve": reserve, "release_id": first["release_id"]}
    stop_endpoints(state)


def records(state: Path) -> int:
    """How many records the ledger holds."""
    ledger = open_ledger(state_dir=state, read_only=True)
    try:
        return len(ledger.history())
    finally:
        ledger.close()


def served(state: Path) -> str | None:
    ledger = open_ledger(state_dir=state, read_only=True)
    try:
        rows = serving_status(ledger, "tiny-decision")
    finally:
        ledger.close()
    return (rows[0]["serving"] or {}).get("release_id") if rows else None


def first_look(result: dict) -> dict:
    """The first look's champion check, as the validate record keeps it beside the choice."""
    record = result["inconclusive"]
    assert record["first_look"]["decision"] == "inconclusive"
    check = next(c for c in record["first_look"]["checks"] if c["name"] == "champion_accuracy")
    assert check["status"] == "inconclusive" and check["n"] == 32 and "min_samples=40" in check["reason"]
    return check


@pytest.mark.slow  # two tiny releases (~60-90 s on 2 cores); make test keeps tests/unit/test_extension.py's fakes
def test_an_inconclusive_gate_extended_on_reserve_tasks_passes_and_the_release_is_promoted(champion):
    second = run_release(champion["config"], overrides=demo.choice_overrides("extend", champion["reserve"]),
                         progress=QUIET)
    assert second["status"] == "promoted" and second["decision"] == "pass"
    assert served(champion["state"]) == second["release_id"]

    result = demo.validate_result(champion["state"], second["release_id"])
    first_look(result)
    record = result["inconclusive"]
    assert (record["choice"], record["outcome"]) == ("extend", "extended: pass")
    looks = record["extension"]["looks"]
    assert [(look["n"], look["status"]) for look in looks] == [(32, "inconclusive"), (48, "inconclusive"),
                                                               (64, "inconclusive"), (80, "pass")]
    assert looks[0]["method"].startswith("Tango score") and looks[-1]["method"] == "betting confidence sequence"
    assert looks[-1]["interval"][0] > -demo.MARGIN  # the sequence's interval at the stopping look clears the margin
    assert record["extension"]["reserve_tasks_scored"] == 48 and record["extension"]["stopped"] == "decided"
    final = next(c for c in result["checks"] if c["name"] == "champion_accuracy")
    assert final["status"] == "pass" and final["n"] == 80 and final["reason"].startswith("extended")

    kept = {name: Path(ref["uri"].removeprefix("file://")) for name, ref in result["evidence"].items()}
    assert {"extension.json", "extension-predictions.jsonl", "champion-extension-predictions.jsonl"} <= set(kept)
    for name, path in kept.items():
        assert sha256_file(path) == result["evidence"][name]["sha256"], name
    evidence = json.loads(kept["extension.json"].read_text())
    assert (evidence["first_decision"], evidence["decision"], evidence["n"]) == ("inconclusive", "pass", 80)
    report = json.loads(kept["gate-report.json"].read_text())  # the report a person opens: the final decision
    assert (report["decision"], report["first_look"]["decision"]) == ("pass", "inconclusive")
    assert [look["n"] for look in report["extension"]["looks"]] == [32, 48, 64, 80]
    reserve_ids = [json.loads(line)["id"] for line in champion["reserve"].read_text().splitlines()]
    for name in ("extension-predictions.jsonl", "champion-extension-predictions.jsonl"):
        rows = [json.loads(line) for line in kept[name].read_text().splitlines()]
        assert sorted(row["id"] for row in rows) == sorted(reserve_ids[:48]), "the reserve's first 48 tasks, once each"
    assert "\n".join(demo.look_lines(result)).count("look ") == 4


@pytest.mark.slow
def test_an_asked_inconclusive_gate_waits_for_a_person_who_approves_or_rejects(champion, cli, monkeypatch):
    monkeypatch.setenv("SHIPLIFT_ACTOR", "alice")

    def asked(description: str) -> dict:
        before = served(champion["state"])
        summary = run_release(champion["config"], actor="alice", progress=QUIET, overrides=(
            *demo.choice_overrides("ask", approvers=APPROVERS), f"description={description}"))
        assert summary["status"] == AWAITING_APPROVAL and summary["decision"] == "inconclusive"
        request = summary["awaiting_approval"]["inconclusive"]
        check = first_look(demo.validate_result(champion["state"], summary["release_id"]))
        assert request["choice"] == "ask" and request["n"] == 32 and request["margin"] == demo.MARGIN
        assert request["interval"] == check["ci"] and request["power_text"][0].startswith("champion_accuracy")
        assert served(champion["state"]) == before, "nothing moves while a person reads the request"
        return summary

    def decide(verb: str, release_id: str, reason: str, actor: str = "bob") -> dict:
        monkeypatch.setenv("SHIPLIFT_ACTOR", actor)
        done = cli(verb, release_id, "--reason", reason, "--state-dir", str(champion["state"]), "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    approved = asked("asked, then approved")
    answer = decide("approve", approved["release_id"], "identical answers on 32 tasks; the rule wants 40")
    assert (answer["decision"], answer["by"], answer["summary"]["status"]) == ("approved", "bob", "promoted")
    assert answer["reason"] == "identical answers on 32 tasks; the rule wants 40"
    assert served(champion["state"]) == approved["release_id"]

    rejected = asked("asked, then rejected")
    answer = decide("reject", rejected["release_id"], "not on a Friday")
    assert (answer["decision"], answer["summary"]["status"]) == ("rejected", "rejected")
    assert served(champion["state"]) == approved["release_id"], "the champion keeps serving"

    # a triggered promotion (the promote_release step) takes the approved inconclusive gate, and refuses the rejected
    # one before it records anything
    again = promote(champion["state"], approved["release_id"], strategy=None, reason="promoted again", actor="alice")
    assert again["status"] == "promoted" and served(champion["state"]) == approved["release_id"]
    before = records(champion["state"])
    with pytest.raises(GateFailed, match="cannot be promoted: not approved: not on a Friday"):
        promote(champion["state"], rejected["release_id"], strategy=None, reason="r", actor="alice")
    assert records(champion["state"]) == before


@pytest.mark.slow
def test_an_inconclusive_gate_that_names_no_choice_blocks(champion, cli):
    before = served(champion["state"])
    blocked = cli("release", str(champion["config"]), "--set", "description=no choice named", "--json")
    summary = json.loads(blocked.stdout)
    assert blocked.returncode == EXIT_REJECTED and summary["decision"] == "inconclusive", blocked.stderr
    assert summary["status"] == "rejected" and served(champion["state"]) == before
    record = demo.validate_result(champion["state"], summary["release_id"])["inconclusive"]
    assert (record["choice"], record["outcome"]) == ("block", "blocked")
