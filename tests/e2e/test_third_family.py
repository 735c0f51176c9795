"""A model family is a plug-in: a toy third family with its own image and its own gate is released end to end.

The toy family (`tests/e2e/third_family/family.py`) borrows no step of another family: its own config classes, build
and package, its own server (`images/toy/`) and its own validation package (`tests/e2e/third_family/parity_gate/`),
registered by one line here. Nothing else in the project knows it exists: the release config, the stages, local
hosting and the ledger find it through `tasks.families.registry`, and a test fails if a new family needs more files.
A family class that lacks a step is refused when it is registered, naming what it lacks.
"""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path
from typing import Literal

import pytest
import yaml

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families import registry
from shiplift.tasks.families.base import BuiltImageConfig, ModelFamily
from shiplift.tasks.families.gguf_decisions import GgufDecisions
from shiplift.tasks.hashing import sha256_file
from tests.e2e.third_family.family import ToyArtifact, ToyFamily, write_toy_model
from tests.tiny_release import stop_endpoints, write_tiny_config

ROOT = Path(__file__).resolve().parents[2]
SEED = 5
# Every file the toy family needed: its family module, its validation package, its image folder and this test (which
# holds the registry line). A new family that needs a file outside these (a stage, the config, placement, package.py)
# grows this list, and the test below fails.
THIRD_FAMILY_FILES = {
    "images/toy/Dockerfile",
    "images/toy/server.py",
    "tests/e2e/third_family/__init__.py",
    "tests/e2e/third_family/family.py",
    "tests/e2e/third_family/parity_gate/__init__.py",
    "tests/e2e/third_family/parity_gate/numbers.jsonl",
    "tests/e2e/third_family/parity_gate/parity.py",
    "tests/e2e/test_third_family.py",
}
# What spells the toy family's kinds or its server's prefix in code, config or docs.
TOY_MENTION = re.compile(r"""Literal\["(?:toy|parity)"\]|["']TOY["']|\bTOY_|["']?kind["']?: ["']?(?:toy|parity)\b""")
SEARCHED = ("tasks", "validation", "images", "dags", "bench", "scripts", "configs", "tests", "docs")
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt", ".json", ".jsonl", ""}


@pytest.fixture
def toy():
    family = registry.register(ToyFamily)  # the registry line
    yield family
    registry.unregister("toy", "toy")


def _toy_config(tmp_path: Path) -> Path:
    """The tiny release config with the toy's artifact, image and gate in place of the GGUF family's."""
    config = write_tiny_config(tmp_path / "configs", tmp_path / "state", name="toy-parity")
    tree = yaml.safe_load(config.read_text())
    model = write_toy_model(tmp_path / "toy.json", SEED)
    tree["artifact"] = {"kind": "toy", "seed": SEED, "sha256": sha256_file(model)}
    tree["image"] = {"kind": "toy", "max_in_flight": 2,
                     "base_image": "python@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7"}
    numbers = ROOT / "tests" / "e2e" / "third_family" / "parity_gate" / "numbers.jsonl"
    tree["validation"] = {**tree["validation"], "kind": "parity",
                          "datasets": [{"path": str(numbers), "splits": ["test"]}],
                          "thresholds": {"min_accuracy": 0.9, "max_ece": 1.0, "min_validity": 1.0}}
    config.write_text(yaml.safe_dump(tree))
    return config


def project_files() -> set[str]:
    """The project's text files (its code, configs, tests and docs), as paths from the repository root."""
    found = set()
    for top in SEARCHED:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in TEXT_SUFFIXES \
                    and path.stat().st_size < 1 << 20:
                found.add(path.relative_to(ROOT).as_posix())
    return found


def test_a_third_family_touches_only_its_own_files():
    files = project_files()
    own = {name for name in files if name.startswith(("images/toy/", "tests/e2e/third_family/"))}
    assert own | {"tests/e2e/test_third_family.py"} == THIRD_FAMILY_FILES, "list every file the toy family brings"
    mentioning = {name for name in files
                  if TOY_MENTION.search((ROOT / name).read_text(encoding="utf-8", errors="replace"))}
    outside = sorted(mentioning - THIRD_FAMILY_FILES)
    assert outside == [], f"files outside the toy family know it: {outside}"
    assert len(THIRD_FAMILY_FILES) == 8


def test_an_unknown_family_is_a_config_error_naming_the_known_ones(tmp_path):
    with pytest.raises(ConfigError) as refused:
        load_release_config(_toy_config(tmp_path))
    assert "artifact.kind must be one of gguf, onnx, got 'toy'" in str(refused.value)


def test_a_family_class_missing_steps_is_refused_at_registration_naming_them():
    class Half(ToyFamily):
        """The toy with two steps left as the base declares them (abstract)."""

        artifact_kind = "half"
        memory = ModelFamily.memory
        manifest_fields = ModelFamily.manifest_fields

    with pytest.raises(ConfigError, match=r"model family Half lacks manifest_fields, memory —") as refused:
        registry.register(Half)
    assert "shiplift.tasks.families.base.ModelFamily" in refused.value.fix
    assert all(family.artifact_kind != "half" for family in registry.families())


def test_a_family_claiming_a_capability_without_its_steps_is_refused():
    class Replays(ToyFamily):
        artifact_kind = "replays"
        replays_online = True

    class CalibratesNothing(ToyFamily):
        artifact_kind = "calibrates"
        temperature_scaling = True

    with pytest.raises(ConfigError, match=r"lacks readout \(claimed by replays_online\), online_gate \(claimed by "
                                          r"replays_online\)"):
        registry.register(Replays)
    with pytest.raises(ConfigError, match=r"lacks calibration_predictions \(claimed by temperature_scaling\)"):
        registry.register(CalibratesNothing)
    class BareImage(BuiltImageConfig):
        kind: Literal["bare"]

    class Bare(ToyFamily):
        artifact_kind = "bare"
        image_model = BareImage

    with pytest.raises(ConfigError, match=r"lacks BareImage.container_env, BareImage.on_gpu"):
        registry.register(Bare)
    with pytest.raises(ConfigError, match="not a model family class"):
        registry.register(ToyFamily())
    with pytest.raises(ConfigError, match="already belongs to GgufDecisions"):
        registry.register(GgufDecisions)


def test_a_toy_family_with_its_own_image_and_gate_is_released_end_to_end(tmp_path, toy):
    from shiplift.tasks.ledger.store import Ledger
    from shiplift.tasks.pipeline.release import reopen_release, run_release

    config_path = _toy_config(tmp_path)
    config = load_release_config(config_path)
    assert type(config.artifact) is ToyArtifact and config.validation.kind == "parity" and config.image.kind == "toy"
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
        reopened = reopen_release(summary["release_id"], state_dir=tmp_path / "state", progress=lambda message: None)
        assert type(reopened.config.artifact) is ToyArtifact
        package = reopened.result("package")
        gate = json.loads(Path(reopened.stage_dir("validate") / "gate-report.json").read_text())
    finally:
        ledger.close()

    assert gate["decision"] == "pass" and gate["metrics"]["accuracy"]["value"] == 1.0  # the toy server knows parity
    archive = Path(package.artifact_uri.removeprefix("file://"))
    with tarfile.open(archive) as tar:
        manifest = json.load(tar.extractfile("model-manifest.json"))
    assert manifest["kind"] == "toy" and manifest["model_file"] == "toy-model.json"
    assert manifest["build"]["toy_seed"] == SEED
    assert set(manifest["tools"]) == {"python", "shiplift"}
