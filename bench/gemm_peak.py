"""The roofline behind the encoder bench: FLOPs per sample of the encoder, this CPU's measured fp32 and int8 GEMM
rates, and where the served int8 graph's time goes, in one process with pinned threads.

1. FLOPs: computed from the architecture (layers, hidden, heads, intermediate, sequence): the linear layers
   (QKV, attention output, FFN up and down: 2 * seq * 12 * hidden^2 a layer with intermediate = 4 * hidden) and
   the attention core (QK^T and PV: 2 * 2 * seq^2 * hidden a layer).
2. GEMM rates at the encoder's own shapes (M = batch 8 x seq 512 rows): ONNX Runtime MatMul fp32, torch.matmul fp32
   (MKL) and ONNX Runtime MatMulInteger u8 x s8 -> s32 (MLAS: AVX2, AVX-512 VNNI or AMX, whichever this CPU has),
   plus the attention core's batched [batch x heads, 512, head_dim] fp32 products.
3. The served int8 graph profiled by operator (ONNX Runtime's profiler) at batch 8, seq 512 (54 real tokens, the rest
   padding, denormals flushed as the server runs it): GEMM operators versus
   the rest (the fp32 attention core inside Attention, layer norms, GELU, quantize/dequantize). The bound: even with
   int8 GEMMs infinitely fast the batch takes the non-GEMM time, so the best ratio to PyTorch is
   PyTorch's time / that floor.

    python -m bench.gemm_peak                           # the export bench.encoder left in .shiplift/bench
    python -m bench.gemm_peak --model-dir DIR           # another exported folder
    python -m bench.gemm_peak --threads 1 --clock cpu   # shared machine: process CPU time, one thread (no spinning)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.encoder import CACHE, CONFIG
from shiplift.tasks.config import load_release_config
from shiplift.tasks.families.onnx_nli import int8_settings
from shiplift.tasks.hashing import sha256_json

THREADS = 2
BATCH, SEQ = 8, 512
REAL_LEN = 54  # the profiled batch's real length before padding (the NLI test split's mean)
# MiniLM-L6 (sentence-transformers/all-MiniLM-L6-v2, the demo's encoder)
MINILM_L6 = {"layers": 6, "hidden": 384, "heads": 12, "intermediate": 1536}
GEMM_OPS = ("MatMul", "MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "Gemm",
            "FusedGemm", "MatMulNBits")


def encoder_flops(*, layers: int, hidden: int, heads: int, intermediate: int, seq: int) -> dict[str, float]:
    """FLOPs (2 per multiply-add) of one sample through a BERT encoder at `seq` tokens, by part.

    Per layer: QKV projections 3 * seq * h^2 MACs, attention output seq * h^2, FFN 2 * seq * h * intermediate; the
    attention core QK^T and PV seq^2 * h each (heads split h, so their count does not change the total). Embeddings,
    layer norms, softmax and GELU are not GEMMs and are left out (they are memory-bound; see the profile)."""
    if heads < 1 or hidden % heads:
        raise ValueError(f"hidden {hidden} must split into {heads} heads")
    linear = layers * seq * (4 * hidden * hidden + 2 * hidden * intermediate) * 2
    attention = layers * 2 * seq * seq * hidden * 2
    return {"linear": float(linear), "attention": float(attention), "total": float(linear + attention)}


def roofline(flops: dict[str, float], *, int8_gemm_ops: float, fp32_gemm_flops: float, attention_flops_rate: float,
             non_gemm_s: float, torch_s: float, batch: int = BATCH) -> dict[str, float]:
    """Lower bounds on one batch's time (seconds) and the best int8 / PyTorch ratio they allow.

    `gemm_bound_s`: the linear layers at the int8 GEMM rate plus the attention core at its fp32 rate (ONNX Runtime's
    CPU attention is fp32); `floor_s`: that plus the measured non-GEMM operator time;
    `max_ratio` = torch_s / floor_s."""
    linear_s = batch * flops["linear"] / int8_gemm_ops
    attention_s = batch * flops["attention"] / attention_flops_rate
    gemm_bound_s = linear_s + attention_s
    floor_s = gemm_bound_s + non_gemm_s
    return {"linear_int8_s": linear_s, "attention_fp32_s": attention_s, "gemm_bound_s": gemm_bound_s,
            "non_gemm_s": non_gemm_s, "floor_s": floor_s, "torch_s": torch_s, "max_ratio": torch_s / floor_s,
            "fp32_linear_s": batch * flops["linear"] / fp32_gemm_flops}


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = CLOCKS["wall"]


def _median_time(call: Callable[[], Any], repeats: int = 7) -> float:
    """Median seconds of `call` after two warm-up calls, on the chosen clock (wall, or this process's CPU time)."""
    call()
    call()
    times = []
    for _ in range(repeats):
        start = _clock()
        call()
        times.append(_clock() - start)
    return sorted(times)[len(times) // 2]


def _session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    # as the server runs: and the first session of a process decides its denormal mode for every later one
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def gemm_rates(m: int, k: int, n: int, threads: int) -> dict[str, float]:
    """Measured rates (FLOP/s or int OP/s, 2 per multiply-add) of one [m, k] x [k, n] product, three ways."""
    import torch
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    ops = 2.0 * m * k * n
    # torch first: an ONNX Runtime session's idle thread pool spins and would take torch's cores
    torch.set_num_threads(threads)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    torch_fp32 = ops / _median_time(lambda: ta @ tb)
    fp32 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])], "fp32",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [m, n])], [numpy_helper.from_array(b, "B")]),
        opset_imports=[helper.make_opsetid("", 17)])
    sessions = [_session(fp32, threads)]
    ort_fp32 = ops / _median_time(lambda: sessions[0].run(None, {"A": a}))
    sessions.clear()  # drop it: its idle pool would spin beside the next one
    au = rng.integers(0, 256, (m, k), dtype=np.uint8)
    bs = rng.integers(-127, 128, (k, n), dtype=np.int8)
    int8 = helper.make_model(helper.make_graph(
        [helper.make_node("MatMulInteger", ["A", "B", "a_zero", "b_zero"], ["C"])], "int8",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [m, k])],
        [helper.make_tensor_value_info("C", TensorProto.INT32, [m, n])],
        [numpy_helper.from_array(bs, "B"), numpy_helper.from_array(np.array(128, np.uint8), "a_zero"),
         numpy_helper.from_array(np.array(0, np.int8), "b_zero")]), opset_imports=[helper.make_opsetid("", 17)])
    session8 = _session(int8, threads)
    ort_int8 = ops / _median_time(lambda: session8.run(None, {"A": au}))
    return {"ort_fp32": ort_fp32, "torch_fp32": torch_fp32, "ort_int8": ort_int8}


def attention_core_rate(heads: int, seq: int, head_dim: int, batch: int, threads: int) -> dict[str, float]:
    """fp32 FLOP/s of the attention core's batched products (QK^T then PV over batch x heads), torch and ORT."""
    import torch
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    shape = (batch * heads, seq, head_dim)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    ops = 2.0 * 2 * batch * heads * seq * seq * head_dim
    torch.set_num_threads(threads)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    torch_rate = ops / _median_time(lambda: (tq @ tk.transpose(1, 2)) @ tv, repeats=5)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["K"], ["Kt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["Q", "Kt"], ["S"]),
         helper.make_node("MatMul", ["S", "V"], ["O"])], "attention",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)) for name in ("Q", "K", "V")],
        [helper.make_tensor_value_info("O", TensorProto.FLOAT, list(shape))])
    session = _session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), threads)
    ort_rate = ops / _median_time(lambda: session.run(None, {"Q": q, "K": k, "V": v}), repeats=5)
    return {"ort_fp32": ort_rate, "torch_fp32": torch_rate}


def profile_graph(path: Path, threads: int, runs: int = 4) -> dict[str, Any]:
    """Per operator type, ms per batch-8 seq-512 run of an ONNX graph (ONNX Runtime's profiler), and the wall time."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=(BATCH, SEQ)).astype(np.int64)
    mask = np.zeros_like(ids)
    mask[:, :REAL_LEN] = 1  # padded to SEQ like the bench's test pairs (mean real length 54 tokens)
    ids[:, REAL_LEN:] = 0
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.set_denormal_as_zero", "1")  # as images/encoder serves
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    feed = {name: feeds[name] for name in names}
    wall = _median_time(lambda: session.run(["logits"], feed), repeats=runs)
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"gemm-peak-{os.getpid()}")
    profiled = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(2 + runs):
        profiled.run(["logits"], feed)
    trace = Path(profiled.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    by_op: dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            op = event["args"].get("op_name", "?")
            by_op[op] = by_op.get(op, 0.0) + event["dur"] / 1000 / (2 + runs)
    return {"wall_ms": wall * 1000, "ops_ms": dict(sorted(by_op.items(), key=lambda kv: -kv[1]))}


def torch_batch_s(checkpoint: Path, threads: int) -> float:
    """PyTorch eager fp32 on one batch of 8 at seq 512 (the bench's base engine)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.set_num_threads(threads)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint).eval()
    rng = np.random.default_rng(0)
    ids = torch.from_numpy(rng.integers(1000, 20000, size=(BATCH, SEQ)).astype(np.int64))
    mask = torch.zeros_like(ids)
    mask[:, :REAL_LEN] = 1
    ids[:, REAL_LEN:] = 0
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    with torch.inference_mode():
        return _median_time(lambda: model(**inputs), repeats=5)


def measure(model_dir: Path | None, checkpoint: Path | None, threads: int) -> dict[str, Any]:
    # PyTorch's batch first, before any ONNX Runtime session exists (their idle pools spin on the same cores)
    torch_s = torch_batch_s(checkpoint, threads) if checkpoint else None
    arch = MINILM_L6
    flops = encoder_flops(**arch, seq=SEQ)
    m = BATCH * SEQ
    h, inter = arch["hidden"], arch["intermediate"]
    shapes = {"qkv": (m, h, 3 * h), "attention_out": (m, h, h), "ffn_up": (m, h, inter), "ffn_down": (m, inter, h),
              "square_2048": (2048, 2048, 2048)}
    gemms = {name: gemm_rates(*shape, threads) for name, shape in shapes.items()}
    attention = attention_core_rate(arch["heads"], SEQ, h // arch["heads"], BATCH, threads)
    report: dict[str, Any] = {"threads": threads, "architecture": arch, "seq": SEQ, "batch": BATCH,
                              "flops_per_sample": flops, "gemm": gemms, "attention_core": attention}
    if model_dir and (model_dir / "model.int8.onnx").is_file():
        profile = profile_graph(model_dir / "model.int8.onnx", threads)
        gemm_ms = sum(ms for op, ms in profile["ops_ms"].items() if op in GEMM_OPS)
        attention_ms = sum(ms for op, ms in profile["ops_ms"].items() if op in ("Attention", "QAttention"))
        other_ms = sum(profile["ops_ms"].values()) - gemm_ms - attention_ms
        report["int8_profile"] = {**profile, "gemm_ms": gemm_ms, "attention_ms": attention_ms, "other_ms": other_ms}
        if torch_s is not None:
            profiled = sum(profile["ops_ms"].values())
            scale = profile["wall_ms"] / profiled if profiled else 1.0  # profiler overhead: scale op times to wall time
            linear_rate = sum(g["ort_int8"] for k, g in gemms.items() if k != "square_2048") / 4
            fp32_rate = sum(max(g["ort_fp32"], g["torch_fp32"]) for k, g in gemms.items() if k != "square_2048") / 4
            # the Attention op holds GEMM work too: its QKV projection (fp32 in Attention, int8 in QAttention) and
            # the core's two products; what is left of its time (softmax, mask, copies) counts as non-GEMM
            qkv_flops = BATCH * arch["layers"] * SEQ * 3 * h * h * 2
            qkv_rate = gemms["qkv"]["ort_int8"] if "QAttention" in profile["ops_ms"] else gemms["qkv"]["ort_fp32"]
            attention_gemm_s = qkv_flops / qkv_rate + BATCH * flops["attention"] / attention["ort_fp32"]
            non_gemm_s = (profiled - gemm_ms) * scale / 1000 - attention_gemm_s
            report["roofline"] = roofline(flops, int8_gemm_ops=linear_rate, fp32_gemm_flops=fp32_rate,
                                          attention_flops_rate=attention["ort_fp32"], non_gemm_s=max(non_gemm_s, 0.0),
                                          torch_s=torch_s)
            report["roofline"]["int8_wall_s"] = profile["wall_ms"] / 1000
    return report


def table(report: dict[str, Any]) -> str:
    f = report["flops_per_sample"]
    lines = [f"MiniLM-L6 at seq {report['seq']}: {f['total'] / 1e9:.2f} GFLOP a sample ({f['linear'] / 1e9:.2f} linear "
             f"layers, {f['attention'] / 1e9:.2f} attention core); {report['threads']} threads, "
             f"{report.get('clock', 'wall')} clock",
             f"{'GEMM [M x K x N]':<34} {'ORT fp32':>10} {'torch fp32':>11} {'ORT int8':>10} {'int8/fp32':>10}"]
    arch, m = report["architecture"], report["batch"] * report["seq"]
    dims = {"qkv": (m, arch["hidden"], 3 * arch["hidden"]), "attention_out": (m, arch["hidden"], arch["hidden"]),
            "ffn_up": (m, arch["hidden"], arch["intermediate"]), "ffn_down": (m, arch["intermediate"], arch["hidden"]),
            "square_2048": (2048, 2048, 2048)}
    for name, g in report["gemm"].items():
        label = f"{name} [{' x '.join(map(str, dims[name]))}]"
        lines.append(f"{label:<34} {g['ort_fp32'] / 1e9:>9.0f}G {g['torch_fp32'] / 1e9:>10.0f}G "
                     f"{g['ort_int8'] / 1e9:>9.0f}G {g['ort_int8'] / max(g['ort_fp32'], g['torch_fp32']):>9.1f}x")
    a = report["attention_core"]
    lines.append(f"attention core fp32 (QK^T, PV over {report['batch']} x {arch['heads']} heads): ORT "
                 f"{a['ort_fp32'] / 1e9:.0f} GFLOP/s, torch {a['torch_fp32'] / 1e9:.0f} GFLOP/s")
    p = report.get("int8_profile")
    if p:
        top = ", ".join(f"{op} {ms:.0f}" for op, ms in list(p["ops_ms"].items())[:8])
        lines.append(f"served int8 graph, batch 8 seq 512: {p['wall_ms']:.0f} ms ({report.get('clock', 'wall')} "
                     f"clock); by operator (profiled ms): {top}")
        lines.append(f"  GEMM operators {p['gemm_ms']:.0f} ms, Attention (QKV GEMM + fp32 core + softmax) "
                     f"{p['attention_ms']:.0f} ms, everything else {p['other_ms']:.0f} ms")
    r = report.get("roofline")
    if r:
        lines.append(f"roofline per batch of 8: linear layers at the int8 rate {r['linear_int8_s'] * 1000:.0f} ms + "
                     f"attention core at the fp32 rate {r['attention_fp32_s'] * 1000:.0f} ms + measured non-GEMM "
                     f"{r['non_gemm_s'] * 1000:.0f} ms = floor {r['floor_s'] * 1000:.0f} ms; served int8 "
                     f"{r['int8_wall_s'] * 1000:.0f} ms; PyTorch fp32 {r['torch_s'] * 1000:.0f} ms -> best int8 ratio "
                     f"{r['max_ratio']:.2f}x (measured {r['torch_s'] / r['int8_wall_s']:.2f}x)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gemm_peak", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--model-dir", type=Path, help="exported folder with model.int8.onnx (default: the bench's)")
    parser.add_argument("--checkpoint", type=Path, help="the PyTorch checkpoint (default: the bench's)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time (quiet machine), or process CPU time (shared machine; use with --threads 1)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args(argv)
    global _clock
    _clock = CLOCKS[args.clock]
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, str(args.threads))
    model_dir, checkpoint = args.model_dir, args.checkpoint
    if model_dir is None or checkpoint is None:
        found = sorted(p for p in CACHE.glob("minilm-nli-*") if (p / "config.json").is_file() and "-onnx" not in p.name)
        checkpoint = checkpoint or (found[-1] if found else None)
        if model_dir is None and checkpoint is not None:
            spec, calibration = int8_settings(load_release_config(CONFIG).artifact, CONFIG.parent)
            settings_hash = sha256_json([spec.to_dict(), calibration and calibration.describe()])
            model_dir = CACHE / f"{checkpoint.name}-onnx-{settings_hash[:8]}"
    report = {**measure(model_dir, checkpoint, args.threads), "clock": args.clock}
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
