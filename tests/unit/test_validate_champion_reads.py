"""What the validate stage reads of the ledger about its champion (tasks/pipeline/stages/validate.py): the champion's
release is shown once for both its build's determinism and its config, and its recorded per-task files are those that
gates measured on the champion's identity and kept, newest first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.stages import validate
from shiplift.validation.champion_reuse import Identity
from shiplift.validation.thresholds import ChampionRule

CHAMPION = Identity(serving_id="c" * 64, determinism={"threads": 4}, readout="semif")
OTHER = Identity(serving_id="d" * 64, determinism={"threads": 4}, readout="semif")


def kept(name: str) -> dict:
    return {"uri": f"file:///store/{name}", "sha256": "0" * 64, "size": 1, "kind": "file"}


def record_gate(ledger: Ledger, release_id: str, measured: dict[str, Identity], kept_files: tuple[str, ...]) -> None:
    """A validate record of `release_id` whose gate measured each file of `measured` on a model of that identity."""
    payload = {"decision": "pass", "metrics": {}, "checks": [], "not_passed": [], "thresholds": {}, "datasets": [],
               "report_json": "gate-report.json", "report_html": "report.html",
               "evidence": {name: kept(name) for name in kept_files}}
    if measured:
        payload["measured"] = {name: identity.measured([{"name": "unit", "sha256": "1" * 64}])
                               for name, identity in measured.items()}
    ledger.append(release_id=release_id, model="tiny", stage=events.VALIDATE, event=events.SUCCEEDED,
                  payload=payload, actor="alice")


@pytest.fixture
def ledger(tmp_path):
    opened = Ledger.for_sqlite(tmp_path / "ledger.db")
    yield opened
    opened.close()


def test_the_champion_s_recorded_files_are_those_gates_measured_and_kept_newest_first(ledger):
    record_gate(ledger, "rel-1", {"predictions.jsonl": CHAMPION}, ("predictions.jsonl",))
    record_gate(ledger, "rel-2", {"predictions.jsonl": OTHER}, ("predictions.jsonl",))
    record_gate(ledger, "rel-3", {}, ())  # a family that records nothing to reuse
    record_gate(ledger, "rel-4", {"predictions.jsonl": OTHER, "champion-predictions.jsonl": CHAMPION},
                ("predictions.jsonl", "champion-predictions.jsonl"))
    record_gate(ledger, "rel-5", {"champion-predictions.jsonl": CHAMPION}, ())  # its file was not kept

    found = validate.recorded_results(SimpleNamespace(backends=SimpleNamespace(ledger=ledger)), CHAMPION.sha256())

    assert [(r.release_id, r.file) for r in found] == [("rel-4", "champion-predictions.jsonl"),
                                                       ("rel-1", "predictions.jsonl")]
    assert found[0].keys == CHAMPION.measured([{"name": "unit", "sha256": "1" * 64}])["keys"]


def test_the_champion_s_release_is_shown_once_for_its_determinism_and_its_config(ledger, monkeypatch):
    shown = []

    def show(_ledger, release_id: str) -> dict:
        shown.append(release_id)
        return {"release_id": release_id, "determinism": CHAMPION.determinism,
                "config": {"name": "tiny", "image": {"threads": 2}}}

    monkeypatch.setattr(validate, "show", show)
    monkeypatch.setattr(validate, "production_endpoint", lambda config: "tiny-prod")
    monkeypatch.setattr(validate, "production_component", lambda config: "tiny-prod-c")
    live = SimpleNamespace(model_ref=SimpleNamespace(model_dump=lambda: {"release_id": "rel-champ"}),
                           status="InService", copies=1, serving_id=lambda: CHAMPION.serving_id)
    hosting = SimpleNamespace(describe=lambda endpoint, component: live,
                              invoker=lambda endpoint, component, timeout_s: f"invoker {endpoint}/{component}")
    config = SimpleNamespace(validation=SimpleNamespace(champion=ChampionRule(), request_timeout_s=5.0),
                             calibration=SimpleNamespace(fit_temperature=False),
                             model_dump=lambda mode: {"name": "tiny", "image": {"threads": 4}})
    ctx = SimpleNamespace(backends=SimpleNamespace(hosting=hosting, ledger=ledger), config=config,
                          release_id="rel-new", state=SimpleNamespace(fresh_champion=False),
                          family=SimpleNamespace(reuses_champion_results=True,
                                                 readout=lambda rule: SimpleNamespace(name=CHAMPION.readout)),
                          result=lambda stage: SimpleNamespace(temperature=1.0, model_extra={}))

    champion, champion_shown = validate.live_champion(ctx)
    context = validate.release_context(ctx, champion_shown)

    assert shown == ["rel-champ"]
    assert champion.offer.identity == CHAMPION
    assert context["champion_release"] == "rel-champ"
    assert context["config_changes"] == [{"field": "image.threads", "champion": 2, "candidate": 4}]
