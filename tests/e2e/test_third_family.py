"""A model family is a plug-in: a toy third family, defined only here, is released end to end on the local backend.

The toy family owns a config class of its own (`artifact.kind: toy`: a seed and the sha256 it must produce), its own
resolve (it writes its model from the seed), build and package steps; it serves on the SemIf image and gates on
decisions by delegating to the GGUF family. Nothing outside this file knows it exists: the release config, the stages,
local hosting and the ledger find it through `tasks.families.registry`.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Literal

import pytest
import yaml
from pydantic import Field

from tasks.config import load_release_config
from tasks.config_types import Sha256
from tasks.errors import ConfigError, IntegrityError
from tasks.families import gguf_decisions, registry
from tasks.families.base import ArtifactConfig, BuiltModel, ModelFamily
from tasks.hashing import sha256_file
from tests.tiny_release import SEED, stop_endpoints, write_tiny_config


class ToyArtifact(ArtifactConfig):
    """A tiny random GGUF the family writes from a seed; the config pins what it must come out as."""

    kind: Literal["toy"]
    seed: int = Field(ge=0)
    sha256: Sha256


class ToyFamily(ModelFamily):
    artifact_kind = "toy"
    artifact_model = ToyArtifact
    image_model = gguf_decisions.SemifImage
    validation_model = gguf_decisions.DecisionGateConfig
    env_prefix = gguf_decisions.FAMILY.env_prefix
    tool_distributions = ("gguf",)

    def __init__(self):
        self.steps: list[str] = []
        self.gguf = gguf_decisions.FAMILY  # serves and gates like the GGUF family

    def resolve(self, ctx, cache: Path):
        from tasks.artifacts.tiny_gguf import write_tiny_gguf

        self.steps.append("resolve")
        artifact = ctx.config.artifact
        path = cache / f"toy-{artifact.seed}.gguf"
        write_tiny_gguf(path, seed=artifact.seed)
        if sha256_file(path) != artifact.sha256:
            raise IntegrityError(f"toy model of seed {artifact.seed} is not {artifact.sha256}", fix="pin its real sha256")
        return path, artifact.sha256, {"kind": "toy", "seed": artifact.seed}

    def source_file_name(self, artifact) -> str:
        return f"toy-{artifact.seed}.gguf"

    built_file_name = source_file_name

    def build(self, ctx) -> BuiltModel:
        from tasks.artifacts.gguf import build_gguf

        self.steps.append("build")
        source = ctx.local_ref(ctx.result("resolve").source_ref)
        built = build_gguf(source, ctx.backends.state_dir / "builds", quantization=None, allow_requantize=False,
                           threads=1).to_dict()
        model_dir = ctx.stage_dir("build") / "model"
        model_dir.mkdir(exist_ok=True)
        (model_dir / "toy.gguf").unlink(missing_ok=True)
        (model_dir / "toy.gguf").symlink_to(built["path"])
        return BuiltModel(output=ctx.keep_file(Path(built["path"]), "toy.gguf"), model_dir=model_dir,
                          model_sha256=built["sha256"], info={**built["info"], "toy": True})

    def memory(self, ctx, built):
        return self.gguf.memory(ctx, built)

    def package(self, built_model, out_dir, manifest, calibration):
        self.steps.append("package")
        return self.gguf.package(built_model, out_dir, {**manifest, "toy": True}, calibration)

    def calibration_predictions(self, ctx, invoker, path, splits, settings):
        return self.gguf.calibration_predictions(ctx, invoker, path, splits, settings)

    def evaluate(self, candidate, champion, paths, out_dir, **kwargs):
        self.steps.append("evaluate")
        return self.gguf.evaluate(candidate, champion, paths, out_dir, **kwargs)

    def invocation_bodies(self, validation, paths):
        return self.gguf.invocation_bodies(validation, paths)


@pytest.fixture
def toy():
    family = ToyFamily()
    registry.register(family)
    yield family
    registry.unregister("toy", "semif")


def _toy_config(tmp_path: Path) -> Path:
    config = write_tiny_config(tmp_path / "configs", tmp_path / "state", name="toy-decision")
    tree = yaml.safe_load(config.read_text())
    gguf = tmp_path / "configs" / f"tiny-seed{SEED}.gguf"
    tree["artifact"] = {"kind": "toy", "seed": SEED, "sha256": sha256_file(gguf)}
    config.write_text(yaml.safe_dump(tree))
    return config


def test_an_unknown_family_is_a_config_error_naming_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_release_config(_toy_config(tmp_path))
    assert "artifact.kind must be one of gguf, onnx, got 'toy'" in str(refused.value)


def test_a_toy_family_defined_here_is_released_end_to_end(tmp_path, toy):
    from tasks.ledger.store import Ledger
    from tasks.pipeline.release import run_release

    config_path = _toy_config(tmp_path)
    config = load_release_config(config_path)
    assert type(config.artifact) is ToyArtifact and config.validation.kind == "decisions"
    with pytest.raises(ConfigError, match="seed"):
        load_release_config(config_path, overrides=("artifact.seed=-1",))
    try:
        summary = run_release(config_path, progress=lambda message: None)
    finally:
        stop_endpoints(tmp_path / "state")
    assert summary["status"] == "promoted", summary
    assert toy.steps == ["resolve", "build", "package", "evaluate"]
    assert all(status == "succeeded" for status in summary["stages"].values()), summary["stages"]

    ledger = Ledger(f"sqlite:///{tmp_path / 'state' / 'ledger.db'}")
    try:
        records = ledger.release(summary["release_id"])
        opened = next(r for r in records if (r.stage, r.event) == ("release", "opened"))
        assert opened.payload["config"]["artifact"] == {"kind": "toy", "seed": SEED, "sha256": config.artifact.sha256}
        resolved = next(r for r in records if (r.stage, r.event) == ("resolve", "succeeded"))
        assert resolved.payload["source"] == {"kind": "toy", "seed": SEED}
        # A worker that reopens the release from the ledger rebuilds the toy config.
        from tasks.pipeline.release import reopen_release

        reopened = reopen_release(summary["release_id"], state_dir=tmp_path / "state", progress=lambda message: None)
        assert type(reopened.config.artifact) is ToyArtifact
        package = reopened.result("package")
    finally:
        ledger.close()

    archive = Path(package.artifact_uri.removeprefix("file://"))
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("model-manifest.json"))
    assert manifest["kind"] == "toy" and manifest["toy"] is True and set(manifest["tools"]) == {"python", "shiplift", "gguf"}
