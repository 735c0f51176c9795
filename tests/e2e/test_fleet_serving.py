"""`shiplift fleet plan` and `fleet move` plan from what serves, the configs being the proposal (issue 44): on the
local backend with a real tiny release, each model's serving release is read from the ledger (its image as gated)
and its copies from the endpoint, and where they differ from the config the plan says so and counts the larger.

The tiny release serves with `image.threads: 2` (two-core copies: 2 x ml.c7i.xlarge hold 4). Its next config says one
thread and one copy, so the configs alone count 8 one-core slots and everything fits. But a move starts the champion's
image, not the config's: moving onto one instance (the config's 4 one-core slots, the champion's 2 two-core ones) is
refused before anything changes. Scaled out to 3 copies on its endpoint, the model is planned with 3 two-core copies
beside the other model's one, and `fleet plan` exits 2 with the differences and the arithmetic.
"""

from __future__ import annotations

import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.backends.registry import make_backends
from shiplift.tasks.config import ReleaseConfig, load_release_config
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline.fleet.move import move_fleet
from shiplift.tasks.pipeline.fleet.plan import plan_fleet
from shiplift.tasks.pipeline.release import run_release
from shiplift.tasks.pipeline.stages.common import production_component, production_endpoint
from tests.e2e.conftest import shiplift_cli

QUIET = lambda message: None  # noqa: E731
PLACE = {"kind": "instance_type", "instance_type": "ml.c7i.xlarge", "instance_count": 2, "endpoint": "serving"}


def release_tiny_a(tmp_path, tiny_release) -> tuple[str, ReleaseConfig, Ledger]:
    """The tiny release promoted onto the shared endpoint `serving` (2 x ml.c7i.xlarge, one copy of two threads)."""
    released = tiny_release.write_tiny_config(tmp_path / "released", tmp_path / "state", name="tiny-a", placement=PLACE)
    release_id = run_release(released, progress=QUIET)["release_id"]
    config = load_release_config(released)
    assert config.image.threads == 2 and config.rollout.copies == 1, "the champion's copies take two cores each"
    return release_id, config, Ledger.for_sqlite(tmp_path / "state" / "ledger.db")


def proposal(tmp_path, tiny_release, **changes) -> list:
    """The next configs of tiny-a and of tiny-b (never released) on the same layout, with `changes`."""
    return [tiny_release.write_tiny_config(tmp_path / "proposal", tmp_path / "state", name=name, placement=PLACE,
                                           **changes) for name in ("tiny-a", "tiny-b")]


def test_fleet_serving_counts_the_champion_s_threads_which_a_move_starts_not_the_config_s(tmp_path, tiny_release):
    """The configs say one thread a copy: 8 one-core slots, where everything fits. A move starts the champion's image
    (two threads): onto one instance (the configs' 4 one-core slots, the champion's 2 two-core ones) its 2 copies
    updated all at once (4) have no room, refused before anything changes; the plan shows the difference."""
    release_id, config, ledger = release_tiny_a(tmp_path, tiny_release)
    endpoint = production_endpoint(config)
    configs = proposal(tmp_path, tiny_release, image__threads=1)
    assert plan_fleet(configs).problems == (), "the configs alone: 2 one-core copies on 8 cores, each update 3"
    smaller = tiny_release.write_tiny_config(tmp_path / "smaller", tmp_path / "state", name="tiny-a", rollout__copies=2,
                                             placement={**PLACE, "instance_count": 1}, image__threads=1)
    records = len(ledger.history())
    with pytest.raises(ConfigError, match=r"does not fit: tiny-a's next update has no room: an update without "
                                          r"DeploymentConfig starts all 2 new copies beside the old ones \(4 at once\) "
                                          r"beside the other models' 0 = 4 copies, but the endpoint grows to at most "
                                          r"1 x ml.c7i.xlarge = 2 2-core slots"):
        move_fleet([smaller], reason="drill: one instance", actor="ops", progress=QUIET)
    assert len(ledger.history()) == records, "refused before anything was recorded"
    assert [e["name"] for e in ProcessSupervisor(tmp_path / "state").list_endpoints()] == [endpoint], \
        "and before anything started"
    plan = plan_fleet(configs, ledger=ledger)
    assert [(t.model, t.threads) for t in plan.tenants] == [("tiny-a", 2), ("tiny-b", 1)]
    assert plan.tenants[0].differs == (
        f"image.threads is 1 in the config, 2 in {release_id} serving now (a move starts its image): counted 2",)
    assert (plan.slots.unit, plan.slots.total(plan.instances)) == ("2-core slot", 4), "counted in the largest slot"
    ledger.close()


def test_fleet_serving_counts_the_copies_the_endpoint_serves_not_the_config_s(tmp_path, tiny_release):
    """The config says 1 copy; the endpoint serves 3 (scaled out after its promotion recorded 1). Counted at 1, both
    models' updates fit 4 two-core slots (1 + 2 = 3); counted at the 3 serving, neither does, and `fleet plan` says
    why, exit 2."""
    _, config, ledger = release_tiny_a(tmp_path, tiny_release)
    configs = proposal(tmp_path, tiny_release)
    hosting = make_backends(config, ledger=ledger).hosting
    hosting.set_copies(production_endpoint(config), production_component(config), 3, progress=QUIET)
    shown = shiplift_cli("fleet", "plan", *map(str, configs))  # the configs' own ledger, and their backend's copies
    assert shown.returncode == 2, shown.stdout + shown.stderr
    assert "tiny-a: copies are 1 in the config, 3 serving now (read from the endpoint): counted 3" in shown.stdout
    assert plan_fleet(configs, ledger=ledger).tenants[0].copies == 1, "the ledger recorded the promotion's 1 copy"
    plan = plan_fleet(configs, ledger=ledger, open_hosting=lambda: hosting)
    served, joining = plan.tenants
    assert (served.copies, served.differs) == (3, ("copies are 1 in the config, 3 serving now (read from the "
                                                   "endpoint): counted 3",))
    assert (joining.serving, joining.differs, joining.copies) == (None, (), 1), "never promoted: its config"
    assert plan.problems == (
        "tiny-a's next update has no room: an update without DeploymentConfig starts all 3 new copies beside the old "
        "ones (6 at once) beside the other models' 1 = 7 copies, but the endpoint grows to at most 2 x ml.c7i.xlarge = "
        "4 2-core slots; fix: a rolling update with a smaller batch (and a small rollout.rollback_batch), fewer "
        "copies, or a lower scale_to_zero.max_copies, or placement.max_instance_count (managed scaling adds instances "
        "for the update)",
        "tiny-b's next update has no room: an update without DeploymentConfig starts all 1 new copies beside the old "
        "ones (2 at once) beside the other models' 3 = 5 copies, but the endpoint grows to at most 2 x ml.c7i.xlarge = "
        "4 2-core slots; fix: a rolling update with a smaller batch (and a small rollout.rollback_batch), fewer "
        "copies, or a lower scale_to_zero.max_copies, or placement.max_instance_count (managed scaling adds instances "
        "for the update)")
    ledger.close()
