"""The project's tiny GGUF models: deterministic, loadable by llama.cpp, tokenizing any text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shiplift.tasks.artifacts.tiny_gguf import LETTERS, MISSING_LETTER, write_tiny_gguf
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.hashing import sha256_file


def _llama(path: Path):
    from llama_cpp import Llama

    return Llama(model_path=str(path), n_ctx=512, logits_all=False, verbose=False)


def _last_logits(llm) -> np.ndarray:
    """Last-position logits (with logits_all=False llama-cpp-python leaves llm.scores unset)."""
    import llama_cpp

    pointer = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return np.ctypeslib.as_array(pointer, shape=(llm.n_vocab(),)).copy()


def test_loads_tokenizes_and_evaluates_in_llama_cpp(tiny_gguf: Path) -> None:
    llm = _llama(tiny_gguf)
    try:
        text = "Question: which option? Answer:"
        tokens = llm.tokenize(text.encode(), add_bos=True, special=False)
        assert tokens[0] == llm.token_bos() == 1
        assert llm.detokenize(tokens).decode() == text
        llm.eval(tokens)
        logits = _last_logits(llm)
        assert len(logits) == llm.n_vocab() > 256 + 3
        assert np.isfinite(logits).all()
        assert np.ptp(logits) > 0  # random weights: the logits differ
    finally:
        llm.close()


def test_any_utf8_text_round_trips_through_byte_fallback(tiny_gguf: Path) -> None:
    llm = _llama(tiny_gguf)
    try:
        text = "Zürich ∑ 東京 🙂 \n\t{\"k\": [1, 2]}"
        tokens = llm.tokenize(text.encode(), add_bos=False, special=False)
        assert llm.detokenize(tokens).decode().removeprefix(" ") == text
        # A prompt of a known length: each emoji byte is one byte-fallback token.
        assert len(llm.tokenize("🙂🙂".encode(), add_bos=False, special=False)) == 1 + 8
    finally:
        llm.close()


def test_letters_are_single_tokens_and_k_is_not_when_asked(
    tiny_gguf: Path, tiny_gguf_no_k: Path
) -> None:
    for path, broken in ((tiny_gguf, set()), (tiny_gguf_no_k, {MISSING_LETTER})):
        llm = _llama(path)
        try:
            for letter in LETTERS:
                tokens = llm.tokenize(letter.encode(), add_bos=False, special=False)
                single = len(tokens) == 1 and llm.detokenize(tokens).decode().strip() == letter
                assert single is (letter not in broken), (path.name, letter, tokens)
        finally:
            llm.close()


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    first = write_tiny_gguf(tmp_path / "a.gguf", seed=7)
    second = write_tiny_gguf(tmp_path / "b.gguf", seed=7)
    other = write_tiny_gguf(tmp_path / "c.gguf", seed=8)
    assert sha256_file(first) == sha256_file(second)
    assert sha256_file(first) != sha256_file(other)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "c.gguf"]


def test_f16_is_half_the_size_and_small(tiny_gguf: Path, tiny_gguf_f16: Path) -> None:
    f32, f16 = tiny_gguf.stat().st_size, tiny_gguf_f16.stat().st_size
    assert 0.45 < f16 / f32 < 0.55
    assert f16 < 4 * 1024 * 1024


def test_bad_shapes_and_dtypes_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dtype 'Q4_0'"):
        write_tiny_gguf(tmp_path / "x.gguf", dtype="Q4_0")
    with pytest.raises(ConfigError, match="multiples of 256"):
        write_tiny_gguf(tmp_path / "x.gguf", n_embd=200)
    with pytest.raises(ConfigError, match="n_head"):
        write_tiny_gguf(tmp_path / "x.gguf", n_head=3)
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gguf

    def boom(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", boom)
    with pytest.raises(OSError, match="disk full"):
        write_tiny_gguf(tmp_path / "x.gguf")
    assert list(tmp_path.iterdir()) == []


def test_cli_writes_the_same_model_as_the_function(tmp_path: Path) -> None:
    out = tmp_path / "cli.gguf"
    done = subprocess.run(
        [sys.executable, "-m", "shiplift.tasks.artifacts.tiny_gguf", str(out), "--seed", "3", "--dtype", "F16"],
        capture_output=True, text=True, timeout=120, check=True,
    )
    assert done.stdout.strip() == str(out)
    same = write_tiny_gguf(tmp_path / "fn.gguf", seed=3, dtype="F16")
    assert sha256_file(out) == sha256_file(same)
