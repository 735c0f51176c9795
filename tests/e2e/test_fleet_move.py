"""A shared endpoint's layout change (`shiplift fleet move`, docs/fleet.md, issue 36 item 2), on the local backend with
real tiny releases: a running endpoint's layout cannot change, so the new layout is a new endpoint and every model
moves to it, each move recorded in its history, and the old endpoint is retired once no model serves on it.

Two models serve on the shared endpoint's first layout. Their configs change placement: a release of the new config is
refused before it is opened (it would gate against no champion); the plan shows both must move. A move whose serving
releases would land elsewhere (another resource_prefix) and a move naming only one of the two models are refused before
anything changes. The first move is stopped halfway by a lease another run holds on model B: A has moved (recorded,
answering on the new endpoint), B still serves on the old one, which is kept, and B answers every request throughout.
The rerun moves B, retires the old endpoint and records that; a third run changes nothing. The audit then checks the
new endpoint against the ledger; a rollback to the moved release serves it on the new endpoint with the moved
placement; a never-promoted model still configured with the old layout is refused before it is opened (it would bring
the retired endpoint back). Moving back to the first layout and away again retires each endpoint again.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.cli.demo import LiveTraffic
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError, Conflict, DeployFailed, LeaseHeld
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.ledger.views import serving_status, timeline
from shiplift.tasks.pipeline.audit import audit
from shiplift.tasks.pipeline.fleet.move import move_fleet
from shiplift.tasks.pipeline.fleet.plan import plan_fleet
from shiplift.tasks.pipeline.promotion import rollback
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint
from tests.e2e.conftest import shiplift_cli

QUIET = lambda message: None  # noqa: E731
OLD = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge", "instance_count": 2, "endpoint": "fleet"}
NEW = {**OLD, "instance_count": 3}


def history(ledger: Ledger, model: str) -> list[tuple[str, str]]:
    return [(r.stage, r.event) for r in ledger.history(model)]


def test_a_layout_change_moves_every_model_to_a_new_endpoint_records_each_move_and_retires_the_old(tmp_path,
                                                                                                   tiny_release):
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
    listed = shiplift_cli("fleet", "plan", str(new["a"]), str(new["b"]), "--json")  # the configs' own ledger
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout)["moves"] == ["tiny-a", "tiny-b"]

    records = len(ledger.history())
    with pytest.raises(ConfigError, match="released with resource_prefix 'shiplift'"):
        move_fleet([new["a"], new["b"]], reason="drill", actor="ops", overrides=("resource_prefix=other",),
                   progress=QUIET)
    assert len(ledger.history()) == records, "a move its champions cannot serve with is refused before anything changes"
    with pytest.raises(ConfigError, match=r"tiny-b \(on shiplift-fleet-[0-9a-f]{8}\) also serve"):
        move_fleet([new["a"]], reason="drill: three instances", actor="ops", progress=QUIET)
    assert len(ledger.history()) == records, "a move that leaves a model behind is refused before anything changes"

    b_release = first["b"]["release_id"]
    b_old = production_component(before["b"])
    url = supervisor.describe_endpoint(old_endpoint)["url"]
    with LiveTraffic(url, b_old) as to_b, ledger.acquire_lease("tiny-b", "drill/another-run", b_release, 600):
        with pytest.raises(LeaseHeld):
            move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", progress=QUIET)
    assert to_b.statuses[200] > 0, f"B answered throughout A's move: {dict(to_b.statuses)}"
    assert set(to_b.statuses) == {200}, f"B answered throughout A's move: {dict(to_b.statuses)}"
    assert serving_status(ledger, "tiny-a")[0]["serving"]["endpoint"] == new_endpoint
    assert serving_status(ledger, "tiny-b")[0]["serving"]["endpoint"] == old_endpoint
    live = {e["name"] for e in supervisor.list_endpoints()}
    assert {old_endpoint, new_endpoint} <= live, "the old endpoint is kept while B serves there"
    assert sorted(supervisor.describe_endpoint(new_endpoint)["components"]) == [production_component(after["a"])]

    resumed = move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", progress=QUIET)
    assert [(m["model"], m["outcome"]) for m in resumed["models"]] == [("tiny-a", "here"), ("tiny-b", "moved")]
    assert resumed["retired"] == [] and resumed["kept"] == [old_endpoint], "callers of the old name are not cut off"
    assert LiveTraffic(url, b_old).send() == 200, "the old endpoint still answers until it is retired"
    assert plan_fleet([new["a"], new["b"]], ledger=ledger).kept == (old_endpoint,), "the plan lists it, with its bill"
    newcomer = tiny_release.write_tiny_config(tmp_path / "old" / "c", state, name="tiny-c", placement=OLD)
    records = len(ledger.history())
    with pytest.raises(Conflict, match=f"which a fleet move left for {new_endpoint}"):
        run_release(newcomer, progress=QUIET)
    assert len(ledger.history()) == records, "a model never promoted does not join the layout the fleet left"
    retiring = move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", retire_old=True,
                          progress=QUIET)
    assert [m["outcome"] for m in retiring["models"]] == ["here", "here"]
    assert retiring["retired"] == [old_endpoint] and retiring["kept"] == []
    assert plan_fleet([new["a"], new["b"]], ledger=ledger).kept == ()
    assert old_endpoint not in {e["name"] for e in supervisor.list_endpoints()}
    components = supervisor.describe_endpoint(new_endpoint)["components"]
    assert sorted(components) == sorted(production_component(after[name]) for name in ("a", "b"))
    for name in ("a", "b"):
        model = f"tiny-{name}"
        component = components[production_component(after[name])]
        assert component["spec"]["model_ref"]["release_id"] == first[name]["release_id"]
        assert len(component["copies"]) == 2, "the new config's copies (1 before)"
        moves = [r for r in ledger.history(model) if r.payload.get("trigger") == "move" and r.event == events.SUCCEEDED]
        assert len(moves) == 1 and moves[0].release_id == first[name]["release_id"]
        assert moves[0].payload["moved_from"] == {"endpoint": old_endpoint,
                                                  "component": production_component(before[name])}
        assert moves[0].payload["endpoint"] == new_endpoint and moves[0].payload["reason"] == "drill: three instances"
        assert history(ledger, model).count((events.FLEET, events.RETIRED)) == 1
        kinds = [event["event"] for event in timeline(ledger, model)]
        assert kinds.index("moved") < kinds.index("retired")

    records = len(ledger.history())
    again = move_fleet([new["a"], new["b"]], reason="drill: three instances", actor="ops", retire_old=True,
                       progress=QUIET)
    assert [m["outcome"] for m in again["models"]] == ["here", "here"] and again["retired"] == []
    assert len(ledger.history()) == records, "a rerun with nothing to move records nothing"

    checked = audit(state)
    assert {model: row["endpoint"] for model, row in checked["models"].items()} == {"tiny-a": new_endpoint,
                                                                                   "tiny-b": new_endpoint}
    back = rollback(state, "tiny-a", first["a"]["release_id"], reason="drill: the moved release again", actor="ops")
    assert (back["endpoint"], back["component"]) == (new_endpoint, production_component(after["a"])), \
        "a rollback to a moved release serves it where the move put it"
    moved = supervisor.describe_endpoint(new_endpoint)["components"][production_component(after["a"])]
    assert len(moved["copies"]) == 2
    assert old_endpoint not in {e["name"] for e in supervisor.list_endpoints()}, "and never on the retired endpoint"

    records = len(ledger.history())
    with pytest.raises(Conflict, match="which a fleet move retired"):
        run_release(newcomer, progress=QUIET)
    assert len(ledger.history()) == records and old_endpoint not in {e["name"] for e in supervisor.list_endpoints()}

    returned = move_fleet([old["a"], old["b"]], reason="drill: back to two", actor="ops", retire_old=True,
                          progress=QUIET)
    assert [m["outcome"] for m in returned["models"]] == ["moved", "moved"] and returned["retired"] == [new_endpoint]
    assert serving_status(ledger, "tiny-b")[0]["serving"]["endpoint"] == old_endpoint
    away = move_fleet([new["a"], new["b"]], reason="drill: three again", actor="ops", retire_old=True, progress=QUIET)
    assert away["retired"] == [old_endpoint], "a layout left, returned to and left again is retired again"
    assert {e["name"] for e in supervisor.list_endpoints()} >= {new_endpoint}
    assert old_endpoint not in {e["name"] for e in supervisor.list_endpoints()}
    for model in ("tiny-a", "tiny-b"):
        retirements = [r.payload["endpoint"] for r in ledger.history(model)
                       if (r.stage, r.event) == (events.FLEET, events.RETIRED)]
        assert retirements == [old_endpoint, new_endpoint, old_endpoint]
    ledger.close()


SOLO = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge", "instance_count": 1, "endpoint": "solo"}


def test_a_move_cut_short_after_its_copies_started_or_after_the_old_endpoint_went_is_finished_by_the_rerun(
        tmp_path, tiny_release, monkeypatch):
    """Two crash points. The new copies start but no first answer comes: the move is recorded as a failed promotion
    and the old endpoint still serves; the rerun finishes it on the same component. The old endpoint is deleted but its
    retirement is not recorded yet: the rerun records it once and deletes nothing again. The new placement's
    scale_to_zero is set on the new component, and `status` shows the move's share of the new endpoint's bill as the
    model's cost, also after a rollback to the moved release."""
    from dataclasses import replace

    import shiplift.validation.cold_start as cold_start
    from shiplift.tasks.backends.local.hosting import LoopbackHosting

    prices = tmp_path / "prices.yaml"  # the shipped table has no CPU figure; 0.25 $/h is a test figure
    prices.write_text("version: 1\noffer: sagemaker-real-time-on-demand\ncurrency: USD\nunit: instance-hour\nprices: "
                      "{us-east-1: {ml.c7i.xlarge: {usd_per_hour: 0.25, source: test figure, as_of: 2026-12-06, "
                      "provenance: project-readme}}}\n")
    monkeypatch.setenv("SHIPLIFT_PRICES", str(prices))
    state = tmp_path / "state"
    old = tiny_release.write_tiny_config(tmp_path / "old", state, name="tiny-s", placement=SOLO)
    new = tiny_release.write_tiny_config(tmp_path / "new", state, name="tiny-s",
                                         placement={**SOLO, "instance_count": 2},
                                         rollout__copies=2,
                                         scale_to_zero={"idle_s": 600, "cold_starts": 1, "max_cold_start_p95_s": 60})
    release_id = run_release(old, progress=QUIET)["release_id"]
    old_endpoint, new_endpoint = (production_endpoint(load_release_config(path)) for path in (old, new))
    component = production_component(load_release_config(new))
    supervisor, ledger = ProcessSupervisor(state), Ledger.for_sqlite(state / "ledger.db")

    answer = cold_start.first_answer
    monkeypatch.setattr(cold_start, "first_answer", lambda *args,
                        **kw: replace(answer(*args, **kw), error="drill: mute"))
    with pytest.raises(DeployFailed, match="drill: mute"):
        move_fleet([new], reason="drill: two instances", actor="ops", retire_old=True, progress=QUIET)
    monkeypatch.setattr(cold_start, "first_answer", answer)
    failed = [r for r in ledger.history("tiny-s") if (r.stage, r.event) == (events.PROMOTE, events.FAILED)]
    assert len(failed) == 1 and failed[0].payload["trigger"] == "move" and failed[0].release_id == release_id
    assert serving_status(ledger, "tiny-s")[0]["serving"]["endpoint"] == old_endpoint, "the old endpoint still serves"
    started = [c["pid"] for c in supervisor.describe_endpoint(new_endpoint)["components"][component]["copies"]]
    assert started, "the copies had started on the new endpoint"

    moved = move_fleet([new], reason="drill: two instances", actor="ops", progress=QUIET)
    assert [m["outcome"] for m in moved["models"]] == ["moved"] and moved["kept"] == [old_endpoint]
    live = supervisor.describe_endpoint(new_endpoint)["components"][component]
    assert [c["pid"] for c in live["copies"]] == started, "the rerun finished on the copies already started"
    assert live["scale_to_zero"]["idle_s"] == 600, "the new placement's scale_to_zero"
    move = ledger.served_at("tiny-s", datetime.now(UTC))
    share = move.payload["share"]["usd_per_hour"]
    assert share == pytest.approx(2 * 0.25 * 2 / 4), "2 copies of 2 instances x 2 two-core slots, at 0.25 $/h each"
    assert serving_status(ledger, "tiny-s")[0]["serving"]["cost_per_hour"] == share, "not the gate's 1 of 2 slots"

    delete = LoopbackHosting.delete_endpoint

    def cut_short(self, endpoint, *, progress):
        delete(self, endpoint, progress=progress)
        raise RuntimeError("drill: the run died after the delete")

    monkeypatch.setattr(LoopbackHosting, "delete_endpoint", cut_short)
    with pytest.raises(RuntimeError, match="drill"):
        move_fleet([new], reason="drill: two instances", actor="ops", retire_old=True, progress=QUIET)
    monkeypatch.setattr(LoopbackHosting, "delete_endpoint", delete)
    assert old_endpoint not in {e["name"] for e in supervisor.list_endpoints()}
    assert (events.FLEET, events.RETIRED) not in history(ledger, "tiny-s")
    finished = move_fleet([new], reason="drill: two instances", actor="ops", retire_old=True, progress=QUIET)
    assert finished["retired"] == [old_endpoint]
    assert history(ledger, "tiny-s").count((events.FLEET, events.RETIRED)) == 1

    back = rollback(state, "tiny-s", release_id, reason="drill: again", actor="ops")
    assert back["endpoint"] == new_endpoint
    assert ledger.served_at("tiny-s", datetime.now(UTC)).payload["share"]["usd_per_hour"] == share
    assert serving_status(ledger, "tiny-s")[0]["serving"]["cost_per_hour"] == share, "a rollback keeps the move's share"
    ledger.close()
