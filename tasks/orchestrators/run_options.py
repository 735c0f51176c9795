"""A run's options for its release's gate, recorded in the ledger (`release/options`) as `shiplift release` records its
flags (`tasks.pipeline.release.run_stages`), for the runs that open a release another way: an Airflow refresh run
(its `fresh_champion` param) and the aws dry run (`--fresh-champion`, into its scratch ledger)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shiplift.tasks.ledger import events
from shiplift.tasks.pipeline.release import StageContext, begin_orchestrated, reopen_release


def ask_fresh_champion(ctx: StageContext) -> None:
    """Record that this release's gate scores its champion on every task (`release/options` fresh_champion), unless a
    run of it asked already; validate reads it (`ReleaseState.fresh_champion`), so a resumed run keeps it."""
    if not ctx.state.fresh_champion:
        ctx.record(events.RELEASE, events.OPTIONS, {"fresh_champion": True})


def begin_with_options(config_path: str | Path, *, holder: str, fresh_champion: bool = False, actor: str | None = None,
                       session: Any = None, **begin: Any) -> dict:
    """`begin_orchestrated` (the config checked, the model's lease taken for `holder`, the release opened), then, under
    that lease, the run's `fresh_champion` recorded (`ask_fresh_champion`): what a refresh DAG run's begin task runs."""
    begun = begin_orchestrated(config_path, holder=holder, actor=actor, session=session, **begin)
    if fresh_champion:
        ask_fresh_champion(reopen_release(begun["release_id"], ledger_url=begun["ledger_url"],
                                          state_dir=begun["state_dir"], actor=actor, session=session))
    return begun
