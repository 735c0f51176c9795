"""The answer-letter check (`check_letter_slots`): each letter is a single token the adapter can read out after the
answer cue."""

from __future__ import annotations

from pathlib import Path

from shiplift.tasks.artifacts.gguf_header import inspect_gguf
from shiplift.tasks.artifacts.llama_log import captured_llama_log
from shiplift.tasks.errors import BadInput, ConfigError

DEFAULT_LETTERS = "ABCDEFGHIJKLMNOP"
ANSWER_CUE = "Answer:"


def check_letter_slots(
    path: str | Path, letters: str = DEFAULT_LETTERS, *, cue: str = ANSWER_CUE
) -> dict[str, int]:
    """Map each answer letter to the single token the model emits for it right after the cue.

    The adapter reads the last-position logits after a prompt ending in ``cue`` ("Answer:"), so
    the token that matters is the one that text ``f"{cue} {letter}"`` adds after the cue's own
    tokens. With SentencePiece vocabularies that is the word-start piece "▁A" (detokenized " A"),
    not the bare "A". A letter passes when that addition is exactly one token, the cue's tokens
    are unchanged, and the token detokenizes to the letter (one leading space allowed). Letters
    must map to distinct tokens. Otherwise BadInput names the failing letters.
    """
    from llama_cpp import Llama

    if not letters or len(set(letters)) != len(letters) or not all(ch.strip() for ch in letters):
        raise ConfigError(
            f"letters must be distinct non-space characters, got {letters!r}",
            fix=f"use e.g. {DEFAULT_LETTERS!r}",
        )
    inspect_gguf(path)  # clear BadInput for non-GGUF files before llama.cpp sees them
    with captured_llama_log() as log:
        try:
            vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
        except ValueError as exc:
            detail = "; ".join(line for line in log if line) or str(exc)
            raise BadInput(
                f"llama.cpp could not load the vocabulary of {path}: {detail}",
                fix="use a GGUF model that llama.cpp can load",
            ) from exc
    try:
        cue_tokens = vocab.tokenize(cue.encode("utf-8"), add_bos=False, special=False)
        ids: dict[str, int] = {}
        failures: list[str] = []
        for letter in letters:
            tokens = vocab.tokenize(f"{cue} {letter}".encode(), add_bos=False, special=False)
            added = tokens[len(cue_tokens):]
            piece = vocab.detokenize(added).decode("utf-8", "replace") if added else ""
            if tokens[: len(cue_tokens)] != cue_tokens or len(added) != 1:
                failures.append(f"{letter} ({len(added)} tokens: {piece!r})")
            elif piece.removeprefix(" ") != letter:
                failures.append(f"{letter} (token {added[0]} detokenizes to {piece!r})")
            else:
                ids[letter] = added[0]
    finally:
        vocab.close()
    if failures:
        raise BadInput(
            f"{path}: answer letters are not single round-tripping tokens after {cue!r}: "
            + ", ".join(failures),
            fix="use a model whose vocabulary has single-token letters A..P",
        )
    if len(set(ids.values())) != len(ids):
        raise BadInput(
            f"{path}: answer letters share tokens: {ids}",
            fix="use a model whose vocabulary has a distinct token for each letter A..P",
        )
    return ids
