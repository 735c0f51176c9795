"""A Step Functions task's outcome, reported with its task token (`ecs:runTask.waitForTaskToken`).

ECS `.sync` tells Step Functions only that a container stopped, never why, so every failure looked retryable. Each
Task state therefore passes its token in `SHIPLIFT_SFN_TASK_TOKEN`, and the `shiplift` command inside reports the
outcome itself: success, or failure named `Shiplift.<error class>`. The state's Retry names exactly the classes whose
`retryable` is true; every other failure goes straight to its Catch (teardown). While the step runs, a heartbeat every
`HEARTBEAT_EVERY_S` shows the container alive; one that dies stops beating, and `States.HeartbeatTimeout` is retried
like a lost Airflow worker.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable

from tasks.errors import ShipliftError, error_classes

TOKEN_ENV = "SHIPLIFT_SFN_TASK_TOKEN"
ERROR_PREFIX = "Shiplift."
UNEXPECTED_ERROR = ERROR_PREFIX + "UnexpectedError"  # not a domain error: a bug, never retried
HEARTBEAT_TIMEOUT = "States.HeartbeatTimeout"
HEARTBEAT_EVERY_S = 60
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

    from tasks.orchestrators.step_functions import CLIENT_TIMEOUTS

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
