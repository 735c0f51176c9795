"""The layout's boundaries, checked on the source (DESIGN §1): `tasks` and `validation` never import Airflow,
`validation` imports only `tasks`' primitives (never the pipeline), nothing edits `sys.path`, the stages see backend
interfaces only, family names are spelled only by the families, and loading a config pulls no evaluation code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what validation may use of tasks
PRIMITIVES = {"shiplift.tasks.errors", "shiplift.tasks.hashing", "shiplift.tasks.atomic"}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def _sources(*folders: str) -> list[Path]:
    return [path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]


def test_tasks_and_validation_never_import_airflow():
    hits = [f"{p.relative_to(ROOT)}:{line} {name}" for p in _sources("tasks", "validation")
            for line, name in _imports(p) if name.split(".")[0] == "airflow"]
    assert hits == []


def test_validation_imports_only_the_primitives_of_tasks():
    hits = [f"{p.relative_to(ROOT)}:{line} {name}" for p in _sources("validation")
            for line, name in _imports(p) if name.startswith("shiplift.tasks.") and name not in PRIMITIVES]
    assert hits == [], "validation must not import the pipeline"


def test_nothing_edits_sys_path():
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in _sources("tasks", "validation", "dags")
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
            if "sys.path" in line and not line.lstrip().startswith("#")]
    assert hits == []


def test_stages_see_backend_interfaces_only():
    hits = [f"{p.relative_to(ROOT)}:{line} {name}" for p in _sources("tasks/pipeline/stages") for line,
            name in _imports(p)
            if name.startswith(("shiplift.tasks.backends.local", "shiplift.tasks.backends.aws", "boto3", "botocore"))]
    assert hits == []


@pytest.mark.parametrize("literal", ['"gguf"', '"onnx"', '"semif"', '"encoder"', '"nli"'])
def test_family_names_are_spelled_only_by_the_families(literal):
    """Outside `tasks/families/`, nothing in the pipeline branches on a family's name (artifact, image or gate kind).
    (The images' own servers, the CLI's process-image commands and the artifact builders name what they are; the extras'
    table names the modules each extra installs, `onnx` among them.)"""
    allowed = ("tasks/families/", "tasks/artifacts/", "tasks/extras.py")
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in _sources("tasks")
            if not str(p.relative_to(ROOT)).startswith(allowed)
            for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if literal in line]
    assert hits == []


def test_loading_a_config_imports_no_evaluation_code_or_numpy():
    probe = ("import sys\nfrom shiplift.tasks.config import load_release_config\n"
             "load_release_config('configs/releases/gemma-decision.yaml')\n"
             "print(sorted(m for m in ('numpy', 'shiplift.validation.metrics', 'shiplift.validation.gates', "
             "'shiplift.validation.transport', 'shiplift.tasks.ledger.store', 'shiplift.tasks.pipeline.release') "
             "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout
