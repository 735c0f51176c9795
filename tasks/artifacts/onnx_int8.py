"""int8 quantization of the optimized fp32 encoder graph: how ``model.int8.onnx`` is made (`Int8Spec`), the pairs
static int8 calibrates on (`CalibrationSet`), the quantizers, and the proof that ONNX Runtime runs its int8 kernels."""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shiplift.tasks.artifacts.onnx_parity import normalized_pairs
from shiplift.tasks.errors import BadInput, IntegrityError
from shiplift.tasks.extras import needs_extra
from shiplift.tasks.hashing import sha256_json
from shiplift.tasks.project import BUILTIN_DATA_DIR
from shiplift.validation.nli.pairs import load_nli

INT8_METHODS = ("static_qdq", "dynamic")
CALIBRATE_METHODS = ("minmax",)  # entropy / percentile need equal-shaped batches: padding to max_len skews them
# Node-name parts kept in fp32 by default: the pooler and classifier head (3 logits; quantizing them buys nothing),
# the first encoder layer and the attention output projections: on the MiniLM demo model these int8 activations cost
# the most logit error against fp32 on the calibration split (docs/encoder-speed.md has the candidates measured).
DEFAULT_KEEP_FP32 = ("pooler", "classifier", "attention/output/dense", "layer.0/")
# ONNX Runtime kernels that compute in int8; a static graph whose session runs none of them is weight-only int8
# (ONNX Runtime turns DequantizeLinear -> MatMul into MatMulNBits, slower than fp32) and is refused.
INT8_KERNELS = ("MatMulIntegerToFloat", "QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul", "QAttention",
                "QGemm", "QEmbedLayerNormalization")
CALIBRATION_BATCH = 8  # pairs per calibration batch, padded to the batch's longest pair as the server pads


@dataclass(frozen=True)
class Int8Spec:
    """How ``model.int8.onnx`` is made from the optimized fp32 graph (recorded in export.json).

    ``static_qdq``: ``onnxruntime.quantization.quantize_static`` in QDQ format on the MatMuls, QInt8 weights (per
    output channel), QUInt8 activations with fixed ranges (MinMax) from the calibration pairs, no output
    re-quantization, so ONNX Runtime runs ``MatMulIntegerToFloat`` (u8s8 int8 GEMM, fp32 out). Deterministic and
    independent of batch neighbours. ``dynamic``: ``quantize_dynamic`` (QAttention, DynamicQuantizeMatMul):
    activation ranges per batch at run time, so a pair's score depends slightly on its batch.
    ``reduce_range`` quantizes weights to 7 bits: for u8s8 on AVX2 / AVX-512 CPUs without VNNI, whose
    ``vpmaddubsw`` can saturate; not needed with VNNI or AMX. ``keep_fp32``: nodes whose name contains one of these
    stay fp32."""

    method: str = "static_qdq"
    per_channel: bool = True
    reduce_range: bool = False
    calibrate_method: str = "minmax"
    keep_fp32: tuple[str, ...] = DEFAULT_KEEP_FP32

    def __post_init__(self) -> None:
        if self.method not in INT8_METHODS:
            raise BadInput(f"int8 method {self.method!r} is not one of {', '.join(INT8_METHODS)}", fix="use static_qdq")
        if self.calibrate_method not in CALIBRATE_METHODS:
            raise BadInput(f"calibrate_method {self.calibrate_method!r} is not one of {', '.join(CALIBRATE_METHODS)}",
                           fix="use minmax")
        object.__setattr__(self, "keep_fp32", tuple(self.keep_fp32))

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return {**asdict(self), "keep_fp32": list(self.keep_fp32)}


@dataclass(frozen=True)
class CalibrationSet:
    """The (premise, hypothesis) pairs static int8 takes its activation ranges from, and where they came from."""

    pairs: tuple[tuple[str, str], ...]
    source: str  # e.g. "builtin:nli[calibration]"
    sha256: str  # of the data file (or of the pairs' canonical JSON when given in memory)

    def describe(self) -> dict[str, Any]:
        """What export.json records (not the pairs themselves)."""
        return {"source": self.source, "sha256": self.sha256, "n_pairs": len(self.pairs),
                "batch_size": CALIBRATION_BATCH, "padding": "longest"}


def builtin_calibration(splits: Sequence[str] = ("calibration",)) -> CalibrationSet:
    """The project's NLI set (validation/data/nli.jsonl), the given splits: the default calibration data."""
    data = load_nli(BUILTIN_DATA_DIR / "nli.jsonl")
    pairs = tuple((p.premise, p.hypothesis) for p in data.pairs if p.split in set(splits))
    return CalibrationSet(pairs=pairs, source=f"builtin:nli[{','.join(splits)}]", sha256=data.sha256)


def calibration_set(pairs: Iterable[Any], source: str, sha256: str | None = None) -> CalibrationSet:
    """A CalibrationSet from NliPair objects, dicts or 2-tuples (as parity takes them)."""
    normalized = tuple(normalized_pairs(pairs))
    return CalibrationSet(pairs=normalized, source=source, sha256=sha256 or sha256_json([list(p) for p in normalized]))


def _kept_fp32(model, spec: Int8Spec) -> list[str]:
    """Names of the nodes `spec.keep_fp32` leaves in fp32."""
    return [node.name for node in model.graph.node if any(part in node.name for part in spec.keep_fp32)]


class CalibrationReader:
    """onnxruntime.quantization.CalibrationDataReader over tokenized pairs: batches of CALIBRATION_BATCH, each padded to
    its longest pair (as the server pads), truncated to max_len."""

    def __init__(self, tokenizer, pairs: Sequence[tuple[str, str]], inputs: Sequence[str], max_len: int):
        self.batches = []
        for start in range(0, len(pairs), CALIBRATION_BATCH):
            chunk = pairs[start:start + CALIBRATION_BATCH]
            encoded = tokenizer([p for p, _ in chunk], [h for _, h in chunk], padding="longest", truncation=True,
                                max_length=max_len, return_tensors="np")
            self.batches.append({name: encoded[name].astype(np.int64) for name in inputs})
        self._next = iter(self.batches)

    def get_next(self):
        return next(self._next, None)

    def rewind(self) -> None:
        self._next = iter(self.batches)


def _quantize_static(fp32_path: Path, int8_path: Path, scratch: Path, spec: Int8Spec, calibration: CalibrationSet,
                     tokenizer_dir: str, inputs: Sequence[str], max_len: int) -> list[str]:
    """Static QDQ int8 (see `Int8Spec`); returns the names of the nodes kept in fp32."""
    with needs_extra("encoders"):
        import onnx
        from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
        from transformers import AutoTokenizer

    if not calibration.pairs:
        raise BadInput("static int8 needs calibration pairs, got none",
                       fix="point the quantization calibration at a non-empty split")
    # The quantizer only quantizes tensors whose type it knows; the fused contrib ops (Attention,
    # SkipLayerNormalization, BiasGelu) defeat ONNX shape inference, which leaves their outputs untyped and the
    # MatMuls weight-only.
    try:
        shaped = SymbolicShapeInference.infer_shapes(onnx.load(str(fp32_path)), auto_merge=True)
    except Exception as exc:  # the tool raises bare Exception
        raise BadInput(
            f"static int8 needs every tensor's type, and symbolic shape inference failed on this graph ({exc})",
            fix="set artifact.quantization.method: dynamic for this model",
        ) from exc
    shaped_path = scratch / "shaped.onnx"
    onnx.save(shaped, str(shaped_path))
    kept = _kept_fp32(shaped, spec)
    reader = CalibrationReader(AutoTokenizer.from_pretrained(tokenizer_dir), list(calibration.pairs), inputs, max_len)
    quantize_static(
        str(shaped_path), str(int8_path), reader, quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
        per_channel=spec.per_channel, reduce_range=spec.reduce_range, activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8, nodes_to_exclude=kept, calibrate_method=CalibrationMethod.MinMax,
        extra_options={
            "MatMulConstBOnly": True,  # weights only: attention's activation x activation products stay fp32
            "OpTypesToExcludeOutputQuantization": ["MatMul"],  # fp32 out: ONNX Runtime fuses MatMulIntegerToFloat
            "DefaultTensorType": onnx.TensorProto.FLOAT,
        },
    )
    return kept


def _quantize_dynamic(fp32_path: Path, int8_path: Path, spec: Int8Spec) -> list[str]:
    """Dynamic int8: QInt8 weights (per output channel), activations quantized per batch at run time."""
    with needs_extra("encoders"):
        import onnx
        from onnxruntime.quantization import QuantType, quantize_dynamic

    kept = _kept_fp32(onnx.load(str(fp32_path), load_external_data=False), spec)
    # Fused ops (com.microsoft) defeat shape inference; their outputs are float.
    quantize_dynamic(
        str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=spec.per_channel,
        reduce_range=spec.reduce_range, nodes_to_exclude=kept,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return kept


def runtime_ops(path: Path, threads: int) -> dict[str, int]:
    """Operator counts of the graph ONNX Runtime actually runs (CPU, ORT_ENABLE_ALL, as the server loads it)."""
    with needs_extra("encoders"):
        import onnx
        import onnxruntime

    with tempfile.TemporaryDirectory(prefix=".runtime-ops-", dir=path.parent) as scratch:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(scratch) / "optimized.onnx")
        onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        model = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return dict(sorted(Counter(node.op_type for node in model.graph.node).items()))


def quantize_int8(fp32_path: Path, int8_path: Path, scratch: Path, spec: Int8Spec, calibration: CalibrationSet | None,
                  tokenizer_dir: str, inputs: Sequence[str], max_len: int, threads: int) -> dict[str, Any]:
    """Write the int8 graph as `spec` says; return its export.json record (what was quantized, how, and what runs)."""
    record: dict[str, Any] = {**spec.to_dict(), "weight_type": "QInt8",
                              "op_types": ["MatMul"] if spec.method == "static_qdq"
                              else ["MatMul", "Attention", "EmbedLayerNormalization", "Gather"]}
    if spec.method == "static_qdq":
        assert calibration is not None
        kept = _quantize_static(fp32_path, int8_path, scratch, spec, calibration, tokenizer_dir, inputs, max_len)
        record.update({"format": "QDQ", "activation_type": "QUInt8", "activation_ranges": "static",
                       "calibration": calibration.describe()})
    else:
        kept = _quantize_dynamic(fp32_path, int8_path, spec)
        record.update({"format": "QOperator", "activation_type": "QUInt8",
                       "activation_ranges": "per batch, at run time"})
    ops = runtime_ops(int8_path, threads)
    int8_kernels = {op: count for op, count in ops.items() if op in INT8_KERNELS}
    if not int8_kernels:
        raise IntegrityError(
            f"the {spec.method} int8 graph runs no int8 kernel in ONNX Runtime (its ops: {ops}); "
            + ("MatMulNBits means the activations were left unquantized (weight-only int8, slower than fp32)"
               if "MatMulNBits" in ops else "nothing was quantized"),
            fix="check the quantization settings (keep_fp32 may exclude every MatMul) and the onnxruntime version",
        )
    record.update({"nodes_kept_fp32": kept, "runtime_ops": ops, "int8_kernels": int8_kernels})
    return record
