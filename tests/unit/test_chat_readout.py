"""The chat readout (issue 19): a decision task asked as a chat completion, options read from top log-probabilities.

Reference values are worked by hand from the OpenAI chat completions contract
(https://platform.openai.com/docs/api-reference/chat/object: `choices[].logprobs.content[].top_logprobs[]` of
`{token, logprob}`), not by this module's code.
"""

from __future__ import annotations

import json
import math

import pytest

from shiplift.images.common.decision_prompt import user_text
from shiplift.validation.decisions.chat_readout import ChatReadout, chat_messages, readout_losses
from shiplift.validation.decisions.jevbench import JevTask
from shiplift.validation.transport import Malformed

SHA = "ab" * 32


def task(labels=("yes", "no")) -> JevTask:
    return JevTask.model_validate({
        "id": "t1", "family": "f", "group": None, "split": "test", "state": {"b": 2, "a": "ü"},
        "question": {"type": "choice", "instructions": "Pick one", "criteria": None},
        "labels": list(labels), "expected": labels[0],
    })


def answer(top: list[tuple[str, float]], generated: str = "A", model: str = f"/opt/ml/model/{SHA}.gguf") -> bytes:
    return json.dumps({"model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": generated},
                       "logprobs": {"content": [{"token": generated, "logprob": top[0][1],
                                                 "top_logprobs": [{"token": t, "logprob": lp} for t,
                                                                  lp in top]}]}}]}).encode()


def test_the_request_asks_one_token_with_top_logprobs_in_semif_words():
    readout = ChatReadout(top_logprobs=7)
    body = json.loads(readout.body(task()))
    assert body["max_tokens"] == 1 and body["temperature"] == 0 and body["logprobs"] is True
    assert body["top_logprobs"] == 7
    [message] = body["messages"]
    assert message["role"] == "user"
    # semif-prompt-v1: the state as canonical JSON (sorted keys, UTF-8 kept), then the lettered options and the cue
    assert message["content"] == (
        'Read the state, then answer the question by choosing exactly one of the options.\n\nState:\n{"a":"ü","b":2}'
        "\n\nQuestion:\nPick one\n\nOptions:\nA. yes\nB. no\n\nAnswer with the letter of the best option."
    )
    assert chat_messages(task()) == body["messages"]
    assert user_text({"a": "ü", "b": 2}, "Pick one", ["yes", "no"]) == message["content"]


def test_letters_spelled_apart_are_summed_and_normalised():
    # A: e^-1 + e^-2 = 0.503214724; B: e^-1.5 = 0.223130160; mass 0.726344884 → p(A) = 0.692804, p(B) = 0.307196
    fields = ChatReadout().parse(task(), answer([("A", -1.0), ("B", -1.5), (" A", -2.0), ("Hello", -3.0)]))
    assert fields["probabilities"] == pytest.approx([0.6928041, 0.3071959], abs=1e-6)
    assert fields["allowed_token_mass"] == pytest.approx(0.726344884, abs=1e-8)
    assert fields["option_logits"] == pytest.approx([math.log(0.503214724), -1.5], abs=1e-8)
    assert fields["missing_letters"] == [] and fields["generated_token"] == "A" and fields["model_sha256"] == SHA


def test_a_missing_letter_makes_the_task_invalid_never_guessed():
    fields = ChatReadout().parse(task(("x", "y", "z")), answer([("A", -0.1), ("B", -3.0), ("The", -4.0)]))
    assert fields["missing_letters"] == ["C"]
    assert fields["probabilities"] is None and fields["allowed_token_mass"] is None


def test_the_model_is_named_only_by_a_sha256_file_name():
    assert ChatReadout().parse(task(), answer([("A", -1.0), ("B", -1.0)], model="gemma"))["model_sha256"] is None


@pytest.mark.parametrize("body, needle", [
    (b"not json", "not JSON"),
    (json.dumps({"choices": []}).encode(), "single 'choices'"),
    (json.dumps({"choices": [{"logprobs": None}]}).encode(), "was logprobs asked"),
    (json.dumps({"choices": [{"logprobs": {"content": [{"token": "A", "logprob": 0.5,
                                                        "top_logprobs": []}]}}]}).encode(),
     "logprob <= 0"),
    (json.dumps({"choices": [{"logprobs": {"content": [{"token": "A", "logprob": -1,
                                                        "top_logprobs": [{"token": 3}]}]}}]}).encode(),
     "top_logprobs[0]"),
])
def test_an_answer_that_is_not_a_chat_completion_with_logprobs_is_malformed(body, needle):
    with pytest.raises(Malformed) as caught:
        ChatReadout().parse(task(), body)
    assert needle in str(caught.value)


def test_top_logprobs_beyond_the_api_bound_and_more_shots_than_examples_are_refused():
    with pytest.raises(ValueError, match=r"\[1, 20\]"):
        ChatReadout(top_logprobs=21)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        ChatReadout(shots=4)


def test_shots_are_solved_examples_asked_first_with_different_letters():
    messages = ChatReadout(shots=2).request(task())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert [messages[1]["content"], messages[3]["content"]] == ["B", "A"]
    assert "A. Drive on through the crossing\nB. Stop and wait\n" in messages[0]["content"]
    assert messages[-1] == chat_messages(task())[0]


def test_losses_count_missing_letters_and_non_letter_tokens_over_answered_rows():
    rows = [
        {"option_ids": ["a", "b"], "generated_token": "A", "missing_letters": []},
        {"option_ids": ["a", "b"], "generated_token": " B", "missing_letters": []},  # spaced letter counts as a letter
        {"option_ids": ["a", "b"], "generated_token": "C", "missing_letters": ["B"]},  # C is not an option here
        {"option_ids": ["a", "b"], "generated_token": "Hello", "missing_letters": []},
        {"option_ids": ["a", "b"], "generated_token": None, "missing_letters": None},  # the request failed
    ]
    losses = readout_losses(rows)
    assert losses["answered"] == 4 and losses["unanswered"] == 1
    assert losses["missing_letter_share"] == 0.25 and losses["non_letter_generated_share"] == 0.5
