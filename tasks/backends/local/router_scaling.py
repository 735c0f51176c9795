"""Scale to zero in the local router, as Application Auto Scaling does on SageMaker, and its emulation of a serverless
endpoint: an idle component's copies are stopped by `python -m shiplift.tasks.backends.local.scaler`; a request that
finds no copy is refused as SageMaker's no-capacity error and starts one (or, serverless, waits up to `hold_s` for
it), and a serverless component throttles requests beyond its `max_concurrency`."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from shiplift.tasks.backends.local.router_metrics import ComponentMetrics
from shiplift.tasks.backends.local.router_model import Component, Rejected

# SageMaker's answer to an invocation of a component with no copy (scaled to zero), which its scale-out alarm counts
# as NoCapacityInvocationFailures
# (https://docs.aws.amazon.com/sagemaker/latest/dg/endpoint-auto-scaling-zero-instances.html)
NO_CAPACITY_MESSAGE = ("Inference Component {} has no capacity to process this request. ApplicationAutoScaling may be "
                       "in-progress (if configured) or try to increase the capacity by invoking "
                       "UpdateInferenceComponentRuntimeConfig API.")
# A serverless endpoint's answer to a request beyond its MaxConcurrency (a throttle the caller retries), and to one
# whose compute did not start in time (https://docs.aws.amazon.com/sagemaker/latest/dg/serverless-endpoints.html)
THROTTLED_MESSAGE = "Endpoint {} is serving its MaxConcurrency of {} requests at once; retry with backoff."
NOT_STARTED_MESSAGE = "Serverless compute for {} did not start within {:g} s; retry."


class ScaleToZeroRouting:
    """The scale-to-zero and serverless steps of `tasks.backends.local.routing.Router`, over the router's components,
    metrics and lock."""

    name: str
    state_dir: Path | None
    lock: threading.Lock
    copies_changed: threading.Condition
    components: dict[str, Component]
    metrics: dict[str, ComponentMetrics]

    def _run_scaler(self, component: Component, copies: int) -> None:
        """Start the scaler for `copies` copies of the component unless one runs (caller holds the lock)."""
        scaling = component.scale_to_zero
        assert scaling is not None and self.state_dir is not None
        if scaling.scaling():
            return
        sys.stderr.write(f"router {self.name}: scaling {component.name} to {copies} "
                         f"cop{'y' if copies == 1 else 'ies'}\n")
        sys.stderr.flush()
        scaling.scaler = subprocess.Popen(
            [sys.executable, "-m", "shiplift.tasks.backends.local.scaler", "--state-dir", str(self.state_dir),
             self.name,
             component.name, str(copies)], stdin=subprocess.DEVNULL, start_new_session=True)

    def no_capacity(self, component: Component) -> bool:
        """For a request to a component scaled to zero: True when it has no copy in rotation, counted as a
        NoCapacityInvocationFailure, and a scaler started for one copy (the scale-out alarm's step). A serverless
        component instead holds the request until its copy is in rotation (False), or raises Rejected when none is
        within `hold_s`."""
        scaling = component.scale_to_zero
        if scaling is None:
            return False
        with self.lock:
            scaling.last_invocation = time.monotonic()
            if any(c.healthy for c in component.copies):
                return False
            if scaling.hold_s is None:
                self.metrics.setdefault(component.name, ComponentMetrics()).no_capacity_invocation_failures += 1
                self._run_scaler(component, 1)
                return True
            deadline = time.monotonic() + scaling.hold_s
            while not (started := any(c.healthy for c in component.copies)) and time.monotonic() < deadline:
                self._run_scaler(component, 1)  # again if a scale-in was running when the request came
                self.copies_changed.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
            scaling.last_invocation = time.monotonic()
        if not started:
            raise Rejected(503, "ServiceUnavailable", NOT_STARTED_MESSAGE.format(component.name, scaling.hold_s))
        return False

    def admit(self, component: Component) -> None:
        """Count a request in flight on a serverless component; Rejected (throttled) beyond its max_concurrency."""
        scaling = component.scale_to_zero
        if scaling is None or scaling.max_concurrency is None:
            return
        with self.lock:
            if scaling.active >= scaling.max_concurrency:
                raise Rejected(429, "ThrottlingException", THROTTLED_MESSAGE.format(self.name, scaling.max_concurrency))
            scaling.active += 1

    def leave(self, component: Component) -> None:
        """The admitted request has been answered."""
        scaling = component.scale_to_zero
        if scaling is None or scaling.max_concurrency is None:
            return
        with self.lock:
            scaling.active -= 1

    def scale_in_idle(self) -> None:
        """Stop the copies of every scale-to-zero component idle for its `idle_s` with nothing in flight."""
        now = time.monotonic()
        with self.lock:
            for component in self.components.values():
                scaling = component.scale_to_zero
                busy = any(c.outstanding for c in component.copies + component.draining)
                if (scaling is not None and not scaling.warm and component.copies and not busy and not scaling.scaling()
                        and not scaling.active and now - scaling.last_invocation >= scaling.idle_s):
                    self._run_scaler(component, 0)
