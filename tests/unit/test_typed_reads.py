"""Readers of the ledger read stage results and record payloads through their typed models
(`tasks.ledger.stage_results`, `tasks.ledger.records`), never by string key: outside those decoder modules, no
`payload["endpoint"]` or `payload.get("decision")` whose key is a field of one of their models, on something that
holds a record's payload.

What holds one: a record's `.payload` (and `ReleaseState.opened`, the opened record's payload), a stage entry's
`["result"]`, a function's parameter called `payload` (in a module that imports the ledger), a name assigned from any
of those in the same function, a field read from one (`payload.get("gate")` holds the gate), and a call of a function
of the same module that returns one. Dicts that are not ledger payloads (configs, AWS API answers, the views' own
output rows) are never flagged, whatever their keys.

Measured on tasks/ with this scan (the fields of the final decoder modules): 174 such reads before issue 46, none after.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pydantic import BaseModel

from shiplift.tasks.ledger import records, stage_results

ROOT = Path(__file__).resolve().parents[2]
DECODERS = (stage_results, records)  # the modules that may read payloads by key: they decode them
DECODER_FILES = {Path(inspect.getfile(module)).relative_to(ROOT).as_posix() for module in DECODERS}


def payload_fields() -> frozenset[str]:
    """Every field name of every model the decoder modules define: the keys a reader must not read by string."""
    return frozenset(name for module in DECODERS for value in vars(module).values()
                     if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == module.__name__
                     for name in value.model_fields)


def _key_read(node: ast.AST) -> tuple[ast.expr, str] | None:
    """(receiver, key) of `x["key"]` or `x.get("key", …)`, else None."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.value, node.slice.value
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return node.func.value, node.args[0].value
    return None


class _Scope:
    """What holds a payload in one function (or the module's top level): names bound to one, functions returning one."""

    def __init__(self, fields: frozenset[str], returning: frozenset[str], bound: set[str]):
        self.fields, self.returning, self.bound = fields, returning, bound

    def holds_payload(self, expr: ast.expr) -> bool:
        """Whether `expr` holds a record's payload (or a part of one) here."""
        if isinstance(expr, ast.Attribute):
            return expr.attr in ("payload", "opened")
        if isinstance(expr, ast.Name):
            return expr.id in self.bound
        if isinstance(expr, ast.BoolOp):
            return self.holds_payload(expr.values[0])
        if isinstance(expr, ast.IfExp):  # `record.payload if record else {}`
            return self.holds_payload(expr.body) or self.holds_payload(expr.orelse)
        if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name):
            return expr.func.id in self.returning
        read = _key_read(expr)
        if read is None:
            return False
        receiver, key = read
        if key == "result":  # `state.stage(name)["result"]`
            called = receiver.func if isinstance(receiver, ast.Call) else None
            return isinstance(called, ast.Attribute) and called.attr == "stage"
        return key in self.fields and self.holds_payload(receiver)

    def bind(self, statements: list[ast.stmt]) -> None:
        """Bind the names assigned from a payload holder (`a, b = x.payload, …` binds `a`); a name also assigned
        anything else is unbound again (an HTTP body called `payload` is not a record's)."""
        for node in (n for statement in statements for n in ast.walk(statement)):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                target, value = (node.targets[0] if isinstance(node, ast.Assign) else node.target), node.value
                unpacked = (isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                            and len(target.elts) == len(value.elts))
                pairs = zip(target.elts, value.elts, strict=True) if unpacked else [(target, value)]
                for name, assigned in ((t.id, v) for t, v in pairs if isinstance(t, ast.Name)):
                    (self.bound.add if self.holds_payload(assigned) else self.bound.discard)(name)


def _payload_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """{"payload"} where the function takes a parameter of that name, else {}."""
    arguments = function.args
    return {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs] if a.arg == "payload"}


def _imports_the_ledger(tree: ast.AST) -> bool:
    """Whether a module imports anything of `tasks.ledger`: one that does not (an HTTP server reading its request body
    as `payload`) holds no record's payload in a parameter."""
    return any(isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shiplift.tasks.ledger")
               or isinstance(node, ast.Import) and any(a.name.startswith("shiplift.tasks.ledger") for a in node.names)
               for node in ast.walk(tree))


def string_key_reads(source: str, fields: frozenset[str]) -> list[tuple[int, str]]:
    """(line, key) of every string-key read of a payload field in `source`."""
    tree = ast.parse(source)
    functions = [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    top = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    ledger_reader = _imports_the_ledger(tree)

    def scope(body: list[ast.stmt], parameters: set[str], returning: set[str]) -> _Scope:
        found = _Scope(fields, frozenset(returning), set(parameters) if ledger_reader else set())
        found.bind(body)
        return found

    returning: set[str] = set()
    for _ in range(2):  # twice: a function returning what another one returns
        for function in functions:
            returns = [n.value for n in ast.walk(function) if isinstance(n, ast.Return) and n.value is not None]
            within = scope(function.body, _payload_parameters(function), returning)
            if returns and all(within.holds_payload(value) for value in returns):
                returning.add(function.name)
    reads = set()
    for body, parameters in [(top, set()), *[(f.body, _payload_parameters(f)) for f in functions]]:
        within = scope(body, parameters, returning)
        for node in (n for statement in body for n in ast.walk(statement)):
            read = _key_read(node)
            if read is not None and read[1] in fields and within.holds_payload(read[0]):
                reads.add((node.lineno, read[1]))
    return sorted(reads)


def reads_in_tasks() -> dict[str, list[tuple[int, str]]]:
    """Per file of tasks/ (the decoder modules left out), its string-key reads of payload fields."""
    fields = payload_fields()
    found = {}
    for path in sorted((ROOT / "tasks").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name in DECODER_FILES:
            continue
        if reads := string_key_reads(path.read_text(encoding="utf-8"), fields):
            found[name] = reads
    return found


def test_no_reader_reads_a_payload_field_by_string_key():
    found = reads_in_tasks()
    problems = [f"{name}:{line} reads {key!r} by string key" for name, reads in found.items() for line, key in reads]
    assert problems == [], "read it through tasks.ledger.records / stage_results instead:\n" + "\n".join(problems)


def test_the_scan_finds_reads_of_payloads_and_ignores_other_dicts():
    fields = payload_fields()
    source = '''from shiplift.tasks.ledger import events

def http(body):
    payload = body.json()
    return payload["copies"]

def view(record, state, config, answer):
    payload = record.payload
    moved = (payload.get("moved_from") or {}).get("endpoint")
    gate = state.stage("validate")["result"]
    summary = {"decision": gate["decision"], "copies": record.payload["copies"]}
    return config["endpoint"], answer.get("decision"), summary["decision"], state.opened.get("config")

def text(payload):
    return payload["phase"]
'''
    found = [(9, "endpoint"), (9, "moved_from"), (11, "copies"), (11, "decision"), (12, "config"), (15, "phase")]
    assert string_key_reads(source, fields) == found
    outside_the_ledger = source.replace("from shiplift.tasks.ledger import events", "import json")
    assert string_key_reads(outside_the_ledger, fields) == found[:-1], "a `payload` parameter there is not a record's"
