"""Scale to zero on the local backend, end to end (docs/fleet.md, "Scale to zero"; issue 36, item 3): a real tiny
release whose config has `scale_to_zero` measures the candidate's cold starts and gates their p95 with the family's
gate; production's copies go when idle and the first request brings one back, answered, not lost. A bound below
what a start takes fails the release."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shiplift.tasks.backends.local.hosting import LoopbackHosting
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.config import load_release_config
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint
from shiplift.validation.cold_start import CHECK_NAME, first_answer
from shiplift.validation.transport import HttpInvoker

QUIET = lambda message: None  # noqa: E731


def validate_result(state_dir: Path, release_id: str) -> dict:
    """The validate stage's recorded result."""
    records = Ledger.for_sqlite(state_dir / "ledger.db").release(release_id)
    return next(r.payload for r in records if (r.stage, r.event) == ("validate", "succeeded"))


def gate_report(state_dir: Path, release_id: str) -> dict:
    return json.loads(Path(validate_result(state_dir, release_id)["report_json"]).read_text())


def wait_for(check, within_s: float, what: str):
    deadline = time.monotonic() + within_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what} did not happen within {within_s} s"
        time.sleep(0.1)
    return value


def copies(state_dir: Path, endpoint: str, component: str) -> list[int]:
    return [c["pid"]
            for c in ProcessSupervisor(state_dir).describe_endpoint(endpoint)["components"][component]["copies"]]


@pytest.fixture(scope="module")
def scaled(tmp_path_factory, tiny_release):
    root = tmp_path_factory.mktemp("scale-to-zero")
    state = root / "state"
    try:
        yield {"root": root, "state": state, "write": lambda name, bound, starts: tiny_release.write_tiny_config(
            root / name, state, name=name,
            scale_to_zero={"idle_s": 2, "cold_starts": starts, "max_cold_start_p95_s": bound})}
    finally:
        tiny_release.stop_endpoints(state)


def test_the_gate_measures_cold_starts_and_production_scales_to_zero_and_back(scaled):
    state, config_path = scaled["state"], scaled["write"]("tiny-zero", 60, 3)
    result = run_release(config_path, progress=QUIET)
    assert result["status"] == "promoted"
    report = gate_report(state, result["release_id"])
    check = next(c for c in report["checks"] if c["name"] == CHECK_NAME)
    starts = report["extra"]["release"]["cold_start"]["starts"]
    assert len(starts) == 3 and all(s["error"] is None and s["seconds"] > 0 for s in starts)
    assert all(s["attempts"] >= 2 for s in starts), "each start's first request found no copy and was retried"
    assert check["status"] == "pass" and check["observed"] == pytest.approx(max(s["seconds"] for s in starts), abs=1e-3)
    assert validate_result(state,
                           result["release_id"])["metrics"]["cold_start_p95_s"] == pytest.approx(check["observed"],
                                                                                                 abs=1e-3)
    html = Path(validate_result(state, result["release_id"])["report_html"]).read_text()
    assert "cold starts, copy restart" in html, "locally: a copy restart"
    assert "cold starts, from zero instances" not in html, "locally: a copy restart"

    config = load_release_config(config_path)
    endpoint, component = production_endpoint(config), production_component(config)
    supervisor = ProcessSupervisor(state)
    assert supervisor.describe_endpoint(endpoint)["components"][component]["scale_to_zero"]["idle_s"] == 2
    serving = copies(state, endpoint, component)
    assert serving, "production serves right after its promotion"

    # idle for 2 s: its copies go, and the endpoint stays InService with none
    wait_for(lambda: not copies(state, endpoint, component), 20, "production's scale-in to zero")
    live = LoopbackHosting(state, store=None).describe(endpoint, component)
    assert (live.status, live.copies) == ("InService", 0)

    # the first request after idling is answered once a copy is up: retried, never lost
    request = config.family.invocation_bodies(config.validation, config.validation.dataset_paths(config_path.parent))[0]
    url = supervisor.describe_endpoint(endpoint)["url"]
    start = first_answer(HttpInvoker(url, component, runtime=True), request, timeout_s=30, deadline_s=60)
    assert start.error is None and start.attempts >= 2
    assert copies(state, endpoint, component) and set(copies(state, endpoint, component)).isdisjoint(serving)


def test_a_cold_start_slower_than_the_bound_fails_the_gate(scaled):
    state = scaled["state"]
    result = run_release(scaled["write"]("tiny-zero-slow", 0.001, 1), progress=QUIET)
    assert result["status"] == "rejected"
    report = gate_report(state, result["release_id"])
    check = next(c for c in report["checks"] if c["name"] == CHECK_NAME)
    assert report["decision"] == "fail" and check["status"] == "fail"
    # within twice a 1 ms bound a start is either unanswered or slower than the bound (its time may round to 1 ms)
    assert "got no answer" in check["reason"] or check["observed"] > 0.001
