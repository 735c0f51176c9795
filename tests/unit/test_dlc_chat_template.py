"""The chat path's template (images/dlc-chat/server.py): the GGUF's own `tokenizer.chat_template`, else the one its
`general.architecture` implies (gemma/gemma2/gemma3 → gemma, qwen2/qwen3 → chatml, llama with Llama 3's BPE
vocabulary → llama3), else a refusal that names the flag, the config key and the variable; a set
SM_LLAMA_CPP_CHAT_TEMPLATE wins. The demo's Gemma-3 GGUF (no template of its own) is served by `shiplift serve chat`
without `--chat-template`, and the unmodified `openai` client gets an answer."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import load_by_path

REPO = Path(__file__).resolve().parents[2]
SERVER = load_by_path("shiplift_dlc_chat_server", REPO / "images" / "dlc-chat" / "server.py")


def header_only_gguf(path: Path, architecture: str, tokenizer: str = "llama", template: str | None = None) -> Path:
    """A GGUF with the metadata the template choice reads and no tensors (the front reads the header only)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_tokenizer_model(tokenizer)
    if template is not None:
        writer.add_chat_template(template)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def settings_for(path: Path, **env: str):
    return SERVER.load_settings({"DLC_CHAT_GGUF_PATH": str(path), **env})


@pytest.mark.parametrize("architecture, tokenizer, chat_format", [
    ("gemma", "llama", "gemma"), ("gemma2", "llama", "gemma"), ("gemma3", "llama", "gemma"),
    ("qwen2", "gpt2", "chatml"), ("qwen3", "gpt2", "chatml"), ("llama", "gpt2", "llama-3"),
])
def test_a_gguf_without_a_template_gets_the_one_its_architecture_implies(architecture, tokenizer, chat_format,
                                                                         tmp_path):
    settings = settings_for(header_only_gguf(tmp_path / "m.gguf", architecture, tokenizer))
    assert settings.child_settings["chat_format"] == chat_format
    assert settings.chat_source.endswith(f"inferred from general.architecture {architecture}")


def test_the_ggufs_own_template_and_then_the_variable_win_over_the_architecture(tmp_path):
    own = settings_for(header_only_gguf(tmp_path / "own.gguf", "gemma3", template="{{ messages }}"))
    assert "chat_format" not in own.child_settings, "llama-cpp-python reads the GGUF's template itself"
    assert own.chat_source == "the GGUF's tokenizer.chat_template"
    named = settings_for(header_only_gguf(tmp_path / "named.gguf", "gemma3"), SM_LLAMA_CPP_CHAT_TEMPLATE="chatml")
    assert named.child_settings["chat_format"] == "chatml"


@pytest.mark.parametrize("architecture, tokenizer", [("llama", "llama"), ("phi3", "llama")])
def test_an_architecture_that_implies_no_template_is_refused_naming_the_flag_the_key_and_the_variable(
        architecture, tokenizer, tmp_path):
    """Llama 2's SentencePiece vocabulary says nothing of its fine-tune's chat format: never guessed."""
    with pytest.raises(SERVER.StartupError) as refused:
        settings_for(header_only_gguf(tmp_path / "m.gguf", architecture, tokenizer))
    message = str(refused.value)
    for needle in ("--chat-template", "image.server.chat_template", "SM_LLAMA_CPP_CHAT_TEMPLATE",
                   f"general.architecture ({architecture})"):
        assert needle in message, (needle, message)
    assert refused.value.exit_code == SERVER.EXIT_MODEL


def test_serve_chat_starts_on_the_demo_gemma_gguf_without_a_flag_and_answers_the_openai_client(gemma_gguf, tmp_path):
    import openai

    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "shiplift.tasks.cli.main", "serve", "chat", "--gguf",
                                 str(gemma_gguf),
                                 "--port", "0", "--threads", "2", "--ctx-size", "512"],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, port = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            text = log.read_text(errors="replace")
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
            if found and "chat template from gemma, inferred from general.architecture gemma3" in text:
                port = int(found.group(1))
                break
            time.sleep(0.2)
        assert port is not None, log.read_text(errors="replace")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=60, max_retries=0)
        answer = client.chat.completions.create(model="gemma", max_tokens=4, temperature=0,
                                                messages=[{"role": "user", "content": "Say hello."}])
        assert answer.choices[0].message.content, "an empty answer is the llama-2 fallback's symptom"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
