"""Invoking a SageMaker endpoint for the gates: `sagemaker-runtime` `InvokeEndpoint`, SigV4-signed by botocore.

A channel answers `(status, body)` exactly like the loopback HTTP transport, so the eval runners
and their retry policy are the same on both backends: a model's own error (`ModelError`) comes
back with the container's status and body, throttling and a model not ready yet as
`503 {"retryable": true}`, and a network failure as an OSError the transport retries once.
botocore's own retries are off for invocations: the transport's policy counts and reports them.
"""

from __future__ import annotations

import math

from tasks.backends.aws.service_model import validate_request
from tasks.backends.aws.session import error_code
from validation.transport import runtime_error_answer


class RuntimeChannel:
    """One worker's `InvokeEndpoint` line to a component (or a single-model endpoint)."""

    def __init__(self, aws, endpoint: str, component: str | None, *, timeout_s: float):
        self.aws, self.endpoint, self.component, self.timeout_s = aws, endpoint, component, timeout_s

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """Invoke once; the read timeout is the request's (the run's deadline may leave less than the configured one)."""
        from botocore import exceptions as bce

        read_timeout = max(1, math.ceil(min(timeout_s, self.timeout_s)))  # whole seconds: a bounded set of clients
        client = self.aws.client("sagemaker-runtime", read_timeout_s=read_timeout, max_attempts=1)

        params = {"EndpointName": self.endpoint, "Body": body, "ContentType": "application/json", "Accept": "application/json"}
        if self.component:
            params["InferenceComponentName"] = self.component
        validate_request("sagemaker-runtime", "InvokeEndpoint", params)
        try:
            answer = client.invoke_endpoint(**params)
        except bce.ClientError as exc:
            code, message, status = error_code(exc)
            return runtime_error_answer(status or 400, code, {**exc.response, "Message": message})
        except (bce.EndpointConnectionError, bce.ConnectTimeoutError, bce.ReadTimeoutError, bce.ConnectionClosedError) as exc:
            raise ConnectionError(f"InvokeEndpoint {self.endpoint}: {exc}") from exc
        with answer["Body"] as stream:
            return 200, stream.read()

    def close(self) -> None:
        """Nothing to release: the client's connection pool is shared by the run's workers."""


class RuntimeInvoker:
    """Hands each eval worker a channel to one endpoint/component, with a read timeout per request."""

    def __init__(self, aws, endpoint: str, component: str | None, *, timeout_s: float):
        self.aws, self.endpoint, self.component, self.timeout_s = aws, endpoint, component, timeout_s

    def describe(self) -> dict:
        """Where the answers come from, for the gate report."""
        return {"endpoint": self.endpoint, "component": self.component, "region": self.aws.region, "via": "sagemaker-runtime"}

    def open(self) -> RuntimeChannel:
        """A channel for one eval worker."""
        return RuntimeChannel(self.aws, self.endpoint, self.component, timeout_s=self.timeout_s)
