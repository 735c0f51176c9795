"""What a fleet command reads, read once and gathered here: the release config of every model on the shared endpoint
(each file parsed once, checked to describe one endpoint), each model's ledger history (one read per model), what
serves each model now (its release's config as gated and as its newest move placed it; its copies, the larger of its
promotion's and those its component reports now) and the price table. The plan (`tasks.pipeline.fleet.plan`) is a
pure function of a snapshot; the move (`tasks.pipeline.fleet.move`) plans, moves and retires from one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shiplift.tasks.backends.capacity import Slots, slots
from shiplift.tasks.backends.placement import endpoint_placement
from shiplift.tasks.backends.pricing import PriceTable, load_price_table
from shiplift.tasks.config import ReleaseConfig, load_release_config
from shiplift.tasks.errors import ConfigError, NotFound
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.records import Opened, is_promotion, promotion, stage_payload
from shiplift.tasks.ledger.stage_results import BuildResult
from shiplift.tasks.ledger.views import moves_not_retired
from shiplift.tasks.pipeline.release import latest_move, moved_config


@dataclass(frozen=True)
class FleetConfig:
    """One model's release config as the command loaded it, and the file it came from (named in refusals)."""

    path: str
    config: ReleaseConfig

    @property
    def name(self) -> str:
        return self.config.name


def load_fleet_configs(config_paths: list[str | Path], overrides: tuple[str, ...] = (), *,
                       placed: bool = True) -> tuple[FleetConfig, ...]:
    """Every model's config, each file parsed once (with `overrides`); ConfigError, naming the configs, when there are
    none, they do not name one shared endpoint, name it with different placements, prefixes, backends or ledgers, list
    a model twice, or count their copies in slots the capacity tables do not know or that differ. Not `placed` (the
    packer's input, whose placement it chooses): their placements may differ and are not counted."""
    if not config_paths:
        raise ConfigError("no release config to plan", fix="pass the configs of every model on the shared endpoint")
    configs = tuple(FleetConfig(str(path), load_release_config(path, overrides=overrides)) for path in config_paths)
    groups = {fleet.config.placement.endpoint for fleet in configs}
    if None in groups or len(groups) != 1:
        named = "; ".join(f"{fleet.path}: {fleet.config.placement.endpoint or 'its own endpoint'}" for fleet in configs)
        raise ConfigError(f"a fleet plan is of one shared endpoint, but the configs name: {named}",
                          fix="set the same placement.endpoint in every config of the fleet")
    first = configs[0]
    for fleet in configs[1:]:
        differs = [d for d in _differences(first.config, fleet.config) if placed or not d.startswith("placement.")]
        if differs:
            raise ConfigError(f"{fleet.path} places its model on {first.config.placement.endpoint} with other "
                              f"{', '.join(differs)} than {first.path}: a running endpoint's instances and layout "
                              "cannot change per model, and one fleet is planned and moved from one ledger",
                              fix="give every model on the shared endpoint the same placement, resource_prefix, "
                                  "backend and ledger")
    names = [fleet.name for fleet in configs]
    if len(set(names)) != len(names):
        raise ConfigError(f"a model is listed twice: {', '.join(sorted(n for n in set(names) if names.count(n) > 1))}",
                          fix="pass each model's config once")
    if not placed:
        return configs
    found: list[Slots | None] = [slots(fleet.config.placement, fleet.config.image) for fleet in configs]
    if None in found:
        raise ConfigError(f"the copies one {first.config.placement} instance holds are not in "
                          "tasks/backends/capacity.py's tables",
                          fix="use an instance type the capacity tables know, or add it there with its source")
    mixed = getattr(first.config.placement, "layout", None) is not None  # each tenant counts its own profile's slots
    if not mixed and len({(s.per_instance, s.unit) for s in found if s is not None}) != 1:
        kinds = "; ".join(f"{fleet.name}: {s.per_instance} x {s.unit} an instance"
                          for fleet, s in zip(configs, found, strict=True) if s is not None)
        raise ConfigError(f"the models count their copies in different slots ({kinds}), "
                          "so one layout cannot be planned",
                          fix="give every model on the shared endpoint the same device and image.threads")
    return configs


def _differences(one: ReleaseConfig, other: ReleaseConfig) -> list[str]:
    """The placement fields (and the resource prefix, backend and ledger) two configs of one shared endpoint give
    differently."""
    mine, theirs = endpoint_placement(one.placement), endpoint_placement(other.placement)  # own MIG types apart
    fields = sorted(f"placement.{key}" for key in mine.keys() | theirs.keys() if mine.get(key) != theirs.get(key))
    return (fields + (["resource_prefix"] if one.resource_prefix != other.resource_prefix else [])
            + (["backend (kind, region)"] if backend_place(one) != backend_place(other) else [])
            + (["ledger (backend.ledger_url, else backend.state_dir)"] if _ledger_of(one) != _ledger_of(other) else []))


def _ledger_of(config: ReleaseConfig) -> str:
    """The ledger a config's releases write: its URL, else the SQLite file's folder (`tasks.backends.registry`)."""
    return config.backend.ledger_url or str(Path(config.backend.state_dir).expanduser().resolve())


def backend_place(config: ReleaseConfig) -> tuple[str, str | None]:
    """Where a config's resources live: its backend's kind and (aws) region; one shared endpoint is in one place."""
    return config.backend.kind, getattr(config.backend, "region", None)


@dataclass(frozen=True)
class ModelHistory:
    """One model's ledger records, oldest first, read once per command: what the fleet asks of the ledger about a model
    (what serves it, its last build's memory, the endpoints its moves left) is answered from them."""

    model: str
    records: tuple[Any, ...] = ()

    @property
    def promotion(self) -> Any:
        """Its newest succeeded promotion (by promotion, rollback or move: what serves it now), or None."""
        return next((record for record in reversed(self.records) if is_promotion(record)), None)

    @property
    def memory_mb(self) -> int | None:
        """What one copy needs, from its newest succeeded build; None when it was never built in this ledger."""
        build = next((record for record in reversed(self.records)
                      if (record.stage, record.event) == (events.BUILD, events.SUCCEEDED)), None)
        if build is None:
            return None
        memory = stage_payload(build, BuildResult).memory  # None: a build recorded before memory was measured
        return memory.total_mb if memory is not None else None

    @property
    def endpoints_left(self) -> dict[str, Any]:
        """Per endpoint a fleet move took it away from, the newest such move that no later retirement covers."""
        return moves_not_retired(list(self.records))

    def release_records(self, release_id: str) -> list[Any]:
        """One of its releases' records (no second read: a release's records are its model's)."""
        return [record for record in self.records if record.release_id == release_id]

    def after(self, *records: Any) -> ModelHistory:
        """This history with the records a run appended since it was read (so a later step reads no more)."""
        return replace(self, records=self.records + records)


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
    component: str | None = None

    @property
    def max_copies(self) -> int | None:
        """The copies its scaling may start (scale_to_zero.max_copies, else its copies); None: it does not scale."""
        scaling = self.config.scale_to_zero
        return None if scaling is None else scaling.plan(self.config.rollout.copies).max_copies

    def as_dict(self) -> dict[str, Any]:
        return {"release_id": self.release_id, "endpoint": self.endpoint, "threads": self.config.image.threads,
                "copies": self.copies, "copies_from": self.copies_from, "max_copies": self.max_copies}


@dataclass(frozen=True)
class FleetSnapshot:
    """Everything one fleet command reads: the configs, each model's history (None: no ledger), what serves each model
    (None where it was never promoted, or without a ledger) and the price table."""

    configs: tuple[FleetConfig, ...]
    prices: PriceTable
    histories: dict[str, ModelHistory] | None = None
    serving: dict[str, Serving | None] | None = None

    def serving_of(self, model: str) -> Serving | None:
        return self.serving.get(model) if self.serving is not None else None

    def memory_mb(self, model: str) -> int | None:
        return self.histories[model].memory_mb if self.histories is not None else None

    def endpoints_left(self, endpoint: str) -> tuple[str, ...]:
        """The endpoints other than `endpoint` that a fleet move took these models away from and whose retirement is
        not recorded since (they serve on for callers that have not switched); none without a ledger."""
        if self.histories is None:
            return ()
        return tuple(sorted({left for history in self.histories.values() for left in history.endpoints_left
                             if left != endpoint}))

    def after(self, model: str, *records: Any) -> FleetSnapshot:
        """This snapshot with the records a run appended to `model`'s history since (its own moves), so the steps
        after them read the ledger no more."""
        histories = {**self.histories, model: self.histories[model].after(*records)}
        return replace(self, histories=histories)


def read_snapshot(configs: tuple[FleetConfig, ...], *, ledger=None, open_hosting: Callable[[], Any] | None = None,
                  prices: PriceTable | None = None) -> FleetSnapshot:
    """The snapshot of `configs`: with `ledger`, each model's history read once and what serves it; `open_hosting`
    (optional, with the ledger; called once, only when a model serves) the backend that reports its component's
    copies now."""
    prices = load_price_table() if prices is None else prices
    if ledger is None:
        return FleetSnapshot(configs, prices)
    hosting = functools.cache(open_hosting) if open_hosting is not None else None
    histories = {fleet.name: ModelHistory(fleet.name, tuple(ledger.history(fleet.name))) for fleet in configs}
    serving = {name: _serving_now(history, hosting) for name, history in histories.items()}
    return FleetSnapshot(configs, prices, histories, serving)


def _serving_now(history: ModelHistory, hosting: Callable[[], Any] | None) -> Serving | None:
    """What serves the model (None: never promoted): the release its newest promotion names, that release's opened
    config as its newest move (if any) serves it, and its copies, the larger of those its promotion recorded and
    those the backend `hosting()` (optional) reports for its component now."""
    record = history.promotion
    if record is None:
        return None
    served = promotion(record)
    release = history.release_records(record.release_id)
    opened = next((r for r in release if (r.stage, r.event) == (events.RELEASE, events.OPENED)), None)
    if opened is None:
        raise NotFound(f"release {record.release_id!r} serves {history.model} but was never opened in the ledger",
                       fix="run `shiplift ledger verify`: a promoted release's records are incomplete")
    config = ReleaseConfig.model_validate(Opened.of(opened).config)
    move = latest_move(release)
    if move is not None:
        config = moved_config(config, promotion(move).moved_to)
    endpoint, component, recorded = served.endpoint, served.component, served.copies or 0
    live = hosting().describe(endpoint, component) if hosting is not None and endpoint and component else None
    if live is not None and live.copies >= recorded:
        return Serving(record.release_id, endpoint, config, live.copies, "the endpoint", component)
    return Serving(record.release_id, endpoint, config, recorded, "the ledger", component)
