"""A release as its ledger records tell it: where each stage stands, its typed result, its status (opened, running,
awaiting an approval, finished) and a small summary of it.

This is the only state a resumed run needs (`tasks.pipeline.release` runs the stages on it) and what every view of
the history reads (`tasks.ledger.views`, the CLI's `status`, the audit report): pure reads of records, below both.
"""

from __future__ import annotations

from shiplift.tasks.errors import NotFound
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.records import RECORD_ONLY_KEYS, Failure, Opened, Options, recorded_or_empty, stage_payload
from shiplift.tasks.ledger.stage_results import (
    BuildResult,
    DeployResult,
    ImageResult,
    PackageResult,
    PromoteResult,
    StageResult,
    TeardownResult,
    ValidateResult,
    stage_result,
)


class ReleaseState:
    """What a release has done so far, read from its ledger records (the only state a resumed run needs)."""

    def __init__(self, ledger, release_id: str):
        self.ledger = ledger
        self.release_id = release_id
        self.records: list = []
        self.refresh()

    @classmethod
    def load(cls, ledger, release_id: str) -> ReleaseState:
        """The release's state; NotFound when the ledger has never seen it opened."""
        state = cls(ledger, release_id)
        if state.opened is None:
            raise NotFound(f"release {release_id!r} was never opened in the ledger",
                           fix="run `shiplift release CONFIG` first, or point --ledger-url / --state-dir at its ledger")
        return state

    @classmethod
    def from_records(cls, release_id: str, records: list) -> ReleaseState:
        """A state over records already read, for views of many releases at once (it cannot refresh)."""
        state = cls.__new__(cls)
        state.ledger, state.release_id, state.records = None, release_id, list(records)
        return state

    def refresh(self) -> None:
        try:
            self.records = self.ledger.release(self.release_id)
        except NotFound:
            self.records = []

    def _latest(self, stage_name: str, events: tuple[str, ...] | None = None):
        for record in reversed(self.records):
            if record.stage == stage_name and (events is None or record.event in events):
                return record
        return None

    @property
    def opened(self) -> dict | None:
        record = next((r for r in self.records if (r.stage, r.event) == (events.RELEASE, events.OPENED)), None)
        return record.payload if record else None

    @property
    def status(self) -> str:
        final = self._latest(events.RELEASE, events.FINAL)
        if final is not None:
            return final.event
        if awaiting(self.records) is not None:
            return events.AWAITING_APPROVAL
        return "running" if any(r.stage != events.RELEASE for r in self.records) else "created"

    def _options(self) -> list[Options]:
        """The release's `release/options` records, oldest first."""
        return [Options.of(r) for r in self.records if (r.stage, r.event) == (events.RELEASE, events.OPTIONS)]

    @property
    def keep_candidate(self) -> bool | None:
        """The latest run's ask to keep (or not) the candidate endpoint; None: no run asked."""
        return next((o.keep_candidate for o in reversed(self._options()) if o.keep_candidate is not None), None)

    @property
    def fresh_champion(self) -> bool:
        """Whether a run of this release asked its gate to score the champion afresh (`--fresh-champion`)."""
        return any(options.fresh_champion for options in self._options())

    def stage(self, name: str) -> dict:
        """`{"status": pending|started|failed|succeeded|torn_down, "result": …, "event": …}` of one stage."""
        record = self._latest(name)
        if record is None:
            return {"status": "pending"}
        if record.event == events.STARTED:
            return {"status": "started"}
        if record.event == events.FAILED:
            failure = Failure.of(record)
            return {"status": "failed", "error": failure.error, "error_type": failure.error_type}
        entry = {"status": "succeeded", "event": record.event, "seq": record.seq,
                 "result": {k: v for k, v in record.payload.items() if k not in RECORD_ONLY_KEYS}}
        if name == events.DEPLOY_CANDIDATE and self._latest(events.PROMOTE, events.DONE) is None:
            # a release that has not finished redeploys on resume,
            teardown = self._latest(events.TEARDOWN, events.DONE)
            asked = self._latest(events.APPROVAL) is not None  # unless it was torn down to wait for approval
            removed = teardown is not None and stage_payload(teardown, TeardownResult).removed
            if removed and teardown.seq > record.seq and not asked:
                entry["status"] = "torn_down"
        return entry

    def result(self, name: str) -> StageResult:
        """A stage's result, typed (`tasks.pipeline.results`); NotFound while it has not succeeded."""
        return stage_result(name, self.stage(name), self.release_id)


def awaiting(records: list) -> dict | None:
    """The open approval request among one release's records (its payload with `seq` and `requested_at`), else None."""
    request = next((r for r in records if (r.stage, r.event) == (events.APPROVAL, events.AWAITING_APPROVAL)), None)
    if request is None or any(r.stage == events.APPROVAL and r.event in events.APPROVAL_DECISIONS for r in records):
        return None
    return {**request.payload, "seq": request.seq, "requested_at": request.recorded_at}


def release_summary(state: ReleaseState) -> dict:
    """A small JSON-able view of a release: ids, artifact, gate decision, serving status (None for what it has not
    reached)."""
    build, package, image = (recorded_or_empty(state, model) for model in (BuildResult, PackageResult, ImageResult))
    deploy, gate, promote = (recorded_or_empty(state, model) for model in (DeployResult, ValidateResult, PromoteResult))
    return {
        "release_id": state.release_id,
        "model": (Opened.model_validate(state.opened or {}).config or {}).get("name"),
        "status": state.status,
        "artifact_sha256": package.artifact_sha256,
        "file_type": (build.info or {}).get("file_type"),
        "temperature": build.temperature,
        "image_uri": image.image_uri,
        "placement": deploy.placement,
        "decision": gate.decision,
        "not_passed": gate.not_passed,
        "metrics": gate.metrics,
        "report": gate.report_html,
        "rollout": {"strategy": promote.strategy, "steps": len(promote.steps or []), "reason": promote.reason},
        "served_by": promote.endpoint,
        "component": promote.component,
        "stages": {name: state.stage(name)["status"] for name in events.STAGES},
        "awaiting_approval": awaiting(state.records),
    }
