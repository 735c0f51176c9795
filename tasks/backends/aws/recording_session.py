"""A recording, validating boto3 session for the dry run: its clients answer from a model of a fresh account and
send nothing.

`recording_session(plan, account)` is a boto3 Session with dummy credentials (so no credential chain is searched)
whose every call, as botocore receives it, is checked against the installed service model
(`service_model.validate_request`: maximum lengths, enums and patterns too), recorded in the `Plan` under its current
stage, and answered by `FreshAccount` through botocore's `before-call` event (as botocore's Stubber does), never by the
network. `FreshAccount` is a small explicit model of the config's account and region after the README's first-run
steps (its bucket, checkpoint bucket and ECR repository exist) where nothing of the release does: a describe of what
is not created answers the error the backend reads as "not found"; what is created is described back with what was
sent, in its terminal success state (InService, SUCCEEDED), so each wait ends at its first poll (a rolling update at
its second, so that its check of the alarms is seen). Values only AWS or a real build can know (UploadIds, ETags,
build ids, image digests) are deterministic placeholders, registered with the plan so the requests that carry them
say so.

The account lives beside this module: `dry_run_account` (`FreshAccount`, what it keeps and how it answers each
operation) and `dry_run_answers` (an answer or a refusal, the SageMaker shapes it describes, the waits' notes).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shiplift.tasks.backends.aws.dry_run_account import FreshAccount
from shiplift.tasks.backends.aws.dry_run_answers import placeholder_hex
from shiplift.tasks.backends.aws.service_model import validate_request

__all__ = ["FreshAccount", "Plan", "Request", "placeholder_hex", "recording_session"]  # what the dry run imports here

BODY_SHOWN_BYTES = 1 << 20  # a larger body (a part of a multipart upload) is kept as its printed size only
ANSWER = "shiplift_dry_run_answer"  # where the answer waits in botocore's request context, from parameter build to send


@dataclass
class Request:
    """One request the release would send; `placeholders` names the parameters holding a placeholder, and why."""

    stage: str
    service: str
    operation: str
    params: dict[str, Any]
    placeholders: dict[str, str] = field(default_factory=dict)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The printed line: stage, service, operation, params (bodies as text or a size), placeholders, note."""
        line: dict[str, Any] = {"stage": self.stage, "service": self.service, "operation": self.operation,
                                "params": _printable(self.params)}
        if self.placeholders:
            line["placeholders"] = self.placeholders
        if self.note:
            line["note"] = self.note
        return line


def _printable(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value[:BODY_SHOWN_BYTES]).decode("utf-8", errors="replace")
        return text if text.startswith("{") else f"<{len(value)} bytes>"
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


class Plan:
    """Collects validated requests and marks every parameter that carries a placeholder value."""

    def __init__(self):
        self.requests: list[Request] = []
        self.stage = "preflight"
        self.placeholders: dict[str, str] = {}  # placeholder text -> what it stands for

    def stand_in(self, value: str, what: str) -> str:
        """Register a placeholder value so every parameter holding it is marked (also in requests recorded before)."""
        self.placeholders[value] = what
        return value

    def add(self, service: str, operation: str, /, *, note: str | None = None, **params: Any) -> Request:
        """Validate and record one request (BadInput naming every problem when the service model refuses it)."""
        validate_request(service, operation, params)
        body = params.get("Body")
        if isinstance(body, (bytes, bytearray)) and len(body) > BODY_SHOWN_BYTES:
            params["Body"] = _printable(body)
        request = Request(self.stage, service, operation, params, note=note)
        self.requests.append(request)
        return request

    def marked(self) -> list[Request]:
        """Every request, each parameter holding a registered placeholder marked with what it stands for."""
        for request in self.requests:
            _mark(request.params, "", self.placeholders, request.placeholders)
        return self.requests


def _mark(value: Any, path: str, placeholders: dict[str, str], marked: dict[str, str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _mark(item, f"{path}.{key}" if path else key, placeholders, marked)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _mark(item, f"{path}[{index}]", placeholders, marked)
    elif isinstance(value, (str, bytes)):
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        found = [what for stand_in, what in placeholders.items() if stand_in in text]
        if found:
            marked[path] = "; ".join(dict.fromkeys(found))


def recording_session(plan: Plan, account: FreshAccount):
    """A boto3 Session whose clients validate and record each call in `plan` and answer it from `account`."""
    import boto3
    import botocore.session
    from botocore.awsrequest import AWSResponse

    core = botocore.session.Session()  # reads no profile, config or credentials file of this machine (AWS_PROFILE, …)
    for name, value in (("profile", None), ("config_file", os.devnull), ("credentials_file", os.devnull)):
        core.get_component("config_store").set_config_variable(name, value)
    session = boto3.Session(botocore_session=core, aws_access_key_id="dry-run", aws_secret_access_key="dry-run",
                            region_name=account.region)

    def record(params: dict, model, context: dict, **_) -> None:
        service, operation = model.service_model.service_name, model.name
        # a copy: botocore's own handlers rewrite the params after this one (UploadPart's Body becomes a file)
        request = plan.add(service, operation, **copy.deepcopy(params))
        context[ANSWER] = answer = account.answer(service, operation, params)
        request.note = answer.note

    def respond(context: dict, **_) -> tuple:
        answer = context.pop(ANSWER)
        return AWSResponse(None, answer.status, {}, None), answer.parsed

    # the first event with the caller's params (botocore's own `before-parameter-build` handlers rewrite them), and the
    # last before the request would be signed and sent
    session.events.register("provide-client-params", record)
    session.events.register_first("before-call", respond)
    return session
