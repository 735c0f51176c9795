"""Check a request against the installed botocore service model, completely.

botocore's own `ParamValidator` checks required members, types and minimums only. SageMaker
refuses the rest late (a 64-character endpoint name, an instance type it does not know, a sixth
instance pool), so every request shiplift sends or prints in a dry run is also checked here for
maximum lengths and counts, numeric maximums, enums and patterns, read from the model's shapes.
The model's patterns are Java regular expressions; the few Java-only constructs they use are
translated and matched with the `regex` module (which knows `\\p{L}` and friends), as full matches.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import regex

from shiplift.tasks.errors import BadInput

_JAVA_ONLY = (
    (r"\p{Alnum}", "A-Za-z0-9"),
    (r"\p{ASCII}", r"\x00-\x7F"),
    (r"\p{Print}", r"\x20-\x7E"),
)
_UTF16_SUPPLEMENTARY = r"\uD800\uDC00-\uDBFF\uDFFF"  # Java spells "every character above U+FFFF" as surrogate pairs


@functools.cache
def service_model(service: str):
    """The installed botocore model of a service (`sagemaker`, `s3`, …), loaded once."""
    import botocore.session
    from botocore.exceptions import UnknownServiceError

    try:
        return botocore.session.get_session().get_service_model(service)
    except UnknownServiceError as exc:
        raise BadInput(f"botocore has no service {service!r}",
                       fix="use a service name such as sagemaker or s3") from exc


@functools.cache
def _compiled(pattern: str) -> regex.Pattern:
    """A model pattern as a `regex` pattern: Java-only classes spelled out, `\\z` as `\\Z`."""
    pattern = pattern.replace(_UTF16_SUPPLEMENTARY, r"\U00010000-\U0010FFFF")
    out, index, in_class = [], 0, False
    while index < len(pattern):
        java = next((j for j in _JAVA_ONLY if pattern.startswith(j[0], index)), None)
        if java:
            out.append(java[1] if in_class else f"[{java[1]}]")
            index += len(java[0])
            continue
        char = pattern[index]
        if char == "\\":
            out.append(pattern[index:index + 2])
            index += 2
            continue
        in_class = (in_class or char == "[") and not (in_class and char == "]")
        out.append(char)
        index += 1
    text = "".join(out).replace(r"\z", r"\Z")
    return regex.compile(re.sub(r"\$\{\d+,\d+\}", "$", text))


def operation_name(service: str, operation: str) -> str:
    """The model's operation name for `create_endpoint` or `CreateEndpoint`; BadInput when unknown."""
    model = service_model(service)
    if operation in model.operation_names:
        return operation
    camel = "".join(part[:1].upper() + part[1:] for part in operation.split("_"))
    by_lower = {name.lower(): name for name in model.operation_names}
    if camel.lower() in by_lower:
        return by_lower[camel.lower()]
    raise BadInput(f"{service} has no operation {operation!r}", fix="use an operation name from the botocore model")


def request_problems(service: str, operation: str, params: dict[str, Any]) -> list[str]:
    """Every way `params` breaks the input shape of `service.operation` (empty when it is valid)."""
    from botocore.validate import ParamValidator

    model = service_model(service)
    shape = model.operation_model(operation_name(service, operation)).input_shape
    if shape is None:
        return [] if not params else [f"{operation} takes no parameters, got {sorted(params)}"]
    report = ParamValidator().validate(params, shape)
    problems = [line.strip() for line in report.generate_report().splitlines()
                if line.strip()] if report.has_errors() else []
    _walk(shape, params, "", problems)
    return list(dict.fromkeys(problems))


def validate_request(service: str, operation: str, params: dict[str, Any]) -> None:
    """Raise BadInput naming the operation and every bad parameter; return quietly when valid."""
    problems = request_problems(service, operation, params)
    if problems:
        raise BadInput(
            f"{service} {operation_name(service, operation)} would be refused by the service model: "
            + "; ".join(problems),
            fix="correct the config values these parameters come from",
        )


def _walk(shape, value: Any, path: str, problems: list[str]) -> None:
    """The checks ParamValidator leaves out, depth first; type errors are ParamValidator's to report."""
    where = path or "(request)"
    meta = shape.metadata
    kind = shape.type_name
    if kind == "structure" and isinstance(value, dict):
        for name, member in value.items():
            if name in shape.members:
                _walk(shape.members[name], member, f"{path}.{name}" if path else name, problems)
        return
    if kind == "list" and isinstance(value, (list, tuple)):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{where}: {len(value)} items, at most {meta['max']} allowed")
        for index, item in enumerate(value):
            _walk(shape.member, item, f"{path}[{index}]", problems)
        return
    if kind == "map" and isinstance(value, dict):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{where}: {len(value)} entries, at most {meta['max']} allowed")
        for key, item in value.items():
            _walk(shape.key, key, f"{path} key {key!r}", problems)
            _walk(shape.value, item, f"{path}[{key!r}]", problems)
        return
    _check_scalar(shape, value, where, problems)


def _check_scalar(shape, value: Any, where: str, problems: list[str]) -> None:
    """A string's, number's or blob's limits: its length or value, enum and pattern."""
    meta = shape.metadata
    kind = shape.type_name
    if kind == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            problems.append(f"{where}: {len(value)} characters, at most {meta['max']} allowed")
        if shape.enum and value not in shape.enum:
            shown = ", ".join(shape.enum[:8]) + (", …" if len(shape.enum) > 8 else "")
            problems.append(f"{where}: {value!r} is not one of the allowed values ({shown})")
        if "pattern" in meta and not _compiled(meta["pattern"]).fullmatch(value):
            problems.append(f"{where}: {value!r} does not match the pattern {meta['pattern']}")
        return
    if (kind in ("integer", "long", "float", "double") and isinstance(value, (int, float))
            and not isinstance(value, bool)):
        if "max" in meta and value > meta["max"]:
            problems.append(f"{where}: {value} is above the maximum {meta['max']}")
        return
    if kind == "blob" and isinstance(value, (bytes, bytearray)) and "max" in meta and len(value) > meta["max"]:
        problems.append(f"{where}: {len(value)} bytes, at most {meta['max']} allowed")


def request_applied(live: Any, wanted: Any) -> bool:
    """Whether a resource's description holds everything a request asked for (AWS adds defaults of its own)."""
    if isinstance(wanted, dict):
        return isinstance(live, dict) and all(request_applied(live.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (isinstance(live, list) and len(live) == len(wanted)
                and all(request_applied(a, b) for a, b in zip(live, wanted, strict=True)))
    return live == wanted
