"""How many copies a SageMaker endpoint holds, counted as SageMaker counts them, and the room a release needs in it.

One model, used by the config check, the recorded placement, the README's cost lines and the SageMaker double:
- a GPU copy takes one whole accelerator (`NumberOfAcceleratorDevicesRequired: 1`), so an endpoint holds
  accelerators per instance × instances copies;
- a MIG layout applies to every accelerator of every instance, so it holds layout × accelerators × instances
  partitions, one copy each, of the copy's own type: in a mixed layout (one mig-3g.40gb, two mig-1g.10gb…) a model's
  copies count only the partitions of its `AcceleratorPartitionType`
  (https://docs.aws.amazon.com/sagemaker/latest/dg/inference-components-accelerator-partitioning-manage.html);
- a CPU copy takes `image.threads` cores (`NumberOfCpuCoresRequired`) of one instance's vCPUs.
Room: a first release creates its copies; an update with no `DeploymentConfig` provisions every new copy beside the old
ones before it removes them, a rolling update provisions one batch beside the old copies, and its rollback the old
copies `RollbackMaximumBatchSize` at a time (all of them when it is not sent) beside the new ones
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html); the
instances that room may use are `instance_count`, or `ManagedInstanceScaling.MaxInstanceCount` where the placement sets
`max_instance_count`
(https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_ProductionVariantManagedInstanceScaling.html).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

from shiplift.tasks.backends.placement import gpus_per_instance, partition_size

# vCPUs of an ml.<family>.<size> CPU instance by size: the sizes of Amazon EC2's general purpose, compute and memory
# optimized families (https://docs.aws.amazon.com/ec2/latest/instancetypes/gp.html); "metal" sizes vary and are not
# listed
VCPUS_BY_SIZE = {"medium": 1, "large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16, "8xlarge": 32, "9xlarge": 36,
                 "12xlarge": 48, "16xlarge": 64, "18xlarge": 72, "24xlarge": 96, "32xlarge": 128, "48xlarge": 192}
CPU_FAMILY = re.compile(r"^[cmrt]\d+[a-z]*$")


class Slots(NamedTuple):
    """Copies one instance holds, of what (a GPU, a MIG partition, a number of cores), and the instance type counted."""

    per_instance: int
    unit: str
    instance_type: str

    def total(self, instances: int) -> int:
        return self.per_instance * instances

    def describe(self, instances: int) -> str:
        """`2 x ml.g6e.xlarge = 2 GPUs`, `1 x ml.p5.4xlarge = 7 mig-1g.10gb partitions`."""
        total = self.total(instances)
        return f"{instances} x {self.instance_type} = {total} {self.unit}{'s' if total != 1 else ''}"


def slots(placement, image) -> Slots | None:
    """The copies one instance of the placement holds (the smallest pool type's, since any may be provisioned), or None
    where this table does not know the instance type (or a serverless placement has no instances)."""
    if placement.kind == "serverless":
        return None
    if placement.kind == "mig_partition":
        gpus = gpus_per_instance(placement.instance_type)
        if gpus is None:
            return None
        return Slots(gpus * placement.partitions, f"{placement.partition_type} partition", placement.instance_type)
    types = ([p.instance_type for p in sorted(placement.pools, key=lambda p: p.priority)]
             if placement.kind == "instance_pool"
             else [placement.instance_type])
    known = []
    for instance_type in types:
        if image.on_gpu:
            gpus = gpus_per_instance(instance_type)
            if gpus is not None:
                known.append(Slots(gpus, "GPU", instance_type))
        else:
            vcpus = cpu_count(instance_type)
            if vcpus is not None:
                known.append(Slots(vcpus // max(1, image.threads), f"{image.threads}-core slot", instance_type))
    return min(known, key=lambda found: found.per_instance) if len(known) == len(types) else None


def layout_share(partition_type: str | None, layout: Sequence[str]) -> float:
    """The share of each GPU that the partitions of `partition_type` hold in a MIG `layout`, by compute slices (3/7 for
    the mig-3g.40gb of 3g + 2g + 1g + 1g): what a model's slots are worth of the bill; 1 for one profile repeated or no
    layout. Compute slices, not memory: MIG caps a GPU at its compute slices, so they are what a partition takes from
    the others (a mig-1g.20gb holds one slice and a fourth of the memory, and pays one slice's share)."""
    if not layout:
        return 1.0
    own = sum(partition_size(profile)[0] for profile in layout if profile == partition_type)
    return own / sum(partition_size(profile)[0] for profile in layout)


def cpu_count(instance_type: str) -> int | None:
    """vCPUs of a CPU instance type such as ml.c6i.large, None when this table does not know it."""
    name, size = instance_type.split(".")[1:3]
    return VCPUS_BY_SIZE.get(size) if CPU_FAMILY.match(name) else None


def update_room(rollout, copies: int | None = None) -> tuple[int, str]:
    """The copies an update of production holds at its peak, and why: all at once, old and new side by side; a rolling
    update, the old copies and one batch. `copies`: the copies it updates (default rollout.copies)."""
    copies = rollout.copies if copies is None else copies
    if rollout.strategy == "all_at_once":
        return 2 * copies, f"an update without DeploymentConfig starts all {copies} new copies beside the old ones"
    batch = rollout.batch.copies_of(copies)
    return copies + batch, f"a rolling update starts a batch of {batch} beside the {copies} old copies"


def rollback_room(rollout, copies: int | None = None) -> tuple[int, str] | None:
    """The copies a rolling update's automatic rollback holds at its peak, and why: SageMaker starts the old copies
    again `RollbackMaximumBatchSize` at a time beside the new ones, and that size is 100 % of the copies unless it is
    sent (rollout.rollback_batch),
    https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html; None for
    an update without DeploymentConfig (nothing rolls back: its peak is the update's own)."""
    if rollout.strategy == "all_at_once":
        return None
    copies = rollout.copies if copies is None else copies
    batch = rollout.rollback_batch.copies_of(copies) if rollout.rollback_batch else copies
    size = "rollout.rollback_batch" if rollout.rollback_batch else "RollbackMaximumBatchSize unset: 100 %"
    return copies + batch, f"its rollback starts {batch} old copies ({size}) beside the {copies} new ones"


def change_room(rollout, copies: int | None = None) -> tuple[int, str]:
    """The larger peak of the next update and of its rollback, and why."""
    update, rollback = update_room(rollout, copies), rollback_room(rollout, copies)
    if rollback is None or rollback[0] <= update[0]:
        return update
    return rollback[0], f"{update[1]}, and {rollback[1]}"


class Room(NamedTuple):
    """Production's copies on its endpoint and the peak of the next release's update of them."""

    slots: Slots
    instances: int  # production's instance_count
    most: int  # the instances the endpoint may grow to (max_instance_count, else instance_count)
    peak: int  # copies at once during the next update
    why: str  # what the peak is made of

    def fits(self, copies: int) -> bool:
        return copies <= self.slots.total(self.instances) and self.peak <= self.slots.total(self.most)

    def describe_update(self) -> str:
        """`an update without DeploymentConfig starts ... (4 at once); the endpoint grows to 4 x ml.g6e.xlarge = 4
        GPUs`."""
        scaling = " (ManagedInstanceScaling)" if self.most > self.instances else ""
        return f"{self.why} ({self.peak} at once); the endpoint grows to {self.slots.describe(self.most)}{scaling}"


def room(placement, image, rollout) -> Room | None:
    """The room production and its next update take, or None where this table does not know the instance type."""
    found = slots(placement, image)
    if found is None:
        return None
    instances = getattr(placement, "instance_count", 1)
    peak, why = update_room(rollout)
    return Room(found, instances, getattr(placement, "max_instance_count", None) or instances, peak, why)


def room_problem(placement, image, rollout) -> str | None:
    """Why production's copies, or the next release's update of them, cannot be placed on SageMaker, with the numbers
    and the fix; None when they fit (or the instance type is not in this table)."""
    found = room(placement, image, rollout)
    if found is None or found.fits(rollout.copies):
        return None
    if rollout.copies > found.slots.total(found.instances):
        return (f"rollout.copies ({rollout.copies}) do not fit {found.slots.describe(found.instances)}: one copy each; "
                f"{_more(placement, found.slots, rollout.copies)}")
    return (f"the next release cannot place its update: {found.why} ({found.peak} at once), but the endpoint grows to "
            f"at most {found.slots.describe(found.most)}; "
            f"{_more(placement, found.slots, found.peak, scaling=True, copies=rollout.copies)}")


def _more(placement, found: Slots, needed: int, *, scaling: bool = False, copies: int = 1) -> str:
    """The fix for `needed` copies: enough instances (for an update, managed instance scaling up to them as well)."""
    instances = -(-needed // max(1, found.per_instance))
    smaller = " or use a rolling update with a smaller batch" if scaling and copies >= 2 else ""
    if placement.kind == "mig_partition":
        where = (f"more {placement.partition_type} in placement.layout" if getattr(placement, "layout", None)
                 else "placement.partitions")
        return f"lay out more partitions per GPU ({where}), or lower rollout.copies{smaller}"
    if scaling:
        return (f"set placement.max_instance_count to {instances} (ManagedInstanceScaling adds instances for the "
                f"update and removes them after), or placement.instance_count to {instances}{smaller}")
    return f"set placement.instance_count to {instances}, or lower rollout.copies"


def batch_problem(rollout) -> str | None:
    """Why a rolling update's batch is outside what SageMaker takes, or None: MaximumBatchSize is 5-50 % of the copy
    count (API_InferenceComponentRollingUpdatePolicy), and SageMaker moves every batch at that size, so a canary (one
    batch, a bake, then the rest at once) is exactly half the copies."""
    copies, size = rollout.copies, rollout.batch
    percent = size.type == "CAPACITY_PERCENT"
    low, high = (5, 50) if percent else (copies * 0.05, copies * 0.5)
    if not low <= size.value <= high:
        unit = "%" if percent else f"copies of {copies}"
        return (f"rollout.batch is {size.value} {unit}, but SageMaker's MaximumBatchSize must be 5-50 % of the copy "
                f"count ({low:g}-{high:g} {unit}); use a batch in that range, or more copies")
    batch = size.copies_of(copies)
    if rollout.strategy == "canary" and copies - batch > batch:
        odd = f"; {copies} copies cannot be halved, so use {copies + 1} copies or strategy linear" if copies % 2 else ""
        return (f"a canary of {batch} then {copies - batch} copies cannot be sent to SageMaker: its rolling update "
                f"moves equal batches of at most half the copies, so the rest would go {batch} at a time; use a batch "
                f"of {copies // 2} (half of {copies}) or strategy linear{odd}")
    return None
