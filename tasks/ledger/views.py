"""Audit views of the ledger (DESIGN §10): one row per release, one release in full, two side by side, what
served a model at a moment and on what evidence, a model's timeline of releases, traffic and rollbacks, and the
release an id a person typed names (a prefix, a suffix, or a table's shortened form).

Pure reads of the records a `Ledger` returns: they never write and never ask an endpoint (drift is
`tasks.pipeline.audit`'s job). The CLI prints them as tables, `--json` as they are; the audit report renders them.
"""

from __future__ import annotations

import difflib
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from shiplift.tasks.console import SHORTENED_MARK, flatten
from shiplift.tasks.errors import BadInput, NotFound
from shiplift.tasks.ledger.events import (
    APPROVAL,
    AWAITING_APPROVAL,
    BAKE,
    FAILED,
    FINAL,
    LEDGER,
    OPENED,
    PROMOTE,
    RELEASE,
    ROLLED_BACK,
    STEP,
    SUCCEEDED,
    SWEEP,
    TRAFFIC,
    VALIDATE,
    VERDICT,
)
from shiplift.tasks.ledger.records import (
    Approval,
    Failure,
    OnlineGateEvidence,
    Opened,
    Retirement,
    StepRecord,
    is_fleet_move,
    is_promotion,
    is_retirement,
    promotion,
    recorded,
    stage_payload,
)
from shiplift.tasks.ledger.release_state import ReleaseState, release_summary
from shiplift.tasks.ledger.stage_results import (
    BuildResult,
    ImageResult,
    PackageResult,
    PromoteResult,
    ResolveResult,
    ValidateResult,
)
from shiplift.tasks.ledger.timestamps import moment_text


def _states(records: list) -> list[ReleaseState]:
    """The records grouped into releases, in the order each release first appears."""
    grouped: dict[str, list] = defaultdict(list)
    for record in records:
        grouped[record.release_id].append(record)
    return [ReleaseState.from_records(release_id, group) for release_id, group in grouped.items()]


def _first(state: ReleaseState, stage: str, event: str):
    return next((r for r in state.records if (r.stage, r.event) == (stage, event)), None)


def _promotions(state: ReleaseState) -> list:
    """Every promote record of a release that changed production: promotions, rollbacks to it, automatic rollbacks."""
    return [r for r in state.records if r.stage == PROMOTE and r.event in (SUCCEEDED, ROLLED_BACK)]


def gate_evidence(gate: ValidateResult) -> dict:
    """A gate's evidence as a release's detail shows it: decision, metrics, thresholds, checks, datasets, champion
    (and whether its per-task results were reused, from which release), the checks not passed, its cost and an
    inconclusive gate's choice."""
    return {"decision": gate.decision, "metrics": gate.metrics, "thresholds": gate.thresholds, "checks": gate.checks,
            "datasets": gate.datasets, "champion_release": gate.champion_release,
            "champion_evidence": gate.champion_evidence, "not_passed": gate.not_passed, "cost": gate.cost,
            "inconclusive": gate.inconclusive}


def release_detail(state: ReleaseState) -> dict:
    """One release in full: who opened it when, what it was built from, its gate evidence and every promotion."""
    summary = release_summary(state)
    opened = _first(state, RELEASE, OPENED)
    opening = Opened.of(opened) if opened else Opened()
    resolve, build = recorded(state, ResolveResult), recorded(state, BuildResult)
    package, image, gate = recorded(state, PackageResult), recorded(state, ImageResult), recorded(state, ValidateResult)
    return {
        **summary,
        "opened_at": opened.recorded_at if opened else None,
        "opened_by": opened.actor if opened else None,
        "config_hash": opening.config_hash,
        "config": opening.config,
        "source_sha256": resolve.source_sha256 if resolve else None,
        "model_sha256": build.model_sha256 if build else None,
        # what shaped the served numbers besides the model (a GGUF build's llama.cpp, threads, batches, cache)
        "determinism": (build.model_extra or {}).get("determinism") if build else None,
        "artifact_uri": package.artifact_uri if package else None,
        "image_digest": image.image_digest if image else None,
        "gate": gate_evidence(gate) if gate else None,
        "promotions": [_promotion_row(r) for r in _promotions(state)],
        "approval": [_approval_row(r) for r in state.records if r.stage == APPROVAL],
        "records": len(state.records),
        "first_at": state.records[0].recorded_at if state.records else None,
        "last_at": state.records[-1].recorded_at if state.records else None,
    }


def _promotion_row(record) -> dict:
    """One promote record: when, by whom, its trigger (`release` where it names none), where, why, how many steps."""
    promoted = promotion(record)
    return {"seq": record.seq, "at": record.recorded_at, "actor": record.actor, "event": record.event,
            "trigger": promoted.trigger or "release", "strategy": promoted.strategy,
            "endpoint": promoted.endpoint, "component": promoted.component,
            "reason": promoted.rollback_reason or promoted.reason,
            "rollback_from": promoted.rollback_from, "steps": len(promoted.steps or [])}


def _approval_row(record) -> dict:
    """One approval record: the request (who may decide, until when) or the decision (by whom, why)."""
    approval = Approval.of(record)
    return {"seq": record.seq, "at": record.recorded_at, "event": record.event, "actor": record.actor,
            "by": approval.by, "reason": approval.reason, "deadline": approval.deadline,
            "approvers": approval.approvers, "report_sha256": approval.report_sha256 or
            (approval.gate.report_sha256 if approval.gate else None)}


def details(records: list) -> list[dict]:
    """Every release of these records in full (`release_detail`), in the order each first appears."""
    return [release_detail(state) for state in _states(records)]


def release_row(detail: dict) -> dict:
    """A release's row in a history: opened when and by whom, its status, gate decision and last promotion."""
    last = detail["promotions"][-1] if detail["promotions"] else None
    return ({key: detail[key] for key in ("release_id", "model", "opened_at", "opened_by", "status", "decision",
                                          "artifact_sha256", "image_digest", "records", "first_at", "last_at")}
            | {"promoted_at": last["at"] if last and last["event"] == SUCCEEDED else None,
               "strategy": detail["rollout"]["strategy"]})


def of_releases(records: list) -> list:
    """The records of releases: the ledger's own records of its signed checkpoints (model LEDGER) and a sweep's own
    records (stage SWEEP) belong to none."""
    return [record for record in records if record.model != LEDGER and record.stage != SWEEP]


def releases(ledger, model: str | None = None) -> list[dict]:
    """One row per release (oldest first), of one model or of all."""
    return [release_row(detail) for detail in details(of_releases(ledger.history(model)))]


SHORTENED = (SHORTENED_MARK, "...")  # how a table shortens an id (`gemma-…3d396`), and how a person may type it


def release_id_matches(text: str, release_id: str) -> bool:
    """Whether `text` names `release_id` as git names a hash: a prefix, a suffix, or a table's shortened form
    (`gemma-…3d396`: that prefix and that suffix)."""
    for mark in SHORTENED:
        if mark in text:
            head, _, tail = text.partition(mark)
            fits = len(release_id) >= len(head) + len(tail)
            return fits and release_id.startswith(head) and release_id.endswith(tail)
    return release_id.startswith(text) or release_id.endswith(text)


def resolve_release(ledger, text: str) -> str:
    """The full id of the release `text` names (the id, a unique prefix or suffix, or the shortened form a table
    prints); BadInput listing the candidates when several match, NotFound naming the nearest ids when none does."""
    if not text.strip(" …."):
        raise BadInput(f"release id {text!r} is empty", fix="pass a release id as `shiplift ledger history` lists it")
    try:
        if of_releases(ledger.release(text)):  # the full id, as orchestrators pass it: one query
            return text
    except NotFound:
        pass
    known = list(dict.fromkeys(record.release_id for record in of_releases(ledger.history())))
    return one_match(text, known, release_id_matches, noun="release",
                     ambiguous_fix="pass more of the id (the --json output carries every id in full)",
                     missing_fix="list releases with `shiplift ledger history` (or pass --state-dir / --ledger-url "
                                 "naming another ledger)")


def one_match(text: str, known: list[str], matches: Callable[[str, str], bool], *, noun: str, ambiguous_fix: str,
              missing_fix: str) -> str:
    """The one id of `known` that `text` names (`matches(text, id)`; `text` itself when it is one of them): the
    resolution every id argument shares, BadInput listing the candidates when several match, NotFound naming the
    nearest ids when none does."""
    found = [known_id for known_id in known if matches(text, known_id)]
    if text in found:
        return text
    if len(found) == 1:
        return found[0]
    if found:
        raise BadInput(f"{noun} id {text!r} is ambiguous: it matches {', '.join(found)}", fix=ambiguous_fix)
    nearest = difflib.get_close_matches(text, known, n=3, cutoff=0.4)
    raise NotFound(f"no {noun} in the ledger matches {text!r}" + (f"; the nearest: {', '.join(nearest)}" if nearest
                                                                   else ""), fix=missing_fix)


def show(ledger, release_id: str) -> dict:
    """One release in full, with its stages' statuses."""
    return release_detail(ReleaseState.from_records(release_id, ledger.release(release_id)))


def config_changes(before: dict | None, after: dict) -> list[dict]:
    """The config fields (dotted) whose value differs between two releases' configs, each with both values: what a
    candidate changed against its champion (`before` None: no champion, nothing to compare)."""
    if before is None:
        return []
    old, new = flatten(before), flatten(after)
    return [{"field": name, "champion": old.get(name), "candidate": new.get(name)}
            for name in sorted(old.keys() | new.keys()) if old.get(name) != new.get(name)]


def field_rows(values: dict, column: str) -> list[dict]:
    """A (field, value) table of a dict, a nested dict's fields one row each (`placement.instance_type`)."""
    return [{column: name, "value": value} for name, value in flatten(values).items()]


CHECK_COLUMNS = ["check", "status", "observed", "interval", "rule", "n"]


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def check_cells(check: dict) -> dict:
    """A gate check as table cells: status, observed value, its interval, the rule it was held to, sample size."""
    ci = check.get("ci")
    rule = f"{check.get('comparator', '')} {_number(check['threshold'])}" if check.get("threshold") is not None else ""
    return {"check": check["name"], "status": check["status"], "observed": _number(check.get("observed")),
            "interval": f"[{_number(ci[0])}, {_number(ci[1])}]" if ci else "", "rule": rule, "n": check.get("n")}


CHECK_FIELDS = ("status", "observed", "ci", "comparator", "threshold", "n")  # what a diff compares of a gate check


def _check_value(check: dict) -> dict:
    """A gate check as one diff value: its status, observed value and interval (`ci`, [lo, hi]), rule and n,
    unrounded."""
    return {key: check.get(key) for key in CHECK_FIELDS}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def numeric(value: Any) -> float | int | None:
    """The number a diff value stands for: itself, or a check's observed value; None for anything else."""
    if isinstance(value, dict) and "observed" in value:
        value = value["observed"]
    return value if _is_number(value) else None


def delta(a: Any, b: Any) -> float | int | None:
    """b − a where both sides are numbers (a check: its observed value), else None."""
    x, y = numeric(a), numeric(b)
    return None if x is None or y is None else y - x


def _diff_fields(detail: dict) -> dict[str, Any]:
    """What `diff` compares, as flat field -> value."""
    gate = detail["gate"] or {}
    fields: dict[str, Any] = {
        name: detail[name] for name in ("status", "config_hash", "source_sha256", "model_sha256", "artifact_sha256",
                                        "artifact_uri", "image_uri", "image_digest")
    }
    fields |= flatten(detail["placement"] or {}, "placement")
    fields |= flatten(detail["determinism"] or {}, "determinism")
    fields["gate.decision"] = gate.get("decision")
    fields["gate.champion_release"] = gate.get("champion_release")
    fields |= flatten(gate.get("metrics") or {}, "metric")
    fields |= flatten(gate.get("thresholds") or {}, "threshold")
    fields |= {f"check.{c['name']}": _check_value(c) for c in gate.get("checks") or []}
    fields |= {f"dataset.{d['name']}.sha256": d.get("sha256") for d in gate.get("datasets") or []}
    fields["rollout.strategy"] = detail["rollout"]["strategy"]
    return fields


def diff(ledger, release_a: str, release_b: str) -> dict:
    """Two releases side by side: config (the fields that differ), artifact, image digest, placement obtained,
    gate metrics, thresholds and checks (each a dict with its interval `ci`); per field `delta` is b − a where both
    are numbers (a check's observed value), unrounded; `changed` names every field that differs."""
    a, b = show(ledger, release_a), show(ledger, release_b)
    fields_a, fields_b = _diff_fields(a), _diff_fields(b)
    config_a, config_b = flatten(a["config"] or {}, "config"), flatten(b["config"] or {}, "config")
    config_changed = {key for key in config_a.keys() | config_b.keys() if config_a.get(key) != config_b.get(key)}
    fields_a |= {key: config_a.get(key) for key in config_changed}
    fields_b |= {key: config_b.get(key) for key in config_changed}
    names = list(dict.fromkeys([*fields_a, *fields_b]))
    rows = [{"field": name, "a": fields_a.get(name), "b": fields_b.get(name),
             "same": fields_a.get(name) == fields_b.get(name), "delta": delta(fields_a.get(name), fields_b.get(name))}
            for name in names]
    return {"release_a": release_a, "release_b": release_b, "rows": rows,
            "changed": [row["field"] for row in rows if not row["same"]],
            "config_fields_same": len(config_a.keys() | config_b.keys()) - len(config_changed)}


STEP_FIELDS = {"phase", "batch", "check", "batches", "old_copies", "new_copies", "copies", "old_spec_sha256",
               "new_spec_sha256", "alarm_states", "alarm"}  # a RolloutStep's, as a traffic record carries them
VERDICT_FIELDS = {"alarm_states", "online_gate", "alarm"}  # what a bake's verdict adds to its step


def step_key(payload: dict) -> tuple:
    """What tells a traffic step (or its verdict) from the rollout's others: phase, batch, check."""
    return StepRecord.model_validate(payload).key()


def step_fields(step: StepRecord) -> dict:
    """A traffic step's fields as the views show them (those its record lacks None), in `StepRecord`'s order."""
    return step.model_dump(include=STEP_FIELDS)


def rollout_steps(records: list) -> list[dict]:
    """A rollout's traffic steps as recorded (the records of one promote attempt), in order, each with its bake's
    verdict: the step's fields, when it was recorded (`at`), what the backend described as serving then (`live`) and,
    once baked, the verdict's alarm states, online gate evidence and alarm, and when (`baked_at`)."""
    steps: dict[tuple, dict] = {}
    for record in records:
        if (record.stage, record.event) not in ((TRAFFIC, STEP), (BAKE, VERDICT)):
            continue
        step = StepRecord.of(record)
        if record.stage == TRAFFIC and step.key() not in steps:
            steps[step.key()] = {**step_fields(step), "at": record.recorded_at,
                                 **step.model_dump(include={"live"}, exclude_unset=True)}
        elif record.stage == BAKE:
            row = steps.setdefault(step.key(), step_fields(step))
            row.update(step.model_dump(include=VERDICT_FIELDS, exclude_unset=True), baked_at=record.recorded_at)
    return list(steps.values())


def _whole(promoted) -> list[dict]:
    """The release a completed promotion put on production, on every copy."""
    if promoted is None:
        return []
    return [{"release_id": promoted.release_id, "copies": promotion(promoted).copies, "share": 1.0,
             "since": promoted.recorded_at}]


def _serving(promoted, rollout: dict | None) -> list[dict]:
    """Each release serving, with its copies and share of them, given the last completed promotion and the rollout
    under way since (its last traffic step). Where the backend reports one copy count for the whole component
    (SageMaker), both releases of a rollout are named with copies and share unknown (None)."""
    if rollout is None:
        return _whole(promoted)
    step, source, target = rollout["step"], rollout["from_release"], rollout["release_id"]
    source_since = promoted.recorded_at if promoted is not None and promoted.release_id == source else None
    old, new = step.get("old_copies"), step.get("new_copies")
    if old is None and new is None:
        if step.get("phase") == "rollback":  # SageMaker's last observation of an update it rolled back: the old model
            return [{"release_id": source, "copies": step.get("copies"), "share": 1.0, "since": source_since}]
        return [{"release_id": source, "copies": None, "share": None, "since": source_since},
                {"release_id": target, "copies": None, "share": None, "since": rollout["since"]}]
    total = (old or 0) + (new or 0)
    return [{"release_id": release, "copies": copies, "share": round(copies / total, 4), "since": since}
            for release, copies, since in ((source, old or 0, source_since), (target, new or 0, rollout["since"]))
            if copies]


def serving_changes(records: list) -> list[dict]:
    """What served a model after each of its records that changed it, oldest first: `serving` (each release with its
    copies and share, `_serving`) and the `rollout` under way (None between rollouts). A completed promotion (or
    rollback) puts its release on every copy; each traffic step of a rollout moves copies between the release it
    rolls from and the one it rolls to; a rollout an alarm rolled back leaves the release it rolled from. Traffic
    records are appended as the steps happen, so their times are when copies moved."""
    promoted, rollout, changes = None, None, []
    for record in records:
        if is_promotion(record):
            promoted, rollout = record, None
        elif ((record.stage, record.event) == (PROMOTE, ROLLED_BACK)
              and rollout and rollout["release_id"] == record.release_id):
            rollout = None
        elif (record.stage, record.event) == (TRAFFIC, STEP):
            step = StepRecord.of(record)
            same = rollout is not None and rollout["release_id"] == record.release_id
            rollout = {"release_id": record.release_id, "strategy": step.strategy,
                       "from_release": step.from_release or (promoted.release_id if promoted else None),
                       "since": rollout["since"] if same else record.recorded_at, "at": record.recorded_at,
                       "seq": record.seq, "step": step_fields(step)}
        else:
            continue
        changes.append({"seq": record.seq, "at": record.recorded_at, "serving": _serving(promoted, rollout),
                        "rollout": rollout})
    return changes


def as_of(ledger, model: str, when: datetime | str) -> dict:
    """What served `model` at `when`: the release, since when and by whose promotion (or rollback), what it was
    built from and the gate evidence it was promoted on; and `serving`, every release serving then with its copies
    and share of them (two during a rollout: the one it rolls from and the one it rolls to), with the `rollout` under
    way then (None between rollouts)."""
    record = ledger.served_at(model, when)
    if record is None:
        raise NotFound(f"nothing of model {model!r} was promoted at or before {when}",
                       fix=f"see `shiplift ledger history {model}` for when its releases were promoted")
    detail = show(ledger, record.release_id)
    moment = moment_text(when)
    then = [change for change in serving_changes(ledger.history(model)) if change["at"] <= moment]
    return {
        "model": model, "as_of": str(when), "release_id": record.release_id,
        "since": record.recorded_at, "promotion": _promotion_row(record),
        "record": {"seq": record.seq, "record_hash": record.record_hash},
        "built_from": {key: detail[key] for key in ("config_hash", "source_sha256", "model_sha256", "artifact_sha256",
                                                    "image_digest", "placement")},
        "evidence": detail["gate"],
        "opened_by": detail["opened_by"],
        "serving": then[-1]["serving"] if then else _whole(record),
        "rollout": then[-1]["rollout"] if then else None,
    }


def _step_text(step: StepRecord) -> str:
    """A traffic step in a line: which batch (copies of each release) or check (copies in all), the alarm that fired."""
    if step.batch is not None:
        source = f" ({step.from_release})" if step.from_release else ""
        where = f"batch {step.batch}/{step.batches}: {step.old_copies} old{source}, {step.new_copies} new"
    else:
        where = f"check {step.check}: {step.copies} copies"
    alarm = f"; alarm {step.alarm}" if step.alarm else ""
    return f"{step.phase or 'rollout'} {where}{alarm}"


def _verdict_text(step: StepRecord) -> str:
    """A bake's verdict in a line: which step, each alarm's state, the online gate's decision, the alarm that fired."""
    where = f"batch {step.batch}/{step.batches}" if step.batch is not None else f"check {step.check}"
    states = ", ".join(f"{name} {state}" for name, state in sorted((step.alarm_states or {}).items()))
    gate = OnlineGateEvidence.model_validate(step.online_gate) if step.online_gate else None
    short = gate is not None and gate.min_samples is not None and (gate.candidate_answers or 0) < gate.min_samples
    answers = f" ({gate.candidate_answers or 0} of {gate.min_samples} answers)" if short else ""
    parts = [states or "the new copies had no answers to judge",
             *([f"online gate {gate.decision or 'inconclusive'}{answers}"] if gate else []),
             *([f"alarm {step.alarm}"] if step.alarm else [])]
    return f"{step.phase or 'rollout'} {where} baked: {'; '.join(parts)}"


def moves_not_retired(records: list) -> dict[str, Any]:
    """Per endpoint a fleet move left, the newest move record away from it that no later retirement record covers
    (records oldest first): a layout left, returned to and left again is retired again."""
    pending: dict[str, Any] = {}
    for record in records:
        if is_fleet_move(record):
            left = promotion(record).moved_from_endpoint
            if left is not None:
                pending[left] = record
        elif is_retirement(record):
            pending.pop(Retirement.of(record).endpoint, None)
    return pending


def left_by_fleet(records: list, endpoint: str) -> Any:
    """The newest record of a fleet move away from `endpoint` or of its retirement (records oldest first), unless a
    promotion onto it came later (a layout returned to); None while models may join it."""
    found = None
    for record in records:
        if is_retirement(record) and Retirement.of(record).endpoint == endpoint:
            found = record
        elif is_promotion(record):
            promoted = promotion(record)
            if is_fleet_move(record) and promoted.moved_from_endpoint == endpoint:
                found = record
            elif promoted.endpoint == endpoint:
                found = None
    return found


def _promotion_event(record, promoted: PromoteResult) -> tuple[str, str]:
    """(kind, detail) of a promote record in a model's timeline: a fleet move, a rollback, a promotion, an alarm's
    rollback of the rollout."""
    if record.event == ROLLED_BACK:
        return "rolled_back", f"{promoted.strategy} rolled back: {promoted.reason}"
    if is_fleet_move(record):
        return "moved", (f"{record.release_id} from {promoted.moved_from_endpoint} to {promoted.endpoint}/"
                         f"{promoted.component} (layout change): {promoted.reason}")
    if promoted.trigger == "rollback":
        return "rollback", f"from {promoted.rollback_from} to {record.release_id}: {promoted.rollback_reason}"
    return "promoted", f"{promoted.strategy} to {promoted.endpoint}/{promoted.component}"


def _timeline_event(record) -> tuple[str, str] | None:
    """(kind, detail) of a record worth a line in a model's timeline, else None."""
    stage, event = record.stage, record.event
    if (stage, event) == (RELEASE, OPENED):
        return "opened", f"config {(Opened.of(record).config_hash or '')[:12]}"
    if stage == RELEASE and event in FINAL:
        return "finished", event
    if stage == VALIDATE and event == SUCCEEDED:
        gate = stage_payload(record, ValidateResult)
        missed = gate.not_passed or []
        return "gate", f"{gate.decision}" + (f": {'; '.join(missed)}" if missed else "")
    if (stage, event) == (TRAFFIC, STEP):
        return "traffic", _step_text(StepRecord.of(record))
    if (stage, event) == (BAKE, VERDICT):
        step = StepRecord.of(record)
        return ("alarm" if step.alarm else "bake"), _verdict_text(step)
    if is_retirement(record):
        retired = Retirement.of(record)
        return "retired", f"{retired.endpoint} deleted, replaced by {retired.replaced_by}"
    if stage == PROMOTE and event in (SUCCEEDED, ROLLED_BACK):
        return _promotion_event(record, promotion(record))
    if event == FAILED:
        return "failed", f"{stage}: {Failure.of(record).error}"
    return None


def require_records(records: list, model: str) -> list:
    """The records of `model`; NotFound when the ledger holds none (a model it never saw)."""
    if not records:
        raise NotFound(f"the ledger has no records of model {model!r}",
                       fix="list models with `shiplift ledger history`")
    return records


def events(records: list) -> list[dict]:
    """The records worth a line in a timeline, oldest first (see `timeline`)."""
    rows = []
    for record in records:
        found = _timeline_event(record)
        if found:
            rows.append({"seq": record.seq, "at": record.recorded_at, "release_id": record.release_id,
                         "event": found[0], "detail": found[1], "actor": record.actor})
    return rows


def timeline(ledger, model: str) -> list[dict]:
    """A model's history as events, oldest first: releases opened and finished, gate decisions, traffic steps and
    their bakes' verdicts (an alarm that fired is its own kind), promotions, automatic and manual rollbacks with their
    reasons, failed stages. Each at the time its record was appended, which for traffic is when the step happened."""
    return events(require_records(ledger.history(model), model))


STATUS_METRICS = ("accuracy", "macro_f1", "ece", "p95_ms")  # a gate's headline numbers, as its stage result names them
# a release opened and not finished (running, or stopped before it recorded an end)
IN_PROGRESS = ("created", "running", AWAITING_APPROVAL)


def cost_per_hour(detail: dict, promoted: PromoteResult | None = None) -> float | None:
    """What serving this release costs per hour in USD, as its gate recorded it (`tasks.backends.pricing`, priced when
    the release was validated), or as the fleet move that put it on its endpoint did (`promoted`, the result of the
    promotion it serves by): on a shared endpoint, the model's share of the endpoint's bill; None where the price
    table had no figure, or for a release older than cost records."""
    if promoted is not None and promoted.share is not None:
        return promoted.share.get("usd_per_hour")
    cost = (detail.get("gate") or {}).get("cost") or {}
    return (cost.get("share") or cost.get("production") or {}).get("usd_per_hour")


def serving_status(ledger, model: str | None = None, *, now: datetime | None = None) -> list[dict]:
    """Per model (of one, or of all, in the order the ledger first saw them): what serves now (the release, since
    when and by which promotion, its gate decision and headline metrics, its cost per hour), its last release and that
    release's outcome, and the releases opened and not finished. Read from the ledger alone."""
    now = now or datetime.now(UTC)
    by_model: dict[str, list] = defaultdict(list)
    for record in of_releases(ledger.history(model)):
        by_model[record.model].append(record)
    rows = []
    for name, records in by_model.items():
        found = details(records)
        record = ledger.served_at(name, now)
        serving = None
        if record is not None:
            detail = next((d for d in found if d["release_id"] == record.release_id), None) or show(ledger,
                                                                                                    record.release_id)
            gate = detail["gate"] or {}
            metrics = gate.get("metrics") or {}
            row = _promotion_row(record)
            serving = {"release_id": record.release_id, "since": record.recorded_at, "trigger": row["trigger"],
                       "endpoint": row["endpoint"], "component": row["component"],
                       "decision": gate.get("decision"), "metrics": {key: metrics.get(key) for key in STATUS_METRICS},
                       "cost_per_hour": cost_per_hour(detail, promotion(record))}
        last = found[-1]
        rows.append({"model": name, "serving": serving,
                     "last_release": {"release_id": last["release_id"], "status": last["status"],
                                      "decision": last["decision"], "opened_at": last["opened_at"],
                                      "last_at": last["last_at"]},
                     "in_progress": [d["release_id"] for d in found if d["status"] in IN_PROGRESS],
                     "awaiting_approval": [{"release_id": d["release_id"], **d["awaiting_approval"]}
                                           for d in found if d["status"] == AWAITING_APPROVAL]})
    return rows
