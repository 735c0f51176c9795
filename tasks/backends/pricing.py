"""What a release costs on SageMaker AI real-time inference, from a dated, sourced price table (docs/cost.md).

Prices are data: `configs/prices/sagemaker-real-time-on-demand.yaml`, or the file `SHIPLIFT_PRICES` names, filled by
`shiplift prices refresh` (`tasks.backends.aws.price_list`); a release fetches nothing. Each figure carries its source
and the date it was read; a type the table lacks is reported as "no price for ml.x in region" once a run
(`PriceTable.once`: the later lines point back to it), never guessed.

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

The parts: `pricing_table` (the price file), `pricing_instances` (hourly costs, a MIG copy's share) and `pricing_costs`
(shared-endpoint shares, candidates, throughput); this module writes the dry run's and the gate's cost lines from them
and keeps every public name importable here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shiplift.tasks.backends.capacity import room
from shiplift.tasks.backends.pricing_costs import (
    CandidateCost,
    ComponentShare,
    ThroughputCost,
    candidate_cost,
    candidate_cost_for,
    component_share,
    throughput_cost,
)
from shiplift.tasks.backends.pricing_instances import (
    CopyShare,
    HourlyCost,
    PoolPrice,
    _placement_types,
    hourly_cost,
    mig_copy_share,
    mig_copy_share_of,
    production_cost,
    serverless_cost,
)
from shiplift.tasks.backends.pricing_table import (
    DEFAULT_PRICES_PATH,
    PRICES_ENV,
    Price,
    PriceTable,
    _usd,
    load_price_table,
    prices_path,
)

__all__ = [  # importers name these from tasks.backends.pricing
    "DEFAULT_PRICES_PATH", "NOMINAL_REGION", "PRICES_ENV", "CandidateCost", "ComponentShare", "CopyShare",
    "HourlyCost", "PoolPrice", "Price", "PriceTable", "ThroughputCost", "candidate_cost", "candidate_cost_for",
    "component_share", "dry_run_cost_lines", "hourly_cost", "load_price_table", "mig_copy_share", "mig_copy_share_of",
    "prices_path", "production_cost", "release_cost", "serverless_cost", "throughput_cost", "update_extra_instances",
]


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
    table = (load_price_table() if table is None else table).once()
    region, placement = config.backend.region, config.placement
    if placement.kind == "serverless":
        return [f"cost: {serverless_cost(region, placement, what='production and its candidate').describe()}"]
    instance_type, _ = _placement_types(placement)
    production = production_cost(table, region, placement)
    lines = [f"cost: {production.describe()}"]
    # the pool's range is on the line above
    candidate = hourly_cost(table, region, instance_type, 1, what="a candidate")
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
            f"{_usd(grown.usd_per_hour + production.usd_per_hour)} $/h at the peak, until ManagedInstanceScaling "
            "removes them after the update")
        lines.append(f"cost: {grown.describe()} while an update runs ({extra[1]}){peak}")
    return lines


NOMINAL_REGION = "us-east-1"  # where a local release's placement is priced: it names no region of its own


def release_cost(config, *, answers_per_second: float | None, items_per_request: int, candidate_since: str | None,
                 until: str, table: PriceTable | None = None) -> dict[str, Any]:
    """What a release's gate report says about cost, as dicts (each with its `text`): production per hour, the
    candidate from deploy_candidate's start until `until` (so far), a MIG copy's share, and per million requests and
    decisions at the gate's measured rate. A local release is priced as its placement would be on SageMaker AI in
    NOMINAL_REGION (`nominal` says so): it runs on this machine and costs nothing there."""
    table = (load_price_table() if table is None else table).once()
    nominal = config.backend.kind != "aws"
    region = NOMINAL_REGION if nominal else config.backend.region
    production = production_cost(table, region, config.placement)
    cost: dict[str, Any] = {"region": region, "nominal": nominal, "table": table.origin,
                            "production": production.as_dict(), "candidate": None, "mig_copy": None,
                            "per_million": None}
    if candidate_since is not None:
        cost["candidate"] = candidate_cost_for(table, config, candidate_since, until, region=region).as_dict()
    if config.placement.kind == "mig_partition":
        cost["mig_copy"] = mig_copy_share_of(table, region, config.placement).as_dict()
    if config.placement.endpoint is not None:
        cost["share"] = component_share(table, region, config.placement, config.image, config.rollout.copies,
                                        scales_to_zero=config.scale_to_zero is not None).as_dict()
    if answers_per_second:
        hourly = production if config.placement.kind == "serverless" else _as_above(table, production)
        cost["per_million"] = throughput_cost(hourly, answers_per_second / items_per_request,
                                              items_per_request).as_dict()
    return cost


def _as_above(table: PriceTable, production: HourlyCost) -> HourlyCost:
    """Production for a later line of the same run: an instance price it lacks is named briefly (`PriceTable.once`),
    the production line having named it in full."""
    if production.price is not None:
        return production
    return replace(production, missing=table.missing(production.region, production.instance_type))
