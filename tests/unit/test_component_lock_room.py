"""A local shared endpoint holds only the copies its placement's instances hold (issue 44), counted as the SageMaker
double counts them (tests/fakes/aws_double.py, `SageMaker._capacity_problem`): a deploy, update or scale that would
not fit is refused with CapacityError before anything changes, and the other tenants' copies and traffic are left
alone. Real router and fake model-server processes on loopback, each copy declaring 2 CPU cores as the promote stage's
specs do; the placement is 2 x ml.c7i.xlarge (4 vCPUs each, https://aws.amazon.com/ec2/instance-types/c7i/), so the
endpoint holds 4 copies."""

from __future__ import annotations

import json

import pytest

from shiplift.tasks.backends.interfaces import ComponentSpec, Compute, ModelRef, RolloutPlan
from shiplift.tasks.backends.local.endpoint_state import ProcessSpec
from shiplift.tasks.backends.local.rollout import peak_copies, roll_out
from shiplift.tasks.backends.local.room import EndpointRoom, need_of, room_of
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.backends.placement import InstancePoolPlacement, InstanceTypePlacement, MigPartitionPlacement
from shiplift.tasks.errors import CapacityError
from tests.unit.test_component_lock import ParkedBake, _invoke
from tests.unit.test_local_hosting import _spec

ENDPOINT = "ep-room"
PLACEMENT = InstanceTypePlacement(kind="instance_type", instance_type="ml.c7i.xlarge", instance_count=2,
                                  endpoint="fleet")


def _tenant(copies: int, version: str = "v1") -> ProcessSpec:
    """A fake copy spec carrying its neutral ComponentSpec: 2 CPU cores a copy (image.threads 2)."""
    digest = "sha256:" + (version.encode().hex() * 64)[:64]
    neutral = ComponentSpec(image_uri=f"fake/semif@{digest}", artifact_uri=f"file:///fake/{version}",
                            artifact_sha256="a" * 64,
                            environment={}, copies=copies, compute=Compute(memory_mb=128, cpu_cores=2.0),
                            model_ref=ModelRef(release_id=version, artifact_sha256="a" * 64, image_digest=digest))
    return _spec(copies=copies, version=version).model_copy(update={"neutral": neutral.model_dump(mode="json")})


def _fleet(hosting: ProcessSupervisor, **copies: int) -> str:
    """The shared endpoint with its room recorded and a tenant per keyword; its URL."""
    url = hosting.ensure_endpoint(ENDPOINT).url
    hosting.set_room(ENDPOINT, room_of(PLACEMENT))
    for name, count in copies.items():
        hosting.put_component(ENDPOINT, name, _tenant(count), ready_timeout_s=20)
    return url


def _serving(hosting: ProcessSupervisor) -> dict[str, tuple[str, list[int]]]:
    """Per component, the version it serves and its copies' pids."""
    state = hosting._load(ENDPOINT)
    return {name: (comp.spec.model_ref["version"], [c.pid for c in comp.copies]) for name,
            comp in state.components.items()}


def _untouched(hosting: ProcessSupervisor, before: dict, url: str) -> None:
    """Nothing changed: the same copies serve the same versions, each answers through the router, and no claim, no
    copy being started and no rolling update is left behind."""
    state = hosting._load(ENDPOINT)
    assert _serving(hosting) == before
    assert state.claims == {} and state.pending == state.retiring == []
    assert all(comp.previous is None for comp in state.components.values())
    for name, (_, pids) in before.items():
        status, body = _invoke(url, name)
        assert status == 200 and json.loads(body)["pid"] in pids, (name, status, body)


def test_a_third_tenant_whose_copies_do_not_fit_is_refused_and_changes_nothing(hosting):
    url = _fleet(hosting, a=2, b=1)
    before = _serving(hosting)
    with pytest.raises(CapacityError) as refused:
        hosting.put_component(ENDPOINT, "c", _tenant(3), ready_timeout_s=20)
    # the double's InsufficientCapacity reason, word for word, then the arithmetic and the fix
    assert ("InsufficientCapacity: Unable to place 3 copies of inference component c: endpoint ep-room has room for 1 "
            "(2 x ml.c7i.xlarge with 4 vCPUs each, 6 held by other inference components, 2 a copy)"
            ) in refused.value.problem
    assert "3 x 2 + 6 = 12 vCPUs > 8" in refused.value.problem
    assert "placement.instance_count (or max_instance_count" in refused.value.fix and " to 3 " in refused.value.fix
    _untouched(hosting, before, url)
    assert "c" not in hosting.describe_endpoint(ENDPOINT)["components"]
    hosting.put_component(ENDPOINT, "c", _tenant(1), ready_timeout_s=20)  # the one copy left fits
    assert _serving(hosting)["c"][0] == "v1"


def test_an_update_s_extra_batch_and_a_scale_out_count_and_a_scale_in_always_fits(hosting):
    url = _fleet(hosting, a=2, b=2)  # 4 of 4
    before = _serving(hosting)
    with pytest.raises(CapacityError, match="Unable to place 3 copies of inference component a: .* room for 2 "):
        roll_out(hosting, ENDPOINT, "a", _tenant(2, "v2"), RolloutPlan(strategy="canary"), lambda step: None,
                 ready_timeout_s=20)
    with pytest.raises(CapacityError, match="Unable to place 4 copies of inference component b"):
        hosting.put_component(ENDPOINT, "b", _tenant(2, "v2"), ready_timeout_s=20)  # all at once: 2 new beside 2 old
    with pytest.raises(CapacityError, match="Unable to place 3 copies of inference component b"):
        hosting.scale(ENDPOINT, "b", 3)
    _untouched(hosting, before, url)
    assert hosting.scale(ENDPOINT, "b", 1), "scaling in needs no room"
    result = roll_out(hosting, ENDPOINT, "a", _tenant(2, "v2"), RolloutPlan(strategy="canary"), lambda step: None,
                      ready_timeout_s=20)
    assert result.status == "succeeded", "with b at one copy, a's canary batch fits beside"


def test_a_rollout_in_flight_holds_its_peak_against_the_other_tenants(hosting):
    """Check and claim are one step: while a's canary bakes with 3 copies, b cannot take that room."""
    import threading

    _fleet(hosting, a=2)
    bake, outcome = ParkedBake(), {}
    thread = threading.Thread(target=lambda: outcome.update(result=roll_out(
        ProcessSupervisor(hosting.state_dir), ENDPOINT, "a", _tenant(2, "v2"), RolloutPlan(strategy="canary"), bake,
        ready_timeout_s=20)), daemon=True)
    thread.start()
    try:
        assert bake.started.wait(30), "a's canary never reached its bake"
        assert hosting._load(ENDPOINT).claims["a"].copies == 3
        with pytest.raises(CapacityError, match="room for 1 .*6 held by other inference components"):
            hosting.put_component(ENDPOINT, "b", _tenant(2), ready_timeout_s=20)
    finally:
        bake.released.set()
        thread.join(60)
    assert outcome["result"].status == "succeeded" and hosting._load(ENDPOINT).claims == {}, "the claim ends with it"
    hosting.put_component(ENDPOINT, "b", _tenant(2), ready_timeout_s=20)  # a holds 2 again: 2 more fit


def test_a_tenant_left_with_more_copies_than_it_wants_is_counted_by_the_copies_it_runs(hosting):
    """An update that stopped partway (LeaseLost, a failed ledger write) leaves more copies running than the component
    wants, and its claim is gone: the other tenants' room counts the copies that run, not the count it wants."""
    _fleet(hosting, a=3)
    state = hosting._load(ENDPOINT)
    state.components["a"].desired = 1  # wants 1, still runs 3 (6 of 8 vCPUs)
    hosting._save(state)
    with pytest.raises(CapacityError, match="room for 1 .*6 held by other inference components"):
        hosting.put_component(ENDPOINT, "b", _tenant(2), ready_timeout_s=20)
    hosting.put_component(ENDPOINT, "b", _tenant(1), ready_timeout_s=20)  # the one slot the 3 copies leave


def test_the_room_of_a_placement_is_counted_as_sagemaker_counts_it():
    assert room_of(PLACEMENT.model_copy(update={"endpoint": None})) is None, "a model's own endpoint is not counted"
    room = room_of(PLACEMENT.model_copy(update={"max_instance_count": 3}))
    assert room.instances == 3 and room.per_instance("vCPUs") == 4, "managed instance scaling adds instances"
    pool = InstancePoolPlacement(kind="instance_pool", endpoint="fleet", pools=[
        {"instance_type": "ml.c7i.2xlarge", "priority": 1}, {"instance_type": "ml.c7i.xlarge", "priority": 2}])
    assert room_of(pool).per_instance("vCPUs") == 4, "any pool type may be provisioned: the smallest counts"
    mig = room_of(MigPartitionPlacement(kind="mig_partition", instance_type="ml.p5.4xlarge",
                                        partition_type="mig-1g.10gb", partitions=7, endpoint="shared-h100"))
    assert mig.per_instance("mig-1g.10gb partitions") == 7 and mig.per_instance("GPUs") == 1
    assert need_of({"compute": {"accelerator_partition": "mig-1g.10gb",
                                "memory_mb": 128}}) == ("mig-1g.10gb partitions", 1)
    assert need_of({"compute": {"accelerators": 1, "memory_mb": 128}}) == ("GPUs", 1)
    assert need_of(None) is None and EndpointRoom(instance_types=("ml.x9.large",),
                                                  instances=1).per_instance("vCPUs") is None
    # the local rollout's peak: a canary of 1 then 1 of 2 copies runs 3 at once, a linear one of 4 by 1 runs 5
    assert peak_copies(RolloutPlan(strategy="canary"), 2, 2) == 3
    assert peak_copies(RolloutPlan(strategy="linear"), 4, 4) == 5
    assert peak_copies(RolloutPlan(strategy="all_at_once"), 2, 2) == 4
