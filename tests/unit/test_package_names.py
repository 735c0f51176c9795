"""One importable namespace (issue 47): the folders tasks/, validation/ and images/ are the packages shiplift.tasks,
shiplift.validation and shiplift.images, so shiplift never claims the generic top-level names an Airflow deployment or
a Celery app (`tasks.py`) already uses."""

import ast
import re
import tomllib
from importlib import metadata
from pathlib import Path

import shiplift.images
import shiplift.tasks
import shiplift.validation

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("tasks", "validation", "images")
CODE = ("tasks", "validation", "images", "dags", "bench", "scripts", "tests")
DATA_ONLY = {"shiplift.configs"}  # a package of YAML files (the price table, the example configs), no code


def test_the_namespace_maps_onto_this_checkouts_folders():
    for package, folder in ((shiplift.tasks, "tasks"), (shiplift.validation, "validation"), (shiplift.images,
                                                                                             "images")):
        assert Path(package.__file__).resolve().parent == ROOT / folder


def test_no_other_distribution_ships_the_shiplift_name():
    others = set(metadata.packages_distributions().get("shiplift", [])) - {"shiplift"}
    assert not others, f"installed distributions {others} also provide top-level 'shiplift'; they would shadow it"


def bare_imports(source: str) -> list[str]:
    """The modules a source imports by one of the folders' bare names (`import tasks.x`, `from validation import y`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        found += [name for name in names if name.split(".")[0] in FOLDERS]
    return found


def test_nothing_imports_the_bare_folder_names():
    offenders = [f"{path.relative_to(ROOT)}: {name}" for folder in CODE for path in (ROOT / folder).rglob("*.py")
                 for name in bare_imports(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_bare_name_check_finds_a_bare_import():
    assert bare_imports("import tasks.cli.main\nfrom validation.gates import x\nimport shiplift.tasks\n") == \
        ["tasks.cli.main", "validation.gates"]


def test_no_command_runs_a_bare_module():
    bare = re.compile(r"-m[\"']?,?\s*[\"']?(tasks|validation|images)\.")
    files = [path for folder in CODE for path in (ROOT / folder).rglob("*") if path.suffix in (".py", ".sh", ".md")]
    files += [ROOT / "Makefile", ROOT / "README.md", ROOT / ".ci" / "run", *(ROOT / "docs").rglob("*.md")]
    offenders = [str(path.relative_to(ROOT)) for path in files if bare.search(path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_every_package_folder_is_declared():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    declared = set(setuptools["packages"]) - DATA_ONLY
    folders = {"shiplift." + ".".join(init.parent.relative_to(ROOT).parts)
               for folder in FOLDERS for init in (ROOT / folder).rglob("__init__.py")}
    assert folders - declared == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert declared - folders == set(), "these are declared but have no folder with an __init__.py"


def test_tasks_and_validation_never_import_airflow():
    offenders = [
        str(path.relative_to(ROOT))
        for folder in FOLDERS
        for path in (ROOT / folder).rglob("*.py")
        if any(line.strip().startswith(("import airflow", "from airflow")) for line in path.read_text().splitlines())
    ]
    assert offenders == []
