"""The chat template a GGUF without `tokenizer.chat_template` was trained on, by its `general.architecture` (and
vocabulary): the dlc-chat stand-in starts its child with it, and a chat release passes it to the DLC as
SM_LLAMA_CPP_CHAT_TEMPLATE, whose llama-server would otherwise fall back to ChatML. One definition, so that the local
path and the endpoint choose the same template. Standard library only: the stand-in imports it from beside itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# general.architecture → llama-server's built-in template name. Gemma 1-3 share the <start_of_turn> turns; Qwen2/Qwen3
# use ChatML; llama only where tokenizer.ggml.model says BPE ("gpt2", Llama 3's vocabulary; Llama 2's is SentencePiece
# "llama", its chat format varies by fine-tune: not guessed).
ARCHITECTURE_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "qwen2": "chatml", "qwen3": "chatml"}
BPE_LLAMA = ("llama", "gpt2")  # (general.architecture, tokenizer.ggml.model) of Llama 3


def inferred_template(metadata: Mapping[str, Any]) -> str | None:
    """The llama-server template name a GGUF's metadata (`general.architecture`, `tokenizer.ggml.model`) implies, or
    None."""
    architecture = metadata.get("general.architecture")
    if (architecture, metadata.get("tokenizer.ggml.model")) == BPE_LLAMA:
        return "llama3"
    return ARCHITECTURE_TEMPLATES.get(architecture) if isinstance(architecture, str) else None
