"""The decision prompt semif-prompt-v1 as text: the SemIf adapter scores it, the chat gate sends it as a user message.

One definition, so that the two readouts of the same model (SemIf's letter logits and the chat path's top
log-probabilities) are asked the same words and their answers can be compared task by task.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

PROMPT_VERSION = "semif-prompt-v1"
LETTERS = "ABCDEFGHIJKLMNOP"
# The prefix ends with the state (shared by decisions on the same state); the suffix carries the question, the
# lettered options and the cue.
PREFIX_TEMPLATE = (
    "Read the state, then answer the question by choosing exactly one of the options.\n\n"
    "State:\n{state}"
)
SUFFIX_TEMPLATE = (
    "\n\nQuestion:\n{question}\n\nOptions:\n{options}\nAnswer with the letter of the best option."
)


def canonical_json(value: Any) -> str:
    """A structured state as the model sees it: sorted keys, no spaces, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def state_text(state: Any) -> str:
    """The state as shown to the model: a string as is, an object or array as canonical JSON."""
    return state if isinstance(state, str) else canonical_json(state)


def prefix_text(state: str) -> str:
    return PREFIX_TEMPLATE.format(state=state)


def suffix_text(question: str, descriptions: Sequence[str]) -> str:
    letters = LETTERS[: len(descriptions)]
    options = "".join(f"{letter}. {description}\n" for letter, description in zip(letters, descriptions, strict=True))
    return SUFFIX_TEMPLATE.format(question=question, options=options)


def user_text(state: Any, question: str, descriptions: Sequence[str]) -> str:
    """The whole user turn of one decision (prefix then suffix), without any chat template around it."""
    return prefix_text(state_text(state)) + suffix_text(question, descriptions)
