"""The local backend's rolling update: a running component moved to a new spec batch by batch, each batch baked, and
rolled back batch by batch on an alarm.

It keeps the rollout's logic (batches, bakes, resume, rollback) apart from `supervisor.ProcessSupervisor`, which only
starts, persists, heals and stops processes: the rollout drives it through its process operations (`component_locked`,
`claim`, `shift`, `forget_dead_copies`, `commit`) under the component's own lock, persisting every step before it is
taken. The endpoint's lock is held only for each step's short write, never through a bake, so the other components of
a shared endpoint scale, wake from zero, roll out and roll back while this one bakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shiplift.tasks.backends.interfaces import Bake, Progress, RolloutPlan, RolloutResult, RolloutStep
from shiplift.tasks.backends.local.endpoint_state import ComponentState, EndpointState, ProcessSpec, check_name
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.errors import BadInput, NotFound


def roll_out(
    supervisor: ProcessSupervisor,
    endpoint: str,
    component: str,
    spec: ProcessSpec,
    plan: RolloutPlan,
    bake: Bake,
    *,
    ready_timeout_s: float = 120,
    drain_timeout_s: float = 90,
    progress: Progress = lambda _line: None,
    on_rollback_step: Callable[[RolloutStep], None] = lambda _step: None,
) -> RolloutResult:
    """Move a running component to `spec` batch by batch: start a batch of new copies, wait for their
    /ping, shift them into rotation, drain and stop as many old ones, then `bake` the step (it watches
    the wait interval and returns the alarm that fired, or None). An alarm rolls back batch by batch
    and the old spec serves again, each rollback batch told to `on_rollback_step` as soon as it is in
    rotation. Every step is persisted first, so a rerun after a crash resumes the same rollout (or rolls
    back one to another spec) and never leaves two half-states. On a shared endpoint the rollout first claims
    room for its peak (`peak_copies`): CapacityError, changing nothing, where it does not fit beside the others."""
    check_name("endpoint", endpoint)
    check_name("component", component)
    if not isinstance(spec, ProcessSpec) or not isinstance(plan, RolloutPlan):
        raise BadInput("roll_out takes a ProcessSpec and a RolloutPlan", fix="build them with their models")
    deadline = time.monotonic() + plan.max_execution_s
    timeouts = (ready_timeout_s, drain_timeout_s)
    digest = spec.sha256()
    with supervisor.component_locked(endpoint, component) as state:
        comp = state.components.get(component)
        if comp is None:
            raise NotFound(
                f"component {component} is not on endpoint {endpoint}; a rolling update replaces running copies",
                fix="deploy it first (put_component), then roll out the next spec",
            )
        if comp.previous is not None and comp.spec_sha256 != digest:
            progress(f"{endpoint}/{component}: rolling back an interrupted rollout to spec "
                     f"{comp.spec_sha256[:12]} first")
            _roll_back(supervisor, state, component, plan, timeouts, [], progress)
        if comp.previous is None and supervisor.serves(comp, digest, spec.copies):
            return RolloutResult(status="unchanged")
        supervisor.claim(state, component, spec, peak_copies(plan, (comp.previous or comp.spec).copies, spec.copies))
        _begin(supervisor, state, component, comp, spec, digest)
        old_sha, old_count = comp.previous.sha256(), comp.previous.copies
        targets = plan.targets(spec.copies)
        steps: list[RolloutStep] = []
        for number, target in enumerate(targets, 1):
            supervisor.forget_dead_copies(state, component)  # a copy that died mid-rollout is started again below
            new, old = comp.running(digest), comp.not_running(digest)
            keep_old = old_count - (old_count * target) // spec.copies
            if len(new) >= target and len(old) <= keep_old:
                continue  # done before an interruption
            if time.monotonic() > deadline:
                reason = f"the rollout passed its maximum execution time of {plan.max_execution_s:g}s"
                _roll_back(supervisor, state, component, plan, timeouts, steps, progress, on_rollback_step)
                return RolloutResult(status="rolled_back", reason=reason, steps=tuple(steps))
            supervisor.shift(state, component, spec, max(0, target - len(new)),
                             old[: max(0, len(old) - keep_old)], timeouts)
            step = RolloutStep(phase="rollout", batch=number, batches=len(targets),
                               old_copies=len(comp.running(old_sha)), new_copies=len(comp.running(digest)),
                               old_spec_sha256=old_sha, new_spec_sha256=digest)
            progress(f"{endpoint}/{component}: batch {number}/{len(targets)}: {step.new_copies} new, "
                     f"{step.old_copies} old copies serving; baking {plan.wait_interval_s:g}s")
            alarm = bake(step)
            steps.append(step.model_copy(update={"alarm": alarm}))
            if alarm:
                progress(f"{endpoint}/{component}: alarm {alarm}; rolling back")
                _roll_back(supervisor, state, component, plan, timeouts, steps, progress, on_rollback_step)
                return RolloutResult(status="rolled_back", reason=alarm, steps=tuple(steps))
        supervisor.forget_dead_copies(state, component)
        missing = spec.copies - len(comp.running(digest))
        if missing > 0:  # a copy died during the last bake: end at the spec's copy count all the same
            progress(f"{endpoint}/{component}: {missing} new copies died during the bake; starting them again")
            supervisor.shift(state, component, spec, missing, [], timeouts)
        comp.previous = None
        supervisor.commit(state, component)
    return RolloutResult(status="succeeded", steps=tuple(steps))


def _begin(supervisor: ProcessSupervisor, state: EndpointState, component: str, comp: ComponentState,
           spec: ProcessSpec, digest: str) -> None:
    """Persist `spec` as the component's spec and the running one as its previous, unless a rollout (to `spec`) is
    already under way; each running copy is marked with the spec it runs first. The copies scaling asked for last
    (none, where the component had scaled to zero) give way to the spec's count, which the rollout starts."""
    if comp.previous is None:
        for copy in comp.copies:
            copy.spec_sha256 = copy.spec_sha256 or comp.spec_sha256
        comp.previous, comp.spec, comp.spec_sha256, comp.desired = comp.spec, spec, digest, None
        supervisor.commit(state, component)


def peak_copies(plan: RolloutPlan, old_count: int, copies: int) -> int:
    """The most copies `roll_out` runs at once: each batch's new copies start beside the old copies still serving,
    which then drop to their share of the batches not yet moved (the rule SageMaker's rolling update counts)."""
    peak, old = old_count, old_count
    for target in plan.targets(copies):
        peak = max(peak, old + target)
        old = old_count - (old_count * target) // copies
    return peak


def _roll_back(
    supervisor: ProcessSupervisor, state: EndpointState, component: str, plan: RolloutPlan,
    timeouts: tuple[float, float], steps: list[RolloutStep], progress: Progress,
    told: Callable[[RolloutStep], None] = lambda _step: None,
) -> None:
    """Return the component to its previous spec, `plan.rollback_batch_copies` copies at a time (all at once
    without it), recording each step and telling it to `told` when it is in rotation; the new spec's copies
    leave rotation and drain first."""
    comp = state.components[component]
    previous = comp.previous
    assert previous is not None
    old_sha, new_sha = previous.sha256(), comp.spec_sha256
    batch = plan.rollback_batch_copies or max(previous.copies, len(comp.copies))
    batches = max(1, -(-len(comp.not_running(old_sha)) // batch))
    number = 0
    while True:
        supervisor.forget_dead_copies(state, component)
        new, old = comp.not_running(old_sha), comp.running(old_sha)
        if not new and len(old) >= previous.copies:
            break
        number += 1
        supervisor.shift(state, component, previous, min(batch, max(0, previous.copies - len(old))),
                         new[:batch], timeouts)
        steps.append(RolloutStep(phase="rollback", batch=number, batches=max(batches, number),
                                 old_copies=len(comp.running(old_sha)), new_copies=len(comp.running(new_sha)),
                                 old_spec_sha256=old_sha, new_spec_sha256=new_sha))
        progress(f"{state.name}/{component}: rollback batch {number}: {steps[-1].old_copies} old copies serving")
        told(steps[-1])
    comp.spec, comp.spec_sha256, comp.previous = previous, old_sha, None
    supervisor.commit(state, component)
