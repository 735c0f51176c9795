"""Bake-time alarms of a rolling update: read the new model's own metrics during each wait interval.

The same `BakeAlarms` rules name the thresholds on every backend. Locally they are evaluated here against
the metrics seam (`Metrics.component_metrics(..., spec_sha256=...)`), so an alarm judges only the copies
that serve the candidate's spec, even while old copies still answer beside them; on aws the hosting sends
them as CloudWatch alarms that SageMaker's rolling update watches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shiplift.tasks.backends.interfaces import ComponentMetrics, LiveComponent, Metrics, RolloutStep
from shiplift.tasks.errors import NotFound


def first_alarm(verdicts: dict[str, str | None]) -> str | None:
    """The first alarm message among per-rule verdicts (the one that rolls back), or None."""
    return next((message for message in verdicts.values() if message), None)


def judge(metrics: ComponentMetrics, rules) -> dict[str, str | None]:
    """Each rule of `rules` (a BakeAlarms) over these metrics: its alarm message when it breaches, else None."""
    verdicts: dict[str, str | None] = {"error_rate": None, "latency_p99": None}
    if metrics.invocations < rules.min_invocations:
        return verdicts
    failed = max(metrics.errors_5xx, metrics.model_errors)  # a 5xx from the model counts once, as CloudWatch does
    rate = failed / metrics.invocations
    if rate > rules.max_error_rate:
        verdicts["error_rate"] = (f"error rate {rate:.3f} ({failed} of {metrics.invocations} answers were 5xx or model "
                                  f"errors) is over rollout.alarms.max_error_rate {rules.max_error_rate}")
    p99 = metrics.latency_p99_ms
    if rules.max_latency_p99_ms is not None and p99 is not None and p99 > rules.max_latency_p99_ms:
        verdicts["latency_p99"] = (f"latency p99 {p99:.1f} ms is over rollout.alarms.max_latency_p99_ms "
                                   f"{rules.max_latency_p99_ms:g}")
    return verdicts


def live_summary(live: LiveComponent | None) -> dict[str, Any] | None:
    """What the backend describes as serving, for a traffic step's record: status, model, artifact sha256, image
    digest and copies (mid-rollout, locally the spec being rolled to; on SageMaker the one the update started from)."""
    if live is None:
        return None
    return {"status": live.status, "release_id": live.model_ref.release_id if live.model_ref else None,
            "artifact_sha256": live.artifact_sha256, "image_digest": live.image_digest, "copies": live.copies}


def mid_update(step: RolloutStep) -> bool:
    """Whether `step` is a check SageMaker's rolling update is still baking (aws): its batches still move, and the
    backend cannot tell which copies run the new spec."""
    return step.check is not None and step.old_copies is None


def update_ended(step: RolloutStep) -> bool:
    """Whether `step` is SageMaker's update seen ended with every copy on the new spec (aws, `old_copies` 0): no batch
    bakes any more and its alarms no longer roll back, so an online gate must decide here."""
    return step.check is not None and step.old_copies == 0


class BakeWatch:
    """A bake: after each batch, replay the online gate's canary set (when there is one; a gate that has not decided by
    the end of a batch's replay raises its alarm, `validation.online_gate.OnlineGate.alarm`), then, where the metrics
    split by spec (local), for `wait_s` read the new copies' metrics every `rules.check_interval_s`; the first
    alarm (which rolls back) ends it. Where they do not (aws), the bake is the gate's round alone and SageMaker's
    alarms judge the metrics; a check mid-update records an undecided gate (its batches still bake), and the step
    once the update has ended (`update_ended`) gets no new round, only the extension its inconclusive choice allows,
    then raises the gate's alarm if it has not passed; where this watch replayed no round before (a rerun after a
    crash between the update's end and its verdict, or the stage run after a deferred promote's polls, each of which
    judged its own check), it replays one then, on every copy new, so the verdict rests on answers it saw. What the
    gate saw, and each alarm's state, is kept per step (`evidence`, by `RolloutStep.key()`) for the verdict record the
    promote stage appends the moment the bake returns."""

    def __init__(self, metrics: Metrics, endpoint: str, component: str, spec_sha256: str, rules, wait_s: float, *,
                 online_gate: Any = None, describe: Callable[[], LiveComponent | None] | None = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic):
        self.metrics, self.endpoint, self.component, self.spec_sha256 = metrics, endpoint, component, spec_sha256
        self.rules, self.wait_s, self.online_gate, self.describe = rules, wait_s, online_gate, describe
        self.sleep, self.clock = sleep, clock
        self.evidence: dict[tuple, dict[str, Any]] = {}
        self.replayed = False  # whether this watch replayed the gate's canary set yet

    def _read(self) -> dict[str, str | None]:
        try:
            seen = self.metrics.component_metrics(self.endpoint, self.component, window_s=max(60.0, self.wait_s),
                                                  spec_sha256=self.spec_sha256)
        except NotFound:
            return {}  # the new copies have answered nothing yet
        return judge(seen, self.rules)

    def __call__(self, step: RolloutStep) -> str | None:
        deadline = self.clock() + self.wait_s
        evidence = self.evidence.setdefault(step.key(), {})
        if self.describe is not None:
            evidence["live"] = live_summary(self.describe())
        verdicts: dict[str, str | None] = {}
        if self.online_gate is not None:
            if update_ended(step) and self.replayed:
                self.online_gate.extend()  # the bake is over: only the release's inconclusive choice may add rounds
            else:  # a batch's round; or the update's end seen by a run that watched none of its checks (a rerun after
                self.online_gate.replay()  # a crash, a deferred promote's stage): the gate judges on a round of its own
                self.replayed = True
            evidence["online_gate"] = self.online_gate.evidence()
            undecided = evidence["online_gate"].get("decision") == "inconclusive"
            # a batch's bake ends here (local), so an undecided gate blocks; a SageMaker check comes mid-update, while
            # its batches still bake: there the gate's undecided state is recorded, and only a failure is raised
            verdicts["online_gate"] = None if undecided and mid_update(step) else self.online_gate.alarm()
        while self.metrics.per_spec:
            verdicts.update(self._read())
            evidence["alarm_states"] = {name: "ALARM" if message else "OK" for name, message in verdicts.items()}
            if any(verdicts.values()) or self.clock() >= deadline:
                break
            self.sleep(min(self.rules.check_interval_s, deadline - self.clock()))
        return first_alarm(verdicts)

