"""Hugging Face NLI checkpoint → ONNX encoder model directory, and its parity proof.

`export_onnx` writes the shared model-directory contract: ``model.onnx`` (fp32, ONNX Runtime
optimized), optional ``model.int8.onnx`` (int8, made as `Int8Spec` says: by default static QDQ with
per-channel weights and activation ranges calibrated on the NLI calibration split), the tokenizer files,
``config.json`` and ``export.json`` (what was exported, how, with which tool versions). Graph
inputs are ``input_ids`` / ``attention_mask`` (/ ``token_type_ids`` when the model uses them),
int64 with dynamic batch and sequence axes; the output is ``logits`` [batch, 3] in the order
entailment, neutral, contradiction. The directory appears whole (built in a temporary sibling,
then renamed) or not at all; an existing directory is reused only when it is the same export.

`parity_check` (in `onnx_parity`) scores probe pairs with the PyTorch checkpoint and with each ONNX variant and
records max / mean |Δlogit| and label agreement, and, when the probes are labelled, each variant's
accuracy and the int8 graph's accuracy loss against the fp32 graph (a budget, like the other limits);
`require_parity` stops a release that fails.

The parts: `onnx_contract` (labels, inputs, file names, the session), `onnx_checkpoint` (`check_checkpoint`),
`onnx_int8` (`Int8Spec`, calibration, the quantizers) and `onnx_parity`; importers name them all from here.

Heavy libraries (torch, transformers, onnx, onnxruntime) are imported inside functions.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shiplift.tasks.artifacts.onnx_checkpoint import CheckpointInfo, check_checkpoint
from shiplift.tasks.artifacts.onnx_contract import (
    EXPORT_RECORD,
    FP32_FILE,
    ID2LABEL,
    INPUT_NAMES,
    INT8_FILE,
    LABEL2ID,
    LABELS,
    cpu_session,
)
from shiplift.tasks.artifacts.onnx_int8 import (
    CalibrationSet,
    Int8Spec,
    builtin_calibration,
    calibration_set,
    quantize_int8,
)
from shiplift.tasks.artifacts.onnx_parity import ParityReport, int8_budget_check, parity_check, require_parity
from shiplift.tasks.atomic import write_json_atomic
from shiplift.tasks.errors import BadInput, Conflict, IntegrityError
from shiplift.tasks.extras import needs_extra
from shiplift.tasks.hashing import sha256_file

__all__ = [  # importers name these from tasks.artifacts.onnx_export; most live in the onnx_* modules beside it
    "EXPORT_RECORD", "FP32_FILE", "ID2LABEL", "INT8_FILE", "LABEL2ID", "LABELS", "CalibrationSet", "CheckpointInfo",
    "ExportResult", "Int8Spec", "ParityReport", "builtin_calibration", "calibration_set", "check_checkpoint",
    "export_onnx", "int8_budget_check", "parity_check", "require_parity",
]

OPSET_RANGE = (14, 20)  # what the TorchScript exporter of torch 2.13 supports for these models
MIN_MAX_LEN = 8
# ONNX Runtime's transformer optimizer fuses attention / layer norm / GELU for these model types;
# others get ONNX Runtime's generic extended graph optimizations.
FUSED_MODEL_TYPES = {"bert": "bert"}
EXAMPLE_PAIRS = (
    ("A man is playing a guitar on a small stage in the park.", "A man plays music."),
    ("The capital of France is Paris.", "no"),
)


@dataclass(frozen=True)
class ExportResult:
    """The written model directory and the proof of what it holds."""

    model_dir: str
    files: dict[str, str]  # file name -> sha256 (export.json excluded: it records this)
    inputs: list[str]
    opset: int
    max_len: int
    int8: bool
    int8_spec: dict[str, Any] | None  # Int8Spec plus the calibration data's identity: what decides the int8 bytes
    quantization: dict[str, Any] | None  # the int8 graph's record: spec, nodes kept fp32, ops ONNX Runtime runs
    optimizer: str
    fused_operators: dict[str, int]
    model_type: str
    checkpoint_sha256: str
    versions: dict[str, str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return asdict(self)


def _versions() -> dict[str, str]:
    with needs_extra("encoders"):
        import onnx
        import onnxruntime
        import torch
        import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
    }


def _check_graph(path: Path, inputs: Sequence[str], max_len: int, threads: int) -> None:
    """Refuse a graph that breaks the contract (inputs, dtypes, dynamic axes, logits [batch, 3])."""
    session = cpu_session(path, threads)
    problems = []
    names = [item.name for item in session.get_inputs()]
    if names != list(inputs):
        problems.append(f"inputs {names}, expected {list(inputs)}")
    for item in session.get_inputs():
        if item.type != "tensor(int64)":
            problems.append(f"input {item.name} is {item.type}, expected tensor(int64)")
        if len(item.shape) != 2 or any(isinstance(dim, int) for dim in item.shape):
            problems.append(f"input {item.name} has shape {item.shape}, expected dynamic [batch, sequence]")
    outputs = session.get_outputs()
    if [item.name for item in outputs] != ["logits"] or len(outputs[0].shape) != 2 or outputs[0].shape[1] != 3:
        problems.append(f"outputs {[(item.name, item.shape) for item in outputs]}, expected logits [batch, 3]")
    if not problems:
        feed = {name: np.ones((2, max_len), dtype=np.int64) for name in inputs}
        if "token_type_ids" in feed:
            feed["token_type_ids"][:, max_len // 2:] = 0
        logits = session.run(["logits"], feed)[0]
        if logits.shape != (2, 3) or not np.isfinite(logits).all():
            problems.append(f"a batch of 2 at max_len {max_len} gave logits {logits.shape}, "
                            f"finite={np.isfinite(logits).all()}")
    if problems:
        raise IntegrityError(f"exported graph {path.name} breaks the encoder contract: " + "; ".join(problems))


def _export_raw(info: CheckpointInfo, raw_path: Path, opset: int) -> list[str]:
    """torch.onnx.export (TorchScript exporter) with dynamic batch/sequence axes; returns input names."""
    with needs_extra("encoders"):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(info.path)
    # Eager attention traces to the MatMul/Softmax pattern ONNX Runtime fuses into Attention.
    model = AutoModelForSequenceClassification.from_pretrained(info.path, attn_implementation="eager").eval()
    accepted = set(inspect.signature(model.forward).parameters)
    inputs = [
        name for name in INPUT_NAMES
        if name in tokenizer.model_input_names and name in accepted
        and not (name == "token_type_ids" and getattr(model.config, "type_vocab_size", 1) == 0)
    ]
    if inputs[:2] != ["input_ids", "attention_mask"]:
        raise BadInput(
            f"checkpoint {info.path} tokenizer gives {tokenizer.model_input_names}; need input_ids and attention_mask",
            fix="use a BERT-family checkpoint whose tokenizer returns an attention mask",
        )
    # Two pairs of different lengths, so the traced graph sees real padding in the mask.
    example = tokenizer(
        [premise for premise, _ in EXAMPLE_PAIRS], [hypothesis for _, hypothesis in EXAMPLE_PAIRS],
        padding=True, return_tensors="pt",
    )
    kwargs = {name: example[name] for name in inputs}
    with torch.no_grad():
        logits = model(**kwargs).logits
    if tuple(logits.shape) != (len(EXAMPLE_PAIRS), len(LABELS)):
        raise BadInput(f"checkpoint {info.path} returns logits {tuple(logits.shape)}, expected [batch, 3]")
    axes = {name: {0: "batch", 1: "sequence"} for name in inputs}
    axes["logits"] = {0: "batch"}
    with torch.no_grad():
        torch.onnx.export(
            model, (), str(raw_path), kwargs=kwargs, input_names=inputs, output_names=["logits"],
            dynamic_axes=axes, opset_version=opset, do_constant_folding=True, dynamo=False,
        )
    return inputs


def _optimize(info: CheckpointInfo, raw_path: Path, out_path: Path) -> tuple[str, dict[str, int]]:
    """ONNX Runtime graph optimization: transformer fusions for BERT, extended level otherwise."""
    with needs_extra("encoders"):
        import onnxruntime

    fused_type = FUSED_MODEL_TYPES.get(info.model_type)
    if fused_type and info.num_attention_heads and info.hidden_size:
        with needs_extra("encoders"):
            from onnxruntime.transformers import optimizer

        optimized = optimizer.optimize_model(
            str(raw_path), model_type=fused_type, num_heads=info.num_attention_heads,
            hidden_size=info.hidden_size, opt_level=0,
        )
        optimized.save_model_to_file(str(out_path))
        stats = {name: int(count) for name, count in optimized.get_fused_operator_statistics().items() if count}
        return f"onnxruntime.transformers.optimizer({fused_type})", stats
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(out_path)
    onnxruntime.InferenceSession(str(raw_path), options, providers=["CPUExecutionProvider"])
    return "onnxruntime.SessionOptions(ORT_ENABLE_EXTENDED)", {}



def _reuse(out: Path, record: dict[str, Any]) -> ExportResult:
    """Return the existing export at out when it is this export, intact; else Conflict."""
    path = out / EXPORT_RECORD
    try:
        existing = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        existing = None
    keys = ("checkpoint_sha256", "opset", "max_len", "int8", "int8_spec")
    if not existing or any(existing.get(key) != record[key] for key in keys):
        raise Conflict(
            f"{out} already exists and is not this export "
            f"({'no readable ' + EXPORT_RECORD if not existing else {k: existing.get(k) for k in keys}})",
            fix="choose another output directory or remove the stale one deliberately",
        )
    for name, digest in existing["files"].items():
        if not (out / name).is_file() or sha256_file(out / name) != digest:
            raise IntegrityError(f"{out / name} does not match its sha256 in {path}",
                                 fix=f"remove {out} and export again")
    return ExportResult(**{**existing, "model_dir": str(out)})


def export_onnx(
    checkpoint_dir: str | Path,
    out_dir: str | Path,
    *,
    opset: int = 17,
    max_len: int = 512,
    int8: bool = True,
    quantization: Int8Spec | None = None,
    calibration: CalibrationSet | None = None,
    threads: int = 2,
) -> ExportResult:
    """Export, optimize and (optionally) int8-quantize a 3-way NLI checkpoint into a model directory.

    `quantization` defaults to `Int8Spec()` (static QDQ); its `calibration` to the project's NLI calibration split."""
    info = check_checkpoint(checkpoint_dir)
    if not OPSET_RANGE[0] <= opset <= OPSET_RANGE[1]:
        raise BadInput(f"opset {opset} is outside {OPSET_RANGE[0]}..{OPSET_RANGE[1]}", fix="use opset 17")
    limit = info.max_position_embeddings
    if not MIN_MAX_LEN <= max_len or (limit and max_len > limit):
        raise BadInput(
            f"max_len {max_len} is outside {MIN_MAX_LEN}..{limit or 'unbounded'} (max_position_embeddings)",
            fix=f"use a max_len the model supports, at most {limit}",
        )
    spec = (quantization or Int8Spec()) if int8 else None
    if spec is not None and spec.method == "static_qdq" and calibration is None:
        calibration = builtin_calibration()
    int8_spec = None if spec is None else {
        **spec.to_dict(),
        "calibration": calibration.describe() if spec.method == "static_qdq" and calibration else None}
    out = Path(out_dir)
    wanted = {"checkpoint_sha256": info.sha256, "opset": opset, "max_len": max_len, "int8": int8,
              "int8_spec": int8_spec}
    if out.exists():
        return _reuse(out, wanted)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        quantized = None
        with tempfile.TemporaryDirectory(prefix=".raw-", dir=out.parent) as scratch:
            raw = Path(scratch) / "raw.onnx"
            inputs = _export_raw(info, raw, opset)
            optimizer_name, fused = _optimize(info, raw, tmp / FP32_FILE)
            _check_graph(tmp / FP32_FILE, inputs, max_len, threads)
            if spec is not None:
                quantized = quantize_int8(tmp / FP32_FILE, tmp / INT8_FILE, Path(scratch), spec, calibration, info.path,
                                          inputs, max_len, threads)
                _check_graph(tmp / INT8_FILE, inputs, max_len, threads)
        root = Path(info.path)
        for name in ["config.json", *info.tokenizer_files]:
            shutil.copyfile(root / name, tmp / name)
        files = {path.name: sha256_file(path) for path in sorted(tmp.iterdir()) if path.is_file()}
        result = ExportResult(
            model_dir=str(out), files=files, inputs=inputs, opset=opset, max_len=max_len, int8=int8,
            int8_spec=int8_spec, quantization=quantized, optimizer=optimizer_name, fused_operators=fused,
            model_type=info.model_type,
            checkpoint_sha256=info.sha256, versions=_versions(),
        )
        write_json_atomic(tmp / EXPORT_RECORD, {**result.to_dict(), "model_dir": None})
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, out)
        except OSError as exc:
            raise Conflict(f"{out} appeared while exporting ({exc})",
                           fix="run one export per output directory") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result
