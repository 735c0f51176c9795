"""The chat path's readout of a decision task (issue 19): one chat completion, letters read from top log-probabilities.

The task is asked with the same words as SemIf (`images/common/decision_prompt.py`, semif-prompt-v1) as one user
message, with `max_tokens: 1`, `temperature: 0`, `logprobs: true` and `top_logprobs: N` (OpenAI's chat completions
contract, which llama-server and llama-cpp-python's server follow). An option's log-probability is the log of the
summed probability of the top entries whose text, stripped of spaces, is its letter (a tokenizer may spell "B" and
" B" apart). What this readout loses against SemIf's full-vocabulary softmax is reported, not hidden: a task where
some option's letter is not among the top N is *invalid* (never guessed), and the generated token may not be a letter.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from shiplift.images.common.decision_prompt import LETTERS, PROMPT_VERSION, user_text
from shiplift.validation.decisions.jevbench import JevTask
from shiplift.validation.transport import Malformed, json_body

MAX_TOP_LOGPROBS = 20  # the OpenAI API's bound, which llama-server also applies
MODEL_FILE = re.compile(r"(?:^|/)([0-9a-f]{64})\.gguf$")  # the package names its GGUF by its sha256


# Solved examples a readout may ask first (`shots`), each as a user turn and the assistant's letter: a base model that
# was never tuned to follow a chat turn answers the task with a letter only once it has seen this done. They are
# written here, apart from every dataset, so no gated task leaks into the prompt; their answers differ in letter.
EXAMPLES = (
    ({"light": "red", "crossing": "pedestrians on the road"}, "What should the driver do?",
     ["Drive on through the crossing", "Stop and wait", "Sound the horn and drive on"], "B"),
    ("The kettle has boiled and the tea bag is in the cup.", "What is the next step?",
     ["Pour the water into the cup", "Put the kettle back in the cupboard", "Throw the tea bag away"], "A"),
    ({"battery": "3%", "charger": "on the desk", "meeting": "in 2 hours"}, "What should the owner do with the phone?",
     ["Start a long video call", "Turn on the torch", "Plug it into the charger"], "C"),
)


def chat_messages(task: JevTask, shots: int = 0) -> list[dict[str, str]]:
    """The messages that ask a task (semif-prompt-v1's text), after `shots` solved examples."""
    decision = task.to_decision()
    messages = []
    for state, question, descriptions, letter in EXAMPLES[:shots]:
        messages += [{"role": "user", "content": user_text(state, question, descriptions)},
                     {"role": "assistant", "content": letter}]
    text = user_text(decision["state"], decision["question"], [o["description"] for o in decision["options"]])
    return [*messages, {"role": "user", "content": text}]


def _logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _entries(value: Any, where: str) -> list[tuple[str, float]]:
    if not isinstance(value, list):
        raise Malformed(f"response field '{where}' is not an array")
    found = []
    for index, entry in enumerate(value):
        token, logprob = (entry.get("token"), entry.get("logprob")) if isinstance(entry, dict) else (None, None)
        number = isinstance(logprob, (int, float)) and not isinstance(logprob, bool)
        if not isinstance(token, str) or not number or not (logprob == -math.inf or -math.inf < logprob <= 1e-6):
            raise Malformed(f"response field '{where}[{index}]' is not a {{token, logprob <= 0}} pair")
        found.append((token, float(logprob)))
    return found


class ChatReadout:
    """Ask a task as a chat completion and read option probabilities from the first token's top log-probabilities."""

    name = "chat"

    def __init__(self, top_logprobs: int = MAX_TOP_LOGPROBS, shots: int = 0):
        if not 1 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [1, {MAX_TOP_LOGPROBS}], got {top_logprobs}")
        if not 0 <= shots <= len(EXAMPLES):
            raise ValueError(f"shots must be in [0, {len(EXAMPLES)}] (the solved examples there are), got {shots}")
        self.top_logprobs, self.shots = top_logprobs, shots

    def request(self, task: JevTask) -> dict[str, Any]:
        return {"messages": chat_messages(task, self.shots), "max_tokens": 1, "temperature": 0, "logprobs": True,
                "top_logprobs": self.top_logprobs}

    def body(self, task: JevTask) -> bytes:
        return json.dumps(self.request(task), ensure_ascii=False).encode("utf-8")

    def parse(self, task: JevTask, data: bytes) -> dict[str, Any]:
        payload = json_body(data)
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
            raise Malformed("response has no single 'choices' entry")
        logprobs = choices[0].get("logprobs")
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if not isinstance(content, list) or not content or not isinstance(content[0], dict):
            raise Malformed("response has no 'choices[0].logprobs.content' for its first token (was logprobs asked?)")
        [(generated, _)] = _entries([content[0]], "choices[0].logprobs.content")
        top = _entries(content[0].get("top_logprobs"), "choices[0].logprobs.content[0].top_logprobs")
        letters = LETTERS[: len(task.labels)]
        by_letter = {letter: [lp for token, lp in top if token.strip() == letter] for letter in letters}
        missing = [letter for letter in letters if not by_letter[letter]]
        model = payload.get("model")
        named = MODEL_FILE.search(model) if isinstance(model, str) else None
        fields: dict[str, Any] = {
            "model_sha256": named[1] if named else None, "generated_token": generated, "missing_letters": missing,
            "temperature": None, "server_forward_ms": None, "server_total_ms": None,
        }
        if missing:  # invalid, never guessed: a missing letter's probability is unknown, not zero
            return {**fields, "probabilities": None, "option_logits": None, "allowed_token_mass": None}
        log_mass = [_logsumexp(by_letter[letter]) for letter in letters]
        total = _logsumexp(log_mass)
        return {**fields, "option_logits": log_mass, "probabilities": [math.exp(v - total) for v in log_mass],
                "allowed_token_mass": min(1.0, math.exp(total))}


    def losses(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        return readout_losses(rows, self.shots)


def readout_losses(rows: Sequence[Mapping[str, Any]], shots: int = 0) -> dict[str, Any]:
    """What the chat readout lost over answered rows: the shares with a missing letter and with a non-letter token."""
    answered = [row for row in rows if row.get("generated_token") is not None]
    n = len(answered)
    missing = sum(1 for row in answered if row.get("missing_letters"))
    non_letter = sum(1 for row in answered if row["generated_token"].strip() not in LETTERS[: len(row["option_ids"])])
    return {
        "name": "chat", "prompt_version": PROMPT_VERSION, "shots": shots, "answered": n, "unanswered": len(rows) - n,
        "missing_letter_share": missing / n if n else None,
        "non_letter_generated_share": non_letter / n if n else None,
    }
