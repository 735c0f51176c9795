"""Invoking a SageMaker endpoint, SigV4-signed by botocore: `sagemaker-runtime` `InvokeEndpoint` for the gates, and
`InvokeEndpointWithResponseStream` for a streamed answer (a chat endpoint asked `stream: true`).

A channel answers `(status, body)` exactly like the loopback HTTP transport, so the eval runners
and their retry policy are the same on both backends: a model's own error (`ModelError`) comes
back with the container's status and body, throttling and a model not ready yet as
`503 {"retryable": true}`, and a network failure as an OSError the transport retries once.
botocore's own retries are off for invocations: the transport's policy counts and reports them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from shiplift.tasks.backends.aws.service_model import validate_request
from shiplift.tasks.backends.aws.session import error_code
from shiplift.validation.transport import runtime_error_answer


class RuntimeChannel:
    """One worker's `InvokeEndpoint` line to a component (or a single-model endpoint)."""

    def __init__(self, aws, endpoint: str, component: str | None, *, timeout_s: float):
        self.aws, self.endpoint, self.component, self.timeout_s = aws, endpoint, component, timeout_s

    def post(self, body: bytes, timeout_s: float) -> tuple[int, bytes]:
        """Invoke once; the read timeout is the request's (the run's deadline may leave less than the
        configured one)."""
        from botocore import exceptions as bce

        try:
            answer = self._call("InvokeEndpoint", body, timeout_s)
        except bce.ClientError as exc:
            code, message, status = error_code(exc)
            return runtime_error_answer(status or 400, code, {**exc.response, "Message": message})
        with answer["Body"] as stream:
            return 200, stream.read()

    def stream(self, body: bytes, timeout_s: float) -> tuple[int, Iterator[bytes]]:
        """Invoke with `InvokeEndpointWithResponseStream`: 200 and the container's answer part by part as it comes
        (each event's `PayloadPart.Bytes`; server-sent events for a chat request with `stream: true`), or the error
        answer `post` gives. Every read waits at most `timeout_s`; a stream that breaks off (a read timeout, the
        connection, or a `ModelStreamError`/`InternalStreamFailure` event) raises ConnectionError, since its status
        is already given
        (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_runtime_InvokeEndpointWithResponseStream.html)."""
        from botocore import exceptions as bce

        try:
            answer = self._call("InvokeEndpointWithResponseStream", body, timeout_s)
        except bce.ClientError as exc:
            code, message, status = error_code(exc)
            status, error = runtime_error_answer(status or 400, code, {**exc.response, "Message": message})
            return status, iter([error])
        return 200, self._parts(answer["Body"])

    def _parts(self, events) -> Iterator[bytes]:
        """The payload parts of an event stream; its error events and broken reads as ConnectionError."""
        from botocore import exceptions as bce

        try:
            for event in events:
                yield event["PayloadPart"]["Bytes"]
        except bce.EventStreamError as exc:  # ModelStreamError / InternalStreamFailure: the stream ends with it
            code, message, _ = error_code(exc)
            raise ConnectionError(f"InvokeEndpointWithResponseStream {self.endpoint}: {code}: {message}") from exc
        except (bce.ReadTimeoutError, bce.ConnectionClosedError, bce.ResponseStreamingError) as exc:
            raise ConnectionError(f"InvokeEndpointWithResponseStream {self.endpoint}: {exc}") from exc
        finally:
            events.close()

    def _call(self, operation: str, body: bytes, timeout_s: float) -> dict:
        """One runtime call (no botocore retries) with a whole-second read timeout; a network failure is
        ConnectionError, an answered error botocore's ClientError."""
        from botocore import exceptions as bce

        read_timeout = max(1, math.ceil(min(timeout_s, self.timeout_s)))  # whole seconds: a bounded set of clients
        client = self.aws.client("sagemaker-runtime", read_timeout_s=read_timeout, max_attempts=1)
        streamed = operation == "InvokeEndpointWithResponseStream"
        params = {"EndpointName": self.endpoint, "Body": body, "ContentType": "application/json",
                  "Accept": "text/event-stream" if streamed else "application/json"}
        if self.component:
            params["InferenceComponentName"] = self.component
        validate_request("sagemaker-runtime", operation, params)
        try:
            if streamed:
                return client.invoke_endpoint_with_response_stream(**params)
            return client.invoke_endpoint(**params)
        except (bce.EndpointConnectionError, bce.ConnectTimeoutError, bce.ReadTimeoutError,
                bce.ConnectionClosedError) as exc:
            raise ConnectionError(f"{operation} {self.endpoint}: {exc}") from exc

    def close(self) -> None:
        """Nothing to release: the client's connection pool is shared by the run's workers."""


class RuntimeInvoker:
    """Hands each eval worker a channel to one endpoint/component, with a read timeout per request."""

    def __init__(self, aws, endpoint: str, component: str | None, *, timeout_s: float):
        self.aws, self.endpoint, self.component, self.timeout_s = aws, endpoint, component, timeout_s

    def describe(self) -> dict:
        """Where the answers come from, for the gate report."""
        return {"endpoint": self.endpoint, "component": self.component, "region": self.aws.region,
                "via": "sagemaker-runtime"}

    def open(self) -> RuntimeChannel:
        """A channel for one eval worker."""
        return RuntimeChannel(self.aws, self.endpoint, self.component, timeout_s=self.timeout_s)
