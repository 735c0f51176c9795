"""Typed payloads of the ledger's records, and one predicate per question readers ask of a record.

A stage's end record holds its typed result (`tasks.ledger.stage_results`, read back here through a tolerant subclass
of each); the other records (a release opened, its options, a failed stage, a rollout's traffic steps and their bakes'
verdicts, approval requests and decisions, a fleet endpoint's retirement) get a small frozen model each here. Readers
decode a record once (`Opened.of(record)`, `promotion(record)`, ...) and read fields, never string keys
(tests/unit/test_typed_reads.py holds them to that). The models tolerate fields older ledgers lack (they default to
None) but never a wrong type.
"""

from __future__ import annotations

from typing import Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, create_model

from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.stage_results import RESULTS, PromoteResult, StageResult

R = TypeVar("R", bound=StageResult)
RECORD_ONLY_KEYS = ("config_hash", "release_id", "seconds")  # what a stage record adds around the result


# --- predicates: one per question, asked everywhere through these -------------------------------------------------


def is_promotion(record) -> bool:
    """A succeeded promote record: a release (by promotion, rollback or fleet move) serves from it."""
    return (record.stage, record.event) == (events.PROMOTE, events.SUCCEEDED)


def is_fleet_move(record) -> bool:
    """A fleet move's record: the succeeded promotion of the release a shared endpoint's layout change moved."""
    return is_promotion(record) and record.payload.get("trigger") == events.MOVE


def is_retirement(record) -> bool:
    """The record of a shared endpoint a fleet move left being deleted (`fleet/retired`)."""
    return (record.stage, record.event) == (events.FLEET, events.RETIRED)


# --- the payloads of records that are not a stage's result ------------------------------------------------------------


class Payload(BaseModel):
    """Base of the record payloads: frozen; a field an older ledger lacks reads None; keys a reader never reads (the
    record's own config hash and release id) are left out; a field of the wrong type is refused."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    @classmethod
    def of(cls, record) -> Self:
        """The payload of `record` (a `tasks.ledger.store.Record`) as this model."""
        return cls.model_validate(record.payload)


class Stamp(Payload):
    """What every record a release run appends carries beside its payload (`StageContext.record`): its config hash."""

    config_hash: str


class Opened(Payload):
    """`release/opened`: the effective config a release was opened with, its hash, and where its file was."""

    config_hash: str | None = None
    config: dict[str, Any] | None = None
    config_path: str | None = None
    config_dir: str | None = None


class Options(Payload):
    """`release/options`: how a run was asked to end (keep its candidate endpoint) and to gate (score the champion
    afresh, not reusing its recorded per-task results)."""

    keep_candidate: bool | None = None
    fresh_champion: bool | None = None


class Failure(Payload):
    """A stage's `failed` record: the error, as text, and its type."""

    error: str | None = None
    error_type: str | None = None


class StepRecord(Payload):
    """A rollout's traffic step (`traffic/step`, appended as copies moved) or its bake's verdict (`bake/verdict`): the
    step (`tasks.backends.interfaces.RolloutStep`) where it rolled, what served then (`live`, traffic) and what the bake
    saw (`online_gate`, verdict). A verdict carries the step's phase, batch, check and batches only."""

    endpoint: str | None = None
    component: str | None = None
    strategy: str | None = None
    from_release: str | None = None
    phase: str | None = None
    batch: int | None = None
    check: int | None = None
    batches: int | None = None
    old_copies: int | None = None
    new_copies: int | None = None
    copies: int | None = None
    old_spec_sha256: str | None = None
    new_spec_sha256: str | None = None
    alarm_states: dict[str, str] | None = None
    alarm: str | None = None
    live: dict[str, Any] | None = None
    online_gate: dict[str, Any] | None = None

    def key(self) -> tuple[str, int | None, int | None]:
        """What tells a traffic step (or its verdict) from the rollout's others: phase, batch, check."""
        return self.phase or "rollout", self.batch, self.check


class OnlineGateEvidence(Payload):
    """What a bake's online gate had seen when its verdict was recorded (`validation.online_gate.OnlineGate.evidence`):
    its decision so far, and the candidate's answers against the samples it needs."""

    decision: str | None = None
    candidate_answers: int | None = None
    min_samples: int | None = None


class ApprovalGate(Payload):
    """What an approval request shows of the gate it asks about: its decision and report (sha256 where it was kept)."""

    decision: str | None = None
    not_passed: list[str] | None = None
    report_html: str | None = None
    report_sha256: str | None = None


class AskedGate(Payload):
    """An inconclusive gate put to a person (`validation.inconclusive.choice: ask`): the champion check's interval over
    `n` paired tasks, the margin it was held to, and the gate's power at this size, in words."""

    choice: str | None = None
    interval: list[float | None] | None = None
    n: int | None = None
    margin: float | None = None
    power_text: list[str] | None = None


class Approval(Payload):
    """An approval record: the request (who may decide, until when, on which gate evidence; `step_functions`: the task
    token reference an execution waits on), a renewed token, or the decision (by whom, why, on which report)."""

    approvers: list[str] | None = None
    four_eyes: bool | None = None
    timeout_s: int | float | None = None
    deadline: str | None = None
    opened_by: str | None = None
    gate: ApprovalGate | None = None
    champion_release: str | None = None
    inconclusive: AskedGate | None = None
    candidate_kept: bool | None = None
    candidate_usd_per_hour: int | float | None = None
    step_functions: dict[str, Any] | None = None
    by: str | None = None
    reason: str | None = None
    requested_seq: int | None = None
    report_sha256: str | None = None
    gate_decision: str | None = None
    decided_at: str | None = None


class Retirement(Payload):
    """`fleet/retired`: a shared endpoint a fleet move left, deleted once no model served on it, and its successor."""

    endpoint: str | None = None
    replaced_by: str | None = None


# --- decoders: a record's payload as its model ------------------------------------------------------------------------


def _as_recorded(model: type[R]) -> type[R]:
    """`model` as a reader reads it back: a subclass whose fields without a default default to None, so a partial
    or older record reads (a field it lacks is None) while a field of the wrong type is still refused."""
    lacking = {name: (info.annotation | None, None) for name, info in model.model_fields.items() if info.is_required()}
    return create_model(f"Recorded{model.__name__}", __base__=model, __module__=__name__, **lacking)


RECORDED: dict[type[StageResult], type[StageResult]] = {model: _as_recorded(model) for model in RESULTS.values()}
STAGE_OF: dict[type[StageResult], str] = {model: name for name, model in RESULTS.items()}


def stage_payload(record, model: type[R]) -> R:
    """The typed result a stage's end record holds (`model`, its stage's result model), read back tolerantly."""
    return as_result({key: value for key, value in record.payload.items() if key not in RECORD_ONLY_KEYS}, model)


def promotion(record) -> PromoteResult:
    """A promote record's result: where the release serves, by which trigger and steps (a fleet move: from where)."""
    return stage_payload(record, PromoteResult)


def as_result(values: dict, model: type[R]) -> R:
    """A stage result's fields (all or some: a view's gate evidence) as `model`, read back tolerantly."""
    return RECORDED[model].model_validate(values)


def entry_result(entry: dict, model: type[R]) -> R | None:
    """The result a stage's entry in `ReleaseState.stage` holds, as `model` read back tolerantly; None while the stage
    has not ended (started, failed, pending)."""
    return as_result(entry["result"], model) if "result" in entry else None


def recorded(state, model: type[R]) -> R | None:
    """The result `state`'s stage of `model` recorded, whatever became of it since (a candidate deployed, then torn
    down, keeps its deploy result), read back tolerantly; None while the stage has not ended."""
    return entry_result(state.stage(STAGE_OF[model]), model)


def recorded_or_empty(state, model: type[R]) -> R:
    """`recorded`, or, while the stage has not ended, the result with every field unset (None): for summaries that
    show what a release has so far."""
    return recorded(state, model) or RECORDED[model]()
