"""Triggered promotion and rollback on the local backend (tiny generated model, real adapter processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, GateFailed, LeaseHeld, NotFound
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.promotion import promote, rollback
from shiplift.tasks.pipeline.release import begin_orchestrated

MODEL, PROD = "tiny-decision", "shiplift-tiny-decision-prod"
QUIET = lambda message: None  # noqa: E731
LATER = "2100-01-01T00:00:00Z"


@pytest.fixture(scope="module")
def releases(tmp_path_factory, tiny_release):
    """Release A promoted, then B (an F16 build) promoted over it, D rejected, C opened only."""
    made = tiny_release.three_releases(tmp_path_factory.mktemp("promotion"))
    c = begin_orchestrated(made["config"], holder="pytest-open", overrides=("validation.seed=1",), progress=QUIET)
    Ledger.for_sqlite(made["state_dir"] / "ledger.db").release_lease(MODEL, "pytest-open")
    yield made | {"c": c["release_id"]}
    tiny_release.stop_endpoints(made["state_dir"])


def live_release(state_dir: Path) -> str:
    component = ProcessSupervisor(state_dir).describe_endpoint(PROD)["components"][f"shiplift-{MODEL}"]
    return component["spec"]["model_ref"]["release_id"]


def test_rollback_then_promote_again_records_and_verifies_each_switch(releases):
    state_dir, a, b = releases["state_dir"], releases["a"], releases["b"]
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    assert live_release(state_dir) == b

    back = rollback(state_dir, MODEL, a, reason="B answers slower in production", actor="pytest", expect_current=b)
    assert (back["rollback_from"], back["rollback_to"], back["served"]["release_id"]) == (b, a, a)
    assert live_release(state_dir) == a
    served = ledger.served_at(MODEL, LATER)
    assert served.release_id == a and served.actor == "pytest"
    assert served.payload["rollback_reason"] == "B answers slower in production"
    assert (served.payload["rollback_from"], served.payload["rollback_to"]) == (b, a)
    assert served.payload["served"]["release_id"] == a and served.payload["endpoint"] == PROD

    again = promote(state_dir, b, strategy="all_at_once", reason="fixed the latency", actor="pytest")
    assert again["status"] == "promoted" and again["served"]["release_id"] == b
    assert live_release(state_dir) == b
    assert again["served"]["artifact_sha256"] != back["served"]["artifact_sha256"], "A and B are different artifacts"
    served = ledger.served_at(MODEL, LATER)
    assert served.release_id == b and served.payload["reason"] == "fixed the latency"
    assert ReleaseState.load(ledger, b).status == "promoted"
    assert [r.event for r in ledger.release(b) if r.stage == "promote"][-2:] == ["started", "succeeded"]
    assert ledger.verify().ok
    with ledger.acquire_lease(MODEL, "pytest-check", a, 60):
        pass  # both gave the lease back


def test_refusals_name_the_problem_and_change_nothing(releases):
    state_dir, a, b, c, d = (releases[k] for k in ("state_dir", "a", "b", "c", "d"))
    ledger = Ledger.for_sqlite(state_dir / "ledger.db")
    before, n_records = live_release(state_dir), len(ledger.history())

    with pytest.raises(GateFailed, match=r"gate decision is 'fail'.*accuracy"):
        promote(state_dir, d, strategy="all_at_once", reason="r", actor="pytest")
    with pytest.raises(GateFailed, match="no gate decision: its validate stage is pending"):
        promote(state_dir, c, strategy="all_at_once", reason="r", actor="pytest")
    for strategy in ("canary", "linear"):
        with pytest.raises(ConfigError,
                           match=f"rolls out as its config says \\(rollout.strategy all_at_once\\), not {strategy}"):
            promote(state_dir, b, strategy=strategy, reason="r", actor="pytest")
    with pytest.raises(ConfigError, match="blue_green is not offered.*InferenceComponentName.*use canary"):
        promote(state_dir, b, strategy="blue_green", reason="r", actor="pytest")
    with pytest.raises(BadInput, match="strategy 'yolo' is unknown"):
        promote(state_dir, b, strategy="yolo", reason="r", actor="pytest")
    with pytest.raises(BadInput, match="not a release id"):
        promote(state_dir, "Bad Id", strategy="all_at_once", reason="r", actor="pytest")
    with pytest.raises(BadInput, match="reason must be a non-empty string"):
        rollback(state_dir, MODEL, a, reason="  ", actor="pytest")
    with pytest.raises(NotFound, match=f"{d} of {MODEL} was never promoted"):
        rollback(state_dir, MODEL, d, reason="r", actor="pytest")
    with pytest.raises(BadInput, match=f"belongs to model '{MODEL}', not 'other-model'"):
        rollback(state_dir, "other-model", a, reason="r", actor="pytest")
    with pytest.raises(NotFound, match="was never opened in the ledger"):
        promote(state_dir, "tiny-decision-000000000000", strategy="all_at_once", reason="r", actor="pytest")
    assert live_release(state_dir) == before and len(ledger.history()) == n_records

    with pytest.raises(Conflict, match=f"says '{before}' serves {MODEL}, not '{d}'"):
        rollback(state_dir, MODEL, a, reason="r", actor="pytest", expect_current=d)
    with ledger.acquire_lease(MODEL, "airflow:refresh_tiny_decision/run-9", b, 600):
        with pytest.raises(LeaseHeld, match="airflow:refresh_tiny_decision/run-9"):
            promote(state_dir, b, strategy="all_at_once", reason="r", actor="pytest")
        with pytest.raises(LeaseHeld, match="airflow:refresh_tiny_decision/run-9"):
            rollback(state_dir, MODEL, a, reason="r", actor="pytest")
    assert live_release(state_dir) == before and len(ledger.history()) == n_records


def test_cli_rollback_prints_what_serves_and_refuses_bad_input_without_a_traceback(releases, capsys):
    from shiplift.tasks.cli.main import main
    from shiplift.tasks.console import EXIT_ERROR

    state_dir, a, b = releases["state_dir"], releases["a"], releases["b"]
    assert live_release(state_dir) == b
    code = main(["rollback", MODEL, "--to", a, "--reason", "B regressed on the canary set", "--expect-current", b,
                 "--state-dir", str(state_dir), "--actor", "pytest-cli"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[0].split() == ["model", "from", "to", "strategy", "traffic", "steps", "serving", "now",
                                            "image"]
    assert out[2].split()[:6] == [MODEL, b, a, "all_at_once", "0", a]
    assert live_release(state_dir) == a
    served = Ledger.for_sqlite(state_dir / "ledger.db").served_at(MODEL, LATER)
    assert (served.release_id, served.actor, served.payload["rollback_reason"]) == (a, "pytest-cli",
                                                                                    "B regressed on the canary set")

    assert main(["rollback", MODEL, "--to", "Not A Release", "--reason", "r", "--state-dir",
                 str(state_dir)]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no release in the ledger matches 'Not A Release'" in err and "Traceback" not in err
    promote(state_dir, b, strategy=None, reason="back to B", actor="pytest")  # None: the release's own strategy
    assert live_release(state_dir) == b
