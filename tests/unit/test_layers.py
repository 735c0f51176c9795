"""The layering rule (docs/design.md §1, "Layers"): `tasks`, `validation`, `dags` and `bench` are cut into layers,
bottom first, and a module imports only its own unit and the units of lower layers. Every import counts, wherever it
is written: at the top, inside a function (a lazy import is still a dependency), under `TYPE_CHECKING`, and the
dynamic ones: `importlib.import_module("…")` and a `"package.module:name"` string (what the stage table and the
registries load lazily). So no import circle can hide behind a function-level or dynamic import, and a new upward
import fails here with the line that makes it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx
import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("tasks", "validation", "dags", "bench")
# "shiplift.tasks.pipeline.fleet.move:move_fleet"
LAZY_REFERENCE = re.compile(r"(?:shiplift\.)?((?:tasks|validation|dags|bench)(?:\.\w+)+):\w+")
# Modules are named here by their folders (`tasks.ledger.store`); the code imports them as
# `shiplift.tasks.ledger.store`.
NAMESPACE = "shiplift."

# Bottom first. A unit is a set of module prefixes; a module belongs to the unit with its longest matching prefix.
LAYERS: tuple[dict[str, tuple[str, ...]], ...] = (
    {"core": ("tasks.errors", "tasks.hashing", "tasks.atomic", "tasks.project", "tasks.processes", "tasks.yamlfile",
              "tasks.secret_keys", "tasks.config_types", "tasks.console", "tasks.extras", "tasks.__init__")},
    {"validation": ("validation",)},
    {"artifacts": ("tasks.artifacts",), "ledger": ("tasks.ledger",)},
    {"backend contracts": ("tasks.backends.__init__", "tasks.backends.interfaces", "tasks.backends.placement",
                           "tasks.backends.capacity", "tasks.backends.mig_profiles", "tasks.backends.pricing",
                           "tasks.backends.pricing_table",
                           "tasks.backends.pricing_instances", "tasks.backends.pricing_costs",
                           "tasks.backends.image_source",
                           "tasks.backends.local.backend_config", "tasks.backends.aws.backend_config",
                           "tasks.backends.aws.service_model",
                           "tasks.backends.aws.base_images")},
    {"families": ("tasks.families",)},
    {"config": ("tasks.config", "tasks.config_release", "tasks.config_rollout", "tasks.config_errors")},
    {"local backend": ("tasks.backends.local",), "aws backend": ("tasks.backends.aws",)},
    {"backend registry": ("tasks.backends.registry",)},
    {"pipeline": ("tasks.pipeline",)},
    {"sweeps": ("tasks.sweeps",)},  # a sweep runs releases; the orchestrators run sweeps
    {"orchestrators": ("tasks.orchestrators",)},
    {"cli": ("tasks.cli",)},
    {"dags": ("dags",), "bench": ("bench",)},  # the Airflow wiring and the benchmarks: on top, apart from each other
)
UNIT_LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
PREFIXES = sorted(((prefix, unit) for units in LAYERS for unit, prefixes in units.items() for prefix in prefixes),
                  key=lambda item: -len(item[0]))


def unit_of(module: str) -> str | None:
    """The unit a module (or a name imported from it) belongs to; None outside the layered folders (FOLDERS)."""
    for prefix, unit in PREFIXES:
        if module == prefix or module.startswith(prefix + "."):
            return unit
    return None


def module_name(path: Path) -> str:
    """`tasks.ledger.store`; a package's own module keeps its `__init__` (`tasks.ledger.__init__`)."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imported_modules(module: str, source: str, *, references: bool = True) -> list[tuple[int, str]]:
    """Every module `source` imports, with its line: top-level, function-level and TYPE_CHECKING imports alike;
    relative imports resolved against `module`; `from package import name` counted as `package.name`;
    `import_module("x")` with a constant name; and, with `references`, a constant `"x.y:name"` string (loads `x.y`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr",
                                                  getattr(node.func, "id", None)) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            found.append((node.lineno, node.args[0].value.removeprefix(NAMESPACE)))
        elif references and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and (reference := LAZY_REFERENCE.fullmatch(node.value)):
            found.append((node.lineno, reference.group(1)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.removeprefix(NAMESPACE)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "").removeprefix(NAMESPACE)
            if node.level:
                package = module.split(".")[: -node.level]
                base = ".".join(package + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def layer_violations(sources: dict[str, str]) -> list[str]:
    """`file:line module -> imported (unit -> unit)` for every import that is not down the layers or within a unit."""
    problems = []
    for module, source in sorted(sources.items()):
        mine = unit_of(module)
        assert mine is not None, f"{module} is in no layer: add it to LAYERS (and to docs/design.md §1)"
        for line, name in imported_modules(module, source):
            theirs = unit_of(name)
            if theirs is None or theirs == mine:
                continue
            if UNIT_LAYER[theirs] >= UNIT_LAYER[mine]:
                problems.append(f"{module}:{line} imports {name} ({mine} -> {theirs}: "
                                f"{'same layer' if UNIT_LAYER[theirs] == UNIT_LAYER[mine] else 'upward'})")
    return problems


def project_sources() -> dict[str, str]:
    return {module_name(path): path.read_text(encoding="utf-8")
            for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def module_graph(sources: dict[str, str]) -> networkx.DiGraph:
    """Module → imported project module, every kind of import counted but a `"module:name"` reference: the stage
    table names its steps as data (`tasks.pipeline.table`), resolved by whoever runs one, so a step's module may read
    the table's policy without a circle (the reference still counts for the layers)."""
    graph = networkx.DiGraph()
    known = set(sources)
    for module, source in sources.items():
        graph.add_node(module)
        for _, name in imported_modules(module, source, references=False):
            for target in (name, f"{name}.__init__", name.rpartition(".")[0], f"{name.rpartition('.')[0]}.__init__"):
                if target in known:
                    if target != module:
                        graph.add_edge(module, target)
                    break
    return graph


def test_every_import_goes_down_the_layers():
    assert layer_violations(project_sources()) == []


def test_no_import_circle_between_modules_of_different_units():
    """No strongly connected set of modules spans two units (within one unit, e.g. a config class and its loader,
    a circle would still be found by the first test only if it crossed units, so this one checks the whole graph)."""
    graph = module_graph(project_sources())
    circles = [sorted(group) for group in networkx.strongly_connected_components(graph) if len(group) > 1]
    assert circles == []


@pytest.mark.parametrize("planted", [
    "def later():\n    from tasks.cli.main import main\n",  # a function-level import
    "import importlib\nSTEP = importlib.import_module('tasks.pipeline.release')\n",  # a dynamic import
    "LAZY = 'tasks.orchestrators.step_functions:render'\n",  # a lazily loaded "module:name"
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tasks.pipeline.release import StageContext\n",
    "import tasks.orchestrators.step_functions\n",
])
def test_a_planted_upward_import_is_found(planted):
    sources = project_sources()
    sources["tasks.ledger.store"] += "\n" + planted
    found = layer_violations(sources)
    assert len(found) == 1 and found[0].startswith("tasks.ledger.store:") and "ledger -> " in found[0], found


def test_an_import_between_units_of_one_layer_is_found():
    sources = project_sources()
    sources["tasks.backends.aws.hosting"] += "\nfrom tasks.backends.local.router import Router\n"
    assert [problem for problem in layer_violations(sources) if "same layer" in problem] == [
        f"tasks.backends.aws.hosting:{sources['tasks.backends.aws.hosting'].count(chr(10))} imports "
        "tasks.backends.local.router.Router (aws backend -> local backend: same layer)"]


def test_every_module_is_in_a_layer():
    assert [module for module in project_sources() if unit_of(module) is None] == []
