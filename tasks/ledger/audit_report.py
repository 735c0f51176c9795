"""The audit report (DESIGN §10): one self-contained HTML page per ledger, for people who audit releases.

Per model: a timeline of its releases, gate decisions, traffic steps, promotions and rollbacks (one row per event
kind, markers coloured by release); the copies serving per release over time, from the traffic records, so a rolling
update's overlap of two releases shows; each release's gate evidence (checks with intervals and the rule each used,
thresholds, dataset sha256s), its comparison with the champion (chart) and its cost as the gate priced it; rollbacks
with their reasons; its sweeps (the rule's sha256 recorded at opening, every candidate's evidence and verdict, the
pick); and, at the top, the verification result with the signed checkpoint it was checked against.
Charts are `validation.charts` (matplotlib SVG, inline, deterministic); styles are inline and nothing is fetched at
view time, so the page can be archived with the evidence and opened offline (docs/reports.md).
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shiplift.tasks.atomic import write_text_atomic
from shiplift.tasks.ledger.checkpoints import verdict_lines
from shiplift.tasks.ledger.events import OPENED, PROMOTE, ROLLED_BACK, STEP, SUCCEEDED, SWEEP, TRAFFIC
from shiplift.tasks.ledger.records import StepRecord, as_result, is_promotion, promotion
from shiplift.tasks.ledger.stage_results import ValidateResult
from shiplift.tasks.ledger.sweep_records import SweepRecords, held_out_text
from shiplift.tasks.ledger.views import (
    CHECK_COLUMNS,
    check_cells,
    cost_per_hour,
    details,
    events,
    field_rows,
    of_releases,
    release_row,
    require_records,
)
from shiplift.validation import charts
from shiplift.validation.gate_report import cost_rows, rule_text
from shiplift.validation.gates import RATIO, summary_line
from shiplift.validation.sweep_report import candidates_table, speed_section

REPORT_FILE = "index.html"
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1b1b1b;max-width:1200px}
h1{margin:0 0 8px}h2{margin-top:36px;border-bottom:2px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0 16px;max-width:100%}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f3f3f3}td.hash{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.verdict{padding:10px 14px;border-radius:6px;margin:12px 0}.verdict.ok{background:#e6f4e6;border:1px solid #2ca02c}
.verdict.broken{background:#fde8e8;border:1px solid #d62728}.status-pass,.status-promoted{color:#1d7a1d;font-weight:600}
.status-fail,.status-rejected,.status-rolled_back,.status-failed{color:#b01e1e;font-weight:600}
details.release{border:1px solid #ddd;border-radius:6px;padding:6px 12px;margin:8px 0}
summary{cursor:pointer;font-weight:600}
svg.chart{display:block;max-width:100%;height:auto;background:#fff;border:1px solid #ddd;margin:8px 0 16px}
.no-price{color:#8a4b00;font-style:italic}.note{color:#555}
"""


# f-strings, not Jinja2, for the reasons written beside validation.gate_report.esc; every value passes through _e.
def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _table(rows: list[dict], columns: list[str], *, css_class: str, hashes: tuple[str, ...] = ()) -> str:
    """An HTML table; hash-like columns are set in monospace and wrap, statuses and decisions are coloured."""
    def cell(column: str, value: Any) -> str:
        style = "hash" if column in hashes else f"status-{_e(value)}" if column in ("status", "decision") else ""
        return f'<td class="{style}">{_e(value)}</td>'

    head = "".join(f"<th>{_e(column)}</th>" for column in columns)
    body = "".join("<tr>" + "".join(cell(column, row.get(column)) for column in columns) + "</tr>" for row in rows)
    return f'<table class="{css_class}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _moment(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _timeline(model: str, release_rows: list[dict], model_events: list[dict]) -> str:
    """The model's releases (first record → last) and their events, one row per kind (`validation.charts.timeline`)."""
    releases = [{"release_id": row["release_id"], "first_at": _moment(row["first_at"]),
                 "last_at": _moment(row["last_at"])}
                for row in release_rows]
    shown = [{**e, "at": _moment(e["at"])} for e in model_events if e["event"] in charts.EVENT_ROWS]
    return charts.timeline(model, releases, shown)


class _CopiesLog:
    """The copies-serving series `copies_series` builds, one record at a time: points per series key, each key's
    (release id, mixed) and the release serving before the record being read."""

    def __init__(self) -> None:
        self.points: dict[str, list[tuple[datetime, int]]] = defaultdict(list)
        self.owner: dict[str, tuple[str, bool]] = {}  # series key -> (release id, mixed)
        self.serving: str | None = None

    def put(self, key: str, release: str, mixed: bool, at: datetime, copies: int) -> None:
        self.owner.setdefault(key, (release, mixed))
        self.points[key].append((at, copies))

    def step(self, record, at: datetime, release: str) -> None:
        step, old = StepRecord.of(record), self.serving if self.serving not in (None, release) else None
        if step.new_copies is not None or step.old_copies is not None:
            self.put(release, release, False, at, step.new_copies or 0)
            if old is not None:
                self.put(old, old, False, at, step.old_copies or 0)
        elif step.copies is not None:
            self.put(f"{release} (mixed)", release, True, at, step.copies)
            if old is not None and self.points.get(old):
                self.put(old, old, False, at, 0)

    def promoted(self, record, at: datetime, release: str) -> None:
        copies = promotion(record).copies
        if copies is not None:
            for key, series in self.points.items():
                if key != release and series and series[-1][1]:
                    series.append((at, 0))
            self.put(release, release, False, at, copies)
        self.serving = release

    def rolled_back(self, at: datetime, release: str) -> None:
        for key in (release, f"{release} (mixed)"):
            if self.points.get(key) and self.points[key][-1][1]:
                self.points[key].append((at, 0))
        restored = self.serving if self.serving not in (None, release) else None
        earlier = [copies for _, copies in self.points.get(restored, []) if copies]
        if restored is not None and earlier and self.points[restored][-1][1] == 0:
            self.points[restored].append((at, earlier[-1]))

    def series(self) -> list[dict]:
        return [{"label": f"{self.owner[key][0]}: old and new copies (not told apart)" if self.owner[key][1] else key,
                 "release_id": self.owner[key][0], "mixed": self.owner[key][1], "points": pts}
                for key, pts in self.points.items()]


def copies_series(records: list) -> tuple[list[dict], datetime | None]:
    """Copies serving per release over time, as the model's records say (oldest first), for `charts.copies_serving`:
    each traffic step (stage traffic, event step) at its recorded_at gives the new spec's release its `new_copies` and
    the release serving before it its `old_copies`; where the backend cannot tell them apart (aws: `check`, `copies`)
    the step's `copies` go to a hatched "old and new" series of the release. A promotion's success gives its release
    the copies it recorded and every other release 0; a rolled-back promotion leaves its release 0 and gives the
    release serving before it back its last copy count. Returns the series and the model's last record time (the
    chart's end)."""
    log = _CopiesLog()
    for record in records:
        at, release = _moment(record.recorded_at), record.release_id
        if (record.stage, record.event) == (TRAFFIC, STEP):
            log.step(record, at, release)
        elif is_promotion(record):
            log.promoted(record, at, release)
        elif (record.stage, record.event) == (PROMOTE, ROLLED_BACK):
            log.rolled_back(at, release)
    until = _moment(records[-1].recorded_at) if records else None
    return log.series(), until


def champion_rows(checks: list[dict]) -> list[dict]:
    """A gate's champion checks (paired rule) as `charts.champion_check` rows: candidate − champion, its interval,
    the margin it was held to and the check's status (the latency ratio apart)."""
    paired = [c for c in checks if (c.get("rule") == "paired" or str(c.get("comparator", "")).startswith("paired"))
              and c.get("comparator") != RATIO]  # a ratio is not a difference: the gate report draws it on its own axis
    return [{"name": c["name"], "difference": c.get("observed"), "ci": c.get("ci"), "threshold": c.get("threshold"),
             "status": c.get("status")} for c in paired if c.get("observed") is not None]


def _cost_table(cost: dict | None) -> str:
    rows = "".join(f"<tr><td>{what}</td><td>{text}</td></tr>" for what, text in cost_rows(cost))
    return f'<table class="cost"><thead><tr><th>what</th><th>cost</th></tr></thead><tbody>{rows}</tbody></table>'


def _per_hour(detail: dict) -> str:
    usd = cost_per_hour(detail)
    if usd is not None:
        return f"{usd:.2f}"
    return "no price" if detail["gate"] and as_result(detail["gate"], ValidateResult).cost else "not recorded"


def rollout_window(records: list, release_id: str) -> tuple[datetime, datetime] | None:
    """From a little before a release's first traffic step to a little after its promotion ended (or its last step),
    None when it recorded no traffic step: the span a rollout chart zooms in on."""
    steps = [_moment(r.recorded_at) for r in records if r.release_id == release_id
             and (r.stage, r.event) == (TRAFFIC, STEP)]
    if not steps:
        return None
    ended = [_moment(r.recorded_at) for r in records if r.release_id == release_id and r.stage == PROMOTE
             and r.event in (SUCCEEDED, ROLLED_BACK) and _moment(r.recorded_at) >= steps[0]]
    start, end = steps[0], ended[0] if ended else steps[-1]
    pad = max((end - start) * 0.15, timedelta(seconds=5))
    return start - pad, end + pad


def _rollout_chart(model: str, release_id: str, series: list[dict], window: tuple[datetime, datetime] | None) -> str:
    if window is None:
        return ""
    chart = charts.copies_serving(model, series, window[1], since=window[0], key=release_id,
                                  title=f"rollout of {release_id}: copies serving per release",
                                  attrs={"data-release": release_id})
    return f"<h4>Rollout: copies serving</h4>{chart}" if chart else ""


def _release_section(detail: dict, rollout: str = "") -> str:
    """One release: what it was built from, its gate evidence, its champion comparison and its promotions."""
    gate = as_result(detail["gate"], ValidateResult) if detail["gate"] else None
    built = field_rows({name: detail[name] for name in (
        "opened_at", "opened_by", "status", "config_hash", "source_sha256", "model_sha256", "artifact_sha256",
        "artifact_uri", "image_uri", "image_digest", "placement")}, "field")
    parts = [f'<details class="release" id="release-{_e(detail["release_id"])}" '
             f'data-release="{_e(detail["release_id"])}"><summary>{_e(detail["release_id"])} — <span '
             f'class="status-{_e(detail["status"])}">{_e(detail["status"])}</span> (gate '
             f'{_e(gate.decision if gate else "not run")})</summary>',
             "<h4>Built from</h4>", _table(built, ["field", "value"], css_class="built", hashes=("value",))]
    if gate:
        checks = gate.checks or []
        parts += [f"<h4>Gate evidence (champion: {_e(gate.champion_release or 'none')})</h4>",
                  f'<p class="summary">{_e(summary_line(str(gate.decision), checks))}</p>',
                  _table([{**check_cells(c), "rule": rule_text(c)} for c in checks], CHECK_COLUMNS, css_class="checks"),
                  _table([{"threshold": k, "value": v} for k, v in (gate.thresholds or {}).items()],
                         ["threshold", "value"], css_class="thresholds"),
                  _table(gate.datasets or [], ["name", "n", "sha256", "path"], css_class="datasets",
                         hashes=("sha256",)),
                  charts.champion_check(champion_rows(checks), key=detail["release_id"],
                                        attrs={"data-release": detail["release_id"]}),
                  "<h4>Cost (as the gate priced it)</h4>", _cost_table(gate.cost)]
    if detail["promotions"]:
        parts += ["<h4>Promotions</h4>", _table(detail["promotions"], ["at", "event", "trigger", "strategy", "endpoint",
                                                                       "component", "steps", "reason", "actor"],
                                                css_class="promotions")]
    parts.append(rollout)
    parts.append("</details>")
    return "".join(parts)


def _sweep_section(records) -> str:
    """One sweep (`tasks.sweeps.records.SweepRecords`): its opening (the rule as hashed before any candidate ran, its
    sha256), every candidate's evidence with its verdict, the pick and the frontier, the pick's own release, and the
    tasks held out for that release's gate."""
    opened, pick = records.opened, records.recorded_pick()
    rows = [{"candidate": c["name"], "release_id": c["release_id"], "config_sha256": c["config_sha256"],
             "evidence": "recorded" if c["name"] in records.evaluated else
             f"failed: {records.failed[c['name']]['error']}" if c["name"] in records.failed else "none yet"}
            for c in records.candidates]
    picked = ("nothing: no candidate meets the rule" if pick and pick.picked is None else
              pick.picked if pick else f"not yet ({len(records.pending())} candidates lack evidence)")
    handed = records.handed_off
    parts = [f'<details class="sweep" data-sweep="{_e(records.sweep_id)}" open><summary>{_e(records.sweep_id)}: '
             f"picked {_e(picked)}</summary>",
             f"<p>Opened {_e(records.opened_at)} by {_e(records.opened_by)}, before any candidate was evaluated, "
             f'under rule sha256 <code class="rule-sha256">{_e(opened["rule_sha256"])}</code>; '
             f"frontier: {_e(', '.join(pick.frontier) if pick else 'not yet')}; the pick's own release: "
             f"{_e(handed['release_id'] if handed else 'not run')}.</p>",
             f'<p class="note">Held out for the pick\'s own gate: {_e(held_out_text(opened))}.</p>',
             _table(rows, ["candidate", "release_id", "evidence", "config_sha256"], css_class="sweep-candidates",
                    hashes=("config_sha256",))]
    if pick is not None:
        parts.append(candidates_table(pick, records.evidence(), records.champion()))
        parts.append(speed_section(records.speed_scale(), records.measured_evidence(), records.evidence()))
    parts.append(f'<pre class="rule">{_e(json.dumps(records.rule.canonical(), indent=1, sort_keys=True))}</pre>')
    parts.append("</details>")
    return "".join(parts)


def _sweeps(ledger, model: str | None) -> dict[str, str]:
    """Each model's sweeps as their sections, from the sweeps' own records."""
    opened = [r for r in ledger.history(model) if (r.stage, r.event) == (SWEEP, OPENED)]
    sections: dict[str, str] = defaultdict(str)
    for record in opened:
        sections[record.model] += _sweep_section(SweepRecords.load(ledger, record.release_id))
    return sections


def _model_section(model: str, records: list, sweeps: str = "") -> str:
    """One model's part of the page, from its records alone (read once for the whole page), with its sweeps (only
    those when the ledger holds no release of it)."""
    if not records:
        return (f'<section class="model" data-model="{_e(model)}"><h2>{_e(model)}</h2><p class="note">no release '
                f"records</p><h3>Sweeps</h3>{sweeps}</section>")
    release_details = details(records)
    release_rows = [release_row(detail) for detail in release_details]
    model_events = events(records)
    rollbacks = [e for e in model_events if e["event"] in ("rollback", "rolled_back")]
    for row, detail in zip(release_rows, release_details, strict=True):
        row["cost $/h"] = _per_hour(detail)
    series, until = copies_series(records)
    copies = charts.copies_serving(model, series, until) if until else ""
    parts = [f'<section class="model" data-model="{_e(model)}"><h2>{_e(model)}</h2>',
             "<h3>Timeline</h3>", _timeline(model, release_rows, model_events),
             "<h3>Copies serving</h3>",
             copies or '<p class="copies note">no traffic step or promotion with a copy count recorded</p>',
             "<h3>Releases</h3>",
             _table(release_rows,
                    ["release_id", "opened_at", "opened_by", "status", "decision", "promoted_at", "strategy",
                                   "cost $/h", "artifact_sha256", "image_digest"], css_class="releases",
                    hashes=("artifact_sha256", "image_digest")),
             "<h3>Rollbacks</h3>",
             _table(rollbacks, ["at", "event", "release_id", "detail", "actor"], css_class="rollbacks") if rollbacks
             else '<p class="rollbacks">none</p>',
             "<h3>Traffic steps and events</h3>",
             _table(model_events, ["seq", "at", "release_id", "event", "detail", "actor"], css_class="events"),
             "<h3>Gate evidence per release</h3>"]
    parts += [_release_section(detail, _rollout_chart(model, detail["release_id"], series,
                                                      rollout_window(records, detail["release_id"])))
              for detail in release_details]
    parts += ["<h3>Sweeps</h3>", sweeps or '<p class="sweeps">none</p>', "</section>"]
    return "".join(parts)


def _verdict(verification: dict) -> str:
    headline, *problems = verdict_lines(verification)
    listed = f"<ul>{''.join(f'<li>{_e(p)}</li>' for p in problems)}</ul>" if problems else ""
    state = "ok" if verification["ok"] else "broken"
    return f'<div class="verdict {state}" id="verification">{_e(headline)}{listed}</div>'


def render(ledger, verification: dict, *, model: str | None = None) -> str:
    """The whole page: the verification result, then one section per model (or just `model`: NotFound when the
    ledger never saw it)."""
    records = of_releases(ledger.history(model))
    if model is not None:
        require_records(records, model)
    by_model: dict[str, list] = defaultdict(list)
    for record in records:
        by_model[record.model].append(record)
    sweeps = _sweeps(ledger, model)
    models = sorted(set(by_model) | set(sweeps))
    generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = ("".join(_model_section(name, by_model[name], sweeps.get(name, "")) for name in models)
            or "<p>The ledger holds no records.</p>")
    return ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>shiplift audit report</title><style>{CSS}</style></head><body>"
            f"<h1>shiplift audit report</h1><p>Generated {generated} for "
            f"{_e(', '.join(models)) or 'no models'}.</p>{_verdict(verification)}{body}</body></html>\n")


def write_report(ledger, out_dir: str | Path, verification: dict, *, model: str | None = None) -> Path:
    """Write the report to OUT_DIR/index.html atomically (nothing is written when it cannot be rendered)."""
    page = render(ledger, verification, model=model)
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    return write_text_atomic(out / REPORT_FILE, page)
