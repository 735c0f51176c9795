"""The extras of `pip install shiplift`, and what a command says when the one it needs is not installed.

`pip install shiplift` is the CLI, the ledger, the aws backend and llama.cpp serving; the heavy engines come with an
extra (pyproject.toml). Their imports sit inside `with needs_extra("encoders"):`, so a missing engine is a ConfigError
naming the extra and its install command (exit 2, no traceback), not a ModuleNotFoundError from inside a stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from shiplift.tasks.errors import ConfigError

# extra -> the top-level modules its distributions install (tests/unit/test_extras.py holds this to pyproject.toml)
EXTRA_MODULES: dict[str, frozenset[str]] = {
    "airflow": frozenset({"airflow", "pendulum"}),
    "encoders": frozenset({"torch", "transformers", "safetensors", "tokenizers", "onnx", "onnxruntime"}),
    "openvino": frozenset({"openvino", "nncf"}),
}


def install_command(extra: str) -> str:
    """What a user types to add `extra` (quoted for the shell: the brackets are a glob)."""
    return f"pip install 'shiplift[{extra}]'"


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Run the imports in the block; one that fails because a module of `extra` is not installed raises a ConfigError
    that names the extra and its install command. Any other ModuleNotFoundError (a bug, not an install) passes on."""
    modules = EXTRA_MODULES[extra]
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in modules:
            raise
        raise ConfigError(f"{missing} is not installed; it comes with shiplift's {extra!r} extra",
                          fix=install_command(extra)) from exc
