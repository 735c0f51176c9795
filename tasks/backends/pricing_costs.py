"""Costs derived from hourly prices (`tasks.backends.pricing`): a model's share of a shared endpoint, a candidate over
its lifetime, and per million requests and decisions at a measured throughput."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shiplift.tasks.backends.capacity import Slots, layout_share, slots
from shiplift.tasks.backends.pricing_instances import (
    HourlyCost,
    _placement_types,
    _whole_instance,
    hourly_cost,
    production_cost,
    serverless_cost,
)
from shiplift.tasks.backends.pricing_table import PROVENANCE_TEXT, PriceTable, _usd
from shiplift.tasks.errors import BadInput

# SageMaker stops an endpoint's instances (ManagedInstanceScaling.MinInstanceCount 0) only when no inference component
# on it has a copy: each component scales to 0 copies by its own scalable target, and an instance that holds any
# component's copy keeps running
# (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html).


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
    weight: float = 1.0  # the share of the bill all its slots carry: < 1 in a mixed MIG layout

    @property
    def capacity(self) -> int | None:
        return None if self.slots is None else self.slots.total(self.bill.instances)

    @property
    def fraction(self) -> float | None:
        """Its copies over its slots, times what those slots are worth of the bill (a mixed MIG layout's profiles
        pay by compute slices: `tasks.backends.capacity.layout_share`)."""
        return None if not self.capacity else self.copies / self.capacity * self.weight

    @property
    def usd_per_hour(self) -> float | None:
        if self.fraction is None or self.bill.usd_per_hour is None:
            return None
        return self.bill.usd_per_hour * self.fraction

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
            text = (f"this model's share of {self.endpoint}: {self.copies} of "
                    f"{self.slots.describe(self.bill.instances)}; {self.bill.missing}")
        else:
            worth = f", which carry {self.weight:.3g} of the bill by compute slices," if self.weight != 1 else ""
            text = (f"this model's share of {self.endpoint} ≈ {_usd(self.usd_per_hour)} $/h = {self.copies} of "
                    f"{self.slots.describe(self.bill.instances)}{worth} "
                    f"at {_usd(self.bill.usd_per_hour)} $/h for the endpoint")
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
        return ("; every model on the endpoint scales to zero, so its instances stop, and nothing is billed, while all "
                "are at 0 copies")

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
    return ComponentShare(placement.endpoint, production_cost(table, region, placement), copies,
                          slots(placement, image), scales_to_zero, kept_on_by if scales_to_zero else (),
                          layout_share(placement.partition_type, placement.profiles)
                          if placement.kind == "mig_partition" else 1.0)


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
    """`candidate_cost` of a release config's candidate: one instance (a single-model endpoint), of `instance_type`
    where the backend recorded the type it provisioned, else the placement's priced type; in `region` (default: the aws
    backend's)."""
    if config.placement.kind == "serverless":
        start, end = _instant(started_at, "started_at"), _instant(finished_at, "finished_at")
        cost = serverless_cost(region or config.backend.region, config.placement, what="a candidate")
        return CandidateCost(cost, start, end)
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
        """E.g. `≈ 103.56 $ per million requests, ≈ 6.47 $ per million decisions
        (4.66 $/h / (3600 × 12.5 req/s) × 1e6; …)`."""
        if self.usd_per_hour is None:
            return f"per million requests at {self.requests_per_second:g} req/s: {self.missing}"
        working = f"{_usd(self.usd_per_hour)} $/h / (3600 × {self.requests_per_second:g} req/s) × 1e6"
        if self.items_per_request == 1:
            return f"≈ {_usd(self.per_million_requests)} $ per million requests and decisions ({working})"
        return (f"≈ {_usd(self.per_million_requests)} $ per million requests, ≈ {_usd(self.per_million_decisions)} $ "
                f"per million decisions ({working}; {self.items_per_request} decisions a request)")

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
        raise BadInput(f"a throughput of {requests_per_second!r} requests/s",
                       fix="pass the measured requests per second, > 0")
    if not isinstance(items_per_request, int) or items_per_request < 1:
        raise BadInput(f"{items_per_request!r} items per request",
                       fix="pass 1 for a decision request, k for a batch of k")
    if isinstance(hourly, HourlyCost):
        return ThroughputCost(hourly.usd_per_hour, float(requests_per_second), items_per_request, hourly.missing)
    missing = None if hourly is not None else "no hourly price to divide"
    return ThroughputCost(None if hourly is None else float(hourly), float(requests_per_second),
                          items_per_request, missing)


def _instant(value: str | datetime, name: str) -> datetime:
    if isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value)
    except (TypeError, ValueError):
        raise BadInput(f"{name} {value!r} is not an ISO 8601 timestamp",
                       fix="pass e.g. 2026-12-03T10:00:00+00:00") from None
