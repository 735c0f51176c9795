"""A Step Functions task reports its own outcome with the task token: success, or the error's class, so the state
machine's Retry retries exactly the retryable errors (`tasks.orchestrators.task_token`).

The client is boto3's with botocore's Stubber, which checks every request against the Step Functions service model
(SendTaskSuccess, SendTaskFailure, SendTaskHeartbeat: https://docs.aws.amazon.com/step-functions/latest/apireference/);
the lengths `ParamValidator` skips (error ≤ 256, cause ≤ 32,768 characters) are checked against the model here.
"""

from __future__ import annotations

import threading

import boto3
import pytest
from botocore.stub import Stubber

from shiplift.tasks.errors import ConfigError, NotReady
from shiplift.tasks.orchestrators import task_token
from shiplift.tasks.orchestrators.task_token import MAX_CAUSE_CHARS, TOKEN_ENV, reporting_to_step_functions

TOKEN = "AQCEAAAAKgAAAAMAAAAAAAAAAR" * 4


def _client():
    client = boto3.client("stepfunctions", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    return client, Stubber(client)


def _limits(client, operation: str) -> dict[str, int]:
    shape = client.meta.service_model.operation_model(operation).input_shape
    return {name: member.metadata["max"] for name, member in shape.members.items() if "max" in member.metadata}


def test_outside_a_step_functions_task_it_only_runs(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    client, stub = _client()
    with stub:
        assert reporting_to_step_functions(lambda: {"ok": 1}, client=client) == {"ok": 1}
        stub.assert_no_pending_responses()


def test_success_is_reported_after_heartbeats_while_it_ran(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    monkeypatch.setattr(task_token, "HEARTBEAT_EVERY_S", 0.01)
    client, stub = _client()
    beaten = threading.Event()
    stub.add_response("send_task_heartbeat", {}, {"taskToken": TOKEN})
    client.meta.events.register("after-call.sfn.SendTaskHeartbeat", lambda **_: beaten.set())

    def run() -> dict:
        assert beaten.wait(10), "no heartbeat while the step ran"
        return {"result": "done"}

    stub.add_response("send_task_success", {}, {"taskToken": TOKEN, "output": "{}"})
    with stub:
        assert reporting_to_step_functions(run, client=client) == {"result": "done"}
        stub.assert_no_pending_responses()


@pytest.mark.parametrize("error, reported", [(ConfigError("bad", fix="mend it"), "Shiplift.ConfigError"),
                                             (NotReady("not yet"), "Shiplift.NotReady"),
                                             (KeyError("bug"), "Shiplift.UnexpectedError")])
def test_a_failure_is_reported_by_its_class_and_still_raised(monkeypatch, error, reported):
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    client, stub = _client()
    cause = str(error) if not isinstance(error, KeyError) else repr(error)
    stub.add_response("send_task_failure", {}, {"taskToken": TOKEN, "error": reported, "cause": cause})

    def run():
        raise error

    with stub, pytest.raises(type(error)):
        reporting_to_step_functions(run, client=client)
    stub.assert_no_pending_responses()


def test_a_cause_longer_than_the_api_takes_says_where_the_rest_is():
    client, _ = _client()
    limits = _limits(client, "SendTaskFailure")
    assert limits["cause"] == MAX_CAUSE_CHARS and limits["error"] == 256
    long_error = ConfigError("x" * 40000)
    cause = task_token.failure_cause(long_error)
    assert len(cause) <= MAX_CAUSE_CHARS
    assert cause.endswith("more characters: the whole error is in the ledger's failed record]")
    assert str(len(str(long_error)) - (MAX_CAUSE_CHARS - 120)) in cause
    assert task_token.failure_cause(ConfigError("short")) == "short"
    assert max(len(name) for name in task_token.retryable_error_names()) <= limits["error"]
