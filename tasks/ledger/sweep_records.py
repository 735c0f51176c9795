"""A sweep's ledger records read back (stage `sweep`, release id the sweep's id, model its base config's): opened with
the rule and the candidates before any is evaluated, one `evaluated` (or `failed`) record per candidate, the `picked`
record, and `handed_off` once the pick's own release runs. Nothing else is needed to re-derive the pick (`shiplift sweep
explain`, the audit); `tasks.sweeps.records` writes the opening."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from shiplift.tasks.errors import BadInput, IntegrityError, NotFound
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.views import one_match
from shiplift.validation.sweep_rule import CandidateEvidence, Pick, SelectionRule, Verdict, choose
from shiplift.validation.sweep_speed import (
    AS_MEASURED,
    SIDE_BY_SIDE,
    GateWindow,
    SpeedScale,
    on_one_scale,
    scaled_champion,
)

SWEEP_ID_PREFIX = "sweep-"  # a sweep's id: this, its name and its content's sha256 prefix (tasks.sweeps.config)


@dataclass(frozen=True)
class SweepRecords:
    """What the ledger holds of one sweep, as read at once (`read`): frozen, so what is derived from the records is
    computed once per read (`_on_scale`)."""

    sweep_id: str
    opened: dict | None = None
    opened_at: str | None = None
    opened_by: str | None = None
    evaluated: dict[str, dict] = field(default_factory=dict)  # candidate name → its evaluated payload
    failed: dict[str, dict] = field(default_factory=dict)  # candidate name → its latest failure, if not evaluated since
    picked: dict | None = None
    handed_off: dict | None = None

    @classmethod
    def read(cls, ledger, sweep_id: str) -> SweepRecords:
        """The sweep's records (none yet: an empty SweepRecords)."""
        try:
            records = ledger.release(sweep_id)
        except NotFound:
            return cls(sweep_id)
        opened = opened_at = opened_by = picked = handed_off = None
        evaluated: dict[str, dict] = {}
        failed: dict[str, dict] = {}
        for record in records:
            if record.stage != events.SWEEP:
                continue
            payload = record.payload
            if record.event == events.OPENED and opened is None:
                opened, opened_at, opened_by = payload, record.recorded_at, record.actor
            elif record.event == events.EVALUATED:
                evaluated.setdefault(payload["candidate"], payload)
                failed.pop(payload["candidate"], None)
            elif record.event == events.FAILED and payload["candidate"] not in evaluated:
                failed[payload["candidate"]] = payload
            elif record.event == events.PICKED:
                picked = payload
            elif record.event == events.HANDED_OFF:
                handed_off = payload
        return cls(sweep_id, opened=opened, opened_at=opened_at, opened_by=opened_by, evaluated=evaluated,
                   failed=failed, picked=picked, handed_off=handed_off)

    @classmethod
    def load(cls, ledger, sweep_id: str) -> SweepRecords:
        """The records of a sweep that was opened; NotFound otherwise."""
        found = cls.read(ledger, sweep_id)
        if found.opened is None:
            raise NotFound(f"sweep {sweep_id!r} was never opened in this ledger",
                           fix="run `shiplift sweep run CONFIG` first, or point --state-dir / --ledger-url at its "
                               "ledger")
        return found

    @property
    def rule(self) -> SelectionRule:
        """The rule as recorded when the sweep opened; IntegrityError when it no longer hashes to the recorded
        sha256."""
        rule = SelectionRule.model_validate(self.opened["rule"])
        if rule.sha256() != self.opened["rule_sha256"]:
            raise IntegrityError(f"sweep {self.sweep_id}: the recorded rule hashes to {rule.sha256()}, but the sweep "
                                 f"opened with rule sha256 {self.opened['rule_sha256']}",
                                 fix="run `shiplift ledger verify`: a record was changed")
        return rule

    @property
    def candidates(self) -> list[dict]:
        """The candidates as the opening recorded them (name, release id, config sha256, values, overrides)."""
        return self.opened["candidates"]

    def measured_evidence(self) -> list[CandidateEvidence]:
        """Every recorded candidate's evidence as its gate measured it, in the order the sweep lists them."""
        return [CandidateEvidence.from_json(self.evaluated[name]["evidence"]) for name in self._evaluated_names()]

    def evidence(self) -> list[CandidateEvidence]:
        """The evidence the rule judges: as measured, with the speeds on one scale where the sweep opened comparing
        them side by side (`validation.sweep_speed`; a sweep opened before that judged them as measured)."""
        return list(self._on_scale[0])

    def speed_scale(self) -> SpeedScale:
        """How the speeds the rule judges were put on one scale (or why they are as measured)."""
        return self._on_scale[1]

    def _evaluated_names(self) -> list[str]:
        return [c["name"] for c in self.candidates if c["name"] in self.evaluated]

    @functools.cached_property
    def _on_scale(self) -> tuple[list[CandidateEvidence], SpeedScale]:
        """`evidence` and `speed_scale` at once, from every evaluated payload parsed once per read."""
        measured = self.measured_evidence()
        if self.opened.get("speed") != SIDE_BY_SIDE:
            return measured, SpeedScale(AS_MEASURED, None, {e.name: 1.0 for e in measured}, {},
                                        "speeds as measured: the sweep opened before speeds were compared side by "
                                        "side")
        return on_one_scale(measured, {name: GateWindow.of(self.evaluated[name]) for name in self._evaluated_names()})

    def champion(self) -> CandidateEvidence | None:
        """The champion as the first evaluated candidate's gate measured it (None when none served), on the scale
        the candidates' speeds are on."""
        first = next((name for name in self._evaluated_names() if self.evaluated[name].get("champion")), None)
        if first is None:
            return None
        return scaled_champion(CandidateEvidence.from_json(self.evaluated[first]["champion"]),
                               GateWindow.of(self.evaluated[first]), self.speed_scale())

    def recorded_pick(self) -> Pick | None:
        """The pick as its record holds it (None before the sweep picked)."""
        if self.picked is None:
            return None
        pick = self.picked["pick"]
        return Pick(rule_sha256=pick["rule_sha256"], picked=pick["picked"], frontier=list(pick["frontier"]),
                    verdicts=[Verdict(**verdict) for verdict in pick["verdicts"]])

    def pending(self) -> list[str]:
        """The candidates without evidence yet."""
        return [c["name"] for c in self.candidates if c["name"] not in self.evaluated]



def held_out_text(opened: dict) -> str:
    """The base's gate datasets (what the pick's own gate reads), as the reports name them."""
    return "; ".join(f"{ref['path']} {ref.get('splits') or 'all splits'}" for ref in opened["held_out"])


def resolve_sweep(ledger, text: str) -> str:
    """The full id of the sweep `text` names (the id, or a unique prefix or suffix of it, with or without `sweep-`)."""
    if not text.strip():
        raise BadInput("sweep id is empty", fix="pass a sweep id as `shiplift sweep run` printed it")
    known = list(dict.fromkeys(r.release_id for r in ledger.events(events.SWEEP, events.OPENED)))
    return one_match(text, known, sweep_id_matches, noun="sweep", ambiguous_fix="pass more of the id",
                     missing_fix="pass --state-dir / --ledger-url naming the sweep's ledger")


def sweep_id_matches(text: str, sweep_id: str) -> bool:
    """Whether `text` names `sweep_id`: the id, a prefix of it with or without `sweep-`, or a suffix."""
    return sweep_id.startswith(text) or sweep_id.startswith(SWEEP_ID_PREFIX + text) or sweep_id.endswith(text)


def explanation(records: SweepRecords) -> dict:
    """The pick re-derived from the ledger alone (`choose` on the recorded rule and evidence), beside the recorded
    pick: whether they agree, and each candidate's verdict (why it lost: a constraint, or dominated by whom)."""
    rule = records.rule
    evidence = records.evidence()
    derived = choose(rule, evidence) if evidence else None
    recorded = records.recorded_pick()
    return {"sweep_id": records.sweep_id, "rule_sha256": rule.sha256(), "rule": rule.canonical(),
            "opened_at": records.opened_at, "opened_by": records.opened_by,
            "evaluated": len(evidence), "candidates": len(records.candidates), "pending": records.pending(),
            "candidate_configs": records.candidates,
            "recorded_pick": recorded.to_json() if recorded else None,
            "derived_pick": derived.to_json() if derived else None,
            "agrees": recorded is not None and derived is not None and derived == recorded,
            "speed": records.speed_scale().to_json(),
            "verdicts": [v.to_json() for v in derived.verdicts] if derived else []}
