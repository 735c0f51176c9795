"""The toy third family: a JSON "model" that says whether a number is even, served by its own image (`images/toy/`) and
gated by its own validation package (`parity_gate`).

Config: `artifact.kind: toy` (a seed and the sha256 the model it writes must have), `image.kind: toy` (built from
`images/toy/Dockerfile`, `TOY_*` variables), `validation.kind: parity` (numbers files). It borrows no other family's
step: it is what a new family with its own image and gate has to write, and all it has to write.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from shiplift.tasks.artifacts.packaging import package_model_dir
from shiplift.tasks.backends.placement import CPU_RUNTIME_OVERHEAD_MB, MIB, MemoryEstimate
from shiplift.tasks.config_types import Sha256
from shiplift.tasks.errors import IntegrityError
from shiplift.tasks.families.base import (
    ArtifactConfig,
    BuiltImageConfig,
    BuiltModel,
    GateConfig,
    ModelFamily,
    recorded_fields,
)
from shiplift.tasks.hashing import sha256_file
from shiplift.validation.evaluate import GateOutcome
from shiplift.validation.thresholds import DecisionThresholds
from tests.e2e.third_family.parity_gate.parity import body, evaluate_parity, load_numbers

MODEL_FILE = "toy-model.json"  # what images/toy/server.py loads from TOY_MODEL_DIR


class ToyArtifact(ArtifactConfig):
    """A toy model the family writes from a seed; the config pins what it must come out as."""

    kind: Literal["toy"]
    seed: int = Field(ge=0)
    sha256: Sha256


class ToyImage(BuiltImageConfig):
    """The toy server (`images/toy/`): CPU only, its limits as TOY_* variables."""

    kind: Literal["toy"]
    max_in_flight: int = Field(4, ge=1, le=1024)

    @property
    def on_gpu(self) -> bool:
        return False

    def container_env(self, *, cpu_only: bool = False) -> dict[str, str]:
        return {"TOY_MAX_IN_FLIGHT": str(self.max_in_flight)}


class ParityGateConfig(GateConfig):
    """The toy gate (`kind: parity`): numbers files, judged by the shared decision thresholds."""

    kind: Literal["parity"]
    thresholds: DecisionThresholds


def write_toy_model(path: Path, seed: int) -> Path:
    """The toy model of `seed`: how sure it is of each answer (between 0.6 and 0.95)."""
    path.write_text(json.dumps({"seed": seed, "confidence": 0.6 + (seed % 8) * 0.05}, sort_keys=True) + "\n")
    return path


class ToyFamily(ModelFamily):
    """Every step a family has to define, each the toy's own; `steps` records which ran, in order."""

    artifact_kind = "toy"
    artifact_model = ToyArtifact
    image_model = ToyImage
    validation_model = ParityGateConfig
    env_prefix = "TOY"
    temperature_scaling: ClassVar[bool] = False

    def __init__(self):
        self.steps: list[str] = []

    def resolve(self, ctx, cache: Path):
        self.steps.append("resolve")
        artifact = ctx.config.artifact
        path = write_toy_model(cache / f"toy-{artifact.seed}.json", artifact.seed)
        if sha256_file(path) != artifact.sha256:
            raise IntegrityError(f"toy model of seed {artifact.seed} is not {artifact.sha256}",
                                 fix="pin its real sha256")
        return path, artifact.sha256, {"kind": "toy", "seed": artifact.seed}

    def source_file_name(self, artifact: ToyArtifact) -> str:
        return f"toy-{artifact.seed}.json"

    def built_file_name(self, artifact: ToyArtifact) -> str:
        return MODEL_FILE

    def build(self, ctx) -> BuiltModel:
        self.steps.append("build")
        model_dir = ctx.stage_dir("build") / "model"
        model_dir.mkdir(exist_ok=True)
        model = model_dir / MODEL_FILE
        shutil.copyfile(ctx.local_ref(ctx.result("resolve").source_ref), model)
        return BuiltModel(output=ctx.keep_file(model, MODEL_FILE), model_dir=model_dir, model_sha256=sha256_file(model),
                          info=json.loads(model.read_text()), toy_seed=ctx.config.artifact.seed)

    def memory(self, ctx, built: BuiltModel) -> MemoryEstimate:
        return MemoryEstimate(-(-built.output.size // MIB), 0, CPU_RUNTIME_OVERHEAD_MB, "answers")

    def manifest_fields(self, built) -> dict:
        return recorded_fields(built, ("toy_seed",))

    def package(self, built_model: Path, out_dir: Path, manifest: dict, calibration: Path | None):
        self.steps.append("package")
        staging = out_dir / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        shutil.copyfile(built_model, staging / MODEL_FILE)
        try:
            return package_model_dir(staging, out_dir, manifest=manifest, model_file=MODEL_FILE)
        finally:
            shutil.rmtree(staging)

    def evaluate(self, candidate, champion, paths, out_dir: Path, *, validation, settings, progress, title: str,
                 context=None, built=None) -> GateOutcome:
        self.steps.append("evaluate")
        datasets = [load_numbers(path, name=f"dataset{i}", splits=splits) for i, (path, splits) in enumerate(paths)]
        return GateOutcome.of(evaluate_parity(candidate, champion, datasets, out_dir, thresholds=validation.thresholds,
                                              champion_rule=validation.champion, settings=settings, title=title,
                                              decision_rule=validation.decision_rule, context=context))

    def items_per_request(self, validation: ParityGateConfig) -> int:
        return 1

    def summary_metrics(self, metrics: dict) -> dict:
        return {}

    def invocation_bodies(self, validation: ParityGateConfig, paths) -> list[bytes]:
        return [body(number) for i, (path, splits) in enumerate(paths)
                for number in load_numbers(path, name=f"dataset{i}", splits=splits).numbers]

    def add_commands(self, serve, evaluate) -> None:
        """None: the toy is released by the pipeline only."""
