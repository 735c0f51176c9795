"""`pip install shiplift` without its extras (issue 47, item 5).

Nothing is uninstalled: each CLI run is a subprocess whose `sys.meta_path` answers every import of the blocked modules
as a missing distribution does (ModuleNotFoundError), so these tests run in the full `make setup` environment. Core
commands work so; a command that needs an extra names it and its install command; tasks/extras.py's table of extras
matches pyproject.toml; and every import of an extra's module in tasks/ and validation/ sits in `needs_extra`.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from shiplift.tasks.errors import ConfigError
from shiplift.tasks.extras import EXTRA_MODULES, install_command, needs_extra
from shiplift.tasks.ledger.store import Ledger

ROOT = Path(__file__).resolve().parents[2]
EVERY_EXTRA = frozenset().union(*EXTRA_MODULES.values())
# What the "done when" asks of an aws --dry-run: no torch, no ONNX tooling, no Airflow.
NO_ENCODERS_NO_AIRFLOW = EXTRA_MODULES["encoders"] | EXTRA_MODULES["airflow"]
BLOCKER = """
import runpy, sys
blocked = set(sys.argv[1].split(","))
assert not blocked & {name.partition(".")[0] for name in sys.modules}, "a blocked module was imported at startup"


class Uninstalled:
    '''Every import of a blocked module fails as it does when its distribution is not installed.'''

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Uninstalled)
sys.argv = ["shiplift", *sys.argv[2:]]
runpy.run_module("shiplift.tasks.cli.main", run_name="__main__", alter_sys=True)
"""


def shiplift(blocked: frozenset[str], *args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """The CLI with `blocked` modules uninstalled as far as it can tell; no AWS credentials, every AWS endpoint a
    closed port (the dry run sends nothing; were it to try, it would fail)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true",
               AWS_ENDPOINT_URL="http://127.0.0.1:9")
    return subprocess.run([sys.executable, "-c", BLOCKER, ",".join(sorted(blocked)), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_help_runs_without_any_extra():
    done = shiplift(EVERY_EXTRA, "--help")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("usage: shiplift") and "ledger" in done.stdout


def test_ledger_verify_runs_without_any_extra(tmp_path):
    ledger = Ledger.for_sqlite(tmp_path / "ledger.db")
    for n in range(2):
        ledger.append(release_id="rel-1", model="tiny", stage="build", event="started", payload={"n": n},
                      actor="tester")
    done = shiplift(EVERY_EXTRA, "ledger", "verify", "--state-dir", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    verdict = json.loads(done.stdout)
    assert verdict["ok"] and verdict["n_records"] == 2 and verdict["head_hash"] == ledger.head().record_hash


def test_aws_dry_run_runs_without_torch_onnx_or_airflow():
    done = shiplift(NO_ENCODERS_NO_AIRFLOW, "release", "configs/releases/qwen35-4b-semif.yaml", "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "nothing was sent" in done.stderr
    operations = [json.loads(line)["operation"] for line in done.stdout.splitlines()]
    assert {"CreateModel", "CreateEndpointConfig", "CreateEndpoint"} <= set(operations)


@pytest.mark.parametrize(("extra", "missing", "args"), [
    # a local encoder release trains and exports its encoder with torch (the resolve stage)
    ("encoders", "torch", ("release", "configs/releases/minilm-nli.yaml")),
])
def test_a_command_that_needs_a_missing_extra_names_it(tmp_path, extra, missing, args):
    done = shiplift(EXTRA_MODULES[extra], *args, "--state-dir", str(tmp_path))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert f"{missing} is not installed; it comes with shiplift's {extra!r} extra" in done.stderr
    assert done.stderr.rstrip().endswith(f"fix: {install_command(extra)}"), done.stderr[-3000:]


def test_needs_extra_names_the_extra_of_a_missing_module_and_passes_any_other_on():
    with pytest.raises(ConfigError) as raised, needs_extra("encoders"):
        raise ModuleNotFoundError("No module named 'onnxruntime.quantization'", name="onnxruntime.quantization")
    assert raised.value.problem == "onnxruntime is not installed; it comes with shiplift's 'encoders' extra"
    assert raised.value.fix == "pip install 'shiplift[encoders]'"
    assert isinstance(raised.value.__cause__, ModuleNotFoundError)
    with pytest.raises(ModuleNotFoundError, match="tasks.nowhere"), needs_extra("encoders"):
        raise ModuleNotFoundError("No module named 'tasks.nowhere'", name="tasks.nowhere")
    with pytest.raises(ModuleNotFoundError, match="torch"), needs_extra("airflow"):  # another extra's module
        raise ModuleNotFoundError("No module named 'torch'", name="torch")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_distributions(extra: str) -> set[str]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extra in extras, f"tasks/extras.py names the extra {extra!r}, which pyproject.toml does not declare"
    return {canonical(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group()) for requirement in extras[extra]}


@pytest.mark.parametrize("extra", sorted(EXTRA_MODULES))
def test_the_table_of_extras_matches_pyproject(extra):
    """Each listed module comes from a distribution the extra declares, and each declared distribution installs a
    listed module (a distribution added to the extra in pyproject.toml must be added to the table)."""
    providers = {module: {canonical(d) for d in dists} for module, dists in metadata.packages_distributions().items()}
    declared = extra_distributions(extra)
    for module in EXTRA_MODULES[extra]:
        assert providers.get(module, set()) & declared, f"{module} comes from none of {sorted(declared)}"
    for distribution in declared:
        # a meta-distribution (apache-airflow) installs through what it pins exactly (apache-airflow-core)
        pinned = {canonical(r.partition("==")[0]) for r in metadata.requires(distribution) or []
                  if "==" in r and "extra ==" not in r}
        installs = {module for module, dists in providers.items() if dists & {distribution, *pinned}}
        assert installs & EXTRA_MODULES[extra], f"{distribution} installs none of {sorted(EXTRA_MODULES[extra])}"


def unguarded_imports(source: str) -> list[tuple[int, str, str | None]]:
    """(line, module, the extra it needs or None) for every import of an extra's module that is not inside
    `with needs_extra(THAT_EXTRA):`."""
    extra_of = {module: extra for extra, modules in EXTRA_MODULES.items() for module in modules}
    guarded: dict[int, str] = {}
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.With):
            for item in node.items:
                call = item.context_expr
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "needs_extra" and call.args:
                    guarded.update({id(inner): call.args[0].value for statement in node.body
                                    for inner in ast.walk(statement)})
    found = []
    for node in ast.walk(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
        for name in names:
            extra = extra_of.get(name.partition(".")[0])
            if extra and guarded.get(id(node)) != extra:
                found.append((node.lineno, name, extra))
    return sorted(found)


def test_every_import_of_an_extra_in_tasks_and_validation_is_guarded():
    problems = [f"{path.relative_to(ROOT)}:{line}: `import {name}` outside `with needs_extra({extra!r}):`"
                for folder in ("tasks", "validation") for path in sorted((ROOT / folder).rglob("*.py"))
                for line, name, extra in unguarded_imports(path.read_text(encoding="utf-8"))]
    assert problems == []


def test_the_guard_scan_is_not_vacuous():
    source = ("def f():\n    import torch\n"
              "def g():\n    with needs_extra('encoders'):\n        import torch\n        from onnx import helper\n"
              "def h():\n    with needs_extra('airflow'):\n        import onnxruntime\n")
    assert unguarded_imports(source) == [(2, "torch", "encoders"), (9, "onnxruntime", "encoders")]
