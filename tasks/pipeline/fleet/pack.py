"""The packer of a MIG portfolio (`shiplift fleet pack`, docs/fleet.md): the cheapest layout (a priced MIG instance
type, the MIG profiles carved on each of its GPUs, one instance) that holds every model's copies, each update's and
rollback's peak and each `scale_to_zero.max_copies`, each copy on a partition of one profile that holds its memory.

The rules are `fleet plan`'s, counted per profile: a model's copies all take partitions of its own profile (its
component names one AcceleratorPartitionType), so the models on one profile share that profile's partitions, and
their need is every model's most copies plus the largest extra copies one of their updates (or its rollback) starts
(`tasks.backends.capacity.change_room`). A layout applies to every GPU of the instance, so a profile needing n
partitions on g GPUs takes ceil(n / g) on each; the per-GPU multiset must be one NVIDIA places
(`tasks.backends.mig_profiles.valid_layouts`, closed under removing a partition).

Exact, not greedy: a depth-first search over the assignment of models (by name) to the profiles that hold them
(smallest first), pruned where the per-GPU layout is no longer placeable or takes more compute slices than the best so
far, and where a state (models assigned, each profile's counts) was reached before by an earlier branch. It returns the
least of (hourly price, instance type, compute slices per GPU, memory per GPU, partitions, layout), and of the
assignments reaching it the first in that order (tests/unit/test_fleet_pack.py checks it against brute force).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from shiplift.tasks.backends.capacity import change_room
from shiplift.tasks.backends.mig_profiles import MigGpu, MigProfile, gpu_for_instance, valid_layouts
from shiplift.tasks.backends.placement import INFERENCE_AMI_DRIVERS, MemoryEstimate, gpus_per_instance
from shiplift.tasks.backends.pricing import NOMINAL_REGION, PriceTable
from shiplift.tasks.config import ReleaseConfig
from shiplift.tasks.config_errors import validate_file
from shiplift.tasks.config_types import Strict
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families.registry import family_of
from shiplift.tasks.pipeline.fleet.plan import FleetPlan, plan_snapshot
from shiplift.tasks.pipeline.fleet.snapshot import FleetConfig, read_snapshot
from shiplift.tasks.yamlfile import read_yaml_file

NEWEST_AMI = max(INFERENCE_AMI_DRIVERS, key=INFERENCE_AMI_DRIVERS.get)  # a GPU image's newest driver (the DLC's 580)


@dataclass(frozen=True)
class Need:
    """What one model asks of the layout: the memory of one copy (and where that figure comes from), its copies, the
    most its scaling may start, and the peak of its next update or that update's rollback from there, with why."""

    model: str
    memory_mb: int
    memory_from: str  # "build" (its last build in the ledger) or "estimate"
    memory_note: str
    copies: int
    most: int
    peak: int
    why: str

    @property
    def extra(self) -> int:
        """Copies its update (or rollback) starts beside its most copies."""
        return self.peak - self.most

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "memory_mb_per_copy": self.memory_mb, "memory_from": self.memory_from,
                "memory_note": self.memory_note, "copies": self.copies, "max_copies": self.most,
                "update_peak": self.peak, "update": self.why}


@dataclass(frozen=True)
class Offer:
    """An instance type the packer may choose: its MIG GPU, GPUs per instance, hourly price and the per-GPU layouts
    NVIDIA places (every valid multiset, as sorted tuples of profile names)."""

    instance_type: str
    gpus: int
    usd_per_hour: float
    gpu: MigGpu
    layouts: frozenset[tuple[str, ...]]


@dataclass(frozen=True)
class Packing:
    """The cheapest layout found: the offer, the profiles carved on each GPU, and each model's profile (by model)."""

    offer: Offer
    layout: tuple[str, ...]
    profile_of: dict[str, str]

    @property
    def key(self) -> tuple:
        return layout_key(self.offer, self.layout)


def layout_key(offer: Offer, layout: tuple[str, ...]) -> tuple:
    """What the packer minimises, in order: the hourly price, the instance type, then on each GPU the compute slices,
    the memory and the partitions the layout carves, then the layout's names (a fixed order among equals)."""
    profiles = [offer.gpu.profile(name) for name in layout]
    return (offer.usd_per_hour, offer.instance_type, sum(p.slices for p in profiles),
            sum(p.memory_gb for p in profiles), len(layout), layout)


def layout_text(layout: tuple[str, ...]) -> str:
    """`4 x mig-1g.10gb + 2 x mig-1g.20gb`: a per-GPU layout as people read it."""
    return " + ".join(f"{layout.count(name)} x {name}" for name in dict.fromkeys(layout))


def holds(profile: MigProfile, need: Need) -> bool:
    """Whether one partition of `profile` holds one copy of the model (its memory, MiB, within the profile's GB)."""
    return need.memory_mb <= profile.memory_gb * 1024


def group_need(needs: list[Need]) -> int:
    """The partitions the models on one profile need: their copies, and every model at its most copies while the one
    with the largest update (or rollback) starts its extra copies (`fleet plan`'s rule, per profile)."""
    if not needs:
        return 0
    return max(sum(n.copies for n in needs), sum(n.most for n in needs) + max(n.extra for n in needs))


def per_gpu(offer: Offer, partitions: dict[str, int]) -> tuple[str, ...]:
    """The sorted per-GPU layout that gives each profile its partitions: a layout applies to every GPU."""
    return tuple(sorted(name for name, total in partitions.items() for _ in range(math.ceil(total / offer.gpus))))


def search(needs: list[Need], offer: Offer) -> Packing | None:
    """The least layout of `offer` that holds `needs` (see the module's docstring), or None where none does."""
    needs = sorted(needs, key=lambda n: n.model)
    eligible = [[p for p in offer.gpu.profiles if holds(p, need)] for need in needs]
    best: list[Packing] = []
    seen: set[tuple] = set()

    def visit(i: int, groups: dict[str, tuple[int, int, int]], chosen: tuple[str, ...]) -> None:
        state = (i, tuple(sorted(groups.items())))
        if state in seen:  # an earlier branch reached it: its completions are these, and it came first
            return
        seen.add(state)
        layout = per_gpu(offer, {name: max(c, m + e) for name, (c, m, e) in groups.items()})
        if layout and layout not in offer.layouts:
            return
        slices = sum(offer.gpu.profile(name).slices for name in layout)
        if best and slices > best[0].key[2]:
            return
        if i == len(needs):
            found = Packing(offer, layout, {n.model: name for n, name in zip(needs, chosen, strict=True)})
            if not best or found.key < best[0].key:
                best[:] = [found]
            return
        need = needs[i]
        for profile in eligible[i]:
            copies, most, extra = groups.get(profile.name, (0, 0, 0))
            grown = {**groups, profile.name: (copies + need.copies, most + need.most, max(extra, need.extra))}
            visit(i + 1, grown, (*chosen, profile.name))

    visit(0, {}, ())
    return best[0] if best else None


def pack(needs: list[Need], offers: list[Offer]) -> Packing:
    """The cheapest packing of `needs` over `offers` (exact); ConfigError with the arithmetic where a model is larger
    than every offer's largest profile, or no layout of any offer holds the portfolio."""
    if not needs:
        raise ConfigError("nothing to pack", fix="pass the release config of every model of the portfolio")
    if not offers:
        raise ConfigError("no priced MIG instance type to pack onto",
                          fix="add the hourly price of a MIG instance type (ml.p5.*, ml.p4d.*, ml.g7*.*) to the price "
                              "table: `shiplift prices refresh` (docs/cost.md)")
    largest = max((p for offer in offers for p in offer.gpu.profiles), key=lambda p: p.memory_gb)
    too_large = [n for n in needs if not holds(largest, n)]
    if too_large:
        raise ConfigError("; ".join(
            f"{n.model} needs {n.memory_mb} MB a copy ({n.memory_note}), more than the largest MIG profile of any "
            f"priced MIG instance type holds: {largest.name}, {largest.memory_gb} GB = {largest.memory_gb * 1024} MB "
            f"({n.memory_mb - largest.memory_gb * 1024} MB short)" for n in too_large),
            fix="a smaller model (artifact.quantization), a shorter context (image.max_tokens, image.server.ctx_size) "
                "or a smaller batch (image.max_batch), or whole GPUs for it (placement kind instance_pool)")
    best: Packing | None = None
    for offer in sorted(offers, key=lambda o: (o.usd_per_hour, o.instance_type)):
        if best is not None and offer.usd_per_hour > best.offer.usd_per_hour:
            break
        found = search(needs, offer)
        if found is not None and (best is None or found.key < best.key):
            best = found
    if best is None:
        raise ConfigError("no MIG layout holds the portfolio: " + "; ".join(_shortfall(needs, o) for o in offers),
                          fix="fewer copies (rollout.copies, scale_to_zero.max_copies), rolling updates with smaller "
                              "batches (and rollout.rollback_batch), smaller copies, or two endpoints")
    return best


def _shortfall(needs: list[Need], offer: Offer) -> str:
    """Why `offer` holds no layout, as a lower bound: each model's most copies on the smallest profile that holds it,
    plus the smallest extra copies any update starts, against the instance's compute slices."""
    smallest = {n.model: next((p for p in offer.gpu.profiles if holds(p, n)), None) for n in needs}
    unheld = [n.model for n in needs if smallest[n.model] is None]
    if unheld:
        return f"{', '.join(unheld)} fit(s) no profile of {offer.instance_type}'s {offer.gpu.name}"
    terms = [f"{n.model} {n.most} x {smallest[n.model].slices}" for n in needs]
    extra = min(needs, key=lambda n: n.extra * smallest[n.model].slices)
    bound = sum(n.most * smallest[n.model].slices for n in needs) + extra.extra * smallest[extra.model].slices
    capacity = offer.gpus * offer.gpu.compute_slices
    head = (f"on {offer.instance_type} ({offer.gpus} x {offer.gpu.name}) the copies take at least {' + '.join(terms)} "
            f"+ {extra.extra} x {smallest[extra.model].slices} ({extra.model}'s update) = {bound} compute slices")
    if bound > capacity:
        return f"{head}, more than its {capacity}"
    return f"{head} of its {capacity}, but no layout NVIDIA places gives each profile the partitions its models need"


# -- the configs' side: what each model needs, the priced offers, the placement each config needs -------------------


class StatedArtifact(Strict):
    """A model's artifact as a sizes file states it, for a model with no build in the ledger whose artifact is not on
    this machine: the packer estimates its copy from it as its family's build would (weights + KV cache or
    activations + runtime)."""

    artifact_bytes: int = Field(gt=0, description="the model file's size in bytes (GGUF file, ONNX weights)")
    shape: dict[str, int] = Field(description="GGUF: the header's block_count, head_count_kv, key_length (value_length "
                                  "optional); ONNX: the checkpoint's hidden_size and num_hidden_layers")
    source: str = Field(min_length=1, description="where the figures come from")


class Sizes(Strict):
    """A sizes file (`shiplift fleet pack --sizes FILE`): stated artifacts by model name."""

    models: dict[str, StatedArtifact]


def load_sizes(path: str | Path) -> Sizes:
    """The sizes file at `path`; ConfigError naming each problem where it is not one."""
    return validate_file(Sizes, read_yaml_file(Path(path), "sizes file"), str(path), "sizes file")


def estimate(config: ReleaseConfig, config_dir: Path, stated: StatedArtifact | None) -> tuple[MemoryEstimate, str]:
    """One copy's memory estimated as the model's family estimates it at build (`ModelFamily.memory_of`: a GGUF's size
    and header and the context its image holds, or ONNX weights and the activations of its largest batch), from
    `stated` or from the artifact's own file where it is on this machine; and where the figures come from.
    ConfigError where neither is there."""
    artifact, image = config.artifact, config.image
    family = family_of(artifact.kind, image.kind)
    if stated is not None:
        missing = [key for key in family.stated_shape if key not in stated.shape]
        if not family.stated_shape or missing:
            raise ConfigError(f"the sizes file's {config.name} cannot size a {artifact.kind} artifact"
                              + (f": shape lacks {', '.join(missing)}" if missing else ""),
                              fix=f"state {', '.join(family.stated_shape or ('a known artifact kind',))}")
        size, shape, origin = stated.artifact_bytes, stated.shape, f"stated: {stated.source}"
    elif (figures := family.artifact_figures(artifact, config_dir)) is not None:
        size, shape, origin = figures
    else:
        raise ConfigError(f"{config.name} has no build in the ledger and its artifact ({artifact.kind}, "
                          f"{artifact.source.kind} source) is not on this machine to size",
                          fix="build it once, or state its size in a sizes file (--sizes; docs/fleet.md)")
    return family.memory_of(size, shape, image), origin


def offers_of(prices: PriceTable, region: str) -> list[Offer]:
    """Every MIG instance type the price table prices in `region` whose GPUs the MIG and capacity tables know."""
    found = []
    for instance_type, price in sorted(prices.prices.get(region, {}).items()):
        gpu, gpus = gpu_for_instance(instance_type), gpus_per_instance(instance_type)
        if gpu is not None and gpus is not None:
            found.append(Offer(instance_type, gpus, price.usd_per_hour, gpu, frozenset(valid_layouts(instance_type))))
    return found


def need_of(fleet: FleetConfig, memory_mb: int | None, stated: StatedArtifact | None) -> Need:
    """What one model asks of the layout: its config's copies and scaling (what a release or a move starts), the peak
    of its next update or rollback from its most copies, and its copy's memory from its last build (`memory_mb`) or,
    where it has none, estimated (`estimate`)."""
    config = fleet.config
    if not config.image.on_gpu:
        raise ConfigError(f"{fleet.path}: {config.name}'s image runs on the CPU, and a MIG partition serves GPU images",
                          fix=f"put its image on the GPU ({config.image.gpu_fix or 'a GPU image'}), or leave it out of "
                              "the MIG portfolio")
    copies = config.rollout.copies
    most = config.scale_to_zero.plan(copies).max_copies if config.scale_to_zero is not None else copies
    peak, why = change_room(config.rollout, most)
    if memory_mb is not None:
        return Need(config.name, memory_mb, "build", "its last build", copies, most, peak, why)
    found, origin = estimate(config, Path(fleet.path).parent, stated)
    return Need(config.name, found.total_mb, "estimate", f"estimate: {found.describe()}; {origin}", copies, most,
                peak, why)


def placement_for(packing: Packing, model: str, first) -> dict[str, Any]:
    """The placement `model`'s config needs for the packing: every field written, so a config that extends another
    replaces each inherited one; one profile repeated is written as partitions x partition_type (the layout id such a
    fleet had before mixed layouts), several as a layout. `first`: the input's placement, whose shared endpoint, AMI
    and scale-to-zero floor (for a MIG placement) are kept."""
    layout = packing.layout
    own = packing.profile_of[model]
    kept = first if first.kind == "mig_partition" else None
    return {"kind": "mig_partition", "endpoint": first.endpoint, "instance_type": packing.offer.instance_type,
            "partition_type": own, "partitions": layout.count(own),
            "layout": list(layout) if len(set(layout)) > 1 else None,
            "inference_ami_version": kept.inference_ami_version if kept else NEWEST_AMI,
            "min_instance_count": kept.min_instance_count if kept else None}


@dataclass(frozen=True)
class Reason:
    """Why a model got its profile: the smallest that holds a copy, or a larger one because, with it on the smallest,
    the layout would not place or would carve more."""

    model: str
    profile: str
    text: str


def reasons(packing: Packing, needs: list[Need]) -> list[Reason]:
    """Each model's profile and why (see `Reason`)."""
    offer, found = packing.offer, []
    for need in sorted(needs, key=lambda n: n.model):
        own = offer.gpu.profile(packing.profile_of[need.model])
        smaller = [p for p in offer.gpu.profiles if p.memory_gb < own.memory_gb]
        smallest = next(p for p in offer.gpu.profiles if holds(p, need))
        copy = f"a copy needs {need.memory_mb} MB ({need.memory_from})"
        if own.name == smallest.name:
            tighter = f", more than {smaller[-1].name}'s {smaller[-1].memory_gb * 1024} MB" if smaller else ""
            found.append(Reason(need.model, own.name, f"{copy}{tighter}: the smallest profile that holds it"))
            continue
        moved = {**packing.profile_of, need.model: smallest.name}
        alternative = per_gpu(offer, partitions_of(moved, needs))
        if alternative not in offer.layouts:
            why = (f"with it on {smallest.name} each GPU would need {layout_text(alternative)}, which NVIDIA cannot "
                   "place")
        else:
            why = (f"with it on {smallest.name} each GPU would carve {layout_text(alternative)}, "
                   f"{layout_key(offer, alternative)[2]} compute slices against {packing.key[2]}")
        found.append(Reason(need.model, own.name, f"{copy}, which {smallest.name} holds, but {why}"))
    return found


def partitions_of(profile_of: dict[str, str], needs: list[Need]) -> dict[str, int]:
    """The partitions each profile needs on the instance when each model takes `profile_of` its own."""
    groups: dict[str, list[Need]] = {}
    for need in needs:
        groups.setdefault(profile_of[need.model], []).append(need)
    return {name: group_need(group) for name, group in groups.items()}


@dataclass(frozen=True)
class FleetPack:
    """`shiplift fleet pack`'s result: what each model needs, the packing, why each model got its profile, the
    placement each config needs, and `fleet plan` of the configs so placed (each model's share of the bill, the room
    left while the largest update runs; its problems, none where the packer and the plan agree)."""

    needs: tuple[Need, ...]
    packing: Packing
    reasons: tuple[Reason, ...]
    placements: dict[str, dict[str, Any]]
    configs: dict[str, str]  # model -> the config it was packed from
    plan: FleetPlan

    def left(self) -> dict[str, Any]:
        """What the layout leaves: each GPU's compute slices and memory no partition takes, and per profile the
        partitions beyond the copies serving and beyond the largest update's peak."""
        offer, layout = self.packing.offer, self.packing.layout
        needed = partitions_of(self.packing.profile_of, list(self.needs))
        profiles = {}
        for name in sorted(set(layout), key=lambda n: offer.gpu.profiles.index(offer.gpu.profile(n))):
            total = layout.count(name) * offer.gpus
            steady = sum(n.copies for n in self.needs if self.packing.profile_of[n.model] == name)
            profiles[name] = {"partitions": total, "copies": steady, "peak": needed[name],
                              "idle": total - steady, "spare_at_peak": total - needed[name]}
        return {"slices_per_gpu": offer.gpu.compute_slices - self.packing.key[2],
                "memory_gb_per_gpu": offer.gpu.memory_gb - self.packing.key[3], "profiles": profiles}

    def as_dict(self) -> dict[str, Any]:
        offer = self.packing.offer
        shares = {t.model: t.share.as_dict() for t in self.plan.tenants}
        why = {r.model: r.text for r in self.reasons}
        return {"instance_type": offer.instance_type, "gpus": offer.gpus, "gpu": offer.gpu.name,
                "instances": 1, "layout_per_gpu": list(self.packing.layout), "endpoint": self.plan.endpoint,
                "bill": self.plan.bill.as_dict(), "left": self.left(), "idle_usd_per_hour": self.plan.idle_usd_per_hour,
                "models": [{**need.as_dict(), "config": self.configs[need.model],
                            "profile": self.packing.profile_of[need.model], "why": why[need.model],
                            "share": shares[need.model], "placement": self.placements[need.model]}
                           for need in self.needs],
                "plan_problems": list(self.plan.problems)}


def pack_fleet(configs: tuple[FleetConfig, ...], *, ledger=None, prices: PriceTable | None = None,
               sizes: Sizes | None = None) -> FleetPack:
    """The cheapest MIG layout for the models of `configs` (`load_fleet_configs(..., placed=False)`: their
    placements are what the packer chooses, so they may differ), each copy's memory from its last build in `ledger` or
    estimated (from `sizes`, else a GGUF at a local path), and `fleet plan` of the configs so placed. Reads, changes
    nothing."""
    stated = sizes.models if sizes is not None else {}  # one file may size several portfolios' models
    snapshot = read_snapshot(configs, ledger=ledger, prices=prices)
    first = configs[0].config
    region = first.backend.region if first.backend.kind == "aws" else NOMINAL_REGION
    needs = [need_of(fleet, snapshot.memory_mb(fleet.name), stated.get(fleet.name)) for fleet in configs]
    packing = pack(needs, offers_of(snapshot.prices, region))
    placements = {fleet.name: placement_for(packing, fleet.name, first.placement) for fleet in configs}
    packed = tuple(FleetConfig(fleet.path, ReleaseConfig.model_validate(
        {**fleet.config.model_dump(mode="json"), "placement": placements[fleet.name]})) for fleet in configs)
    return FleetPack(tuple(needs), packing, tuple(reasons(packing, needs)), placements,
                     {fleet.name: fleet.path for fleet in configs}, plan_snapshot(replace(snapshot, configs=packed)))


def write_placements(result: FleetPack, out_dir: str | Path) -> list[Path]:
    """Write, per model, `<out_dir>/<model>.yaml`: its packed config, which extends the config it was packed from and
    sets the placement the packing gives it. Never over a config packed from, nor over an existing file."""
    out = Path(out_dir)
    targets = {model: out / f"{model}.yaml" for model in result.placements}
    sources = {Path(path).resolve() for path in result.configs.values()}
    taken = [str(path) for path in targets.values() if path.resolve() in sources or path.exists()]
    if taken:
        raise ConfigError(f"--write would replace {', '.join(taken)}",
                          fix="write the packed configs to a new folder; a config packed from is never overwritten")
    out.mkdir(parents=True, exist_ok=True)
    for model, path in targets.items():
        source = os.path.relpath(Path(result.configs[model]).resolve(), out.resolve())
        path.write_text(f"# `shiplift fleet pack`: {model} on {layout_text(result.packing.layout)} per GPU of "
                        f"{result.packing.offer.instance_type}\n"
                        + yaml.safe_dump({"extends": source, "placement": result.placements[model]}, sort_keys=False),
                        encoding="utf-8")
    return list(targets.values())
