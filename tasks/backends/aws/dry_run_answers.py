"""What the dry run's account (`dry_run_account.FreshAccount`) answers with: an answer or the error the service
sends, the SageMaker hosting resources' names and list shapes, the notes on what a wait polls, and the deterministic
placeholders and response pieces (a body stream, a UUID, a variant as it serves) it builds its answers from."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from datetime import UTC, datetime

THEN = datetime(2000, 1, 1, tzinfo=UTC)  # every time the account answers


def placeholder_hex(what: str, release_id: str) -> str:
    """A deterministic sha256-shaped stand-in for a value only a real build or AWS can know."""
    return hashlib.sha256(f"shiplift-dry-run:{what}:{release_id}".encode()).hexdigest()


@dataclass
class Answer:
    """What the account answers one call: botocore's parsed response, its HTTP status, and a note for the plan."""

    parsed: dict
    status: int = 200
    note: str | None = None


class Refusal(Exception):
    """An error answer, raised by botocore as the ClientError the service would send."""

    def __init__(self, code: str, message: str, status: int = 400, note: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.status, self.note = code, message, status, note


# SageMaker hosting resources: the name parameter, the ARN's resource type, and how SageMaker names it when it finds
# none
HOSTING = {
    "Model": ("ModelName", "model", "model"),
    "EndpointConfig": ("EndpointConfigName", "endpoint-config", "endpoint configuration"),
    "Endpoint": ("EndpointName", "endpoint", "endpoint"),
    "InferenceComponent": ("InferenceComponentName", "inference-component", "inference component"),
}
LISTED = {  # what a List call's summary of each resource holds (SageMaker's *Summary shapes)
    "Model": ("ModelName", "ModelArn", "CreationTime"),
    "EndpointConfig": ("EndpointConfigName", "EndpointConfigArn", "CreationTime"),
    "InferenceComponent": ("InferenceComponentName", "InferenceComponentArn", "EndpointName", "EndpointArn",
                           "VariantName", "InferenceComponentStatus", "CreationTime", "LastModifiedTime"),
}
# the notes on the describes a wait polls (the account answers the end of the wait at once)
CREATED = "polled until InService (any other terminal status fails)"
UPDATED = "polled until InService; on the candidate's model is success, on the old one a failed promotion"
ROLLING = "polled until the update ends; meanwhile the alarms are read every rollout.alarms.check_interval_s"
ROLLED = "the update has ended: InService on the candidate's model is success, on the old one a rollback"
DELETED = "polled until it is gone"
COPIES = "polled until InService with the new copy count, desired and current"
RELEASED = ("polled until CurrentInstanceCount is 0: no component has a copy and MinInstanceCount is 0, so the "
            "endpoint gives back its instances (on AWS minutes after the last copy stops)")
BUILT = "polled until the build ends"


def _body(data: bytes):
    """A response body as botocore hands it over: a stream."""
    from botocore.response import StreamingBody

    return StreamingBody(io.BytesIO(data), len(data))


def _uuid(digits: str) -> str:
    return "-".join(digits[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))


def _copies(count: int) -> dict:
    return {"DesiredCopyCount": count, "CurrentCopyCount": count}


def _serving(variant: dict, *, released: bool = False) -> dict:
    """What DescribeEndpoint says of a config's variant once it serves: its instances, from the first pool by priority
    (none once `released`: the endpoint gave them back)."""
    if "ServerlessConfig" in variant:  # no instances (API_DescribeEndpoint: CurrentServerlessConfig instead)
        return {"VariantName": variant["VariantName"], "CurrentServerlessConfig": dict(variant["ServerlessConfig"]),
                "DesiredServerlessConfig": dict(variant["ServerlessConfig"])}
    count = 0 if released else variant.get("InitialInstanceCount", 1)
    serving = {"VariantName": variant["VariantName"], "CurrentInstanceCount": count, "DesiredInstanceCount": count}
    if variant.get("InstancePools"):
        first = min(variant["InstancePools"], key=lambda pool: pool["Priority"])
        serving["InstancePools"] = [{"InstanceType": pool["InstanceType"],
                                     "CurrentInstanceCount": count if pool is first else 0}
                                    for pool in variant["InstancePools"]]
    return serving
