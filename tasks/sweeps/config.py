"""A sweep config (`configs/sweeps/<name>.yaml`, docs/sweeps.md) and the candidates it names.

A sweep varies one base release config along up to three axes: the source model (`artifact.source`), the quantization
(a family's own values: GGUF types, fp32/int8 for ONNX; `ModelFamily.quantization_overrides`) and the placement. The
candidates are the axes' product or an explicit list. Each candidate is an ordinary release config: the base loaded by
`load_release_config` with the candidate's values as `--set` overrides, so it gets the same validation and the same
content-derived release id, and two candidates that build the same artifact share the build. The sweep compares the
candidates on its own `datasets`, which must share no task with the base's gate (its datasets, its reserve, the
calibration set it fits a temperature on): the pick's gate against the champion then runs on tasks it was not chosen on.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from shiplift.tasks.config import load_release_config, require_named_files
from shiplift.tasks.config_errors import validate_file
from shiplift.tasks.config_release import ReleaseConfig
from shiplift.tasks.config_types import NAME_PATTERN, DatasetRef, Strict
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.hashing import sha256_json
from shiplift.tasks.ledger.sweep_records import SWEEP_ID_PREFIX
from shiplift.tasks.pipeline.release import release_id_for
from shiplift.tasks.yamlfile import read_yaml_file
from shiplift.validation.sweep_rule import SelectionRule

AXES = ("source", "quantization", "placement")
AXIS_FIELDS = {"source": "artifact.source", "placement": "placement"}  # quantization: the family's fields
MAX_CANDIDATES = 64
MAX_PARALLEL = 16  # candidates evaluated at once, at most


class CandidateChoice(Strict):
    """One candidate of an explicit list: the axis values it sets; an axis it leaves out keeps the base's value
    (`quantization: null` is a value: a GGUF source as it is)."""

    source: dict[str, Any] | None = None
    quantization: str | None = None
    placement: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _mappings_not_null(self) -> CandidateChoice:
        for axis in ("source", "placement"):
            if axis in self.model_fields_set and getattr(self, axis) is None:
                raise ValueError(f"{axis}: null names no {axis}; leave {axis} out to keep the base config's")
        return self

    def values(self) -> dict[str, Any]:
        """The axis values this candidate sets, in AXES order."""
        return {axis: getattr(self, axis) for axis in AXES if axis in self.model_fields_set}


class SweepAxes(Strict):
    """`axes`: the values each varied axis takes (an axis left out keeps the base's value)."""

    source: list[dict[str, Any]] | None = Field(None, min_length=1, description="artifact.source mappings")
    quantization: list[str | None] | None = Field(None, min_length=1, description="the family's quantization values")
    placement: list[dict[str, Any]] | None = Field(None, min_length=1, description="placement mappings")

    def product(self) -> list[dict[str, Any]]:
        """Every combination of the listed values, as {axis: value}."""
        listed = [(axis, values) for axis in AXES if (values := getattr(self, axis)) is not None]
        return [dict(zip([axis for axis, _ in listed], combo, strict=True))
                for combo in itertools.product(*(values for _, values in listed))]


class SweepConfig(Strict):
    """A sweep: the base release config (a path relative to the sweep file), the candidates, the tasks they are
    compared on, the rule that picks one (written before any result), and the most its candidates may cost per hour
    while they run at once."""

    name: str = Field(pattern=NAME_PATTERN, max_length=40)
    description: str = ""
    base: str = Field(min_length=1)
    axes: SweepAxes | None = None
    candidates: Literal["product"] | list[CandidateChoice] = "product"
    datasets: list[DatasetRef] = Field(min_length=1)
    rule: SelectionRule
    max_usd_per_hour: float = Field(gt=0, allow_inf_nan=False)
    parallel: int = Field(1, ge=1, le=MAX_PARALLEL, description="candidates evaluated at once: `sweep run`'s default "
                          "--parallel, the Airflow pool's slots, the Step Functions Map state's MaxConcurrency")

    @model_validator(mode="after")
    def _candidates_named_once(self) -> SweepConfig:
        if self.candidates == "product":
            if self.axes is None or not any(getattr(self.axes, axis) for axis in AXES):
                raise ValueError(f"candidates: product needs axes naming at least one of {', '.join(AXES)}; "
                                 "or list the candidates")
        elif self.axes is not None:
            raise ValueError("axes and a list of candidates both name candidates; keep one (candidates: product "
                             "takes every combination of the axes)")
        return self

    def choices(self) -> list[dict[str, Any]]:
        """Every candidate as {axis: value}."""
        return self.axes.product() if self.candidates == "product" else [c.values() for c in self.candidates]


@dataclass(frozen=True)
class Candidate:
    """One candidate: its name in the sweep, the axis values it sets, the `--set` overrides that make its release
    config from the base (what the pick is released with), and its config as the sweep gates it (the base's with these
    overrides and the sweep's datasets)."""

    name: str
    values: dict[str, Any]
    overrides: tuple[str, ...]
    config: ReleaseConfig

    @property
    def config_sha256(self) -> str:
        return self.config.config_hash()

    @property
    def release_id(self) -> str:
        return release_id_for(self.config)


@dataclass(frozen=True)
class Sweep:
    """A loaded sweep: its config and file, its base release config and file, and its candidates."""

    path: Path
    config: SweepConfig
    base_path: Path
    base: ReleaseConfig
    candidates: tuple[Candidate, ...]
    sweep_overrides: tuple[str, ...]  # what every candidate adds to its own overrides: the sweep's datasets

    @property
    def sweep_id(self) -> str:
        """Derived from the sweep's name and its candidates' configs, not from the rule: a changed rule reopens the
        same sweep, which refuses it (a changed rule is a new sweep, under a new name)."""
        content = sha256_json(sorted(c.config_sha256 for c in self.candidates))
        return f"{SWEEP_ID_PREFIX}{self.config.name}-{content[:12]}"

    def candidate(self, name: str) -> Candidate:
        return next(c for c in self.candidates if c.name == name)


def override(key: str, value: Any) -> str:
    """A `--set` override of `key` to `value` (JSON is YAML, so it parses back to the same value)."""
    return f"{key}={json.dumps(value, sort_keys=True)}"


def read_sweep_config(path: Path) -> SweepConfig:
    """Read and validate a sweep file; ConfigError naming the file, each field and its fix."""
    if not path.is_file():
        raise ConfigError(f"sweep config {path} does not exist", fix="pass a file under configs/sweeps/")
    tree = read_yaml_file(path, "sweep config")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(tree).__name__}",
                          fix="see configs/sweeps/gemma-decision-quant.yaml")
    _refuse_unknown_keys(path, tree)
    return validate_file(SweepConfig, tree, str(path), "sweep config")


def _refuse_unknown_keys(path: Path, tree: dict) -> None:
    """ConfigError naming a key the sweep does not have, at the top or among the axes, and the closest one."""
    axes = tree.get("axes")
    levels = [("", tree, SweepConfig.model_fields), ("axes.", axes if isinstance(axes, dict) else {}, AXES)]
    for prefix, level, known in levels:
        for key in level:
            if key not in known:
                close = difflib.get_close_matches(str(key), list(known), n=1)
                what = "a sweep varies only " + ", ".join(AXES) if prefix else "the keys are " + ", ".join(known)
                raise ConfigError(f"{path}: {prefix}{key}: unknown key ({what})",
                                  fix=f"rename it to {prefix}{close[0]}" if close else f"remove {prefix}{key}")


def load_sweep(path: str | Path) -> Sweep:
    """The sweep a file names, its base and every candidate loaded and checked; ConfigError for a sweep that cannot
    run as written (a missing base or file, an axis the family lacks, tasks shared with the base's gate, candidates
    that are one config, too few or too many)."""
    path = Path(path)
    config = read_sweep_config(path)
    base_path = (path.parent / config.base).resolve()
    base = load_release_config(base_path)
    require_named_files(base, base_path)
    datasets = [_relative_to(ref, path.parent, base_path.parent) for ref in config.datasets]
    _refuse_shared_tasks(path, base, base_path.parent, datasets)
    sweep_overrides = (override("validation.datasets", [ref.model_dump(mode="json", exclude_none=True)
                                                        for ref in datasets]), *_gate_only_overrides(base))
    candidates = []
    for values in config.choices():
        overrides = tuple(o for axis, value in values.items() for o in _axis_overrides(path, base, axis, value))
        try:
            candidate_config = load_release_config(base_path, overrides=overrides + sweep_overrides)
            require_named_files(candidate_config, base_path)  # a source the axis names, say
        except ConfigError as exc:
            raise ConfigError(f"{path}: candidate {values} is not a valid release config of {base_path.name}: "
                              f"{exc.problem}", fix=exc.fix) from exc
        candidates.append((values, overrides, candidate_config))
    return Sweep(path=path, config=config, base_path=base_path, base=base,
                 candidates=tuple(_named(path, candidates)), sweep_overrides=sweep_overrides)


def _relative_to(ref: DatasetRef, sweep_dir: Path, base_dir: Path) -> DatasetRef:
    """A sweep dataset as the candidate configs name it: relative to the base config's folder (a relative path in the
    sweep file is read from the sweep's folder), so the candidates' release ids do not depend on the checkout's
    location; `builtin:` and absolute paths as written."""
    if ref.path.startswith("builtin:") or Path(ref.path).is_absolute():
        return ref
    return ref.model_copy(update={"path": os.path.relpath((sweep_dir / ref.path).resolve(), base_dir)})


def _gate_only_overrides(base: ReleaseConfig) -> tuple[str, ...]:
    """What a candidate gated on the sweep's tasks leaves out of the base: extending an inconclusive check onto the
    base's reserve (tasks held out for the pick's own gate) and an online gate (a candidate never rolls out, and its
    split is one of the base's datasets)."""
    found = []
    if base.validation.inconclusive.choice != "block":
        found.append(override("validation.inconclusive", {"choice": "block"}))
    if getattr(base.rollout, "online_gate", None) is not None:
        found.append(override("rollout.online_gate", None))
    return tuple(found)


def _axis_overrides(path: Path, base: ReleaseConfig, axis: str, value: Any) -> list[str]:
    """The `--set` overrides one axis value makes; ConfigError for a quantization the family does not sweep."""
    if axis in AXIS_FIELDS:
        return [override(AXIS_FIELDS[axis], value)]
    family = base.family
    if not family.sweep_quantizations:
        raise ConfigError(f"{path}: axes.quantization: {type(family).__name__} ({base.artifact.kind} on "
                          f"{base.image.kind}) has no quantization axis",
                          fix="leave quantization out of the sweep, and vary the source or the placement")
    if value not in family.sweep_quantizations:
        known = ", ".join("null (the source as it is)" if v is None else v for v in family.sweep_quantizations)
        raise ConfigError(f"{path}: quantization {value!r} is not one {type(family).__name__} can build",
                          fix=f"use one of {known}")
    return [override(key, setting) for key, setting in family.quantization_overrides(value).items()]


def _gate_refs(base: ReleaseConfig) -> list[tuple[str, DatasetRef]]:
    """Every dataset the base's own release reads tasks from to decide: its gate, its reserve, and its calibration set
    when it fits a temperature there."""
    refs = [(f"validation.datasets[{i}]", ref) for i, ref in enumerate(base.validation.datasets)]
    extend = base.validation.inconclusive.extend
    refs += [(f"validation.inconclusive.extend.datasets[{i}]", ref)
             for i, ref in enumerate(extend.datasets if extend else [])]
    if base.calibration.fit_temperature:
        refs.append(("calibration.dataset", base.calibration.dataset))
    return refs


def _refuse_shared_tasks(path: Path, base: ReleaseConfig, base_dir: Path, datasets: list[DatasetRef]) -> None:
    """ConfigError when a task the sweep compares candidates on is one the base's release decides on: the same
    request, whatever file it sits in (the family's own request bodies are compared)."""
    family, validation = base.family, base.validation

    def bodies(ref: DatasetRef) -> set[bytes]:
        return set(family.invocation_bodies(validation, [(ref.resolve(base_dir), ref.splits)]))

    shared = []
    for i, ref in enumerate(datasets):
        mine = bodies(ref)
        if not mine:
            raise ConfigError(f"{path}: datasets[{i}] ({ref.path}, splits {ref.splits}) holds no task",
                              fix="name a file and splits that hold the tasks to compare the candidates on")
        for where, theirs in _gate_refs(base):
            common = len(mine & bodies(theirs))
            if common:
                shared.append(f"datasets[{i}] ({ref.path} {ref.splits or 'all splits'}) shares {common} of its "
                              f"{len(mine)} tasks with the base's {where} ({theirs.path} "
                              f"{theirs.splits or 'all splits'})")
    if shared:
        raise ConfigError(f"{path}: the sweep must compare candidates on tasks the pick's own gate never reads, but "
                          + "; ".join(shared),
                          fix="name another split or file for the sweep (e.g. the calibration split when the base "
                              "fits no temperature), or hold a split out of the base's gate")


def _placement_label(config: ReleaseConfig) -> str:
    placement = config.placement
    if placement.kind == "instance_pool":
        return "pool-" + "-".join(p.instance_type for p in sorted(placement.pools, key=lambda p: p.priority))
    if placement.kind == "mig_partition":
        return f"{placement.instance_type}-{placement.partition_type}x{placement.partitions}"
    if placement.kind == "serverless":
        return f"serverless-{placement.memory_size_mb}mb"
    return placement.instance_type


def _label(axis: str, value: Any, config: ReleaseConfig) -> str:
    """A short name for one axis value of a candidate."""
    if axis == "quantization":
        return "as-source" if value is None else str(value)
    if axis == "placement":
        return _placement_label(config)
    source = config.artifact.source
    path = getattr(source, "path", None)
    named = (getattr(source, "package", None) or getattr(source, "file", None) or getattr(source, "repo", None)
             or (Path(path).name if isinstance(path, str) else None))
    return f"{source.kind}-{named or getattr(source, 'sha256', None) or 'source'}"[:40]


def _named(path: Path, loaded: list[tuple[dict, tuple[str, ...], ReleaseConfig]]) -> list[Candidate]:
    """The candidates, each named by its values on the axes that vary (its config hash added where two names meet);
    ConfigError for two that are one config, for fewer than two, or for more than MAX_CANDIDATES."""
    if not 2 <= len(loaded) <= MAX_CANDIDATES:
        raise ConfigError(f"{path}: the sweep names {len(loaded)} candidates; a sweep compares 2 to {MAX_CANDIDATES}",
                          fix="add axis values or candidates" if len(loaded) < 2 else "split it into smaller sweeps")
    hashes: dict[str, dict] = {}
    for values, _, config in loaded:
        first = hashes.setdefault(config.config_hash(), values)
        if first is not values:
            raise ConfigError(f"{path}: candidates {first} and {values} are the same release config",
                              fix="remove one of them")
    varied = [axis for axis in AXES if len({json.dumps(v.get(axis, "<base>"), sort_keys=True)
                                            for v, _, _ in loaded}) > 1]
    names = ["-".join(_label(axis, values.get(axis), config) for axis in varied if axis in values) or "base"
             for values, _, config in loaded]
    return [Candidate(name=name if names.count(name) == 1 else f"{name}-{config.config_hash()[:8]}", values=values,
                      overrides=overrides, config=config)
            for name, (values, overrides, config) in zip(names, loaded, strict=True)]
