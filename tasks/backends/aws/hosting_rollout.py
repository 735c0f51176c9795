"""A release's rollout on SageMaker: the rolling update of production's inference component with its rollback alarms,
followed and baked check by check (the online gate's verdict published for its alarm), resumed after a crash, and told
as the rollout or the rollback it ended as; an online gate that has not passed once the update ended puts the previous
spec back."""

from __future__ import annotations

import time

from shiplift.tasks.backends.aws.hosting_calls import (
    COMPONENT_WAIT_S,
    UNSETTLED,
    SageMakerCalls,
    current_copies,
    failure_reason,
)
from shiplift.tasks.backends.aws.hosting_deploy import Deployer
from shiplift.tasks.backends.aws.hosting_requests import (
    RESTORED_SPEC,
    alarm_requests,
    gate_datum,
    model_request,
    restore_request,
    rolling_update_request,
)
from shiplift.tasks.backends.interfaces import (
    Bake,
    ComponentSpec,
    DeployPoll,
    KeepReplaced,
    OnStep,
    Progress,
    RolloutPlan,
    RolloutResult,
    RolloutStep,
)
from shiplift.tasks.errors import DeployFailed, NotReady


def our_update(live: dict, alarms: list[str]) -> bool:
    """Whether the component's last deployment is this rollout's rolling update: its rollback alarms are the ones
    this rollout names (they derive from the component, the release and the rules)."""
    config = (live.get("LastDeploymentConfig") or {}).get("AutoRollbackConfiguration") or {}
    named = [alarm.get("AlarmName") for alarm in config.get("Alarms") or []]
    return bool(named) and named == alarms


def runs(live: dict, model_name: str, copies: int) -> bool:
    """Whether a component's description shows `model_name` on `copies` copies."""
    runtime = live.get("RuntimeConfig", {})
    return (live.get("Specification", {}).get("ModelName") == model_name
            and runtime.get("DesiredCopyCount") == copies == runtime.get("CurrentCopyCount"))


def rollback_reason(final: dict, steps: list[RolloutStep], fired: dict[str, str], plan: RolloutPlan) -> str:
    """Why SageMaker ended the update on the old spec: the alarms seen in ALARM, the online gate's verdict, the
    update's FailureReason, or (none of them seen) its maximum execution time."""
    if fired:
        return "; ".join(f"alarm {name} fired" + (f": {reason}" if reason else "") for name, reason in fired.items())
    gate = next((step.alarm for step in steps if step.alarm), None)
    if gate:
        return gate
    if final.get("FailureReason"):
        return f"the update failed: {final['FailureReason']}"
    return ("SageMaker ended the update on the previous model with no alarm seen in ALARM: it passed "
            f"MaximumExecutionTimeoutInSeconds ({plan.max_execution_s:g}s) or an alarm fired between two checks")


def last_step(final: dict, steps: list[RolloutStep], fired: dict[str, str], plan: RolloutPlan, model_name: str,
              copies: int) -> RolloutStep:
    """The last observation as the step it is: the rollout's where the update ended on the new spec (every copy new,
    so no old one: `old_copies` 0) or Failed, else the rollback SageMaker made, with its reason."""
    if runs(final, model_name, copies):
        return steps[-1].model_copy(update={"old_copies": 0, "new_copies": copies})
    if final.get("InferenceComponentStatus") == "Failed":
        return steps[-1]
    return steps[-1].model_copy(update={"phase": "rollback", "alarm": rollback_reason(final, steps, fired, plan)})


def replaced_spec(live: dict) -> dict:
    """What an update is about to replace, read from the component's description before UpdateInferenceComponent is
    sent: its model, compute, startup parameters and copy count (what `restore_request` puts back), as JSON for the
    ledger. Read then, never from a description taken while the update runs: DescribeInferenceComponent documents
    `Specification` only as "details about the resources that are deployed with this inference component" and
    `LastDeploymentConfig` as "the deployment and rollback settings that you assigned"; neither says which spec it
    shows mid-update, and no member returns the spec an update replaces
    (https://docs.aws.amazon.com/sagemaker/latest/APIReference/API_DescribeInferenceComponent.html, and the botocore
    service model's DescribeInferenceComponentOutput). A rerun that follows an update already under way gets it back
    from the ledger (`roll_out`'s `previous`)."""
    described = live.get("Specification") or {}
    return {"Specification": {key: described[key] for key in RESTORED_SPEC if key in described},
            "RuntimeConfig": {"DesiredCopyCount": int((live.get("RuntimeConfig") or {}).get("DesiredCopyCount") or 0)}}


class Checks:
    """The checks one process makes of a rolling update while it runs: each reads the alarms' states, runs the bake
    (the online gate replays there), publishes the gate's verdict for its alarm and tells the step as it is seen and
    judged. `steps` lists them (numbered from 1 here: the promote stage's ledger log numbers them on), `fired` every
    alarm seen in ALARM with its StateReason."""

    def __init__(self, calls: SageMakerCalls, component: str, spec: ComponentSpec, plan: RolloutPlan, bake: Bake,
                 alarms: list[str], progress: Progress, tell: OnStep):
        self.calls, self.component, self.plan, self.bake, self.alarms = calls, component, plan, bake, alarms
        self.progress, self.tell = progress, tell
        self.spec_sha256, self.batches = spec.sha256(), len(plan.targets(spec.copies))
        self.steps: list[RolloutStep] = []
        self.fired: dict[str, str] = {}

    def observed(self, answer: dict) -> RolloutStep:
        """The component's copy count in this description and every alarm's state now."""
        found = self.calls.call("cloudwatch", "DescribeAlarms", AlarmNames=self.alarms).get("MetricAlarms", [])
        self.fired.update({a["AlarmName"]: a.get("StateReason", "") for a in found if a.get("StateValue") == "ALARM"})
        return RolloutStep(phase="rollout", check=len(self.steps) + 1, batches=self.batches,
                           new_spec_sha256=self.spec_sha256,
                           copies=answer.get("RuntimeConfig", {}).get("CurrentCopyCount"),
                           alarm_states={a["AlarmName"]: a.get("StateValue", "INSUFFICIENT_DATA") for a in found})

    def check(self, answer: dict) -> None:
        """One check of the update this description shows running."""
        step = self.observed(answer)
        self.tell("shifted", step)
        alarm = self.bake(step)
        if self.plan.online_gate:
            self.calls.call("cloudwatch", "PutMetricData", **gate_datum(self.component, failed=alarm is not None))
        self.steps.append(step.model_copy(update={"alarm": alarm}))
        # after the gate's datum: SageMaker's alarm on it must not wait for the ledger
        self.tell("baked", self.steps[-1])
        in_alarm = [name for name, state in step.alarm_states.items() if state == "ALARM"]
        self.progress(f"inference component {self.component}: check {len(self.steps)}: {step.copies} copies; "
                      + (f"in ALARM: {', '.join(in_alarm)}" if in_alarm else "no alarm")
                      + (f"; {alarm}" if alarm else ""))


class Rollout:
    """Rolls production's component to a new spec; a component that does not exist yet is deployed (`deployer`)."""

    def __init__(self, calls: SageMakerCalls, deployer: Deployer):
        self.calls, self.deployer = calls, deployer

    def _prepared(self, endpoint: str, component: str, spec: ComponentSpec,
                  plan: RolloutPlan) -> tuple[str, list[dict], list[str]]:
        """The candidate's model (created unless it exists), the rollout's alarm requests and their names."""
        model = model_request(component, spec, endpoint, role_arn=self.calls.backend.execution_role_arn)
        self.deployer.ensure_model(model)
        alarms = alarm_requests(endpoint, component, spec, plan)
        return model["ModelName"], alarms, [alarm["AlarmName"] for alarm in alarms]

    def _send(self, endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan, live: dict, model_name: str,
              alarms: list[dict], keep: KeepReplaced | None, progress: Progress) -> dict:
        """Put the alarms, tell `keep` what the update replaces (before it is sent: a crash between the two leaves it
        known), then send the rolling update; returns what it replaces."""
        for alarm in alarms:
            self.calls.call("cloudwatch", "PutMetricAlarm", **alarm)
        if live.get("InferenceComponentStatus") == "Failed":
            progress(f"inference component {component} is Failed ({failure_reason(live)}) with "
                     f"{current_copies(live)} copies; updating it again (it is never deleted: its copies may "
                     "still serve)")
        names = [alarm["AlarmName"] for alarm in alarms]
        progress(f"inference component {component}: rolling update to {model_name} in batches of "
                 f"{plan.batch_copies}, {plan.wait_interval_s:g}s bake, alarms {', '.join(names)}")
        replaced = replaced_spec(live)
        if keep is not None:
            keep(replaced)
        self.calls.sm("UpdateInferenceComponent",
                      **rolling_update_request(component, endpoint, spec, model_name, plan, names))
        return replaced

    def start(self, endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan, *, progress: Progress,
              keep: KeepReplaced) -> bool:
        """`roll_out` without its wait (a deferred promote's start): send this rollout's update and return. Nothing is
        sent where the component is absent (the stage deploys it whole), where this rollout's update is under way or
        has ended (a retried start), or where the spec serves already; a component Creating or Updating for another
        cause is NotReady (retryable: SageMaker refuses the update until it settles). Whether it sent one."""
        live = self.calls.inference_component(endpoint, component)
        if live is None:
            return False
        model_name, alarms, names = self._prepared(endpoint, component, spec, plan)
        status, ours = live.get("InferenceComponentStatus"), our_update(live, names)
        if ours and status in ("Updating", "InService"):
            return False
        if status in UNSETTLED:
            raise NotReady(f"inference component {component} is {status} (not this rollout's update), and SageMaker "
                           "updates it only once that ends", fix="the stage's retry starts it again once it settled")
        if status == "InService" and runs(live, model_name, spec.copies):
            return False
        self._send(endpoint, component, spec, plan, live, model_name, alarms, keep, progress)
        return True

    def poll(self, endpoint: str, component: str, spec: ComponentSpec, plan: RolloutPlan, bake: Bake, *,
             progress: Progress, on_step: OnStep | None = None) -> DeployPoll:
        """One DescribeInferenceComponent of the update `start` sent: while it is Updating, one check (alarms, bake,
        the gate's datum, told to `on_step`) and not done; else done, and `roll_out` (the stage run after the wait)
        follows what it ended as: the last verdict, a rollback, or its failure raised."""
        live = self.calls.inference_component(endpoint, component)
        status = (live or {}).get("InferenceComponentStatus", "absent")
        if status != "Updating":
            return DeployPoll(in_service=True, status=f"inference component {component} {status}: no update runs")
        names = [alarm["AlarmName"] for alarm in alarm_requests(endpoint, component, spec, plan)]
        Checks(self.calls, component, spec, plan, bake, names, progress, on_step or (lambda kind, step: None)).check(
            live)
        return DeployPoll(in_service=False, status=f"inference component {component} Updating "
                                                   f"({current_copies(live)} copies)")

    def roll_out(self, endpoint: str, component: str, spec: ComponentSpec, placement, plan: RolloutPlan, bake: Bake, *,
                 progress: Progress, on_step: OnStep | None = None, previous: dict | None = None,
                 keep: KeepReplaced | None = None) -> RolloutResult:
        """SageMaker's rolling update: create the release's alarms, send UpdateInferenceComponent with the
        RollingUpdatePolicy and the alarms, and follow it, calling `bake` every `check_interval_s` (the online gate
        replays there and its verdict is published for its alarm). SageMaker ends a rolled-back update InService
        on the old spec with no rollback status, so success is the candidate's model serving on every copy and
        anything else is the rollback it is, with the alarm seen firing. This rollout's own update (its
        LastDeploymentConfig names this rollout's alarms), still Updating or ended after a crash, is followed, not
        sent again; a component Creating, or Updating for another cause, is waited for first (SageMaker refuses
        UpdateInferenceComponent then). A Failed component is updated again, never deleted: its copies may still serve
        the champion. The alarms are removed once the update has ended (a crashed watcher leaves them to SageMaker,
        and its rerun, which names the same alarms, removes them). `on_step` hears of every check as it is seen
        (shifted) and judged (baked), and of the last observation, once the update has ended, as the step it is
        (rollout, or the rollback SageMaker made). With an online gate, an update that ended on the new spec is baked
        once more: a gate that has not passed then (SageMaker's alarms no longer roll back) puts the spec the update
        replaced back (`_put_back`), so an undecided gate is never a silent pass; that holds for this rollout's update
        found ended by a rerun too (a crash between the update's end and the verdict), which is judged again, never
        taken as unchanged. What the update replaces is told to `keep` before it is sent; a run that follows an update
        it did not send puts back `previous` (what `keep` was told then, from the ledger)."""
        calls = self.calls
        tell = on_step or (lambda kind, step: None)
        live = calls.inference_component(endpoint, component)
        if live is None:
            self.deployer.deploy(endpoint, component, spec, placement, role="production", progress=progress)
            return RolloutResult(status="created")
        model_name, alarms, names = self._prepared(endpoint, component, spec, plan)
        status, ours = live.get("InferenceComponentStatus"), our_update(live, names)
        if status in UNSETTLED and not (ours and status == "Updating"):
            progress(f"inference component {component} is {status} (not this rollout's update); waiting for it to end "
                     "before updating it")
            live = calls.settled(component, progress, deadline_s=plan.max_execution_s + COMPONENT_WAIT_S)
            if live is None:
                self.deployer.deploy(endpoint, component, spec, placement, role="production", progress=progress)
                return RolloutResult(status="created")
            status, ours = live.get("InferenceComponentStatus"), our_update(live, names)
        if status == "InService" and runs(live, model_name, spec.copies) and not (ours and plan.online_gate):
            return RolloutResult(status="unchanged")
        if ours and status in ("Updating", "InService"):
            for alarm in alarms:  # a rerun's bake reads them; SageMaker may still watch them
                calls.call("cloudwatch", "PutMetricAlarm", **alarm)
            progress(f"inference component {component}: this rollout's update (an earlier attempt's) is {status}; "
                     "following it, not sending it again" + (", its last verdict judged again" if status == "InService"
                                                             else ""))
        else:
            previous = self._send(endpoint, component, spec, plan, live, model_name, alarms, keep, progress)
        steps, final, fired = self._follow(component, spec, plan, bake, names, progress, tell)
        steps[-1] = last_step(final, steps, fired, plan, model_name, spec.copies)
        tell("shifted", steps[-1])
        calls.call("cloudwatch", "DeleteAlarms", AlarmNames=names)  # kept while an update may still need them
        if final.get("InferenceComponentStatus") == "Failed":
            serving = current_copies(final)
            raise DeployFailed(
                f"inference component {component} failed during its rolling update: {failure_reason(final)}"
                + (f"; {serving} copies of the previous model still serve on it" if serving else ""),
                fix="read the FailureReason and the container logs, fix the cause and rerun promote: it updates the "
                    "same component again (a Failed production component is never deleted)"
                    + ("" if serving else "; no copy serves now"))
        if runs(final, model_name, spec.copies):
            return self._last_word(component, previous, plan, bake, steps, progress, tell)
        reason = steps[-1].alarm
        progress(f"inference component {component}: rolled back: {reason}")
        return RolloutResult(status="rolled_back", reason=reason, steps=tuple(steps))

    def _last_word(self, component: str, previous: dict | None, plan: RolloutPlan, bake: Bake,
                   steps: list[RolloutStep], progress: Progress, tell: OnStep) -> RolloutResult:
        """The update ended on the new spec, and SageMaker's alarms roll back no more: with an online gate, the last
        step is baked (`tasks.pipeline.bake.update_ended`: the gate must decide now) and an alarm puts the previous
        spec back; else, or once it passed, the rollout succeeded."""
        if plan.online_gate:
            steps[-1] = steps[-1].model_copy(update={"alarm": bake(steps[-1])})
            tell("baked", steps[-1])
            if steps[-1].alarm:
                return self._put_back(component, previous, plan, steps, progress, tell)
        return RolloutResult(status="succeeded", steps=tuple(steps))

    def _put_back(self, component: str, previous: dict | None, plan: RolloutPlan, steps: list[RolloutStep],
                  progress: Progress, tell: OnStep) -> RolloutResult:
        """After an update that ended on the new spec with an online gate that has not passed (failed, or undecided
        and not decided by its inconclusive choice): UpdateInferenceComponent back to `previous` (`restore_request`),
        waited for and told as a rollback step; `rolled_back` once the previous model serves on its copies again."""
        calls, alarm = self.calls, steps[-1].alarm
        if previous is None:
            raise DeployFailed(
                f"inference component {component}: SageMaker's update ended on the new model but {alarm}, and the spec "
                "it replaced is not known here (this run followed an update an earlier attempt had started, and the "
                "ledger holds no record of what it replaced)",
                fix="roll production back with `shiplift rollback MODEL --to CHAMPION_RELEASE --reason ...`")
        request = restore_request(component, previous, plan)
        model_name, copies = request["Specification"]["ModelName"], request["RuntimeConfig"]["CopyCount"]
        progress(f"inference component {component}: the update ended but {alarm}; putting {model_name} back on "
                 f"{copies} copies")
        calls.sm("UpdateInferenceComponent", **request)
        _, final = calls.wait(component, deadline_s=plan.max_execution_s + COMPONENT_WAIT_S, progress=progress)
        final = final or {}
        back = steps[-1].model_copy(update={
            "phase": "rollback", "check": steps[-1].check + 1, "copies": current_copies(final), "alarm_states": {},
            "old_copies": current_copies(final) if runs(final, model_name, copies) else None, "new_copies": None})
        tell("shifted", back)
        if not runs(final, model_name, copies):
            raise DeployFailed(
                f"inference component {component}: putting {model_name} back after the online gate ({alarm}) did not "
                f"end with it on {copies} copies: {final.get('InferenceComponentStatus')}, {failure_reason(final)}",
                fix="read the FailureReason, then roll back with `shiplift rollback MODEL --to CHAMPION_RELEASE`")
        reason = f"{alarm}; SageMaker's update had ended, so the previous spec was put back (UpdateInferenceComponent)"
        progress(f"inference component {component}: rolled back: {reason}")
        return RolloutResult(status="rolled_back", reason=reason, steps=(*steps, back))

    def _follow(self, component: str, spec: ComponentSpec, plan: RolloutPlan, bake: Bake, alarms: list[str],
                progress: Progress, tell: OnStep) -> tuple[list[RolloutStep], dict, dict[str, str]]:
        """Poll the update until it ends; every check interval one `Checks.check`. Returns the steps (the last one, not
        told yet: the component and its alarms once the update ended), the last description and every alarm seen in
        ALARM with its StateReason."""
        checks = Checks(self.calls, component, spec, plan, bake, alarms, progress, tell)
        next_check = 0.0

        def check(answer: dict) -> None:
            nonlocal next_check
            if time.monotonic() < next_check:
                return
            next_check = time.monotonic() + plan.alarms.check_interval_s
            checks.check(answer)

        _, final = self.calls.wait(component, deadline_s=plan.max_execution_s + COMPONENT_WAIT_S, progress=progress,
                                   on_poll=check)
        final = final or {}
        checks.steps.append(checks.observed(final))
        return checks.steps, final, checks.fired
