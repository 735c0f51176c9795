"""What instances cost per hour (`tasks.backends.pricing`): a type, production's placement (an instance pool at its
highest-priority type, with the pool's range; a serverless endpoint unpriced per hour) and a MIG copy's share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from shiplift.tasks.backends.capacity import layout_share
from shiplift.tasks.backends.placement import MIG_GPUS, family, gpus_per_instance, partition_size
from shiplift.tasks.backends.pricing_table import PROVENANCE_TEXT, Price, PriceTable, _usd, price_dict
from shiplift.tasks.errors import BadInput


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
                     + (f"{_usd(span[0])}–{_usd(span[1])} $/h over {others}"
                        if span else f"none of {others} is priced"))
            if span and self.unpriced_pool_types:
                text += f", no price for {', '.join(self.unpriced_pool_types)} in {self.region}"
        return text

    def as_dict(self) -> dict[str, Any]:
        """The working, for a JSON report."""
        return {"what": self.what, "region": self.region, "instance_type": self.instance_type,
                "instances": self.instances, "price": price_dict(self.price), "usd_per_hour": self.usd_per_hour,
                "missing": self.missing,
                "pool": [{"instance_type": e.instance_type, "priority": e.priority, "price": price_dict(e.price)}
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
    layout: tuple[str, ...] = ()  # a mixed layout's profiles per GPU; () for partitions_per_gpu x partition_type

    @property
    def copies_per_instance(self) -> int | None:
        return None if self.gpus is None else self.partitions_per_gpu * self.gpus

    @property
    def fraction(self) -> float | None:
        """The share of the instance's bill one laid-out partition carries: 1 / (partitions x GPUs) for one profile
        repeated; in a mixed layout its compute slices over the layout's, on each GPU (a mig-3g.40gb of
        3g + 2g + 1g + 1g pays 3/7 of a GPU; `tasks.backends.capacity.layout_share` says why compute)."""
        copies = self.copies_per_instance
        if not copies:
            return None
        return layout_share(self.partition_type, self.layout) / copies

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
        """E.g. `a mig-1g.10gb copy ≈ 2.02 $/h = 1/56 of ml.p5.48xlarge at 113.00 $/h
        (7 partitions on each of 8 GPUs; …)`."""
        if self.usd_per_copy_hour is None:
            return f"a {self.partition_type} copy's share: {self.missing}"
        if self.layout:
            own, total = partition_size(self.partition_type)[0], sum(partition_size(p)[0] for p in self.layout)
            return (f"a {self.partition_type} copy ≈ {_usd(self.usd_per_copy_hour)} $/h = {own}/{total} compute "
                    f"slices of one of {self.gpus} GPU(s) of {self.instance_type} at {_usd(self.price.usd_per_hour)} "
                    f"$/h (layout {' + '.join(self.layout)} per GPU; the instance is billed whole; {self.region}, "
                    f"price as of {self.price.as_of.isoformat()} {PROVENANCE_TEXT[self.price.provenance]})")
        gpus = f"{self.gpus} GPUs" if self.gpus != 1 else "its GPU"
        return (f"a {self.partition_type} copy ≈ {_usd(self.usd_per_copy_hour)} $/h = 1/{self.copies_per_instance} of "
                f"{self.instance_type} at {_usd(self.price.usd_per_hour)} $/h ({self.partitions_per_gpu} partitions on "
                f"{'each of ' if self.gpus != 1 else ''}{gpus}; the instance is billed whole, idle partitions "
                f"included; {self.region}, price as of {self.price.as_of.isoformat()} "
                f"{PROVENANCE_TEXT[self.price.provenance]})")

    def as_dict(self) -> dict[str, Any]:
        return {"region": self.region, "instance_type": self.instance_type, "partition_type": self.partition_type,
                "partitions_per_gpu": self.partitions_per_gpu, "gpus": self.gpus,
                "copies_per_instance": self.copies_per_instance, "fraction": self.fraction,
                "compute_fraction": self.compute_fraction, "price": price_dict(self.price),
                "usd_per_copy_hour": self.usd_per_copy_hour, "missing": self.missing, "text": self.describe(),
                **({"layout": list(self.layout)} if self.layout else {})}


def mig_copy_share(table: PriceTable, region: str, instance_type: str, partition_type: str,
                   partitions: int, layout: tuple[str, ...] = ()) -> CopyShare:
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
    mixed = layout if len(set(layout)) > 1 else ()  # one profile repeated: the 1 / copies share above
    return CopyShare(region, instance_type, partition_type, partitions, gpus, price, missing, mixed)


def mig_copy_share_of(table: PriceTable, region: str, placement) -> CopyShare:
    """`mig_copy_share` of a `mig_partition` placement."""
    return mig_copy_share(table, region, placement.instance_type, placement.partition_type, placement.partitions,
                          placement.profiles)
