"""An approver's answer, delivered to wherever the release waits for it (`shiplift approve` / `shiplift reject`).

A release that `shiplift release` left waiting continues here: the decision is recorded under the model's lease and
the remaining stages run. A release waiting in a Step Functions execution gets the decision recorded and sent with its
task token instead, and the execution goes on by itself (`tasks.orchestrators.task_token`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shiplift.tasks.orchestrators.task_token import decide_for_execution
from shiplift.tasks.pipeline.approval import decide, waiting_execution
from shiplift.tasks.pipeline.release import (
    Progress,
    holding_lease,
    in_policy,
    print_progress,
    reopen_release,
    run_holder,
    run_stages,
)
from shiplift.tasks.pipeline.table import APPROVAL_DECISION


def answer_approval(release_id: str, *, approve: bool, reason: str, actor: str | None = None,
                    ledger_url: str | None = None, state_dir: str | Path | None = None,
                    progress: Progress = print_progress, session: Any = None) -> dict:
    """Record an approver's decision (`tasks.pipeline.approval.decide`, which refuses what it must; the policy table's
    `approval_decision`) under the model's lease, taken back, then run the release's remaining stages. A release waiting
    in a Step Functions execution (its request names the execution's task token) is answered there instead: the decision
    is recorded and sent with the token its request names (`tasks.orchestrators.task_token.decide_for_execution`), and
    the execution promotes or skips promote itself; its result then also carries `step_functions`. Returns the decision
    with the release's summary."""
    ctx = reopen_release(release_id, ledger_url=ledger_url, state_dir=state_dir, actor=actor, progress=progress,
                         session=session)
    if waiting_execution(ctx.state.records) is not None:
        return in_policy(ctx, APPROVAL_DECISION.name,
                         lambda: decide_for_execution(ctx, approve=approve, reason=reason, session=session))
    with holding_lease(ctx, run_holder(ctx.actor)):
        decision = in_policy(ctx, APPROVAL_DECISION.name,
                             lambda: decide(ctx, approve=approve, actor=ctx.actor, reason=reason))
    return {**decision, "summary": run_stages(ctx)}
