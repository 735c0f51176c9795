"""A release config over a tiny generated model, in its own state folder, for end-to-end runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tasks.hashing import sha256_file
from tasks.tinymodel import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "configs" / "releases" / "gemma-decision.yaml"


@pytest.fixture(scope="session")
def tiny_sha256(tmp_path_factory) -> str:
    return sha256_file(write_tiny_gguf(tmp_path_factory.mktemp("pin") / "tiny.gguf", seed=3))


@pytest.fixture
def release_config(tmp_path, tiny_sha256):
    """Write a config for the tiny model (gates that a random model can pass) and return a factory."""

    def make(name: str = "tiny-decision", **changes) -> Path:
        tree = yaml.safe_load(BASE.read_text())
        tree["name"] = name
        tree["artifact"] = {"kind": "gguf", "source": {"kind": "generated", "seed": 3, "sha256": tiny_sha256}, "quantization": "Q8_0"}
        tree["backend"] = {"kind": "local", "state_dir": str(tmp_path / "state")}
        tree["validation"]["thresholds"] = {"min_accuracy": 0.0, "max_ece": 1.0, "min_validity": 1.0}
        tree["validation"]["n_bootstrap"] = 200
        for dotted, value in changes.items():
            node = tree
            *parents, leaf = dotted.split("__")
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = value
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(tree))
        return path

    return make
