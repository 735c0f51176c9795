"""Hugging Face NLI checkpoint → ONNX encoder model directory, and its parity proof.

`export_onnx` writes the shared model-directory contract: ``model.onnx`` (fp32, ONNX Runtime
optimized), optional ``model.int8.onnx`` (int8, made as `Int8Spec` says: by default static QDQ with
per-channel weights and activation ranges calibrated on the NLI calibration split), the tokenizer files,
``config.json`` and ``export.json`` (what was exported, how, with which tool versions). Graph
inputs are ``input_ids`` / ``attention_mask`` (/ ``token_type_ids`` when the model uses them),
int64 with dynamic batch and sequence axes; the output is ``logits`` [batch, 3] in the order
entailment, neutral, contradiction. The directory appears whole (built in a temporary sibling,
then renamed) or not at all; an existing directory is reused only when it is the same export.

`parity_check` scores probe pairs with the PyTorch checkpoint and with each ONNX variant and
records max / mean |Δlogit| and label agreement, and, when the probes are labelled, each variant's
accuracy and the int8 graph's accuracy loss against the fp32 graph (a budget, like the other limits);
`require_parity` stops a release that fails.

Heavy libraries (torch, transformers, onnx, onnxruntime) are imported inside functions.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from tasks.atomic import write_json_atomic
from tasks.errors import BadInput, Conflict, IntegrityError
from tasks.hashing import sha256_file, sha256_json

LABELS = ("entailment", "neutral", "contradiction")
ID2LABEL = {index: label for index, label in enumerate(LABELS)}
LABEL2ID = {label: index for index, label in enumerate(LABELS)}
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
WEIGHT_FILES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
)
FP32_FILE, INT8_FILE, EXPORT_RECORD = "model.onnx", "model.int8.onnx", "export.json"
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
# The server flushes denormals to zero (session.set_denormal_as_zero: on padded batches they made ONNX Runtime ~1.5x
# slower on x86). Parity does not: that setting changes the floating-point mode of the whole calling process (the
# release's, which goes on computing metrics), and it moves logits by denormal amounts only (< 1e-37).
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
class CheckpointInfo:
    """What `check_checkpoint` found: the facts export and parity rely on."""

    path: str
    model_type: str
    architecture: str
    num_labels: int
    id2label: dict[str, str]
    hidden_size: int | None
    num_attention_heads: int | None
    max_position_embeddings: int | None
    weights_file: str
    tokenizer_files: list[str]
    sha256: str  # sha256 of the canonical JSON {relative path: file sha256} of every file

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return asdict(self)


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
    from tasks.project import BUILTIN_DATA_DIR
    from validation.nli import load_nli

    data = load_nli(BUILTIN_DATA_DIR / "nli.jsonl")
    pairs = tuple((p.premise, p.hypothesis) for p in data.pairs if p.split in set(splits))
    return CalibrationSet(pairs=pairs, source=f"builtin:nli[{','.join(splits)}]", sha256=data.sha256)


def calibration_set(pairs: Iterable[Any], source: str, sha256: str | None = None) -> CalibrationSet:
    """A CalibrationSet from NliPair objects, dicts or 2-tuples (as parity takes them)."""
    normalized = tuple(_pairs(pairs))
    return CalibrationSet(pairs=normalized, source=source, sha256=sha256 or sha256_json([list(p) for p in normalized]))


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


@dataclass(frozen=True)
class VariantParity:
    """Parity of one ONNX variant (fp32 or int8) against the PyTorch reference."""

    variant: str
    file: str
    n: int
    max_abs_logit_delta: float
    mean_abs_logit_delta: float
    label_agreement: float
    max_abs_logit_delta_limit: float
    min_label_agreement: float
    failures: list[str]
    accuracy: float | None = None  # on the probes' own labels, when every probe has one

    @property
    def passed(self) -> bool:
        """True when every limit held."""
        return not self.failures


@dataclass(frozen=True)
class ParityReport:
    """Parity of every variant in a model directory, on the same tokenized probe set."""

    n: int
    tokenizer_match: bool
    variants: dict[str, VariantParity]
    failures: list[str]
    reference_accuracy: float | None = None  # PyTorch's, on the probes' labels
    int8_budget: dict[str, Any] | None = None  # the int8-vs-fp32 accuracy budget as a gate check (validation.gates.Check)

    @property
    def passed(self) -> bool:
        """True when the tokenizers agree and every variant passed."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict, with `passed` spelled out for the ledger."""
        return {
            "n": self.n,
            "tokenizer_match": self.tokenizer_match,
            "passed": self.passed,
            "failures": list(self.failures),
            "reference_accuracy": self.reference_accuracy,
            "int8_budget": self.int8_budget,
            "variants": {
                name: {**asdict(variant), "passed": variant.passed} for name, variant in self.variants.items()
            },
        }


# --------------------------------------------------------------------------------------------
# check


def _tree_sha256(root: Path) -> str:
    """sha256 of {relative path: sha256} over every regular, non-hidden file under root."""
    files = {
        str(path.relative_to(root)): sha256_file(path)
        for path in sorted(root.rglob("*"))
        if path.is_file() and not any(part.startswith(".") for part in path.relative_to(root).parts)
    }
    return sha256_json(files)


def _weight_shapes(root: Path, weights_file: str) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of the checkpoint weights, read without loading the model."""
    if weights_file.endswith(".index.json"):
        index = json.loads((root / weights_file).read_text(encoding="utf-8"))
        shards = sorted(set(index.get("weight_map", {}).values()))
    else:
        shards = [weights_file]
    shapes: dict[str, tuple[int, ...]] = {}
    for shard in shards:
        if shard.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(str(root / shard), framework="np") as handle:
                for key in handle.keys():
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
        else:
            import torch

            state = torch.load(root / shard, map_location="cpu", weights_only=True, mmap=True)
            shapes.update({key: tuple(value.shape) for key, value in state.items()})
    return shapes


def check_checkpoint(checkpoint_dir: str | Path) -> CheckpointInfo:
    """Check that a directory is a 3-label HF sequence classifier with a fast tokenizer (else BadInput)."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        raise BadInput(f"checkpoint {root} is not a directory", fix="pass a Hugging Face checkpoint directory")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise BadInput(f"checkpoint {root} has no config.json", fix="save the model with save_pretrained")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BadInput(f"{config_path} is not valid JSON: {exc}", fix="save the model with save_pretrained") from exc
    architectures = config.get("architectures") or []
    classifiers = [name for name in architectures if name.endswith("ForSequenceClassification")]
    fix_head = (
        "fine-tune a 3-way NLI head (python -m tasks.artifacts.nli_train) and export the saved checkpoint"
    )
    if not classifiers:
        raise BadInput(
            f"checkpoint {root} is not a sequence classifier: architectures {architectures or 'missing'} "
            "has no *ForSequenceClassification",
            fix=fix_head,
        )
    id2label = {str(key): str(value) for key, value in (config.get("id2label") or {}).items()}
    num_labels = len(id2label) if id2label else int(config.get("num_labels", 2))
    if num_labels != len(LABELS):
        raise BadInput(
            f"checkpoint {root} has the wrong label count: {num_labels} labels {sorted(id2label.values())}, "
            f"need {len(LABELS)} ({', '.join(LABELS)})",
            fix="use a 3-way NLI checkpoint",
        )
    wanted = {str(index): label for index, label in ID2LABEL.items()}
    if {key: value.lower() for key, value in id2label.items()} != wanted:
        raise BadInput(
            f"checkpoint {root} has id2label {id2label}; the contract needs {wanted}",
            fix="set config.id2label / label2id to entailment, neutral, contradiction in that order "
            "(reorder the classifier rows if the head was trained in another order)",
        )
    weights = [name for name in WEIGHT_FILES if (root / name).is_file()]
    if not weights:
        raise BadInput(
            f"checkpoint {root} has no weights ({' / '.join(WEIGHT_FILES)})", fix="save the model with save_pretrained"
        )
    shapes = _weight_shapes(root, weights[0])
    head = {key: shape for key, shape in shapes.items() if "classifier" in key.split(".")}
    if not head:
        raise BadInput(
            f"checkpoint {root} is not a sequence classifier: no classifier head in {weights[0]} "
            f"(architectures says {classifiers[0]})",
            fix=fix_head,
        )
    for key in ("classifier.weight", "classifier.out_proj.weight"):
        if key in head and head[key][0] != len(LABELS):
            raise BadInput(
                f"checkpoint {root} has the wrong label count: {key} has {head[key][0]} rows, need {len(LABELS)}",
                fix="use a 3-way NLI checkpoint",
            )
    if not (root / "tokenizer.json").is_file():
        raise BadInput(
            f"checkpoint {root} is missing its tokenizer (tokenizer.json)",
            fix="save the fast tokenizer beside the model: AutoTokenizer.from_pretrained(...).save_pretrained(dir)",
        )
    return CheckpointInfo(
        path=str(root),
        model_type=str(config.get("model_type", "")),
        architecture=classifiers[0],
        num_labels=num_labels,
        id2label=id2label,
        hidden_size=config.get("hidden_size"),
        num_attention_heads=config.get("num_attention_heads"),
        max_position_embeddings=config.get("max_position_embeddings"),
        weights_file=weights[0],
        tokenizer_files=[name for name in TOKENIZER_FILES if (root / name).is_file()],
        sha256=_tree_sha256(root),
    )


# --------------------------------------------------------------------------------------------
# export


def _versions() -> dict[str, str]:
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


def _session(path: Path, threads: int):
    """A CPU ONNX Runtime session with a bounded thread pool."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _check_graph(path: Path, inputs: Sequence[str], max_len: int, threads: int) -> None:
    """Refuse a graph that breaks the contract (inputs, dtypes, dynamic axes, logits [batch, 3])."""
    import numpy as np

    session = _session(path, threads)
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
            problems.append(f"a batch of 2 at max_len {max_len} gave logits {logits.shape}, finite={np.isfinite(logits).all()}")
    if problems:
        raise IntegrityError(f"exported graph {path.name} breaks the encoder contract: " + "; ".join(problems))


def _export_raw(info: CheckpointInfo, raw_path: Path, opset: int) -> list[str]:
    """torch.onnx.export (TorchScript exporter) with dynamic batch/sequence axes; returns input names."""
    import inspect

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
    import onnxruntime

    fused_type = FUSED_MODEL_TYPES.get(info.model_type)
    if fused_type and info.num_attention_heads and info.hidden_size:
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


def _kept_fp32(model, spec: Int8Spec) -> list[str]:
    """Names of the nodes `spec.keep_fp32` leaves in fp32."""
    return [node.name for node in model.graph.node if any(part in node.name for part in spec.keep_fp32)]


class _CalibrationReader:
    """onnxruntime.quantization.CalibrationDataReader over tokenized pairs: batches of CALIBRATION_BATCH, each padded to
    its longest pair (as the server pads), truncated to max_len."""

    def __init__(self, tokenizer, pairs: Sequence[tuple[str, str]], inputs: Sequence[str], max_len: int):
        import numpy as np

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
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    from transformers import AutoTokenizer

    if not calibration.pairs:
        raise BadInput("static int8 needs calibration pairs, got none", fix="point the quantization calibration at a non-empty split")
    # The quantizer only quantizes tensors whose type it knows; the fused contrib ops (Attention, SkipLayerNormalization,
    # BiasGelu) defeat ONNX shape inference, which leaves their outputs untyped and the MatMuls weight-only.
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
    reader = _CalibrationReader(AutoTokenizer.from_pretrained(tokenizer_dir), list(calibration.pairs), inputs, max_len)
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
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    kept = _kept_fp32(onnx.load(str(fp32_path), load_external_data=False), spec)
    # Fused ops (com.microsoft) defeat shape inference; their outputs are float.
    quantize_dynamic(
        str(fp32_path), str(int8_path), weight_type=QuantType.QInt8, per_channel=spec.per_channel,
        reduce_range=spec.reduce_range, nodes_to_exclude=kept, extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )
    return kept


def runtime_ops(path: Path, threads: int) -> dict[str, int]:
    """Operator counts of the graph ONNX Runtime actually runs (CPU, ORT_ENABLE_ALL, as the server loads it)."""
    from collections import Counter

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


def _quantize(fp32_path: Path, int8_path: Path, scratch: Path, spec: Int8Spec, calibration: CalibrationSet | None,
              tokenizer_dir: str, inputs: Sequence[str], max_len: int, threads: int) -> dict[str, Any]:
    """Write the int8 graph as `spec` says; return its export.json record (what was quantized, how, and what runs)."""
    record: dict[str, Any] = {**spec.to_dict(), "weight_type": "QInt8", "op_types": ["MatMul"] if spec.method == "static_qdq"
                              else ["MatMul", "Attention", "EmbedLayerNormalization", "Gather"]}
    if spec.method == "static_qdq":
        assert calibration is not None
        kept = _quantize_static(fp32_path, int8_path, scratch, spec, calibration, tokenizer_dir, inputs, max_len)
        record.update({"format": "QDQ", "activation_type": "QUInt8", "activation_ranges": "static",
                       "calibration": calibration.describe()})
    else:
        kept = _quantize_dynamic(fp32_path, int8_path, spec)
        record.update({"format": "QOperator", "activation_type": "QUInt8", "activation_ranges": "per batch, at run time"})
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
            raise IntegrityError(f"{out / name} does not match its sha256 in {path}", fix=f"remove {out} and export again")
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
        **spec.to_dict(), "calibration": calibration.describe() if spec.method == "static_qdq" and calibration else None}
    out = Path(out_dir)
    wanted = {"checkpoint_sha256": info.sha256, "opset": opset, "max_len": max_len, "int8": int8, "int8_spec": int8_spec}
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
                quantized = _quantize(tmp / FP32_FILE, tmp / INT8_FILE, Path(scratch), spec, calibration, info.path,
                                      inputs, max_len, threads)
                _check_graph(tmp / INT8_FILE, inputs, max_len, threads)
        root = Path(info.path)
        for name in ["config.json", *info.tokenizer_files]:
            shutil.copyfile(root / name, tmp / name)
        files = {path.name: sha256_file(path) for path in sorted(tmp.iterdir()) if path.is_file()}
        result = ExportResult(
            model_dir=str(out), files=files, inputs=inputs, opset=opset, max_len=max_len, int8=int8, int8_spec=int8_spec,
            quantization=quantized, optimizer=optimizer_name, fused_operators=fused, model_type=info.model_type,
            checkpoint_sha256=info.sha256, versions=_versions(),
        )
        write_json_atomic(tmp / EXPORT_RECORD, {**result.to_dict(), "model_dir": None})
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, out)
        except OSError as exc:
            raise Conflict(f"{out} appeared while exporting ({exc})", fix="run one export per output directory") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


# --------------------------------------------------------------------------------------------
# parity


def _pairs(probe_pairs: Iterable[Any]) -> list[tuple[str, str]]:
    """Normalise probes (objects or dicts with premise/hypothesis, or 2-tuples); refuse bad ones."""
    pairs = []
    for index, probe in enumerate(probe_pairs):
        if isinstance(probe, dict):
            premise, hypothesis = probe.get("premise"), probe.get("hypothesis")
        elif isinstance(probe, (tuple, list)) and len(probe) == 2:
            premise, hypothesis = probe
        else:
            premise, hypothesis = getattr(probe, "premise", None), getattr(probe, "hypothesis", None)
        if not (isinstance(premise, str) and premise.strip() and isinstance(hypothesis, str) and hypothesis.strip()):
            raise BadInput(
                f"probe pair {index} needs non-empty premise and hypothesis strings, got {probe!r}",
                fix="pass NliPair objects, {'premise', 'hypothesis'} dicts or (premise, hypothesis) tuples",
            )
        pairs.append((premise, hypothesis))
    if not pairs:
        raise BadInput("parity needs at least one probe pair, got none", fix="pass the calibration or test split")
    return pairs


def _labels(probe_pairs: Sequence[Any]) -> list[int] | None:
    """The probes' gold label indices when every probe carries a contract label, else None."""
    labels = []
    for probe in probe_pairs:
        label = probe.get("label") if isinstance(probe, dict) else getattr(probe, "label", None)
        if label not in LABEL2ID:
            return None
        labels.append(LABEL2ID[label])
    return labels


def int8_budget_check(fp32_accuracy: float, int8_accuracy: float, n: int, max_drop: float | None) -> dict[str, Any]:
    """The int8 graph's accuracy loss against the fp32 graph on the same labelled pairs, judged against its budget
    (None: recorded, `skipped`); a dict with `validation.gates.Check`'s fields (point rule: at n of a few dozen an
    interval could never clear a 1-point budget)."""
    drop = fp32_accuracy - int8_accuracy
    change = "no change" if abs(drop) < 1e-12 else f"{abs(drop) * 100:.1f} pt {'lost' if drop > 0 else 'gained'}"
    measured = f"int8 accuracy {int8_accuracy:.4f} vs fp32 {fp32_accuracy:.4f} on {n} labelled pairs: {change}"
    if max_drop is None:
        status, reason = "skipped", f"{measured} (no budget set: not judged)"
    else:
        ok = drop <= max_drop + 1e-12  # accuracies are k/n: keep an exact tie at the budget a pass
        status, reason = ("pass" if ok else "fail"), f"{measured} {'<=' if ok else '>'} the {max_drop * 100:g} pt budget"
    return {"name": "int8_accuracy_drop_vs_fp32", "status": status, "observed": drop, "threshold": max_drop,
            "comparator": "<=", "ci": None, "n": n, "rule": "point", "reason": reason}


def _variant(
    name: str, file: str, reference, logits, limit: float, min_agreement: float, gold=None
) -> VariantParity:
    import numpy as np

    delta = np.abs(reference - logits)
    worst, mean = float(delta.max()), float(delta.mean())
    agreement = float((reference.argmax(axis=1) == logits.argmax(axis=1)).mean())
    failures = []
    if not np.isfinite(logits).all():
        failures.append(f"{name} logits are not all finite")
    elif worst > limit:
        failures.append(f"{name} max |Δlogit| {worst:.3g} > {limit:g}")
    if agreement < min_agreement:
        failures.append(f"{name} label agreement {agreement:.4f} < {min_agreement:g}")
    return VariantParity(
        variant=name, file=file, n=len(reference), max_abs_logit_delta=worst, mean_abs_logit_delta=mean,
        label_agreement=agreement, max_abs_logit_delta_limit=limit, min_label_agreement=min_agreement,
        failures=failures, accuracy=None if gold is None else float((logits.argmax(axis=1) == gold).mean()),
    )


def parity_check(
    checkpoint_dir: str | Path,
    model_dir: str | Path,
    probe_pairs: Iterable[Any],
    *,
    max_abs_logit_delta: float = 1e-3,
    min_label_agreement: float = 1.0,
    int8_max_abs_logit_delta: float = 0.5,
    int8_min_label_agreement: float = 0.95,
    int8_max_accuracy_drop: float | None = 0.01,
    max_len: int = 512,
    batch_size: int = 8,
    threads: int = 2,
) -> ParityReport:
    """Score probe pairs with the PyTorch checkpoint and each ONNX variant; record the differences. When every probe
    is labelled, each variant's accuracy too, and the int8 graph may lose at most `int8_max_accuracy_drop` of
    accuracy against the fp32 graph (None: recorded, not judged)."""
    import numpy as np
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    probe_pairs = list(probe_pairs)
    pairs = _pairs(probe_pairs)
    labels = _labels(probe_pairs)
    gold = None if labels is None else np.array(labels)
    info = check_checkpoint(checkpoint_dir)
    model_dir = Path(model_dir)
    if not (model_dir / FP32_FILE).is_file():
        raise BadInput(f"model directory {model_dir} has no {FP32_FILE}", fix="run export_onnx first")
    shipped = AutoTokenizer.from_pretrained(str(model_dir))
    source = AutoTokenizer.from_pretrained(info.path)
    premises, hypotheses = [p for p, _ in pairs], [h for _, h in pairs]
    shipped_ids = shipped(premises, hypotheses, truncation=False)["input_ids"]
    tokenizer_match = shipped_ids == source(premises, hypotheses, truncation=False)["input_ids"]
    for index, ids in enumerate(shipped_ids):
        if len(ids) > max_len:
            raise BadInput(
                f"probe pair {index} is {len(ids)} tokens, over max_len {max_len}",
                fix="use shorter probe pairs (parity never truncates)",
            )
    variants = [("fp32", FP32_FILE, max_abs_logit_delta, min_label_agreement)]
    if (model_dir / INT8_FILE).is_file():
        variants.append(("int8", INT8_FILE, int8_max_abs_logit_delta, int8_min_label_agreement))
    sessions = {name: _session(model_dir / file, threads) for name, file, _, _ in variants}
    model = AutoModelForSequenceClassification.from_pretrained(info.path).eval()
    reference, outputs = [], {name: [] for name in sessions}
    with torch.inference_mode():
        for start in range(0, len(pairs), batch_size):
            batch = shipped(
                premises[start:start + batch_size], hypotheses[start:start + batch_size],
                padding=True, truncation=False, return_tensors="np",
            )
            for name, session in sessions.items():
                feed = {item.name: batch[item.name].astype(np.int64) for item in session.get_inputs()}
                outputs[name].append(session.run(["logits"], feed)[0])
            accepted = {name: torch.from_numpy(batch[name].astype(np.int64)) for name in INPUT_NAMES if name in batch}
            reference.append(model(**accepted).logits.float().numpy())
    ref = np.concatenate(reference)
    report = {
        name: _variant(name, file, ref, np.concatenate(outputs[name]), limit, agreement, gold)
        for name, file, limit, agreement in variants
    }
    failures = [] if tokenizer_match else ["the shipped tokenizer tokenizes the probes differently from the checkpoint's"]
    failures += [failure for variant in report.values() for failure in variant.failures]
    budget = None
    if gold is not None and "int8" in report:
        budget = int8_budget_check(report["fp32"].accuracy, report["int8"].accuracy, len(pairs), int8_max_accuracy_drop)
        if budget["status"] == "fail":
            failures.append(f"int8 accuracy budget: {budget['reason']}")
    return ParityReport(n=len(pairs), tokenizer_match=tokenizer_match, variants=report, failures=failures,
                        reference_accuracy=None if gold is None else float((ref.argmax(axis=1) == gold).mean()),
                        int8_budget=budget)


def require_parity(report: ParityReport) -> ParityReport:
    """Raise IntegrityError when parity failed (this stops a release); return the report otherwise."""
    if not report.passed:
        raise IntegrityError(
            f"parity failed: {'; '.join(report.failures)} (n={report.n})",
            fix="re-export from the checkpoint; if it persists, check the exporter/optimizer versions in export.json",
        )
    return report
