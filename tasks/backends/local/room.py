"""The room of a local shared endpoint, counted as SageMaker counts it, so the local backend refuses what aws refuses.

A shared endpoint (`placement.endpoint`) stands for instances that every model on it shares: locally its copies are
processes, yet a release whose copies would not fit the placement's instances must fail here as it fails on aws,
before anything changes. The arithmetic follows the SageMaker double's `_capacity_problem` (tests/fakes/aws_double.py):
a copy takes its MIG partition, else its whole accelerators, else its CPU cores (`NumberOfCpuCoresRequired`, 1 when
unset); an instance has the placement layout's partitions, its accelerators or its vCPUs
(`tasks.backends.capacity`'s tables); the instances are `instance_count`, or `max_instance_count` where the placement
sets it (ManagedInstanceScaling adds instances to place copies,
https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariantManagedInstanceScaling.html); the
other components hold their copies, and an update holds its peak: new copies start beside the old ones
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from shiplift.tasks.backends.capacity import cpu_count
from shiplift.tasks.backends.placement import gpus_per_instance


class Need(NamedTuple):
    """What one copy takes of an instance: `per_copy` of `unit` (vCPUs, GPUs or `<profile> partitions`)."""

    unit: str
    per_copy: float


class Claim(BaseModel):
    """The copies an operation in flight on a component may run at once (its peak), and what each takes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    copies: int = Field(ge=0)
    unit: str
    per_copy: float = Field(gt=0)


class EndpointRoom(BaseModel):
    """The instances of a shared endpoint's placement: its instance types (any pool type may be provisioned, so the
    smallest counts), how many instances copies may use, and its MIG layout (one profile, `partitions` a GPU)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_types: tuple[str, ...] = Field(min_length=1)
    instances: int = Field(ge=1)
    partition_type: str | None = None
    partitions: int = 0

    def per_instance(self, unit: str) -> float | None:
        """How much of `unit` one instance has (the smallest type's); None where the tables do not know a type."""
        found = [self._of(instance_type, unit) for instance_type in self.instance_types]
        return None if None in found else min(found)

    def _of(self, instance_type: str, unit: str) -> float | None:
        gpus = gpus_per_instance(instance_type)
        if unit.endswith(" partitions"):
            return self.partitions * gpus if gpus and unit == f"{self.partition_type} partitions" else None
        return gpus if unit == "GPUs" else cpu_count(instance_type)


def room_of(placement) -> EndpointRoom | None:
    """The room of a shared endpoint's placement; None for an endpoint of one model or a serverless one."""
    if getattr(placement, "endpoint", None) is None or placement.kind == "serverless":
        return None
    types = ([pool.instance_type for pool in placement.pools] if placement.kind == "instance_pool"
             else [placement.instance_type])
    count = getattr(placement, "instance_count", 1)
    return EndpointRoom(instance_types=tuple(types),
                        instances=max(count, getattr(placement, "max_instance_count", None) or 0),
                        partition_type=getattr(placement, "partition_type", None),
                        partitions=getattr(placement, "partitions", 0))


def need_of(neutral: dict[str, Any] | None) -> Need | None:
    """What one copy of a neutral component spec (`ComponentSpec` as JSON) takes; None without one (not counted)."""
    compute = (neutral or {}).get("compute")
    if not compute:
        return None
    if compute.get("accelerator_partition"):
        return Need(f"{compute['accelerator_partition']} partitions", 1.0)
    if compute.get("accelerators"):
        return Need("GPUs", float(compute["accelerators"]))
    return Need("vCPUs", float(compute.get("cpu_cores") or 1))


def room_problem(room: EndpointRoom, endpoint: str, component: str, copies: int, need: Need,
                 held: float) -> tuple[str, str] | None:
    """(problem, fix) when `copies` copies taking `need` each do not fit beside `held` of the unit that the endpoint's
    other components hold (the double's InsufficientCapacity reason, with the arithmetic); None when they fit or the
    tables do not know the instance type."""
    per_instance = room.per_instance(need.unit)
    if not per_instance:
        return None
    total = per_instance * room.instances
    fit = int(min((per_instance // need.per_copy) * room.instances, (total - held) // need.per_copy))
    if copies <= fit:
        return None
    types = "/".join(room.instance_types)
    wanted = held + copies * need.per_copy
    problem = (f"InsufficientCapacity: Unable to place {copies} copies of inference component {component}: endpoint "
               f"{endpoint} has room for {max(0, fit)} ({room.instances} x {types} with {per_instance:g} {need.unit} "
               f"each, {held:g} held by other inference components, {need.per_copy:g} a copy): {copies} x "
               f"{need.per_copy:g} + {held:g} = {wanted:g} {need.unit} > {total:g}")
    if per_instance < need.per_copy:
        return problem, f"one copy takes more {need.unit} than one {types} has: use a larger instance type"
    instances = max(math.ceil(wanted / per_instance), math.ceil(copies / (per_instance // need.per_copy)))
    fix = (f"make room for {wanted:g} {need.unit}: set placement.instance_count (or max_instance_count, which adds "
           f"instances only while an update's extra batch runs) to {instances} in every config on the endpoint and "
           "move the fleet there (`shiplift fleet plan`, then `shiplift fleet move`), or lower rollout.copies or the "
           "rollout's batch, or place this model on another endpoint")
    return problem, fix
