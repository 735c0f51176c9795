"""Typed stage results: one frozen model per stage, stored in the ledger as the JSON the stages always wrote.

A stage returns its result model; `run_stage` records `model_dump(mode="json")` in the stage's succeeded (or skipped,
kept, rolled back) record, and `StageContext.result(name)` reads it back as the same model, so later stages, the
summary and the backends read fields, not string keys. The field names are the keys earlier releases wrote, so a
ledger written before these models existed opens and resumes unchanged. A family's build records what only it knows
(a GGUF's letter tokens, an export's parity report) beside the common fields (`BuildResult` keeps those as they are).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shiplift.tasks.errors import NotFound
from shiplift.tasks.ledger.events import SUCCEEDED


class StageResult(BaseModel):
    """Base of the results: frozen; `event` is the ledger event the stage ended with."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: str = SUCCEEDED

    def record(self) -> dict[str, Any]:
        """The payload the ledger keeps: the fields that were set (an optional field a stage did not set is left out,
        as the stages always left it out), so a result read back records exactly what was read."""
        return self.model_dump(mode="json", exclude_unset=True)


class KeptRef(BaseModel):
    """A file or folder a later stage needs, kept in the artifact store (`tasks.pipeline.stages.common.keep_file`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uri: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)
    kind: Literal["file", "folder"]


class ResolveResult(StageResult):
    source_sha256: str
    source: dict[str, Any]
    source_ref: KeptRef


class Memory(BaseModel):
    """What one copy needs, in MiB (`tasks.backends.placement.MemoryEstimate`, with its total)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_mb: int
    context_mb: int
    runtime_mb: int
    context_label: str
    total_mb: int


class BuildResult(StageResult):
    """The built model: common fields, plus what the model family records of its own build (kept as it wrote them)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    output: KeptRef
    model_sha256: str
    info: dict[str, Any]
    memory: Memory
    temperature: float
    calibration: dict[str, Any] | None = None


class PackageResult(StageResult):
    artifact_uri: str
    artifact_sha256: str
    size_bytes: int


class ImageResult(StageResult):
    image_uri: str
    image_digest: str
    base_image: str
    files: int
    source_sha256: str | None = None
    size_bytes: int | None = None  # the registry's size where it tells one (ECR: compressed layers); unset: unknown


class DeployResult(StageResult):
    endpoint: str
    component: str
    placement: dict[str, Any]
    model_ref: dict[str, Any]


class ValidateResult(StageResult):
    decision: Literal["pass", "fail", "inconclusive"]
    metrics: dict[str, Any]
    checks: list[dict[str, Any]]
    not_passed: list[str]
    thresholds: dict[str, Any]
    datasets: list[dict[str, Any]]
    champion_release: str | None = None
    report_json: str
    report_html: str
    evidence: dict[str, KeptRef]
    cost: dict[str, Any] | None = None  # tasks.backends.pricing results (candidate hour, production hour, per million)
    # an inconclusive gate's validation.inconclusive choice and its outcome (blocked, asked with the interval and the
    # power, or extended with every look), and the first look's decision and checks; unset when the gate decided
    inconclusive: dict[str, Any] | None = None
    # the per-task files this gate measured live (evidence names), each with the identity hash of the model that
    # answered and each dataset's reuse key (`validation.champion_reuse`): what a later gate against that model reuses
    measured: dict[str, dict[str, Any]] | None = None
    # the champion's evidence: reused (from_release, file, n, latency_sample) or scored on every task (why)
    champion_evidence: dict[str, Any] | None = None

    @property
    def asked(self) -> bool:
        """Inconclusive, and the release chose to ask a person (validation.inconclusive.choice: ask)."""
        return self.decision == "inconclusive" and (self.inconclusive or {}).get("outcome") == "asked"


class PromoteResult(StageResult):
    """Production after promote: succeeded on the candidate's spec, rolled back by an alarm, or skipped (gate)."""

    event: Literal["succeeded", "rolled_back", "skipped"] = SUCCEEDED
    reason: str | None = None
    decision: str | None = None
    endpoint: str | None = None
    component: str | None = None
    strategy: str | None = None
    steps: list[dict[str, Any]] = []
    served: dict[str, Any] | None = None
    copies: int | None = None
    placement: dict[str, Any] | None = None
    image_digest: str | None = None
    trigger: Literal["promote", "rollback", "move"] | None = None  # a triggered promotion, rollback or fleet move
    rollback_reason: str | None = None
    rollback_from: str | None = None
    rollback_to: str | None = None
    moved_from: dict[str, str | None] | None = None  # a fleet move: the endpoint and component it served on before
    moved_to: dict[str, Any] | None = None  # a fleet move: the placement, copies and scale_to_zero it serves with since
    # a fleet move (and a promotion of a moved release): its share of the endpoint's bill
    share: dict[str, Any] | None = None

    @property
    def moved_from_endpoint(self) -> str | None:
        """A fleet move's: the endpoint it moved the release away from (None for any other promotion)."""
        return (self.moved_from or {}).get("endpoint")


class TeardownResult(StageResult):
    """The candidate removed (`removed`: whether anything was there), kept as asked, or skipped (none deployed)."""

    event: Literal["succeeded", "kept", "skipped"] = SUCCEEDED
    endpoint: str | None = None
    removed: bool | None = None
    reason: str | None = None


RESULTS: dict[str, type[StageResult]] = {
    "resolve": ResolveResult, "build": BuildResult, "package": PackageResult, "image": ImageResult,
    "deploy_candidate": DeployResult, "validate": ValidateResult, "promote": PromoteResult,
    "teardown_candidate": TeardownResult,
}


def stage_result(name: str, entry: dict, release_id: str) -> StageResult:
    """A stage's typed result from its entry in `ReleaseState.stage`; NotFound while the stage has not succeeded."""
    if entry["status"] != "succeeded":
        raise NotFound(f"stage {name!r} of {release_id} has not succeeded (it is {entry['status']})",
                       fix=f"run stage {name} first")
    return RESULTS[name].model_validate(entry["result"])  # a payload without an event is a succeeded one
