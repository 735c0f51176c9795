"""The encoder's second engine: OpenVINO IR converted from the same exported ``model.onnx`` (fp32) and an NNCF
post-training int8 IR calibrated on the pairs ONNX Runtime's static int8 uses, written beside the ONNX graphs with a
record (``openvino.json``); the CPU session parity scores them with; and which int8 layers the CPU plugin really runs
(an int8 IR that runs none is refused, as ONNX Runtime's weight-only int8 is)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from shiplift.tasks.artifacts.onnx_contract import FP32_FILE
from shiplift.tasks.artifacts.onnx_int8 import CalibrationReader, CalibrationSet
from shiplift.tasks.atomic import write_json_atomic
from shiplift.tasks.errors import BadInput, IntegrityError
from shiplift.tasks.extras import needs_extra
from shiplift.tasks.hashing import sha256_file

OV_FP32_FILE, OV_INT8_FILE, OV_RECORD = "model.ov.xml", "model.ov.int8.xml", "openvino.json"
OV_FILES = {"fp32": OV_FP32_FILE, "int8": OV_INT8_FILE}
INT8_PRECISIONS = ("u8", "i8")  # the CPU plugin's runtimePrecision of a layer that computes in int8
INT8_COMPUTE = ("FullyConnected", "MatMul", "Convolution")  # layers whose int8 is arithmetic, not data movement


def compile_config(threads: int, keep_denormals: bool = False) -> dict[str, str]:
    """CPU plugin properties as the encoder server sets them: one stream of `threads` threads for latency, fp32
    inference precision (the plugin would pick bf16 on AVX-512 BF16 / AMX CPUs and break fp32 parity), denormals
    flushed to zero unless kept (as the server's ONNX Runtime session does)."""
    return {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1", "INFERENCE_NUM_THREADS": str(threads),
            "INFERENCE_PRECISION_HINT": "f32", "CPU_DENORMALS_OPTIMIZATION": "NO" if keep_denormals else "YES"}


def capabilities() -> list[str]:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES on this machine (e.g. FP32, INT8, BF16): which kernels it has."""
    with needs_extra("openvino"):
        import openvino as ov

    return [str(item) for item in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


class OpenVinoSession:
    """An OpenVINO CPU model behind the calls parity makes of an ONNX Runtime session (`get_inputs`, `run`)."""

    def __init__(self, path: Path, threads: int):
        with needs_extra("openvino"):
            import openvino as ov

        self.compiled = ov.Core().compile_model(str(path), "CPU", compile_config(threads))
        self.request = self.compiled.create_infer_request()

    def get_inputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=port.get_any_name()) for port in self.compiled.inputs]

    def run(self, names: Sequence[str], feeds: dict[str, Any]) -> list[Any]:
        result = self.request.infer(feeds)
        return [result[self.compiled.output(name)] for name in names]


def int8_layers(compiled) -> dict[str, int]:
    """The executed graph's compute layers that the CPU plugin runs in int8, counted by `layer:kernel` (e.g.
    ``FullyConnected:undef_i8``); empty when nothing computes in int8."""
    counts: Counter[str] = Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = {key: info.astype(str) for key, info in op.get_rt_info().items()
                if key in ("layerType", "runtimePrecision", "primitiveType")}
        if info["layerType"] in INT8_COMPUTE and info["runtimePrecision"] in INT8_PRECISIONS:
            counts[f"{info['layerType']}:{info['primitiveType']}"] += 1
    return dict(sorted(counts.items()))


def _versions() -> dict[str, str]:
    with needs_extra("openvino"):
        import nncf
        import openvino as ov

    return {"openvino": ov.get_version(), "nncf": nncf.__version__}


def _reusable(model_dir: Path, wanted: dict[str, Any]) -> dict[str, Any] | None:
    """The existing record when it is this conversion and its files are intact; None when there is none."""
    path = model_dir / OV_RECORD
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    if record.get("spec") != wanted:
        return None
    intact = all((model_dir / name).is_file() and sha256_file(model_dir / name) == digest
                 for name, digest in record["files"].items())
    return record if intact else None


def _quantize(model, calibration: CalibrationSet, model_dir: Path, keep_fp32: Sequence[str], max_len: int):
    """NNCF post-training int8 (transformer model type, mixed preset: symmetric weights, asymmetric activations)
    with activation ranges from the calibration pairs, batched and padded as ONNX Runtime's static int8 sees them."""
    with needs_extra("openvino"):
        import nncf
    with needs_extra("encoders"):
        from transformers import AutoTokenizer

    if not calibration.pairs:
        raise BadInput("OpenVINO int8 needs calibration pairs, got none",
                       fix="point the quantization calibration at a non-empty split")
    inputs = [port.get_any_name() for port in model.inputs]
    batches = CalibrationReader(AutoTokenizer.from_pretrained(str(model_dir)), list(calibration.pairs), inputs,
                                 max_len).batches
    ignored = nncf.IgnoredScope(patterns=[f".*{re.escape(part)}.*" for part in keep_fp32], validate=False)
    return nncf.quantize(model, nncf.Dataset(batches), preset=nncf.QuantizationPreset.MIXED,
                         model_type=nncf.ModelType.TRANSFORMER, subset_size=len(batches), ignored_scope=ignored)


def convert_openvino(model_dir: str | Path, *, int8: bool, calibration: CalibrationSet | None,
                     keep_fp32: Sequence[str] = (), max_len: int = 512, threads: int = 2) -> dict[str, Any]:
    """Convert `model_dir`'s ``model.onnx`` to ``model.ov.xml`` (+ .bin, fp32) and, with `int8`, an NNCF int8
    ``model.ov.int8.xml``; write ``openvino.json`` (what was converted, how, which int8 layers run) last and return
    it. A folder that already holds this conversion, intact, is reused."""
    with needs_extra("openvino"):
        import openvino as ov

    model_dir = Path(model_dir)
    if not (model_dir / FP32_FILE).is_file():
        raise BadInput(f"model directory {model_dir} has no {FP32_FILE}", fix="run export_onnx first")
    if int8 and calibration is None:
        raise BadInput("OpenVINO int8 needs a calibration set", fix="pass the calibration split the ONNX int8 uses")
    spec = {"source": FP32_FILE, "source_sha256": sha256_file(model_dir / FP32_FILE), "int8": int8,
            "calibration": calibration.describe() if int8 else None, "keep_fp32": list(keep_fp32) if int8 else [],
            "max_len": max_len, "versions": _versions()}
    existing = _reusable(model_dir, spec)
    if existing is not None:
        return existing
    record: dict[str, Any] = {"spec": spec, "precision": {"fp32": "f32 (INFERENCE_PRECISION_HINT)"},
                              "capabilities": capabilities()}
    with tempfile.TemporaryDirectory(prefix=".openvino-", dir=model_dir) as scratch:
        model = ov.convert_model(str(model_dir / FP32_FILE))
        written = [OV_FP32_FILE]
        ov.save_model(model, str(Path(scratch) / OV_FP32_FILE), compress_to_fp16=False)  # before NNCF edits it
        if int8:
            quantized = _quantize(model, calibration, model_dir, keep_fp32, max_len)
            ov.save_model(quantized, str(Path(scratch) / OV_INT8_FILE), compress_to_fp16=False)
            written.append(OV_INT8_FILE)
            layers = int8_layers(OpenVinoSession(Path(scratch) / OV_INT8_FILE, threads).compiled)
            if not layers:
                raise IntegrityError(
                    "the NNCF int8 IR runs no layer in int8 on this CPU (every layer's runtimePrecision is f32)",
                    fix="check keep_fp32 (it may exclude every MatMul) and the openvino / nncf versions")
            record["int8"] = {"method": "nncf_ptq", "preset": "mixed", "model_type": "transformer",
                              "weights": "int8 symmetric, per output channel", "activations": "u8, static ranges",
                              "calibration": calibration.source, "int8_layers": layers}
        files = {}
        for name in written:
            for path in (Path(scratch) / name, (Path(scratch) / name).with_suffix(".bin")):
                os.replace(path, model_dir / path.name)
                files[path.name] = sha256_file(model_dir / path.name)
    record["files"] = files
    write_json_atomic(model_dir / OV_RECORD, record)
    return record
