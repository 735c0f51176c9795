"""A fast release config for the DAG, promotion and audit tests: a tiny generated GGUF and 32 test tasks.

Validation dominates a tiny release, so the gate reads 32 tasks of the project's decision set
(above the champion rule's 30-task minimum) instead of all 111; thresholds are ones a random
model passes, so the first release is promoted.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.hashing import sha256_file

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "configs" / "releases" / "gemma-decision.yaml"
DECISIONS = ROOT / "validation" / "data" / "decisions.jsonl"
N_TASKS = 32
SEED = 3


def _apply_changes(tree: dict, changes: dict) -> None:
    """Set dotted keys written with `__` (validation__seed=1) in a config tree."""
    for dotted, value in changes.items():
        node = tree
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value


def write_tiny_config(folder: Path, state_dir: Path, *, name: str = "tiny-decision", **changes) -> Path:
    """Write `<folder>/<name>.yaml`; `changes` set dotted keys written with `__` (validation__seed=1)."""
    folder.mkdir(parents=True, exist_ok=True)
    gguf = folder / f"tiny-seed{SEED}.gguf"
    if not gguf.is_file():
        write_tiny_gguf(gguf, seed=SEED)
    dataset = folder / "decisions-small.jsonl"
    if not dataset.is_file():
        rows = [line for line in DECISIONS.read_text().splitlines() if json.loads(line)["split"] == "test"]
        dataset.write_text("\n".join(rows[:N_TASKS]) + "\n")
    tree = yaml.safe_load(BASE.read_text())
    tree["name"] = name
    tree["artifact"] = {"kind": "gguf", "source": {"kind": "generated", "seed": SEED, "sha256": sha256_file(gguf)},
                        "quantization": "Q8_0"}
    tree["backend"] = {"kind": "local", "state_dir": str(state_dir)}
    tree["validation"]["datasets"] = [{"path": str(dataset), "splits": ["test"]}]
    tree["validation"]["thresholds"] = {"min_accuracy": 0.0, "max_ece": 1.0, "min_validity": 1.0}
    tree["validation"]["n_bootstrap"] = 200
    # no latency ratio: a tiny model answers in milliseconds, so its p95 on 32 tasks is the machine's noise (the ratio
    # check has its own tests, tests/unit/test_latency_ratio.py); a test that wants it sets it with `changes`
    tree["validation"]["champion"]["max_p95_ratio"] = None
    # an inconclusive tiny gate blocks (the default) rather than extend onto Gemma's reserve; tests of the extension
    # name their own (tests/e2e/test_inconclusive_release.py)
    tree["validation"].pop("inconclusive", None)
    _apply_changes(tree, changes)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def write_tiny_chat_config(folder: Path, state_dir: Path, *, name: str = "tiny-chat", **changes) -> Path:
    """The tiny release on the DLC's chat path (`configs/releases/gemma-chat.yaml` with a tiny GGUF that carries a
    chat template, as a pinned path source); `changes` as in `write_tiny_config`."""
    from shiplift.tasks.artifacts.tiny_gguf import CHAT_TEMPLATES

    folder.mkdir(parents=True, exist_ok=True)
    gguf = folder / f"tiny-chat-seed{SEED}.gguf"
    if not gguf.is_file():
        write_tiny_gguf(gguf, seed=SEED, chat_template=CHAT_TEMPLATES["turns"], letters_first=True)
    base = yaml.safe_load(write_tiny_config(folder, state_dir, name=name).read_text())
    tree = yaml.safe_load((ROOT / "configs" / "releases" / "gemma-chat.yaml").read_text())
    tree.update(name=name, backend=base["backend"])
    tree["artifact"] = {"kind": "gguf", "source": {"kind": "path", "path": str(gguf), "sha256": sha256_file(gguf)}}
    tree["image"]["server"] = {"ctx_size": 1024}  # the tiny GGUF's own chat template, not Gemma's named one
    tree["validation"].update(datasets=base["validation"]["datasets"], n_bootstrap=200,
                              thresholds={"min_accuracy": 0.0, "max_ece": 1.0, "min_validity": 0.0},
                              # as write_tiny_config
                              champion={**tree["validation"]["champion"], "max_p95_ratio": None})
    tree["validation"].pop("inconclusive", None)
    _apply_changes(tree, changes)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def three_releases(root: Path) -> dict:
    """In a fresh state dir under `root`: release A promoted, B (an F16 build) promoted over it, D rejected by
    its gate (min_accuracy 0.99). Returns the state dir, the config and the three release ids."""
    from shiplift.tasks.pipeline.release import run_release

    state_dir = root / "state"
    config = write_tiny_config(root / "configs", state_dir)
    quiet = lambda message: None  # noqa: E731
    a = run_release(config, progress=quiet)
    b = run_release(config, overrides=("artifact.quantization=F16",), progress=quiet)
    d = run_release(config, overrides=("validation.thresholds.min_accuracy=0.99",), progress=quiet)
    assert (a["status"], b["status"], d["status"]) == ("promoted", "promoted", "rejected")
    return {"state_dir": state_dir, "config": config, "a": a["release_id"], "b": b["release_id"], "d": d["release_id"]}


def stop_endpoints(state_dir: Path) -> None:
    """Delete every local endpoint a test's releases left serving."""
    from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

    hosting = ProcessSupervisor(state_dir)
    for endpoint in hosting.list_endpoints():
        hosting.delete_endpoint(endpoint["name"])
