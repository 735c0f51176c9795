"""The GGUF chat family: a GGUF served by the llama.cpp DLC's default chat path, gated on decision tasks asked as chat.

Config: `artifact.kind: gguf` (the same sources as the SemIf family), `image.kind: dlc-chat` (the DLC itself, no
Dockerfile and no build: its tag resolved to a digest, llama-server's options as `SM_LLAMA_CPP_*` variables),
`validation.kind: chat-decisions` (JevBench-format datasets read out through `validation.decisions.chat_readout`).
The package holds the GGUF as `<sha256>.gguf`, which the DLC finds as the first `*.gguf` under /opt/ml/model and
reports as the model of every answer, so the online gate can tell which release answered. Locally `images/dlc-chat/`
stands in for the DLC on loopback (llama-cpp-python's OpenAI-compatible server behind the SageMaker container contract).
The chat template is the config's `image.server.chat_template`, else the GGUF's own, else the one its architecture
implies (`images.common.chat_templates`, as the stand-in chooses it); the build records which and where it came from
(`chat_template`, in the manifest too), and an inferred one reaches the DLC as SM_LLAMA_CPP_CHAT_TEMPLATE (the build's
`container_env`), since its llama-server would fall back to ChatML.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from shiplift.images.common.chat_templates import inferred_template
from shiplift.tasks.config_types import Strict
from shiplift.tasks.errors import BadInput, ConfigError
from shiplift.tasks.families.base import (
    AdoptedImageConfig,
    BuiltModel,
    GateConfig,
    add_evaluation_arguments,
    exec_server,
    optional_env,
    recorded_fields,
)
from shiplift.tasks.families.gguf_decisions import GgufDecisions, run_jevbench_eval
from shiplift.validation.thresholds import DecisionThresholds

# llama-server's built-in --chat-template names that the local stand-in maps onto llama-cpp-python's chat formats.
CHAT_TEMPLATES = ("chatml", "gemma", "llama2", "llama3", "mistral-v1", "zephyr", "vicuna", "openchat")
DLC_TAGS = ("server-sagemaker-cpu-v1", "server-sagemaker-cuda-v1")
# The DLC's registry account per region (aws/deep-learning-containers, docs/reference/region_availability.md); the
# regions not listed use 763104351884.
DLC_ACCOUNTS = {
    "*": "763104351884",
    "af-south-1": "626614931356", "ap-east-1": "871362719292", "ap-east-2": "975050140332",
    "ap-south-2": "772153158452", "ap-southeast-3": "907027046896", "ap-southeast-4": "457447274322",
    "ap-southeast-5": "550225433462", "ap-southeast-6": "633930458069", "ap-southeast-7": "590183813437",
    "ap-northeast-3": "364406365360", "ca-west-1": "204538143572", "eu-south-1": "692866216735",
    "eu-south-2": "503227376785", "eu-central-2": "380420809688", "il-central-1": "780543022126",
    "mx-central-1": "637423239942", "me-south-1": "217643126080", "me-central-1": "914824155844",
    "cn-north-1": "727897471807", "cn-northwest-1": "727897471807",
    "us-gov-east-1": "446045086412", "us-gov-west-1": "442386744353",
}
NETWORK_OPTIONS = ("hf_repo", "hf_file")


class LlamaServerOptions(Strict):
    """`image.server`: llama-server's options, each passed as `SM_LLAMA_CPP_<NAME>` (→ `--<name>`)."""

    ctx_size: int = Field(4096, ge=256, le=1 << 20, description="--ctx-size: the context each request shares")
    batch_size: int | None = Field(None, ge=1, le=1 << 16)
    ubatch_size: int | None = Field(None, ge=1, le=1 << 16)
    flash_attn: Literal["on", "off", "auto"] | None = None
    chat_template: Literal[CHAT_TEMPLATES] | None = Field(
        None, description="a built-in template for a GGUF whose metadata has none; None: the GGUF's own")

    @field_validator("flash_attn", mode="before")
    @classmethod
    def _yaml_switch(cls, value: Any) -> Any:
        """YAML 1.1 reads a bare `on`/`off` as true/false: take them as the words they were written as."""
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value

    @model_validator(mode="before")
    @classmethod
    def _no_download(cls, data: Any) -> Any:
        named = [key for key in NETWORK_OPTIONS if isinstance(data, dict) and key in data]
        if named:
            raise ValueError(
                f"image.server.{' and '.join(named)} make the DLC download the model from Hugging Face when it starts, "
                "but shiplift's endpoints run with network isolation (EnableNetworkIsolation), where that download "
                "cannot happen; give the model as artifact.source (kind: huggingface is fetched and pinned at build "
                "time)")
        return data

    @model_validator(mode="after")
    def _ubatch_fits_batch(self) -> LlamaServerOptions:
        if self.batch_size is not None and self.ubatch_size is not None and self.ubatch_size > self.batch_size:
            raise ValueError(f"image.server.ubatch_size ({self.ubatch_size}) exceeds batch_size ({self.batch_size}); "
                             "lower ubatch_size or raise batch_size")
        return self

    def environment(self) -> dict[str, str]:
        """The options that are set, as the DLC's SM_LLAMA_CPP_* variables."""
        return {f"SM_LLAMA_CPP_{name.upper()}": str(value) for name, value in self.model_dump().items()
                if value is not None}


class DlcChatImage(AdoptedImageConfig):
    """The llama.cpp DLC as published, serving its default chat path; `tag` picks the CPU or CUDA build."""

    kind: Literal["dlc-chat"]
    tag: Literal[DLC_TAGS]
    n_gpu_layers: int = Field(0, ge=-1, le=100_000)
    server: LlamaServerOptions = LlamaServerOptions()

    repository: ClassVar[str] = "llama-cpp"
    registry_accounts: ClassVar[dict[str, str]] = DLC_ACCOUNTS
    min_gpu_driver: ClassVar[int] = 580  # the llama.cpp CUDA-13 DLC does not start on older drivers
    gpu_fix: ClassVar[str] = "use image.tag server-sagemaker-cuda-v1 and set image.n_gpu_layers (-1: all)"

    @property
    def on_gpu(self) -> bool:
        return self.tag == "server-sagemaker-cuda-v1"

    @model_validator(mode="after")
    def _layers_fit_build(self) -> DlcChatImage:
        if self.n_gpu_layers != 0 and not self.on_gpu:
            raise ValueError(f"image.n_gpu_layers is {self.n_gpu_layers} but image.tag {self.tag} is the CPU build; "
                             "use tag server-sagemaker-cuda-v1 or n_gpu_layers 0")
        return self

    def container_env(self, *, cpu_only: bool = False) -> dict[str, str]:
        return {
            "SM_LLAMA_CPP_THREADS": str(self.threads),
            "SM_LLAMA_CPP_N_GPU_LAYERS": "0" if cpu_only else str(self.n_gpu_layers),
            **self.server.environment(),
        }


class ChatDecisionGateConfig(GateConfig):
    """Decision gates through chat completions (`kind: chat-decisions`): the SemIf gate's thresholds and rules."""

    kind: Literal["chat-decisions"] = "chat-decisions"
    concurrency: int = Field(2, ge=1, le=64)
    thresholds: DecisionThresholds
    top_logprobs: int = Field(20, ge=1, le=20,
                              description="entries asked per request; a letter outside them is invalid")
    shots: int = Field(0, ge=0, le=3,
                       description="solved examples asked before each task (validation.decisions.chat_readout)")

    extendable: ClassVar[bool] = True  # GgufDecisions.reserve scores the reserve through the chat readout


class GgufChat(GgufDecisions):
    image_model = DlcChatImage
    validation_model = ChatDecisionGateConfig
    env_prefix = "DLC_CHAT"
    replays_online = True
    temperature_scaling = False

    def build(self, ctx) -> BuiltModel:
        """The GGUF build, with the chat template chosen (`chat_template`) and, when inferred from the architecture,
        the variable that gives it to the DLC (`container_env`); ConfigError when no template applies."""
        built = super().build(ctx)
        named = ctx.config.image.server.chat_template
        if named is not None:
            return built.model_copy(update={"chat_template": {"name": named, "from": "image.server.chat_template"}})
        if built.info.get("has_chat_template"):
            return built.model_copy(update={"chat_template": {"name": None, "from": "tokenizer.chat_template"}})
        architecture, vocabulary = built.info.get("architecture"), built.info.get("tokenizer_model")
        inferred = inferred_template({"general.architecture": architecture, "tokenizer.ggml.model": vocabulary})
        if inferred is None:
            raise ConfigError(
                f"the GGUF {Path(built.output.uri).name} has no tokenizer.chat_template and its general.architecture "
                f"({architecture}, tokenizer {vocabulary}) implies none, so the chat path cannot format its messages "
                "(llama.cpp would fall back to a template the model was not trained on)",
                fix=f"set image.server.chat_template to the model's format ({', '.join(CHAT_TEMPLATES)})",
            )
        ctx.say(f"build: chat template {inferred}, inferred from general.architecture {architecture} (the GGUF has "
                "none): the endpoint gets SM_LLAMA_CPP_CHAT_TEMPLATE")
        chosen = {"name": inferred, "from": f"general.architecture {architecture}"}
        return built.model_copy(update={"chat_template": chosen,
                                        "container_env": {"SM_LLAMA_CPP_CHAT_TEMPLATE": inferred}})

    def manifest_fields(self, built) -> dict:
        """The GGUF fields, and the chat template with where it came from."""
        return {**super().manifest_fields(built), **recorded_fields(built, ("chat_template",))}

    def context_tokens(self, image: DlcChatImage) -> int:
        return image.server.ctx_size

    def package(self, built_model: Path, out_dir: Path, manifest: dict, calibration: Path | None):
        from shiplift.tasks.artifacts.packaging import package_gguf

        return package_gguf(built_model, out_dir, manifest=manifest,
                            member_name=f"{manifest['build']['model_sha256']}.gguf")

    def calibration_predictions(self, ctx, invoker, path: Path, splits, settings) -> tuple[list, str]:
        raise ConfigError("a chat release fits no temperature", fix="leave calibration.fit_temperature false")

    def gate_context(self, context, candidate, datasets: list, validation: ChatDecisionGateConfig, settings,
                     progress):
        """The gate's release context as it is: the DLC's chat server keeps no prefix cache of shiplift's to check
        cold against warm."""
        return context

    def readout(self, validation: ChatDecisionGateConfig):
        from shiplift.validation.decisions.chat_readout import ChatReadout

        return ChatReadout(validation.top_logprobs, validation.shots)

    def summary_metrics(self, metrics: dict) -> dict:
        losses = metrics.get("readout") or {}
        return {key: losses.get(key) for key in ("missing_letter_share", "non_letter_generated_share")}

    def add_commands(self, serve, evaluate) -> None:
        p = serve.add_parser("chat", help="the DLC's chat path on a GGUF file: /v1/chat/completions and /invocations")
        p.add_argument("--gguf", required=True, help="the GGUF model file to serve")
        p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
        p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
        p.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 1), help="SM_LLAMA_CPP_THREADS")
        p.add_argument("--ctx-size", type=int, help="SM_LLAMA_CPP_CTX_SIZE (default 4096, llama-server's)")
        p.add_argument("--chat-template", choices=CHAT_TEMPLATES,
                       help="SM_LLAMA_CPP_CHAT_TEMPLATE: the template of a GGUF without tokenizer.chat_template "
                            "whose general.architecture implies none (gemma*, qwen2/3 and Llama 3 are inferred)")
        p.add_argument("--max-in-flight", type=int, help="requests admitted at once (DLC_CHAT_MAX_IN_FLIGHT)")
        p.set_defaults(func=_serve)

        p = evaluate.add_parser("chat", help="score JevBench-format tasks on any OpenAI-compatible chat endpoint")
        add_evaluation_arguments(p, unit="tasks", data_help="JSONL files in JevBench format",
                                 component_help="inference component name (X-Amzn-SageMaker-Inference-Component)")
        p.add_argument("--concurrency", type=int, default=2, help="requests in flight at once (default 2)")
        p.add_argument("--top-logprobs", type=int, default=20, help="entries asked per request (1-20)")
        p.add_argument("--shots", type=int, default=0, help="solved examples asked before each task (0-3)")
        p.set_defaults(func=_eval)


def _serve(args) -> int:
    """`shiplift serve chat`: the local stand-in of the DLC's chat path on any GGUF file, in the foreground."""
    gguf = Path(args.gguf)
    if not gguf.is_file():
        raise BadInput(f"GGUF file {gguf} does not exist", fix="pass --gguf PATH to a .gguf file")
    env = {"DLC_CHAT_GGUF_PATH": str(gguf.resolve()), "DLC_CHAT_PORT": str(args.port), "DLC_CHAT_HOST": args.host,
           "SM_LLAMA_CPP_THREADS": str(args.threads)}
    env.update(optional_env(args,
                            (("ctx_size", "SM_LLAMA_CPP_CTX_SIZE"), ("chat_template", "SM_LLAMA_CPP_CHAT_TEMPLATE"),
                                   ("max_in_flight", "DLC_CHAT_MAX_IN_FLIGHT"))))
    return exec_server("dlc-chat", env)


def _eval(args) -> int:
    """`shiplift eval chat`: score JevBench-format tasks through chat completions, against a champion if given."""
    from shiplift.validation.decisions.chat_readout import EXAMPLES, MAX_TOP_LOGPROBS, ChatReadout

    if not 1 <= args.top_logprobs <= MAX_TOP_LOGPROBS:
        raise BadInput(f"--top-logprobs {args.top_logprobs} is outside 1..{MAX_TOP_LOGPROBS}",
                       fix=f"pass a value from 1 to {MAX_TOP_LOGPROBS} (the OpenAI API's bound)")
    if not 0 <= args.shots <= len(EXAMPLES):
        raise BadInput(f"--shots {args.shots} is outside 0..{len(EXAMPLES)}",
                       fix=f"pass 0 to {len(EXAMPLES)}: there are {len(EXAMPLES)} solved examples")
    return run_jevbench_eval(args, ChatReadout(args.top_logprobs, args.shots),
                             title=f"chat-path evaluation of {args.endpoint}")


FAMILY = GgufChat  # the class the registry admits (and refuses if it lacks a step)
