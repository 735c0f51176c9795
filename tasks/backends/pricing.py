"""What a release costs on SageMaker AI real-time inference, from a dated, sourced price table (docs/cost.md).

Prices are data: `configs/prices/sagemaker-real-time-on-demand.yaml`, or the file `SHIPLIFT_PRICES` names. Nothing is
fetched at run time. Each figure carries its source and the date it was read; a type the table lacks is reported as
"no price for ml.x in region", never guessed.

The arithmetic is small pure functions whose results keep the inputs they used, so a report can show the working:
- production per hour: instances x the hourly price. An instance pool is priced at its highest-priority type (SageMaker
  may provision another listed type: the result also gives the range over the pool's priced types). A MIG partition
  placement pays its whole instance, idle partitions included.
- a MIG copy's share: the instance's hourly price over the copies one instance holds (`tasks.backends.capacity`'s
  count: partitions per GPU x GPUs per instance).
- a model's share of a shared endpoint (`placement.endpoint`): its copies over the copies the endpoint's instances hold,
  x the endpoint's hourly cost; a model that scales to zero pays it while at zero copies too, unless every model on
  the endpoint scales to zero (SageMaker stops the instances only when every component is at 0 copies).
- a candidate: its lifetime (deploy_candidate's start to teardown_candidate's success) x instances x the hourly price.
- per million requests and decisions at a measured throughput: usd_per_hour / (3600 x requests/s) x 1e6, and that over
  the items one request answers (1 for a decision request, k for an NLI batch of k pairs).
Not counted: storage (EBS, S3), data transfer, CodeBuild, ECR, CloudWatch, Savings Plans, taxes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

from tasks.backends.capacity import Slots, room, slots
from tasks.backends.placement import MIG_GPUS, family, gpus_per_instance, partition_size
from tasks.errors import BadInput, ConfigError
from tasks.project import PROJECT_ROOT
from tasks.yamlfile import read_yaml_file

PRICES_ENV = "SHIPLIFT_PRICES"
DEFAULT_PRICES_PATH = PROJECT_ROOT / "configs" / "prices" / "sagemaker-real-time-on-demand.yaml"
HOW_TO_UPDATE = "docs/cost.md says how to take a figure from the AWS Price List API"

Region = Annotated[str, Field(pattern=r"^[a-z]{2}(-[a-z]+)+-\d$")]
InstanceTypeName = Annotated[str, Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9-]+$")]
PROVENANCE_TEXT = {
    "price-list-api": "from the AWS Price List API",
    "pricing-page": "from the SageMaker AI pricing page",
    "project-readme": "as quoted in the project README, unchecked",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class Price(_Frozen):
    """One On-Demand figure: USD for one instance-hour, where it was read and when."""

    usd_per_hour: float = Field(gt=0, le=10_000)
    source: str = Field(min_length=1, max_length=500)
    as_of: date = Field(strict=False, description="the date the figure was read (a Price List offer's publicationDate)")
    provenance: Literal["price-list-api", "pricing-page", "project-readme"]
    note: str | None = Field(None, max_length=2000)

    @model_validator(mode="after")
    def _read_from_aws_means_a_url(self) -> Price:
        if self.provenance != "project-readme" and not self.source.startswith("https://"):
            raise ValueError(f"a {self.provenance} figure names the https URL it was read from as its source, got "
                             f"{self.source!r}")
        return self

    def describe(self) -> str:
        """`2.33 $/h, price as of 2026-12-03 as quoted in the project README, unchecked`."""
        return f"{_usd(self.usd_per_hour)} $/h, price as of {self.as_of.isoformat()} {PROVENANCE_TEXT[self.provenance]}"


class PriceTable(_Frozen):
    """The price file: USD per instance-hour by region, then instance type."""

    version: Literal[1]
    offer: Literal["sagemaker-real-time-on-demand"]
    currency: Literal["USD"]
    unit: Literal["instance-hour"]
    prices: dict[Region, dict[InstanceTypeName, Price]]
    _origin: str = PrivateAttr(default="configs/prices/sagemaker-real-time-on-demand.yaml")

    @property
    def origin(self) -> str:
        """The file the table was read from, as a message names it."""
        return self._origin

    def hourly(self, region: str, instance_type: str) -> Price | None:
        """The On-Demand price of one `instance_type` in `region`, or None where the table has none."""
        return self.prices.get(region, {}).get(instance_type)

    def missing(self, region: str, instance_type: str) -> str:
        """What a report says instead of a number."""
        return f"no price for {instance_type} in {region}; add it to {self.origin} ({HOW_TO_UPDATE})"


def prices_path(environ: dict[str, str] | None = None) -> Path:
    """The price file to read: `SHIPLIFT_PRICES` where it is set, else the checkout's configs/prices file."""
    environ = os.environ if environ is None else environ
    named = environ.get(PRICES_ENV, "").strip()
    return Path(named).expanduser() if named else DEFAULT_PRICES_PATH


def load_price_table(path: str | Path | None = None, *, environ: dict[str, str] | None = None) -> PriceTable:
    """Read and check a price file (default: `prices_path()`); ConfigError names the file, the entry and the fix."""
    chosen = Path(path) if path is not None else prices_path(environ)
    named_by = f" (named by {PRICES_ENV})" if path is None and chosen != DEFAULT_PRICES_PATH else ""
    if not chosen.is_file():
        raise ConfigError(f"price table {chosen}{named_by} does not exist",
                          fix=f"point {PRICES_ENV} at a price file, or unset it to use {_shown(DEFAULT_PRICES_PATH)}")
    tree = read_yaml_file(chosen, "price table")
    fix = f"correct the entries listed above; the header of {_shown(DEFAULT_PRICES_PATH)} shows the format"
    if not isinstance(tree, dict):
        raise ConfigError(f"{chosen}: a price table is a mapping (version, offer, currency, unit, prices), got "
                          f"{type(tree).__name__}", fix=fix)
    try:
        table = PriceTable.model_validate(tree)
    except ValidationError as exc:
        lines = [f"  {'.'.join(str(step) for step in err['loc']) or '(top level)'}: {err['msg']}{_got(err)}"
                 for err in exc.errors()]
        raise ConfigError(f"{chosen}: invalid price table\n" + "\n".join(lines), fix=fix) from None
    table._origin = _shown(chosen)
    return table


class PoolPrice(NamedTuple):
    """One type a pool may provision, and its price (None where the table has none)."""

    instance_type: str
    priority: int
    price: Price | None


@dataclass(frozen=True)
class HourlyCost:
    """`instances` x `instance_type` for an hour, and what it was computed from."""

    what: str  # "production", "a candidate", "an update's extra instances"
    region: str
    instance_type: str  # the type priced: a pool's highest-priority one
    instances: int
    price: Price | None
    missing: str | None = None  # what to say instead of a number, when price is None
    pool: tuple[PoolPrice, ...] = ()  # every type of an instance pool, by priority
    whole_instance: str = ""  # why the whole instance is paid (a MIG layout)

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.price is None else self.instances * self.price.usd_per_hour

    @property
    def range_usd_per_hour(self) -> tuple[float, float] | None:
        """min..max over the pool's priced types, for the same instance count (None outside a pool)."""
        priced = [entry.price.usd_per_hour * self.instances for entry in self.pool if entry.price is not None]
        return (min(priced), max(priced)) if priced else None

    @property
    def unpriced_pool_types(self) -> tuple[str, ...]:
        return tuple(entry.instance_type for entry in self.pool if entry.price is None)

    def describe(self) -> str:
        """`production ≈ 4.66 $/h (2 × ml.g6e.xlarge at 2.33 $/h, us-east-1, price as of …)` or the missing price."""
        if self.price is None:
            text = f"{self.what}: {self.missing}"
        else:
            text = (f"{self.what} ≈ {_usd(self.usd_per_hour)} $/h ({self.instances} × {self.instance_type} at "
                    f"{_usd(self.price.usd_per_hour)} $/h, {self.region}, price as of {self.price.as_of.isoformat()} "
                    f"{PROVENANCE_TEXT[self.price.provenance]})")
        if self.whole_instance:
            text += f"; {self.whole_instance}"
        if len(self.pool) > 1:
            others = ", ".join(entry.instance_type for entry in self.pool)
            span = self.range_usd_per_hour
            text += ("; SageMaker may provision another pool type instead: "
                     + (f"{_usd(span[0])}–{_usd(span[1])} $/h over {others}" if span else f"none of {others} is priced"))
            if span and self.unpriced_pool_types:
                text += f", no price for {', '.join(self.unpriced_pool_types)} in {self.region}"
        return text

    def as_dict(self) -> dict[str, Any]:
        """The working, for a JSON report."""
        return {"what": self.what, "region": self.region, "instance_type": self.instance_type, "instances": self.instances,
                "price": _price_dict(self.price), "usd_per_hour": self.usd_per_hour, "missing": self.missing,
                "pool": [{"instance_type": e.instance_type, "priority": e.priority, "price": _price_dict(e.price)}
                         for e in self.pool],
                "range_usd_per_hour": list(self.range_usd_per_hour) if self.range_usd_per_hour else None,
                "whole_instance": self.whole_instance or None, "text": self.describe()}


def hourly_cost(table: PriceTable, region: str, instance_type: str, instances: int = 1, *, what: str = "production",
                pool: tuple[tuple[str, int], ...] | list[tuple[str, int]] = (), whole_instance: str = "") -> HourlyCost:
    """`instances` x the hourly price of `instance_type` in `region`; `pool` lists (type, priority) of an instance pool
    so the result can give the range over the types SageMaker may provision instead."""
    if instances < 0:
        raise BadInput(f"{what}: {instances} instances", fix="pass a count of 0 or more")
    price = table.hourly(region, instance_type)
    entries = tuple(PoolPrice(t, p, table.hourly(region, t)) for t, p in sorted(pool, key=lambda entry: entry[1]))
    return HourlyCost(what, region, instance_type, instances, price,
                      None if price else table.missing(region, instance_type), entries, whole_instance)


def _placement_types(placement) -> tuple[str, tuple[tuple[str, int], ...]]:
    """The type a placement is priced at and, for a pool, every (type, priority) it may provision."""
    if placement.kind == "instance_pool":
        pool = tuple((p.instance_type, p.priority) for p in sorted(placement.pools, key=lambda p: p.priority))
        return pool[0][0], pool
    return placement.instance_type, ()


def _whole_instance(placement) -> str:
    if placement.kind != "mig_partition":
        return ""
    return f"a MIG layout bills its whole {placement.instance_type}, idle partitions included"


def serverless_cost(region: str, placement, *, what: str) -> HourlyCost:
    """A serverless endpoint has no instance-hours: SageMaker bills each request's memory x duration and nothing while
    idle (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html). This table holds instance-hours
    only, so the figure is reported as missing, with why, never guessed."""
    provisioned = (f"; provisioned concurrency {placement.provisioned_concurrency} is billed while provisioned too"
                   if placement.provisioned_concurrency else "")
    return HourlyCost(what, region, f"serverless {placement.memory_size_mb} MB", 0, None,
                      "serverless bills per request (memory x duration), nothing while idle" + provisioned
                      + "; the price table holds instance-hours only, so no figure is given")


def production_cost(table: PriceTable, region: str, placement) -> HourlyCost:
    """Production per hour: the instances it serves with (`placement.instance_count`; a MIG layout: one instance, as
    the endpoint config asks for) x the hourly price of the priced type."""
    if placement.kind == "serverless":
        return serverless_cost(region, placement, what="production")
    instance_type, pool = _placement_types(placement)
    instances = getattr(placement, "instance_count", 1) if placement.kind != "mig_partition" else 1
    return hourly_cost(table, region, instance_type, instances, what="production", pool=pool,
                       whole_instance=_whole_instance(placement))


@dataclass(frozen=True)
class CopyShare:
    """A MIG copy's share of its instance's hourly price: the instance over the copies one instance holds."""

    region: str
    instance_type: str
    partition_type: str
    partitions_per_gpu: int
    gpus: int | None  # GPUs per instance (None where tasks.backends.placement does not know the type)
    price: Price | None
    missing: str | None = None

    @property
    def copies_per_instance(self) -> int | None:
        return None if self.gpus is None else self.partitions_per_gpu * self.gpus

    @property
    def fraction(self) -> float | None:
        """The share of the instance's bill one laid-out partition carries."""
        copies = self.copies_per_instance
        return None if not copies else 1 / copies

    @property
    def usd_per_copy_hour(self) -> float | None:
        return None if self.price is None or self.fraction is None else self.price.usd_per_hour * self.fraction

    @property
    def compute_fraction(self) -> float | None:
        """The partition's compute slices over the instance's (what it uses, not what it pays)."""
        gpu = MIG_GPUS.get(family(self.instance_type))
        if gpu is None or self.gpus is None:
            return None
        return partition_size(self.partition_type)[0] / (gpu.compute_slices * self.gpus)

    def describe(self) -> str:
        """`a mig-1g.10gb copy ≈ 2.02 $/h = 1/56 of ml.p5.48xlarge at 113.00 $/h (7 partitions on each of 8 GPUs; …)`."""
        if self.usd_per_copy_hour is None:
            return f"a {self.partition_type} copy's share: {self.missing}"
        gpus = f"{self.gpus} GPUs" if self.gpus != 1 else "its GPU"
        return (f"a {self.partition_type} copy ≈ {_usd(self.usd_per_copy_hour)} $/h = 1/{self.copies_per_instance} of "
                f"{self.instance_type} at {_usd(self.price.usd_per_hour)} $/h ({self.partitions_per_gpu} partitions on "
                f"{'each of ' if self.gpus != 1 else ''}{gpus}; the instance is billed whole, idle partitions included; "
                f"{self.region}, price as of {self.price.as_of.isoformat()} {PROVENANCE_TEXT[self.price.provenance]})")

    def as_dict(self) -> dict[str, Any]:
        return {"region": self.region, "instance_type": self.instance_type, "partition_type": self.partition_type,
                "partitions_per_gpu": self.partitions_per_gpu, "gpus": self.gpus,
                "copies_per_instance": self.copies_per_instance, "fraction": self.fraction,
                "compute_fraction": self.compute_fraction, "price": _price_dict(self.price),
                "usd_per_copy_hour": self.usd_per_copy_hour, "missing": self.missing, "text": self.describe()}


def mig_copy_share(table: PriceTable, region: str, instance_type: str, partition_type: str, partitions: int) -> CopyShare:
    """One copy's share of a MIG instance: the layout (`partitions` x `partition_type`) is carved on every GPU, one copy
    a partition (`tasks.backends.capacity.slots`), so a copy carries 1 / (partitions x GPUs) of the instance's price."""
    if partitions < 1:
        raise BadInput(f"a MIG layout of {partitions} partitions", fix="pass 1 or more partitions")
    partition_size(partition_type)  # refuses a name that is not a MIG profile
    gpus = gpus_per_instance(instance_type)
    price = table.hourly(region, instance_type)
    missing = None
    if price is None:
        missing = table.missing(region, instance_type)
    elif gpus is None:
        missing = (f"the GPUs of one {instance_type} are not in tasks/backends/placement.py's table, so its copies per "
                   "instance cannot be counted")
    return CopyShare(region, instance_type, partition_type, partitions, gpus, price, missing)


def mig_copy_share_of(table: PriceTable, region: str, placement) -> CopyShare:
    """`mig_copy_share` of a `mig_partition` placement."""
    return mig_copy_share(table, region, placement.instance_type, placement.partition_type, placement.partitions)


# SageMaker stops an endpoint's instances (ManagedInstanceScaling.MinInstanceCount 0) only when no inference component
# on it has a copy: each component scales to 0 copies by its own scalable target, and an instance that holds any
# component's copy keeps running (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html).


@dataclass(frozen=True)
class ComponentShare:
    """A model's share of a shared endpoint's hourly bill (`placement.endpoint`): its copies over the copies the
    endpoint's instances hold (`tasks.backends.capacity.slots`: GPUs, MIG partitions or core slots), times the
    endpoint's hourly cost. Idle room is shared by nobody: the shares of the models serving add up to less than the
    bill by what no copy uses. A model that scales to zero pays the same share: its slot stays paid while it is at
    zero copies whenever another model on the endpoint keeps the instances running (`kept_on_by`), since SageMaker
    stops them only when every component is at zero; only where every model scales to zero do the idle hours cost
    nothing (`idle_costs` False)."""

    endpoint: str
    bill: HourlyCost
    copies: int
    slots: Slots | None
    scales_to_zero: bool = False
    kept_on_by: tuple[str, ...] | None = ()  # the models on the endpoint that never scale to zero; None: not known here

    @property
    def capacity(self) -> int | None:
        return None if self.slots is None else self.slots.total(self.bill.instances)

    @property
    def fraction(self) -> float | None:
        return None if not self.capacity else self.copies / self.capacity

    @property
    def usd_per_hour(self) -> float | None:
        return None if self.fraction is None or self.bill.usd_per_hour is None else self.bill.usd_per_hour * self.fraction

    @property
    def idle_costs(self) -> bool | None:
        """Whether this share is billed while the model is at zero copies (None: depends on models not known here)."""
        if not self.scales_to_zero:
            return True
        return None if self.kept_on_by is None else bool(self.kept_on_by)

    def describe(self) -> str:
        """`this model's share of fleet ≈ 0.83 $/h = 2 of 7 mig-1g.10gb partitions of 1 x ml.p5.4xlarge at …`."""
        if self.slots is None:
            return (f"this model's share of {self.endpoint}: the copies one {self.bill.instance_type} holds are not in "
                    "tasks/backends/capacity.py's tables, so its share cannot be counted")
        if self.usd_per_hour is None:
            text = f"this model's share of {self.endpoint}: {self.copies} of {self.slots.describe(self.bill.instances)}; {self.bill.missing}"
        else:
            text = (f"this model's share of {self.endpoint} ≈ {_usd(self.usd_per_hour)} $/h = {self.copies} of "
                    f"{self.slots.describe(self.bill.instances)} at {_usd(self.bill.usd_per_hour)} $/h for the endpoint")
        return text + self._idle()

    def _idle(self) -> str:
        """What scaling to zero saves of this share: nothing while another model keeps the instances running."""
        if not self.scales_to_zero:
            return ""
        if self.kept_on_by is None:
            return (f"; it scales to zero, but SageMaker stops a shared endpoint's instances only when every model on "
                    f"it is at 0 copies, so this share is paid while any other model on {self.endpoint} has a copy "
                    "(`shiplift fleet plan` names those that never scale to zero)")
        if self.kept_on_by:
            return (f"; it scales to zero, but {', '.join(self.kept_on_by)} never do(es), and SageMaker stops the "
                    "instances only when every model on the endpoint is at 0 copies: this share is paid while it "
                    "is at zero too")
        return "; every model on the endpoint scales to zero, so its instances stop, and nothing is billed, while all are at 0 copies"

    def as_dict(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "copies": self.copies, "capacity": self.capacity, "fraction": self.fraction,
                "unit": self.slots.unit if self.slots else None, "endpoint_usd_per_hour": self.bill.usd_per_hour,
                "usd_per_hour": self.usd_per_hour, "scales_to_zero": self.scales_to_zero,
                "kept_on_by": list(self.kept_on_by) if self.kept_on_by is not None else None,
                "idle_costs": self.idle_costs, "text": self.describe()}


def component_share(table: PriceTable, region: str, placement, image, copies: int, *, scales_to_zero: bool = False,
                    kept_on_by: tuple[str, ...] | None = None) -> ComponentShare:
    """`copies` of `image`'s model on the shared endpoint `placement` names, as a share of its hourly bill; a model
    that `scales_to_zero` with `kept_on_by` the models beside it that never do (None: not known, as for one config)."""
    return ComponentShare(placement.endpoint, production_cost(table, region, placement), copies, slots(placement, image),
                          scales_to_zero, kept_on_by if scales_to_zero else ())


@dataclass(frozen=True)
class CandidateCost:
    """A candidate's bill: its instances from deploy_candidate's start until teardown_candidate succeeded."""

    hourly: HourlyCost
    started_at: datetime
    finished_at: datetime

    @property
    def seconds(self) -> float:
        return (self.finished_at - self.started_at).total_seconds()

    @property
    def instance_hours(self) -> float:
        return self.hourly.instances * self.seconds / 3600

    @property
    def usd(self) -> float | None:
        return None if self.hourly.price is None else self.instance_hours * self.hourly.price.usd_per_hour

    def describe(self) -> str:
        """`candidate ≈ 0.75 $ (1 × ml.g6.2xlarge at 1.22 $/h for 37.0 min, … → …, us-east-1, price as of …)`."""
        minutes = f"{self.seconds / 60:.1f} min"
        span = f"{self.started_at.isoformat()} → {self.finished_at.isoformat()}"
        if self.usd is None:
            return f"candidate ({minutes}, {span}): {self.hourly.missing}"
        price = self.hourly.price
        text = (f"candidate ≈ {_usd(self.usd)} $ ({self.hourly.instances} × {self.hourly.instance_type} at "
                f"{_usd(price.usd_per_hour)} $/h for {minutes}, {span}, {self.hourly.region}, price as of "
                f"{price.as_of.isoformat()} {PROVENANCE_TEXT[price.provenance]})")
        return text + (f"; {self.hourly.whole_instance}" if self.hourly.whole_instance else "")

    def as_dict(self) -> dict[str, Any]:
        return {"started_at": self.started_at.isoformat(), "finished_at": self.finished_at.isoformat(),
                "seconds": self.seconds, "instance_hours": self.instance_hours, "usd": self.usd,
                "hourly": self.hourly.as_dict(), "text": self.describe()}


def candidate_cost(table: PriceTable, region: str, instance_type: str, started_at: str | datetime,
                   finished_at: str | datetime, instances: int = 1, *, whole_instance: str = "") -> CandidateCost:
    """The candidate's instance-hours (two ISO 8601 timestamps: when deploy_candidate started, when
    teardown_candidate succeeded) x `instances` x the hourly price of the type it ran on."""
    start, end = _instant(started_at, "started_at"), _instant(finished_at, "finished_at")
    if (start.tzinfo is None) != (end.tzinfo is None):
        raise BadInput(f"started_at {start.isoformat()} and finished_at {end.isoformat()}: one has a time zone and the "
                       "other not", fix="pass both with an offset (e.g. 2026-12-03T10:00:00+00:00)")
    if end < start:
        raise BadInput(f"finished_at {end.isoformat()} is before started_at {start.isoformat()}",
                       fix="pass when deploy_candidate started, then when teardown_candidate succeeded")
    hourly = hourly_cost(table, region, instance_type, instances, what="a candidate", whole_instance=whole_instance)
    return CandidateCost(hourly, start, end)


def candidate_cost_for(table: PriceTable, config, started_at: str | datetime, finished_at: str | datetime,
                       instance_type: str | None = None, *, region: str | None = None) -> CandidateCost:
    """`candidate_cost` of a release config's candidate: one instance (a single-model endpoint), of `instance_type` where
    the backend recorded the type it provisioned, else the placement's priced type; in `region` (default: the aws
    backend's)."""
    if config.placement.kind == "serverless":
        start, end = _instant(started_at, "started_at"), _instant(finished_at, "finished_at")
        return CandidateCost(serverless_cost(region or config.backend.region, config.placement, what="a candidate"), start, end)
    priced, _ = _placement_types(config.placement)
    return candidate_cost(table, region or config.backend.region, instance_type or priced, started_at, finished_at, 1,
                          whole_instance=_whole_instance(config.placement))


@dataclass(frozen=True)
class ThroughputCost:
    """Cost per million requests and per million decisions at a measured throughput, from an hourly cost."""

    usd_per_hour: float | None
    requests_per_second: float
    items_per_request: int  # decisions one request answers: 1, or the pairs of an NLI batch
    missing: str | None = None

    @property
    def per_million_requests(self) -> float | None:
        if self.usd_per_hour is None:
            return None
        return self.usd_per_hour / (3600 * self.requests_per_second) * 1e6

    @property
    def per_million_decisions(self) -> float | None:
        per_request = self.per_million_requests
        return None if per_request is None else per_request / self.items_per_request

    def describe(self) -> str:
        """`≈ 103.56 $ per million requests, ≈ 6.47 $ per million decisions (4.66 $/h / (3600 × 12.5 req/s) × 1e6; …)`."""
        if self.usd_per_hour is None:
            return f"per million requests at {self.requests_per_second:g} req/s: {self.missing}"
        working = f"{_usd(self.usd_per_hour)} $/h / (3600 × {self.requests_per_second:g} req/s) × 1e6"
        if self.items_per_request == 1:
            return f"≈ {_usd(self.per_million_requests)} $ per million requests and decisions ({working})"
        return (f"≈ {_usd(self.per_million_requests)} $ per million requests, ≈ {_usd(self.per_million_decisions)} $ per "
                f"million decisions ({working}; {self.items_per_request} decisions a request)")

    def as_dict(self) -> dict[str, Any]:
        return {"usd_per_hour": self.usd_per_hour, "requests_per_second": self.requests_per_second,
                "items_per_request": self.items_per_request, "per_million_requests": self.per_million_requests,
                "per_million_decisions": self.per_million_decisions, "missing": self.missing, "text": self.describe()}


def throughput_cost(hourly: HourlyCost | float | None, requests_per_second: float,
                    items_per_request: int = 1) -> ThroughputCost:
    """usd_per_hour / (3600 x requests/s) x 1e6 per million requests; per million decisions, that over the items one
    request answers. `hourly` is an HourlyCost (its missing price carries through) or a plain USD-per-hour figure."""
    if not (isinstance(requests_per_second, (int, float)) and math.isfinite(requests_per_second)
            and requests_per_second > 0):
        raise BadInput(f"a throughput of {requests_per_second!r} requests/s", fix="pass the measured requests per second, > 0")
    if not isinstance(items_per_request, int) or items_per_request < 1:
        raise BadInput(f"{items_per_request!r} items per request", fix="pass 1 for a decision request, k for a batch of k")
    if isinstance(hourly, HourlyCost):
        return ThroughputCost(hourly.usd_per_hour, float(requests_per_second), items_per_request, hourly.missing)
    missing = None if hourly is not None else "no hourly price to divide"
    return ThroughputCost(None if hourly is None else float(hourly), float(requests_per_second), items_per_request, missing)


def update_extra_instances(config) -> tuple[int, str] | None:
    """The instances production's next update adds (managed instance scaling) beside the serving ones, and the capacity
    line that says why; None where tasks.backends.capacity does not know the placement's types."""
    found = room(config.placement, config.image, config.rollout)
    if found is None:
        return None
    needed = -(-found.peak // max(1, found.slots.per_instance))
    return max(0, min(needed, found.most) - found.instances), found.describe_update()


def dry_run_cost_lines(config, table: PriceTable | None = None) -> list[str]:
    """What the dry run's summary prints about cost: production per hour, a candidate hour, a MIG copy's share, and the
    update's extra instances while it runs. The local backend runs on this machine: no SageMaker price applies."""
    if config.backend.kind != "aws":
        return [f"cost: the {config.backend.kind} backend serves on this machine; no SageMaker price applies"]
    table = load_price_table() if table is None else table
    region, placement = config.backend.region, config.placement
    if placement.kind == "serverless":
        return [f"cost: {serverless_cost(region, placement, what='production and its candidate').describe()}"]
    instance_type, _ = _placement_types(placement)
    production = production_cost(table, region, placement)
    lines = [f"cost: {production.describe()}"]
    candidate = hourly_cost(table, region, instance_type, 1, what="a candidate")  # the pool's range is on the line above
    if candidate.price is None:
        lines.append(f"cost: {candidate.describe()}")
    else:
        lines.append(f"cost: {candidate.describe()}, billed from CreateEndpoint until its deletion finishes "
                     f"(≈ {_usd(candidate.usd_per_hour / 2)} $ for 30 minutes)")
    if placement.kind == "mig_partition":
        lines.append(f"cost: {mig_copy_share_of(table, region, placement).describe()}")
    extra = update_extra_instances(config)
    if extra is None:
        lines.append(f"cost: the instances an update adds cannot be counted: tasks/backends/capacity.py does not know "
                     f"{instance_type}")
    elif extra[0] == 0:
        lines.append(f"cost: an update adds no instance ({extra[1]})")
    else:
        grown = hourly_cost(table, region, instance_type, extra[0], what="an update's extra instances")
        peak = "" if grown.price is None else (
            f"; {production.instances + extra[0]} × {instance_type} ≈ "
            f"{_usd(grown.usd_per_hour + production.usd_per_hour)} $/h at the peak, until ManagedInstanceScaling removes "
            "them after the update")
        lines.append(f"cost: {grown.describe()} while an update runs ({extra[1]}){peak}")
    return lines


NOMINAL_REGION = "us-east-1"  # where a local release's placement is priced: it names no region of its own


def release_cost(config, *, answers_per_second: float | None, items_per_request: int, candidate_since: str | None,
                 until: str, table: PriceTable | None = None) -> dict[str, Any]:
    """What a release's gate report says about cost, as dicts (each with its `text`): production per hour, the
    candidate from deploy_candidate's start until `until` (so far), a MIG copy's share, and per million requests and
    decisions at the gate's measured rate. A local release is priced as its placement would be on SageMaker AI in
    NOMINAL_REGION (`nominal` says so): it runs on this machine and costs nothing there."""
    table = load_price_table() if table is None else table
    nominal = config.backend.kind != "aws"
    region = NOMINAL_REGION if nominal else config.backend.region
    production = production_cost(table, region, config.placement)
    cost: dict[str, Any] = {"region": region, "nominal": nominal, "table": table.origin,
                            "production": production.as_dict(), "candidate": None, "mig_copy": None, "per_million": None}
    if candidate_since is not None:
        cost["candidate"] = candidate_cost_for(table, config, candidate_since, until, region=region).as_dict()
    if config.placement.kind == "mig_partition":
        cost["mig_copy"] = mig_copy_share_of(table, region, config.placement).as_dict()
    if config.placement.endpoint is not None:
        cost["share"] = component_share(table, region, config.placement, config.image, config.rollout.copies,
                                        scales_to_zero=config.scale_to_zero is not None).as_dict()
    if answers_per_second:
        cost["per_million"] = throughput_cost(production, answers_per_second / items_per_request,
                                              items_per_request).as_dict()
    return cost


def _instant(value: str | datetime, name: str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise BadInput(f"{name} {value!r} is not an ISO 8601 timestamp", fix="pass e.g. 2026-12-03T10:00:00+00:00") from None


def _got(err: dict) -> str:
    value = err.get("input")
    return "" if isinstance(value, (dict, list)) else f" (got {value!r})"


def _usd(amount: float) -> str:
    """Two decimals; small amounts with three significant digits, so they do not print as 0.00."""
    return f"{amount:.2f}" if abs(amount) >= 0.1 or amount == 0 else f"{amount:.3g}"


def _price_dict(price: Price | None) -> dict[str, Any] | None:
    return None if price is None else {**price.model_dump(), "as_of": price.as_of.isoformat()}


def _shown(path: Path) -> str:
    """A path under the checkout relative to it (as the user would type it), any other path as given."""
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)
