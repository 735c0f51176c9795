"""What a model family is: its three config shapes and the steps the pipeline asks of it.

A family owns everything that depends on the kind of model: the `artifact`, `image` and `validation` config classes,
how a source is resolved and built into a servable model, how it is packaged and sized, the environment prefix of its
image's server, how its datasets are scored and gated, the bodies its gate sends (for the dry run), and its `serve` and
`eval` commands. The stages, the config, the backends and the CLI ask the family; none of them branches on one.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shiplift.tasks.backends.image_source import server_command
from shiplift.tasks.backends.placement import MemoryEstimate
from shiplift.tasks.config_types import DatasetRef, Sha256, Strict
from shiplift.tasks.console import EXIT_REJECTED, print_fields, print_json
from shiplift.tasks.errors import CapacityError, ConfigError
from shiplift.tasks.ledger.stage_results import KeptRef
from shiplift.validation.evaluate import GateOutcome, Target, lost_requests
from shiplift.validation.retry_policy import DEFAULT_RETRY_DEADLINE_S
from shiplift.validation.thresholds import ChampionRule, DecisionRule, DefaultsUnwritten


class ArtifactConfig(Strict):
    """`artifact`: what to build, from which pinned source (a family's subclass says how)."""

    kind: str


class ImageConfig(Strict):
    """`image`: the serving image and the limits its server gets as environment variables. An image is either built
    (`BuiltImageConfig`: shiplift's Dockerfile on a base pinned by digest) or adopted (`AdoptedImageConfig`: a
    published image used as it is, resolved from its tag to a digest before anything deploys it)."""

    kind: str
    threads: int = Field(2, ge=1, le=256)

    min_gpu_driver: ClassVar[int] = 0  # the oldest NVIDIA driver the GPU build of the image starts on
    gpu_fix: ClassVar[str] = ""  # how to put this image on the GPU, for a config that places it on one

    @property
    @abstractmethod
    def on_gpu(self) -> bool:
        """Whether a copy of the image runs on a GPU (what the placement checks ask of it)."""

    @abstractmethod
    def container_env(self, *, cpu_only: bool = False) -> dict[str, str]:
        """The server's settings as the container gets them; `cpu_only` for scoring on a worker without a GPU."""


class BuiltImageConfig(ImageConfig):
    """An image shiplift builds from `images/<kind>/Dockerfile` on `base_image` (CodeBuild on aws)."""

    base_image: str = Field(pattern=r"^[^@\s]+@sha256:[0-9a-f]{64}$")


class AdoptedImageConfig(ImageConfig):
    """A published image served as it is (no Dockerfile, no build): its repository's tag is resolved to a digest,
    or the config pins the digest and the resolution checks it; locally `images/<kind>/` stands in for it."""

    tag: str
    digest: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$",
                               description="pin: the image the tag must resolve to; None records what it resolves to")

    repository: ClassVar[str]  # the ECR repository name in the publisher's account
    registry_accounts: ClassVar[dict[str, str]]  # region → the publisher's account; "*" for every other region

    def registry_account(self, region: str) -> str:
        return self.registry_accounts.get(region) or self.registry_accounts["*"]

    def reference(self, region: str) -> str:
        """`account.dkr.ecr.region.amazonaws.com/repository:tag` (a tag: never deployed as such)."""
        suffix = ".amazonaws.com.cn" if region.startswith("cn-") else ".amazonaws.com"
        return f"{self.registry_account(region)}.dkr.ecr.{region}{suffix}/{self.repository}:{self.tag}"


class ExtendSettings(Strict):
    """`validation.inconclusive.extend`: the reserve tasks an inconclusive champion check is extended on (scored on the
    candidate and the champion only when needed, never part of the first gate), `batch` paired tasks per look, at most
    `max_tasks` of them and `deadline_s` seconds in all (`validation.extension`)."""

    datasets: list[DatasetRef] = Field(min_length=1)
    batch: int = Field(50, ge=1, le=100_000)
    max_tasks: int = Field(1000, ge=1, le=1_000_000)
    deadline_s: float = Field(3600.0, gt=0)


class InconclusiveConfig(Strict):
    """`validation.inconclusive`: what a release whose champion check is inconclusive does (docs/reports.md): `block`
    (the default: it does not promote), `extend` (score reserve tasks until an always-valid sequence decides) or `ask`
    (a person decides through promotion.approval, with the interval, the power and the evidence)."""

    choice: Literal["block", "extend", "ask"] = "block"
    extend: ExtendSettings | None = None

    @model_validator(mode="after")
    def _extend_goes_with_its_settings(self) -> InconclusiveConfig:
        if self.choice == "extend" and self.extend is None:
            raise ValueError("validation.inconclusive.choice extend needs validation.inconclusive.extend: the reserve "
                             "datasets to score (e.g. {datasets: [{path: builtin:decisions, splits: [reserve]}]})")
        if self.choice != "extend" and self.extend is not None:
            raise ValueError(f"validation.inconclusive.extend is set but choice is {self.choice}, so it would never be "
                             "used; set choice: extend, or leave extend out")
        return self


class GateConfig(Strict, DefaultsUnwritten):
    """`validation`: the one shape every family's gate takes (datasets, request limits, bootstrap, champion rule,
    what an inconclusive check does); a family's subclass fixes its `kind` and its thresholds and adds what its runner
    needs."""

    extendable: ClassVar[bool] = False  # whether the family scores reserve tasks (`ModelFamily.reserve_scorer`)
    unwritten_defaults: ClassVar[tuple[str, ...]] = ("inconclusive",)  # a gate naming no choice: as before it existed

    kind: str
    datasets: list[DatasetRef] = Field(min_length=1)
    concurrency: int = Field(1, ge=1, le=64)
    request_timeout_s: float = Field(120.0, gt=0)
    deadline_s: float = Field(3600.0, gt=0)
    n_bootstrap: int = Field(1000, ge=100)
    seed: int = 0
    thresholds: Any
    decision_rule: DecisionRule = Field("bound", description="how absolute checks read their evidence: bound (the "
                                        "bootstrap interval's conservative end must clear the threshold) or point")
    champion: ChampionRule = ChampionRule()
    inconclusive: InconclusiveConfig = InconclusiveConfig()

    @model_validator(mode="after")
    def _can_extend(self) -> GateConfig:
        if self.inconclusive.choice == "extend" and not self.extendable:
            raise ValueError(f"validation.inconclusive.choice extend scores reserve tasks, which {self.kind} gates "
                             "cannot yet; use choice ask (a person decides) or block")
        return self

    def dataset_paths(self, config_dir: Path) -> list[tuple[Path, list[str] | None]]:
        """Each dataset's file (resolved against the config's folder, or built in) and the splits it keeps."""
        return [(ref.resolve(config_dir), ref.splits) for ref in self.datasets]


class BuiltModel(BaseModel):
    """What a family's build hands the build stage: the servable model kept in the artifact store for later stages
    (`output`), the same model on this worker (`model_dir`, which the stage sizes and scores but never records), its
    identity and description, and whatever else the family records of its own build (extra fields, recorded as
    given: a GGUF's letter tokens, an export's parity report)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    output: KeptRef
    model_dir: Path
    model_sha256: Sha256
    info: dict[str, Any]

    def recorded(self) -> dict[str, Any]:
        """The fields the build stage's ledger record keeps: all but `model_dir`, as JSON."""
        return self.model_dump(mode="json", exclude={"model_dir"})


class ModelFamily(ABC):
    """One family as a plug-in (see the module's docstring); `tasks.families.registry` holds the known ones.

    Every step a stage, the config, the dry run or the CLI asks of a family is abstract, so a family class missing one
    is refused when it is registered (`registry.register`), not when a stage first calls it. Three steps belong only to
    the families that claim a capability, and the registry checks those by the claim (`CAPABILITY_STEPS`): a family
    that does not claim it keeps the shared refusal, which nothing reaches because the config refuses first."""

    artifact_kind: ClassVar[str]  # the `artifact.kind` that selects the family
    artifact_model: ClassVar[type[ArtifactConfig]]
    image_model: ClassVar[type[ImageConfig]]
    validation_model: ClassVar[type[GateConfig]]
    env_prefix: ClassVar[str]  # the image server's <PREFIX>_MODEL_DIR, _HOST and _PORT
    source_main_file: ClassVar[str] = ""  # the file a source that is a folder is known by (its archive's main file)
    tool_distributions: ClassVar[tuple[str, ...]] = ()  # packages whose versions go into the artifact's manifest
    # whether a rollout can replay this family's tasks through the live component
    replays_online: ClassVar[bool] = False
    # whether its gate reuses a champion's recorded per-task results (`validation.champion_reuse`; the gate reads the
    # champion Target's offer) and so needs a `readout`; else it scores the champion on every task
    reuses_champion_results: ClassVar[bool] = False
    temperature_scaling: ClassVar[bool] = True  # whether its server applies a fitted temperature (calibration.json)
    # the values a sweep's quantization axis may take (tasks.sweeps); empty: the family has no such axis
    sweep_quantizations: ClassVar[tuple[str | None, ...]] = ()

    @property
    def image_kind(self) -> str:
        return self.image_model.model_fields["kind"].annotation.__args__[0]

    @property
    def key(self) -> tuple[str, str]:
        """What selects the family: the (`artifact.kind`, `image.kind`) pair."""
        return self.artifact_kind, self.image_kind

    @property
    def validation_kind(self) -> str:
        return self.validation_model.model_fields["kind"].annotation.__args__[0]

    # -- resolve, build, size, package --------------------------------------------------------------------------

    @abstractmethod
    def resolve(self, ctx, cache: Path) -> tuple[Path, str, dict]:
        """Fetch and prove the pinned source: (local path, its sha256, a description for the ledger)."""

    @abstractmethod
    def source_file_name(self, artifact: ArtifactConfig) -> str:
        """The name the source is kept under in the artifact store (the dry run plans its upload)."""

    @abstractmethod
    def built_file_name(self, artifact: ArtifactConfig) -> str:
        """The name the built model is kept under in the artifact store."""

    @abstractmethod
    def build(self, ctx) -> BuiltModel:
        """Build and prove the servable model."""

    @abstractmethod
    def memory(self, ctx, built: BuiltModel) -> MemoryEstimate:
        """What one copy of the built model needs (weights, its working memory, runtime), for the placement checks."""

    stated_shape: tuple[str, ...] = ()  # the artifact's shape figures `memory_of` needs when no build exists

    def memory_of(self, size_bytes: int, shape: dict[str, Any], image) -> MemoryEstimate:
        """What one copy needs, from the artifact's size and shape alone (`fleet pack` before any build)."""
        raise unclaimed(self, "cannot estimate a copy's memory without a build", fix="build the model once")

    def artifact_figures(self, artifact: ArtifactConfig, config_dir: Path) -> tuple[int, dict[str, Any], str] | None:
        """The artifact's size, shape and where they were read, where its file is on this machine; else None."""
        return None

    @abstractmethod
    def manifest_fields(self, built) -> dict[str, Any]:
        """What of its own build the model's manifest records beside the shared `model_sha256` and `info` (`built`: the
        build stage's result); `recorded_fields` picks named fields."""

    @abstractmethod
    def package(self, built_model: Path, out_dir: Path, manifest: dict, calibration: Path | None):
        """The deterministic model.tar.gz of the built model (`tasks.artifacts.packaging.PackagedModel`)."""

    # -- datasets and gates -------------------------------------------------------------------------------------

    @abstractmethod
    def evaluate(self, candidate, champion, paths: list[tuple[Path, list[str] | None]], out_dir: Path, *, validation,
                 settings, progress, title: str, context=None, built=None) -> GateOutcome:
        """Gate the candidate (and the champion, when one serves) on the validation datasets: the gate report;
        `context(metrics)` returns what it shows of the release (`validation.evaluate.RELEASE_CONTEXT`), and `built` is
        the build stage's result, for checks the build judged that the report carries beside the gate's own."""

    @abstractmethod
    def items_per_request(self, validation: GateConfig) -> int:
        """The decisions one gate request answers (what a cost per million decisions divides by)."""

    @abstractmethod
    def summary_metrics(self, metrics: dict) -> dict:
        """The family's headline metrics of a gate report, beside accuracy, calibration and latency ({}: none)."""

    @abstractmethod
    def invocation_bodies(self, validation: GateConfig, paths: list[tuple[Path, list[str] | None]]) -> list[bytes]:
        """The request bodies the gate sends, in order (the dry run plans one InvokeEndpoint each)."""

    # -- steps of a capability (the registry requires them of a family that claims it) --------------------------

    def calibration_predictions(self, ctx, invoker, path: Path, splits, settings) -> tuple[list, str]:
        """Score the calibration dataset through the model's own server: (predictions, dataset sha256). Only a family
        with `temperature_scaling` is asked (the config refuses calibration.fit_temperature for the others)."""
        raise unclaimed(self, "fits no temperature", "leave calibration.fit_temperature false")

    def reserve(self, validation: GateConfig, config_dir: Path, settings, progress=None):
        """The reserve tasks of `validation.inconclusive.extend` and how one batch of them is scored on a target
        (`validation.extension.Reserve`; `settings` the gate's `validation.evaluate.RunSettings`). Only a family
        whose gate config is `extendable` is asked (the gate config refuses choice extend for the others)."""
        raise unclaimed(self, "cannot score reserve tasks", "use validation.inconclusive.choice ask or block")

    def readout(self, validation: GateConfig):
        """How the family's server is asked a decision task (`validation.runner.Readout`): the online gate's
        replay. Only a family that `replays_online` is asked."""
        raise unclaimed(self, "has no decision readout", "leave rollout.online_gate out")

    def online_gate(self, invoker, validation: GateConfig, gate, *, config_dir: Path, candidate_model_sha256: str):
        """A rollout's online gate over the live component (`gate` is `rollout.online_gate`): the family's tasks of
        `gate.split` replayed through `invoker` and judged as the candidate's answers come in, with `replay()`,
        `alarm()` and `evidence()` (`validation.online_gate.OnlineGate`). Only a family that `replays_online` is
        asked (the config refuses rollout.online_gate for the others)."""
        raise unclaimed(self, "cannot replay its tasks through a live component", "leave rollout.online_gate out")

    def quantization_overrides(self, value: str | None) -> dict[str, Any]:
        """The config fields (dotted key → value) a sweep candidate of quantization `value` sets (`tasks.sweeps`). Only
        a family that lists `sweep_quantizations` is asked (the sweep config refuses the axis for the others)."""
        raise unclaimed(self, "has no quantization axis", "leave axes.quantization out of the sweep")

    # -- the command line ---------------------------------------------------------------------------------------

    @abstractmethod
    def add_commands(self, serve, evaluate) -> None:
        """Add the family's `shiplift serve …` and `shiplift eval …` subcommands (none is a choice the family makes)."""


# A capability a family claims (a class attribute, or its gate config's) → the steps that claim obliges it to define.
CAPABILITY_STEPS: dict[str, tuple[str, ...]] = {
    "temperature_scaling": ("calibration_predictions",),
    "validation_model.extendable": ("reserve",),
    "replays_online": ("readout", "online_gate"),
    "reuses_champion_results": ("readout",),
    "sweep_quantizations": ("quantization_overrides",),
}


def missing_steps(family_class: type[ModelFamily]) -> list[str]:
    """The steps `family_class` lacks: its abstract methods, its config classes' abstract methods, the steps its claimed
    capabilities need, and the class attributes every family declares; [] for a complete family."""
    missing = sorted(getattr(family_class, "__abstractmethods__", ()))
    declared = [name for name in ("artifact_kind", "artifact_model", "image_model", "validation_model", "env_prefix")
                if not hasattr(family_class, name)]
    missing += [f"{name} (class attribute)" for name in declared]
    if "image_model" not in declared:
        missing += [f"{family_class.image_model.__name__}.{name}"
                    for name in sorted(getattr(family_class.image_model, "__abstractmethods__", ()))]
    for claim, steps in CAPABILITY_STEPS.items():
        owner, _, flag = claim.rpartition(".")
        holder = getattr(family_class, owner, None) if owner else family_class
        if holder is not None and getattr(holder, flag, False):
            missing += [f"{step} (claimed by {claim})" for step in steps
                        if getattr(family_class, step) is getattr(ModelFamily, step)]
    return missing


def unclaimed(family: ModelFamily, cannot: str, fix: str) -> ConfigError:
    """The shared refusal of a capability step the family does not claim."""
    return ConfigError(f"{type(family).__name__} {cannot}", fix=fix)


def recorded_fields(built, names: tuple[str, ...]) -> dict[str, Any]:
    """The build result's fields of `names` that it recorded (a field missing or None is left out)."""
    recorded = built.model_dump(mode="json")
    return {name: recorded[name] for name in names if recorded.get(name) is not None}


def add_server_arguments(parser) -> None:
    """Where a `shiplift serve …` server listens and how many threads it uses (every family's server takes these)."""
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1),
                        help="inference threads (default: this machine's CPUs)")


def add_evaluation_arguments(parser, *, unit: str, data_help: str, component_help: str) -> None:
    """What every `shiplift eval …` takes: the endpoint, the data and its splits, the champion to compare with, the
    output folder, request timeout, bootstrap resamples and the thresholds every gate has."""
    parser.add_argument("--endpoint", required=True, help="model server root or http://HOST:PORT/endpoints/NAME")
    parser.add_argument("--component", help=component_help)
    parser.add_argument("--data", nargs="+", required=True, help=data_help)
    parser.add_argument("--split", action="append", help=f"keep only {unit} of this split (repeatable)")
    parser.add_argument("--out", required=True, help="folder for predictions.jsonl, gate-report.json and report.html")
    parser.add_argument("--champion", help=f"a second endpoint to compare against on the same {unit}")
    parser.add_argument("--champion-component", help="the champion endpoint's inference component name")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--retry-deadline", type=positive_seconds, default=DEFAULT_RETRY_DEADLINE_S, metavar="SECONDS",
                        help="retry no-capacity (a component at zero copies) and throttled answers until the endpoint "
                             f"has answered nothing this long (default {DEFAULT_RETRY_DEADLINE_S:g}: a cold start); "
                             f"{unit} still unanswered then are lost and the command exits 1")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--min-accuracy", type=float,
                        help="gate: accuracy floor (no threshold flag: measure, not gate)")
    parser.add_argument("--max-ece", type=float, help="gate: expected calibration error ceiling")
    parser.add_argument("--min-validity", type=float, help="gate: share of valid answers floor")
    parser.add_argument("--max-p95-ms", type=float, help="gate: p95 latency ceiling per request, ms")
    parser.add_argument("--decision-rule", choices=["bound", "point"], default="bound",
                        help="how thresholds are judged: the interval's conservative end (default) or the point "
                             "estimate")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON for machines instead of a table")


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above 0 (argparse names the flag and exits 2 otherwise)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0 (e.g. 600)")
    return seconds


def evaluation_thresholds(args, model, flags: dict[str, str]):
    """The thresholds an `eval` command's flags set (`flags`: field name → its flag; a flag not given is a check not
    run), or None when none is given: an evaluation that measures and does not gate."""
    given = {field: getattr(args, flag.lstrip("-").replace("-", "_")) for field, flag in flags.items()}
    if all(value is None for value in given.values()):
        return None
    return model(**given)


def exec_server(image: str, env: dict[str, str]) -> int:
    """Replace this process with an image's server (what its container runs), configured by `env`."""
    command = server_command(image)
    os.execve(command[0], command, {**os.environ, **env})
    return 0  # not reached: execve replaces this process


def optional_env(args, mapping: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The server variables of the flags given (`mapping`: flag → variable); a flag not given sets nothing."""
    return {variable: str(getattr(args, flag)) for flag, variable in mapping if getattr(args, flag) is not None}


def server_env(args, prefix: str) -> dict[str, str]:
    """The flags of `add_server_arguments` as the server's `<PREFIX>_PORT`, `_HOST` and `_THREADS` variables."""
    return {f"{prefix}_PORT": str(args.port), f"{prefix}_HOST": args.host, f"{prefix}_THREADS": str(args.threads)}


def evaluation_targets(args):
    """An `eval` command's candidate and champion (None without --champion), and a progress printer on stderr."""
    champion = Target.http(args.champion, args.champion_component, "champion") if args.champion else None
    candidate = Target.http(args.endpoint.rstrip("/"), args.component, "candidate")
    return candidate, champion, lambda message: print(message, file=sys.stderr, flush=True)


def evaluation_exit(report: dict, summary: dict, *, as_json: bool = False, out_dir: Path | None = None,
                    unit: str = "tasks") -> int:
    """Print an `eval` command's summary (a table; `as_json`: JSON); exit 0 when the gate passed, else the CLI's
    rejected code; CapacityError (exit 1) when the predictions written to `out_dir` say some of its `unit` got no
    answer (lost), whatever the gate said."""
    if as_json:
        print_json(summary)
    else:
        print(f"decision: {report['decision']}")
        print_fields({key: value for key, value in summary.items() if key != "decision"})
    lost = None if out_dir is None else lost_requests(out_dir, unit)
    if lost:
        raise CapacityError(f"the evaluation is incomplete: {lost}",
                            fix="rerun once the endpoint answers, or wait longer for a cold start with "
                                "--retry-deadline SECONDS; the reports count the lost ones as errors")
    return 0 if report["decision"] in ("pass", "not_gated") else EXIT_REJECTED  # not_gated: measured, nothing judged

