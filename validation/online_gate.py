"""The online gate of a rolling update: a labelled canary set replayed through the live component during
each bake.

Every answer is attributed to what served it: by the serving id the copy echoes (`Prediction.serving_id`, a hash of
the component's image, artifact and container environment, `tasks.backends.interfaces.ComponentSpec.serving_id`), or,
where a server echoes none (an older image, the DLC on aws), by the model sha256 it reports. So the candidate is
scored on its own answers even while champion copies still serve beside it, also when both run the same GGUF at
another temperature, and it is compared with the champion's answers to the same tasks under the release's thresholds
and champion rule.

Too few answers is no evidence, not a pass: a gate that has not decided (the candidate answered fewer than
`min_samples` tasks, or a check is inconclusive) follows the release's `validation.inconclusive.choice`: `extend`
replays more rounds (at most `extend_rounds` a bake) until it decides; `block`, and `ask` (a bake cannot hold production
mid-rollout waiting for a person), raise the alarm that rolls the rollout back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shiplift.validation.gates import GateReport, evaluate_gates
from shiplift.validation.retry_policy import DEFAULT_RETRY_DEADLINE_S
from shiplift.validation.runner import SEMIF, Prediction, Readout, run_decisions

InconclusiveChoice = Literal["block", "extend", "ask"]
DECIDED = ("pass", "fail")


@dataclass
class OnlineGate:
    """Replays `tasks` through a live component and judges the candidate's answers as they come in."""

    invoker: Any  # tasks.backends.interfaces.Invoker of the live (production) component
    tasks: Sequence[Any]  # validation.decisions.jevbench.JevTask, the canary split
    candidate_model_sha256: str
    thresholds: Any  # validation.gates.DecisionThresholds
    champion_rule: Any  # validation.gates.ChampionRule
    rounds: int = 4
    concurrency: int = 2
    timeout_s: float = 60.0
    readout: Readout = SEMIF  # how the live component is asked (SemIf's decisions, or chat completions)
    decision_rule: str = "bound"  # validation.decision_rule: how the absolute checks read their evidence
    retry_deadline_s: float = DEFAULT_RETRY_DEADLINE_S  # no capacity / throttling retried while the component answers
    candidate_serving_id: str | None = None  # the candidate spec's serving id; None: attributed by model sha256 alone
    inconclusive: InconclusiveChoice = "block"  # validation.inconclusive.choice, for a gate that has not decided
    extend_rounds: int = 0  # with extend: the most extra rounds one bake replays while the gate has not decided
    answers: dict[str, dict[str, Prediction]] = field(default_factory=dict)  # serving identity -> task id -> answer
    unattributed: int = 0  # answers with no identity (failed requests, malformed bodies)
    lost: int = 0  # of those, requests that got no answer (refused as retryable to the retry deadline, unreachable)
    extended: int = 0  # extra rounds replayed so far (extend)

    @property
    def candidate(self) -> str:
        """The key of the candidate's answers: its serving id, or its model sha256 where it has none."""
        return self.candidate_serving_id or self.candidate_model_sha256

    def identity(self, answer: Prediction) -> str | None:
        """Who gave `answer`: its serving id where both it and the candidate have one, else its model sha256 (answers
        of a server that echoes no serving id stay readable); the candidate's answers under `candidate`."""
        if answer.serving_id is not None and self.candidate_serving_id is not None:
            return self.candidate if answer.serving_id == self.candidate_serving_id else answer.serving_id
        if answer.model_sha256 is None:
            return None
        return self.candidate if answer.model_sha256 == self.candidate_model_sha256 else answer.model_sha256

    def replay(self) -> None:
        """Send the canary tasks the candidate has not answered yet, up to `rounds` times (the router sends each to
        whichever copy is least busy, so some land on champion copies), then `extend`."""
        for _ in range(self.rounds):
            pending = self._pending(champion_too=False)
            if not pending:
                break
            self._send(pending)
        self.extend()

    def extend(self) -> None:
        """With `extend`, while the gate has not decided, up to `extend_rounds` rounds that resend the tasks the
        candidate or the champion has not answered, until it decides or a round brings no new answer; nothing with
        `block` or `ask`. (Also on its own, where the bake is over but the choice allows more evidence.)"""
        if self.inconclusive != "extend":
            return
        for _ in range(self.extend_rounds):
            if self.decision() in DECIDED:
                return
            pending = self._pending(champion_too=True)
            if not pending:
                return
            self.extended += 1
            if not self._send(pending):
                return

    def _pending(self, *, champion_too: bool) -> list[Any]:
        """The canary tasks the candidate has not answered (and, with `champion_too`, those the champion has not)."""
        mine, champion = self._of(self.candidate), self._champion()
        return [task for task in self.tasks if task.id not in mine or (champion_too and task.id not in champion)]

    def _send(self, pending: Sequence[Any]) -> int:
        """One round of `pending` through the live component; how many answers were new (a task an identity had not
        answered before)."""
        new = 0
        for answer in run_decisions(self.invoker, pending, concurrency=self.concurrency, timeout_s=self.timeout_s,
                                    retry_deadline_s=self.retry_deadline_s, dataset_name="canary",
                                    readout=self.readout):
            who = self.identity(answer)
            if who is None:
                self.unattributed += 1
                self.lost += answer.lost
                continue
            by_task = self.answers.setdefault(who, {})
            new += answer.id not in by_task
            by_task[answer.id] = answer
        return new

    def _of(self, identity: str) -> dict[str, Prediction]:
        return self.answers.get(identity, {})

    def _champion(self) -> dict[str, Prediction]:
        """The champion's answers: those of the one other identity that answered (none when several did)."""
        others = [who for who in self.answers if who != self.candidate]
        return self._of(others[0]) if len(others) == 1 else {}

    def report(self) -> GateReport | None:
        """The gate on the candidate's answers, with the champion's on the same tasks when there are enough
        of them; None until the candidate has answered `champion_rule.min_samples` tasks."""
        mine = self._of(self.candidate)
        if len(mine) < self.champion_rule.min_samples:
            return None
        ids = [task.id for task in self.tasks if task.id in mine]
        champion = self._champion()
        shared = [task_id for task_id in ids if task_id in champion]
        champion_rows = [champion[i].to_dict()
                         for i in shared] if len(shared) >= self.champion_rule.min_samples else None
        # no latency ratio live: the router, not the gate, picks which copy answers, so the two are not measured
        # alternately, and the offline gate judged the ratio side by side already
        rule = self.champion_rule.model_copy(update={"max_p95_ratio": None})
        return evaluate_gates([mine[i].to_dict() for i in ids], thresholds=self.thresholds,
                              champion_preds=champion_rows,
                              champion_rule=rule, decision_rule=self.decision_rule)

    def decision(self) -> str:
        """pass, fail, or inconclusive (also while the candidate has answered too few tasks to judge)."""
        report = self.report()
        return "inconclusive" if report is None else report.decision

    def alarm(self) -> str | None:
        """The alarm that rolls the rollout back, or None when the gate passed: a failed gate's checks, or an undecided
        gate's evidence with the way out (never a silent pass)."""
        report = self.report()
        if report is not None and report.decision == "pass":
            return None
        answered = len(self._of(self.candidate))
        if report is not None and report.decision == "fail":
            failed = "; ".join(f"{c.name}: {c.reason}" for c in report.checks if c.status == "fail")
            return f"online gate failed on {answered} canary tasks: {failed}"
        if report is None:
            why = (f"{answered} of {self.champion_rule.min_samples} answers the candidate needs "
                   f"(validation.champion.min_samples)")
        else:
            undecided = "; ".join(f"{c.name}: {c.reason}" for c in report.checks if c.status == "inconclusive")
            why = f"on {answered} canary tasks, {undecided or report.decision}"
        choice = {"block": "validation.inconclusive.choice is block",
                  "ask": "validation.inconclusive.choice is ask, but a bake cannot hold production mid-rollout "
                         "waiting for a person, so it blocks",
                  "extend": f"{self.extended} extra rounds (rollout.online_gate.extend_rounds {self.extend_rounds}) "
                            "did not decide it"}[self.inconclusive]
        return (f"online gate inconclusive: {why} ({len(self.tasks)} canary tasks, {self.unattributed} unattributed, "
                f"{self.lost} lost); {choice}. Fix: give the gate more evidence (rollout.online_gate.rounds or "
                "max_tasks, a larger first batch), or validation.inconclusive.choice: extend with "
                "rollout.online_gate.extend_rounds; if the new copies lost answers, read their logs")

    def evidence(self) -> dict[str, Any]:
        """What the gate has seen so far, for the ledger's traffic step: answers per identity (the candidate's under
        its serving id where it has one), the decision (inconclusive included) and its checks."""
        report = self.report()
        return {
            "answers": {who[:12]: len(by_task) for who, by_task in sorted(self.answers.items())},
            "candidate": self.candidate[:12],
            "attributed_by": "serving_id" if self.candidate_serving_id else "model_sha256",
            "candidate_answers": len(self._of(self.candidate)),
            "min_samples": self.champion_rule.min_samples,
            "unattributed": self.unattributed,
            "lost": self.lost,
            "decision": "inconclusive" if report is None else report.decision,
            "inconclusive_choice": self.inconclusive,
            "extended_rounds": self.extended,
            "checks": [] if report is None else [
                {"name": c.name, "status": c.status, "observed": c.observed, "threshold": c.threshold}
                for c in report.checks if c.status != "skipped"],
        }
