"""The plan of a shared production endpoint (`placement.endpoint`, docs/fleet.md): the models that join it, the room
their copies and each one's next update take, the memory each copy needs as its last build measured it, and each
model's share of the hourly bill. A fleet that does not fit is refused with its arithmetic, before any release runs.

Each model is its own inference component with its own gate, rollout and lease, so two models' updates may overlap:
the plan asks room for the largest one beside every model's copies (the rule SageMaker's capacity enforces; an update
that finds no room fails with CapacityError and is retried with the policy table's backoff).

The configs are the proposal; what serves is read too (the snapshot's `Serving`: the release the ledger names for each
model, its image as gated and its copies as the endpoint reports them), since a move starts that release's image, not
the config's, and copies that serve take room whatever a config says. Where the two differ the plan says so per model
and counts the larger (a model serving on another endpoint is counted with the config's copies, which its move
starts). A model may grow to `scale_to_zero.max_copies`, and a rolling update's rollback may start all its old copies
beside the new, so both are counted in its peak. `plan_snapshot` is a pure function of what a command read once
(`tasks.pipeline.fleet.snapshot`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shiplift.tasks.backends.capacity import Slots, change_room, slots
from shiplift.tasks.backends.placement import partition_size
from shiplift.tasks.backends.pricing import (
    NOMINAL_REGION,
    ComponentShare,
    HourlyCost,
    PriceTable,
    component_share,
    production_cost,
)
from shiplift.tasks.config import ReleaseConfig
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.pipeline.fleet.snapshot import FleetSnapshot, Serving, load_fleet_configs, read_snapshot
from shiplift.tasks.pipeline.stages.common import production_endpoint


@dataclass(frozen=True)
class Tenant:
    """One model on the shared endpoint (a row of the plan): its copies (the larger of its config's and what serves),
    the most it may grow to (scale_to_zero.max_copies), the peak of its next update or that update's rollback from
    there, its CPU threads per copy, its memory per copy (None: never built in this ledger), its share of the bill,
    what serves it now (None: never promoted, or no ledger) and where its config and what serves differ."""

    model: str
    config: str
    copies: int
    most: int
    peak: int
    why: str
    threads: int | None  # per copy, on the CPU (None: a GPU image)
    memory_mb: int | None
    share: ComponentShare
    serving: Serving | None = None
    differs: tuple[str, ...] = ()
    partition_type: str | None = None  # its own MIG profile: in a mixed layout its copies take only those partitions

    @property
    def serves_on(self) -> str | None:
        """The endpoint the ledger says it serves on now (None: never promoted, or no ledger)."""
        return self.serving.endpoint if self.serving is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "config": self.config, "copies": self.copies, "max_copies": self.most,
                "update_peak": self.peak, "update": self.why, "threads": self.threads,
                "memory_mb_per_copy": self.memory_mb, "share": self.share.as_dict(), "serves_on": self.serves_on,
                "serving": self.serving.as_dict() if self.serving is not None else None, "differs": list(self.differs),
                "partition_type": self.partition_type}


@dataclass(frozen=True)
class FleetPlan:
    """The shared endpoint's layout, its tenants, the room they take and what each pays; `problems` say why it does not
    fit (empty: it fits); `kept`, the earlier layouts' endpoints still serving (with a ledger)."""

    group: str
    endpoint: str
    placement: dict[str, Any]
    slots: Slots
    instances: int
    most: int
    bill: HourlyCost
    tenants: tuple[Tenant, ...]
    problems: tuple[str, ...]
    kept: tuple[str, ...] = ()  # endpoints the fleet left, not retired: they serve on for callers of their names

    @property
    def steady(self) -> int:
        return sum(tenant.copies for tenant in self.tenants)

    def slots_of(self, tenant: Tenant) -> Slots:
        """The slots `tenant`'s copies take: in a mixed MIG layout its own profile's partitions, else the endpoint's."""
        return tenant.share.slots or self.slots

    def mates(self, tenant: Tenant) -> tuple[Tenant, ...]:
        """The models whose copies take the same slots as `tenant`'s (in a mixed MIG layout: the same profile)."""
        return tuple(t for t in self.tenants if t.partition_type == tenant.partition_type)

    def others(self, tenant: Tenant) -> int:
        """The copies every other model on its slots may hold (each grown to its most) beside `tenant`."""
        return sum(other.most for other in self.mates(tenant) if other is not tenant)

    def peak(self, tenant: Tenant) -> int:
        """Copies on the endpoint at once while `tenant` updates (or its update rolls back), every other model serving
        beside it at the most copies it may grow to."""
        return self.others(tenant) + tenant.peak

    @property
    def idles_free(self) -> bool:
        """Whether the endpoint's instances may stop: only when every model on it scales to zero (docs/fleet.md)."""
        return all(tenant.share.scales_to_zero for tenant in self.tenants)

    @property
    def moving(self) -> tuple[Tenant, ...]:
        """The models serving on another endpoint (an earlier layout's): `shiplift fleet move` moves them here."""
        return tuple(t for t in self.tenants if t.serves_on not in (None, self.endpoint))

    @property
    def headroom(self) -> int:
        """Slots left when the largest update runs (negative: short by that many); in a mixed MIG layout the least
        left of any profile's partitions."""
        return min(self.slots_of(tenant).total(self.most) - self.peak(tenant) for tenant in self.tenants)

    @property
    def idle_usd_per_hour(self) -> float | None:
        """What the slots no model's copies take cost an hour (None: the instance type is unpriced)."""
        used = sum(t.share.usd_per_hour or 0 for t in self.tenants)
        return (self.bill.usd_per_hour - used) if self.bill.usd_per_hour is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "endpoint": self.endpoint, "placement": self.placement, "unit": self.slots.unit,
                "slots": self.slots.total(self.instances), "slots_with_scaling": self.slots.total(self.most),
                "steady_copies": self.steady, "headroom": self.headroom, "bill": self.bill.as_dict(),
                "tenants": [t.as_dict() for t in self.tenants], "idle_usd_per_hour": self.idle_usd_per_hour,
                "idles_free": self.idles_free, "moves": [t.model for t in self.moving], "kept": list(self.kept),
                "differs": {t.model: list(t.differs) for t in self.tenants if t.differs}, "fits": not self.problems,
                "problems": list(self.problems)}


def plan_fleet(config_paths: list[str | Path], *, ledger=None, open_hosting: Callable[[], Any] | None = None,
               prices: PriceTable | None = None, overrides: tuple[str, ...] = ()) -> FleetPlan:
    """The plan of the shared endpoint every config names (each loaded once, with `overrides`): `plan_snapshot` of
    what `read_snapshot` reads (with `ledger`, each model's last build and what serves it; `open_hosting`, the
    backend that reports each serving component's copies now)."""
    configs = load_fleet_configs(config_paths, overrides)
    return plan_snapshot(read_snapshot(configs, ledger=ledger, open_hosting=open_hosting, prices=prices))


def plan_snapshot(snapshot: FleetSnapshot) -> FleetPlan:
    """The plan of the shared endpoint the snapshot's configs name, from the snapshot alone (reads nothing, changes
    nothing); ConfigError when a release serving now runs on another device than the configs."""
    configs = [fleet.config for fleet in snapshot.configs]
    serving = {config.name: snapshot.serving_of(config.name) for config in configs}
    images = {config.name: _planned_image(config, serving[config.name]) for config in configs}
    if len({image.on_gpu for image in images.values()}) != 1:
        raise ConfigError("a release serving now runs on another device than its config: "
                          + "; ".join(f"{name} serves {serving[name].release_id}" for name, image in images.items()
                                      if serving[name] is not None and image is serving[name].config.image),
                          fix="release each model with its config first, so that every model serves on one device")
    widest = max(images.values(), key=lambda image: image.threads)  # the largest copy counts every copy's slot
    first = configs[0]
    region = NOMINAL_REGION if first.backend.kind != "aws" else first.backend.region
    endpoint = production_endpoint(first)
    zero = {config.name: _scales_to_zero(config, serving[config.name], endpoint) for config in configs}
    always_on = tuple(name for name, scales in zero.items() if not scales)
    tenants = []
    for fleet in snapshot.configs:
        config, image = fleet.config, images[fleet.name]
        copies, most, differs = _counted(config, serving[config.name], image, endpoint)
        share = component_share(snapshot.prices, region, config.placement, widest, copies,
                                scales_to_zero=zero[config.name], kept_on_by=always_on)
        tenants.append(Tenant(config.name, fleet.path, copies, most, *change_room(config.rollout, most),
                              None if image.on_gpu else image.threads, snapshot.memory_mb(config.name), share,
                              serving[config.name], differs, getattr(config.placement, "partition_type", None)))
    placement = first.placement
    instances = getattr(placement, "instance_count", 1)
    plan = FleetPlan(group=placement.endpoint, endpoint=endpoint,
                     placement=placement.model_dump(mode="json", exclude={"endpoint"}), slots=slots(placement, widest),
                     instances=instances, most=getattr(placement, "max_instance_count", None) or instances,
                     bill=production_cost(snapshot.prices, region, placement), tenants=tuple(tenants), problems=(),
                     kept=snapshot.endpoints_left(endpoint))
    return replace(plan, problems=_problems(plan))


def _planned_image(config: ReleaseConfig, serving: Serving | None):
    """The image whose copies the plan counts for a model: the serving release's where its copies are larger (a move
    starts that image, and its copies serve until the next release), else the config's."""
    if serving is not None and serving.config.image.threads > config.image.threads:
        return serving.config.image
    return config.image


def _scales_to_zero(config: ReleaseConfig, serving: Serving | None, endpoint: str) -> bool:
    """Whether a model's copies on `endpoint` may all go: its config scales to zero, and so does the release serving
    it there, if one does (one serving elsewhere is moved with the config's scaling)."""
    return config.scale_to_zero is not None and (serving is None or serving.endpoint != endpoint
                                                 or serving.config.scale_to_zero is not None)


def _counted(config: ReleaseConfig, serving: Serving | None, image, endpoint: str) -> tuple[int, int, tuple[str, ...]]:
    """A model's copies on `endpoint` and the most it may grow to, and where its config and what serves differ, each
    difference with what is counted: the larger of the two where it serves on `endpoint`; where it serves elsewhere,
    the config's copies and scaling (a move starts those, with the serving release's image)."""
    proposed = config.rollout.copies
    grows = config.scale_to_zero.plan(proposed).max_copies if config.scale_to_zero is not None else proposed
    if serving is None:
        return proposed, grows, ()
    differs = []
    if not image.on_gpu and serving.config.image.threads != config.image.threads:
        differs.append(f"image.threads is {config.image.threads} in the config, {serving.config.image.threads} in "
                       f"{serving.release_id} serving now (a move starts its image): counted {image.threads}")
    if serving.endpoint != endpoint:
        return proposed, grows, tuple(differs)
    copies = max(proposed, serving.copies)
    most = max(copies, grows, serving.max_copies or 0)
    if serving.copies != proposed:
        differs.append(f"copies are {proposed} in the config, {serving.copies} serving now (read from "
                       f"{serving.copies_from}): counted {copies}")
    if serving.max_copies is not None and serving.max_copies != grows:
        differs.append(f"scale_to_zero grows to {grows} copies in the config, to {serving.max_copies} as it serves "
                       f"now: counted {most}")
    return copies, most, tuple(differs)


def _problems(plan: FleetPlan) -> tuple[str, ...]:
    """Why the fleet does not fit, each with its arithmetic and the fix: per slots the models share (in a mixed MIG
    layout, per profile)."""
    problems = []
    pools = {tenant.partition_type: plan.mates(tenant) for tenant in plan.tenants}
    for pool in pools.values():
        room, steady = plan.slots_of(pool[0]), sum(t.copies for t in pool)
        if steady > room.total(plan.instances):
            copies = " + ".join(f"{t.model} {t.copies}" for t in pool)
            problems.append(f"the models' copies do not fit: {copies} = {steady} copies, one {room.unit} each, "
                            f"but {room.describe(plan.instances)}; fix: fewer copies, more instances "
                            "(placement.instance_count) or, for MIG, more partitions per GPU, or another endpoint for "
                            "some")
    smaller = ("a rolling update with a smaller batch (and a small rollout.rollback_batch), fewer copies, or a lower "
               "scale_to_zero.max_copies")
    on_mig = plan.placement.get("kind") == "mig_partition"
    grow = (f"{smaller} (a MIG endpoint is one instance, its layout fixed)" if on_mig
            else f"{smaller}, or placement.max_instance_count (managed scaling adds instances for the update)")
    for tenant in plan.tenants:
        if plan.peak(tenant) > plan.slots_of(tenant).total(plan.most):
            problems.append(f"{tenant.model}'s next update has no room: {tenant.why} ({tenant.peak} at once) beside "
                            f"the other models' {plan.others(tenant)} = {plan.peak(tenant)} copies, but the endpoint "
                            f"grows to at most {plan.slots_of(tenant).describe(plan.most)}; fix: {grow}")
    if on_mig:
        problems += [f"{t.model}'s copy needs {t.memory_mb} MB (its last build), more than a {t.partition_type} "
                     f"partition's {partition_size(t.partition_type)[1] * 1024} MB; fix: a larger partition type"
                     for t in plan.tenants
                     if t.memory_mb is not None and t.memory_mb > partition_size(t.partition_type)[1] * 1024]
    return tuple(problems)
