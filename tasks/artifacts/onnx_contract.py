"""The encoder model directory's contract, shared by export, int8 quantization and parity: the label order, the graph
inputs, the file names, and the CPU ONNX Runtime session every check loads a graph with."""

from __future__ import annotations

from pathlib import Path

from shiplift.tasks.extras import needs_extra

LABELS = ("entailment", "neutral", "contradiction")
ID2LABEL = {index: label for index, label in enumerate(LABELS)}
LABEL2ID = {label: index for index, label in enumerate(LABELS)}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
FP32_FILE, INT8_FILE, EXPORT_RECORD = "model.onnx", "model.int8.onnx", "export.json"


def cpu_session(path: Path, threads: int):
    """A CPU ONNX Runtime session with a bounded thread pool."""
    with needs_extra("encoders"):
        import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
