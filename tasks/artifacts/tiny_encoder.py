"""Tiny, deterministic BERT NLI checkpoints and ONNX model directories for tests and offline demos.

The checkpoint is a real Hugging Face ``BertForSequenceClassification`` (hidden 32, 2 layers,
2 heads, intermediate 64, 512 positions, 3 labels in the contract's order) with a real
``BertTokenizerFast`` saved beside it. Its weights are random (``torch.manual_seed(seed)``), so it
predicts nothing useful, but it loads, tokenizes, exports, quantizes and serves like a real one.
The WordPiece vocabulary holds a few common words plus every lowercase letter, digit and ASCII
punctuation mark (and their ``##`` continuations), so any ASCII text tokenizes without ``[UNK]``
and longer text gives more tokens.

CLI: ``python -m shiplift.tasks.artifacts.tiny_encoder OUT_DIR [--seed N] [--checkpoint-only] [--no-int8]``.
"""

from __future__ import annotations

import argparse
import string
import tempfile
from pathlib import Path

from shiplift.tasks.artifacts.onnx_export import ID2LABEL, LABEL2ID, export_onnx
from shiplift.tasks.extras import needs_extra

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = (
    "the", "a", "an", "is", "are", "was", "were", "be", "not", "no", "yes", "and", "or", "of",
    "to", "in", "on", "at", "for", "with", "by", "from", "it", "this", "that", "there", "he",
    "she", "they", "we", "you", "i", "man", "woman", "child", "people", "dog", "cat", "car",
    "house", "city", "river", "water", "food", "book", "music", "guitar", "street", "park",
    "sun", "rain", "snow", "day", "night", "year", "plays", "playing", "walks", "walking",
    "runs", "running", "sits", "sitting", "eats", "eating", "reads", "reading", "sleeps",
    "sleeping", "has", "have", "had", "does", "did", "can", "will", "answer", "question",
    "passage", "capital", "france", "paris", "london", "red", "blue", "green", "big", "small",
    "old", "new", "good", "bad", "happy", "sad", "two", "three", "many", "some", "all", "never",
)
TINY_CONFIG = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 512,
    # Wider than BERT's 0.02 so the random head gives clearly different logits per class.
    "initializer_range": 0.2,
}


def tiny_vocabulary() -> list[str]:
    """The WordPiece vocabulary, in id order (special tokens first, deterministic)."""
    pieces = list(SPECIAL_TOKENS) + list(WORDS)
    singles = string.ascii_lowercase + string.digits + string.punctuation
    pieces += list(singles) + [f"##{c}" for c in string.ascii_lowercase + string.digits]
    seen: set[str] = set()
    return [piece for piece in pieces if not (piece in seen or seen.add(piece))]


def write_tiny_checkpoint(directory: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random BERT 3-way NLI checkpoint plus its tokenizer into directory (created)."""
    with needs_extra("encoders"):
        import torch
        from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    vocab = tiny_vocabulary()
    vocab_path = out / "vocab.txt"
    vocab_path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(vocab_path), do_lower_case=True, model_max_length=512)
    config = BertConfig(
        vocab_size=len(vocab),
        num_labels=3,
        id2label=dict(ID2LABEL),
        label2id=dict(LABEL2ID),
        **TINY_CONFIG,
    )
    config.architectures = ["BertForSequenceClassification"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForSequenceClassification(config).eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_tiny_onnx_model_dir(directory: str | Path, *, seed: int = 0, int8: bool = True) -> Path:
    """Write a ready encoder model directory (contract layout) exported from a tiny checkpoint."""
    out = Path(directory)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".tiny-encoder-", dir=out.parent) as tmp:
        checkpoint = write_tiny_checkpoint(Path(tmp) / "checkpoint", seed=seed)
        export_onnx(checkpoint, out, int8=int8)
    return out


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: write a tiny checkpoint or ONNX model directory."""
    parser = argparse.ArgumentParser(prog="python -m shiplift.tasks.artifacts.tiny_encoder",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory (must not exist for the ONNX layout)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint-only", action="store_true", help="write the HF checkpoint, not ONNX")
    parser.add_argument("--no-int8", action="store_true", help="skip model.int8.onnx")
    args = parser.parse_args(argv)
    if args.checkpoint_only:
        path = write_tiny_checkpoint(args.out, seed=args.seed)
    else:
        path = write_tiny_onnx_model_dir(args.out, seed=args.seed, int8=not args.no_int8)
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
