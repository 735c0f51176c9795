"""The approval steps of an orchestrated run: ask a person, then record the answer the orchestrator collected.

Airflow's refresh and promote DAGs wait for a person between validate and promote with Airflow 3's `ApprovalOperator`
(dags/_shiplift_dags.py). The tasks on either side of that wait call these two functions with plain values only (this
module, like all of `tasks`, never imports Airflow):

- `request_approval_orchestrated` records `approval/awaiting_approval` once the gate passed (`approval.hold`), tears the
  candidate down while it waits unless the config keeps it, and returns what the approver is shown (subject, body,
  approvers, deadline), or why nobody needs asking (no approval required, the gate did not pass, already decided,
  timed out: recorded here when the deadline passed).
- `record_decision_orchestrated` writes the answer: the person's identity (the orchestrator's user, e.g. the Airflow
  user who responded) and their comment go through `approval.decide`, which refuses with Conflict, recording nothing,
  an answer by someone who is not an approver, by the release's opener under four eyes, without a reason, after the
  deadline, or on stale evidence. An answer the orchestrator filled in itself at its timeout (no person) records the
  request `timed_out`.
- `finish_unapproved_orchestrated` ends a release that was rejected or timed out where no later step of the run does
  it (the promote DAG): its remaining stages (promote skips, with the reason) and its final status, `rejected`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from shiplift.tasks.errors import NotReady
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.records import Approval, entry_result
from shiplift.tasks.ledger.stage_results import ValidateResult
from shiplift.tasks.pipeline.approval import approval_state, awaits_person, decide, hold
from shiplift.tasks.pipeline.release import Progress, ensure_stage, print_progress, reopen_release, run_stages
from shiplift.tasks.pipeline.table import LEASE, TEARDOWN

DEPLOY_CANDIDATE = "deploy_candidate"


def _last_seq(records: list, stage: str, names: tuple[str, ...]) -> int | None:
    return max((r.seq for r in records if r.stage == stage and r.event in names), default=None)


def candidate_may_be_up(records: list) -> bool:
    """True when the release's candidate was deployed and no teardown has finished since."""
    deployed = _last_seq(records, DEPLOY_CANDIDATE, (events.SUCCEEDED,))
    torn_down = _last_seq(records, TEARDOWN, events.DONE)
    return deployed is not None and (torn_down is None or torn_down < deployed)


def _not_waiting_reason(state, config, validate: dict) -> str:
    current = approval_state(state, config)
    if current.status == "not_required":
        return "its config requires no approval (promotion.approval.required is false)"
    if validate.get("status") != "succeeded":
        return f"its validate stage is {validate.get('status')}: there is no gate decision to approve"
    gate = entry_result(validate, ValidateResult)
    if not awaits_person(gate, config):
        return f"its gate decision is {gate.decision}: nothing to approve, promote skips it"
    if current.status == "approved":
        return f"already approved by {Approval.of(current.decision).by}: {current.reason}"
    return f"already {current.status}: {current.reason}"


def _number(value: Any) -> str:
    return "–" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def approval_prompt(release_id: str, model: str, request: dict, validate: dict) -> tuple[str, str]:
    """The subject and the Markdown body an approver reads: the gate's decision and checks, its report, the champion it
    was compared with, who opened the release, who may decide until when, what the candidate costs meanwhile
    (`request`: the awaiting_approval record's payload; `validate`: the validate stage's `ReleaseState.stage` entry)."""
    approval = Approval.model_validate(request)
    gate, result = approval.gate, entry_result(validate, ValidateResult)
    checks = (result.checks if result else None) or []
    not_passed = gate.not_passed or []
    asked = approval.inconclusive
    how = ("passed its gate" if not asked else "has an inconclusive gate and its config asks a person to decide "
           "(validation.inconclusive.choice: ask)")
    lines = [
        f"**{model}**: release `{release_id}` {how} and waits for an approver before promote changes "
        "production. Unanswered by the deadline it ends rejected and the champion keeps serving.",
        "",
        "| | |",
        "|---|---|",
        f"| gate decision | **{gate.decision}** |",
        f"| checks not passed | {', '.join(not_passed) if not_passed else 'none'} |",
        f"| gate report | `{gate.report_html}` (gate-report.json sha256 `{gate.report_sha256}`) |",
        f"| compared with champion | {approval.champion_release or 'none (first release of this model)'} |",
        f"| opened by | {approval.opened_by}" + (" (four eyes: may not approve it)" if approval.four_eyes else "")
        + " |",
        f"| approvers | {', '.join(approval.approvers)} |",
        f"| deadline | {approval.deadline} |",
        "| candidate while waiting | " + (f"kept running, {approval.candidate_usd_per_hour} USD/h"
                                        if approval.candidate_kept else "torn down") + " |",
    ]
    if asked:
        low, high = asked.interval or (None, None)
        lines += ["", f"Candidate − champion accuracy on {asked.n} paired tasks: interval [{_number(low)}, "
                      f"{_number(high)}] against the margin −{asked.margin:g}, so the gate could not tell. Power at "
                      "this size:", *(f"- {text}" for text in asked.power_text)]
    if checks:
        lines += ["", "| check | status | observed | threshold |", "|---|---|---|---|"]
        lines += [f"| {c.get('name')} | {c.get('status')} | {_number(c.get('observed'))} | "
                  + (f"{c.get('comparator', '')} {_number(c.get('threshold'))} |"
                     if c.get("threshold") is not None else "– |")
                  for c in checks]
    lines += ["", "Approve or Reject, and write why in **comment**: the ledger records it as the decision's reason "
                  "(a decision without one is refused)."]
    return f"Approve {release_id} for production?", "\n".join(lines)


def request_approval_orchestrated(release_id: str, *, holder: str | None = None, ledger_url: str | None = None,
                                  state_dir: str | Path | None = None, actor: str | None = None,
                                  progress: Progress = print_progress, session: Any = None) -> dict:
    """Ask for the approval a release's config requires (once its gate passed) and say what to show the approver;
    `waiting` False (with `why`) when nobody needs asking. `holder` is the run whose lease the teardown renews and
    which gives it back while the release waits (the policy table's `releases`)."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, progress=progress,
                         session=session)
    ctx.lease_holder = holder
    validate = ctx.state.stage("validate")
    base = {"release_id": release_id, "model": ctx.config.name}
    waiting = validate["status"] == "succeeded" and hold(ctx)
    current = approval_state(ctx.state, ctx.config)
    if not waiting:
        why = _not_waiting_reason(ctx.state, ctx.config, validate)
        ctx.say(f"approval: nobody to ask, {why}")
        return {**base, "waiting": False, "status": current.status, "why": why}
    if not ctx.config.promotion.approval.keep_candidate and candidate_may_be_up(ctx.state.records):
        ensure_stage(ctx, TEARDOWN)  # the candidate does not run (and cost) while a person reads the report
    if holder is not None:  # nobody is blocked while a person reads the report; the decision takes it back
        ctx.backends.ledger.release_lease(ctx.config.name, holder)
    request = Approval.of(current.request)
    subject, body = approval_prompt(release_id, ctx.config.name, current.request.payload, validate)
    seconds_left = (current.deadline - datetime.now(UTC)).total_seconds()
    return {**base, "waiting": True, "status": current.status, "requested_seq": current.request.seq,
            "subject": subject, "body": body, "approvers": list(request.approvers), "opened_by": request.opened_by,
            "four_eyes": request.four_eyes, "deadline": request.deadline, "seconds_left": max(0.0, seconds_left)}


def record_decision_orchestrated(release_id: str, *, approve: bool, actor: str | None, reason: str | None,
                                 decided_at: str | None = None, run_actor: str | None = None, holder: str | None = None,
                                 ledger_url: str | None = None, state_dir: str | Path | None = None,
                                 progress: Progress = print_progress,
                                 session: Any = None) -> dict:
    """Record the answer an orchestrator collected: `actor` is the person who answered (None when the orchestrator
    filled in its default at the timeout), `reason` their comment and `decided_at` (ISO 8601) when the orchestrator
    says they answered, at which the deadline is judged. First `holder` takes the model's lease back (given back while
    the release waited; LeaseHeld while another run holds it), so the run goes on to promote and end under it (the
    policy table's `takes back`). A person's answer then goes through `decide` (Conflict, nothing recorded, when it is
    not theirs to give). A timeout records `timed_out` (`run_actor` is then the record's actor); NotReady, retried,
    while this worker's clock has not reached the ledger's deadline yet."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor or run_actor,
                         progress=progress, session=session)
    if holder is not None:
        ctx.backends.ledger.acquire_lease(ctx.config.name, holder, release_id, LEASE.ttl_s)
        ctx.lease_holder = holder
    if actor is None:
        if hold(ctx):
            deadline = Approval.of(approval_state(ctx.state, ctx.config).request).deadline
            raise NotReady(f"the orchestrator timed the approval of {release_id} out, but the ledger's deadline "
                           f"{deadline} has not passed on this worker's clock", fix="retried shortly; check the clocks")
        current = approval_state(ctx.state, ctx.config)
        if current.status in ("not_required", "not_requested", "awaiting"):
            raise NotReady(f"release {release_id} is {current.status}, not timed out", fix="retried shortly")
        ctx.say(f"approval: no answer by the deadline; the release is {current.status}")
        return {"release_id": release_id, "decision": current.status,
                "by": Approval.of(current.decision).by, "reason": current.reason}
    answered = datetime.fromisoformat(decided_at.replace("Z", "+00:00")) if decided_at else None
    return decide(ctx, approve=approve, actor=actor, reason=(reason or "").strip(), decided_at=answered)


def finish_unapproved_orchestrated(release_id: str, *, actor: str | None = None, ledger_url: str | None = None,
                                   state_dir: str | Path | None = None, progress: Progress = print_progress,
                                   session: Any = None) -> dict:
    """After a rejection or a timeout: the release's remaining stages under the model's lease (promote skips with
    "not approved: …", the candidate is torn down) and its final status, `rejected`, as `shiplift reject` continues.
    Returns the release's summary."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, progress=progress,
                         session=session)
    return run_stages(ctx)
