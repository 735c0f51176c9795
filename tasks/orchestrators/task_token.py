"""A Step Functions task's outcome, reported with its task token (`ecs:runTask.waitForTaskToken`).

ECS `.sync` tells Step Functions only that a container stopped, never why, so every failure looked retryable. Each
Task state therefore passes its token in `SHIPLIFT_SFN_TASK_TOKEN`, and the `shiplift` command inside reports the
outcome itself: success, or failure named `Shiplift.<error class>`. The state's Retry names exactly the classes whose
`retryable` is true; every other failure goes straight to its Catch (teardown). While the step runs, a heartbeat every
`HEARTBEAT_EVERY_S` shows the container alive; one that dies stops beating, and `States.HeartbeatTimeout` is retried
like a lost Airflow worker.

One step is different: AwaitApproval (a config that requires an approval, docs/approval.md). Its command records the
approval request and exits without reporting, so the state keeps waiting on its token until a person decides;
`shiplift approve` / `shiplift reject` then sends the decision with that token (`decide_for_execution`). The token is
a secret (botocore marks taskToken sensitive; the ledger refuses such keys), so the task keeps it in S3 under the
result prefix and the ledger's request records only its sha256 and where it is: the approver sends only the token
that matches the release's own record, once (a second decision is refused before anything is sent, and Step
Functions refuses a closed token with TaskTimedOut).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from typing import Any

from shiplift.tasks.backends.aws.session import Aws, error_code
from shiplift.tasks.errors import ConfigError, Conflict, NotFound, ShipliftError, error_classes
from shiplift.tasks.ledger.records import Approval
from shiplift.tasks.ledger.release_state import release_summary
from shiplift.tasks.pipeline.approval import (
    approval_state,
    decide,
    follow_registry,
    record_orchestrator_timeout,
    request_for_execution,
    waiting_execution,
)
from shiplift.tasks.pipeline.release import (
    ensure_stage,
    holding_lease,
    print_progress,
    reopen_release,
    run_holder,
    run_stages,
)
from shiplift.tasks.pipeline.table import LEASE, TEARDOWN

TOKEN_ENV = "SHIPLIFT_SFN_TASK_TOKEN"
ERROR_PREFIX = "Shiplift."
UNEXPECTED_ERROR = ERROR_PREFIX + "UnexpectedError"  # not a domain error: a bug, never retried
HEARTBEAT_TIMEOUT = "States.HeartbeatTimeout"
HEARTBEAT_EVERY_S = 60
# boto3 clients of Step Functions and S3 (the task token, the stage results): bounded waits, standard retries
CLIENT_TIMEOUTS = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 5, "mode": "standard"}}
MAX_CAUSE_CHARS = 32768  # SendTaskFailure.cause in the botocore model; `error` is at most 256


def error_name(exc: BaseException) -> str:
    """The error a failed task reports: `Shiplift.<class>` for a domain error, else `Shiplift.UnexpectedError`."""
    return ERROR_PREFIX + type(exc).__name__ if isinstance(exc, ShipliftError) else UNEXPECTED_ERROR


def retryable_error_names() -> list[str]:
    """The errors a Retry rule names: every domain error class whose `retryable` is true."""
    return [ERROR_PREFIX + cls.__name__ for cls in error_classes() if cls.retryable]


def failure_cause(exc: BaseException) -> str:
    """The failure's message for Step Functions; one longer than the API takes says where the rest is, instead of
    being cut silently (the ledger's failed record always holds it whole)."""
    text = str(exc) if isinstance(exc, ShipliftError) else repr(exc)
    if len(text) <= MAX_CAUSE_CHARS:
        return text
    kept = MAX_CAUSE_CHARS - 120  # room for the note
    return text[:kept] + f" … [{len(text) - kept} more characters: the whole error is in the ledger's failed record]"


def _client():
    import boto3
    from botocore.config import Config

    return boto3.client("stepfunctions", config=Config(**CLIENT_TIMEOUTS))


def reporting_to_step_functions(run: Callable[[], Any], *, client: Any = None) -> Any:
    """Run one step; inside a Step Functions task (its token in the environment) heartbeat while it runs, then report
    its success or its error. Outside one, just run it."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        return run()
    client = client or _client()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_EVERY_S):
            try:
                client.send_task_heartbeat(taskToken=token)
            except Exception as exc:  # the next beat tries again; HeartbeatSeconds allows several misses
                print(f"shiplift: Step Functions heartbeat not sent: {exc}", file=sys.stderr, flush=True)

    beating = threading.Thread(target=beat, name="sfn-heartbeat", daemon=True)
    beating.start()
    try:
        result = run()
    except BaseException as exc:
        stop.set()
        beating.join()
        try:
            client.send_task_failure(taskToken=token, error=error_name(exc), cause=failure_cause(exc))
        except Exception as report_error:  # Step Functions then learns of it at the heartbeat timeout
            print(f"shiplift: Step Functions not told of the failure: {report_error}", file=sys.stderr, flush=True)
        raise
    stop.set()
    beating.join()
    client.send_task_success(taskToken=token, output="{}")  # the state discards its output (ResultPath null)
    return result


# --- Approval: AwaitApproval waits on its token; `shiplift approve` / `reject` send the decision with it --------------
# The callback pattern: https://docs.aws.amazon.com/step-functions/latest/dg/connect-to-resource.html#connect-wait-token
# SendTaskSuccess: https://docs.aws.amazon.com/step-functions/latest/apireference/API_SendTaskSuccess.html

HOLDER_PREFIX = "stepfunctions:"  # an execution's lease holder: `stepfunctions:<execution ARN>` (the Prepare state)
# SendTaskSuccess's errors for a token Step Functions does not wait on (the operation's errors in botocore's model;
# TaskTimedOut: "the task token has either expired or the task associated with the token has already been closed")
TOKEN_REFUSALS = {
    "TaskTimedOut": "the token expired or its task was already closed (decided once already, or the execution was "
                    "stopped or timed out)",
    "InvalidToken": "Step Functions does not know this token",
    "TaskDoesNotExist": "the token's task does not exist",
}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _s3_place(uri: str) -> tuple[str, str]:
    match = re.fullmatch(r"s3://([^/]+)/(.+?)/?", uri)
    if not match:
        raise ConfigError(f"{uri!r} is not s3://BUCKET/KEY",
                          fix="pass --token-prefix s3://BUCKET/PREFIX (what `sfn render` writes)")
    return match[1], match[2]


def approval_aws(config, session: Any = None):
    """The AWS session the approval's S3 and Step Functions calls use: the aws backend's (region, profile, and the
    caller's boto3 session), or for a local-backend config the standard chain in $AWS_DEFAULT_REGION."""
    backend = config.backend
    if backend.kind == "aws":
        return Aws(region=backend.region, profile=backend.profile, access=session)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ConfigError(f"{config.name} uses the local backend, which names no AWS region for Step Functions",
                          fix="set AWS_DEFAULT_REGION to the state machine's region")
    return Aws(region=region, access=session)


def keep_token(aws, prefix: str, release_id: str, holder: str, token: str) -> dict:
    """Put the task token where the approver reads it (PREFIX/task-token-<sha256[:16]>.json, with the release and the
    execution); returns the reference the ledger's request records: holder, execution, token_uri, token_sha256."""
    digest = _sha256(token)
    bucket, key = _s3_place(prefix)
    key = f"{key}/task-token-{digest[:16]}.json"
    body = json.dumps({"release_id": release_id, "holder": holder, "task_token": token}, sort_keys=True).encode()
    aws.call("s3", "PutObject", Bucket=bucket, Key=key, Body=body, ContentType="application/json",
             ChecksumAlgorithm="SHA256")
    return {"holder": holder, "execution": holder.removeprefix(HOLDER_PREFIX), "token_uri": f"s3://{bucket}/{key}",
            "token_sha256": digest}


def read_token(aws, release_id: str, wait: dict) -> str:
    """The task token the release's request names (`wait`), read back and checked against it: Conflict, and nothing
    recorded or sent, when the object holds another token (its sha256 is not the ledger's), another release's or
    another execution's, or is gone."""
    bucket, key = _s3_place(wait["token_uri"])
    refused = (f"the task token at {wait['token_uri']} is not the one release {release_id}'s approval request "
               f"names (sha256 {wait['token_sha256'][:16]}…, execution {wait['execution']})")
    fix = ("nothing was recorded or sent; the token is only ever taken from the place the ledger names, so look at "
           "who wrote that object, or rerun the execution so its AwaitApproval task keeps its token again")
    try:
        kept = json.loads(aws.call("s3", "GetObject", Bucket=bucket, Key=key)["Body"].read())
    except NotFound as exc:
        raise Conflict(f"{refused}: it is not there", fix=fix) from exc
    except ValueError as exc:
        raise Conflict(f"{refused}: it is not JSON", fix=fix) from exc
    token = kept.get("task_token") if isinstance(kept, dict) else None
    if not isinstance(token, str) or _sha256(token) != wait["token_sha256"]:
        raise Conflict(f"{refused}: it holds another token", fix=fix)
    if (kept.get("release_id"), kept.get("holder")) != (release_id, wait["holder"]):
        raise Conflict(f"{refused}: it was kept for release {kept.get('release_id')} in {kept.get('holder')}", fix=fix)
    return token


def send_decision(aws, token: str, output: dict) -> None:
    """SendTaskSuccess with the decision as the task's output (both decisions: a rejection goes on to Promote, which
    skips, not to the failure path). A token Step Functions does not wait on (TaskTimedOut, InvalidToken,
    TaskDoesNotExist) is a Conflict naming the error; other failures are the session's domain errors."""
    try:
        aws.call("stepfunctions", "SendTaskSuccess", taskToken=token, output=json.dumps(output, sort_keys=True))
    except ShipliftError as exc:
        code = error_code(exc.__cause__)[0] if exc.__cause__ is not None else ""
        if code in TOKEN_REFUSALS:
            raise Conflict(f"Step Functions refused the task token: {code}: {TOKEN_REFUSALS[code]}",
                           fix="see the execution's history in the Step Functions console") from exc
        raise


def _decided(ctx) -> dict:
    """The output sent with the token: the approval's status and the decision record's who and seq."""
    current = approval_state(ctx.state, ctx.config)
    record = current.decision
    return {"release_id": ctx.release_id, "decision": current.status,
            "by": Approval.of(record).by if record is not None else None, "seq": record.seq
            if record is not None else None}


def decide_for_execution(ctx, *, approve: bool, reason: str, session: Any = None) -> dict:
    """`shiplift approve` / `reject` of a release waiting in AwaitApproval: read its task token back from where its
    request says (refused, nothing recorded, when it is not that token), give the execution its lease back (LeaseHeld
    while another run promotes the model), record the decision (`approval.decide`, which refuses what it must), then
    send it with the token instead of running the remaining stages here: the execution goes on to Promote. A send that
    fails leaves the decision recorded and says so; the execution's ApprovalTimedOut step then follows the ledger."""
    wait = waiting_execution(ctx.state.records)
    if wait is None:
        raise Conflict(f"release {ctx.release_id} does not wait in a Step Functions execution",
                       fix=f"see `shiplift ledger show {ctx.release_id}`")
    aws = approval_aws(ctx.config, session)
    token = read_token(aws, ctx.release_id, wait)
    ledger, model, holder = ctx.backends.ledger, ctx.config.name, wait["holder"]
    ledger.acquire_lease(model, holder, ctx.release_id, LEASE.ttl_s)
    try:
        decision = decide(ctx, approve=approve, actor=ctx.actor, reason=reason)
    except BaseException:
        ledger.release_lease(model, holder)
        raise
    output = _send_recorded(ctx, aws, token, wait)
    return {**decision, "summary": release_summary(ctx.state),
            "step_functions": {"execution": wait["execution"], "sent": "SendTaskSuccess", "output": output}}


def _send_recorded(ctx, aws, token: str, wait: dict) -> dict:
    """Send the decision just recorded to the waiting execution (which holds the lease for Promote now); a send that
    fails gives the lease back and says that the decision stands and how the execution learns of it."""
    output = _decided(ctx)
    try:
        send_decision(aws, token, output)
    except ShipliftError as exc:
        ctx.backends.ledger.release_lease(ctx.config.name, wait["holder"])
        raise type(exc)(f"the {output['decision']} decision on {ctx.release_id} is recorded, but {wait['execution']} "
                        f"was not told: {exc.problem}",
                        fix="nothing to decide again: when AwaitApproval times out, ApprovalTimedOut goes on to "
                            "Promote with the recorded decision; to go on sooner, stop the execution and start it "
                            "again (it resumes from the ledger)") from exc
    ctx.say(f"approval: sent to {wait['execution']} with its task token; it goes on to promote")
    return output


def await_approval(release_id: str, *, holder: str, token_prefix: str, ledger_url: str | None = None,
                   state_dir: Any = None, actor: str | None = None, progress: Callable[[str], None] | None = None,
                   session: Any = None, client: Any = None) -> dict:
    """What AwaitApproval's task runs (`shiplift orchestrate await-approval`): keep its task token (`keep_token`),
    record the request with the token's reference (`approval.request_for_execution`), tear the candidate down unless the
    approval keeps it, give the lease back so others are not blocked while a person reads the report, and exit
    WITHOUT reporting: the state waits on the token for `shiplift approve` / `reject`. A release already decided (a
    retried or new execution; a decision made meanwhile in the Model Registry is followed first) reports its decision
    at once, and a failure is reported as any step's is."""
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise ConfigError("`shiplift orchestrate await-approval` runs in the Step Functions AwaitApproval task: no "
                          f"task token in {TOKEN_ENV}",
                          fix="run it from the state machine `shiplift sfn render` writes")
    client = client or _client()
    try:
        ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                             progress=progress or print_progress, session=session)
        ctx.lease_holder = holder
        follow_registry(ctx)
        wait = keep_token(approval_aws(ctx.config, session), token_prefix, release_id, holder, token)
        status = request_for_execution(ctx, wait)
        if status == "awaiting":
            if not ctx.config.promotion.approval.keep_candidate:
                ensure_stage(ctx, TEARDOWN)
            ctx.backends.ledger.release_lease(ctx.config.name, holder)
            ctx.say(f"waiting for approval in {wait['execution']}: an approver runs `shiplift approve {release_id} "
                    "--reason TEXT` (or `shiplift reject`); the task token stays open")
            return {"release_id": release_id, "decision": "awaiting", "token_sha256": wait["token_sha256"]}
        output = _decided(ctx)
    except BaseException as exc:
        try:
            client.send_task_failure(taskToken=token, error=error_name(exc), cause=failure_cause(exc))
        except Exception as report_error:  # Step Functions then learns of it at the state's timeout
            print(f"shiplift: Step Functions not told of the failure: {report_error}", file=sys.stderr, flush=True)
        raise
    client.send_task_success(taskToken=token, output=json.dumps(output, sort_keys=True))
    return output


def approval_timed_out(release_id: str, *, holder: str, ledger_url: str | None = None, state_dir: Any = None,
                       actor: str | None = None, progress: Callable[[str], None] | None = None,
                       session: Any = None) -> dict:
    """What ApprovalTimedOut runs (`shiplift orchestrate approval-timed-out`, reported like any step): AwaitApproval's
    TimeoutSeconds passed, so a request still awaiting is recorded timed out (one decided but not relayed keeps its
    decision), and the execution takes its lease back for Promote, which then skips (or promotes an approval)."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                         progress=progress or print_progress, session=session)
    rule = ctx.config.promotion.approval
    status = record_orchestrator_timeout(ctx, f"Step Functions stopped waiting: AwaitApproval timed out "
                                              f"(promotion.approval.timeout_s {rule.timeout_s:g} s plus the task's "
                                              "start-up allowance)")
    ctx.backends.ledger.acquire_lease(ctx.config.name, holder, release_id, LEASE.ttl_s)
    ctx.say(f"approval: {status}; going on to promote")
    return {"release_id": release_id, "decision": status}


def follow_registry_approval(release_id: str, *, ledger_url: str | None = None, state_dir: Any = None,
                             actor: str | None = None, progress: Callable[[str], None] | None = None,
                             session: Any = None) -> dict:
    """Record a decision made in the SageMaker Model Registry on a release awaiting approval
    (`approval.follow_registry`), then continue the release as `shiplift approve` does: send it to the waiting
    execution with its token, or run the remaining stages here. What a `shiplift approval follow RELEASE` command, a
    schedule or an EventBridge rule on the registry's state changes would call."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor,
                         progress=progress or print_progress, session=session)
    wait = waiting_execution(ctx.state.records)
    if wait is None:
        with holding_lease(ctx, run_holder(ctx.actor)):
            found = follow_registry(ctx)
        decided = found is not None and found.get("decision") is not None
        return {"registry": found, "summary": run_stages(ctx) if decided else release_summary(ctx.state)}
    aws = approval_aws(ctx.config, session)
    token = read_token(aws, release_id, wait)
    ledger, model, holder = ctx.backends.ledger, ctx.config.name, wait["holder"]
    ledger.acquire_lease(model, holder, release_id, LEASE.ttl_s)
    try:
        found = follow_registry(ctx)
    except BaseException:
        ledger.release_lease(model, holder)
        raise
    if found is None or found.get("decision") is None:
        ledger.release_lease(model, holder)
        return {"registry": found, "summary": release_summary(ctx.state)}
    output = _send_recorded(ctx, aws, token, wait)
    return {"registry": found, "summary": release_summary(ctx.state),
            "step_functions": {"execution": wait["execution"], "sent": "SendTaskSuccess", "output": output}}
