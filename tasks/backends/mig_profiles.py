"""NVIDIA's MIG placement rules as data: per GPU that SageMaker partitions, the profiles SageMaker offers (compute
slices, memory, most instances) and the memory slices each may start at, so a layout of mixed profiles is checked by
exact placement, as the GPU places it, not only by sums (docs/fleet.md, "Mixed MIG layouts").

A GPU instance occupies `span` consecutive memory slices from one of its profile's start slots, and two instances may
not share a memory slice ("A created GPU instance occupies memory slices described by its placement. Creation of new
GPU instance will fail if there is overlap with the already occupied memory slices": NVML,
nvmlDeviceGetGpuInstancePossiblePlacements_v2). The start slots are those `nvidia-smi mig -lgipp` prints and the MIG
user guide's "Supported MIG Profiles" figures draw. SageMaker supports no `+me`/`+gfx` profiles
(inference-components-accelerator-partitioning-create), so the tables hold none.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import cache
from typing import NamedTuple

NVIDIA_PROFILES = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"
NVIDIA_GPUS = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html"
NVIDIA_BLACKWELL_VGPU = "https://docs.nvidia.com/ai-enterprise/release-8/latest/infra-software/vgpu/reference/blackwell.html"
NVML_PLACEMENTS = ("https://docs.nvidia.com/deploy/nvml-api/group__nvmlMultiInstanceGPU.html "
                   "(nvmlDeviceGetGpuInstancePossiblePlacements_v2)")
SAGEMAKER_LAYOUT = "https://docs.aws.amazon.com/sagemaker/latest/dg/inference-components-accelerator-partitioning-create.html"
PROFILE_NAME = re.compile(r"^mig-([0-9]+)g\.([0-9]+)gb")
SAGEMAKER_API = "https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_AcceleratorPartitionLayout.html"


class MigProfile(NamedTuple):
    """One MIG profile of one GPU: `name` as SageMaker spells it (`mig-3g.40gb`), its compute slices and memory, the
    most instances one GPU holds, and where it may sit (first memory slice, slices occupied)."""

    name: str
    slices: int
    memory_gb: int
    max_instances: int
    starts: tuple[int, ...]
    span: int
    source: str


class MigGpu(NamedTuple):
    """One GPU that SageMaker partitions with MIG: its memory, compute slices (also the most partitions: a layout's
    `Ng` sum must fit them), memory slices and profiles."""

    name: str
    memory_gb: int
    compute_slices: int
    profiles: tuple[MigProfile, ...] = ()
    memory_slices: int = 8
    source: str = NVIDIA_GPUS

    def profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.profiles if p.name == name), None)


def _seven_slice(names: tuple[str, str, str, str, str, str], source: str) -> tuple[MigProfile, ...]:
    """The A100/H100 geometry: 7 compute and 8 memory slices, one row per profile of the guide's table (names from the
    smallest to the whole GPU: 1g one slice, 1g two slices, 2g, 3g, 4g, 7g)."""
    one, one_wide, two, three, four, seven = names
    gb = [int(n.rsplit(".", 1)[1][:-2]) for n in names]
    return (MigProfile(one, 1, gb[0], 7, (0, 1, 2, 3, 4, 5, 6), 1, source),
            MigProfile(one_wide, 1, gb[1], 4, (0, 2, 4, 6), 2, source),
            MigProfile(two, 2, gb[2], 3, (0, 2, 4), 2, source),
            MigProfile(three, 3, gb[3], 2, (0, 4), 4, source),
            MigProfile(four, 4, gb[4], 1, (0,), 4, source),
            MigProfile(seven, 7, gb[5], 1, (0,), 8, source))


# The A100-SXM4-40GB of P4d and the H100-SXM5-80GB of P5: NVIDIA's "A100 MIG Profiles" / "H100 MIG Profiles" tables
# (fraction of memory in eighths, fraction of SMs in sevenths, instances available) and their placement figures; the
# names are those SageMaker lists for ml.p4d / ml.p5 (SAGEMAKER_LAYOUT, "GPU partition types").
A100_40GB = MigGpu("A100 40 GB", 40, 7, _seven_slice(
    ("mig-1g.5gb", "mig-1g.10gb", "mig-2g.10gb", "mig-3g.20gb", "mig-4g.20gb", "mig-7g.40gb"),
    f"{NVIDIA_PROFILES}#a100-mig-profiles"))
H100_80GB = MigGpu("H100 80 GB", 80, 7, _seven_slice(
    ("mig-1g.10gb", "mig-1g.20gb", "mig-2g.20gb", "mig-3g.40gb", "mig-4g.40gb", "mig-7g.80gb"),
    f"{NVIDIA_PROFILES}#h100-mig-profiles"))
# The Blackwell RTX PRO GPUs: NVIDIA_GPUS gives RTX PRO 6000 Blackwell Server Edition (G7e) 96 GB and at most 4
# instances, RTX PRO 4500 Blackwell (G7) 32 GB and at most 2; their profiles split compute and memory in equal
# quarters (halves): 1g.24gb x4, 2g.48gb x2, 4g.96gb x1 on the 6000, 1g.16gb x2, 2g.32gb x1 on the 4500
# (NVIDIA_PROFILES, "RTX PRO 6000 Blackwell" / "RTX PRO 4500 Blackwell"; NVIDIA_BLACKWELL_VGPU's MIG-backed types).
RTX_PRO_6000 = MigGpu("RTX PRO 6000 96 GB", 96, 4, (
    MigProfile("mig-1g.24gb", 1, 24, 4, (0, 1, 2, 3), 1, f"{NVIDIA_PROFILES}#rtx-pro-6000-blackwell-mig-profiles"),
    MigProfile("mig-2g.48gb", 2, 48, 2, (0, 2), 2, f"{NVIDIA_PROFILES}#rtx-pro-6000-blackwell-mig-profiles"),
    MigProfile("mig-4g.96gb", 4, 96, 1, (0,), 4, f"{NVIDIA_PROFILES}#rtx-pro-6000-blackwell-mig-profiles"),
), memory_slices=4)
RTX_PRO_4500 = MigGpu("RTX PRO 4500 32 GB", 32, 2, (
    MigProfile("mig-1g.16gb", 1, 16, 2, (0, 1), 1, NVIDIA_BLACKWELL_VGPU),
    MigProfile("mig-2g.32gb", 2, 32, 1, (0,), 2, NVIDIA_BLACKWELL_VGPU),
), memory_slices=2)

# Which GPU each SageMaker instance family partitions (SAGEMAKER_LAYOUT: MIG on P4d, P5, G7 and G7e).
MIG_GPUS: dict[str, MigGpu] = {"p4d": A100_40GB, "p5": H100_80GB, "g7": RTX_PRO_4500, "g7e": RTX_PRO_6000}


def gpu_for_instance(instance_type: str) -> MigGpu | None:
    """The MIG GPU of `ml.<family>.<size>`, or None where SageMaker partitions no GPU of that family."""
    parts = instance_type.split(".")
    return MIG_GPUS.get(parts[1]) if len(parts) >= 3 else None


def _mask(profile: MigProfile, start: int) -> int:
    """The memory slices a profile occupies from `start`, as bits."""
    return ((1 << profile.span) - 1) << start


def _placements(gpu: MigGpu, profiles: Sequence[MigProfile]) -> tuple[int, ...] | None:
    """Start slots that place every profile on the GPU without two sharing a memory slice, or None. Exact: a
    backtracking search, the widest first (at most 7 instances over 8 slots)."""
    order = sorted(range(len(profiles)), key=lambda i: -profiles[i].span)
    starts = [0] * len(profiles)

    def place(k: int, used: int) -> bool:
        if k == len(order):
            return True
        profile = profiles[order[k]]
        for start in profile.starts:
            mask = _mask(profile, start)
            if not used & mask:
                starts[order[k]] = start
                if place(k + 1, used | mask):
                    return True
        return False

    return tuple(starts) if place(0, 0) else None


def _names(profiles: Sequence[str]) -> str:
    return " + ".join(f"{count} x {name}" for name, count in Counter(profiles).items())


def _size(name: str) -> tuple[int, int] | None:
    """(compute slices, GB) that a profile's name states (`mig-3g.40gb` -> (3, 40)), or None for another name."""
    match = PROFILE_NAME.match(name)
    return (int(match[1]), int(match[2])) if match else None


def layout_problem(instance_type: str, profiles: Sequence[str]) -> str | None:
    """Why these profiles cannot all be carved on ONE GPU of `instance_type` by NVIDIA's placement rules, or None.
    Checked in the order a reader can act on: the sums of compute slices and memory, each profile exists on that GPU,
    then exact start slots (which also bound each profile's instances: `max_instances` is NVIDIA's count of them)."""
    gpu = gpu_for_instance(instance_type)
    if gpu is None:
        return (f"instance_type {instance_type}: SageMaker MIG partitions are known for "
                f"{', '.join(f'ml.{f}.*' for f in MIG_GPUS)}; pick one of those families")
    if not profiles:
        return f"the layout for {instance_type} names no MIG profile; list at least one, e.g. {gpu.profiles[0].name}"
    sizes = [_size(name) for name in profiles]
    if None in sizes:
        odd = ", ".join(name for name, size in zip(profiles, sizes, strict=True) if size is None)
        return f"{odd}: not a MIG profile such as {gpu.profiles[0].name}"
    slices, memory = sum(size[0] for size in sizes), sum(size[1] for size in sizes)
    if slices > gpu.compute_slices or memory > gpu.memory_gb:
        return (f"{_names(profiles)} needs {slices} compute slices and {memory} GB, but one {gpu.name} GPU of "
                f"{instance_type} has {gpu.compute_slices} slices and {gpu.memory_gb} GB; "
                "use fewer or smaller partitions")
    unknown = sorted({name for name in profiles if gpu.profile(name) is None})
    if unknown:
        verb = "is not a MIG profile" if len(unknown) == 1 else "are not MIG profiles"
        return (f"{', '.join(unknown)} {verb} of the {gpu.name} GPU of {instance_type}; "
                f"use one of {', '.join(p.name for p in gpu.profiles)}")
    known = [gpu.profile(name) for name in profiles]
    if _placements(gpu, known) is None:
        slots = "; ".join(f"{p.name} starts at memory slice {'/'.join(map(str, p.starts))} and spans {p.span}"
                          for p in sorted(set(known), key=lambda p: -p.span))
        return (f"{_names(profiles)} fits the sums ({slices} of {gpu.compute_slices} compute slices, {memory} of "
                f"{gpu.memory_gb} GB) but cannot be placed on one {gpu.name} GPU of {instance_type} "
                f"({gpu.memory_slices} memory slices): {slots}, and no choice of start slots keeps them apart "
                f"({NVIDIA_PROFILES}); drop a partition or pick one of tasks.backends.mig_profiles.valid_layouts")
    return None


def placement_of(instance_type: str, profiles: Sequence[str]) -> tuple[int, ...] | None:
    """The first memory slice of each profile in one valid placement on a GPU of `instance_type`, or None."""
    gpu = gpu_for_instance(instance_type)
    if gpu is None or layout_problem(instance_type, profiles):
        return None
    return _placements(gpu, [gpu.profile(name) for name in profiles])


@cache
def _valid_layouts(gpu: MigGpu) -> tuple[tuple[str, ...], ...]:
    """Every set of placements with no shared memory slice, as sorted names, within the compute slices and memory."""
    found: set[tuple[str, ...]] = set()

    def grow(used: int, chosen: tuple[str, ...], candidates: list[tuple[MigProfile, int]]) -> None:
        if chosen:
            found.add(tuple(sorted(chosen)))
        for i, (profile, start) in enumerate(candidates):
            mask = _mask(profile, start)
            if not used & mask:
                grow(used | mask, (*chosen, profile.name), candidates[i + 1:])

    grow(0, (), [(p, s) for p in gpu.profiles for s in p.starts])
    return tuple(sorted(layout for layout in found
                        if sum(gpu.profile(n).slices for n in layout) <= gpu.compute_slices
                        and sum(gpu.profile(n).memory_gb for n in layout) <= gpu.memory_gb))


def valid_layouts(instance_type: str) -> list[tuple[str, ...]]:
    """Every non-empty multiset of profiles that one GPU of `instance_type` can hold at once (maximal or not), each a
    sorted tuple of names, enumerated from the start slots; [] where SageMaker partitions no GPU of that type."""
    gpu = gpu_for_instance(instance_type)
    return [] if gpu is None else list(_valid_layouts(gpu))


__all__ = ["MIG_GPUS", "MigGpu", "MigProfile", "gpu_for_instance", "layout_problem", "placement_of", "valid_layouts"]
