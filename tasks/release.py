"""The release as a resumable state machine (DESIGN §4).

`resolve → build → package → image → deploy_candidate → validate → promote →
teardown_candidate`. Each stage's result is persisted under
`<state_dir>/releases/<release_id>/state.json` and every start/end is appended to the ledger,
so a rerun after a crash continues at the first stage that has not succeeded. The release id
derives from the effective config, so the same config never creates a second release.
"""

from __future__ import annotations

import datetime as dt
import getpass
import json
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tasks.atomic import write_json_atomic
from tasks.config import ReleaseConfig, load_release_config
from tasks.errors import BadInput, ConfigError, NotFound, ShipliftError

STAGES = (
    "resolve",
    "build",
    "package",
    "image",
    "deploy_candidate",
    "validate",
    "promote",
    "teardown_candidate",
)
LEASE_TTL_S = 4 * 3600
Progress = Callable[[str], None]


def print_progress(message: str) -> None:
    stamp = dt.datetime.now().strftime("%H:%M:%S")
    print(f"[{stamp}] {message}", file=sys.stderr, flush=True)


def default_actor() -> str:
    return os.environ.get("SHIPLIFT_ACTOR") or f"{getpass.getuser()}@{socket.gethostname()}"


def release_id_for(config: ReleaseConfig) -> str:
    return f"{config.name}-{config.config_hash()[:12]}"


@dataclass
class ReleaseState:
    """What a release has done so far; the only thing a resumed run needs."""

    path: Path
    data: dict

    @classmethod
    def load_or_create(cls, path: Path, seed: dict) -> "ReleaseState":
        if path.is_file():
            return cls(path, json.loads(path.read_text(encoding="utf-8")))
        state = cls(path, {**seed, "status": "created", "stages": {}})
        state.save()
        return state

    @classmethod
    def load(cls, state_dir: Path, release_id: str) -> "ReleaseState":
        path = state_dir / "releases" / release_id / "state.json"
        if not path.is_file():
            raise NotFound(f"release {release_id!r} has no state under {state_dir}", fix="run `shiplift release CONFIG` first")
        return cls(path, json.loads(path.read_text(encoding="utf-8")))

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    def stage(self, name: str) -> dict:
        return self.data["stages"].get(name, {})

    def result(self, name: str) -> dict:
        entry = self.stage(name)
        if entry.get("status") != "succeeded":
            raise NotFound(f"stage {name!r} of {self.data['release_id']} has not succeeded", fix=f"run stage {name} first")
        return entry["result"]

    def mark(self, name: str, status: str, **fields: Any) -> None:
        entry = dict(self.stage(name))
        entry.update(status=status, updated_at=time.time(), **fields)
        self.data["stages"][name] = entry
        self.save()


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
        self.work_dir = self.state.path.parent

    def result(self, stage: str) -> dict:
        return self.state.result(stage)

    def stage_dir(self, stage: str) -> Path:
        path = self.work_dir / stage
        path.mkdir(parents=True, exist_ok=True)
        return path

    def say(self, message: str) -> None:
        self.progress(f"{self.release_id} {message}")


def stage_functions() -> dict[str, Callable[[StageContext], dict]]:
    from tasks.stages import build, candidate, image, package, promote, resolve, validate

    return {
        "resolve": resolve.run,
        "build": build.run,
        "package": package.run,
        "image": image.run,
        "deploy_candidate": candidate.deploy,
        "validate": validate.run,
        "promote": promote.run,
        "teardown_candidate": candidate.teardown,
    }


def state_dir_for(config: ReleaseConfig) -> Path:
    return Path(config.backend.state_dir).expanduser().resolve()


def open_release(
    config_path: str | Path, *, overrides: tuple[str, ...] = (), actor: str | None = None, progress: Progress = print_progress
) -> StageContext:
    """Load the config, derive the release id and open (or create) its persisted state."""
    config = load_release_config(config_path, overrides=overrides)
    if config.rollout.strategy != "all_at_once":
        raise ConfigError(
            f"rollout.strategy {config.rollout.strategy!r} is not available in this version",
            fix="use rollout.strategy: all_at_once",
        )
    release_id = release_id_for(config)
    state_dir = state_dir_for(config)
    seed = {
        "release_id": release_id,
        "model": config.name,
        "config_path": str(Path(config_path).resolve()),
        "config_dir": str(Path(config_path).resolve().parent),
        "config_hash": config.config_hash(),
        "config": config.model_dump(mode="json"),
        "created_at": time.time(),
    }
    state = ReleaseState.load_or_create(state_dir / "releases" / release_id / "state.json", seed)
    return _context(config, state, actor, progress)


def _context(config: ReleaseConfig, state: ReleaseState, actor: str | None, progress: Progress) -> StageContext:
    from tasks.backends import make_backends

    return StageContext(
        config=config,
        config_dir=Path(state.data["config_dir"]),
        release_id=state.data["release_id"],
        state=state,
        backends=make_backends(config),
        actor=actor or default_actor(),
        progress=progress,
    )


def reopen_release(state_dir: str | Path, release_id: str, *, actor: str | None = None, progress: Progress = print_progress) -> StageContext:
    """Rebuild a release's context from its persisted state (what `shiplift stage` runs on)."""
    state = ReleaseState.load(Path(state_dir).expanduser().resolve(), release_id)
    return _context(ReleaseConfig.model_validate(state.data["config"]), state, actor, progress)


def ledger_base(ctx: StageContext) -> dict:
    return {"config_hash": ctx.config.config_hash(), "release_id": ctx.release_id}


def run_stage(ctx: StageContext, name: str) -> dict:
    """Run one stage, recording start and end in the ledger and the release state."""
    if name not in STAGES:
        raise BadInput(f"unknown stage {name!r}", fix=f"use one of {', '.join(STAGES)}")
    ledger = ctx.backends.ledger
    ctx.say(f"{name}: started")
    ctx.state.mark(name, "started", started_at=time.time())
    ledger.append(release_id=ctx.release_id, model=ctx.config.name, stage=name, event="started", payload=ledger_base(ctx), actor=ctx.actor)
    began = time.monotonic()
    try:
        result = stage_functions()[name](ctx)
    except Exception as exc:
        error = str(exc) if isinstance(exc, ShipliftError) else repr(exc)
        ctx.state.mark(name, "failed", error=error, error_type=type(exc).__name__)
        ledger.append(
            release_id=ctx.release_id, model=ctx.config.name, stage=name, event="failed",
            payload={**ledger_base(ctx), "error": error, "error_type": type(exc).__name__}, actor=ctx.actor,
        )
        raise
    seconds = round(time.monotonic() - began, 3)
    event = result.get("event", "succeeded")
    ctx.state.mark(name, "succeeded", result=result, seconds=seconds)
    ledger.append(
        release_id=ctx.release_id, model=ctx.config.name, stage=name, event=event,
        payload={**ledger_base(ctx), **result, "seconds": seconds}, actor=ctx.actor,
    )
    ctx.say(f"{name}: {event} in {seconds:.1f}s")
    return result


FINISHED = ("promoted", "rejected")


def ensure_stage(ctx: StageContext, name: str) -> dict:
    """Run a stage unless it already succeeded; teardown always runs (it is idempotent).

    This is what makes a retried Airflow task or Step Functions state continue instead of
    duplicating work: a stage that finished before the crash returns its recorded result.
    """
    entry = ctx.state.stage(name)
    if entry.get("status") == "succeeded" and name != "teardown_candidate":
        return entry["result"]
    return run_stage(ctx, name)


def run_release(
    config_path: str | Path,
    *,
    overrides: tuple[str, ...] = (),
    keep_candidate: bool | None = None,
    actor: str | None = None,
    progress: Progress = print_progress,
) -> dict:
    """Run (or resume) every stage of a release under the model's promotion lease."""
    ctx = open_release(config_path, overrides=overrides, actor=actor, progress=progress)
    if ctx.state.data.get("status") in FINISHED:
        ctx.say(f"already {ctx.state.data['status']}; nothing to do")
        return release_summary(ctx.state)
    if keep_candidate is not None:
        ctx.state.data["keep_candidate"] = keep_candidate
        ctx.state.save()
    ledger = ctx.backends.ledger
    with ledger.acquire_lease(ctx.config.name, f"{ctx.actor}/pid-{os.getpid()}", ctx.release_id, LEASE_TTL_S):
        try:
            for name in STAGES[:-1]:
                ensure_stage(ctx, name)
        except BaseException:
            finish(ctx, failed=True)
            _teardown_quietly(ctx)
            raise
        ensure_stage(ctx, "teardown_candidate")
        return finish(ctx, failed=False)


def _teardown_quietly(ctx: StageContext) -> None:
    """Remove the candidate after a failure without hiding the failure itself."""
    try:
        ensure_stage(ctx, "teardown_candidate")
    except Exception as exc:
        ctx.say(f"teardown_candidate after failure also failed: {exc}")


def finish(ctx: StageContext, *, failed: bool) -> dict:
    """Record the release's final status (failed, promoted or rejected) and return its summary."""
    ctx.state.data["status"] = "failed" if failed else _final_status(ctx.state)
    ctx.state.save()
    return release_summary(ctx.state)


def begin_orchestrated(config_path: str | Path, *, holder: str, overrides: tuple[str, ...] = (), actor: str | None = None,
                       progress: Progress = print_progress) -> dict:
    """First step of an Airflow or Step Functions run: open the release and take the model's lease."""
    ctx = open_release(config_path, overrides=overrides, actor=actor, progress=progress)
    ctx.backends.ledger.acquire_lease(ctx.config.name, holder, ctx.release_id, LEASE_TTL_S)
    return {"release_id": ctx.release_id, "state_dir": str(ctx.backends.state_dir), "model": ctx.config.name,
            "status": ctx.state.data.get("status")}


def run_orchestrated_stage(state_dir: str | Path, release_id: str, name: str, *, actor: str | None = None,
                           progress: Progress = print_progress) -> dict:
    """One stage of an orchestrated run, from persisted state (what `shiplift stage` runs)."""
    return ensure_stage(reopen_release(state_dir, release_id, actor=actor, progress=progress), name)


def end_orchestrated(state_dir: str | Path, release_id: str, *, holder: str, failed: bool, actor: str | None = None,
                     progress: Progress = print_progress) -> dict:
    """Last step of an orchestrated run: final status, then give the model's lease back."""
    ctx = reopen_release(state_dir, release_id, actor=actor, progress=progress)
    summary = finish(ctx, failed=failed)
    ctx.backends.ledger.release_lease(ctx.config.name, holder)
    return summary


def _final_status(state: ReleaseState) -> str:
    promote = state.stage("promote").get("result", {})
    return "promoted" if promote.get("event") == "succeeded" else "rejected"


def release_summary(state: ReleaseState) -> dict:
    """A small JSON-able view of a release: ids, artifact, gate decision, serving status."""
    stages = state.data["stages"]
    get = lambda stage, key, default=None: stages.get(stage, {}).get("result", {}).get(key, default)  # noqa: E731
    return {
        "release_id": state.data["release_id"],
        "model": state.data["model"],
        "status": state.data.get("status"),
        "artifact_sha256": get("package", "artifact_sha256"),
        "gguf_file_type": (get("build", "info") or {}).get("file_type"),
        "temperature": get("build", "temperature"),
        "image_uri": get("image", "image_uri"),
        "decision": get("validate", "decision"),
        "not_passed": get("validate", "not_passed"),
        "metrics": get("validate", "metrics"),
        "report": get("validate", "report_html"),
        "served_by": get("promote", "endpoint"),
        "stages": {name: stages.get(name, {}).get("status", "pending") for name in STAGES},
    }
