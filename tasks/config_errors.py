"""A bad release config's error report: each problem at the path the user wrote, and for an unknown key the closest
valid key(s) of that level (`did_you_mean`), found by walking the config's models along pydantic's error location."""

from __future__ import annotations

import difflib
import re
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

from shiplift.tasks.config_release import ReleaseConfig
from shiplift.tasks.config_types import URL_PASSWORD
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.families.registry import artifact_models, family_of, image_models, validation_models

PRIVATE_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|$)")


def _field_path(tree: Any, loc: tuple) -> str:
    """The error location as the user wrote it: union tags that pydantic adds (`semif`, `pypi`) are dropped."""
    parts, node = [], tree
    for step in loc:
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and step < len(node):
            node = node[step]
        elif isinstance(node, (dict, list)) and step != loc[-1]:
            continue
        else:
            node = None
        parts.append(f"[{step}]" if isinstance(step, int) else str(step))
    return ".".join(parts).replace(".[", "[") or "(top level)"


FAMILY_PARTS = {"artifact": artifact_models, "image": image_models, "validation": validation_models}


def _members(annotation: Any) -> list:
    """What a field's annotation may hold, one entry per alternative (through Annotated, unions and Optional)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin in (Union, UnionType):
        return [member for arg in get_args(annotation) for member in _members(arg)]
    return [annotation]


def _is_model(candidate: Any) -> bool:
    return isinstance(candidate, type) and issubclass(candidate, BaseModel)


def _tags(model: type[BaseModel]) -> dict[str, Any]:
    """The Literal fields of a model (`strategy: Literal["canary"]`): what tells it apart in a tagged union."""
    return {name: get_args(info.annotation) for name, info in model.model_fields.items()
            if get_origin(info.annotation) is Literal}


def _narrowed(candidates: list, node: Any) -> list:
    """The models among `candidates` whose tags (`kind`, `strategy`) the user's mapping names, when it names any."""
    models = [c for c in candidates if _is_model(c)]
    if len(models) < 2 or not isinstance(node, dict):
        return models
    chosen = [m for m in models if all(node[k] in values for k, values in _tags(m).items() if k in node)
              and any(k in node for k in _tags(m))]
    return chosen or models


def _family_models(part: str, node: Any, tree: Any) -> list:
    """The family classes that validate `artifact`, `image` or `validation` (chosen by kind, as `_family_part`)."""
    models = FAMILY_PARTS[part]()
    kind = node.get("kind") if isinstance(node, dict) else None
    if part == "validation" and kind is None and isinstance(tree, dict):
        try:
            kind = family_of(tree["artifact"]["kind"], tree["image"]["kind"]).validation_kind
        except Exception:  # noqa: BLE001 - no family follows from what is there: every gate's keys
            kind = None
    return [models[kind]] if isinstance(kind, str) and kind in models else list(models.values())


def _key_context(loc: tuple, tree: Any) -> tuple[list, list[str]] | None:
    """(the model classes that hold the key `loc[-1]`, the path to it as the user wrote it), walking the config's
    models along the error's location: a tagged union's variant (the tag pydantic inserts into `loc`), a family part's
    class (by its kind), list items; None when the location leads to no model."""
    candidates: list = [ReleaseConfig]
    node, parts, tagged = tree, [], False
    for step in loc[:-1]:
        if tagged:  # pydantic names the variant of a tagged union it tried: not a key the user wrote
            tagged = False
            chosen = [m for m in candidates if _is_model(m) and any(step in values for values in _tags(m).values())]
            candidates = chosen or candidates
            continue
        if isinstance(step, int):
            candidates = [get_args(c)[0] for c in candidates if get_origin(c) in (list, tuple) and get_args(c)]
            node = node[step] if isinstance(node, list) and 0 <= step < len(node) else None
            parts.append(f"[{step}]")
            continue
        child = node.get(step) if isinstance(node, dict) else None
        models = _narrowed(candidates, node)
        holder = next((m for m in models if step in m.model_fields), None)
        if holder is None:
            values = [get_args(c)[1] for c in candidates if get_origin(c) is dict and len(get_args(c)) == 2]
            if not values:
                return None
            candidates = [member for value in values for member in _members(value)]
        elif holder is ReleaseConfig and step in FAMILY_PARTS:
            candidates = _family_models(step, child, tree)
        else:
            info = holder.model_fields[step]
            candidates, tagged = _members(info.annotation), info.discriminator is not None
        node = child
        parts.append(str(step))
    models = _narrowed(candidates, node)
    return (models, parts) if models else None


def did_you_mean(loc: tuple, tree: Any) -> tuple[str, list[str], list[str]] | None:
    """For an unknown key at `loc`: (its path as written, the closest valid keys as full paths, every valid key at
    that level); the closest are looked for among the keys of that level, then one level down
    (`validation.min_accuracy` → `validation.thresholds.min_accuracy`). None when the level cannot be told."""
    try:
        found = _key_context(tuple(loc), tree)
        key = loc[-1]
        if found is None or not isinstance(key, str):
            return None
        models, parts = found
        names = list(dict.fromkeys(name for model in models for name in model.model_fields))
        close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
        if not close:
            below = list(dict.fromkeys(
                f"{name}.{inner}" for model in models for name, info in model.model_fields.items()
                for member in _members(info.annotation) if _is_model(member) for inner in member.model_fields))
            by_leaf: dict[str, list[str]] = {}
            for dotted in below:
                by_leaf.setdefault(dotted.rsplit(".", 1)[1], []).append(dotted)
            close = [d for leaf in difflib.get_close_matches(key, list(by_leaf), n=3, cutoff=0.75)
                     for d in by_leaf[leaf]]
        prefix = ".".join(parts).replace(".[", "[")

        def full(name: str) -> str:
            return f"{prefix}.{name}" if prefix else name

        return full(key), [full(name) for name in close], names
    except Exception:  # noqa: BLE001 - a suggestion is a courtesy: never the reason an error is not reported
        return None


def format_validation_error(origin: str, exc: ValidationError, tree: Any,
                            set_by: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The error's lines (one per problem, at the path the user wrote) and the fixes it can name: for an unknown key,
    the closest valid key(s) of that level of the config (a --set or environment override is named as such)."""
    lines, fixes = [], []
    for err in exc.errors():
        where = _field_path(tree, err["loc"])
        got = err.get("input")
        shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
        shown = URL_PASSWORD.sub(r"\1***@", shown)  # a refused ledger_url must not echo its password
        shown = PRIVATE_PEM.sub("<a private key, not shown>", shown)  # one pasted where a public key belongs
        line = f"  {where}: {err['msg']} (got {shown})"
        hint = did_you_mean(err["loc"], tree) if err["type"] == "extra_forbidden" else None
        if hint is not None:
            written, close, names = hint
            origin_of = (set_by or {}).get(written)
            line = f"  {written}: unknown key{f' (from {origin_of})' if origin_of else ''}: {err['msg']} (got {shown})"
            if close:
                line += f"; did you mean {' or '.join(close)}?"
                if origin_of and origin_of.startswith("--set "):
                    typed = origin_of.removeprefix("--set ")
                    fixes.append(f"write --set {close[0]}{typed[len(written):]}=… instead of --set {typed}=…")
                else:
                    fixes.append(f"rename {written} to {close[0]}")
            else:
                line += f"; the keys there are: {', '.join(names)}"
                fixes.append(f"remove {written}, or use one of the keys listed")
        lines.append(line)
    return f"{origin}: invalid release config\n" + "\n".join(lines), fixes


def validate_file(model: type[BaseModel], tree: Any, origin: str, what: str) -> Any:
    """`tree` (read from the file `origin`) as `model`; ConfigError with a line per problem at the path the user wrote
    and the fixes `format_validation_error` names, calling the file `what` ("sweep config", "sizes file")."""
    try:
        return model.model_validate(tree)
    except ValidationError as exc:
        text, fixes = format_validation_error(origin, exc, tree)
        raise ConfigError(text.replace("invalid release config", f"invalid {what}", 1),
                          fix="; ".join(fixes) if fixes else "correct the fields listed above") from exc
