"""Approval before production: a passed candidate waits for a person the config names (`promotion.approval`).

An inconclusive gate whose release chose `validation.inconclusive.choice: ask` waits the same way, its request carrying
the champion check's interval, the gate's power and the evidence (`awaits_person`): an approval promotes it, a
rejection or a timeout does not. After validate passes (or so asks), the release records `approval/awaiting_approval`
(with the gate's summary, its report and the deadline) and stops before promote; the candidate is torn down unless the
config keeps it. `shiplift approve` or `shiplift reject` records the decision, by whom, when and on what evidence, and
continues the release: promote runs for an approval, and the release ends `rejected` with the reason for a rejection or
a timeout, the champion serving on. Every record is in the ledger's hash chain, so the next signed checkpoint covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from shiplift.tasks.errors import Conflict, ShipliftError
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.records import Approval
from shiplift.tasks.ledger.release_state import awaiting
from shiplift.tasks.pipeline.release import ensure_stage_retrying
from shiplift.tasks.pipeline.table import TEARDOWN


@dataclass(frozen=True)
class ApprovalState:
    """Where a release stands with its approval: not_required, not_requested, awaiting, approved, rejected or timed_out
    (the last three from the decision record)."""

    status: str
    request: Any = None  # the awaiting_approval record
    decision: Any = None  # the approved / rejected / timed_out record

    @property
    def deadline(self) -> datetime | None:
        return _moment(Approval.of(self.request).deadline) if self.request is not None else None

    @property
    def reason(self) -> str | None:
        return Approval.of(self.decision).reason if self.decision is not None else None


def _moment(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _now() -> datetime:
    return datetime.now(UTC)


def awaits_person(validate, config) -> bool:
    """Whether a release's gate (`ValidateResult`) goes to an approver: it passed, or it was inconclusive and the
    release chose to ask and names approvers (the config refuses ask without them; an asked gate of a config that
    needs no approval, read back from an older ledger, blocks: nobody could answer)."""
    return validate.decision == "pass" or (validate.asked and config.promotion.approval.required)


def approval_state(state, config) -> ApprovalState:
    """The release's approval, read from its ledger records."""
    if not config.promotion.approval.required:
        return ApprovalState("not_required")
    mine = [r for r in state.records if r.stage == events.APPROVAL]
    request = next((r for r in mine if r.event == events.AWAITING_APPROVAL), None)
    decision = next((r for r in mine if r.event in events.APPROVAL_DECISIONS), None)
    if request is None:
        return ApprovalState("not_requested")
    if decision is None:
        return ApprovalState("awaiting", request)
    return ApprovalState(decision.event if decision.event != events.APPROVED else "approved", request, decision)


def _request_payload(ctx) -> dict:
    """What an approver decides on: the gate's decision and summary, its report, the champion it was compared with,
    who opened the release, the deadline, and what the kept candidate costs while it waits."""
    rule = ctx.config.promotion.approval
    validate = ctx.result("validate")
    report = validate.evidence.get("gate-report.json")
    opened = next(r for r in ctx.state.records if (r.stage, r.event) == (events.RELEASE, events.OPENED))
    candidate = (validate.cost or {}).get("candidate") or {}
    return {
        "approvers": list(rule.approvers), "four_eyes": rule.four_eyes, "timeout_s": rule.timeout_s,
        "deadline": (_now() + timedelta(seconds=rule.timeout_s)).isoformat(), "opened_by": opened.actor,
        "gate": {"decision": validate.decision, "not_passed": validate.not_passed, "report_html": validate.report_html,
                 "report_sha256": report.sha256 if report else None},
        "champion_release": validate.champion_release,
        **({"inconclusive": {key: validate.inconclusive.get(key)
                             for key in ("choice", "interval", "n", "margin", "power_text")}}
           if validate.asked else {}),
        "candidate_kept": rule.keep_candidate,
        "candidate_usd_per_hour": candidate.get("usd_per_hour") if rule.keep_candidate else None,
    }


def hold(ctx) -> bool:
    """Before promote: True when this release must stop and wait for a person (asking once, when its gate passed);
    a request past its deadline is recorded timed out here, and the release goes on to end rejected."""
    if not awaits_person(ctx.result("validate"), ctx.config):
        return False
    current = approval_state(ctx.state, ctx.config)
    if current.status == "not_requested":
        payload = _request_payload(ctx)
        ctx.record(events.APPROVAL, events.AWAITING_APPROVAL, payload)
        ctx.say(f"approval: awaiting one of {', '.join(payload['approvers'])} until {payload['deadline'][:19]}Z; "
                f"gate report {payload['gate']['report_html']}")
        current = approval_state(ctx.state, ctx.config)
    if current.status == "awaiting" and _now() >= current.deadline:
        ctx.record(events.APPROVAL, events.TIMED_OUT, {"reason": _timed_out_reason(current.request)})
        return False
    return current.status == "awaiting"


def _timed_out_reason(request) -> str:
    """Why a request past its deadline ends rejected (the timed_out record's reason): its timeout and deadline."""
    asked = Approval.of(request)
    return f"nobody approved it within promotion.approval.timeout_s ({asked.timeout_s:g} s, deadline {asked.deadline})"


def waits_before_promote(ctx) -> bool:
    """The promote step's wait (`tasks.pipeline.table`): honour a decision made in the backend's registry, then hold
    the release while its approval is awaited, the candidate torn down unless the config keeps it (True)."""
    follow_registry(ctx)  # a decision made in the backend's registry (aws), where the CLI did not
    if not hold(ctx):
        return False
    if not ctx.config.promotion.approval.keep_candidate:
        ensure_stage_retrying(ctx, TEARDOWN)
    ctx.say(f"waiting for approval: an approver runs `shiplift approve {ctx.release_id} --reason TEXT` "
            f"(or `shiplift reject`)")
    return True


def blocked_reason(ctx) -> str | None:
    """Why promote must not change production (a rejection or a timeout), None when it may; Conflict while the release
    still waits, so a promote run by hand or by an orchestrator cannot pass an approval by."""
    current = approval_state(ctx.state, ctx.config)
    if current.status in ("not_required", "approved"):
        return None
    if current.status in ("rejected", "timed_out"):
        return f"not approved: {current.reason}"
    raise Conflict(f"release {ctx.release_id} has not been approved yet (promotion.approval.required)",
                   fix=f"an approver runs `shiplift approve {ctx.release_id} --reason TEXT`")


def _awaiting(ctx) -> ApprovalState:
    """The release's approval state while it awaits a decision; Conflict, saying why, when it does not."""
    current = approval_state(ctx.state, ctx.config)
    if current.status == "not_required":
        raise Conflict(f"release {ctx.release_id} does not require an approval (its config has no promotion.approval)",
                       fix="nothing to approve: it promotes on its gate alone")
    if current.status == "not_requested":
        raise Conflict(f"release {ctx.release_id} is not awaiting approval: its gate has not passed (yet)",
                       fix=f"see `shiplift ledger show {ctx.release_id}`")
    if current.status != "awaiting":
        raise Conflict(f"release {ctx.release_id} is not awaiting approval: it was already {current.status} "
                       f"({current.reason})", fix="open a new release to change the decision")
    return current


def decide(ctx, *, approve: bool, actor: str, reason: str, decided_at: datetime | None = None) -> dict:
    """Record an approver's decision on a release that waits for one; refused with the reason, and nothing recorded,
    when it does not wait (any more), the deadline passed, `actor` is not an approver, or four eyes forbid it.

    `decided_at` (time-zone aware) is when the person answered, as the orchestrator recorded it (Airflow's
    responded_at): the deadline is judged at that moment, not when the answer reaches the ledger, and it is kept in
    the record."""
    if not reason.strip():
        raise Conflict("a decision needs its reason", fix="pass --reason TEXT: what you checked, for the ledger")
    current = _awaiting(ctx)
    verb = "approve" if approve else "reject"
    request = Approval.of(current.request)
    if decided_at is not None and decided_at.tzinfo is None:
        raise Conflict(f"the answer to {ctx.release_id} is dated {decided_at.isoformat()} with no time zone",
                       fix="pass the answer's time in ISO 8601 with its offset (e.g. 2026-12-04T10:00:00+00:00)")
    if decided_at is not None and not _moment(current.request.recorded_at) <= decided_at <= _now():
        raise Conflict(f"the answer to {ctx.release_id} is dated {decided_at.isoformat()}, outside the wait "
                       f"({current.request.recorded_at} until now)",
                       fix="an answer made before the request or in the future is not this request's: check the clocks")
    if (decided_at or _now()) >= current.deadline:
        raise Conflict(f"the approval of {ctx.release_id} timed out at {request.deadline}",
                       fix="rerunning `shiplift release CONFIG` records the timeout and ends it rejected; release it "
                           "anew for a fresh gate")
    if actor not in request.approvers:
        raise Conflict(f"{actor!r} is not an approver of {ctx.config.name} (promotion.approval.approvers: "
                       f"{', '.join(request.approvers)})",
                       fix="ask one of them, or set SHIPLIFT_ACTOR to your identity")
    if request.four_eyes and actor == request.opened_by:
        raise Conflict(f"{actor!r} opened release {ctx.release_id}; four eyes (promotion.approval.four_eyes) need "
                       "someone else to decide",
                       fix="ask another approver: "
                           f"{', '.join(a for a in request.approvers if a != actor) or '(none listed)'}")
    if approve:
        serving = ctx.backends.ledger.served_at(ctx.config.name, _now())
        now_serving = serving.release_id if serving is not None else None
        if now_serving != request.champion_release:
            raise Conflict(f"the gate compared {ctx.release_id} with champion {request.champion_release}, but "
                           f"{now_serving} serves now: the approval would rest on stale evidence",
                           fix="reject it and release it again, so its gate runs against the current champion")
    answered = {"decided_at": decided_at.isoformat()} if decided_at is not None else {}
    ctx.record(events.APPROVAL, events.APPROVED if approve else events.REJECTED, {
        "by": actor, "reason": reason, "requested_seq": current.request.seq,
        "report_sha256": request.gate.report_sha256, "gate_decision": request.gate.decision, **answered})
    ctx.say(f"approval: {verb}d by {actor}: {reason}")
    return {"release_id": ctx.release_id, "decision": events.APPROVED if approve else events.REJECTED, "by": actor,
            "reason": reason}


# --- Additions (issue 21): waiting in a Step Functions execution, and decisions made in the Model Registry
# ------------- The functions above are the CLI's; these are called by the Step Functions steps
# (`tasks.orchestrators.task_token`) and wherever a release checks for a decision made in the SageMaker Model Registry.
# None changes the functions above.

TOKEN_RENEWED = "task_token_renewed"  # event: a retried or later execution of the release waits on a new task token
STEP_FUNCTIONS = "step_functions"  # payload key: the reference to the task token an execution waits on


def _requests(records: list) -> tuple[Any, list]:
    """The release's approval request record and the approval records after it."""
    request = next((r for r in records if (r.stage, r.event) == (events.APPROVAL, events.AWAITING_APPROVAL)), None)
    return request, [r for r in records if r.stage == events.APPROVAL and request is not None and r.seq > request.seq]


def token_reference(records: list) -> dict | None:
    """The reference to the task token the release's request was last waited on with (its execution's holder, where the
    token is kept and its sha256; never the token), whether or not it is decided; None when no execution waits."""
    request, later = _requests(records)
    if request is None:
        return None
    found = [request.payload.get(STEP_FUNCTIONS),
             *(r.payload.get(STEP_FUNCTIONS) for r in later if r.event == TOKEN_RENEWED)]
    found = [reference for reference in found if reference]
    return found[-1] if found else None


def waiting_execution(records: list) -> dict | None:
    """The task-token reference of a request still awaiting a decision in a Step Functions execution, else None (the
    CLI's `shiplift release` waits without one)."""
    return token_reference(records) if awaiting(records) is not None else None


def request_for_execution(ctx, wait: dict) -> str:
    """The Step Functions AwaitApproval step: record the request once, with `wait` (the reference to its task token),
    or, when a retried or new execution of the release asks again, the new token's reference; a request past its
    deadline is recorded timed out, as `hold` does. Returns the approval's status: `awaiting` (the execution waits on
    its token), or approved / rejected / timed_out / not_required, when it can go on to promote at once."""
    if not awaits_person(ctx.result("validate"), ctx.config):
        raise Conflict(f"release {ctx.release_id} has no passed or asked gate to ask an approval for (gate "
                       f"{ctx.result('validate').decision})",
                       fix="the state machine asks only after GateDecision pass, "
                       "or an inconclusive gate its release chose to ask (validation.inconclusive.choice: ask)")
    current = approval_state(ctx.state, ctx.config)
    if current.status == "not_requested":
        payload = {**_request_payload(ctx), STEP_FUNCTIONS: wait}
        ctx.record(events.APPROVAL, events.AWAITING_APPROVAL, payload)
        ctx.say(f"approval: awaiting one of {', '.join(payload['approvers'])} until {payload['deadline'][:19]}Z in "
                f"{wait['holder']}; gate report {payload['gate']['report_html']}")
        return "awaiting"
    if current.status != "awaiting":
        return current.status
    if _now() >= current.deadline:
        ctx.record(events.APPROVAL, events.TIMED_OUT, {"reason": _timed_out_reason(current.request)})
        return events.TIMED_OUT
    if (token_reference(ctx.state.records) or {}).get("token_sha256") != wait["token_sha256"]:
        ctx.record(events.APPROVAL, TOKEN_RENEWED, {STEP_FUNCTIONS: wait, "requested_seq": current.request.seq})
        ctx.say(f"approval: still awaiting; {wait['holder']} waits on a new task token")
    return "awaiting"


def record_orchestrator_timeout(ctx, why: str) -> str:
    """The orchestrator stopped waiting (Step Functions' States.Timeout of AwaitApproval): a request still awaiting is
    recorded timed out with `why`; one already decided keeps its decision (a decision whose token could not be sent
    goes on here). Returns the approval's status. Conflict when nothing was ever requested (the step never recorded
    it)."""
    current = approval_state(ctx.state, ctx.config)
    if current.status == "not_requested":
        raise Conflict(f"release {ctx.release_id} timed out waiting for an approval it never asked for",
                       fix="look at the AwaitApproval task's log; rerun the execution to ask again")
    if current.status == "awaiting":
        ctx.record(events.APPROVAL, events.TIMED_OUT, {"reason": why})
        return events.TIMED_OUT
    return current.status


def follow_registry(ctx) -> dict | None:
    """Honour a decision made in the backend's registry (aws: Approved or Rejected on the release's version in the
    SageMaker Model Registry, by SageMaker Studio or UpdateModelPackage): `decide` records it with the principal read
    back from the registry, refusing what it refuses for the CLI; what is not honoured (a stale decision, another
    version's, or one `decide` refuses) is reported and the registry put back to the ledger's view. None when the
    release does not await approval or the registry holds no decision; else what was found, with `decision` when it
    was recorded or `refused` with the reason."""
    current = approval_state(ctx.state, ctx.config)
    read = getattr(ctx.backends.registry, "decision_for", None)
    if current.status != "awaiting" or read is None:
        return None

    try:
        found = read(ctx.facts(), current.request)
    except ShipliftError as exc:  # the registry is a view: the ledger's decision does not depend on reading it
        ctx.say(f"WARNING the model registry could not be read for a decision (the ledger is unaffected): {exc}")
        return None
    if found is None:
        return None
    for other in found.get("others") or ():
        ctx.say(f"WARNING the model registry's {other['status']} of {other['model_package_arn']} by {other['by']} is "
                f"not honoured: {other['refused']}")
    if found.get("status") is None:
        return found
    if found.get("refused") is None:
        try:
            found = {**found,
                     "decision": decide(ctx, approve=found["approve"], actor=found["actor"], reason=found["reason"])}
        except Conflict as exc:
            found = {**found, "refused": str(exc)}
    if found.get("refused") is not None:
        ctx.say(f"WARNING the model registry's {found['status']} of {found['model_package_arn']} by {found['actor']} "
                f"is not honoured: {found['refused']}; the registry is put back to the ledger's view")
        ctx.sync_registry()
    return found
