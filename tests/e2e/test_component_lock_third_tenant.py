"""A third model that does not fit a shared endpoint is refused by the local backend as the aws double refuses it
(issue 44): `shiplift fleet plan` exits 2 for the three configs, and the third model's promotion fails with
CapacityError before any of its copies starts, while the two models already serving keep their copies and answer
every request; nothing is recorded as promoted for it.

Real tiny releases on 2 x ml.c7i.xlarge (4 vCPUs each, https://aws.amazon.com/ec2/instance-types/c7i/), copies of
2 cores (image.threads): the endpoint holds 4 copies; a and b serve 1 each, c asks for 3.
"""

from __future__ import annotations

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.cli.demo import LiveTraffic
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import CapacityError
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint
from tests.e2e.test_shared_endpoint import QUIET, copies

PLACEMENT = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge", "instance_count": 2, "endpoint": "fleet"}


# ~60 s on 2 cores: make test-slow; tests/unit/test_component_lock_room.py keeps the refusal in make test
@pytest.mark.slow
def test_a_third_tenant_that_does_not_fit_is_refused_and_the_others_serve_on(tmp_path, tiny_release, cli):
    state = tmp_path / "state"
    configs = {name: tiny_release.write_tiny_config(tmp_path / name, state, name=f"tiny-{name}", placement=PLACEMENT,
                                                    rollout__copies=3 if name == "c" else 1) for name in "abc"}
    plan = cli("fleet", "plan", *(str(path) for path in configs.values()))
    assert plan.returncode == 2, f"the plan refuses 1 + 1 + 3 copies on 4 slots: {plan.stdout}{plan.stderr}"
    for name in "ab":
        assert run_release(configs[name], progress=QUIET)["status"] == "promoted"
    a, b, c = (load_release_config(configs[name]) for name in "abc")
    endpoint = production_endpoint(a)
    assert endpoint == production_endpoint(c)
    serving = {config.name: copies(state, endpoint, production_component(config)) for config in (a, b)}
    url = ProcessSupervisor(state).describe_endpoint(endpoint)["url"]

    with LiveTraffic(url, production_component(a)) as to_a, LiveTraffic(url, production_component(b)) as to_b:
        with pytest.raises(CapacityError) as refused:
            run_release(configs["c"], progress=QUIET)
    assert (f"Unable to place 3 copies of inference component {production_component(c)}: endpoint {endpoint} has room "
            "for 2 (2 x ml.c7i.xlarge with 4 vCPUs each, 4 held by other inference components, 2 a copy)"
            ) in str(refused.value)

    for traffic in (to_a, to_b):
        assert traffic.statuses[200] > 0 and set(traffic.statuses) == {200}, dict(traffic.statuses)
    assert {config.name: copies(state, endpoint, production_component(config)) for config in (a, b)} == serving
    live = ProcessSupervisor(state).describe_endpoint(endpoint)["components"]
    assert sorted(live) == sorted(production_component(config) for config in (a, b)), "no copy of c was left"
    ledger = Ledger.for_sqlite(state / "ledger.db")
    try:
        history = [(r.stage, r.event) for r in ledger.history("tiny-c")]
        assert (events.PROMOTE, events.FAILED) in history and (events.RELEASE, events.FAILED) in history
        assert (events.PROMOTE, events.SUCCEEDED) not in history and (events.RELEASE, events.PROMOTED) not in history
    finally:
        ledger.close()
