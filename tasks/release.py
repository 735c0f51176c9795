"""The release as a resumable state machine whose state is the ledger (DESIGN §4).

`resolve → build → package → image → deploy_candidate → validate → promote →
teardown_candidate` (the stage table, `tasks.stages.table`). Opening a release appends a
`release/opened` record carrying the effective config; every stage appends `started` and then
`succeeded` (with its result), `skipped`, `kept` or `failed`; the end appends `release/<status>`.
So any worker that reaches the ledger (PostgreSQL in production: Celery workers on several hosts,
ECS tasks started by Step Functions) can run or resume any stage with no shared filesystem: files a
later stage needs go through the artifact store. The release id derives from the config alone
(`<name>-<config hash>`, where the hash leaves out where state and the ledger live), so the same
config never creates a second release and a rerun continues at the first stage not done.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tasks.config import ReleaseConfig, load_release_config
from tasks.errors import NotFound, ShipliftError
from tasks.stages.table import STAGE_NAMES, TEARDOWN, stage

STAGES = STAGE_NAMES
LEASE_TTL_S = 4 * 3600
RELEASE_STAGE = "release"
OPENED, OPTIONS = "opened", "options"
FINISHED = ("promoted", "rejected", "rolled_back")
FINAL_EVENTS = (*FINISHED, "failed")
DONE_EVENTS = ("succeeded", "skipped", "kept", "rolled_back")
RECORD_ONLY_KEYS = ("config_hash", "release_id", "seconds")  # what a stage record adds around the result
Progress = Callable[[str], None]


def print_progress(message: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def default_actor() -> str:
    return os.environ.get("SHIPLIFT_ACTOR") or f"{getpass.getuser()}@{socket.gethostname()}"


def release_id_for(config: ReleaseConfig) -> str:
    return f"{config.name}-{config.config_hash()[:12]}"


class ReleaseState:
    """What a release has done so far, read from its ledger records (the only state a resumed run needs)."""

    def __init__(self, ledger, release_id: str):
        self.ledger = ledger
        self.release_id = release_id
        self.records: list = []
        self.refresh()

    @classmethod
    def load(cls, ledger, release_id: str) -> "ReleaseState":
        """The release's state; NotFound when the ledger has never seen it opened."""
        state = cls(ledger, release_id)
        if state.opened is None:
            raise NotFound(f"release {release_id!r} was never opened in the ledger",
                           fix="run `shiplift release CONFIG` first, or point --ledger-url / --state-dir at its ledger")
        return state

    @classmethod
    def from_records(cls, release_id: str, records: list) -> "ReleaseState":
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
        record = next((r for r in self.records if (r.stage, r.event) == (RELEASE_STAGE, OPENED)), None)
        return record.payload if record else None

    @property
    def status(self) -> str:
        final = self._latest(RELEASE_STAGE, FINAL_EVENTS)
        if final is not None:
            return final.event
        return "running" if any(r.stage != RELEASE_STAGE for r in self.records) else "created"

    @property
    def keep_candidate(self) -> bool | None:
        options = self._latest(RELEASE_STAGE, (OPTIONS,))
        return options.payload.get("keep_candidate") if options else None

    def stage(self, name: str) -> dict:
        """`{"status": pending|started|failed|succeeded|torn_down, "result": …, "event": …}` of one stage."""
        record = self._latest(name)
        if record is None:
            return {"status": "pending"}
        if record.event == "started":
            return {"status": "started"}
        if record.event == "failed":
            return {"status": "failed", "error": record.payload.get("error"), "error_type": record.payload.get("error_type")}
        entry = {"status": "succeeded", "event": record.event, "seq": record.seq,
                 "result": {k: v for k, v in record.payload.items() if k not in RECORD_ONLY_KEYS}}
        if name == "deploy_candidate" and self._latest("promote", DONE_EVENTS) is None:
            teardown = self._latest(TEARDOWN, DONE_EVENTS)  # a release that has not finished redeploys on resume
            if teardown is not None and teardown.seq > record.seq and teardown.payload.get("removed"):
                entry["status"] = "torn_down"
        return entry

    def result(self, name: str) -> dict:
        entry = self.stage(name)
        if entry["status"] != "succeeded":
            raise NotFound(f"stage {name!r} of {self.release_id} has not succeeded (it is {entry['status']})",
                           fix=f"run stage {name} first")
        return entry["result"]


@dataclass
class StageContext:
    """Everything a stage function needs: typed config, backends, and earlier stage results."""

    config: ReleaseConfig
    config_dir: Path
    release_id: str
    state: ReleaseState
    backends: Any
    actor: str
    progress: Progress = print_progress
    work_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.work_dir = self.backends.state_dir / "releases" / self.release_id

    def result(self, name: str) -> dict:
        return self.state.result(name)

    def stage_dir(self, name: str) -> Path:
        """Scratch space of one stage on this worker (what later stages need goes to the artifact store)."""
        path = self.work_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def say(self, message: str) -> None:
        self.progress(f"{self.release_id} {message}")

    def record(self, stage_name: str, event: str, payload: dict) -> None:
        """Append one ledger record of this release (with its config hash and id) and re-read its state; then, where
        the backend keeps a registry view that follows this record, sync it."""
        self.backends.ledger.append(release_id=self.release_id, model=self.config.name, stage=stage_name, event=event,
                                    payload={"config_hash": self.config.config_hash(), "release_id": self.release_id,
                                             **payload}, actor=self.actor)
        self.state.refresh()
        registry = self.backends.registry
        if registry is not None and (stage_name, event) in registry.follows:
            self.sync_registry()

    def sync_registry(self) -> None:
        """Bring the backend's registry view of this release in line with its ledger records (aws: the SageMaker
        Model Registry; nothing locally). The ledger is written first and stays the truth, so a failure here is
        reported, never raised; the next sync repairs the view: the release's next followed record, or reopening it
        (a rerun of `shiplift release CONFIG` or of the refresh DAG, also once the release has finished)."""
        if self.backends.registry is None:
            return
        try:
            view = self.backends.registry.sync(self)
        except ShipliftError as exc:
            self.say(f"WARNING model registry not updated, the ledger is unaffected (rerun the release to repair the view): {exc}")
            return
        if view is not None:
            self.say(f"model registry: {view['model_package_arn']} {view['status']}" + (" (updated)" if view["changed"] else ""))


def open_release(
    config_path: str | Path, *, overrides: tuple[str, ...] = (), actor: str | None = None, progress: Progress = print_progress,
    session: Any = None,
) -> StageContext:
    """Load the config, derive the release id and open the release in the ledger (once)."""
    from tasks.backends import make_backends

    config = load_release_config(config_path, overrides=overrides)
    release_id = release_id_for(config)
    backends = make_backends(config, session=session)
    state = ReleaseState(backends.ledger, release_id)
    actor = actor or default_actor()
    backends.preflight()
    if state.opened is None:
        backends.ledger.append(
            release_id=release_id, model=config.name, stage=RELEASE_STAGE, event=OPENED, actor=actor,
            payload={"config_hash": config.config_hash(), "config": config.model_dump(mode="json"),
                     "config_path": str(Path(config_path).resolve()), "config_dir": str(Path(config_path).resolve().parent)},
        )
        state.refresh()
    ctx = StageContext(config=config, config_dir=Path(state.opened["config_dir"]), release_id=release_id, state=state,
                       backends=backends, actor=actor, progress=progress)
    ctx.sync_registry()  # a rerun repairs a view an earlier failure left behind (no call before the gate has decided)
    return ctx


def reopen_release(release_id: str, *, ledger_url: str | None = None, state_dir: str | Path | None = None,
                   actor: str | None = None, progress: Progress = print_progress, session: Any = None) -> StageContext:
    """Rebuild a release's context from the ledger alone (what `shiplift stage` and the DAG tasks run on)."""
    from tasks.backends import default_state_dir, make_backends, open_ledger

    ledger = open_ledger(ledger_url=ledger_url, state_dir=state_dir)
    state = ReleaseState.load(ledger, release_id)
    config = ReleaseConfig.model_validate(state.opened["config"])
    if config.backend.kind == "aws":  # scratch and caches are this worker's own, not the opener's
        here = str(Path(state_dir).expanduser().resolve()) if state_dir else str(default_state_dir())
        config = config.model_copy(update={"backend": config.backend.model_copy(update={"state_dir": here})})
    backends = make_backends(config, ledger=ledger, session=session)
    return StageContext(config=config, config_dir=Path(state.opened["config_dir"]), release_id=release_id, state=state,
                        backends=backends, actor=actor or default_actor(), progress=progress)



def run_stage(ctx: StageContext, name: str, *, function: Callable[[StageContext], dict] | None = None,
              extra: dict | None = None) -> dict:
    """Run one stage (or `function` in its place, as promotion and rollback do), recording its start
    and its end (result or error) in the ledger; `extra` goes into every record (reason, trigger)."""
    function = function or stage(name).load()
    extra = extra or {}
    ctx.say(f"{name}: started")
    ctx.record(name, "started", extra)
    began = time.monotonic()
    try:
        result = function(ctx)
    except Exception as exc:
        error = str(exc) if isinstance(exc, ShipliftError) else repr(exc)
        ctx.record(name, "failed", {**extra, "error": error, "error_type": type(exc).__name__})
        raise
    seconds = round(time.monotonic() - began, 3)
    event = result.get("event", "succeeded")
    ctx.record(name, event, {**extra, **result, "seconds": seconds})
    ctx.say(f"{name}: {event} in {seconds:.1f}s")
    return result


def ensure_stage(ctx: StageContext, name: str) -> dict:
    """Run a stage unless it already succeeded; teardown always runs (it is idempotent).

    This is what makes a retried Airflow task or Step Functions state continue instead of
    duplicating work: a stage that finished before the crash returns its recorded result.
    """
    entry = ctx.state.stage(name)
    if entry["status"] == "succeeded" and name != TEARDOWN:
        return entry["result"]
    return run_stage(ctx, name)


def run_release(
    config_path: str | Path,
    *,
    overrides: tuple[str, ...] = (),
    keep_candidate: bool | None = None,
    actor: str | None = None,
    progress: Progress = print_progress,
    session: Any = None,
) -> dict:
    """Run (or resume) every stage of a release under the model's promotion lease."""
    ctx = open_release(config_path, overrides=overrides, actor=actor, progress=progress, session=session)
    if ctx.state.status in FINISHED:
        ctx.say(f"already {ctx.state.status}; nothing to do")
        return release_summary(ctx.state)
    if keep_candidate is not None and keep_candidate != ctx.state.keep_candidate:
        ctx.record(RELEASE_STAGE, OPTIONS, {"keep_candidate": keep_candidate})
    with ctx.backends.ledger.acquire_lease(ctx.config.name, f"{ctx.actor}/pid-{os.getpid()}", ctx.release_id, LEASE_TTL_S):
        try:
            for name in STAGES[:-1]:
                ensure_stage(ctx, name)
        except BaseException:
            _teardown_quietly(ctx)
            finish(ctx, failed=True)
            raise
        ensure_stage(ctx, TEARDOWN)
        return finish(ctx, failed=False)


def _teardown_quietly(ctx: StageContext) -> None:
    """Remove the candidate after a failure without hiding the failure itself."""
    try:
        ensure_stage(ctx, TEARDOWN)
    except Exception as exc:
        ctx.say(f"teardown_candidate after failure also failed: {exc}")


def finish(ctx: StageContext, *, failed: bool) -> dict:
    """Record the release's final status (failed, promoted or rejected), sign the ledger's head where the backend
    keeps checkpoints, and return the release's summary."""
    status = "failed" if failed else _final_status(ctx.state)
    if ctx.state.status != status:
        ctx.record(RELEASE_STAGE, status, {})
    if ctx.backends.checkpoint is not None:
        signed = ctx.backends.checkpoint()
        ctx.say(f"ledger checkpoint: seq {signed.seq} signed by key {signed.key_id}")
    return release_summary(ctx.state)


def begin_orchestrated(config_path: str | Path, *, holder: str, overrides: tuple[str, ...] = (), actor: str | None = None,
                       progress: Progress = print_progress, session: Any = None) -> dict:
    """First step of an Airflow or Step Functions run: open the release and take the model's lease."""
    ctx = open_release(config_path, overrides=overrides, actor=actor, progress=progress, session=session)
    ctx.backends.ledger.acquire_lease(ctx.config.name, holder, ctx.release_id, LEASE_TTL_S)
    return {"release_id": ctx.release_id, "ledger_url": ctx.backends.ledger_url, "state_dir": str(ctx.backends.state_dir),
            "model": ctx.config.name, "status": ctx.state.status}


def run_orchestrated_stage(release_id: str, name: str, *, ledger_url: str | None = None, state_dir: str | Path | None = None,
                           actor: str | None = None, progress: Progress = print_progress, session: Any = None) -> dict:
    """One stage of an orchestrated run, from the ledger (what `shiplift stage` runs)."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, progress=progress, session=session)
    return ensure_stage(ctx, name)


def end_orchestrated(release_id: str, *, holder: str, failed: bool, ledger_url: str | None = None,
                     state_dir: str | Path | None = None, actor: str | None = None, progress: Progress = print_progress,
                     session: Any = None) -> dict:
    """Last step of an orchestrated run: final status, then give the model's lease back."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, progress=progress, session=session)
    summary = finish(ctx, failed=failed)
    ctx.backends.ledger.release_lease(ctx.config.name, holder)
    return summary


def _final_status(state: ReleaseState) -> str:
    """promoted, rolled_back (a bake alarm took the candidate back out of production) or rejected."""
    promote = state.stage("promote")
    if promote["status"] == "succeeded" and promote.get("event") in ("succeeded", "rolled_back"):
        return "promoted" if promote["event"] == "succeeded" else "rolled_back"
    return "rejected"


def release_summary(state: ReleaseState) -> dict:
    """A small JSON-able view of a release: ids, artifact, gate decision, serving status."""
    def get(stage_name: str, key: str, default: Any = None) -> Any:
        return state.stage(stage_name).get("result", {}).get(key, default)

    opened = state.opened or {}
    return {
        "release_id": state.release_id,
        "model": (opened.get("config") or {}).get("name"),
        "status": state.status,
        "artifact_sha256": get("package", "artifact_sha256"),
        "gguf_file_type": (get("build", "info") or {}).get("file_type"),
        "temperature": get("build", "temperature"),
        "image_uri": get("image", "image_uri"),
        "placement": get("deploy_candidate", "placement"),
        "decision": get("validate", "decision"),
        "not_passed": get("validate", "not_passed"),
        "metrics": get("validate", "metrics"),
        "report": get("validate", "report_html"),
        "rollout": {"strategy": get("promote", "strategy"), "steps": len(get("promote", "steps") or []),
                    "reason": get("promote", "reason")},
        "served_by": get("promote", "endpoint"),
        "component": get("promote", "component"),
        "stages": {name: state.stage(name)["status"] for name in STAGES},
    }
