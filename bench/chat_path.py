"""SemIf vs the DLC's chat path on the same model and the same 120 public tasks (issue 19): what a path loses.

Each path's server runs alone in its own process (llama.cpp's thread pool never shares the cores with the other's):
the SemIf adapter (`images/semif`), then the local stand-in of the DLC's chat path (`images/dlc-chat`,
llama-cpp-python's OpenAI-compatible server) asked as `configs/releases/gemma-chat.yaml` asks (its shots and
top_logprobs). One request at a time, so latency is one request's. Printed: validity, accuracy, label agreement (the
share of tasks both answer validly with the same option), ECE, p50/p95 latency, each path's value and chat/SemIf.
Caveat, printed with the table: locally llama-cpp-python computes every prompt token's logits when log-probabilities are
asked (`logits_all`), which llama-server does not, so the chat path's local latency is an upper bound of the DLC's.

Run alone: `python -m bench.chat_path` (~10 min here); `make bench` runs it as its last section.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import numpy as np

from bench.harness import bench_tasks, gemma_path, image_server
from shiplift.tasks.config import load_release_config
from shiplift.validation.decisions.chat_readout import ChatReadout, readout_losses
from shiplift.validation.metrics import expected_calibration_error, score_predictions
from shiplift.validation.runner import SEMIF, run_decisions

ROOT = Path(__file__).resolve().parent.parent
THREADS = 2
CHAT_CONFIG = ROOT / "configs" / "releases" / "gemma-chat.yaml"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def shown(value: float | None, unit: str) -> str:
    """One path's value as the table's detail shows it."""
    if value is None:
        return "n/a"
    return f"{value:.0f} ms" if unit == "ms" else f"{value:.3f}"


def summarise(rows: list[dict]) -> dict:
    """Validity, accuracy, ECE and latency percentiles of one path's predictions (validation.metrics)."""
    scored = score_predictions(rows)
    valid = scored.valid
    latencies = [row["latency_ms"] for row in rows if row["error"] is None]
    return {
        "validity": float(valid.mean()), "accuracy": float(scored.correct.mean()),
        "ece": expected_calibration_error(scored.confidence[valid], scored.correct[valid]) if valid.any() else None,
        "p50_ms": statistics.median(latencies) if latencies else None,
        "p95_ms": float(np.percentile(latencies, 95)) if latencies else None,
        "predicted": scored.predicted,
    }


def run() -> list[dict]:
    """Both paths on the bench's 120 tasks: one result row per metric, chat/SemIf as the value."""
    gguf, tasks, source = gemma_path(), *bench_tasks()
    chat_config = load_release_config(CHAT_CONFIG, environ={})
    readout = ChatReadout(chat_config.validation.top_logprobs, chat_config.validation.shots)
    paths = {
        "semif": ("semif", {"SEMIF_GGUF_PATH": str(gguf), "SEMIF_THREADS": str(THREADS), "SEMIF_MAX_TOKENS": "2048",
                            "SEMIF_MAX_REQUEST_TOKENS": "1536"}, "SEMIF_PORT", SEMIF),
        "chat": ("dlc-chat", {"DLC_CHAT_GGUF_PATH": str(gguf), **chat_config.image.container_env(),
                              "SM_LLAMA_CPP_THREADS": str(THREADS)}, "DLC_CHAT_PORT", readout),
    }
    rows: dict[str, list[dict]] = {}
    for name, (image, env, port_env, path_readout) in paths.items():
        log(f"  {name}: {len(tasks)} tasks through {image}")
        with image_server(image, env, port_env, start_timeout_s=300) as url:
            predictions = run_decisions(url, tasks, concurrency=1, timeout_s=300, readout=path_readout)
            rows[name] = [p.to_dict() for p in predictions]
    semif, chat = summarise(rows["semif"]), summarise(rows["chat"])
    both = [a for a, b in zip(semif["predicted"], chat["predicted"], strict=True) if a is not None and b is not None]
    agree = sum(1 for a, b in zip(semif["predicted"], chat["predicted"], strict=True) if a is not None and a == b)
    losses = readout_losses(rows["chat"], readout.shots)
    detail = (f"{source}; chat: {readout.shots} shots, top {readout.top_logprobs} log-probabilities, "
              f"{losses['missing_letter_share']:.0%} with a letter missing, {losses['non_letter_generated_share']:.0%} "
              f"generated a non-letter; local chat latency includes logits_all (an upper bound of llama-server's)")
    results = []
    for key, label, unit in (("validity", "validity", "share"), ("accuracy", "accuracy", "share"),
                             ("ece", "ECE", "share"), ("p50_ms", "p50 latency", "ms"), ("p95_ms", "p95 latency", "ms")):
        a, b = semif[key], chat[key]
        ratio = b / a if a and b is not None else float("nan")
        results.append({"name": f"chat path vs SemIf: {label} (chat/SemIf)", "value": ratio, "unit": "x",
                        "target": "report", "ok": True, "detail": f"SemIf {shown(a, unit)}, chat {shown(b, unit)}"})
    results.append({"name": "chat path vs SemIf: label agreement", "value": agree / len(tasks), "unit": "share",
                    "target": "report", "ok": True,
                    "detail": f"{agree} of {len(tasks)} tasks the same option ({len(both)} valid on both); {detail}"})
    return results


def main() -> int:
    results = run()
    width = max(len(r["name"]) for r in results)
    for r in results:
        print(f"{r['name'].ljust(width)}  {r['value']:>8.3f}  {r['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
