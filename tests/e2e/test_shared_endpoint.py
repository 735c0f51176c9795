"""Two models on one shared production endpoint (`placement.endpoint`, docs/fleet.md), on the local backend: each is
its own inference component with its own gate, rollout, rollback and ledger history, and a release of one never
touches the other's copies or traffic (issue 36, item 1).

Real tiny releases: model B serves on the shared endpoint; model A joins it, then a canary of A runs and A is rolled
back, while a client keeps calling B through the endpoint's router. B's copies (their processes) and answers are
watched throughout.
"""

from __future__ import annotations

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.cli.demo import LiveTraffic
from shiplift.tasks.config import load_release_config
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.ledger.views import show
from shiplift.tasks.pipeline.promotion import rollback
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint

QUIET = lambda message: None  # noqa: E731
CANARY = {"strategy": "canary", "copies": 2, "wait_interval_s": 1, "maximum_execution_timeout_s": 600,
          "alarms": {"max_error_rate": 0.05, "min_invocations": 1, "check_interval_s": 0.25}}


def copies(state_dir, endpoint: str, component: str) -> list[tuple[int, str]]:
    """(pid, url) of each copy of a component, as the supervisor knows them."""
    described = ProcessSupervisor(state_dir).describe_endpoint(endpoint)["components"][component]
    return sorted((copy["pid"], copy["url"]) for copy in described["copies"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, tiny_release):
    root = tmp_path_factory.mktemp("shared-endpoint")
    state = root / "state"
    # 2 x 4 vCPUs hold 2 + 2 copies of 2 cores; A's canary runs a third copy beside them, on the instance that managed
    # instance scaling adds (max_instance_count), as both backends count it (issue 44)
    placement = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge", "instance_count": 2,
                 "max_instance_count": 3, "endpoint": "fleet"}
    configs = {name: tiny_release.write_tiny_config(root / name, state, name=f"tiny-{name}", placement=placement,
                                                    rollout=CANARY) for name in ("a", "b")}
    try:
        yield {"state": state, **configs}
    finally:
        tiny_release.stop_endpoints(state)


# ~45 s on 2 cores: make test-slow; make test keeps the shared endpoint's aws twin
# (tests/aws/test_shared_endpoint_aws.py)
@pytest.mark.slow
def test_a_canary_and_a_rollback_of_one_model_leave_the_other_s_copies_and_traffic_alone(fleet):
    state = fleet["state"]
    a, b = load_release_config(fleet["a"]), load_release_config(fleet["b"])
    endpoint = production_endpoint(a)
    assert endpoint == production_endpoint(b) and endpoint.startswith("shiplift-fleet-")
    assert production_component(a) != production_component(b)

    assert run_release(fleet["b"], progress=QUIET)["status"] == "promoted"
    first_a = run_release(fleet["a"], progress=QUIET)
    assert first_a["status"] == "promoted" and first_a["served_by"] == endpoint
    b_component = production_component(b)
    b_copies = copies(state, endpoint, b_component)
    url = ProcessSupervisor(state).describe_endpoint(endpoint)["url"]
    ledger = Ledger.for_sqlite(state / "ledger.db")
    b_records = len(ledger.history("tiny-b"))

    with LiveTraffic(url, b_component) as to_b:
        canary = run_release(fleet["a"], overrides=("validation.seed=1",), progress=QUIET)
        assert canary["status"] == "promoted" and canary["rollout"]["strategy"] == "canary"
        assert canary["rollout"]["steps"] == 2, "one copy, a bake, then the other"
        back = rollback(state, "tiny-a", first_a["release_id"], reason="drill: back to the first", actor="ops")
        assert back["rollback_to"] == first_a["release_id"]

    assert to_b.statuses[200] > 0 and set(to_b.statuses) == {200}, (
        f"B answered every request throughout A's canary and rollback: {dict(to_b.statuses)}")
    assert copies(state, endpoint, b_component) == b_copies, "B's copies are the same processes"
    assert len(ledger.history("tiny-b")) == b_records, "nothing was recorded of B"
    live = ProcessSupervisor(state).describe_endpoint(endpoint)["components"]
    assert sorted(live) == [production_component(a), b_component], "one endpoint, one component per model"
    assert live[production_component(a)]["spec"]["model_ref"]["release_id"] == first_a["release_id"]
    shares = {model: show(ledger, release)["gate"]["cost"]["share"] for model, release in (
        ("tiny-a", first_a["release_id"]), ("tiny-b", ledger.history("tiny-b")[0].release_id))}
    assert {model: (share["copies"], share["capacity"], share["unit"]) for model, share in shares.items()} == {
        model: (2, 4, "2-core slot") for model in shares}, "2 x ml.c7i.xlarge (4 vCPUs) = 4 slots of 2 cores; 2 each"
    ledger.close()
