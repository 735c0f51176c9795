"""The audit report (DESIGN §10): one self-contained HTML page per ledger, for people who audit releases.

Per model: a timeline of its releases, gate decisions, traffic steps, promotions and rollbacks (SVG,
labelled axes); each release's gate evidence (metrics with intervals, thresholds, dataset sha256s) and
its comparison with the champion; rollbacks with their reasons; and, at the top, the verification
result with the signed checkpoint it was checked against. Styles and charts are inline and nothing
is fetched at view time, so the page can be archived with the evidence and opened offline.
"""

from __future__ import annotations

import html
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.atomic import write_text_atomic
from tasks.ledger.audit import verdict_lines
from tasks.ledger.views import (CHECK_COLUMNS, check_cells, details, events, field_rows, of_releases, release_row,
                                 require_records)

REPORT_FILE = "index.html"
LANE_H, LEFT, RIGHT, TOP, AXIS_H = 26, 250, 30, 16, 44
WIDTH = 1000
EVENT_STYLE = {  # timeline event -> (marker, colour) in the chart and its legend
    "gate": ("circle", "#1f77b4"),
    "traffic": ("tick", "#7f7f7f"),
    "promoted": ("triangle", "#2ca02c"),
    "rolled_back": ("cross", "#d62728"),
    "rollback": ("cross", "#9467bd"),
    "failed": ("cross", "#ff7f0e"),
}
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1b1b1b;max-width:1200px}
h1{margin:0 0 8px}h2{margin-top:36px;border-bottom:2px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;margin:8px 0 16px;max-width:100%}th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f3f3f3}td.hash{font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.verdict{padding:10px 14px;border-radius:6px;margin:12px 0}.verdict.ok{background:#e6f4e6;border:1px solid #2ca02c}
.verdict.broken{background:#fde8e8;border:1px solid #d62728}.status-pass,.status-promoted{color:#1d7a1d;font-weight:600}
.status-fail,.status-rejected,.status-rolled_back,.status-failed{color:#b01e1e;font-weight:600}
details.release{border:1px solid #ddd;border-radius:6px;padding:6px 12px;margin:8px 0}summary{cursor:pointer;font-weight:600}
svg text{font:12px system-ui,sans-serif}
"""


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
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def _marker(kind: str, x: float, y: float) -> str:
    shape, colour = EVENT_STYLE[kind]
    if shape == "circle":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}"/>'
    if shape == "triangle":
        return f'<polygon points="{x:.1f},{y - 7:.1f} {x - 6:.1f},{y + 5:.1f} {x + 6:.1f},{y + 5:.1f}" fill="{colour}"/>'
    if shape == "tick":
        return f'<line x1="{x:.1f}" y1="{y - 8:.1f}" x2="{x:.1f}" y2="{y + 8:.1f}" stroke="{colour}" stroke-width="2"/>'
    return (f'<path d="M{x - 5:.1f},{y - 5:.1f}L{x + 5:.1f},{y + 5:.1f}M{x - 5:.1f},{y + 5:.1f}L{x + 5:.1f},{y - 5:.1f}" '
            f'stroke="{colour}" stroke-width="3"/>')


def _timeline_svg(model: str, release_rows: list[dict], events: list[dict]) -> str:
    """Releases as lanes over time (first record → last) with their events as markers; x: time (UTC)."""
    lanes = {row["release_id"]: i for i, row in enumerate(release_rows)}
    moments = [_moment(row[key]) for row in release_rows for key in ("first_at", "last_at")]
    start, end = min(moments), max(moments)
    span = max((end - start).total_seconds(), 1.0)
    plot_w = WIDTH - LEFT - RIGHT
    height = TOP + LANE_H * len(lanes) + AXIS_H + 30

    def x_of(moment: datetime) -> float:
        return LEFT + plot_w * (moment - start).total_seconds() / span

    parts = [f'<svg class="timeline" data-model="{_e(model)}" width="{WIDTH}" height="{height}" role="img" '
             f'aria-label="timeline of {_e(model)}: releases over time">']
    for row in release_rows:
        y = TOP + LANE_H * lanes[row["release_id"]] + LANE_H / 2
        x0, x1 = x_of(_moment(row["first_at"])), x_of(_moment(row["last_at"]))
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{_e(row["release_id"])}</text>')
        parts.append(f'<line x1="{x0:.1f}" y1="{y:.1f}" x2="{max(x1, x0 + 2):.1f}" y2="{y:.1f}" stroke="#bbb" stroke-width="6"/>')
    for e in events:
        if e["event"] in EVENT_STYLE and e["release_id"] in lanes:
            y = TOP + LANE_H * lanes[e["release_id"]] + LANE_H / 2
            parts.append(f'<g class="event event-{e["event"]}"><title>{_e(e["at"])} {_e(e["event"])}: {_e(e["detail"])}</title>'
                         f'{_marker(e["event"], x_of(_moment(e["at"])), y)}</g>')
    axis_y = TOP + LANE_H * len(lanes) + 6
    parts.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" y2="{axis_y}" stroke="#333"/>')
    same_day = start.date() == end.date()
    for i in range(6):
        moment = start + (end - start) * (i / 5)
        x = x_of(moment)
        label = moment.strftime("%H:%M:%S" if same_day else "%m-%d %H:%M")
        parts.append(f'<line x1="{x:.1f}" y1="{axis_y}" x2="{x:.1f}" y2="{axis_y + 5}" stroke="#333"/>'
                     f'<text x="{x:.1f}" y="{axis_y + 18}" text-anchor="middle">{label}</text>')
    day = start.strftime("%Y-%m-%d") + ("" if same_day else " … " + end.strftime("%Y-%m-%d"))
    parts.append(f'<text class="axis-label" x="{LEFT + plot_w / 2:.1f}" y="{axis_y + 36}" text-anchor="middle">'
                 f'time (UTC, {day})</text>')
    parts.append(f'<text class="axis-label" x="12" y="{TOP + 4}" transform="rotate(-90 12 {TOP + 4})" text-anchor="end">release</text>')
    parts.append("</svg>")
    legend = " ".join(f'<svg width="16" height="16">{_marker(kind, 8, 9)}</svg> {kind.replace("_", " ")}'
                      for kind in EVENT_STYLE)
    return "".join(parts) + f'<p class="legend">{legend}</p>'


def _champion_svg(release_id: str, checks: list[dict]) -> str:
    """Candidate − champion on every paired gate check: the difference with its interval and the threshold."""
    rows = [c for c in checks if c.get("comparator", "").startswith("paired") and c.get("ci") and None not in c["ci"]]
    if not rows:
        return ""
    values = [v for c in rows for v in (*c["ci"], c["observed"], c["threshold"] or 0.0) if v is not None]
    low, high = min(values + [0.0]), max(values + [0.0])
    pad = (high - low) * 0.1 or 0.01
    low, high = low - pad, high + pad
    plot_w, height = WIDTH - LEFT - RIGHT, TOP + LANE_H * len(rows) + AXIS_H + 10

    def x_of(value: float) -> float:
        return LEFT + plot_w * (value - low) / (high - low)

    parts = [f'<svg class="champion" data-release="{_e(release_id)}" width="{WIDTH}" height="{height}" role="img" '
             f'aria-label="candidate minus champion per gate check">']
    for i, check in enumerate(rows):
        y = TOP + LANE_H * i + LANE_H / 2
        colour = "#2ca02c" if check["status"] == "pass" else "#d62728"
        ci_low, ci_high = check["ci"]
        parts.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{_e(check["name"])}</text>'
                     f'<line x1="{x_of(ci_low):.1f}" y1="{y:.1f}" x2="{x_of(ci_high):.1f}" y2="{y:.1f}" stroke="{colour}" stroke-width="2"/>'
                     f'<circle cx="{x_of(check["observed"]):.1f}" cy="{y:.1f}" r="4" fill="{colour}"/>')
        if check.get("threshold") is not None:
            x = x_of(check["threshold"])
            parts.append(f'<line x1="{x:.1f}" y1="{y - 9:.1f}" x2="{x:.1f}" y2="{y + 9:.1f}" stroke="#333" stroke-dasharray="3,2"/>')
    axis_y = TOP + LANE_H * len(rows) + 6
    parts.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{WIDTH - RIGHT}" y2="{axis_y}" stroke="#333"/>')
    for i in range(6):
        value = low + (high - low) * i / 5
        parts.append(f'<text x="{x_of(value):.1f}" y="{axis_y + 16}" text-anchor="middle">{value:+.3g}</text>')
    parts.append(f'<text class="axis-label" x="{LEFT + plot_w / 2:.1f}" y="{axis_y + 34}" text-anchor="middle">'
                 "candidate − champion (point, 95% interval; dashed: threshold)</text></svg>")
    return "".join(parts)


def _release_section(detail: dict) -> str:
    """One release: what it was built from, its gate evidence, its champion comparison and its promotions."""
    gate = detail["gate"] or {}
    built = field_rows({name: detail[name] for name in (
        "opened_at", "opened_by", "status", "config_hash", "source_sha256", "model_sha256", "artifact_sha256",
        "artifact_uri", "image_uri", "image_digest", "placement")}, "field")
    parts = [f'<details class="release" id="release-{_e(detail["release_id"])}" data-release="{_e(detail["release_id"])}">'
             f'<summary>{_e(detail["release_id"])} — <span class="status-{_e(detail["status"])}">{_e(detail["status"])}</span>'
             f' (gate {_e(gate.get("decision", "not run"))})</summary>',
             "<h4>Built from</h4>", _table(built, ["field", "value"], css_class="built", hashes=("value",))]
    if gate:
        parts += [f"<h4>Gate evidence (champion: {_e(gate.get('champion_release') or 'none')})</h4>",
                  _table([check_cells(c) for c in gate.get("checks") or []], CHECK_COLUMNS, css_class="checks"),
                  _table([{"threshold": k, "value": v} for k, v in (gate.get("thresholds") or {}).items()],
                         ["threshold", "value"], css_class="thresholds"),
                  _table(gate.get("datasets") or [], ["name", "n", "sha256", "path"], css_class="datasets", hashes=("sha256",)),
                  _champion_svg(detail["release_id"], gate.get("checks") or [])]
    if detail["promotions"]:
        parts += ["<h4>Promotions</h4>", _table(detail["promotions"], ["at", "event", "trigger", "strategy", "endpoint",
                                                                       "component", "steps", "reason", "actor"],
                                                css_class="promotions")]
    parts.append("</details>")
    return "".join(parts)


def _model_section(model: str, records: list) -> str:
    """One model's part of the page, from its records alone (read once for the whole page)."""
    release_details = details(records)
    release_rows = [release_row(detail) for detail in release_details]
    model_events = events(records)
    rollbacks = [e for e in model_events if e["event"] in ("rollback", "rolled_back")]
    parts = [f'<section class="model" data-model="{_e(model)}"><h2>{_e(model)}</h2>',
             "<h3>Timeline</h3>", _timeline_svg(model, release_rows, model_events),
             "<h3>Releases</h3>",
             _table(release_rows, ["release_id", "opened_at", "opened_by", "status", "decision", "promoted_at", "strategy",
                                   "artifact_sha256", "image_digest"], css_class="releases",
                    hashes=("artifact_sha256", "image_digest")),
             "<h3>Rollbacks</h3>",
             _table(rollbacks, ["at", "event", "release_id", "detail", "actor"], css_class="rollbacks") if rollbacks
             else '<p class="rollbacks">none</p>',
             "<h3>Traffic steps and events</h3>",
             _table(model_events, ["seq", "at", "release_id", "event", "detail", "actor"], css_class="events"),
             "<h3>Gate evidence per release</h3>"]
    parts += [_release_section(detail) for detail in release_details]
    parts.append("</section>")
    return "".join(parts)


def _verdict(verification: dict) -> str:
    headline, *problems = verdict_lines(verification)
    listed = f"<ul>{''.join(f'<li>{_e(p)}</li>' for p in problems)}</ul>" if problems else ""
    return f'<div class="verdict {"ok" if verification["ok"] else "broken"}" id="verification">{_e(headline)}{listed}</div>'


def render(ledger, verification: dict, *, model: str | None = None) -> str:
    """The whole page: the verification result, then one section per model (or just `model`: NotFound when the
    ledger never saw it)."""
    records = of_releases(ledger.history(model))
    if model is not None:
        require_records(records, model)
    by_model: dict[str, list] = defaultdict(list)
    for record in records:
        by_model[record.model].append(record)
    models = sorted(by_model)
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = "".join(_model_section(name, by_model[name]) for name in models) or "<p>The ledger holds no records.</p>"
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
