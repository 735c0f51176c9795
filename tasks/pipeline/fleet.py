"""The plan of a shared production endpoint (`placement.endpoint`, docs/fleet.md): the models that join it, the room
their copies and each one's next update take, the memory each copy needs as its last build measured it, and each
model's share of the hourly bill. A fleet that does not fit is refused with its arithmetic, before any release runs.

Each model is its own inference component with its own gate, rollout and lease, so two models' updates may overlap:
the plan asks room for the largest one beside every model's copies (the rule SageMaker's capacity enforces; an update
that finds no room fails with CapacityError and is retried with the policy table's backoff).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.backends.capacity import Slots, slots, update_room
from tasks.backends.placement import partition_size
from tasks.backends.pricing import NOMINAL_REGION, ComponentShare, HourlyCost, component_share, load_price_table, production_cost
from tasks.config import load_release_config
from tasks.errors import ConfigError
from tasks.ledger import events
from tasks.ledger.views import moves_not_retired
from tasks.pipeline.stages.common import production_endpoint


@dataclass(frozen=True)
class Tenant:
    """One model on the shared endpoint: its copies, its next update's peak, its memory per copy (None: never built in
    this ledger), its share of the bill, and the endpoint the ledger says it serves on now (None: never promoted, or
    no ledger)."""

    model: str
    config: str
    copies: int
    peak: int
    why: str
    memory_mb: int | None
    share: ComponentShare
    serves_on: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "config": self.config, "copies": self.copies, "update_peak": self.peak,
                "update": self.why, "memory_mb_per_copy": self.memory_mb, "share": self.share.as_dict(),
                "serves_on": self.serves_on}


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

    def peak(self, tenant: Tenant) -> int:
        """Copies on the endpoint at once while `tenant` updates, every other model serving beside it."""
        return self.steady - tenant.copies + tenant.peak

    @property
    def moving(self) -> tuple[Tenant, ...]:
        """The models serving on another endpoint (an earlier layout's): `shiplift fleet move` moves them here."""
        return tuple(t for t in self.tenants if t.serves_on not in (None, self.endpoint))

    @property
    def headroom(self) -> int:
        """Slots left when the largest update runs (negative: short by that many)."""
        return self.slots.total(self.most) - max(self.peak(tenant) for tenant in self.tenants)

    def rows(self) -> list[dict[str, Any]]:
        """A row per model for people: copies, its update's peak with everyone else serving, memory, share and cost."""
        total = self.slots.total(self.most)
        return [{"model": t.model, "copies": t.copies, "peak while it updates": f"{self.peak(t)} of {total}",
                 "memory/copy MB": t.memory_mb, "share": f"{t.share.fraction:.1%}" if t.share.fraction is not None else None,
                 "$/h": round(t.share.usd_per_hour, 2) if t.share.usd_per_hour is not None else None,
                 "serves on now": "this endpoint" if t.serves_on == self.endpoint else t.serves_on} for t in self.tenants]

    def as_dict(self) -> dict[str, Any]:
        capacity = self.slots.total(self.instances)
        used = sum(t.share.usd_per_hour or 0 for t in self.tenants)
        return {"group": self.group, "endpoint": self.endpoint, "placement": self.placement, "unit": self.slots.unit,
                "slots": capacity, "slots_with_scaling": self.slots.total(self.most), "steady_copies": self.steady,
                "headroom": self.headroom, "bill": self.bill.as_dict(), "tenants": [t.as_dict() for t in self.tenants],
                "idle_usd_per_hour": (self.bill.usd_per_hour - used) if self.bill.usd_per_hour is not None else None,
                "moves": [t.model for t in self.moving], "kept": list(self.kept), "fits": not self.problems,
                "problems": list(self.problems)}


def plan_fleet(config_paths: list[str | Path], *, ledger=None, table=None, overrides: tuple[str, ...] = ()) -> FleetPlan:
    """The plan of the shared endpoint every config names (each loaded with `overrides`); ConfigError, naming the
    configs, when they do not name one endpoint, name it with different placements, prefixes or backends, or list a
    model twice. `ledger` (optional) gives each model's memory per copy from its newest succeeded build and the
    endpoint it serves on now."""
    if not config_paths:
        raise ConfigError("no release config to plan", fix="pass the configs of every model on the shared endpoint")
    configs = [(str(path), load_release_config(path, overrides=overrides)) for path in config_paths]
    groups = {config.placement.endpoint for _, config in configs}
    if None in groups or len(groups) != 1:
        named = "; ".join(f"{path}: {config.placement.endpoint or 'its own endpoint'}" for path, config in configs)
        raise ConfigError(f"a fleet plan is of one shared endpoint, but the configs name: {named}",
                          fix="set the same placement.endpoint in every config of the fleet")
    first_path, first = configs[0]
    for path, config in configs[1:]:
        differs = _differences(first, config)
        if differs:
            raise ConfigError(f"{path} places its model on {first.placement.endpoint} with other {', '.join(differs)} than "
                              f"{first_path}: a running endpoint's instances and layout cannot change per model, and "
                              "one fleet is planned and moved from one ledger",
                              fix="give every model on the shared endpoint the same placement, resource_prefix, backend "
                                  "and ledger")
    names = [config.name for _, config in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"a model is listed twice: {', '.join(sorted(n for n in set(names) if names.count(n) > 1))}",
                          fix="pass each model's config once")
    found = [slots(config.placement, config.image) for _, config in configs]
    if None in found:
        raise ConfigError(f"the copies one {first.placement} instance holds are not in tasks/backends/capacity.py's tables",
                          fix="use an instance type the capacity tables know, or add it there with its source")
    if len({(s.per_instance, s.unit) for s in found}) != 1:
        kinds = "; ".join(f"{config.name}: {s.per_instance} x {s.unit} an instance" for (_, config), s in zip(configs, found))
        raise ConfigError(f"the models count their copies in different slots ({kinds}), so one layout cannot be planned",
                          fix="give every model on the shared endpoint the same device and image.threads")
    table = load_price_table() if table is None else table
    region = NOMINAL_REGION if first.backend.kind != "aws" else first.backend.region
    tenants = tuple(Tenant(config.name, path, config.rollout.copies, *update_room(config.rollout),
                           _memory_mb(ledger, config.name),
                           component_share(table, region, config.placement, config.image, config.rollout.copies),
                           serves_on(ledger, config.name))
                    for path, config in configs)
    placement = first.placement
    instances = getattr(placement, "instance_count", 1)
    plan = FleetPlan(group=placement.endpoint, endpoint=production_endpoint(first),
                     placement=placement.model_dump(mode="json", exclude={"endpoint"}), slots=found[0],
                     instances=instances, most=getattr(placement, "max_instance_count", None) or instances,
                     bill=production_cost(table, region, placement), tenants=tenants, problems=(),
                     kept=endpoints_left(ledger, [t.model for t in tenants], production_endpoint(first)))
    return replace(plan, problems=_problems(plan))


def _differences(one, other) -> list[str]:
    """The placement fields (and the resource prefix) two configs of one shared endpoint give differently."""
    mine, theirs = one.placement.model_dump(mode="json"), other.placement.model_dump(mode="json")
    fields = sorted(f"placement.{key}" for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
    return (fields + (["resource_prefix"] if one.resource_prefix != other.resource_prefix else [])
            + (["backend (kind, region)"] if backend_place(one) != backend_place(other) else [])
            + (["ledger (backend.ledger_url, else backend.state_dir)"] if _ledger_of(one) != _ledger_of(other) else []))


def _ledger_of(config) -> str:
    """The ledger a config's releases write: its URL, else the SQLite file's folder (`tasks.backends.registry`)."""
    return config.backend.ledger_url or str(Path(config.backend.state_dir).expanduser().resolve())


def backend_place(config) -> tuple[str, str | None]:
    """Where a config's resources live: its backend's kind and (aws) region; one shared endpoint is in one place."""
    return config.backend.kind, getattr(config.backend, "region", None)


def _memory_mb(ledger, model: str) -> int | None:
    """What one copy needs, from the model's newest succeeded build in the ledger; None when it was never built."""
    if ledger is None:
        return None
    builds = [r for r in ledger.history(model) if (r.stage, r.event) == (events.BUILD, events.SUCCEEDED)]
    return builds[-1].payload["memory"]["total_mb"] if builds else None


def endpoints_left(ledger, models: list[str], endpoint: str) -> tuple[str, ...]:
    """The endpoints other than `endpoint` that a fleet move took these models away from and whose retirement is not
    recorded since (they serve on for callers that have not switched); none without a ledger."""
    if ledger is None:
        return ()
    return tuple(sorted({left for model in models for left in moves_not_retired(ledger.history(model)) if left != endpoint}))


def serves_on(ledger, model: str) -> str | None:
    """The endpoint the model's newest promotion names (where it serves now); None when never promoted."""
    served = ledger.served_at(model, datetime.now(timezone.utc)) if ledger is not None else None
    return served.payload.get("endpoint") if served is not None else None


def _problems(plan: FleetPlan) -> tuple[str, ...]:
    """Why the fleet does not fit, each with its arithmetic and the fix."""
    problems = []
    steady = " + ".join(f"{t.model} {t.copies}" for t in plan.tenants)
    if plan.steady > plan.slots.total(plan.instances):
        problems.append(f"the models' copies do not fit: {steady} = {plan.steady} copies, one {plan.slots.unit} each, "
                        f"but {plan.slots.describe(plan.instances)}; fix: fewer copies, more instances "
                        "(placement.instance_count) or, for MIG, more partitions per GPU, or another endpoint for some")
    grow = ("a rolling update with a smaller batch, or fewer copies (a MIG endpoint is one instance, its layout fixed)"
            if plan.placement.get("kind") == "mig_partition" else
            "a rolling update with a smaller batch, placement.max_instance_count (managed scaling adds instances for "
            "the update), or fewer copies")
    for tenant in plan.tenants:
        if plan.peak(tenant) > plan.slots.total(plan.most):
            others = plan.steady - tenant.copies
            problems.append(f"{tenant.model}'s next update has no room: {tenant.why} ({tenant.peak} at once) beside the "
                            f"other models' {others} = {plan.peak(tenant)} copies, but the endpoint grows to at most "
                            f"{plan.slots.describe(plan.most)}; fix: {grow}")
    if plan.placement.get("kind") == "mig_partition":
        room_mb = partition_size(plan.placement["partition_type"])[1] * 1024
        problems += [f"{t.model}'s copy needs {t.memory_mb} MB (its last build), more than a "
                     f"{plan.placement['partition_type']} partition's {room_mb} MB; fix: a larger partition type"
                     for t in plan.tenants if t.memory_mb is not None and t.memory_mb > room_mb]
    return tuple(problems)
