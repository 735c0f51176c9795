"""JevBench-format decision tasks: load, validate and turn into SemIf decisions.

A task is one JSON object per line: id, family, group, split, state,
question{type, instructions, criteria}, labels (ordered), expected. The option order the
model sees is always the order of `labels`; the criteria dict only supplies descriptions
(its key order is meaningless: the public copies are key-sorted).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError, model_validator

from shiplift.tasks.errors import BadInput, NotFound
from shiplift.tasks.hashing import sha256_file
from shiplift.validation.jsonl import jsonl_values

QuestionType = Literal["noul", "choice", "score"]
MIN_OPTIONS = 2
MAX_OPTIONS = 16
NOUL_LABELS = frozenset({"no", "yes"})
# noul criteria may be keyed true/false (public JevBench) or yes/no.
NOUL_CRITERIA_KEYS = {"yes": ("true", "yes"), "no": ("false", "no")}

JsonState = StrictStr | dict[str, Any] | list[Any]


class Question(BaseModel):
    """The question part of a task: its type, the instructions shown, and the criteria."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: QuestionType
    instructions: StrictStr
    criteria: dict[str, StrictStr | None] | list[StrictStr] | None


class JevTask(BaseModel):
    """One JevBench decision task, validated so that it can be sent to a SemIf server."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: StrictStr
    family: StrictStr
    group: StrictStr | None
    split: StrictStr
    state: JsonState
    question: Question
    labels: tuple[StrictStr, ...]
    expected: StrictStr | StrictInt

    @model_validator(mode="after")
    def _check_consistency(self) -> JevTask:
        for name in ("id", "family", "split"):
            if not getattr(self, name).strip():
                raise ValueError(f"field '{name}': must be a non-empty string")
        if not self.question.instructions.strip():
            raise ValueError("field 'question.instructions': must be a non-empty string")
        if isinstance(self.state, str) and not self.state.strip():
            raise ValueError("field 'state': must be non-empty text (or a non-empty object/array)")
        if not isinstance(self.state, str) and len(self.state) == 0:
            raise ValueError("field 'state': must not be an empty object/array")
        if not MIN_OPTIONS <= len(self.labels) <= MAX_OPTIONS:
            raise ValueError(
                f"field 'labels': has {len(self.labels)} labels, need {MIN_OPTIONS}..{MAX_OPTIONS}"
            )
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"field 'labels': labels must be unique, got {list(self.labels)}")
        if any(not label.strip() for label in self.labels):
            raise ValueError("field 'labels': every label must be a non-empty string")
        {"noul": _check_noul, "choice": _check_choice, "score": _check_score}[self.question.type](
            self
        )
        return self

    @property
    def expected_label(self) -> str:
        """The expected answer as a label string (score ints become "0".."K-1")."""
        return str(self.expected)

    @property
    def option_descriptions(self) -> list[str]:
        """Option descriptions in `labels` order (a missing description is the label itself)."""
        criteria = self.question.criteria
        kind = self.question.type
        if kind == "score":
            assert isinstance(criteria, list)
            return list(criteria)
        if criteria is None:
            return list(self.labels)
        assert isinstance(criteria, dict)
        if kind == "noul":
            out = []
            for label in self.labels:
                keys = [k for k in NOUL_CRITERIA_KEYS[label] if criteria.get(k) is not None]
                out.append(criteria[keys[0]] if keys else label)
            return out
        return [criteria.get(label) or label for label in self.labels]

    def to_decision(self) -> dict[str, Any]:
        """The SemIf `decision` object for this task; option ids are the labels, in order."""
        return {
            "id": self.id,
            "state": self.state,
            "question": self.question.instructions,
            "options": [
                {"id": label, "description": description}
                for label, description in zip(self.labels, self.option_descriptions, strict=True)
            ],
        }


def _check_noul(task: JevTask) -> None:
    if set(task.labels) != NOUL_LABELS:
        raise ValueError(f"field 'labels': a noul task needs labels ['no', 'yes'], got {list(task.labels)}")
    if task.expected not in NOUL_LABELS:
        raise ValueError(f"field 'expected': a noul task expects 'yes' or 'no', got {task.expected!r}")
    criteria = task.question.criteria
    if isinstance(criteria, list):
        raise ValueError("field 'question.criteria': a noul task needs an object (true/false) or null")
    if criteria is not None:
        allowed = {key for keys in NOUL_CRITERIA_KEYS.values() for key in keys}
        unknown = sorted(set(criteria) - allowed)
        if unknown:
            raise ValueError(
                f"field 'question.criteria': unknown keys {unknown} for a noul task "
                "(use 'true'/'false' or 'yes'/'no')"
            )


def _check_choice(task: JevTask) -> None:
    if not isinstance(task.expected, str) or task.expected not in task.labels:
        raise ValueError(f"field 'expected': {task.expected!r} is not one of the labels {list(task.labels)}")
    criteria = task.question.criteria
    if isinstance(criteria, list):
        raise ValueError("field 'question.criteria': a choice task needs an object label -> description, or null")
    if criteria is not None and set(criteria) != set(task.labels):
        missing = sorted(set(task.labels) - set(criteria))
        extra = sorted(set(criteria) - set(task.labels))
        raise ValueError(
            f"field 'question.criteria': keys must be exactly the labels (missing {missing}, unknown {extra})"
        )


def _check_score(task: JevTask) -> None:
    count = len(task.labels)
    wanted = tuple(str(i) for i in range(count))
    if task.labels != wanted:
        raise ValueError(f"field 'labels': a score task needs labels {list(wanted)}, got {list(task.labels)}")
    criteria = task.question.criteria
    if not isinstance(criteria, list) or len(criteria) != count:
        raise ValueError(f"field 'question.criteria': a score task needs a list of {count} descriptions")
    if any(not text.strip() for text in criteria):
        raise ValueError("field 'question.criteria': score descriptions must be non-empty")
    if isinstance(task.expected, int):
        if not 0 <= task.expected < count:
            raise ValueError(f"field 'expected': score {task.expected} is outside 0..{count - 1}")
    elif task.expected not in wanted:
        raise ValueError(f"field 'expected': {task.expected!r} is not a score in 0..{count - 1}")


def _describe_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        if err["type"] == "value_error" and not err["loc"]:
            parts.append(str(err["ctx"]["error"]))
            continue
        field = ".".join(str(part) for part in err["loc"]) or "<record>"
        parts.append(f"field '{field}': {err['msg']}")
    return "; ".join(parts)


def parse_task(record: Any, *, where: str) -> JevTask:
    """Validate one decoded JSON record as a JevTask; `where` (e.g. "file:3") prefixes errors."""
    if not isinstance(record, dict):
        raise BadInput(
            f"{where}: a task must be a JSON object, got {type(record).__name__}",
            fix="write one JSON object per line",
        )
    try:
        return JevTask.model_validate(record)
    except ValidationError as exc:
        raise BadInput(
            f"{where}: {_describe_validation_error(exc)}",
            fix="follow the JevBench format (DESIGN §8.1): id, family, group, split, state, "
            "question{type, instructions, criteria}, labels, expected",
        ) from None


def load_jevbench(path: str | Path) -> list[JevTask]:
    """Read a JevBench JSONL file into validated tasks; errors name the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise NotFound(f"decision dataset {path} does not exist", fix="pass the path of a JevBench .jsonl file")
    tasks = [parse_task(record, where=f"{path}:{lineno}") for lineno, record in jsonl_values(path)]
    if not tasks:
        raise BadInput(f"{path}: the file holds no tasks", fix="give a JSONL file with at least one task")
    return tasks


def dataset_sha256(path: str | Path) -> str:
    """Hex sha256 of a dataset file's bytes, recorded in gate evidence."""
    return sha256_file(path)
