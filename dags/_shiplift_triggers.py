"""The triggers of shiplift's deferrable tasks (not a DAG file: `.airflowignore` lists it).

A stage the policy table defers (`tasks.pipeline.table.Step.defers`: deploy_candidate) runs its start on a worker,
then defers to `StagePollTrigger` (a sweep's candidate: `CandidatePollTrigger`), which polls the stage from the
triggerer (`tasks.pipeline.deferred.poll_orchestrated` in a thread, every `every_s` seconds) until it is done or has
failed, so no worker slot is held while SageMaker brings an endpoint up; the task then resumes on a worker and records
the stage (as the Amazon provider's deferrable SageMakerEndpointOperator and its SageMakerTrigger do with
describe_endpoint).

The triggerer imports a trigger by its classpath, `_shiplift_triggers.StagePollTrigger`, from its own import path, and
Airflow 3 puts neither the DAG folder nor a DAG bundle there (only the config and plugins folders): the triggerer runs
with this folder on PYTHONPATH (scripts/airflow_local.py sets it; docs/airflow.md says so for a deployment). Workers
and `dag.test()` find it as they find `_shiplift_dags`, the bundle folder being on their path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent


class StagePollTrigger(BaseTrigger):
    """Polls one deferred stage of one release until it is done (event `done`) or failed (event `failed`, with the
    error's class, problem and fix; the poll has recorded it in the ledger). The stage's timeout is the poll's own
    check, from the stage's `started` record, so a deferral that outlives it ends as a failed event too."""

    def __init__(self, *, release_id: str, stage: str, holder: str, every_s: float, ledger_url: str | None = None,
                 state_dir: str | None = None):
        super().__init__()
        self.release_id, self.stage, self.holder, self.every_s = release_id, stage, holder, every_s
        self.ledger_url, self.state_dir = ledger_url, state_dir

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}",
                {"release_id": self.release_id, "stage": self.stage, "holder": self.holder, "every_s": self.every_s,
                 "ledger_url": self.ledger_url, "state_dir": self.state_dir})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        polls = 0
        while True:
            polls += 1
            try:
                polled = await asyncio.to_thread(self._poll)
            except Exception as exc:  # recorded in the ledger by the poll; the task raises it again on a worker
                yield TriggerEvent({"status": "failed", "polls": polls, "error_type": type(exc).__name__,
                                    "problem": getattr(exc, "problem", repr(exc)), "fix": getattr(exc, "fix", None)})
                return
            if polled["done"]:
                yield TriggerEvent({"status": "done", "polls": polls, "stage_status": polled["status"]})
                return
            await asyncio.sleep(self.every_s)

    def _poll(self) -> dict:
        """One `poll_orchestrated` (blocking: run in a thread, off the triggerer's event loop)."""
        from _shiplift_dags import aws_access  # the task's own connection access (imported there at runtime)

        from shiplift.tasks.pipeline.deferred import poll_orchestrated

        return poll_orchestrated(self.release_id, self.stage, holder=self.holder, ledger_url=self.ledger_url,
                                 state_dir=self.state_dir, actor=self.holder, progress=self.log.info,
                                 session=aws_access)


class CandidatePollTrigger(StagePollTrigger):
    """`StagePollTrigger` for a sweep candidate's deferred stage: a candidate holds its own lease, not the model's
    promotion lease, so each poll renews that one (`tasks.sweeps.orchestrated.poll_candidate_orchestrated`) and another
    run never takes the candidate over mid-deploy."""

    def __init__(self, *, sweep_path: str, candidate: str, **kwargs: Any):
        super().__init__(**kwargs)
        self.sweep_path, self.candidate = sweep_path, candidate

    def serialize(self) -> tuple[str, dict[str, Any]]:
        classpath, kwargs = super().serialize()
        return classpath, {**kwargs, "sweep_path": self.sweep_path, "candidate": self.candidate}

    def _poll(self) -> dict:
        """One `poll_candidate_orchestrated` (blocking: run in a thread, off the triggerer's event loop)."""
        from shiplift.tasks.sweeps.orchestrated import poll_candidate_orchestrated

        return poll_candidate_orchestrated(self.sweep_path, self.candidate, self.stage, actor=self.holder,
                                           ledger_url=self.ledger_url, state_dir=self.state_dir,
                                           progress=self.log.info)
