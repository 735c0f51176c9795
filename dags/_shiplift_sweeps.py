"""Wiring of shiplift's sweep DAGs, one per `configs/sweeps/*.yaml` (not a DAG file: `.airflowignore` lists it).

A sweep DAG opens the sweep (its rule's sha256 into the ledger before any candidate runs), evaluates the candidates
with dynamic task mapping (`evaluate` expanded over the names `open` returns), picks once all have evidence, and, when
the run's `release_pick` param is set, releases the pick. The work is in `shiplift.tasks.sweeps.orchestrated`; each
task calls into it, and each is idempotent (a retried candidate whose evidence is in the ledger returns it without
running). A candidate's `evaluate` is deferrable (`CandidateEvaluation`): its stages before the one the policy table
defers and that stage's start run on a worker, the task defers to `_shiplift_triggers.CandidatePollTrigger` while
SageMaker brings the endpoint up (no worker slot held; each poll renews the candidate's lease), and it resumes on a
worker for validate, teardown and the evidence. At most the sweep's `parallel` candidates run at once: the mapped task
runs in the Airflow pool `shiplift-sweep-<name>`, created with `parallel` slots and `include_deferred` true
(docs/airflow.md), so a candidate waiting for its endpoint keeps its pool slot (its endpoint costs while it waits) but
no worker slot, and `max_active_tis_per_dagrun` is `parallel`.
Parse time reads the sweep file and its base release config (the candidate task's timeout); nothing runs.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from _shiplift_dags import OWNER, RETRY_POLICY, SHORT_TIMEOUT, START_DATE, _holder, _params, _polled_error
from _shiplift_triggers import CandidatePollTrigger
from airflow.sdk import DAG, BaseOperator, Param, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from shiplift.tasks.pipeline.table import BACKOFF, MAX_STEP_TIMEOUT_S, STEPS

MAX_PARALLEL = 16  # = shiplift.tasks.sweeps.config.MAX_PARALLEL (not imported, so parsing stays light)

REPO_ROOT = Path(__file__).resolve().parents[1]
SWEEPS_DIR = REPO_ROOT / "configs" / "sweeps"


def sweep_dag_id(sweep_path: Path) -> str:
    """`sweep_<sweep file stem>` with hyphens as underscores: the DAG file's own name."""
    return "sweep_" + sweep_path.stem.replace("-", "_")


def sweep_settings(sweep_path: Path) -> dict[str, Any]:
    """What the DAG is built with, read as the refresh DAGs read theirs (the file's YAML, the base release config): the
    pool, its slots (`parallel`) and a candidate task's timeout, the longest `candidate_timeout_s` of the base on
    each placement the sweep names (only the placement of what a sweep varies changes a timeout; `open` checks the
    candidates themselves). A file that cannot be read gets one slot and the longest step
    timeout: the DAG still imports and `open` fails with the real error."""
    from shiplift.tasks.errors import ShipliftError
    from shiplift.tasks.sweeps.policy import airflow_pool, candidate_timeout_s

    settings = {"pool": airflow_pool(sweep_path.stem), "parallel": 1, "evaluate_s": MAX_STEP_TIMEOUT_S}
    try:
        tree = yaml.safe_load(sweep_path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return settings
    if not isinstance(tree, dict):
        return settings
    if isinstance(tree.get("name"), str):
        settings["pool"] = airflow_pool(tree["name"])
    if isinstance(tree.get("parallel"), int) and 1 <= tree["parallel"] <= MAX_PARALLEL:
        settings["parallel"] = tree["parallel"]
    axes, listed = tree.get("axes"), tree.get("candidates")
    placements = [*((axes or {}).get("placement") or [] if isinstance(axes, dict) else []),
                  *(c["placement"] for c in (listed if isinstance(listed, list) else [])
                    if isinstance(c, dict) and "placement" in c)]
    try:
        from shiplift.tasks.config import load_release_config

        base_path = (sweep_path.parent / str(tree.get("base"))).resolve()
        configs = [load_release_config(base_path)] + [
            load_release_config(base_path, overrides=(f"placement={json.dumps(p)}",)) for p in placements]
        settings["evaluate_s"] = min(MAX_STEP_TIMEOUT_S, max(candidate_timeout_s(c) for c in configs))
    except ShipliftError:
        pass
    return settings


class CandidateEvaluation(BaseOperator):
    """One candidate's evaluation whose wait for its endpoint holds no worker: `execute` runs the stages before the one
    the policy table defers and starts that one (`start_candidate_orchestrated`, under the candidate's lease by the
    run's name), then defers to `CandidatePollTrigger`; `execute_complete` runs the rest on a worker
    (`finish_candidate_orchestrated`: the deferred stage recorded, validate, teardown, the evidence; or, after a failed
    poll, the teardown and the failure). A candidate with evidence, or with nothing to wait for, never defers. The
    deferral is bounded by the task's `execution_timeout`; the poll enforces the stage's own timeout."""

    template_fields = ("candidate",)

    def __init__(self, *, sweep_path: str, candidate: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.sweep_path, self.candidate = sweep_path, candidate

    def execute(self, context: Any) -> Any:
        context["candidate"] = self.candidate  # the mapped task instance's label (map_index_template)
        from shiplift.tasks.sweeps.orchestrated import start_candidate_orchestrated

        started = start_candidate_orchestrated(self.sweep_path, self.candidate, actor=_holder())
        if "evaluated" in started:
            return started["evaluated"]
        if started["stage"] is None:
            return self._finish(None)
        self.defer(trigger=CandidatePollTrigger(sweep_path=self.sweep_path, candidate=self.candidate,
                                                release_id=started["release_id"], stage=started["stage"],
                                                holder=_holder(), every_s=STEPS[started["stage"]].defers.every_s,
                                                ledger_url=started["ledger_url"], state_dir=started["state_dir"]),
                   method_name="execute_complete", timeout=self.execution_timeout)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        context["candidate"] = self.candidate
        return self._finish(None if event["status"] == "done" else _polled_error(event))

    def _finish(self, failure: Exception | None) -> dict:
        from shiplift.tasks.sweeps.orchestrated import finish_candidate_orchestrated

        return finish_candidate_orchestrated(self.sweep_path, self.candidate, actor=_holder(), failure=failure)


def sweep_dag(sweep_file: str) -> DAG:
    """Build the sweep DAG of one sweep config: open, evaluate (mapped over the candidates, in the sweep's pool), pick,
    and release the pick when asked."""
    from shiplift.tasks.sweeps.policy import EVALUATE_RETRIES

    sweep_path = Path(sweep_file)
    sweep_path = (sweep_path if sweep_path.is_absolute() else SWEEPS_DIR / sweep_path).resolve()
    settings = sweep_settings(sweep_path)
    pool, parallel, evaluate_s = settings["pool"], settings["parallel"], settings["evaluate_s"]

    @dag(
        dag_id=sweep_dag_id(sweep_path),
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["shiplift", "sweep", sweep_path.stem],
        default_args={"owner": OWNER, "retries": 0, "execution_timeout": SHORT_TIMEOUT},
        params={"release_pick": Param(False, type="boolean",
                                      description="then release the pick (the base config with the pick's values, "
                                                  "gated on the base's own datasets), as `sweep run --release-pick`"),
                "fresh_champion": Param(False, type="boolean",
                                        description="with release_pick: the pick's gate scores the champion on every "
                                                    "task, as `sweep run --release-pick --fresh-champion`")},
        doc_md=f"Sweep `{sweep_path}` (docs/sweeps.md): `open` records the rule's sha256 before any candidate runs; "
               f"`evaluate` runs once per candidate (dynamic task mapping), at most {parallel} at once, in the pool "
               f"`{pool}`, which must exist before a run: `airflow pools set {pool} {parallel} \"shiplift sweep "
               f"{sweep_path.stem}\" --include-deferred` (or `POST /api/v2/pools` with name, slots, include_deferred "
               "true: a candidate waiting for its endpoint keeps its slot, its endpoint costing meanwhile, but holds "
               "no worker). A task in a pool that does not exist is never scheduled. Each candidate is torn down once "
               "its evidence is recorded; `pick` records the frontier and the pick once all have evidence; "
               "`release_pick` releases it when the run's param asks.",
    )
    def sweep():
        @task(task_id="open", retries=1, retry_delay=timedelta(seconds=BACKOFF.first_s), retry_policy=RETRY_POLICY,
              execution_timeout=SHORT_TIMEOUT)
        def open_sweep() -> list[str]:
            """Check the cost bound and that a candidate fits its task's timeout, then open the sweep (or find it
            open under the same rule); returns the candidates' names, which `evaluate` maps over."""
            from shiplift.tasks.sweeps.orchestrated import open_orchestrated

            return open_orchestrated(sweep_path, actor=_holder(), allowed_timeout_s=evaluate_s)["candidates"]

        @task(task_id="pick", retries=1, retry_delay=timedelta(seconds=BACKOFF.first_s), retry_policy=RETRY_POLICY,
              execution_timeout=SHORT_TIMEOUT)
        def pick() -> dict:
            """The frontier and the pick, from the recorded evidence by the recorded rule."""
            from shiplift.tasks.sweeps.orchestrated import pick_orchestrated

            summary = pick_orchestrated(sweep_path, actor=_holder())
            return {key: summary[key] for key in ("sweep_id", "rule_sha256", "picked", "frontier")}

        @task(task_id="release_pick", retries=0, execution_timeout=timedelta(seconds=MAX_STEP_TIMEOUT_S))
        def release_pick(picked: dict) -> dict:
            """The pick's own release, in one task as the CLI runs it (its stages retried inside; its gate on the
            held-out tasks, approval and rollout as the base says); skipped unless the run's `release_pick` param is
            set, or when nothing was picked."""
            if not _params()["release_pick"]:
                raise AirflowSkipException("release_pick is not set: release the pick with `shiplift release BASE "
                                           "--set …` (`shiplift sweep explain --json` lists its overrides)")
            if picked["picked"] is None:
                raise AirflowSkipException("no candidate met the rule: nothing to release")
            from shiplift.tasks.sweeps.orchestrated import release_pick_orchestrated

            return release_pick_orchestrated(sweep_path, actor=_holder(), fresh_champion=_params()["fresh_champion"])

        evaluated = CandidateEvaluation.partial(
            task_id="evaluate", sweep_path=str(sweep_path), pool=pool, pool_slots=1,
            max_active_tis_per_dagrun=parallel, retries=EVALUATE_RETRIES,
            retry_delay=timedelta(seconds=BACKOFF.first_s), retry_exponential_backoff=BACKOFF.factor,
            max_retry_delay=timedelta(seconds=BACKOFF.max_s), retry_policy=RETRY_POLICY,
            execution_timeout=timedelta(seconds=evaluate_s), map_index_template="{{ candidate }}",
            doc_md="One candidate through the gate on the sweep's tasks, torn down, its evidence recorded (or its "
                   "recorded evidence, on a retry); the wait for its endpoint is deferred (no worker held). The mapped "
                   "task instance is labelled with the candidate's name.",
        ).expand(candidate=open_sweep())
        picked = pick()
        evaluated >> picked
        release_pick(picked)

    return sweep()
