"""Tiny, deterministic llama-architecture GGUF models for tests and offline demos.

The models have random weights (numpy ``default_rng(seed)``), so they predict nothing useful,
but llama.cpp loads, tokenizes, evaluates and quantizes them exactly like a real model.
The vocabulary is SentencePiece-style (``tokenizer.ggml.model = "llama"``):

- control tokens ``<unk>`` (0), ``<s>`` (1), ``</s>`` (2);
- the 256 byte-fallback tokens ``<0x00>``..``<0xFF>`` (3..258), so any UTF-8 text tokenizes;
- ``▁`` and the printable ASCII characters as single tokens;
- the answer letters ``A``..``P`` and their word-start forms ``▁A``..``▁P``;
- a few common word pieces (every prefix of each piece is a token too, because the SPM
  tokenizer only reaches a piece through merges of pieces already in the vocabulary).

With ``letters_single_token=False`` the letter ``K`` (both ``K`` and ``▁K``) is left out of the
vocabulary, so ``K`` falls back to its byte token and is not a single round-tripping token.

CLI: ``python -m shiplift.tasks.artifacts.tiny_gguf OUT.gguf --seed N [--dtype F16]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np

from shiplift.tasks.errors import ConfigError

SPACE = "\u2581"  # SentencePiece's word-boundary marker "▁"
LETTERS = "ABCDEFGHIJKLMNOP"
MISSING_LETTER = "K"  # left out when letters_single_token=False
WORD_PIECES = (
    "Answer", "Question", "Options", "Option", "State", "Choose", "the", "and", "of", "to",
    "in", "is", "a", "an", "or", "no", "yes", "not", "with", "for", "that", "this", "which",
    "best", "answer", "question", "option", "letter", "one", "true", "false", "score",
)
DTYPES = {"F32": (np.float32, 0), "F16": (np.float16, 1)}  # numpy dtype, llama_ftype id
# A minimal turn-based template in the Gemma style, for tiny chat models (the tokens are plain text in this vocabulary).
CHAT_TEMPLATES = {
    "turns": (
        "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' "
        "else message['role'] }}\n{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    ),
}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_BYTE = 1, 2, 3, 6


def _vocabulary(letters_single_token: bool) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types of the tiny SPM vocabulary (deterministic order)."""
    excluded = set() if letters_single_token else {MISSING_LETTER}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_CONTROL] + [TOKEN_BYTE] * 256
    normal: list[str] = [SPACE]
    normal += [f"{SPACE}{letter}" for letter in LETTERS if letter not in excluded]
    normal += [chr(c) for c in range(33, 127) if chr(c) not in excluded]
    for word in WORD_PIECES:
        for piece in (f"{SPACE}{word}", word):
            normal += [piece[:end] for end in range(2, len(piece) + 1)]
    seen: set[str] = set()
    unique = [piece for piece in normal if not (piece in seen or seen.add(piece))]
    tokens += unique
    types += [TOKEN_NORMAL] * len(unique)
    # SPM merges prefer higher scores: favour longer pieces, break ties by order.
    scores = [0.0] * (3 + 256) + [
        float(len(piece)) - index / 1e4 for index, piece in enumerate(unique)
    ]
    return tokens, scores, types


def _check_shape(dtype: str, *, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_ctx: int) -> None:
    """Refuse a dtype or shape `write_tiny_gguf` cannot write (ConfigError)."""
    if dtype not in DTYPES:
        raise ConfigError(
            f"tiny model dtype {dtype!r} is not supported", fix=f"use one of {sorted(DTYPES)}"
        )
    if n_embd % 256 or n_ff % 256:
        raise ConfigError(
            f"n_embd={n_embd} and n_ff={n_ff} must be multiples of 256",
            fix="use multiples of 256 so k-quants (block size 256) really quantize every matrix",
        )
    if n_layer < 1 or n_head < 1 or n_embd % n_head or n_ctx < 1:
        raise ConfigError(
            f"bad tiny model shape n_layer={n_layer} n_head={n_head} n_embd={n_embd} n_ctx={n_ctx}",
            fix="use n_layer >= 1, n_ctx >= 1 and an n_head that divides n_embd",
        )


def write_tiny_gguf(
    path: str | Path,
    *,
    seed: int = 0,
    dtype: str = "F32",
    n_layer: int = 2,
    n_embd: int = 256,
    n_ff: int = 512,
    n_head: int = 4,
    n_ctx: int = 2048,
    letters_single_token: bool = True,
    chat_template: str | None = None,
    letters_first: bool = False,
    architecture: str = "llama",
) -> Path:
    """Write a tiny random llama GGUF atomically; the same arguments give identical bytes. `chat_template` (a Jinja
    template, as `tokenizer.chat_template`) makes it a chat model; `letters_first` makes its next token lean to the
    answer letters (a constant embedding dimension the letters' output rows read), so a readout limited to the top
    log-probabilities (the chat path) sees every letter. Without either the file is byte for byte as before.
    `architecture` relabels the same llama tensors (`general.architecture` and its keys' prefix): a header that says,
    for instance, gemma3 to what reads only the metadata (llama.cpp cannot run such a file)."""
    import gguf

    _check_shape(dtype, n_layer=n_layer, n_embd=n_embd, n_ff=n_ff, n_head=n_head, n_ctx=n_ctx)
    np_dtype, file_type = DTYPES[dtype]
    out = Path(path)
    tokens, scores, types = _vocabulary(letters_single_token)
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np_dtype)

    def norm() -> np.ndarray:
        return np.ones(n_embd, dtype=np.float32)

    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp_name, architecture)
        writer.add_name(f"shiplift-tiny-llama-seed{seed}-{dtype}")
        writer.add_file_type(file_type)
        writer.add_context_length(n_ctx)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head)
        writer.add_rope_dimension_count(n_embd // n_head)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_vocab_size(len(tokens))
        writer.add_tokenizer_model("llama")
        writer.add_token_list(tokens)
        writer.add_token_scores(scores)
        writer.add_token_types(types)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_add_space_prefix(True)
        if chat_template is not None:
            writer.add_chat_template(chat_template)
        embedding, output = matrix(len(tokens), n_embd), matrix(len(tokens), n_embd)
        if letters_first:
            embedding[:, 0] += 1  # after the RMS norm, dimension 0 is ~15 at every position; the letters read it
            letters = [i for i, token in enumerate(tokens) if len(token.removeprefix(SPACE)) == 1
                       and token.removeprefix(SPACE) in LETTERS]
            output[letters, 0] += 1
        writer.add_tensor("token_embd.weight", embedding)
        writer.add_tensor("output_norm.weight", norm())
        writer.add_tensor("output.weight", output)
        for layer in range(n_layer):
            block = f"blk.{layer}"
            writer.add_tensor(f"{block}.attn_norm.weight", norm())
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                writer.add_tensor(f"{block}.{name}.weight", matrix(n_embd, n_embd))
            writer.add_tensor(f"{block}.ffn_norm.weight", norm())
            writer.add_tensor(f"{block}.ffn_gate.weight", matrix(n_ff, n_embd))
            writer.add_tensor(f"{block}.ffn_up.weight", matrix(n_ff, n_embd))
            writer.add_tensor(f"{block}.ffn_down.weight", matrix(n_embd, n_ff))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, out)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: write one tiny GGUF and print its path."""
    parser = argparse.ArgumentParser(prog="python -m shiplift.tasks.artifacts.tiny_gguf",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output .gguf path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="F32")
    parser.add_argument("--n-layer", type=int, default=2)
    parser.add_argument("--n-embd", type=int, default=256)
    parser.add_argument("--n-ff", type=int, default=512)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument(
        "--no-single-token-letters",
        action="store_true",
        help=f"leave {MISSING_LETTER!r} out of the vocabulary (tests the letter-slot check)",
    )
    parser.add_argument("--chat-template", choices=sorted(CHAT_TEMPLATES),
                        help="embed a chat template (tokenizer.chat_template), so the chat path serves it")
    args = parser.parse_args(argv)
    path = write_tiny_gguf(
        args.out,
        seed=args.seed,
        dtype=args.dtype,
        n_layer=args.n_layer,
        n_embd=args.n_embd,
        n_ff=args.n_ff,
        n_head=args.n_head,
        n_ctx=args.n_ctx,
        letters_single_token=not args.no_single_token_letters,
        chat_template=CHAT_TEMPLATES.get(args.chat_template),
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
