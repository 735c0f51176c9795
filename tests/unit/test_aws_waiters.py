"""shiplift.tasks.backends.aws.waiters.wait_for against a scripted `aws`: acceptors from waiters.json, deadlines,
progress."""

from __future__ import annotations

import json
import time
from pathlib import Path

import botocore
import pytest

from shiplift.tasks.backends.aws.waiters import wait_for, waiter_models
from shiplift.tasks.errors import ConfigError, Conflict, NotFound, NotReady

BOTOCORE_WAITERS = next((Path(botocore.__file__).parent / "data" / "sagemaker").glob("*/waiters-2.json"))


class ScriptedAws:
    """Answers each `call` with the next scripted response; an exception in the script is raised instead."""

    def __init__(self, *script):
        self.script = list(script)
        self.calls: list[tuple[str, str, dict]] = []

    def call(self, service, operation, **params):
        self.calls.append((service, operation, params))
        step = self.script.pop(0) if len(self.script) > 1 else self.script[0]  # the last answer repeats
        if isinstance(step, Exception):
            raise step
        return step


def endpoint(status: str, **extra) -> dict:
    return {"EndpointName": "e", "EndpointStatus": status, **extra}


def component(status: str, **extra) -> dict:
    return {"InferenceComponentName": "c", "InferenceComponentStatus": status, **extra}


def wait(aws, name="EndpointInService", params=None, *, deadline_s=5.0, poll_s=0.001, what="endpoint e"):
    heard: list[str] = []
    params = params if params is not None else ({"EndpointName": "e"}
                                                if name.startswith("Endpoint") else {"InferenceComponentName": "c"})
    result = wait_for(aws, name, params, deadline_s=deadline_s, poll_s=poll_s, progress=heard.append, what=what)
    return result, heard


def test_creating_then_in_service_is_success_with_the_last_response():
    aws = ScriptedAws(endpoint("Creating"), endpoint("Creating"), endpoint("InService", ProductionVariants=[]))
    (state, response), heard = wait(aws)
    assert state == "success" and response == endpoint("InService", ProductionVariants=[])
    assert aws.calls == [("sagemaker", "DescribeEndpoint", {"EndpointName": "e"})] * 3
    assert heard == ["endpoint e: Creating", "endpoint e: InService"]


# botocore's own sagemaker `EndpointInService` waiter (botocore/data/sagemaker/2017-07-24/waiters-2.json) has one
# failure acceptor, EndpointStatus == Failed (plus ValidationException errors). UpdateRollbackFailed, OutOfService and
# Deleting match nothing there, so botocore keeps polling them (30 s x 120 attempts: an hour) until it gives up with a
# timeout. shiplift's waiters.json ends the wait on every one of them at once, with the response, so FailureReason is
# read at once.
@pytest.mark.parametrize("terminal", ["Failed", "UpdateRollbackFailed", "OutOfService", "Deleting"])
def test_every_non_success_terminal_status_fails_at_once_with_the_response(terminal):
    failed = endpoint(terminal, FailureReason="the primary container did not pass the ping health check")
    aws = ScriptedAws(endpoint("Updating"), failed, endpoint("InService"))
    (state, response), heard = wait(aws)
    assert state == "failure" and response == failed and response["FailureReason"].startswith("the primary container")
    assert len(aws.calls) == 2, "no poll after the terminal status"
    assert heard == ["endpoint e: Updating", f"endpoint e: {terminal}"]


def test_botocore_treats_only_failed_as_failure_where_shiplift_treats_every_terminal_status():
    """The claim in the comment above, checked against the installed botocore."""
    theirs = json.loads(BOTOCORE_WAITERS.read_text())["waiters"]["EndpointInService"]["acceptors"]
    their_failures = {a["expected"] for a in theirs if a["state"] == "failure" and a["matcher"] == "path"}
    ours = {a["expected"] for a in waiter_models()["EndpointInService"]["acceptors"] if a["state"] == "failure"}
    assert their_failures == {"Failed"}
    assert ours - their_failures == {"UpdateRollbackFailed", "OutOfService", "Deleting"}


def test_a_failed_inference_component_fails_the_wait():
    failed = component("Failed", FailureReason="copies do not fit the endpoint's partitions")
    (state, response), heard = wait(ScriptedAws(component("Creating"), failed), "InferenceComponentInService",
                                    what="inference component c")
    assert (state, response) == ("failure", failed)
    assert heard == ["inference component c: Creating", "inference component c: Failed"]


@pytest.mark.parametrize("name, deleting", [("EndpointDeleted", endpoint("Deleting")),
                                            ("InferenceComponentDeleted", component("Deleting"))])
def test_not_found_is_success_for_the_deleted_waiters(name, deleting):
    aws = ScriptedAws(deleting, deleting, NotFound("Could not find it"))
    (state, response), heard = wait(aws, name, what="it")
    assert (state, response) == ("success", None) and len(aws.calls) == 3
    assert heard == ["it: Deleting", "it: NotFound"]


def test_an_endpoint_failed_during_its_deletion_fails_the_wait_at_once_as_botocores_waiter_does():
    """botocore's EndpointDeleted waiter (botocore/data/sagemaker/2017-07-24/waiters-2.json) ends in failure on
    EndpointStatus Failed; shiplift's did the same acceptor as `retry` and polled a Failed endpoint to its deadline."""
    failed = endpoint("Failed", FailureReason="the endpoint could not be deleted")
    aws = ScriptedAws(endpoint("Deleting"), failed, NotFound("Could not find endpoint"))
    (state, response), heard = wait(aws, "EndpointDeleted")
    assert (state, response) == ("failure", failed) and len(aws.calls) == 2, "no poll after Failed"
    assert heard == ["endpoint e: Deleting", "endpoint e: Failed"]
    theirs = json.loads(BOTOCORE_WAITERS.read_text())["waiters"]["EndpointDeleted"]["acceptors"]
    ours = waiter_models()["EndpointDeleted"]["acceptors"]
    path = lambda acceptors: {(a["expected"], a["state"]) for a in acceptors if a["matcher"] == "path"}  # noqa: E731
    assert path(ours) == path(theirs) == {("Failed", "failure")}


@pytest.mark.parametrize("name, error", [("EndpointInService", NotFound('Could not find endpoint "e"')),
                                         ("EndpointInService", ConfigError("AccessDeniedException: not authorized")),
                                         ("EndpointDeleted", Conflict("someone else is updating it")),
                                         ("InferenceComponentDeleted", NotReady("could not reach AWS"))])
def test_an_unexpected_domain_error_propagates(name, error):
    aws = ScriptedAws(endpoint("Creating") if name.startswith("Endpoint") else component("Deleting"), error)
    with pytest.raises(type(error)) as caught:
        wait(aws, name)
    assert caught.value is error and len(aws.calls) == 2


def test_the_deadline_raises_not_ready_naming_the_last_status():
    aws = ScriptedAws(endpoint("Creating"), endpoint("Creating"), endpoint("Updating"))
    began = time.monotonic()
    with pytest.raises(NotReady) as caught:
        wait(aws, deadline_s=0.2, poll_s=0.02)
    assert time.monotonic() - began < 2, "the wait ends on its deadline"
    assert "endpoint e is still Updating after 0.2s" in str(caught.value) and caught.value.retryable is True
    assert "rerun the stage" in caught.value.fix
    assert 3 <= len(aws.calls) <= 12, f"{len(aws.calls)} polls in 0.2 s at 0.02 s apart"


def test_progress_reports_each_status_change_once():
    aws = ScriptedAws(*[endpoint("Creating")] * 4, *[endpoint("Updating")] * 3, endpoint("Creating"),
                      endpoint("InService"))
    (state, _), heard = wait(aws)
    assert state == "success" and len(aws.calls) == 9
    assert heard == ["endpoint e: Creating", "endpoint e: Updating", "endpoint e: Creating", "endpoint e: InService"]

