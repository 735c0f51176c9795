"""shiplift.tasks.backends.placement: MIG layouts, GPU driver fitness and memory sizing, alone and through the
release config."""

from __future__ import annotations

from pathlib import Path

import pytest

from shiplift.tasks.backends.aws.service_model import service_model
from shiplift.tasks.backends.placement import (
    CPU_RUNTIME_OVERHEAD_MB,
    DEFAULT_DRIVERS,
    INFERENCE_AMI_DRIVERS,
    RUNTIME_OVERHEAD_MB,
    InstancePoolPlacement,
    InstanceTypePlacement,
    MemoryEstimate,
    MigPartitionPlacement,
    driver_problem,
    fit_problem,
    is_gpu_instance,
    layout_problem,
    partition_size,
)
from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families.gguf_decisions import gguf_memory

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "configs" / "releases" / "gemma-decision.yaml"
NEWEST_AMI = "al2023-ami-sagemaker-inference-gpu-4-1"
LLAMA_CPP_CUDA13 = 580  # SemifImage.min_gpu_driver
QWEN3_4B = {"block_count": 36, "head_count": 32, "head_count_kv": 8, "key_length": 128, "value_length": 128,
            "embedding_length": 2560}
QWEN3_4B_BYTES = 2_500_000_000


# -- MIG layouts ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("instance_type, partition, count",
                         [("ml.p4d.24xlarge", "mig-3g.20gb", 2), ("ml.p4d.24xlarge", "mig-1g.5gb", 7),
                                                              ("ml.p5.48xlarge", "mig-1g.10gb", 7),
                                                              ("ml.g7e.2xlarge", "mig-1g.24gb", 4),
                                                              ("ml.g7.2xlarge", "mig-1g.16gb", 2)])
def test_layouts_that_fit_one_gpu(instance_type, partition, count):
    assert layout_problem(instance_type, partition, count) is None


def test_too_many_compute_slices():
    problem = layout_problem("ml.p4d.24xlarge", "mig-2g.10gb", 4)
    assert problem == ("4 x mig-2g.10gb needs 8 compute slices and 40 GB, but one A100 40 GB GPU of ml.p4d.24xlarge "
                       "has 7 slices and 40 GB; use fewer or smaller partitions")


def test_too_much_memory():
    problem = layout_problem("ml.p4d.24xlarge", "mig-1g.10gb", 5)
    assert "needs 5 compute slices and 50 GB" in problem and "7 slices and 40 GB" in problem


def test_three_partitions_of_a_g7e_gpu_exceed_its_memory():
    assert "needs 3 compute slices and 144 GB" in layout_problem("ml.g7e.2xlarge", "mig-1g.48gb", 3)


def test_a_family_without_known_mig_partitions():
    problem = layout_problem("ml.g6e.xlarge", "mig-1g.10gb", 1)
    assert problem.startswith("instance_type ml.g6e.xlarge: SageMaker MIG partitions are known for ")
    assert all(f"ml.{name}.*" in problem for name in ("p4d", "p5", "g7", "g7e"))


def test_partition_sizes_and_refused_profiles():
    assert partition_size("mig-3g.40gb") == (3, 40)
    assert partition_size("mig-1g.10gb+me") == (1, 10)
    with pytest.raises(ValueError, match="not a MIG profile"):
        partition_size("3g.40gb")


# -- GPU driver fitness ---------------------------------------------------------------------------------

def test_the_llama_cpp_cuda13_image_runs_on_al2023_gpu_4_1():
    for instance_type in ("ml.g6e.xlarge", "ml.g5.2xlarge", "ml.p5.48xlarge"):
        assert driver_problem(instance_type, NEWEST_AMI, needs_driver=LLAMA_CPP_CUDA13,
                              what="the semif GPU image") is None


@pytest.mark.parametrize("ami", ["al2-ami-sagemaker-inference-gpu-2", "al2-ami-sagemaker-inference-gpu-2-1",
                                 "al2-ami-sagemaker-inference-gpu-3-1"])
def test_older_amis_are_refused_for_the_cuda13_image_with_the_fix(ami):
    problem = driver_problem("ml.g6e.xlarge", ami, needs_driver=LLAMA_CPP_CUDA13, what="the semif GPU image")
    assert problem == (f"the semif GPU image needs NVIDIA driver >= 580, but AMI {ami} (driver "
                       f"{INFERENCE_AMI_DRIVERS[ami]}) has an older one; set placement.inference_ami_version: "
                       f"{NEWEST_AMI}")


@pytest.mark.parametrize("instance_type, driver", [("ml.g5.2xlarge", "driver 470"), ("ml.g4dn.xlarge", "driver 470"),
                                                   ("ml.p5.48xlarge", "driver 535"), ("ml.p5en.48xlarge", "driver 550"),
                                                   ("ml.g6e.xlarge", "driver unknown")])
def test_default_amis_are_refused_for_the_cuda13_image_with_the_fix(instance_type, driver):
    problem = driver_problem(instance_type, None, needs_driver=LLAMA_CPP_CUDA13, what="the semif GPU image")
    assert f"the default AMI of {instance_type} ({driver})" in problem
    assert problem.endswith(f"set placement.inference_ami_version: {NEWEST_AMI}")


def test_an_ami_that_is_not_a_gpu_inference_ami_is_refused():
    problem = driver_problem("ml.g6e.xlarge", "al2-ami-sagemaker-inference-neuron-2", needs_driver=0, what="x")
    assert "'al2-ami-sagemaker-inference-neuron-2' is not a GPU inference AMI" in problem and NEWEST_AMI in problem


def test_mig_1g_10gb_on_p4d_needs_r525():
    assert DEFAULT_DRIVERS["p4d"] == 470
    problem = driver_problem("ml.p4d.24xlarge", None, needs_driver=0, what="the encoder GPU image",
                             partition_type="mig-1g.10gb")
    assert problem == ("the encoder GPU image on mig-1g.10gb partitions of P4d needs NVIDIA driver >= 525, but the "
                       "default AMI of ml.p4d.24xlarge (driver 470) has an older one; set "
                       f"placement.inference_ami_version: {NEWEST_AMI}")
    assert driver_problem("ml.p4d.24xlarge", "al2-ami-sagemaker-inference-gpu-2", needs_driver=0, what="x",
                          partition_type="mig-1g.10gb") is None, "driver 535 >= R525"
    assert driver_problem("ml.p4d.24xlarge", None, needs_driver=0, what="x", partition_type="mig-3g.20gb") is None
    assert driver_problem("ml.p5.48xlarge", None, needs_driver=0, what="x", partition_type="mig-1g.10gb") is None


def test_the_ami_table_stays_inside_botocores_enum():
    enum = service_model("sagemaker").shape_for("ProductionVariantInferenceAmiVersion").enum
    assert set(INFERENCE_AMI_DRIVERS) <= set(enum), set(INFERENCE_AMI_DRIVERS) - set(enum)
    assert {ami for ami in enum
            if "-gpu-" in ami} <= set(INFERENCE_AMI_DRIVERS), "every GPU AMI botocore knows has a driver"


def test_gpu_families():
    assert [is_gpu_instance(t) for t in ("ml.g6e.xlarge", "ml.p4d.24xlarge", "ml.p5en.48xlarge", "ml.c7i.xlarge",
                                         "ml.m5.large", "ml.inf2.xlarge")] == [True, True, True, False, False, False]


# -- memory sizing --------------------------------------------------------------------------------------

def test_gguf_memory_of_a_qwen3_4b_shape_against_a_hand_computed_kv_cache():
    estimate = gguf_memory(QWEN3_4B_BYTES, QWEN3_4B, context_tokens=131072, on_gpu=True)
    # f16 K and V: 131072 tokens x 36 layers x 8 KV heads x (128 + 128) x 2 bytes = 19,327,352,832 bytes = 18 GiB
    assert estimate.context_mb == 131072 * 36 * 8 * 256 * 2 // 1024**2 == 18432
    assert estimate.weights_mb == 2385, "2.5e9 bytes, rounded up to whole MiB"
    assert estimate.runtime_mb == RUNTIME_OVERHEAD_MB == 1536
    assert estimate.total_mb == 2385 + 18432 + 1536
    assert estimate.describe() == "21.8 GB (weights 2.3 GB + KV cache 18.0 GB + runtime 1.5 GB)"


def test_gguf_memory_takes_the_head_size_from_the_embedding_when_key_length_is_missing():
    shape = {k: v for k, v in QWEN3_4B.items() if k not in ("key_length", "value_length")}
    estimate = gguf_memory(QWEN3_4B_BYTES, shape, context_tokens=8192, on_gpu=False)
    assert estimate.context_mb == 8192 * 36 * 8 * (80 + 80) * 2 // 1024**2  # 2560 / 32 heads = 80
    assert estimate.runtime_mb == CPU_RUNTIME_OVERHEAD_MB


def pool(*types: str) -> InstancePoolPlacement:
    return InstancePoolPlacement(kind="instance_pool",
                                 pools=[{"instance_type": t, "priority": i + 1} for i, t in enumerate(types)])


def test_fit_problem_on_a_pool_is_judged_by_its_smallest_gpu():
    estimate = MemoryEstimate(weights_mb=20 * 1024, context_mb=4 * 1024, runtime_mb=1536)  # 25.5 GB
    problem = fit_problem(estimate, pool("ml.g6e.xlarge", "ml.g5.2xlarge", "ml.p4d.24xlarge"))
    assert problem.startswith("the model needs 25.5 GB (weights 20.0 GB + KV cache 4.0 GB + runtime 1.5 GB) but one "
                              "GPU of ml.g5.2xlarge (24 GB) holds 24 GB: 1.5 GB short; drop the smaller instance "
                              "types from the pool")
    assert fit_problem(estimate, pool("ml.g6e.xlarge", "ml.p4d.24xlarge")) is None
    assert fit_problem(estimate, InstanceTypePlacement(kind="instance_type", instance_type="ml.p4d.24xlarge")) is None
    assert fit_problem(estimate, pool("ml.c7i.xlarge")) is None, "CPU instances are not sized against a GPU"


def test_fit_problem_on_a_mig_partition_says_how_many_gb_short():
    placement = MigPartitionPlacement(kind="mig_partition", instance_type="ml.p4d.24xlarge",
                                      partition_type="mig-1g.10gb", partitions=4)
    estimate = gguf_memory(QWEN3_4B_BYTES, QWEN3_4B, context_tokens=131072, on_gpu=True)
    problem = fit_problem(estimate, placement)
    assert "a mig-1g.10gb partition holds 10 GB: 11.8 GB short" in problem  # (22353 - 10240) MiB = 11.83 GiB
    assert "use a larger partition type" in problem and "image.max_tokens" in problem
    assert fit_problem(gguf_memory(QWEN3_4B_BYTES, QWEN3_4B, context_tokens=8192, on_gpu=True), placement) is None


# -- through the release config -------------------------------------------------------------------------

def load(*overrides: str):
    return load_release_config(GEMMA, overrides=overrides, environ={})


def test_a_gpu_image_on_a_cpu_only_pool_type_is_refused():
    with pytest.raises(ConfigError) as caught:
        load("image.n_gpu_layers=-1", "placement={kind: instance_pool, inference_ami_version: " + NEWEST_AMI + ", "
             "pools: [{instance_type: ml.g6e.xlarge, priority: 1}, {instance_type: ml.c7i.xlarge, priority: 2}]}")
    message = str(caught.value)
    assert "the image runs on the GPU but ['ml.c7i.xlarge'] have no GPU" in message
    assert "pick GPU instance types or run the image on the CPU" in message


def test_a_gpu_variant_without_a_suitable_ami_is_refused():
    with pytest.raises(ConfigError) as caught:
        load("image.n_gpu_layers=-1", "placement={kind: instance_type, instance_type: ml.g5.2xlarge}")
    message = str(caught.value)
    assert "the semif GPU image needs NVIDIA driver >= 580" in message
    assert "default AMI of ml.g5.2xlarge (driver 470)" in message
    assert f"set placement.inference_ami_version: {NEWEST_AMI}" in message
    config = load("image.n_gpu_layers=-1", f"placement={{kind: instance_type, instance_type: ml.g5.2xlarge, "
                                           f"inference_ami_version: {NEWEST_AMI}}}")
    assert config.placement.inference_ami_version == NEWEST_AMI, "the named fix is accepted"


def test_a_mig_layout_that_does_not_fit_is_refused_at_load():
    with pytest.raises(ConfigError) as caught:
        load("image.n_gpu_layers=-1", "placement={kind: mig_partition, instance_type: ml.p4d.24xlarge, "
             f"partition_type: mig-3g.40gb, partitions: 2, inference_ami_version: {NEWEST_AMI}}}")
    assert "placement" in str(caught.value) and "needs 6 compute slices and 80 GB" in str(caught.value)
