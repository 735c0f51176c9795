"""Invocation metrics of live SageMaker components from CloudWatch (namespace AWS/SageMaker)."""

from __future__ import annotations

import datetime as dt
import math

from shiplift.tasks.backends.aws.hosting_requests import component_dimensions
from shiplift.tasks.backends.interfaces import ComponentMetrics
from shiplift.tasks.errors import BadInput

METRICS = {"invocations": ("Invocations", "Sum"), "errors_4xx": ("Invocation4XXErrors", "Sum"),
           "errors_5xx": ("Invocation5XXErrors", "Sum"), "model_errors": ("InvocationModelErrors", "Sum"),
           "latency_p99_ms": ("ModelLatency", "p99")}


class CloudWatchMetrics:
    """`GetMetricData` over a window; inference components by `InferenceComponentName`, else endpoint + variant."""

    per_spec = False  # CloudWatch keeps a component's metrics by component, not by the model each copy serves

    def __init__(self, aws, hosting):
        self.aws, self.hosting = aws, hosting

    def component_metrics(self, endpoint: str, component: str, *, window_s: float,
                          spec_sha256: str | None = None) -> ComponentMetrics:
        """Invocations, 4xx/5xx and model errors, and the p99 ModelLatency in ms, over the last window."""
        if spec_sha256 is not None:
            raise BadInput(
                "CloudWatch keeps an inference component's metrics by component, not by the model each copy serves",
                fix="read the whole component's metrics; during a rollout SageMaker's own alarms watch the component",
            )
        if not (isinstance(window_s, (int, float)) and math.isfinite(window_s) and 60 <= window_s <= 86400):
            raise BadInput(f"window_s={window_s!r} is not 60..86400 seconds",
                           fix="CloudWatch aggregates SageMaker metrics per minute")
        period = 60 * math.ceil(window_s / 60)  # GetMetricData takes multiples of 60 s
        if self.hosting.inference_component(endpoint, component) is not None:
            dimensions = component_dimensions(component)
        else:
            dimensions = [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": component}]
        now = dt.datetime.now(dt.UTC)  # to the end of this minute: datapoints are per minute, and this one counts
        end = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
        queries = [{"Id": key, "ReturnData": True, "MetricStat": {
            "Metric": {"Namespace": "AWS/SageMaker", "MetricName": name, "Dimensions": dimensions},
            "Period": period, "Stat": stat}} for key, (name, stat) in METRICS.items()]
        answer = self.aws.call("cloudwatch", "GetMetricData", MetricDataQueries=queries,
                               StartTime=end - dt.timedelta(seconds=period), EndTime=end)
        values = {r["Id"]: r.get("Values", []) for r in answer.get("MetricDataResults", [])}
        total = {key: int(sum(values.get(key, [])))
                 for key in ("invocations", "errors_4xx", "errors_5xx", "model_errors")}
        latency = values.get("latency_p99_ms") or []
        # ModelLatency is in µs
        return ComponentMetrics(**total, latency_p99_ms=max(latency) / 1000.0 if latency else None)
