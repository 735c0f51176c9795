"""The one thin call wrapper the hosting parts share: SageMaker calls (and Application Auto Scaling's and CloudWatch's),
paged lists, tags, the describes several parts read, and the wait for a component to settle before it is changed."""

from __future__ import annotations

from collections.abc import Callable

from shiplift.tasks.backends.aws.backend_config import AwsBackend
from shiplift.tasks.backends.aws.session import Aws
from shiplift.tasks.backends.aws.waiters import wait_for
from shiplift.tasks.backends.interfaces import DEPLOY_WAIT_S, TEARDOWN_WAIT_S, Progress
from shiplift.tasks.errors import NotFound

COMPONENT_WAIT_S = DEPLOY_WAIT_S // 2  # with the endpoint's (hosting_deploy.ENDPOINT_WAIT_S): the stage table's
DELETE_WAIT_S = TEARDOWN_WAIT_S // 2  # a component, then the endpoint
# SageMaker refuses UpdateInferenceComponent in these (reported, not on its API page)
UNSETTLED = ("Creating", "Updating")


def failure_reason(answer: dict | None) -> str:
    """SageMaker's FailureReason of a describe answer, or a note that it gave none."""
    return (answer or {}).get("FailureReason") or "(SageMaker gave no FailureReason)"


def current_copies(live: dict | None) -> int:
    """The copies a component's description says are deployed now (CurrentCopyCount)."""
    return int(((live or {}).get("RuntimeConfig") or {}).get("CurrentCopyCount") or 0)


class SageMakerCalls:
    """The session, the backend's config and the poll interval every hosting part calls AWS with."""

    def __init__(self, aws: Aws, backend: AwsBackend, *, poll_s: float):
        self.aws, self.backend, self.poll_s = aws, backend, poll_s

    def call(self, service: str, operation: str, **params) -> dict:
        """One call of any service the hosting uses (SageMaker, Application Auto Scaling, CloudWatch)."""
        return self.aws.call(service, operation, **params)

    def sm(self, operation: str, **params) -> dict:
        """One SageMaker call."""
        return self.call("sagemaker", operation, **params)

    def pages(self, service: str, operation: str, key: str, **params) -> list[dict]:
        """Every item of a call paged with NextToken (SageMaker, Application Auto Scaling, CloudWatch)."""
        items, token = [], None
        while True:
            page = self.call(service, operation, **params, **({"NextToken": token} if token else {}))
            items.extend(page.get(key, []))
            token = page.get("NextToken")
            if not token:
                return items

    def sm_list(self, operation: str, key: str, **params) -> list[dict]:
        """Every item of a paged SageMaker list call."""
        return self.pages("sagemaker", operation, key, **params)

    def tags(self, arn: str) -> dict[str, str]:
        """A SageMaker resource's tags, as a dict."""
        return {t["Key"]: t["Value"] for t in self.sm("ListTags", ResourceArn=arn).get("Tags", [])}

    def describe_endpoint(self, endpoint: str) -> dict | None:
        """DescribeEndpoint's answer, or None when there is no such endpoint."""
        try:
            return self.sm("DescribeEndpoint", EndpointName=endpoint)
        except NotFound:
            return None

    def inference_component(self, endpoint: str, component: str) -> dict | None:
        """The component's description when it runs on `endpoint`; None for a single-model endpoint's variant."""
        try:
            live = self.sm("DescribeInferenceComponent", InferenceComponentName=component)
        except NotFound:
            return None
        return live if live.get("EndpointName") == endpoint else None

    def config_of(self, live_endpoint: dict) -> dict | None:
        """The endpoint config a described endpoint runs, or None when it is gone (or the endpoint names none)."""
        try:
            return self.sm("DescribeEndpointConfig", EndpointConfigName=live_endpoint["EndpointConfigName"])
        except (NotFound, KeyError):
            return None

    def model(self, name: str | None) -> dict | None:
        """DescribeModel's answer with the model's tags under "tags", or None when there is no such model."""
        if not name:
            return None
        try:
            model = self.sm("DescribeModel", ModelName=name)
        except NotFound:
            return None
        return {**model, "tags": self.tags(model["ModelArn"])}

    def wait(self, component: str, *, deadline_s: float, progress: Progress,
             on_poll: Callable[[dict], None] | None = None) -> tuple[str, dict | None]:
        """Poll the component until it is InService or fails (waiters.json's InferenceComponentInService); `on_poll`
        sees each answer before that (a rolling update's bake runs there)."""
        return wait_for(self.aws, "InferenceComponentInService", {"InferenceComponentName": component},
                        deadline_s=deadline_s, poll_s=self.poll_s, progress=progress,
                        what=f"inference component {component}", on_poll=on_poll)

    def settled(self, component: str, progress: Progress, *, deadline_s: float) -> dict | None:
        """Wait (deadline) until the component is neither Creating nor Updating, which SageMaker refuses to update (a
        reported behaviour that API_UpdateInferenceComponent does not state; waiting is right either way): its
        description, or None once a deletion in progress removed it."""
        _, answer = self.wait(component, deadline_s=deadline_s, progress=progress)
        if (answer or {}).get("InferenceComponentStatus") == "Deleting":
            wait_for(self.aws, "InferenceComponentDeleted", {"InferenceComponentName": component},
                     deadline_s=DELETE_WAIT_S, poll_s=self.poll_s, progress=progress,
                     what=f"inference component {component}")
            return None
        return answer
