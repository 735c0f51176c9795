"""Capacity as SageMaker counts it (tasks.backends.capacity): a MIG layout on every GPU of every instance, updates that
start new copies beside the serving ones, and rolling-update batches of 5-50 % of the copies — each refused at load with
the numbers and the fix, before any request is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from shiplift.tasks.backends.capacity import batch_problem, change_room, rollback_room, room_problem, slots, update_room
from shiplift.tasks.backends.placement import InstancePoolPlacement, MigPartitionPlacement
from shiplift.tasks.config import AllAtOnce, Canary, Linear, load_release_config
from shiplift.tasks.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
QWEN = ROOT / "configs" / "releases" / "qwen35-4b-semif.yaml"
MDEBERTA = ROOT / "configs" / "releases" / "mdeberta-nli.yaml"


class Image:
    def __init__(self, on_gpu: bool = True, threads: int = 2):
        self.on_gpu, self.threads = on_gpu, threads


def mig(instance_type: str, partitions: int) -> MigPartitionPlacement:
    return MigPartitionPlacement(kind="mig_partition", instance_type=instance_type, partition_type="mig-1g.10gb",
                                 partitions=partitions)


@pytest.mark.parametrize("instance_type, partitions, total", [("ml.p5.48xlarge", 2, 16), ("ml.p5.4xlarge", 2, 2),
                                                              ("ml.p5.4xlarge", 7, 7), ("ml.p4d.24xlarge", 4, 32)])
def test_a_mig_layout_is_carved_on_every_gpu_of_the_instance(instance_type, partitions, total):
    """SageMaker's guide: partitions = layout x accelerators per instance x instances; the old count took the layout
    alone."""
    assert slots(mig(instance_type, partitions), Image()).total(1) == total


def test_a_pool_counts_the_smallest_of_its_types_and_unknown_types_count_nothing():
    pool = InstancePoolPlacement(kind="instance_pool", pools=[{"instance_type": "ml.g5.12xlarge", "priority": 1},
                                                              {"instance_type": "ml.g6e.xlarge", "priority": 2}])
    assert slots(pool, Image()).describe(2) == "2 x ml.g6e.xlarge = 2 GPUs", "any pool entry may be the one provisioned"
    assert slots(pool, Image(on_gpu=False, threads=2)) is None, "GPU types have no CPU-slot entry here"
    cpu = InstancePoolPlacement(kind="instance_pool", pools=[{"instance_type": "ml.c6i.xlarge", "priority": 1}])
    assert slots(cpu, Image(on_gpu=False, threads=2)).describe(1) == "1 x ml.c6i.xlarge = 2 2-core slots"


@pytest.mark.parametrize("rollout, peak", [
    (AllAtOnce(strategy="all_at_once", copies=2), 4),  # new copies start beside the old ones
    (Linear(strategy="linear", copies=4, batch={"value": 1}), 5),
    (Canary(strategy="canary", copies=4, batch={"value": 2}), 6),
    (Linear(strategy="linear", copies=10, batch={"type": "CAPACITY_PERCENT", "value": 20}), 12),
])
def test_an_update_needs_room_for_what_it_adds(rollout, peak):
    assert update_room(rollout)[0] == peak


@pytest.mark.parametrize("rollout, peak", [
    (AllAtOnce(strategy="all_at_once", copies=2), None),  # no DeploymentConfig: nothing rolls back
    (Linear(strategy="linear", copies=4, batch={"value": 1}), 8),  # RollbackMaximumBatchSize unset: all 4 old copies
    (Canary(strategy="canary", copies=4, batch={"value": 2}, rollback_batch={"value": 1}), 5),
    (Linear(strategy="linear", copies=10, batch={"value": 1},
            rollback_batch={"type": "CAPACITY_PERCENT", "value": 30}), 13),
])
def test_a_rollback_needs_room_for_the_old_copies_it_starts_beside_the_new(rollout, peak):
    """https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_InferenceComponentRollingUpdatePolicy.html:
    RollbackMaximumBatchSize defaults to the whole copy count when it is not sent."""
    found = rollback_room(rollout)
    assert (found[0] if found else None) == peak
    assert change_room(rollout)[0] == max(update_room(rollout)[0], peak or 0)


def test_the_shipped_qwen_example_fits_its_update_only_with_managed_scaling():
    config = load_release_config(QWEN, environ={})
    assert (config.placement.instance_count, config.placement.max_instance_count, config.rollout.copies) == (2, 4, 2)
    with pytest.raises(ConfigError) as refused:
        load_release_config(QWEN, overrides=("placement.max_instance_count=null",), environ={})
    assert ("the next release cannot place its update: an update without DeploymentConfig starts all 2 new copies "
            "beside the old ones (4 at once), but the endpoint grows to at most 2 x ml.g6e.xlarge = 2 GPUs; set "
            "placement.max_instance_count to 4") in str(refused.value)
    assert "or use a rolling update with a smaller batch" in str(refused.value)


def test_the_shipped_mig_example_uses_one_gpu_whole():
    config = load_release_config(MDEBERTA, environ={})
    found = slots(config.placement, config.image)
    assert found.describe(1) == "1 x ml.p5.4xlarge = 7 mig-1g.10gb partitions"
    assert room_problem(config.placement, config.image, config.rollout) is None
    with pytest.raises(ConfigError, match=r"4 at once\), but the endpoint grows to at most 1 x ml.p5.4xlarge = 3 "
                                          r"mig-1g.10gb partitions; lay out more partitions per GPU"):
        load_release_config(MDEBERTA, overrides=("placement.partitions=3",), environ={})


def test_max_instance_count_below_instance_count_is_refused():
    with pytest.raises(ConfigError,
                       match=r"placement.max_instance_count \(1\) is below placement.instance_count \(2\)"):
        load_release_config(QWEN, overrides=("placement.max_instance_count=1",), environ={})


@pytest.mark.parametrize("strategy, copies, batch, words", [
    ("linear", 4, {"value": 3},
     "rollout.batch is 3 copies of 4, but SageMaker's MaximumBatchSize must be 5-50 % of the "
                                "copy count (0.2-2 copies of 4)"),
    ("linear", 4, {"type": "CAPACITY_PERCENT", "value": 60}, "rollout.batch is 60 %"),
    ("linear", 10, {"type": "CAPACITY_PERCENT", "value": 4}, "(5-50 %)"),
    ("canary", 4, {"value": 1}, "use a batch of 2 (half of 4) or strategy linear"),
    ("canary", 3, {"value": 1}, "3 copies cannot be halved, so use 4 copies or strategy linear"),
])
def test_batches_outside_sagemakers_bounds_are_refused(strategy, copies, batch, words):
    rollout = (Canary if strategy == "canary" else Linear)(strategy=strategy, copies=copies, batch=batch)
    assert words in batch_problem(rollout)


@pytest.mark.parametrize("strategy, copies, batch", [("linear", 16, {"value": 1}), ("linear", 4, {"value": 2}),
                                                     ("canary", 4, {"value": 2}), ("canary", 2, {"value": 1}),
                                                     ("linear", 10, {"type": "CAPACITY_PERCENT", "value": 50})])
def test_batches_inside_the_bounds_pass(strategy, copies, batch):
    assert batch_problem((Canary if strategy == "canary" else Linear)(strategy=strategy, copies=copies,
                                                                      batch=batch)) is None


def test_an_aws_config_with_a_batch_out_of_bounds_is_refused_at_load():
    with pytest.raises(ConfigError, match="MaximumBatchSize must be 5-50 % of the copy count"):
        load_release_config(QWEN, overrides=("rollout.strategy=linear", "rollout.copies=4", "rollout.batch.value=3",
                                              "placement.instance_count=4", "placement.max_instance_count=8"),
                                              environ={})
