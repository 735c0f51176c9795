"""Where a release's copies run (the `placement` part of a release config: an instance pool, a MIG partition layout or
one instance type) and what a placement needs to work on SageMaker, checked before any call (DESIGN §7).

Three checks SageMaker would otherwise fail late, or never name:
- **GPU fitness**: a GPU image needs an NVIDIA driver its CUDA runtime accepts. Each instance
  family has a default driver; `InferenceAmiVersion` pins a newer one. The llama.cpp CUDA-13 DLC
  needs ≥ 580 (only `al2023-ami-sagemaker-inference-gpu-4-1`), `mig-1g.10gb` on P4d needs ≥ R525.
- **MIG layout**: a layout's profiles must be placeable on one GPU of the family by NVIDIA's rules
  (`tasks.backends.mig_profiles`).
- **Sizing**: weights + KV cache + runtime must fit the memory of one partition (or one GPU), and
  the error says by how much they do not.
The driver versions come from the botocore documentation of `InferenceAmiVersion` and the
SageMaker "GPU drivers" page; a test keeps the table inside botocore's enum.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, NamedTuple

from pydantic import AfterValidator, Field, field_validator, model_validator

from shiplift.tasks.backends.aws.service_model import service_model
from shiplift.tasks.backends.mig_profiles import MIG_GPUS as MIG_GPUS  # re-exported: tasks.backends.pricing_instances
from shiplift.tasks.backends.mig_profiles import layout_problem as profiles_problem
from shiplift.tasks.config_types import NAME_PATTERN, Strict

MIB = 1024**2
RUNTIME_OVERHEAD_MB = 1536  # CUDA context, llama.cpp / ONNX Runtime compute buffers (DESIGN §7: 1–2 GB)
CPU_RUNTIME_OVERHEAD_MB = 512


INFERENCE_AMI_DRIVERS = {
    "al2-ami-sagemaker-inference-gpu-2": 535,
    "al2-ami-sagemaker-inference-gpu-2-1": 535,
    "al2-ami-sagemaker-inference-gpu-3-1": 550,
    "al2023-ami-sagemaker-inference-gpu-4-1": 580,
}
DEFAULT_DRIVERS = {  # real-time inference without an AMI override
    **dict.fromkeys(("p2", "p3", "p4d", "p4de", "g4dn", "g5"), 470),
    **dict.fromkeys(("p5", "g6"), 535),
    **dict.fromkeys(("p5e", "p5en"), 550),
}
GPU_FAMILY = re.compile(r"^(g\d+[a-z]*|p\d+[a-z]*)$")
MIG_1G_10GB_MIN_DRIVER = 525
# Serverless Inference's limits (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html: memory 1-6
# GB in 1 GB steps, CPU only, a container image of at most 10 GB; API_ProductionVariantServerlessConfig: MaxConcurrency
# and ProvisionedConcurrency 1-200; serverless-endpoints-invoke.html: the model must download and answer /ping within
# 3 minutes, /invocations within 1 minute, payloads of at most 4 MB)
SERVERLESS_MEMORY_MB = (1024, 2048, 3072, 4096, 5120, 6144)
SERVERLESS_MAX_CONCURRENCY = 200
SERVERLESS_STARTUP_S = 180
# "The maximum size of the container image you can use is 10 GB" (serverless-endpoints.html, Container support). The
# page says neither decimal nor binary, and the same page writes "1024 MB (1 GB)" for memory, so GB may mean GiB there;
# this check must refuse only what AWS surely refuses, so it takes the larger reading, 10 GiB (10,737,418,240 bytes).
SERVERLESS_IMAGE_MAX_BYTES = 10 * 1024**3
GPU_MEMORY_GB = {"g4dn": 16, "g5": 24, "g6": 24, "g6e": 48, "g7": 32, "g7e": 96, "p4d": 40, "p4de": 80, "p5": 80}


def gpus_per_instance(instance_type: str) -> int | None:
    """How many whole GPUs one instance has (None when the type is not in this table)."""
    family_name, size = instance_type.split(".")[1:3]
    if family_name in ("p4d", "p4de") or size == "48xlarge" and family_name in ("g5", "g6", "g6e", "p5"):
        return 8
    if family_name in ("g4dn", "g5", "g6", "g6e"):
        return 4 if size in ("12xlarge", "24xlarge") else 8 if size == "metal" else 1
    return 1 if instance_type == "ml.p5.4xlarge" else None


def family(instance_type: str) -> str:
    """`ml.g6e.xlarge` → `g6e`."""
    return instance_type.split(".")[1]


def is_gpu_instance(instance_type: str) -> bool:
    return bool(GPU_FAMILY.match(family(instance_type)))


def partition_size(partition_type: str) -> tuple[int, int]:
    """(compute slices, GB) of a MIG profile such as `mig-3g.40gb`."""
    match = re.match(r"^mig-([0-9]+)g\.([0-9]+)gb", partition_type)
    if not match:
        raise ValueError(f"{partition_type!r} is not a MIG profile such as mig-1g.10gb")
    return int(match[1]), int(match[2])


def layout_problem(instance_type: str, partition_type: str, partitions: int) -> str | None:
    """Why `partitions` x `partition_type` cannot be laid out on one GPU of `instance_type`, or None (NVIDIA's
    placement rules: `tasks.backends.mig_profiles.layout_problem`)."""
    return profiles_problem(instance_type, [partition_type] * partitions)


def driver_problem(instance_type: str, ami_version: str | None, *, needs_driver: int, what: str,
                   partition_type: str | None = None) -> str | None:
    """Why a GPU variant on `instance_type` with `ami_version` cannot run `what`, or None."""
    if ami_version is not None and ami_version not in INFERENCE_AMI_DRIVERS:
        return (f"inference_ami_version {ami_version!r} is not a GPU inference AMI; use one of "
                f"{', '.join(sorted(INFERENCE_AMI_DRIVERS))}")
    driver = INFERENCE_AMI_DRIVERS[ami_version] if ami_version else DEFAULT_DRIVERS.get(family(instance_type))
    shown = f"AMI {ami_version} (driver {driver})" if ami_version else (
        f"the default AMI of {instance_type} (driver {driver})"
        if driver else f"the default AMI of {instance_type} (driver unknown)")
    newest = max(INFERENCE_AMI_DRIVERS, key=INFERENCE_AMI_DRIVERS.get)
    if partition_type and partition_type.startswith("mig-1g.10gb") and family(instance_type) == "p4d":
        needs_driver = max(needs_driver, MIG_1G_10GB_MIN_DRIVER)
        what = f"{what} on mig-1g.10gb partitions of P4d"
    if driver is None or driver < needs_driver:
        return (f"{what} needs NVIDIA driver >= {needs_driver}, but {shown} has "
                f"{'an older one' if driver else 'no known driver'}; set placement.inference_ami_version: {newest}")
    return None


class MemoryEstimate(NamedTuple):
    """What one copy of a model needs in accelerator (or host) memory, in MiB; each family estimates its own
    (`ModelFamily.memory`), and `fit_problem` checks it against a placement."""

    weights_mb: int
    context_mb: int  # the KV cache of a decoder, the activations of an encoder's largest batch
    runtime_mb: int
    context_label: str = "KV cache"

    @property
    def total_mb(self) -> int:
        return self.weights_mb + self.context_mb + self.runtime_mb

    def describe(self) -> str:
        return (f"{self.total_mb / 1024:.1f} GB (weights {self.weights_mb / 1024:.1f} GB + {self.context_label} "
                f"{self.context_mb / 1024:.1f} GB + runtime {self.runtime_mb / 1024:.1f} GB)")


def fit_problem(estimate: MemoryEstimate, placement) -> str | None:
    """Why the model does not fit one partition (MIG), one GPU of the smallest pool type or a serverless endpoint's
    memory, or None."""
    if placement.kind == "serverless":
        if estimate.total_mb <= placement.memory_size_mb:
            return None
        bigger = next((mb for mb in SERVERLESS_MEMORY_MB if mb >= estimate.total_mb), None)
        return (f"the model needs {estimate.describe()} but placement.memory_size_mb gives the serverless endpoint "
                f"{placement.memory_size_mb} MB; " + (f"set placement.memory_size_mb: {bigger}" if bigger else
                f"serverless endpoints hold at most {SERVERLESS_MEMORY_MB[-1]} MB, so use an instance placement")
                + ", or lower the batch (image.max_batch)")
    if placement.kind == "mig_partition":
        capacity_gb, where = partition_size(placement.partition_type)[1], f"a {placement.partition_type} partition"
        bigger = "use a larger partition type"
    else:
        types = ([p.instance_type for p in placement.pools] if placement.kind == "instance_pool"
                 else [placement.instance_type])
        known = [(GPU_MEMORY_GB[family(t)], t) for t in types if is_gpu_instance(t) and family(t) in GPU_MEMORY_GB]
        if not known:
            return None
        capacity_gb, smallest = min(known)
        where, bigger = f"one GPU of {smallest} ({capacity_gb} GB)", "drop the smaller instance types from the pool"
    capacity_mb = capacity_gb * 1024
    if estimate.total_mb <= capacity_mb:
        return None
    short = (estimate.total_mb - capacity_mb) / 1024
    return (f"the model needs {estimate.describe()} but {where} holds {capacity_gb} GB: {short:.1f} GB short; "
            f"{bigger}, or lower the context (image.max_tokens) or batch (image.max_batch)")


def image_size_problem(size_bytes: int | None, placement) -> str | None:
    """Why a serverless endpoint cannot take an image of `size_bytes` (its registry's size: on ECR the compressed
    layers), or None: the size is unknown, the placement is not serverless, or the size is within the limit. An image
    compressed under the limit may still be over it uncompressed; AWS then refuses it at CreateEndpoint."""
    if size_bytes is None or placement.kind != "serverless" or size_bytes <= SERVERLESS_IMAGE_MAX_BYTES:
        return None
    return (f"the serving image is {size_bytes:,} bytes ({size_bytes / 1024**3:.2f} GiB) compressed in its registry, "
            f"over the {SERVERLESS_IMAGE_MAX_BYTES:,} bytes (10 GiB) a SageMaker serverless endpoint takes "
            "(https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html)")


# -- the `placement` part of a release config ----------------------------------------------------------------------

def sagemaker_instance_types() -> tuple[str, ...]:
    """The hosting instance types of the installed botocore model (ProductionVariantInstanceType)."""
    return tuple(service_model("sagemaker").shape_for("ProductionVariantInstanceType").enum)


def _hosting_instance_type(instance_type: str) -> str:
    if instance_type not in sagemaker_instance_types():
        raise ValueError(f"{instance_type} is not a SageMaker hosting instance type (botocore "
                         "ProductionVariantInstanceType); pick one from the SageMaker pricing page, e.g. ml.g6.2xlarge")
    return instance_type


InstanceType = Annotated[str, Field(pattern=r"^ml\.[a-z0-9]+\.[a-z0-9]+$"), AfterValidator(_hosting_instance_type)]


class SharedEndpoint(Strict):
    """Where production serves: the model's own endpoint, or a shared one that every model naming it joins as its own
    inference component, with its own gate, rollout, rollback and ledger history (docs/fleet.md)."""

    endpoint: str | None = Field(
        None, pattern=NAME_PATTERN, max_length=32,
        description="the shared production endpoint this model joins (`<resource_prefix>-<endpoint>-<layout id>`); "
        "every model on it names the same placement, since a running endpoint's instances and layout cannot change; "
        "unset: the model's own endpoint")


class InstanceCounts(SharedEndpoint):
    """How many instances production runs, and how many managed instance scaling may add for an update's room."""

    instance_count: int = Field(1, ge=1)
    max_instance_count: int | None = Field(
        None, ge=1,
        description="production's ManagedInstanceScaling.MaxInstanceCount: SageMaker adds instances up to it "
        "when an update needs room beside the serving copies, and removes them after; unset: no managed scaling")
    min_instance_count: int | None = Field(
        None, ge=0, description="ManagedInstanceScaling.MinInstanceCount: 0 lets the endpoint give back every instance "
        "while no component has a copy (scale_to_zero); unset: instance_count")

    @model_validator(mode="after")
    def _scaling_range(self):
        most, least = self.max_instance_count, self.min_instance_count
        if most is not None and most < self.instance_count:
            raise ValueError(f"placement.max_instance_count ({most}) is below placement.instance_count "
                             f"({self.instance_count}); raise it or leave it out")
        if least is not None and most is None:
            raise ValueError("placement.min_instance_count is ManagedInstanceScaling's floor, which needs "
                             "placement.max_instance_count too; set both")
        if least is not None and least > self.instance_count:
            raise ValueError(f"placement.min_instance_count ({least}) is above placement.instance_count "
                             f"({self.instance_count}); lower it or leave it out")
        return self


class PoolEntry(Strict):
    instance_type: InstanceType
    priority: int = Field(ge=1, le=5)


class InstancePoolPlacement(InstanceCounts):
    """Priority fallback over instance types (not load balancing)."""

    kind: Literal["instance_pool"]
    pools: list[PoolEntry] = Field(min_length=1, max_length=5)
    provision_timeout_s: int = Field(1800, ge=300, le=3600)
    inference_ami_version: str | None = None

    @field_validator("pools")
    @classmethod
    def _unique_pools(cls, pools: list[PoolEntry]) -> list[PoolEntry]:
        types = [p.instance_type for p in pools]
        if len(set(types)) != len(types):
            raise ValueError(f"instance types must be unique, got {types}")
        priorities = sorted(p.priority for p in pools)
        if priorities != list(range(1, len(pools) + 1)):
            raise ValueError(f"priorities must be exactly 1..{len(pools)} (1 = tried first), got {priorities}")
        return pools



class MigPartitionPlacement(SharedEndpoint):
    """A MIG layout, which SageMaker applies to every GPU of the instance (the endpoint's AcceleratorPartitionLayouts),
    and this model's partition type in it: `partitions` x `partition_type`, or a mixed `layout` (a list of profiles per
    GPU, e.g. one mig-3g.40gb, one mig-2g.20gb and two mig-1g.10gb) that names this model's type among the others'.
    Each copy takes one partition of its own type, so the model has partitions x GPUs of them."""

    kind: Literal["mig_partition"]
    instance_type: InstanceType
    partition_type: str = Field(pattern=r"^mig-[0-9]+g\.[0-9]+gb",
                                description="this model's AcceleratorPartitionType: one of the layout's profiles")
    partitions: int = Field(1, ge=1, le=7, description="partitions of partition_type per GPU; with a layout, its count "
                            "there (set by the layout, so leave it out)")
    layout: tuple[Annotated[str, Field(pattern=r"^mig-[0-9]+g\.[0-9]+gb")], ...] | None = Field(
        None, min_length=1, max_length=7,
        description="the shared endpoint's profiles on each GPU, the same list in every tenant's config (NVIDIA's "
        "placement rules: tasks/backends/mig_profiles.py); unset: partitions x partition_type")
    inference_ami_version: str | None = None
    min_instance_count: Literal[0] | None = Field(
        None,
        description="0: ManagedInstanceScaling.MinInstanceCount 0 (MaxInstanceCount 1, the endpoint's one instance), "
        "so the endpoint gives its instance back while no component has a copy, as scale_to_zero needs "
        "(https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html); "
        "unset: it keeps it")

    @model_validator(mode="before")
    @classmethod
    def _partitions_from_layout(cls, data):
        """With a layout, `partitions` is the count of this model's type in it (given: it must agree)."""
        if not isinstance(data, dict) or not data.get("layout") or not isinstance(data.get("partition_type"), str):
            return data
        layout, own = list(data["layout"]), data["partition_type"]
        if own not in layout:
            raise ValueError(f"placement.partition_type {own} is not in placement.layout {layout}; name this model's "
                             "profile, one of the layout's")
        given = data.get("partitions")
        if given is not None and given != layout.count(own):
            raise ValueError(f"placement.partitions is {given}, but placement.layout has {layout.count(own)} x {own}; "
                             "leave placement.partitions out (the layout counts them)")
        return {**data, "layout": tuple(layout), "partitions": layout.count(own)}

    @property
    def profiles(self) -> tuple[str, ...]:
        """The profiles SageMaker carves on each GPU: the layout, else `partitions` x `partition_type`."""
        return self.layout or (self.partition_type,) * self.partitions

    @model_validator(mode="after")
    def _layout_fits_one_gpu(self) -> MigPartitionPlacement:
        problem = profiles_problem(self.instance_type, self.profiles)
        if problem:
            raise ValueError(problem)
        # the release config checks the driver for this model's own type; a layout carves the others' too
        others = [p for p in dict.fromkeys(self.profiles) if p != self.partition_type]
        problem = next(filter(None, (driver_problem(self.instance_type, self.inference_ami_version, needs_driver=0,
                                                    what="the layout", partition_type=p) for p in others)), None)
        if problem:
            raise ValueError(problem)
        return self


def endpoint_placement(placement) -> dict:
    """The placement as its shared endpoint sees it (every tenant must give it alike): with a mixed MIG layout, the
    tenant's own partition type and count are left out; unset fields too, so a placement without a layout keeps the
    fields (and the endpoint name, `tasks.pipeline.fleet.layout`) it had before layouts existed."""
    own = {"partition_type", "partitions"} if getattr(placement, "layout", None) is not None else set()
    return placement.model_dump(mode="json", exclude={"endpoint"} | own, exclude_none=True)


class InstanceTypePlacement(InstanceCounts):
    kind: Literal["instance_type"]
    instance_type: InstanceType
    inference_ami_version: str | None = None



class ServerlessPlacement(SharedEndpoint):
    """SageMaker Serverless Inference (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html): no
    instances; SageMaker starts CPU compute of `memory_size_mb` on a request that finds none (a cold start), runs up to
    `max_concurrency` requests at once, and gives the compute back when idle, so idle costs nothing;
    `provisioned_concurrency` keeps that many warm. One model per endpoint: no inference components, so neither a
    shared endpoint nor a rolling update. The gate times `cold_starts` starts from no compute to the first answer."""

    kind: Literal["serverless"]
    memory_size_mb: int = Field(description="ServerlessConfig.MemorySizeInMB: 1024-6144 in steps of 1024; the model's "
                                "weights and working memory must fit it")
    max_concurrency: int = Field(ge=1, le=SERVERLESS_MAX_CONCURRENCY,
                                 description="ServerlessConfig.MaxConcurrency: requests served at once; "
                                             "more are throttled")
    provisioned_concurrency: int | None = Field(None, ge=1, le=SERVERLESS_MAX_CONCURRENCY,
                                                description="ServerlessConfig.ProvisionedConcurrency: requests "
                                                "kept warm (billed while provisioned); unset: none, "
                                                "every start is cold")
    cold_starts: int = Field(3, ge=1, le=20, description="starts from no compute the gate measures on the candidate")
    max_cold_start_p95_s: float = Field(gt=0, le=SERVERLESS_STARTUP_S + 60, allow_inf_nan=False,
                                        description="the gate's bound on the p95 of those starts, each from the first "
                                        "request to its answer")

    @field_validator("memory_size_mb")
    @classmethod
    def _memory_step(cls, value: int) -> int:
        if value not in SERVERLESS_MEMORY_MB:
            raise ValueError(f"placement.memory_size_mb is {value}, but a serverless endpoint takes one of "
                             f"{', '.join(map(str, SERVERLESS_MEMORY_MB))} MB (1 GB steps up to 6 GB)")
        return value

    @model_validator(mode="after")
    def _one_model_within_limits(self) -> ServerlessPlacement:
        if self.endpoint is not None:
            raise ValueError("a serverless endpoint hosts one model and no inference components, so it cannot be the "
                             f"shared endpoint {self.endpoint!r}; leave placement.endpoint out, or use an instance "
                             "placement")
        if self.provisioned_concurrency is not None and self.provisioned_concurrency > self.max_concurrency:
            raise ValueError(f"placement.provisioned_concurrency ({self.provisioned_concurrency}) is above "
                             f"placement.max_concurrency ({self.max_concurrency}); SageMaker needs it at most that")
        return self


Placement = Annotated[
    InstancePoolPlacement | MigPartitionPlacement | InstanceTypePlacement | ServerlessPlacement,
    Field(discriminator="kind"),
]
