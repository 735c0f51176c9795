"""`shiplift fleet plan` (tasks/pipeline/fleet/plan.py, issue 36 item 2): the models on one shared MIG endpoint, the
room their copies and updates take counted by hand here, each model's share of the bill, and a layout that does not fit
refused with its arithmetic, changing nothing. Issue 44: a rollback's peak and `scale_to_zero.max_copies` counted, and
a model that scales to zero beside one that never does paying its full slot share (what serves: test_fleet_serving)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shiplift.tasks.cli.fleet_commands import plan_rows
from shiplift.tasks.cli.main import main
from shiplift.tasks.console import EXIT_BAD_INPUT
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.fleet.plan import plan_fleet

ROOT = Path(__file__).resolve().parents[2]
FLEET = sorted((ROOT / "configs" / "fleets" / "shared-h100").glob("*.yaml"))
OVERFULL = ROOT / "configs" / "fleets" / "shared-h100-overfull" / "mdeberta-nli-fr.yaml"


def tenant(folder: Path, name: str, **top) -> Path:
    """A config of the shared-h100 fleet for another model, with `top` replacing top-level keys."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"extends": str(FLEET[0]), "name": name, **top}))
    return path


def test_two_encoders_fit_seven_partitions_with_room_for_the_largest_update():
    """mdeberta-nli: 2 copies, updated all at once (4 at its peak); mdeberta-nli-de: 2, by a canary of 1 (3), whose
    rollback starts both old copies beside the 2 new (4: RollbackMaximumBatchSize is unset). Steady 2 + 2 = 4 of 7;
    while mdeberta-nli updates, 2 + 4 = 6; while -de updates or rolls back, 2 + 4 = 6: one partition to spare."""
    plan = plan_fleet(FLEET)
    assert plan.endpoint.startswith("shiplift-shared-h100-") and plan.slots.total(plan.instances) == 7
    peaks = {t.model: plan.peak(t) for t in plan.tenants}
    assert plan.steady == 4 and peaks == {"mdeberta-nli": 6, "mdeberta-nli-de": 6} and plan.headroom == 1
    assert plan.problems == ()
    assert all(t.share.fraction == pytest.approx(2 / 7) for t in plan.tenants)


def test_a_rolling_update_s_rollback_is_planned_with_all_its_old_copies_unless_rollback_batch_is_set(tmp_path):
    """SageMaker's rollback starts the old copies RollbackMaximumBatchSize at a time beside the new ones, 100 % of them
    when it is not sent (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html).
    A linear update of 3 copies in batches of 1 peaks at 4, its rollback at 6: beside -de's 2 copies that is 8 of 7
    partitions. Counting the update alone (6 of 7) passed; a rollback batch of 1 copy brings it back to 6."""
    linear = {"strategy": "linear", "copies": 3, "batch": {"type": "COPY_COUNT", "value": 1}}
    plan = plan_fleet([FLEET[0], tenant(tmp_path, "wide", rollout=linear)])
    wide = next(t for t in plan.tenants if t.model == "wide")
    assert (wide.peak, plan.peak(wide)) == (6, 8)
    [problem] = plan.problems
    assert problem.startswith("wide's next update has no room: a rolling update starts a batch of 1 beside the 3 old "
                              "copies, and its rollback starts 3 old copies (RollbackMaximumBatchSize unset: 100 %) "
                              "beside the 3 new ones (6 at once) beside the other models' 2 = 8 copies")
    assert "rollout.rollback_batch" in problem
    batched = plan_fleet([FLEET[0], tenant(tmp_path, "wide", rollout={**linear, "rollback_batch": {
        "type": "COPY_COUNT", "value": 1}})])
    assert [batched.peak(t) for t in batched.tenants] == [7, 6] and batched.problems == ()


GEMMA = ROOT / "configs" / "releases" / "gemma-decision.yaml"
CPU = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge", "instance_count": 2, "endpoint": "cpu"}
WAKES = {"idle_s": 60, "max_cold_start_p95_s": 60}  # scale_to_zero without max_copies


def cpu_tenant(folder: Path, name: str, **top) -> Path:
    """A config of Gemma on a shared CPU endpoint of 2 x ml.c7i.xlarge (4 two-core slots), `top` replacing keys."""
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"extends": str(GEMMA), "name": name, "placement": CPU, **top}))
    return path


def test_a_model_that_scales_to_zero_is_planned_at_its_max_copies(tmp_path):
    """An encoder of 1 copy that may scale out to 3 beside a decision model of 1, on 4 two-core slots: counted at 1
    copy each (the old plan), every update fits (1 + 2 = 3); counted at the 3 copies the encoder may run, the decision
    model's update (3 + 2 = 5) does not."""
    plan = plan_fleet([cpu_tenant(tmp_path, "decider"),
                       cpu_tenant(tmp_path, "encoder", scale_to_zero={**WAKES, "max_copies": 3})])
    assert plan.problems[0].startswith("decider's next update has no room: an update without DeploymentConfig starts "
                                       "all 1 new copies beside the old ones (2 at once) beside the other models' "
                                       "3 = 5")
    assert {t.model: (t.copies, t.most) for t in plan.tenants} == {"decider": (1, 1), "encoder": (1, 3)}
    assert plan.steady == 2 and {t.model: plan.peak(t) for t in plan.tenants} == {"decider": 5, "encoder": 7}
    assert "scale_to_zero.max_copies" in plan.problems[0] and plan_rows(plan)[1]["copies"] == "1 (up to 3)"


def test_a_model_that_scales_to_zero_beside_one_that_never_does_pays_its_full_slot_share():
    """The demo's shared encoder scales to zero beside Gemma, which never does: SageMaker stops the endpoint's
    instances only when every component is at 0 copies
    (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html), so the encoder's slot
    is paid while it idles, and the plan credits no saving. Only where every model scales to zero may the idle hours
    cost nothing."""
    shared = [ROOT / "configs" / "releases" / name for name in ("gemma-decision-shared.yaml", "minilm-nli-shared.yaml")]
    plan = plan_fleet(shared)
    share = {t.model: t.share for t in plan.tenants}
    encoder = share["minilm-nli-shared"]
    assert "gemma-shared never do(es)" in encoder.describe(), "no saving is credited"
    assert encoder.scales_to_zero and encoder.kept_on_by == ("gemma-shared",) and encoder.idle_costs is True
    assert encoder.fraction == pytest.approx(1 / 4) == share["gemma-shared"].fraction, "its full slot share"
    assert not plan.idles_free
    assert plan.as_dict()["tenants"][1]["share"]["idle_costs"] is True
    both = plan_fleet(shared, overrides=("scale_to_zero.idle_s=30", "scale_to_zero.max_cold_start_p95_s=60"))
    assert both.idles_free and all(t.share.kept_on_by == () and t.share.idle_costs is False for t in both.tenants)
    assert "nothing is billed, while all are at 0 copies" in both.tenants[1].share.describe()


def test_a_third_tenant_overfills_the_layout_and_the_refusal_shows_the_arithmetic(capsys):
    plan = plan_fleet([*FLEET, OVERFULL])
    assert plan.steady == 6 and plan.headroom == -1
    rollback, problem, third = plan.problems
    assert rollback.startswith("mdeberta-nli-de's next update has no room: a rolling update starts a batch of 1 beside "
                               "the 2 old copies, and its rollback starts 2 old copies"), "4 at once beside 4 = 8"
    assert third.startswith("mdeberta-nli-fr's next update has no room")
    assert problem.startswith("mdeberta-nli's next update has no room: an update without DeploymentConfig starts all 2 "
                              "new copies beside the old ones (4 at once) beside the other models' 4 = 8 copies, but "
                              "the endpoint grows to at most 1 x ml.p5.4xlarge = 7 mig-1g.10gb partitions")
    assert "a MIG endpoint is one instance" in problem and "max_instance_count" not in problem
    assert main(["fleet", "plan", *map(str, [*FLEET, OVERFULL]), "--state-dir", "/nonexistent/state"]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert "8 of 7" in out and "the fleet does not fit" in err and not Path("/nonexistent/state").exists()


def test_copies_that_do_not_fit_even_before_any_update_are_refused(tmp_path):
    crowd = [tenant(tmp_path, f"verifier-{n}", rollout={"strategy": "all_at_once", "copies": 3}) for n in range(3)]
    problems = plan_fleet(crowd).problems
    assert problems[0] == ("the models' copies do not fit: verifier-0 3 + verifier-1 3 + verifier-2 3 = 9 copies, one "
                           "mig-1g.10gb partition each, but 1 x ml.p5.4xlarge = 7 mig-1g.10gb partitions; fix: fewer "
                           "copies, more instances (placement.instance_count) or, for MIG, more partitions per GPU, or "
                           "another endpoint for some")


def build_payload(memory: dict) -> dict:
    """A succeeded build's payload as the build stage writes it (`BuildResult`), with `memory` per copy."""
    output = {"uri": "file:///built", "sha256": "0" * 64, "size": 1, "kind": "folder"}
    return {"output": output, "model_sha256": "0" * 64, "info": {}, "memory": memory, "temperature": 1.0}


def test_a_copy_larger_than_its_partition_by_its_last_build_is_refused(tmp_path):
    ledger = Ledger.for_sqlite(tmp_path / "ledger.db")
    memory = {"weights_mb": 11000, "context_mb": 500, "runtime_mb": 500, "context_label": "activations",
              "total_mb": 12000}
    ledger.append(release_id="mdeberta-nli-000000000000", model="mdeberta-nli", stage="build", event="succeeded",
                  payload=build_payload(memory), actor="test")
    plan = plan_fleet(FLEET, ledger=ledger)
    assert {t.model: t.memory_mb for t in plan.tenants} == {"mdeberta-nli": 12000, "mdeberta-nli-de": None}
    assert plan.problems == ("mdeberta-nli's copy needs 12000 MB (its last build), more than a mig-1g.10gb partition's "
                             "10240 MB; fix: a larger partition type",)
    ledger.close()


@pytest.mark.parametrize("top, refused", [
    ({"placement": {"endpoint": "shared-h100", "partitions": 3}}, "other placement.partitions than"),
    ({"resource_prefix": "team"}, "other resource_prefix than"),
    ({"backend": {"ledger_url": "postgresql+psycopg2://shiplift@other.example:5432/shiplift"}},
     r"other ledger \(backend.ledger_url, else backend.state_dir\) than"),
    ({"placement": {"endpoint": None}}, "name: "),
])
def test_configs_that_do_not_describe_one_endpoint_are_refused(tmp_path, top, refused):
    with pytest.raises(ConfigError, match=refused):
        plan_fleet([*FLEET, tenant(tmp_path, "odd", **top)])


def test_a_model_listed_twice_is_refused():
    with pytest.raises(ConfigError, match="listed twice: mdeberta-nli"):
        plan_fleet([FLEET[0], FLEET[0]])


def test_a_move_onto_an_overfull_layout_is_refused_with_its_arithmetic_before_anything_is_made(tmp_path, capsys,
                                                                                              monkeypatch):
    """`shiplift fleet move` runs under the policy table's fleet_move step and plans the new layout first: one that
    does not fit exits 2 naming the model whose update has no room, and creates neither the state dir nor a ledger
    (bad input changes nothing)."""
    from shiplift.tasks.pipeline import table

    attempts, seen = table.attempts, []

    def observed(name, run, *, timeout_s, say=lambda message: None):
        seen.append((name, timeout_s))
        return attempts(name, run, timeout_s=timeout_s, say=say)

    monkeypatch.setattr(table, "attempts", observed)
    state = tmp_path / "state"
    code = main(["fleet", "move", *map(str, FLEET), str(OVERFULL), "--reason", "drill", "--state-dir", str(state)])
    assert code == EXIT_BAD_INPUT and seen == [("fleet_move", table.FLEET_MOVE.timeout_s)]
    assert "mdeberta-nli's next update has no room" in capsys.readouterr().err
    assert not state.exists()


def test_a_move_needs_a_reason_for_the_ledger(tmp_path, capsys):
    code = main(["fleet", "move", *map(str, FLEET), "--reason", " ", "--state-dir", str(tmp_path / "state")])
    assert code == EXIT_BAD_INPUT and "--reason" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


def _record(stage: str, event: str, release_id: str = "m-000000000000", **payload):
    from types import SimpleNamespace

    return SimpleNamespace(stage=stage, event=event, release_id=release_id, payload=payload)


def _moved(from_endpoint: str | None, to: str, release_id: str = "m-000000000000"):
    return _record("promote", "succeeded", release_id, trigger="move", endpoint=to,
                   moved_from={"endpoint": from_endpoint, "component": None})


def test_a_retirement_counts_only_after_the_newest_move_away_so_a_layout_returned_to_is_retired_again():
    """L1 -> L2 -> L1 -> L2: the first retirement of L1 must not hide the second move away from it (docs/fleet.md)."""
    from shiplift.tasks.ledger.views import left_by_fleet, moves_not_retired

    retired = lambda endpoint: _record("fleet", "retired", endpoint=endpoint, replaced_by="x")  # noqa: E731
    history = [_record("promote", "succeeded", endpoint="p-l1"), _moved("p-l1", "p-l2"), retired("p-l1")]
    assert list(moves_not_retired(history[:2])) == ["p-l1"] and moves_not_retired(history) == {}
    assert left_by_fleet(history[:2], "p-l1") is history[1], "left by the move, before any retirement"
    assert left_by_fleet(history, "p-l1") is history[-1] and left_by_fleet(history, "p-l2") is None
    history += [_moved("p-l2", "p-l1", "m-111111111111")]
    assert list(moves_not_retired(history)) == ["p-l2"] and left_by_fleet(history, "p-l1") is None, \
        "a promotion onto a retired endpoint brings it back"
    assert left_by_fleet(history, "p-l2") is history[-1]
    history += [retired("p-l2"), _moved("p-l1", "p-l2", "m-222222222222")]
    pending = moves_not_retired(history)
    assert list(pending) == ["p-l1"] and pending["p-l1"].release_id == "m-222222222222"
    assert moves_not_retired([_record("promote", "succeeded", trigger="move", endpoint="p-l2")]) == {}, \
        "a move record without moved_from names no endpoint left"


def test_a_layout_id_leaves_out_unset_fields_and_is_the_sha256_of_the_canonical_json_of_the_rest():
    """Checked against the canonical JSON of the placement written out by hand: its unset (null) fields are left out,
    so a placement field added later with no value does not rename running endpoints."""
    import hashlib

    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.pipeline.fleet.layout import layout_id

    config = load_release_config(ROOT / "configs" / "releases" / "gemma-decision.yaml",
                                 overrides=("placement.endpoint=demo-cpu",))
    assert config.placement.max_instance_count is None, "the example has unset fields"
    text = '{"instance_count":1,"instance_type":"ml.c7i.xlarge","kind":"instance_type"}'
    assert layout_id(config.placement) == hashlib.sha256(text.encode()).hexdigest()[:8]
