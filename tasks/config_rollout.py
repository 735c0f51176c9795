"""The release config's rollout and scale-to-zero parts (DESIGN §2): how new copies replace the old ones, and when
production's copies go to zero; each model turns into the backend's plan (`tasks.backends.interfaces`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from shiplift.tasks.backends.interfaces import BakeAlarms, RolloutPlan, ScaleToZeroPlan
from shiplift.tasks.config_types import Strict
from shiplift.validation.thresholds import DefaultsUnwritten


class AllAtOnce(Strict):
    """Replace every copy at once (the previous release keeps serving until the new copies are ready)."""

    strategy: Literal["all_at_once"]
    copies: int = Field(1, ge=1, le=16)

    def plan(self) -> RolloutPlan:
        return RolloutPlan(strategy="all_at_once")


class CapacitySize(Strict):
    """A number of copies, counted as SageMaker's InferenceComponentCapacitySize counts them."""

    type: Literal["COPY_COUNT", "CAPACITY_PERCENT"] = "COPY_COUNT"
    value: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _percent(self) -> CapacitySize:
        if self.type == "CAPACITY_PERCENT" and self.value > 100:
            raise ValueError(f"a CAPACITY_PERCENT value is at most 100, got {self.value}")
        return self

    def copies_of(self, total: int) -> int:
        """The copies this size means out of `total` (a percentage rounds down, to at least one copy)."""
        return min(total, self.value) if self.type == "COPY_COUNT" else max(1, total * self.value // 100)


class OnlineGate(Strict, DefaultsUnwritten):
    """A labelled canary set replayed through the live component in every bake, judged on the candidate's own
    answers against the champion's under the release's thresholds and champion rule. A gate that has not decided at
    the end of a bake's replay follows validation.inconclusive.choice (extend: `extend_rounds` more; else it blocks)."""

    split: str = Field("test", min_length=1, description="the split of the release's validation datasets replayed")
    max_tasks: int = Field(64, ge=1, le=10_000, description="at most this many tasks of that split, in file order")
    rounds: int = Field(4, ge=1, le=32, description="resends of tasks a champion copy answered, per bake")
    concurrency: int = Field(1, ge=1, le=64, description="requests in flight at once: the canary set is a probe, not "
                             "load, so its latencies are the copies' own")
    extend_rounds: int = Field(8, ge=1, le=256,
                               description="with validation.inconclusive.choice extend: the most extra "
                               "rounds one bake replays while the gate has not decided, before it blocks")

    unwritten_defaults: ClassVar[tuple[str, ...]] = ("extend_rounds",)


class RollingUpdate(Strict):
    """Batches of copies with a bake after each, parameters as SageMaker's RollingUpdatePolicy takes them."""

    copies: int = Field(2, ge=2, le=16)
    alarms: BakeAlarms = BakeAlarms()
    online_gate: OnlineGate | None = None
    batch: CapacitySize = CapacitySize()
    wait_interval_s: int = Field(300, ge=0, le=3600, description="bake after each batch (WaitIntervalInSeconds)")
    rollback_batch: CapacitySize | None = Field(None, description="copies rolled back at a time; unset: all at once")
    maximum_execution_timeout_s: int = Field(3600, ge=600, le=28800, description="MaximumExecutionTimeoutInSeconds")

    @model_validator(mode="after")
    def _batch_leaves_old_copies(self) -> RollingUpdate:
        if self.batch.copies_of(self.copies) >= self.copies:
            raise ValueError(
                f"a batch of {self.batch.copies_of(self.copies)} of {self.copies} copies replaces them all at once; "
                "make the batch smaller than rollout.copies, or use strategy all_at_once"
            )
        return self

    def plan(self) -> RolloutPlan:
        return RolloutPlan(
            strategy=self.strategy,
            batch_copies=self.batch.copies_of(self.copies),
            wait_interval_s=self.wait_interval_s,
            rollback_batch_copies=self.rollback_batch.copies_of(self.copies) if self.rollback_batch else None,
            max_execution_s=self.maximum_execution_timeout_s,
            alarms=self.alarms,
            online_gate=self.online_gate is not None,
        )


class Canary(RollingUpdate):
    """One batch of new copies, a bake, then the rest."""

    strategy: Literal["canary"]


class Linear(RollingUpdate):
    """Equal batches of new copies, a bake after each."""

    strategy: Literal["linear"]


BLUE_GREEN_REFUSED = (
    "rollout.strategy blue_green is not offered: on inference-component endpoints every caller names the "
    "component it invokes (InferenceComponentName), so a second, green component gets no traffic until every "
    "caller changes, and going back means changing them all again. A rolling update replaces the copies behind "
    "the one name instead; use canary (one batch, a bake, then the rest) or linear (equal batches, a bake after each)"
)


class BlueGreen(Strict):
    """Refused with the reason, so an old config says what to use instead."""

    strategy: Literal["blue_green"]

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        raise ValueError(BLUE_GREEN_REFUSED)


Rollout = Annotated[AllAtOnce | Canary | Linear | BlueGreen, Field(discriminator="strategy")]


class ScaleToZero(Strict):
    """Production's copies scale in to zero after `idle_s` without a request and a copy starts again on the first
    request that finds none (that request and those during the start fail retryably; callers retry). The gate
    measures `cold_starts` starts of the candidate from zero, each until its first answer, and fails the release
    when their p95 is above `max_cold_start_p95_s` (docs/fleet.md, "Scale to zero")."""

    max_copies: int | None = Field(None, ge=1, le=64, description="most copies a busy component scales out to; "
                                   "unset: rollout.copies")
    idle_s: int = Field(900, ge=1, le=86400, description="seconds without an invocation before the copies go "
                        "(aws: the target-tracking policy's ScaleInCooldown)")
    invocations_per_copy: float = Field(10.0, gt=0, le=1e6, description="target invocations per copy and minute "
                                        "(aws: SageMakerInferenceComponentInvocationsPerCopy)")
    cold_starts: int = Field(3, ge=1, le=20, description="starts from zero the gate measures on the candidate")
    max_cold_start_p95_s: float = Field(gt=0, le=3600, allow_inf_nan=False,
                                        description="the gate's bound on the p95 of those starts, each from the first "
                                        "request to its answer")

    def plan(self, copies: int) -> ScaleToZeroPlan:
        return ScaleToZeroPlan(max_copies=self.max_copies or copies, idle_s=self.idle_s,
                               invocations_per_copy=self.invocations_per_copy)
