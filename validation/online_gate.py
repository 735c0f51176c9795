"""The online gate of a rolling update: a labelled canary set replayed through the live component during
each bake.

Every answer is attributed to the model that gave it by the model sha256 the server reports with it, so
the candidate is scored on its own answers even while champion copies still serve beside it, and it is
compared with the champion's answers to the same tasks under the release's thresholds and champion rule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from validation.gates import GateReport, evaluate_gates
from validation.runner import SEMIF, Prediction, Readout, run_decisions
from validation.retry_policy import DEFAULT_RETRY_DEADLINE_S


@dataclass
class OnlineGate:
    """Replays `tasks` through a live component and judges the candidate's answers as they come in."""

    invoker: Any  # tasks.backends.interfaces.Invoker of the live (production) component
    tasks: Sequence[Any]  # validation.jevbench.JevTask, the canary split
    candidate_model_sha256: str
    thresholds: Any  # validation.gates.DecisionThresholds
    champion_rule: Any  # validation.gates.ChampionRule
    rounds: int = 4
    concurrency: int = 2
    timeout_s: float = 60.0
    readout: Readout = SEMIF  # how the live component is asked (SemIf's decisions, or chat completions)
    decision_rule: str = "bound"  # validation.decision_rule: how the absolute checks read their evidence
    retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S  # no capacity / throttling retried while the component answers
    answers: dict[str, dict[str, Prediction]] = field(default_factory=dict)  # model sha256 -> task id -> answer
    unattributed: int = 0  # answers with no model identity (failed requests, malformed bodies)
    lost: int = 0  # of those, requests that got no answer (refused as retryable to the retry deadline, unreachable)

    def replay(self) -> None:
        """Send the canary tasks the candidate has not answered yet, up to `rounds` times (the router sends
        each to whichever copy is least busy, so some land on champion copies)."""
        for _ in range(self.rounds):
            pending = [task for task in self.tasks if task.id not in self._of(self.candidate_model_sha256)]
            if not pending:
                return
            for answer in run_decisions(self.invoker, pending, concurrency=self.concurrency, timeout_s=self.timeout_s,
                                        retry_deadline_s=self.retry_deadline_s, dataset_name="canary",
                                        readout=self.readout):
                if answer.model_sha256 is None:
                    self.unattributed += 1
                    self.lost += answer.lost
                else:
                    self.answers.setdefault(answer.model_sha256, {})[answer.id] = answer

    def _of(self, model_sha256: str) -> dict[str, Prediction]:
        return self.answers.get(model_sha256, {})

    def report(self) -> GateReport | None:
        """The gate on the candidate's answers, with the champion's on the same tasks when there are enough
        of them; None until the candidate has answered `champion_rule.min_samples` tasks."""
        mine = self._of(self.candidate_model_sha256)
        if len(mine) < self.champion_rule.min_samples:
            return None
        ids = [task.id for task in self.tasks if task.id in mine]
        others = [sha for sha in self.answers if sha != self.candidate_model_sha256]
        champion = self._of(others[0]) if len(others) == 1 else {}
        shared = [task_id for task_id in ids if task_id in champion]
        champion_rows = [champion[i].to_dict() for i in shared] if len(shared) >= self.champion_rule.min_samples else None
        return evaluate_gates([mine[i].to_dict() for i in ids], thresholds=self.thresholds, champion_preds=champion_rows,
                              champion_rule=self.champion_rule, decision_rule=self.decision_rule)

    def alarm(self) -> str | None:
        """The alarm a failed online gate raises (which rolls the rollout back), or None."""
        report = self.report()
        if report is None or report.decision != "fail":
            return None
        failed = "; ".join(f"{c.name}: {c.reason}" for c in report.checks if c.status == "fail")
        return f"online gate failed on {len(self._of(self.candidate_model_sha256))} canary tasks: {failed}"

    def evidence(self) -> dict[str, Any]:
        """What the gate has seen so far, for the ledger's traffic step."""
        report = self.report()
        return {
            "answers": {sha[:12]: len(by_task) for sha, by_task in sorted(self.answers.items())},
            "candidate_answers": len(self._of(self.candidate_model_sha256)),
            "unattributed": self.unattributed,
            "lost": self.lost,
            "decision": None if report is None else report.decision,
            "checks": [] if report is None else [
                {"name": c.name, "status": c.status, "observed": c.observed, "threshold": c.threshold}
                for c in report.checks if c.status != "skipped"],
        }
