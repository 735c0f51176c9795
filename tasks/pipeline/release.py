"""The release as a resumable state machine whose state is the ledger (DESIGN §4).

`resolve → build → package → image → deploy_candidate → validate → promote →
teardown_candidate` (the stage table, `tasks.pipeline.table`). Opening a release appends a
`release/opened` record carrying the effective config; every stage appends `started` and then
`succeeded` (with its result), `skipped`, `kept` or `failed`; the end appends `release/<status>`.
So any worker that reaches the ledger (PostgreSQL in production: Celery workers on several hosts,
ECS tasks started by Step Functions) can run or resume any stage with no shared filesystem: files a
later stage needs go through the artifact store. The release id derives from the config alone
(`<name>-<config hash>`, where the hash leaves out where state and the ledger live), so the same
config never creates a second release and a rerun continues at the first stage not done.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shiplift.tasks.artifacts.packaging import FOLDER_ARCHIVE, package_model_dir, safe_extract
from shiplift.tasks.backends.interfaces import ReleaseFacts
from shiplift.tasks.backends.registry import default_state_dir, make_backends, open_ledger
from shiplift.tasks.config import ReleaseConfig, load_release_config, require_named_files
from shiplift.tasks.errors import ConfigError, LeaseLost, ShipliftError
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.leases import renewing
from shiplift.tasks.ledger.records import Opened, is_fleet_move, promotion, recorded
from shiplift.tasks.ledger.release_state import ReleaseState, release_summary
from shiplift.tasks.ledger.stage_results import RESULTS, KeptRef, PromoteResult, StageResult
from shiplift.tasks.pipeline import table
from shiplift.tasks.pipeline.stages.common import require_production_here
from shiplift.tasks.pipeline.table import TEARDOWN, check_timeouts, stage
from shiplift.tasks.processes import pid_running

if TYPE_CHECKING:  # the registry imports the backends' modules lazily; this is for checkers only
    from shiplift.tasks.backends.registry import Backends
    from shiplift.tasks.families.base import ModelFamily
    from shiplift.tasks.ledger.store import Lease

Progress = Callable[[str], None]


def print_progress(message: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def default_actor() -> str:
    return os.environ.get("SHIPLIFT_ACTOR") or f"{getpass.getuser()}@{socket.gethostname()}"


def release_id_for(config: ReleaseConfig) -> str:
    return f"{config.name}-{config.config_hash()[:12]}"


@dataclass
class StageContext:
    """Everything a stage function needs: typed config, backends, and earlier stage results."""

    config: ReleaseConfig
    config_dir: Path
    release_id: str
    state: ReleaseState
    backends: Backends
    actor: str
    progress: Progress = print_progress
    lease_holder: str | None = None  # the run holding the model's promotion lease, renewed while a stage runs
    lease_token: str | None = None  # that lease's token when this process holds it (`holding_lease`); None: by name
    # the `release/opened` payload of a release the ledger has not seen yet (`record_opened`)
    opening: dict | None = None
    family: ModelFamily | None = None  # what builds, packages and gates the model: the config's (a dry run stands in)
    work_dir: Path = field(init=False)

    def __post_init__(self) -> None:
        self.work_dir = self.backends.state_dir / "releases" / self.release_id
        self.family = self.family or self.config.family

    def result(self, name: str) -> StageResult:
        """An earlier stage's result, typed (`tasks.ledger.stage_results`); NotFound while it has not succeeded."""
        return self.state.result(name)

    def stage_dir(self, name: str) -> Path:
        """Scratch space of one stage on this worker (what later stages need goes to the artifact store)."""
        path = self.work_dir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def say(self, message: str) -> None:
        self.progress(f"{self.release_id} {message}")

    def keep_file(self, path: Path, name: str) -> KeptRef:
        """Put a file a later stage needs in the artifact store (no stage relies on another worker's disk)."""
        stored = self.backends.store.put_file(path, name=name, progress=self.say)
        return KeptRef(uri=stored.uri, sha256=stored.sha256, size=stored.size, kind="file")

    def keep_folder(self, folder: Path, *, main_file: str) -> KeptRef:
        """Put a flat folder in the artifact store as one deterministic, manifest-checked archive."""
        archive = package_model_dir(folder, self.stage_dir("keep") / folder.name, manifest={"kept_from": folder.name},
                                    model_file=main_file, archive_name=FOLDER_ARCHIVE)
        return self.keep_file(archive.path, FOLDER_ARCHIVE).model_copy(update={"kind": "folder"})

    def local_ref(self, ref: KeptRef) -> Path:
        """A kept file (sha256-verified, downloaded once when the store is remote) or folder (extracted once per
        archive sha256, safely, its manifest verified) on this worker."""
        path = self.backends.store.get(ref.uri)
        if ref.kind != "folder":
            return path
        target = self.backends.state_dir / "unpacked" / ref.sha256
        if not target.is_dir():
            safe_extract(path, target)
        return target

    def require_lease(self) -> None:
        """Renew this run's lease on the model now; LeaseLost when another run has it (called before production
        changes). A context without a lease holder (a stage run by hand, a test) has nothing to check."""
        if self.lease_holder is not None:
            self.backends.ledger.renew_lease(self.config.name, self.lease_holder, self.release_id, table.LEASE.ttl_s,
                                             token=self.lease_token)

    def record_opened(self) -> None:
        """Append the `release/opened` record (the effective config) of a release the ledger has not seen yet; a run
        calls it once it holds the model's lease, so a run refused for the lease appends nothing."""
        if self.opening is not None and self.state.opened is None:
            self.backends.ledger.append(release_id=self.release_id, model=self.config.name, stage=events.RELEASE,
                                        event=events.OPENED, actor=self.actor, payload=self.opening)
            self.state.refresh()
        self.opening = None

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

    def facts(self) -> ReleaseFacts:
        """The typed view of this release a backend's registry reads."""
        done = {name: self.state.stage(name) for name in ("package", "image", "validate")}
        result = {name: self.state.result(name) for name, entry in done.items() if entry["status"] == "succeeded"}
        report = result["validate"].evidence.get("gate-report.json") if "validate" in result else None
        return ReleaseFacts(release_id=self.release_id, config=self.config,
                            history=tuple(self.backends.ledger.history(self.config.name)),
                            artifact_uri=result["package"].artifact_uri if "package" in result else None,
                            image_uri=result["image"].image_uri if "image" in result else None,
                            gate_report=report.model_dump() if report else None)

    def sync_registry(self) -> None:
        """Bring the backend's registry view of this release in line with its ledger records (aws: the SageMaker
        Model Registry; nothing locally). The ledger is written first and stays the truth, so a failure here is
        reported, never raised; the next sync repairs the view: the release's next followed record, or reopening it
        (a rerun of `shiplift release CONFIG` or of the refresh DAG, also once the release has finished)."""
        if self.backends.registry is None:
            return
        try:
            view = self.backends.registry.sync(self.facts())
        except ShipliftError as exc:
            self.say("WARNING model registry not updated, the ledger is unaffected (rerun the release to repair the "
                     f"view): {exc}")
            return
        if view is not None:
            self.say(f"model registry: {view['model_package_arn']} {view['status']}"
                     + (" (updated)" if view["changed"] else ""))


def open_release(
    config_path: str | Path, *, overrides: tuple[str, ...] = (), actor: str | None = None,
    progress: Progress = print_progress,
    session: Any = None, orchestrator_timeouts: dict[str, int] | None = None, waits_for_approval: bool = True,
) -> StageContext:
    """Load the config, derive the release id and prepare the release (`prepare_release`: its `release/opened` record
    is appended once the run holds the model's lease, by `StageContext.record_opened`). Under an orchestrator
    (`orchestrator_timeouts`: what it was set up with per step, possibly none), a config whose deadlines do not fit is
    refused first, before anything is touched, as is one that requires an approval when the orchestrator cannot wait
    for a person (`waits_for_approval` False). Every file and package the config names is checked first of all
    (`require_named_files`): a release refused so writes no state dir, ledger record or checkpoint."""
    config = load_release_config(config_path, overrides=overrides)
    require_named_files(config, config_path)
    if orchestrator_timeouts is not None:
        check_timeouts(config, orchestrator_timeouts)
        if config.promotion.approval.required and not waits_for_approval:
            raise ConfigError(f"{config.name} requires an approval (promotion.approval.required), which this "
                              "orchestrated run cannot wait for", fix="run it with `shiplift release CONFIG`, which "
                              "waits for `shiplift approve`")
    return prepare_release(config, Path(config_path), make_backends(config, session=session),
                           actor=actor or default_actor(), progress=progress)


def prepare_release(config: ReleaseConfig, config_path: Path, backends: Backends, *, actor: str, progress: Progress,
                    family: ModelFamily | None = None) -> StageContext:
    """The stage context of a loaded config's release on `backends`, after their preflight check. A release the ledger
    has not seen carries its `release/opened` payload (the effective config) in `opening`, appended by `record_opened`
    once the run holds the lease; for one it has seen (a rerun), a registry view an earlier failure left behind is
    repaired. `family` stands in for the config's model family, as the dry run's does."""
    release_id = release_id_for(config)
    state = ReleaseState(backends.ledger, release_id)
    if state.opened is None:  # before it is opened: a changed layout moves first (promote checks a reopened one)
        require_production_here(backends.ledger, config, release_id)
    backends.preflight()
    path = config_path.resolve()
    opening = None if state.opened is not None else {
        "config_hash": config.config_hash(), "config": config.model_dump(mode="json"), "config_path": str(path),
        "config_dir": str(path.parent)}
    opened = Opened.model_validate(state.opened or opening)
    ctx = StageContext(config=config, config_dir=Path(opened.config_dir), release_id=release_id,
                       state=state, backends=backends, actor=actor, progress=progress, family=family, opening=opening)
    if opening is None:
        ctx.sync_registry()  # no call before the gate has decided, so a new release has nothing to sync
    return ctx


def open_loaded(config: ReleaseConfig, config_path: Path, backends: Backends, *, actor: str, progress: Progress,
                family: ModelFamily | None = None) -> StageContext:
    """`prepare_release`, its `release/opened` record appended at once: for a run that takes no lease (the dry run)."""
    ctx = prepare_release(config, config_path, backends, actor=actor, progress=progress, family=family)
    ctx.record_opened()
    return ctx


def moved_config(config: ReleaseConfig, moved_to: dict[str, Any]) -> ReleaseConfig:
    """`config` as a fleet move serves it (`moved_to`: the fleet's placement, copies and scale_to_zero), validated as a
    config is: what serves (artifact, image, environment) stays the release's own; where and how many are the
    fleet's."""
    rollout = {**config.rollout.model_dump(mode="json"), "copies": moved_to["copies"]}
    return ReleaseConfig.model_validate({**config.model_dump(mode="json"), "placement": moved_to["placement"],
                                         "rollout": rollout, "scale_to_zero": moved_to["scale_to_zero"]})


def latest_move(records: list) -> Any:
    """The release's newest fleet move (its succeeded promotion with trigger `move`), or None. A promotion or rollback
    to a moved release serves it where that move put it (`moved_config` of its `moved_to`, docs/fleet.md); the
    release's identity (id, config hash) stays the opened config's."""
    return next((r for r in reversed(records) if is_fleet_move(r) and promotion(r).moved_to), None)


def reopen_release(release_id: str, *, ledger_url: str | None = None, state_dir: str | Path | None = None,
                   actor: str | None = None, progress: Progress = print_progress, session: Any = None) -> StageContext:
    """Rebuild a release's context from the ledger alone (what `shiplift stage` and the DAG tasks run on)."""
    ledger = open_ledger(ledger_url=ledger_url, state_dir=state_dir)
    state = ReleaseState.load(ledger, release_id)
    opened = Opened.model_validate(state.opened)
    config = ReleaseConfig.model_validate(opened.config)
    if config.backend.kind == "aws":  # scratch and caches are this worker's own, not the opener's
        here = str(Path(state_dir).expanduser().resolve()) if state_dir else str(default_state_dir())
        config = config.model_copy(update={"backend": config.backend.model_copy(update={"state_dir": here})})
    backends = make_backends(config, ledger=ledger, session=session)
    return StageContext(config=config, config_dir=Path(opened.config_dir), release_id=release_id, state=state,
                        backends=backends, actor=actor or default_actor(), progress=progress)



def run_holder(actor: str) -> str:
    """The name a CLI run's lease is recorded under, for people: who, and its pid. Only recorded, never parsed: the
    lease itself records the run's host and pid and its token (`holding_lease`)."""
    return f"{actor}/pid-{os.getpid()}"


def stopped_holder(lease: Lease) -> str | None:
    """Why the run holding this release's lease has stopped, or None while it may still run, from what the lease
    records of its process (never from the holder's name or actor): its process on this host is gone, or it has not
    renewed the lease for three renewal periods (a live run renews it while every stage runs). An orchestrator's lease
    (no pid) is renewed only while one of its steps runs, so only its expiry frees it."""
    if lease.pid is None:
        return None
    if lease.host == socket.gethostname() and not pid_running(lease.pid):
        return f"its process {lease.pid} on {lease.host} is gone"
    silent_s = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(lease.renewed_at)).total_seconds()
    if silent_s > 3 * table.LEASE.renew_every_s:
        return (f"its process {lease.pid} on {lease.host} last renewed the lease {silent_s / 60:.0f} min ago (a live "
                f"run renews it every {table.LEASE.renew_every_s / 60:.0f} min)")
    return None


@contextlib.contextmanager
def holding_lease(ctx: StageContext, holder: str) -> Iterator[None]:
    """Take the model's promotion lease for this process, recorded under the name `holder` (LeaseHeld names another
    run that has it; a stopped run of this same release is taken over, and the takeover recorded); the stages run
    inside renew it with its token and promote requires it. Leaving gives it back."""
    lease = ctx.backends.ledger.acquire_lease(ctx.config.name, holder, ctx.release_id, table.LEASE.ttl_s,
                                              stopped=stopped_holder, by_this_process=True)
    with lease:
        ctx.lease_holder, ctx.lease_token = holder, lease.token
        try:
            if lease.taken_over is not None:
                ctx.record_opened()  # a run that died between its lease and its opening: the release opens first
                previous, why = lease.taken_over
                ctx.say(f"took the promotion lease over from {previous!r}, an earlier run of this release: {why}; "
                        "continuing")
                ctx.record(events.RELEASE, events.LEASE_TAKEN_OVER,
                           {"from_holder": previous, "reason": why, "holder": holder})
            yield
        finally:
            ctx.lease_holder, ctx.lease_token = None, None


@contextlib.contextmanager
def lease_kept(ctx: StageContext, *, required: bool) -> Iterator[None]:
    """Renew the run's lease every `LEASE.renew_every_s` while one stage runs, so a stage longer than the lease's TTL
    never lets a second run take the model. Entering renews at once: a run that lost its lease stops before the stage
    (except teardown, which removes only this release's own candidate and must run whatever happened)."""
    try:
        ctx.require_lease()
    except LeaseLost as exc:
        if required:
            raise
        ctx.say(f"WARNING {exc}; tearing down this release's own candidate anyway")
        yield
        return
    with renewing(ctx.require_lease, every_s=table.LEASE.renew_every_s, say=ctx.say, name=f"lease-{ctx.release_id}"):
        yield


def run_stage(ctx: StageContext, name: str, *, function: Callable[[StageContext], StageResult | dict] | None = None,
              extra: dict | None = None) -> StageResult:
    """Run one stage (or `function` in its place, as promotion and rollback do), recording its start
    and its end (result or error) in the ledger; `extra` goes into every record (reason, trigger)."""
    function = function or stage(name).load()
    extra = extra or {}
    ctx.say(f"{name}: started")
    ctx.record(name, events.STARTED, extra)
    began = time.monotonic()
    with failure_recorded(ctx, name, extra), lease_kept(ctx, required=name != TEARDOWN):
        result = function(ctx)
    seconds = round(time.monotonic() - began, 3)
    result = result if isinstance(result, StageResult) else RESULTS[name].model_validate(result)
    ctx.record(name, result.event, {**extra, **result.record(), "seconds": seconds})
    ctx.say(f"{name}: {result.event} in {seconds:.1f}s")
    return result


@contextlib.contextmanager
def failure_recorded(ctx: StageContext, name: str, extra: dict | None = None) -> Iterator[None]:
    """Record the stage `failed` with the error that leaves the block (and `extra`), then re-raise it."""
    try:
        yield
    except Exception as exc:
        error = str(exc) if isinstance(exc, ShipliftError) else repr(exc)
        ctx.record(name, events.FAILED, {**(extra or {}), "error": error, "error_type": type(exc).__name__})
        raise


def ensure_stage(ctx: StageContext, name: str) -> StageResult:
    """Run a stage unless it already succeeded; teardown always runs (it is idempotent).

    This is what makes a retried Airflow task or Step Functions state continue instead of
    duplicating work: a stage that finished before the crash returns its recorded result.
    """
    entry = ctx.state.stage(name)
    if entry["status"] == "succeeded" and name != TEARDOWN:
        return ctx.state.result(name)
    return run_stage(ctx, name)


def ensure_stage_retrying(ctx: StageContext, name: str) -> StageResult:
    """`ensure_stage` under the table's policy, as the CLI applies it (`table.attempts`): each attempt under the
    stage's timeout for this config, a failure whose error says `retryable` retried with the table's backoff."""
    return in_policy(ctx, name, lambda: ensure_stage(ctx, name))


def in_policy(ctx: StageContext, name: str, run: Callable[[], Any]) -> Any:
    """`run` as the CLI runs the table's step `name` of this release: retries, backoff and per-attempt timeout."""
    return table.attempts(name, run, timeout_s=table.timeout_for(name, ctx.config), say=ctx.say)


def run_release(
    config_path: str | Path,
    *,
    overrides: tuple[str, ...] = (),
    keep_candidate: bool | None = None,
    fresh_champion: bool = False,
    actor: str | None = None,
    progress: Progress = print_progress,
    session: Any = None,
) -> dict:
    """Run (or resume) every stage of a release under the model's promotion lease (`begin`, the stages, `end` each
    under the table's policy); `fresh_champion`: its gate scores the champion on every task, reusing no recorded
    results (`validation.champion_reuse`)."""
    ctx = table.attempts("begin", lambda: open_release(config_path, overrides=overrides, actor=actor, progress=progress,
                                                       session=session), timeout_s=table.BEGIN.timeout_s, say=progress)
    if ctx.state.status in events.FINISHED:
        ctx.say(f"already {ctx.state.status}; nothing to do")
        return release_summary(ctx.state)
    return run_stages(ctx, keep_candidate=keep_candidate, fresh_champion=fresh_champion)


def run_stages(ctx: StageContext, *, keep_candidate: bool | None = None, fresh_champion: bool = False) -> dict:
    """Every stage not done yet, under the model's promotion lease, taken before anything is appended (the
    `release/opened` record of a new release, a changed `keep_candidate`, a first ask for a fresh champion); a step
    whose `waits` (the table's: promote's approval) holds the release stops it there until a person decides, the lease
    given back."""
    with holding_lease(ctx, run_holder(ctx.actor)):
        ctx.record_opened()
        asked = {}
        if keep_candidate is not None and keep_candidate != ctx.state.keep_candidate:
            asked["keep_candidate"] = keep_candidate
        if fresh_champion and not ctx.state.fresh_champion:
            asked["fresh_champion"] = True
        if asked:
            ctx.record(events.RELEASE, events.OPTIONS, asked)
        try:
            for step in table.STAGES[:-1]:
                if step.waits is not None and in_policy(ctx, table.APPROVAL_REQUEST.name,
                                                        lambda step=step: step.load(step.waits)(ctx)):
                    return release_summary(ctx.state)
                ensure_stage_retrying(ctx, step.name)
        except BaseException:
            _teardown_quietly(ctx)
            in_policy(ctx, table.END.name, lambda: finish(ctx, failed=True))
            raise
        ensure_stage_retrying(ctx, TEARDOWN)
        return in_policy(ctx, table.END.name, lambda: finish(ctx, failed=False))


def _teardown_quietly(ctx: StageContext) -> None:
    """Remove the candidate after a failure without hiding the failure itself."""
    try:
        ensure_stage_retrying(ctx, TEARDOWN)
    except Exception as exc:
        ctx.say(f"teardown_candidate after failure also failed: {exc}")


def finish(ctx: StageContext, *, failed: bool) -> dict:
    """Record the release's final status (failed, promoted or rejected), sign the ledger's head where the backend
    keeps checkpoints, and return the release's summary."""
    status = events.FAILED if failed else _final_status(ctx.state)
    if ctx.state.status != status:
        promoted = recorded(ctx.state, PromoteResult) if status == events.REJECTED else None
        reason = promoted.reason if promoted else None
        ctx.record(events.RELEASE, status, {"reason": reason} if reason else {})
    if ctx.backends.checkpoint is not None:
        signed = ctx.backends.checkpoint()
        ctx.say(f"ledger checkpoint: seq {signed.seq} signed by key {signed.key_id}")
    return release_summary(ctx.state)


def begin_orchestrated(config_path: str | Path, *, holder: str, allowed_timeouts: dict[str, int] | None = None,
                       overrides: tuple[str, ...] = (), actor: str | None = None, progress: Progress = print_progress,
                       session: Any = None, waits_for_approval: bool = False) -> dict:
    """First step of an Airflow or Step Functions run: check that the config's deadlines fit the timeouts the
    orchestrator was set up with (`allowed_timeouts`, per step), take the model's lease and open the release (a run
    refused for the lease appends nothing)."""
    ctx = open_release(config_path, overrides=overrides, actor=actor, progress=progress, session=session,
                       orchestrator_timeouts=allowed_timeouts or {}, waits_for_approval=waits_for_approval)
    ctx.backends.ledger.acquire_lease(ctx.config.name, holder, ctx.release_id, table.LEASE.ttl_s)
    ctx.record_opened()
    return {"release_id": ctx.release_id, "ledger_url": ctx.backends.ledger_url,
            "state_dir": str(ctx.backends.state_dir),
            "model": ctx.config.name, "status": ctx.state.status}


def run_orchestrated_stage(release_id: str, name: str, *, holder: str | None = None, ledger_url: str | None = None,
                           state_dir: str | Path | None = None, actor: str | None = None,
                           progress: Progress = print_progress,
                           session: Any = None) -> dict:
    """One stage of an orchestrated run, from the ledger (what `shiplift stage` runs); `holder` is the run whose lease
    the stage renews and promote requires. The orchestrator retries it, so one attempt runs here. Returns the result as
    the JSON the ledger keeps (what XCom and `shiplift stage` carry)."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, progress=progress,
                         session=session)
    ctx.lease_holder = holder
    return ensure_stage(ctx, name).record()


def end_orchestrated(release_id: str, *, holder: str, failed: bool, ledger_url: str | None = None,
                     state_dir: str | Path | None = None, actor: str | None = None, progress: Progress = print_progress,
                     session: Any = None) -> dict:
    """Last step of an orchestrated run: final status, then give the model's lease back."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, progress=progress,
                         session=session)
    summary = finish(ctx, failed=failed)
    ctx.backends.ledger.release_lease(ctx.config.name, holder)
    return summary


def _final_status(state: ReleaseState) -> str:
    """promoted, rolled_back (a bake alarm took the candidate back out of production) or rejected."""
    promote = state.stage(events.PROMOTE)
    if promote["status"] == "succeeded" and promote.get("event") in (events.SUCCEEDED, events.ROLLED_BACK):
        return events.PROMOTED if promote["event"] == events.SUCCEEDED else events.ROLLED_BACK
    return events.REJECTED
