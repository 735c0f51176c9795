"""The plan of a shared production endpoint (`placement.endpoint`, docs/fleet.md): the models that join it, the room
their copies and each one's next update take, the memory each copy needs as its last build measured it, and each
model's share of the hourly bill. A fleet that does not fit is refused with its arithmetic, before any release runs.

Each model is its own inference component with its own gate, rollout and lease, so two models' updates may overlap:
the plan asks room for the largest one beside every model's copies (the rule SageMaker's capacity enforces; an update
that finds no room fails with CapacityError and is retried with the policy table's backoff).

The configs are the proposal; what serves is read too (`serving_now`: the release the ledger names for each model, its
image as gated and its copies as the endpoint reports them), since a move starts that release's image, not the
config's, and copies that serve take room whatever a config says. Where the two differ the plan says so per model
and counts the larger (a model serving on another endpoint is counted with the config's copies, which its move
starts). A model may grow to `scale_to_zero.max_copies`, and a rolling update's rollback may start all its old copies
beside the new, so both are counted in its peak.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from tasks.backends.capacity import Slots, change_room, slots
from tasks.backends.placement import partition_size
from tasks.backends.pricing import NOMINAL_REGION, ComponentShare, HourlyCost, component_share, load_price_table, production_cost
from tasks.config import ReleaseConfig, load_release_config
from tasks.errors import ConfigError
from tasks.ledger import events
from tasks.ledger.release_state import ReleaseState
from tasks.ledger.views import moves_not_retired
from tasks.pipeline.release import latest_move, moved_config
from tasks.pipeline.stages.common import production_endpoint


@dataclass(frozen=True)
class Serving:
    """What serves a model now: the release its newest promotion names (ledger), that release's config as it serves
    (its image as gated; placement, copies and scaling as its newest move set them), and its copies, the larger of
    those the endpoint reports for its component now and those its promotion recorded (`copies_from` says which)."""

    release_id: str
    endpoint: str | None
    config: ReleaseConfig
    copies: int
    copies_from: str

    @property
    def max_copies(self) -> int | None:
        """The copies its scaling may start (scale_to_zero.max_copies, else its copies); None: it does not scale."""
        scaling = self.config.scale_to_zero
        return None if scaling is None else scaling.plan(self.config.rollout.copies).max_copies

    def as_dict(self) -> dict[str, Any]:
        return {"release_id": self.release_id, "endpoint": self.endpoint, "threads": self.config.image.threads,
                "copies": self.copies, "copies_from": self.copies_from, "max_copies": self.max_copies}


@dataclass(frozen=True)
class Tenant:
    """One model on the shared endpoint: its copies (the larger of its config's and what serves), the most it may
    grow to (scale_to_zero.max_copies), the peak of its next update or that update's rollback from there, its CPU
    threads per copy, its memory per copy (None: never built in this ledger), its share of the bill, what serves it now (None:
    never promoted, or no ledger) and where its config and what serves differ."""

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

    @property
    def serves_on(self) -> str | None:
        """The endpoint the ledger says it serves on now (None: never promoted, or no ledger)."""
        return self.serving.endpoint if self.serving is not None else None

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "config": self.config, "copies": self.copies, "max_copies": self.most,
                "update_peak": self.peak, "update": self.why, "threads": self.threads,
                "memory_mb_per_copy": self.memory_mb, "share": self.share.as_dict(), "serves_on": self.serves_on,
                "serving": self.serving.as_dict() if self.serving is not None else None, "differs": list(self.differs)}


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

    def others(self, tenant: Tenant) -> int:
        """The copies every other model may hold (each grown to its most) beside `tenant`."""
        return sum(other.most for other in self.tenants if other is not tenant)

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
        """Slots left when the largest update runs (negative: short by that many)."""
        return self.slots.total(self.most) - max(self.peak(tenant) for tenant in self.tenants)

    def rows(self) -> list[dict[str, Any]]:
        """A row per model for people: copies, its update's peak with everyone else serving, memory, share and cost."""
        total = self.slots.total(self.most)
        return [{"model": t.model, "copies": t.copies if t.most == t.copies else f"{t.copies} (up to {t.most})",
                 "peak while it updates": f"{self.peak(t)} of {total}", "threads": t.threads,
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
                "idles_free": self.idles_free, "moves": [t.model for t in self.moving], "kept": list(self.kept),
                "differs": {t.model: list(t.differs) for t in self.tenants if t.differs}, "fits": not self.problems,
                "problems": list(self.problems)}


def plan_fleet(config_paths: list[str | Path], *, ledger=None, open_hosting: Callable[[], Any] | None = None,
               table=None, overrides: tuple[str, ...] = ()) -> FleetPlan:
    """The plan of the shared endpoint every config names (each loaded with `overrides`); ConfigError, naming the
    configs, when they do not name one endpoint, name it with different placements, prefixes or backends, or list a
    model twice. `ledger` (optional) gives each model's memory per copy from its newest succeeded build and what
    serves it now (its release's image and copies, counted where larger than the config's); `open_hosting` (optional,
    with the ledger; called once, only when a model serves) the backend that reports its component's copies now."""
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
    hosting = functools.cache(open_hosting) if open_hosting is not None else None
    serving = {config.name: serving_now(ledger, hosting, config.name) for _, config in configs}
    images = {config.name: _planned_image(config, serving[config.name]) for _, config in configs}
    if len({image.on_gpu for image in images.values()}) != 1:
        raise ConfigError("a release serving now runs on another device than its config: "
                          + "; ".join(f"{name} serves {serving[name].release_id}" for name, image in images.items()
                                      if serving[name] is not None and image is serving[name].config.image),
                          fix="release each model with its config first, so that every model serves on one device")
    widest = max(images.values(), key=lambda image: image.threads)  # the largest copy counts every copy's slot
    table = load_price_table() if table is None else table
    region = NOMINAL_REGION if first.backend.kind != "aws" else first.backend.region
    endpoint = production_endpoint(first)
    zero = {config.name: _scales_to_zero(config, serving[config.name], endpoint) for _, config in configs}
    always_on = tuple(name for name, scales in zero.items() if not scales)
    tenants = []
    for path, config in configs:
        copies, most, differs = _counted(config, serving[config.name], images[config.name], endpoint)
        share = component_share(table, region, config.placement, widest, copies, scales_to_zero=zero[config.name],
                                kept_on_by=always_on)
        tenants.append(Tenant(config.name, path, copies, most, *change_room(config.rollout, most),
                              None if images[config.name].on_gpu else images[config.name].threads,
                              _memory_mb(ledger, config.name), share,
                              serving[config.name], differs))
    placement = first.placement
    instances = getattr(placement, "instance_count", 1)
    plan = FleetPlan(group=placement.endpoint, endpoint=endpoint,
                     placement=placement.model_dump(mode="json", exclude={"endpoint"}), slots=slots(placement, widest),
                     instances=instances, most=getattr(placement, "max_instance_count", None) or instances,
                     bill=production_cost(table, region, placement), tenants=tuple(tenants), problems=(),
                     kept=endpoints_left(ledger, [t.model for t in tenants], endpoint))
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


def serving_now(ledger, hosting: Callable[[], Any] | None, model: str) -> Serving | None:
    """What serves `model` now (None: never promoted, or no ledger): the release its newest promotion names, that
    release's opened config as its newest move (if any) serves it, and its copies, the larger of those its promotion
    recorded and those the backend `hosting()` (optional) reports for its component now."""
    served = ledger.served_at(model, datetime.now(timezone.utc)) if ledger is not None else None
    if served is None:
        return None
    state = ReleaseState.load(ledger, served.release_id)
    config = ReleaseConfig.model_validate(state.opened["config"])
    move = latest_move(state.records)
    if move is not None:
        config = moved_config(config, move.payload["moved_to"])
    endpoint, component = served.payload.get("endpoint"), served.payload.get("component")
    recorded = served.payload.get("copies") or 0
    live = hosting().describe(endpoint, component) if hosting is not None and endpoint and component else None
    if live is not None and live.copies >= recorded:
        return Serving(served.release_id, endpoint, config, live.copies, "the endpoint")
    return Serving(served.release_id, endpoint, config, recorded, "the ledger")


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
    """Why the fleet does not fit, each with its arithmetic and the fix."""
    problems = []
    steady = " + ".join(f"{t.model} {t.copies}" for t in plan.tenants)
    if plan.steady > plan.slots.total(plan.instances):
        problems.append(f"the models' copies do not fit: {steady} = {plan.steady} copies, one {plan.slots.unit} each, "
                        f"but {plan.slots.describe(plan.instances)}; fix: fewer copies, more instances "
                        "(placement.instance_count) or, for MIG, more partitions per GPU, or another endpoint for some")
    smaller = ("a rolling update with a smaller batch (and a small rollout.rollback_batch), fewer copies, or a lower "
               "scale_to_zero.max_copies")
    grow = (f"{smaller} (a MIG endpoint is one instance, its layout fixed)" if plan.placement.get("kind") == "mig_partition"
            else f"{smaller}, or placement.max_instance_count (managed scaling adds instances for the update)")
    for tenant in plan.tenants:
        if plan.peak(tenant) > plan.slots.total(plan.most):
            problems.append(f"{tenant.model}'s next update has no room: {tenant.why} ({tenant.peak} at once) beside the "
                            f"other models' {plan.others(tenant)} = {plan.peak(tenant)} copies, but the endpoint grows to at most "
                            f"{plan.slots.describe(plan.most)}; fix: {grow}")
    if plan.placement.get("kind") == "mig_partition":
        room_mb = partition_size(plan.placement["partition_type"])[1] * 1024
        problems += [f"{t.model}'s copy needs {t.memory_mb} MB (its last build), more than a "
                     f"{plan.placement['partition_type']} partition's {room_mb} MB; fix: a larger partition type"
                     for t in plan.tenants if t.memory_mb is not None and t.memory_mb > room_mb]
    return tuple(problems)
