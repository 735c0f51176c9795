"""`image.engine: auto`: the build times ONNX Runtime and OpenVINO on the graph the image will serve, each in its own
process (two engines' thread pools in one process take each other's cores), in alternated rounds, on this CPU class,
and records the faster one with the numbers and the CPU's int8-relevant flags (AVX2, AVX-512 VNNI, AMX).

    python -m shiplift.tasks.artifacts.openvino_choice --time SPEC.json     # one timing worker (the build runs it)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from shiplift.tasks.artifacts.onnx_contract import FP32_FILE, INT8_FILE
from shiplift.tasks.artifacts.openvino_ir import OV_FILES, OpenVinoSession
from shiplift.tasks.errors import IntegrityError
from shiplift.tasks.extras import needs_extra

ENGINES = ("onnxruntime", "openvino")
ONNX_FILES = {"fp32": FP32_FILE, "int8": INT8_FILE}
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8",
             "amx_bf16")
WORKER_TIMEOUT_S = 600


def parse_cpu_flags(cpuinfo: str) -> dict[str, bool]:
    """Which of CPU_FLAGS the first processor's `flags` line of /proc/cpuinfo lists."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags = set(value.split())
            return {flag: flag in flags for flag in CPU_FLAGS}
    return {flag: False for flag in CPU_FLAGS}


def cpu_class() -> dict[str, Any]:
    """This CPU's model name and flags: the class an engine choice holds for."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    model = next((line.partition(":")[2].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 "unknown")
    return {"model": model, "flags": parse_cpu_flags(cpuinfo)}


def engine_file(engine: str, variant: str) -> str:
    """The file `engine` serves for `variant` (fp32 | int8)."""
    return (OV_FILES if engine == "openvino" else ONNX_FILES)[variant]


def _session(engine: str, path: Path, threads: int):
    """The engine loaded as the encoder server loads it (ONNX Runtime: all graph optimizations, denormals flushed)."""
    if engine == "openvino":
        return OpenVinoSession(path, threads)
    with needs_extra("encoders"):
        import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def time_engine(spec: dict[str, Any]) -> dict[str, Any]:
    """One worker's measurement: samples/s of `spec`'s engine on batches of `batch` x `seq` tokens after a warm-up."""
    session = _session(spec["engine"], Path(spec["path"]), spec["threads"])
    batch, seq = spec["batch"], spec["seq"]
    arrays = {"input_ids": (np.arange(batch * seq, dtype=np.int64).reshape(batch, seq) % 100) + 5,
              "attention_mask": np.ones((batch, seq), dtype=np.int64),
              "token_type_ids": np.zeros((batch, seq), dtype=np.int64)}
    arrays["token_type_ids"][:, seq // 2:] = 1
    feeds = {item.name: arrays[item.name] for item in session.get_inputs()}
    session.run(["logits"], feeds)
    start = time.perf_counter()
    for _ in range(spec["iterations"]):
        session.run(["logits"], feeds)
    return {"samples_per_s": batch * spec["iterations"] / (time.perf_counter() - start)}


def _worker(spec: dict[str, Any], folder: Path) -> float:
    """Run `time_engine` in a fresh process with pinned thread pools; its samples/s."""
    spec_path = folder / f"{spec['engine']}-{spec['round']}.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, **{name: str(spec["threads"]) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
    done = subprocess.run([sys.executable, "-m", "shiplift.tasks.artifacts.openvino_choice", "--time", str(spec_path)],
                          env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    if done.returncode != 0:
        raise IntegrityError(f"timing {spec['engine']} on {Path(spec['path']).name} failed ({done.returncode}): "
                             f"{(done.stdout + done.stderr)[-1500:]}",
                             fix="check that the engine loads the graph (shiplift serve encoder --engine ...)")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["samples_per_s"])


def choose_engine(model_dir: str | Path, variant: str, *, threads: int, capabilities: list[str], batch: int = 8,
                  seq: int = 128, rounds: int = 3, iterations: int = 5) -> dict[str, Any]:
    """Time both engines on `variant`'s graph, alternated (round r starts with engine r mod 2); the winner is the
    higher median samples/s. Returns the record a build keeps: winner, per-round numbers, settings, CPU class and
    the CPU plugin's `capabilities` (as the conversion recorded them: this process never loads OpenVINO)."""
    model_dir = Path(model_dir)
    rates: dict[str, list[float]] = {engine: [] for engine in ENGINES}
    with tempfile.TemporaryDirectory(prefix="engine-choice-") as folder:
        for r in range(rounds):
            for engine in ENGINES[r % 2:] + ENGINES[:r % 2]:
                spec = {"engine": engine, "path": str(model_dir / engine_file(engine, variant)), "round": r,
                        "threads": threads, "batch": batch, "seq": seq, "iterations": iterations}
                rates[engine].append(_worker(spec, Path(folder)))
    medians = {engine: statistics.median(values) for engine, values in rates.items()}
    winner = max(ENGINES, key=lambda engine: medians[engine])
    return {"mode": "auto", "winner": winner, "variant": variant, "samples_per_s": rates,
            "median_samples_per_s": medians, "ratio_openvino_to_onnxruntime": medians["openvino"] /
            medians["onnxruntime"], "batch": batch, "seq": seq, "rounds": rounds, "iterations": iterations,
            "threads": threads, "cpu": cpu_class(), "openvino_capabilities": capabilities}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shiplift.tasks.artifacts.openvino_choice",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--time", type=Path, required=True, help="a timing spec written by choose_engine")
    args = parser.parse_args(argv)
    print(json.dumps(time_engine(json.loads(args.time.read_text()))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
