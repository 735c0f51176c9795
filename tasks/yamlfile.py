"""Configuration YAML read as if hostile: bounded in size, nesting and alias expansion.

Duplicate keys, integers too long to be a setting and non-finite numbers are refused. Each
problem is a ConfigError naming the file, the place (line or field path) and the fix, and never
echoes the text around it, which may hold a value that should not be printed.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import yaml

from shiplift.tasks.errors import ConfigError

MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_EXPANDED_NODES = 20_000
MAX_INT_DIGITS = 30


class OversizedInteger:
    """Stands in for an integer literal with more digits than any setting takes, so the tree check can name its
    field."""

    def __init__(self, digits: int):
        self.digits = digits


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting and duplicate keys, and never converts a huge integer literal."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nesting deeper than {MAX_DEPTH} levels", self.peek_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (dict, list)):
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, "a key is itself a mapping or list",
                        key_node.start_mark
                    )
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        text = self.construct_scalar(node)
        digits = sum(char.isalnum() for char in text.removeprefix("-").removeprefix("+"))
        if digits > MAX_INT_DIGITS:
            return OversizedInteger(digits)
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """The parser's problem and where it is, without the snippet of the line (it may hold a secret)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        context = f" ({exc.context})" if exc.context and exc.problem else ""
        return f"{where}{exc.problem or exc.context}{context}"
    if isinstance(exc, yaml.reader.ReaderError):
        return f"character #x{exc.character:04x} at position {exc.position} is not allowed in YAML"
    return type(exc).__name__


def _place(field: str) -> str:
    return field or "(top level)"


def check_tree(tree: Any, origin: str, field: str = "") -> None:
    """Refuse a parsed tree that expands past MAX_EXPANDED_NODES through aliases, refers to itself,
    or holds a non-finite number or an over-long integer; the error names the field."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    budget = [MAX_EXPANDED_NODES]

    def spend(count: int, place: str) -> None:
        budget[0] -= count
        if budget[0] < 0:
            raise ConfigError(
                f"{origin}: at {_place(place)}, YAML aliases expand to more than {MAX_EXPANDED_NODES} values",
                fix="write the values out; a release config has a few hundred at most",
            )

    def visit(value: Any, place: str) -> int:
        if isinstance(value, OversizedInteger):
            raise ConfigError(
                f"{origin}: {_place(place)} is an integer of {value.digits} digits",
                fix=f"no setting takes more than {MAX_INT_DIGITS} digits; write the intended value",
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{origin}: {_place(place)} is {value}, not a finite number", fix="write a finite number")
        if not isinstance(value, (dict, list)):
            spend(1, place)
            return 1
        key = id(value)
        if key in open_nodes:
            raise ConfigError(f"{origin}: {_place(place)} contains itself through a YAML alias",
                              fix="remove the alias cycle")
        if key in sizes:
            spend(sizes[key], place)
            return sizes[key]
        open_nodes.add(key)
        items = value.items() if isinstance(value, dict) else enumerate(value)
        total = 1
        for name, child in items:
            here = f"{place}[{name}]" if isinstance(name, int) else (f"{place}.{name}" if place else str(name))
            total += visit(child, here)
        open_nodes.discard(key)
        sizes[key] = total
        spend(1, place)
        return total

    visit(tree, field)


def parse_yaml(text: str, origin: str, field: str = "") -> Any:
    """Parse one YAML document with the bounded loader and check the tree; `field` prefixes paths in errors."""
    try:
        loader = _BoundedLoader(text)
        try:
            tree = loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        raise ConfigError(f"{origin}: not valid YAML: {_yaml_problem(exc)}", fix="fix the YAML at that place") from None
    check_tree(tree, origin, field)
    return tree


def read_yaml_file(path: Path, what: str) -> Any:
    """Read and parse a YAML file (`what` names it in errors): at most MAX_FILE_BYTES, UTF-8 only."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ConfigError(f"{what} {path} is {size} bytes, over the limit of {MAX_FILE_BYTES}",
                              fix="point at the right file")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be read: {exc.strerror or exc}",
                          fix="check the path and its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: byte 0x{raw[exc.start]:02x} at offset {exc.start} is not UTF-8", fix="save the file as UTF-8"
        ) from None
    return parse_yaml(text, str(path))
