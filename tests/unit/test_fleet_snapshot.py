"""What one fleet command reads (tasks/pipeline/fleet/snapshot.py, issue 46 item 3): each config file parsed once and
each model's ledger history read once per `fleet plan` and per `fleet move`, counted through wrappers around the
config reader and the ledger's reads; the plan a pure function of that snapshot (the same plan from the same snapshot,
no read while planning)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import shiplift.tasks.config
from shiplift.tasks.cli.main import main
from shiplift.tasks.config import load_release_config
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.records import Retirement
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.fleet.plan import plan_snapshot
from shiplift.tasks.pipeline.fleet.snapshot import load_fleet_configs, read_snapshot
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint
from tests.unit.test_fleet import CPU, build_payload, cpu_tenant

OLD_ENDPOINT = "shiplift-cpu-0ld1a7e0"  # an earlier layout's endpoint the fleet moved away from
MEMORY = {"weights_mb": 700, "context_mb": 100, "runtime_mb": 200, "context_label": "activations", "total_mb": 1000}


def fleet(folder: Path) -> list[Path]:
    """Two models on a shared CPU endpoint of the local backend (6 two-core slots), one copy each."""
    return [cpu_tenant(folder, name, placement={**CPU, "instance_count": 3}) for name in ("tenant-a", "tenant-b")]


def fleet_ledger(configs: list[Path], state: Path) -> Ledger:
    """A ledger where tenant-a was built and moved onto the configs' endpoint (from OLD_ENDPOINT, not retired),
    serving 2 copies, and tenant-b was never promoted."""
    config = load_release_config(configs[0])
    endpoint, component = production_endpoint(config), production_component(config)
    ledger = Ledger.for_sqlite(state / "ledger.db")
    release = "tenant-a-000000000001"

    def append(stage: str, event: str, payload: dict) -> None:
        ledger.append(release_id=release, model=config.name, stage=stage, event=event, payload=payload, actor="test")

    append(events.RELEASE, events.OPENED, {"config_hash": config.config_hash(),
                                           "config": config.model_dump(mode="json"), "config_path": str(configs[0]),
                                           "config_dir": str(configs[0].parent)})
    append(events.BUILD, events.SUCCEEDED, build_payload(MEMORY))
    moved_to = {"placement": config.placement.model_dump(mode="json"), "copies": 1, "scale_to_zero": None}
    append(events.PROMOTE, events.SUCCEEDED, {"endpoint": endpoint, "component": component, "copies": 2,
                                              "trigger": events.MOVE, "moved_to": moved_to,
                                              "moved_from": {"endpoint": OLD_ENDPOINT, "component": "old"}})
    return ledger


@pytest.fixture
def reads(monkeypatch):
    """Counts, per file, the release configs parsed (each top-level read of a config file) and, per model, the ledger
    histories and promotions read, wherever a command asks for them."""
    counted: dict[str, Counter] = {"parsed": Counter(), "history": Counter(), "served_at": Counter()}
    read_tree = shiplift.tasks.config._read_tree

    def parsed(path, chain):
        if not chain:
            counted["parsed"][Path(path).name] += 1
        return read_tree(path, chain=chain)

    def counting(name: str):
        method = getattr(Ledger, name)

        def wrapper(self, model=None, *args, **kwargs):
            counted[name][model] += 1
            return method(self, model, *args, **kwargs)
        return wrapper

    monkeypatch.setattr(shiplift.tasks.config, "_read_tree", parsed)
    monkeypatch.setattr(Ledger, "history", counting("history"))
    monkeypatch.setattr(Ledger, "served_at", counting("served_at"))
    return counted


def reset(counted: dict[str, Counter]) -> None:
    for counter in counted.values():
        counter.clear()


def test_fleet_plan_parses_each_config_once_and_reads_each_model_s_history_once(tmp_path, reads, capsys):
    configs = fleet(tmp_path)
    fleet_ledger(configs, tmp_path / "state").close()
    reset(reads)  # what setting the ledger up read
    code = main(["fleet", "plan", *map(str, configs), "--state-dir", str(tmp_path / "state"), "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["kept"] == [OLD_ENDPOINT]
    assert plan["differs"] == {
        "tenant-a": ["copies are 1 in the config, 2 serving now (read from the ledger): counted 2"]}
    assert plan["tenants"][0]["memory_mb_per_copy"] == 1000
    assert reads["parsed"] == {"tenant-a.yaml": 1, "tenant-b.yaml": 1}
    assert reads["history"] == {"tenant-a": 1, "tenant-b": 1}
    assert reads["served_at"] == {}, "what serves is the newest promotion in the history already read"


def test_fleet_move_parses_each_config_once_and_reads_each_model_s_history_once(tmp_path, reads, capsys):
    """No model moves here (one serves on the new endpoint already, one was never promoted), and --retire-old retires
    the endpoint the first one's earlier move left: one history read per model for the plan, the moves and the
    retirement together."""
    configs = fleet(tmp_path)
    fleet_ledger(configs, tmp_path / "state").close()
    reset(reads)  # what setting the ledger up read
    code = main(["fleet", "move", *map(str, configs), "--reason", "drill", "--retire-old",
                 "--state-dir", str(tmp_path / "state"), "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0 and result["retired"] == [OLD_ENDPOINT] and result["kept"] == []
    assert [(m["model"], m["outcome"]) for m in result["models"]] == [("tenant-a", "here"), ("tenant-b", "unreleased")]
    assert reads["parsed"] == {"tenant-a.yaml": 1, "tenant-b.yaml": 1}
    assert reads["history"] == {"tenant-a": 1, "tenant-b": 1}
    assert reads["served_at"] == {}
    with Ledger.for_sqlite(tmp_path / "state" / "ledger.db") as ledger:
        [retired] = ledger.events(events.FLEET, events.RETIRED)
    assert Retirement.of(retired).endpoint == OLD_ENDPOINT


def test_the_plan_is_a_pure_function_of_its_snapshot(tmp_path, reads):
    """Planned twice from one snapshot: the same plan, and no config parsed nor history read while planning."""
    configs = fleet(tmp_path)
    with fleet_ledger(configs, tmp_path / "state") as ledger:
        snapshot = read_snapshot(load_fleet_configs(configs), ledger=ledger)
    before = {name: Counter(counter) for name, counter in reads.items()}
    assert plan_snapshot(snapshot) == plan_snapshot(snapshot)
    assert reads == before
    assert plan_snapshot(snapshot).kept == (OLD_ENDPOINT,)
