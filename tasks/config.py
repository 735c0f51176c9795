"""Typed release configuration (DESIGN §2).

Load order: built-in defaults → the YAML file → `SHIPLIFT_CONFIG__a__b=value` environment
variables → `--set a.b=value` flags. Every model is frozen and forbids unknown keys; a bad
config raises ConfigError naming the file, the field path and what was expected. The models are in
`config_release` (the release) and `config_rollout` (rollout, scale to zero); the error report in `config_errors`.
`require_named_files` checks that every file and package a loaded config names is there, before anything is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from shiplift.tasks.backends.interfaces import BakeAlarms
from shiplift.tasks.config_errors import did_you_mean, format_validation_error
from shiplift.tasks.config_release import ApprovalConfig, ReleaseConfig
from shiplift.tasks.config_rollout import BLUE_GREEN_REFUSED, AllAtOnce, Canary, Linear
from shiplift.tasks.config_types import DatasetRef, local_path
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.secret_keys import looks_secret
from shiplift.tasks.yamlfile import parse_yaml, read_yaml_file

__all__ = [  # importers name these from tasks.config; the models live in config_release and config_rollout
    "AllAtOnce", "ApprovalConfig", "BLUE_GREEN_REFUSED", "BakeAlarms", "Canary", "Linear", "ReleaseConfig",
    "did_you_mean", "load_release_config", "require_named_files",
]

# Layered here, not by pydantic-settings (installed with llama-cpp-python's server): a variable goes onto the YAML tree
# by the same path as `--set`, so its value parses as YAML, an unknown key gets the same "did you mean" naming the
# variable that set it, and ReleaseConfig stays a plain model that reads no environment when it is built.
ENV_PREFIX = "SHIPLIFT_CONFIG__"


def _set_path(tree: dict, dotted: str, value: Any, origin: str) -> None:
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"{origin}: empty segment in {dotted!r}", fix="use a.b.c=value")
    node = tree
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {dotted!r} descends into {key!r}, which is not a mapping",
                              fix="override the parent key instead")
        node = child
    node[keys[-1]] = value


def _find_secret_keys(tree: Any, path: str = "") -> list[str]:
    found = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            here = f"{path}.{key}" if path else str(key)
            if looks_secret(key):
                found.append(here)
            found.extend(_find_secret_keys(value, here))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            found.extend(_find_secret_keys(value, f"{path}[{index}]"))
    return found


def _refuse_secrets(found: list[str], origin: object) -> None:
    """Secret-looking keys are named, never their values."""
    if found:
        raise ConfigError(
            f"{origin}: keys that look like secrets are not allowed in configs: {', '.join(found)}",
            fix="remove them; credentials come from the AWS credential chain or Airflow connections",
        )


def _apply_override(tree: dict, dotted: str, text: str, origin: str) -> None:
    """Set one `a.b.c` override, its value parsed as YAML; a secret-looking key is refused before its value is read."""
    _refuse_secrets([dotted] if any(looks_secret(key) for key in dotted.split(".")) else [], origin)
    _set_path(tree, dotted, parse_yaml(text, origin, field=dotted), origin)


def _same_variant(base: dict, top: dict) -> bool:
    return all(base.get(tag) == top.get(tag) for tag in ("kind", "strategy") if tag in top)


def _deep_merge(base: dict, top: dict) -> dict:
    """Mappings merge key by key, except that a different `kind`/`strategy` replaces the whole mapping."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(value, dict) and isinstance(below, dict) and _same_variant(below, value):
            merged[key] = _deep_merge(below, value)
        else:
            merged[key] = value
    return merged


def _read_tree(path: Path, chain: tuple[Path, ...]) -> dict:
    """Read one YAML file; `extends: other.yaml` (relative to it) is merged underneath, mappings deeply."""
    if not path.is_file():
        raise ConfigError(f"release config {path} does not exist", fix="pass a file under configs/releases/")
    if path.resolve() in chain:
        raise ConfigError(f"{path}: `extends` loops back through {[str(p) for p in chain]}", fix="remove the cycle")
    tree = read_yaml_file(path, "release config")
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(tree).__name__}",
                          fix="see configs/releases/gemma-decision.yaml")
    parent = tree.pop("extends", None)
    if parent is None:
        return tree
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: extends must be a file name, got {parent!r}", fix="write extends: other.yaml")
    return _deep_merge(_read_tree(path.parent / parent, chain + (path.resolve(),)), tree)


def load_release_config(
    path: str | Path, *, overrides: list[str] | tuple[str, ...] = (), environ: dict[str, str] | None = None
) -> ReleaseConfig:
    """Read, layer and validate a release config; raise ConfigError naming file, field and fix."""
    path = Path(path)
    tree = _read_tree(path, chain=())
    environ = os.environ if environ is None else environ
    set_by: dict[str, str] = {}  # dotted key -> the override that wrote it (named in an unknown-key error)
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX):
            dotted = name.removeprefix(ENV_PREFIX).replace("__", ".")
            _apply_override(tree, dotted, environ[name], f"environment {name}")
            set_by.update(_written_keys(dotted, f"environment {name}"))
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set {key.strip()!r} has no '='", fix="write --set a.b=value")
        _apply_override(tree, key.strip(), value, f"--set {key.strip()}")
        set_by.update(_written_keys(key.strip(), f"--set {key.strip()}"))
    _refuse_secrets(_find_secret_keys(tree), path)
    try:
        return ReleaseConfig.model_validate(tree)
    except ValidationError as exc:
        text, fixes = format_validation_error(str(path), exc, tree, set_by)
        raise ConfigError(text, fix="; ".join(fixes) if fixes else "correct the fields listed above") from exc


def _written_keys(dotted: str, origin: str) -> dict[str, str]:
    """Every key an override `a.b.c` writes or creates (`a`, `a.b`, `a.b.c`), each named by the override."""
    keys = dotted.split(".")
    return {".".join(keys[:n]): origin for n in range(1, len(keys) + 1)}


def config_parts(value: Any, key: str = "") -> Iterator[tuple[str, BaseModel]]:
    """Every model inside a loaded config with its dotted key (`validation.datasets[0]`), the config itself first."""
    if isinstance(value, BaseModel):
        yield key, value
        for name in type(value).model_fields:
            yield from config_parts(getattr(value, name), f"{key}.{name}" if key else name)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from config_parts(item, f"{key}[{index}]")


def named_file_problem(key: str, part: BaseModel, config_dir: Path) -> str | None:
    """What is wrong with the file, folder or package one part of a config names (None: nothing, or it names none):
    a dataset, an artifact source given by path, a source installed from PyPI. S3 and Hugging Face sources are
    fetched by the stage that needs them, with its own timeouts, and not checked here."""
    kind = getattr(part, "kind", None)
    if isinstance(part, DatasetRef) or (kind == "path" and isinstance(getattr(part, "path", None), str)):
        path = local_path(part.path, config_dir)
        if not path.exists():
            return (f"{key}.path {part.path!r}: no such file or folder {path} (fix: correct the path; a relative "
                    f"one is read from the config's folder {config_dir})")
        if not os.access(path, os.R_OK) or (isinstance(part, DatasetRef) and not path.is_file()):
            what = "a folder, not a file" if path.is_dir() else "not readable by this user"
            return f"{key}.path {part.path!r}: {path} is {what} (fix: name a readable file)"
    if kind == "pypi":
        try:
            metadata.version(part.package)
        except metadata.PackageNotFoundError:
            return f"{key}.package {part.package!r} is not installed (fix: pip install {part.package})"
    return None


def require_named_files(config: ReleaseConfig, config_path: str | Path) -> None:
    """ConfigError naming every file, folder or package the config names that is not there or cannot be read, each
    with its key, its path and the fix: `config validate` and a release's first step run this before they write."""
    config_dir = Path(config_path).expanduser().resolve().parent
    problems = [problem for key, part in config_parts(config)
                if (problem := named_file_problem(key, part, config_dir)) is not None]
    if problems:
        raise ConfigError(f"{config_path} names what cannot be read: " + "; ".join(problems),
                          fix="correct each key listed, then run `shiplift config validate` again")
