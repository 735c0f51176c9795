"""Shared wiring for shiplift's DAGs (not a DAG file: `.airflowignore` lists it).

Parse time does no work: the refresh factory reads one YAML key (the schedule) and builds the
task graph; configs are validated, the database and the model servers are touched only when a
task runs. Every task is a thin call into `tasks/` (DESIGN §1, §11); XCom carries only the small
JSON those calls return.

Retries and timeouts come from the one stage table (`tasks.pipeline.table`), which the CLI and
the Step Functions renderer read too. Every retried task returns a finished stage's recorded
result (`ensure_stage`), so a retry never duplicates work; only errors whose `retryable` is true
(`tasks.errors.is_retryable`) are retried, every other failure (bad config, integrity, conflict,
held or lost lease, failed gate, a bug) fails at once. Each task's `execution_timeout` is the
stage's `timeout_for` the config, read when the DAG file is parsed; `begin` refuses a run whose
overrides need longer.

Tasks find their release in the ledger (`begin` returns its id, the configured ledger URL and the
state dir), so any worker that reaches the ledger runs any stage. For an aws release each task
body takes its boto3 session from the `aws_default` connection
(`AwsBaseHook(aws_conn_id="aws_default").get_session()`, plus the connection's `endpoint_url`)
and passes it into `tasks`, which never import Airflow.

Waits hold no worker: a stage the policy table defers (`Step.defers`: deploy_candidate) is a `DeferredStage`, which
starts the work, defers to `_shiplift_triggers.StagePollTrigger` while the triggerer polls it, and records the stage
once the poll says it is in service (docs/airflow.md, "Waits that hold no worker").

Approval (`promotion.approval.required`, docs/approval.md): a refresh DAG whose config requires one, and the
promote DAG, wait between validate and promote with Airflow 3's `ApprovalOperator`: `approval_request` records the
request in the ledger (and skips the wait when nobody needs asking), `approval` shows the gate summary and parks in
`awaiting_input` (no worker held) until a person answers in the UI / HITL API or the deadline passes, and
`approval_decision` writes the answer Airflow recorded (its user, the `comment`) to the ledger through
`tasks.pipeline.approval.decide`, which refuses what it must.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pendulum
import yaml
from _shiplift_triggers import StagePollTrigger
from airflow.providers.common.compat.sdk import conf
from airflow.providers.standard.operators.hitl import ApprovalOperator, HITLOperator
from airflow.sdk import DAG, BaseOperator, Param, chain, dag, get_current_context, task
from airflow.sdk.definitions.retry_policy import RetryDecision, RetryPolicy
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from shiplift.tasks.errors import error_classes, is_retryable
from shiplift.tasks.ledger.events import FINISHED
from shiplift.tasks.pipeline.table import (
    APPROVAL,
    APPROVAL_DECISION,
    APPROVAL_REQUEST,
    AUDIT,
    BACKOFF,
    BEGIN,
    END,
    PROMOTE_RELEASE,
    ROLLBACK,
    STAGE_NAMES,
    STEPS,
    TEARDOWN,
)

MAX_APPROVAL_WAIT = timedelta(days=30)  # = tasks.config.ApprovalConfig's bound on timeout_s

REPO_ROOT = Path(__file__).resolve().parents[1]
RELEASES_DIR = REPO_ROOT / "configs" / "releases"
OWNER = "ml-platform"
START_DATE = pendulum.datetime(2026, 1, 1, tz="UTC")
# = tasks.pipeline.promotion.RELEASE_ID_PATTERN (a test keeps them equal); not imported, so parsing stays light.
RELEASE_ID_PATTERN = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?-[0-9a-f]{12}$"
OVERRIDE_PATTERN = r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*=.*$"



class RetryableErrors(RetryPolicy):
    """Retry exactly the errors whose `retryable` is true, as the CLI and Step Functions do; fail any other at once."""

    def evaluate(self, exception: BaseException, try_number: int, max_tries: int, context: Any = None) -> RetryDecision:
        name = type(exception).__name__
        if is_retryable(exception):
            return RetryDecision.retry(reason=f"{name} is retryable")
        return RetryDecision.fail(reason=f"{name} is not retryable: running the step again cannot help")

    def serialize(self) -> dict[str, Any]:
        return {"__type": type(self).__name__}


RETRY_POLICY = RetryableErrors()
AWS_CONN_ID = "aws_default"
SHORT_TIMEOUT = timedelta(minutes=5)


def config_schedule(config_path: Path) -> str | None:
    """The raw `schedule` of a release config (following `extends`), or None; never raises.

    A config that cannot be read gets no schedule: the DAG still imports and its begin task
    fails with the config's real error.
    """
    seen: set[Path] = set()
    path = config_path
    try:
        while path not in seen:
            seen.add(path)
            tree = yaml.safe_load(path.read_text(encoding="utf-8"))
            if not isinstance(tree, dict):
                return None
            if "schedule" in tree or not isinstance(tree.get("extends"), str):
                schedule = tree.get("schedule")
                return schedule if isinstance(schedule, str) and schedule.strip() else None
            path = (path.parent / tree["extends"]).resolve()
    except (OSError, yaml.YAMLError):
        return None
    return None


def dag_id_for(config_path: Path) -> str:
    """`refresh_<config file stem>` with hyphens as underscores: the DAG file's own name."""
    return "refresh_" + config_path.stem.replace("-", "_")


def _holder() -> str:
    context = get_current_context()
    return f"airflow:{context['dag'].dag_id}/{context['run_id']}"


def _opener() -> str:
    """Who opens the release: the Airflow user who triggered this run (whom four eyes keep from approving it), else
    (a scheduled run) the run itself."""
    return getattr(get_current_context()["dag_run"], "triggering_user_name", None) or _holder()


def _params() -> dict[str, Any]:
    """This run's validated params; conf keys that are not params are refused (a typo would be ignored)."""
    context = get_current_context()
    declared = set(context["dag"].params)
    unknown = sorted(set(context["dag_run"].conf or {}) - declared)
    if unknown:
        raise AirflowFailException(f"unknown params {unknown}; this DAG takes {sorted(declared)}")
    return {name: context["params"][name] for name in declared}


def _failed_tasks() -> list[str]:
    """Task ids of this run that failed (or could not run because an upstream failed)."""
    context = get_current_context()
    states = context["ti"].get_task_states(dag_id=context["dag"].dag_id, run_ids=[context["run_id"]])
    return sorted(tid for tid, state in states.get(context["run_id"], {}).items()
                  if state in ("failed", "upstream_failed"))


def aws_access():
    """The boto3 session (and endpoint override) of the `aws_default` connection; the aws backend calls
    this on its first AWS request, so local releases never read the connection."""
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    from shiplift.tasks.backends.aws.session import AwsAccess

    hook = AwsBaseHook(aws_conn_id=AWS_CONN_ID, client_type="sts")
    return AwsAccess(session=hook.get_session(), endpoint_url=hook.conn_config.endpoint_url)


def config_timeouts(config_path: Path) -> dict[str, int]:
    """Each step's `timeout_for` the release config; the table's own timeouts when the config cannot be loaded (then
    begin fails with the config's real error)."""
    from shiplift.tasks.errors import ShipliftError

    try:
        from shiplift.tasks.config import load_release_config
        from shiplift.tasks.pipeline.table import timeouts_for

        return timeouts_for(load_release_config(config_path))
    except ShipliftError:
        return {name: step.timeout_s for name, step in STEPS.items()}


def _retry_args(name: str, timeout_s: int) -> dict[str, Any]:
    """A task's retries, backoff, retry policy and timeout, from the policy table (`timeout_s`: the step's
    `timeout_for` the config, or the table's own where the config is not known when the DAG is parsed)."""
    return {"retries": STEPS[name].retries, "retry_delay": timedelta(seconds=BACKOFF.first_s),
            "retry_exponential_backoff": BACKOFF.factor, "max_retry_delay": timedelta(seconds=BACKOFF.max_s),
            "execution_timeout": timedelta(seconds=timeout_s), "retry_policy": RETRY_POLICY}


def _allowed_timeouts() -> dict[str, int]:
    """What every task of this run's DAG may take, by task id (= step name): its execution timeout, and for the
    approval, how long it waits for a person (its response timeout)."""
    tasks = get_current_context()["dag"].tasks
    limits = {t.task_id: t.response_timeout if isinstance(t, ShipliftApproval) else t.execution_timeout
              for t in tasks if t.execution_timeout is not None}
    return {task_id: int(limit.total_seconds()) for task_id, limit in limits.items()}


def _run_stage(begun: dict, name: str) -> dict:
    if begun["status"] in FINISHED:
        raise AirflowSkipException(f"release {begun['release_id']} is already {begun['status']}")
    from shiplift.tasks.pipeline.release import run_orchestrated_stage

    return run_orchestrated_stage(begun["release_id"], name, holder=_holder(), ledger_url=begun["ledger_url"],
                                  state_dir=begun["state_dir"], actor=_holder(), session=aws_access)


def _request_approval(begun: dict) -> dict:
    if begun["status"] in FINISHED:
        raise AirflowSkipException(f"release {begun['release_id']} is already {begun['status']}")
    from shiplift.tasks.pipeline.approval_steps import request_approval_orchestrated

    asked = request_approval_orchestrated(begun["release_id"], holder=_holder(), ledger_url=begun["ledger_url"],
                                          state_dir=begun["state_dir"], actor=_holder(), session=aws_access)
    if not asked["waiting"]:
        raise AirflowSkipException(f"no approval to wait for: {asked['why']}")
    return asked


def _stage_task(name: str, timeout_s: int):
    @task(task_id=name, **_retry_args(name, timeout_s),
          doc_md=f"Stage `{name}`: {STEPS[name].doc} (`{STEPS[name].function}`).")
    def run_stage(begun: dict) -> dict:
        return _run_stage(begun, name)

    return run_stage


class DeferredStage(BaseOperator):
    """A stage the policy table defers (`Step.defers`): its start runs on a worker and returns at once, the task then
    defers to `StagePollTrigger` (the triggerer polls; no worker slot is held while SageMaker brings the endpoint up),
    and `execute_complete` runs the stage itself on a worker, which finds the work done and records its result. Retries
    and timeouts are the table's, as for every stage task; `execution_timeout` bounds each worker run (start, finish)
    and the deferral is bounded by the stage's own timeout, which the poll checks (and, a little later, by the
    deferral's timeout, should the triggerer stop polling)."""

    template_fields = ("begun",)

    def __init__(self, *, stage: str, begun: Any, poll_every_s: float, **kwargs: Any) -> None:
        super().__init__(task_id=stage, **kwargs)
        self.stage, self.begun, self.poll_every_s = stage, begun, poll_every_s

    def _begun(self, context: Any) -> dict:
        """begin's XCom: as rendered, or pulled here for a promote after the approval steps (which reads it itself:
        Airflow wants every task right after a setup task to run on `all_success`)."""
        return self.begun if self.begun is not None else context["ti"].xcom_pull(task_ids=BEGIN.name)

    def execute(self, context: Any) -> Any:
        begun = self._begun(context)
        if begun["status"] in FINISHED:
            raise AirflowSkipException(f"release {begun['release_id']} is already {begun['status']}")
        from shiplift.tasks.pipeline.deferred import start_orchestrated

        started = start_orchestrated(begun["release_id"], self.stage, holder=_holder(), ledger_url=begun["ledger_url"],
                                     state_dir=begun["state_dir"], actor=_holder(), session=aws_access)
        if "finished" in started:  # a retry or rerun of a stage that already succeeded
            return started["finished"]
        self.defer(trigger=StagePollTrigger(release_id=begun["release_id"], stage=self.stage, holder=_holder(),
                                            every_s=self.poll_every_s, ledger_url=begun["ledger_url"],
                                            state_dir=begun["state_dir"]),
                   method_name="execute_complete",
                   timeout=self.execution_timeout + timedelta(seconds=2 * self.poll_every_s))

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        if event["status"] != "done":
            raise _polled_error(event)
        return _run_stage(self._begun(context), self.stage)


def _polled_error(event: dict[str, Any]) -> Exception:
    """The error a failed poll reported (already recorded in the ledger), raised again on the worker as its domain
    class, so the retry policy treats it as it would have in the stage (CapacityError retried, DeployFailed not)."""
    domain = {cls.__name__: cls for cls in error_classes()}.get(event["error_type"])
    if domain is None:
        return AirflowFailException(f"{event['error_type']}: {event['problem']}")
    return domain(event["problem"], fix=event["fix"])


def _stage(name: str, timeout_s: int, begun: Any) -> Any:
    """The task of one stage: deferrable where the policy table defers it, else a plain task."""
    step = STEPS[name]
    if step.defers is not None:
        return DeferredStage(stage=name, begun=begun, poll_every_s=step.defers.every_s, **_retry_args(name, timeout_s),
                             doc_md=f"Stage `{name}`: {step.doc}; deferred: started (`{step.defers.start}`), then "
                                    f"polled every {step.defers.every_s}s (`{step.defers.poll}`) with no worker held, "
                                    f"then `{step.function}`.")
    return _stage_task(name, timeout_s)(begun)


def _promote_after_approval(timeout_s: int) -> Any:
    """The promote stage of a DAG that may wait for an approval: it runs whether or not anybody was asked (the approval
    tasks skipped) and never after a failure (`none_failed_min_one_success` over validate and approval_decision). It
    reads begin's XCom itself: Airflow wants every task right after a setup task to run on `all_success`. Deferrable
    where the policy table defers promote, as `_stage` makes it."""
    step, done = STEPS["promote"], "none_failed_min_one_success"
    if step.defers is not None:
        return DeferredStage(stage="promote", begun=None, poll_every_s=step.defers.every_s, trigger_rule=done,
                             **_retry_args("promote", timeout_s),
                             doc_md=f"Stage `promote`: {step.doc}, once approved where the config requires it; "
                                    f"deferred: started, then polled every {step.defers.every_s}s with no worker held.")

    @task(task_id="promote", **_retry_args("promote", timeout_s), trigger_rule=done,
          doc_md=f"Stage `promote`: {step.doc}, once approved where the config requires it.")
    def run_stage() -> dict:
        return _run_stage(get_current_context()["ti"].xcom_pull(task_ids=BEGIN.name), "promote")

    return run_stage()


def _assignees(approvers: list[str]) -> list[dict[str, str]] | None:
    """The approvers as the users Airflow assigns the HITL task to, so that its API refuses anyone else (403) and its
    UI shows who may answer. Airflow assigns by user id; the simple auth manager's ids are the user names the config
    lists, other auth managers' are not (FAB's numbers, Keycloak's subjects), so there the task is left unassigned and
    the ledger's own check of the responder's name refuses anyone else."""
    manager = conf.get("core", "auth_manager", fallback="") or ""
    if manager.rpartition(".")[2] != "SimpleAuthManager":
        return None
    return [{"id": name, "name": name} for name in approvers]


class ShipliftApproval(ApprovalOperator):
    """Airflow's ApprovalOperator on the request `approval_request` recorded: its subject and body (the gate summary),
    the approvers as assigned users, and the ledger's deadline as the response timeout (no answer by then: the default
    Reject, with no responder, which the ledger records as timed out). It parks in `awaiting_input` (Airflow 3.3; a
    deferral to the triggerer before), so no worker waits. Unlike the stock operator it skips nothing on Reject: the
    answer goes on to `approval_decision`, and promote reads the outcome from the ledger."""

    def __init__(self, *, request_task_id: str = APPROVAL_REQUEST.name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.request_task_id = request_task_id

    def execute(self, context: Any) -> Any:
        asked = context["ti"].xcom_pull(task_ids=self.request_task_id)
        deadline = pendulum.parse(asked["deadline"])
        self.subject, self.body = asked["subject"], asked["body"]
        self.response_timeout = max(timedelta(seconds=1), deadline - pendulum.now("UTC"))
        self.assigned_users = _assignees(asked["approvers"])
        return super().execute(context)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        answer = HITLOperator.execute_complete(self, context=context, event=event)  # checks the options and params
        self.hitl_summary_extra["approved"] = answer["chosen_options"] == [self.APPROVE]
        return {**answer, "timedout": bool(event.get("timedout"))}


def _approval_operator(timeout_s: float) -> ShipliftApproval:
    """The person's wait (the policy table's `approval`: not retried, no worker held, `timeout_s` for an answer)."""
    return ShipliftApproval(
        task_id=APPROVAL.name, subject="Approve this release for production?", defaults=ApprovalOperator.REJECT,
        params={"comment": Param("", type="string", title="comment",
                                 description="why you approve or reject it: the ledger records it as the "
                                             "decision's reason")},
        response_timeout=timedelta(seconds=timeout_s), retries=APPROVAL.retries, execution_timeout=SHORT_TIMEOUT,
        doc_md="A person approves or rejects the release (`promotion.approval`); the answer and its comment go to the "
               "ledger in `approval_decision`. Unanswered by the deadline: Reject by default, recorded as timed out.")


def _answer(answer: dict[str, Any]) -> dict[str, Any]:
    """The ledger's view of an answer Airflow recorded: approve or not, who (None: Airflow's timeout default),
    why, when."""
    user, when = answer.get("responded_by_user"), answer.get("responded_at")
    return {"approve": answer["chosen_options"] == [ApprovalOperator.APPROVE], "actor": user["name"] if user else None,
            "reason": (answer.get("params_input") or {}).get("comment") or "",
            "decided_at": when.isoformat() if isinstance(when, datetime) else when}


def config_requires_approval(config_path: Path) -> bool:
    """Whether the release config requires an approval; False when it cannot be loaded."""
    from shiplift.tasks.errors import ShipliftError

    try:
        from shiplift.tasks.config import load_release_config

        return load_release_config(config_path).promotion.approval.required
    except ShipliftError:
        return False


def refresh_dag(config_file: str) -> DAG:
    """Build the refresh DAG of one release config: begin, one task per stage, teardown, end."""
    config_path = Path(config_file)
    config_path = (config_path if config_path.is_absolute() else RELEASES_DIR / config_path).resolve()
    dag_id = dag_id_for(config_path)
    timeouts = config_timeouts(config_path)
    waits_for_approval = config_requires_approval(config_path)

    @dag(
        dag_id=dag_id,
        schedule=config_schedule(config_path),
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["shiplift", "refresh", config_path.stem],
        default_args={"owner": OWNER, "retries": 0, "execution_timeout": SHORT_TIMEOUT},
        params={
            "overrides": Param(
                [], type="array", items={"type": "string", "pattern": OVERRIDE_PATTERN},
                description="config overrides, like `shiplift release --set a.b=value` "
                            "(e.g. backend.state_dir=/srv/shiplift)",
            ),
            "fresh_champion": Param(
                False, type="boolean",
                description="the gate scores the champion on every task, reusing none of the per-task results "
                            "earlier gates recorded of it, like `shiplift release --fresh-champion`",
            ),
        },
        doc_md=f"Release `{config_path}` stage by stage (DESIGN §4, §11). The gate rejecting the release is "
               "not a failure: the run succeeds and the release's status is `rejected`."
               + (" Its config requires an approval: a person approves it (task `approval`) before promote."
                  if waits_for_approval else ""),
    )
    def refresh():
        @task(task_id="begin", **_retry_args(BEGIN.name, timeouts[BEGIN.name]))
        def begin() -> dict:
            """Validate the config (a bad one, or one whose deadlines outgrow these tasks' timeouts, fails here with its
            ConfigError), open the release, take the model's lease, and record the run's `fresh_champion`."""
            from shiplift.tasks.orchestrators.run_options import begin_with_options

            params = _params()
            return begin_with_options(str(config_path), holder=_holder(), allowed_timeouts=_allowed_timeouts(),
                                      overrides=tuple(params["overrides"]), fresh_champion=params["fresh_champion"],
                                      actor=_opener(), session=aws_access, waits_for_approval=waits_for_approval)

        @task(task_id=APPROVAL_REQUEST.name, **_retry_args(APPROVAL_REQUEST.name, timeouts[APPROVAL_REQUEST.name]))
        def approval_request(begun: dict) -> dict:
            """Record the approval request once the gate passed, tear the candidate down while it waits (unless the
            config keeps it) and give the lease back meanwhile; skipped, and with it the wait, when nobody needs asking
            (promote then runs)."""
            return _request_approval(begun)

        @task(task_id=APPROVAL_DECISION.name, **_retry_args(APPROVAL_DECISION.name, timeouts[APPROVAL_DECISION.name]))
        def approval_decision(begun: dict, answer: dict) -> dict:
            """Take the lease back, then write the answer Airflow recorded (its user, the comment) to the ledger;
            refused (Conflict, nothing recorded) when the user is not an approver, opened the release under four eyes,
            or gave no reason."""
            from shiplift.tasks.pipeline.approval_steps import record_decision_orchestrated

            return record_decision_orchestrated(begun["release_id"], **_answer(answer), run_actor=_holder(),
                                                holder=_holder(), ledger_url=begun["ledger_url"],
                                                state_dir=begun["state_dir"], session=aws_access)

        @task(task_id=TEARDOWN, **_retry_args(TEARDOWN, timeouts[TEARDOWN]))
        def teardown_candidate(begun: dict) -> dict:
            """Remove the candidate endpoint whatever happened (idempotent)."""
            return _run_stage(begun, TEARDOWN)

        @task(task_id="end", **_retry_args(END.name, timeouts[END.name]))
        def end(begun: dict) -> dict:
            """Record the final status, give the lease back, and fail the run if any task failed."""
            from shiplift.tasks.pipeline.release import end_orchestrated

            failed = _failed_tasks()
            summary = end_orchestrated(begun["release_id"], holder=_holder(), failed=bool(failed),
                                       ledger_url=begun["ledger_url"], state_dir=begun["state_dir"],
                                       actor=_holder(), session=aws_access)
            if failed:
                raise AirflowFailException(f"release {begun['release_id']} failed at {', '.join(failed)}; "
                                           "its candidate was torn down and the lease given back")
            return {key: summary[key] for key in ("release_id", "model", "status", "artifact_sha256", "image_uri",
                                                  "decision", "not_passed", "metrics", "served_by")}

        begun = begin()
        plain = [name for name in STAGE_NAMES if name != TEARDOWN and not (waits_for_approval and name == "promote")]
        stages = [_stage(name, timeouts[name], begun) for name in plain]
        if waits_for_approval:  # validate → approval_request → approval → approval_decision → promote
            waiting = _approval_operator(timeouts[APPROVAL.name])
            promoted = _promote_after_approval(timeouts["promote"])
            stages[-1] >> promoted
            stages += [approval_request(begun), waiting, approval_decision(begun, waiting.output), promoted]
        chain(*stages)
        torn_down, ended = teardown_candidate(begun), end(begun)
        stages[-1] >> torn_down >> ended
        # Setup/teardown: both run whatever happened to the stages (ALL_DONE_SETUP_SUCCESS), and are
        # skipped when begin failed (no release, no lease). The run's state comes from promote and end.
        torn_down.as_teardown(setups=begun)
        ended.as_teardown(setups=begun, on_failure_fail_dagrun=True)

    return refresh()


def _state_dir(params: dict[str, Any]) -> str | None:
    """The state dir param; None lets tasks use $SHIPLIFT_LEDGER_URL or $SHIPLIFT_HOME."""
    return params.get("state_dir")


def promote_release_dag() -> DAG:
    """The triggered promotion / rollback DAG; params are checked by Airflow before any task runs."""

    @dag(
        dag_id="promote_release",
        schedule=None,
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["shiplift", "promotion"],
        default_args={"owner": OWNER, "retries": 0, "execution_timeout": timedelta(minutes=30)},
        params={
            "release_id": Param(type="string", pattern=RELEASE_ID_PATTERN, description="the release to promote, "
                                "or (with rollback_target) the release being rolled back"),
            "strategy": Param(None, type=["null", "string"], enum=[None, "all_at_once", "canary", "linear"],
                              description="unset: the release's own rollout.strategy (the only one it accepts)"),
            "rollback_target": Param(None, type=["null", "string"], pattern=RELEASE_ID_PATTERN,
                                     description="roll the model back from release_id to this earlier release"),
            "reason": Param(type="string", minLength=1, pattern=r"\S", description="why (recorded in the ledger)"),
            "state_dir": Param(None, type=["null", "string"], minLength=1,
                               description="local backend state dir; default $SHIPLIFT_HOME or .shiplift"),
            "ledger_url": Param(None, type=["null", "string"], minLength=1,
                                description="the ledger (SQLAlchemy URL, no password); default $SHIPLIFT_LEDGER_URL "
                                            "or SQLite under state_dir"),
        },
        doc_md="Promote a gated release (`tasks.pipeline.promotion.promote`) or roll its model back to an earlier "
               "promoted release (`tasks.pipeline.promotion.rollback`), with the reason in the ledger. A release "
               "whose config requires an approval that it has not had yet waits for a person first (task `approval`).",
    )
    def promote_release():
        @task.branch(task_id="choose")
        def choose() -> str | list[str]:
            """Promotion (after an approval where the release's config requires one) when no rollback target is
            given, else rollback."""
            return "rollback" if _params()["rollback_target"] else [APPROVAL_REQUEST.name, "promote"]

        def run_actor() -> str:
            return f"airflow:promote_release/{get_current_context()['run_id']}"

        @task(task_id=APPROVAL_REQUEST.name, **_retry_args(APPROVAL_REQUEST.name, APPROVAL_REQUEST.timeout_s))
        def approval_request() -> dict:
            """Ask for the release's approval if its config requires one and it has not been decided; skipped (and
            with it the wait) otherwise."""
            from shiplift.tasks.pipeline.approval_steps import request_approval_orchestrated

            params = _params()
            asked = request_approval_orchestrated(params["release_id"], ledger_url=params["ledger_url"],
                                                  state_dir=_state_dir(params), actor=run_actor(), session=aws_access)
            if not asked["waiting"]:
                raise AirflowSkipException(f"no approval to wait for: {asked['why']}")
            return asked

        @task(task_id=APPROVAL_DECISION.name, **_retry_args(APPROVAL_DECISION.name, APPROVAL_DECISION.timeout_s))
        def approval_decision(answer: dict) -> dict:
            """Write the answer Airflow recorded to the ledger (refused, nothing recorded, when it is not theirs)."""
            from shiplift.tasks.pipeline.approval_steps import record_decision_orchestrated

            params = _params()
            return record_decision_orchestrated(params["release_id"], **_answer(answer), run_actor=run_actor(),
                                                ledger_url=params["ledger_url"], state_dir=_state_dir(params),
                                                session=aws_access)

        @task(task_id="promote", **_retry_args(PROMOTE_RELEASE.name, PROMOTE_RELEASE.timeout_s),
              trigger_rule="none_failed_min_one_success")
        def promote_task() -> dict:
            """Promote; after a rejection or a timeout the release instead ends `rejected` (promote skipped with the
            reason, candidate torn down), the champion serving on."""
            context = get_current_context()
            params = context["params"]
            decided = context["ti"].xcom_pull(task_ids=APPROVAL_DECISION.name)
            if decided is not None and decided["decision"] != "approved":
                from shiplift.tasks.pipeline.approval_steps import finish_unapproved_orchestrated

                summary = finish_unapproved_orchestrated(params["release_id"], actor=run_actor(),
                                                         ledger_url=params["ledger_url"], state_dir=_state_dir(params),
                                                         session=aws_access)
                return {"release_id": params["release_id"], "action": "not_approved", "status": summary["status"],
                        "reason": decided["reason"]}
            from shiplift.tasks.pipeline.promotion import promote

            return promote(_state_dir(params), params["release_id"], strategy=params["strategy"],
                           reason=params["reason"], actor=run_actor(), ledger_url=params["ledger_url"],
                           session=aws_access)

        @task(task_id="rollback", **_retry_args(ROLLBACK.name, ROLLBACK.timeout_s))
        def rollback_task() -> dict:
            from shiplift.tasks.backends.registry import open_ledger
            from shiplift.tasks.ledger.release_state import ReleaseState
            from shiplift.tasks.pipeline.promotion import rollback

            context = get_current_context()
            params = context["params"]
            ledger = open_ledger(ledger_url=params["ledger_url"], state_dir=_state_dir(params))
            model = ReleaseState.load(ledger, params["release_id"]).opened["config"]["name"]
            return rollback(_state_dir(params), model, params["rollback_target"], reason=params["reason"],
                            actor=f"airflow:promote_release/{context['run_id']}", expect_current=params["release_id"],
                            ledger_url=params["ledger_url"], session=aws_access)

        chosen, promoted = choose(), promote_task()
        asked, waiting = approval_request(), _approval_operator(MAX_APPROVAL_WAIT.total_seconds())
        chosen >> asked >> waiting
        approval_decision(waiting.output) >> promoted
        chosen >> [promoted, rollback_task()]

    return promote_release()


def audit_ledger_dag() -> DAG:
    """The scheduled audit DAG: the ledger chain, then live endpoints against the ledger."""

    @dag(
        dag_id="audit_ledger",
        schedule="@hourly",
        start_date=START_DATE,
        catchup=False,
        max_active_runs=1,
        tags=["shiplift", "audit"],
        default_args={"owner": OWNER, "retries": 0, "execution_timeout": SHORT_TIMEOUT},
        params={"state_dir": Param(None, type=["null", "string"], minLength=1),
                "ledger_url": Param(None, type=["null", "string"], minLength=1),
                "config": Param(None, type=["null", "string"], minLength=1,
                                description="an aws release config whose backend.checkpoints the ledger is "
                                            "verified against")},
        doc_md="Fails loudly (IntegrityError, Conflict) on a ledger that does not verify against its checkpoints, "
               "or on drift.",
    )
    def audit_ledger():
        @task(task_id="audit", **_retry_args(AUDIT.name, AUDIT.timeout_s))
        def audit_task() -> dict:
            from shiplift.tasks.pipeline.audit import audit

            params = _params()
            return audit(_state_dir(params), ledger_url=params["ledger_url"], config=params["config"],
                         session=aws_access)

        audit_task()

    return audit_ledger()
