"""A shared endpoint's layout change (`shiplift fleet move`, docs/fleet.md, issue 36 item 2), on the local backend with
real tiny releases: a running endpoint's layout cannot change, so the new layout is a new endpoint and every model
moves to it, each move recorded in its history, and the old endpoint is retired once no model serves on it.

Two models serve on the shared endpoint's first layout. Their configs change placement: a release of the new config is
refused before it is opened (it would gate against no champion); the plan shows both must move. The first move is stopped halfway by a
lease another run holds on model B: A has moved (recorded, answering on the new endpoint), B still serves on the old
one, which is kept, and B answers every request throughout. The rerun moves B, retires the old endpoint and records
that; a third run changes nothing. A move naming only one of the two models is refused before anything changes. The audit then checks the new endpoint against the ledger, and a rollback to a
release of the old layout is refused.
"""

from __future__ import annotations

import json

import pytest

from tasks.backends.local.supervisor import ProcessSupervisor
from tasks.cli.demo import LiveTraffic
from tasks.config import load_release_config
from tasks.errors import ConfigError, Conflict, LeaseHeld
from tasks.ledger import events
from tasks.ledger.store import Ledger
from tasks.ledger.views import serving_status, timeline
from tasks.pipeline.audit import audit
from tasks.pipeline.fleet import plan_fleet
from tasks.pipeline.fleet_move import move_fleet
from tasks.pipeline.promotion import rollback
from tasks.pipeline.release import run_release
from tasks.pipeline.stages.common import production_component, production_endpoint
from tests.e2e.conftest import shiplift_cli

QUIET = lambda message: None  # noqa: E731
OLD = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge", "instance_count": 2, "endpoint": "fleet"}
NEW = {**OLD, "instance_count": 3}


def history(ledger: Ledger, model: str) -> list[tuple[str, str]]:
    return [(r.stage, r.event) for r in ledger.history(model)]


def test_a_layout_change_moves_every_model_to_a_new_endpoint_records_each_move_and_retires_the_old(tmp_path, tiny_release):
    state = tmp_path / "state"
    old = {name: tiny_release.write_tiny_config(tmp_path / "old" / name, state, name=f"tiny-{name}", placement=OLD)
           for name in ("a", "b")}
    new = {name: tiny_release.write_tiny_config(tmp_path / "new" / name, state, name=f"tiny-{name}", placement=NEW,
                                                rollout__copies=2) for name in ("a", "b")}
    first = {name: run_release(old[name], progress=QUIET) for name in ("a", "b")}
    assert {name: r["status"] for name, r in first.items()} == {"a": "promoted", "b": "promoted"}
    before = {name: load_release_config(old[name]) for name in old}
    after = {name: load_release_config(new[name]) for name in new}
    old_endpoint, new_endpoint = production_endpoint(before["a"]), production_endpoint(after["a"])
    assert old_endpoint != new_endpoint and production_endpoint(after["b"]) == new_endpoint
    supervisor = ProcessSupervisor(state)

    ledger = Ledger.for_sqlite(state / "ledger.db")
    records = len(ledger.history())
    with pytest.raises(Conflict, match="fleet move"):
        run_release(new["a"], progress=QUIET)
    assert new_endpoint not in {e["name"] for e in supervisor.list_endpoints()}, "the refused release started nothing"
    assert len(ledger.history()) == records, "and was refused before it was opened in the ledger"

    plan = plan_fleet([new["a"], new["b"]], ledger=ledger)
    assert plan.endpoint == new_endpoint and [t.model for t in plan.moving] == ["tiny-a", "tiny-b"]
    assert {t.serves_on for t in plan.tenants} == {old_endpoint}
    listed = shiplift_cli("fleet", "plan", str(new["a"]), str(new["b"]), "--state-dir", str(state), "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["moves"] == ["tiny-a", "tiny-b"]

    records = len(ledger.history())
    with pytest.raises(ConfigError, match="tiny-b also serve"):
        move_fleet([new["a"]], reason="drill: three instances", actor="ops", progress=QUIET)
    assert len(ledger.history()) == records, "a move that leaves a model behind is refused before anything changes"

    b_release = first["b"]["release_id"]
    b_old = production_component(before["b"])
    url = supervisor.describe_endpoint(old_endpoint)["url"]
    with LiveTraffic(url, b_old) as to_b, ledger.acquire_lease("tiny-b", "drill/another-run", b_release, 600):
        with pytest.raises(LeaseHeld):
            move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", progress=QUIET)
    assert to_b.statuses[200] > 0 and set(to_b.statuses) == {200}, f"B answered throughout A's move: {dict(to_b.statuses)}"
    assert serving_status(ledger, "tiny-a")[0]["serving"]["endpoint"] == new_endpoint
    assert serving_status(ledger, "tiny-b")[0]["serving"]["endpoint"] == old_endpoint
    live = {e["name"] for e in supervisor.list_endpoints()}
    assert {old_endpoint, new_endpoint} <= live, "the old endpoint is kept while B serves there"
    assert sorted(supervisor.describe_endpoint(new_endpoint)["components"]) == [production_component(after["a"])]

    resumed = move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", progress=QUIET)
    assert [(m["model"], m["outcome"]) for m in resumed["models"]] == [("tiny-a", "here"), ("tiny-b", "moved")]
    assert resumed["retired"] == [old_endpoint] and resumed["kept"] == []
    assert old_endpoint not in {e["name"] for e in supervisor.list_endpoints()}
    components = supervisor.describe_endpoint(new_endpoint)["components"]
    assert sorted(components) == sorted(production_component(after[name]) for name in ("a", "b"))
    for name in ("a", "b"):
        model = f"tiny-{name}"
        assert components[production_component(after[name])]["spec"]["model_ref"]["release_id"] == first[name]["release_id"]
        assert len(components[production_component(after[name])]["copies"]) == 2, "the new config's copies (1 before)"
        moves = [r for r in ledger.history(model) if r.payload.get("trigger") == "move" and r.event == events.SUCCEEDED]
        assert len(moves) == 1 and moves[0].release_id == first[name]["release_id"]
        assert moves[0].payload["moved_from"] == {"endpoint": old_endpoint, "component": production_component(before[name])}
        assert moves[0].payload["endpoint"] == new_endpoint and moves[0].payload["reason"] == "drill: three instances"
        assert history(ledger, model).count((events.FLEET, events.RETIRED)) == 1
        kinds = [event["event"] for event in timeline(ledger, model)]
        assert kinds.index("moved") < kinds.index("retired")

    records = len(ledger.history())
    again = move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", progress=QUIET)
    assert [m["outcome"] for m in again["models"]] == ["here", "here"] and again["retired"] == []
    assert len(ledger.history()) == records, "a rerun with nothing to move records nothing"

    checked = audit(state)
    assert {model: row["endpoint"] for model, row in checked["models"].items()} == {"tiny-a": new_endpoint,
                                                                                   "tiny-b": new_endpoint}
    with pytest.raises(Conflict, match="fleet move"):
        rollback(state, "tiny-a", first["a"]["release_id"], reason="drill: across the move", actor="ops")
    ledger.close()
