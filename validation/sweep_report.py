"""Sweep reports (issue 48): sweep-report.json for machines, a self-contained report.html for people.

What a reviewer reads, top to bottom (docs/sweeps.md, "The rule and the pick"): the pick (or that nothing met the
rule) and whether its gate against the champion runs on tasks held out from the sweep; the Pareto frontier as two
charts, accuracy against $ per 1M decisions and against p95 latency, with the champion marked, the frontier connected
and the pick highlighted; every candidate with its measured values, intervals and verdict; then the rule as written
with its sha256. The HTML follows the gate report (validation.gate_report: f-strings, every data string escaped, no
scripts, inline deterministic SVG charts from validation.charts' renderer). The pick shown is re-derived from the rule
and the evidence before anything is written, so a report never shows a pick the rule does not give.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from shiplift.tasks.atomic import write_bytes_atomic
from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import sha256_bytes
from shiplift.validation.charts import CHAMPION, STATUS_COLOUR, plain, render
from shiplift.validation.gate_report import CSS, esc, num, table_html
from shiplift.validation.sweep_rule import (
    METRICS,
    VS_CHAMPION,
    CandidateEvidence,
    Pick,
    SelectionRule,
    choose,
)
from shiplift.validation.sweep_speed import SCALED, SIDE_BY_SIDE, SpeedScale

SWEEP_REPORT_NAME = "sweep-report.json"
HTML_REPORT_NAME = "report.html"
ACCURACY_LABEL = "accuracy (share of tasks answered correctly)"
CHART_AXES = (  # (metric on x, axis label with unit, chart name, title)
    ("usd_per_1m_decisions", "cost ($ per 1M decisions, USD)", "pareto-cost", "Accuracy against cost"),
    ("p95_ms", "p95 latency (ms, per request)", "pareto-latency", "Accuracy against p95 latency"),
)
STATUS_STYLE = {  # verdict status -> (colour, marker, size, legend words)
    "picked": (STATUS_COLOUR["pass"], "*", 18, "picked"),
    "frontier": ("#1f77b4", "o", 9, "on the frontier"),
    "dominated": ("#7f7f7f", "o", 7, "dominated"),
    "violates": (STATUS_COLOUR["fail"], "X", 8, "violates a constraint"),
}
LOG_SPREAD = 20.0  # an x axis whose largest value is this many times its smallest is drawn on a log scale
EXTRA_CSS = ".picked{background:#d8f5d8}.frontier{background:#e4ecf7}.dominated{background:#f4f4f4}" \
            ".violates{background:#f8d3d3}.champion{background:#fdebd3}"


def _value_cell(evidence: CandidateEvidence, metric: str) -> str:
    """A measured value with its interval, if one was recorded under the metric's own name."""
    value = evidence.metrics.get(metric)
    interval = evidence.intervals.get(metric)
    text = num(value) if value is not None else "not measured"
    return f"{text} [{num(interval[0])}, {num(interval[1])}]" if interval else text


def _columns(evidence: Sequence[CandidateEvidence]) -> tuple[list[str], list[str]]:
    """The metrics anyone measured (in METRICS order) and the paired champion intervals anyone recorded."""
    measured = [m for m in METRICS if any(m in e.metrics for e in evidence)]
    paired = sorted({k for e in evidence for k in e.intervals if k.endswith(VS_CHAMPION)})
    return measured, paired


def candidates_table(pick: Pick, candidates: Sequence[CandidateEvidence], champion: CandidateEvidence | None) -> str:
    by_name = {c.name: c for c in candidates}
    rows_in = [(champion, "champion", "the serving model every paired interval compares against")] if champion else []
    rows_in += [(by_name[v.name], v.status, v.reason) for v in pick.verdicts]
    measured, paired = _columns([e for e, _, _ in rows_in])
    rows, classes = [], []
    for evidence, status, reason in rows_in:
        cells = [esc(evidence.name), esc(status)]
        cells += [_value_cell(evidence, m) for m in measured]
        cells += [(f"[{num(evidence.intervals[k][0])}, {num(evidence.intervals[k][1])}]"
                   if k in evidence.intervals else "–") for k in paired]
        cells += [esc(reason), f"<code>{esc(evidence.config_sha256[:12])}</code>"]
        rows.append(cells)
        classes.append(status)
    headers = ["candidate", "verdict", *(f"{m} ({METRICS[m].unit})" if METRICS[m].unit else m for m in measured),
               *(f"{k.removesuffix(VS_CHAMPION)}: candidate − champion (paired interval)" for k in paired),
               "why", "config sha256"]
    return table_html(headers, rows, classes, css_class="candidates")


def _point(ax, evidence: CandidateEvidence, x_metric: str, style: tuple[str, str, float], label: str) -> None:
    """One candidate at (x, accuracy), labelled, with its accuracy interval as an error bar where recorded."""
    colour, marker, size = style
    x, y = evidence.metrics[x_metric], evidence.metrics["accuracy"]
    interval = evidence.intervals.get("accuracy")
    if interval:
        ax.plot([x, x], interval, color=colour, lw=1.5, alpha=0.6)
    ax.plot([x], [y], marker=marker, ms=size, color=colour, ls="none", mec="#222", mew=0.6, zorder=3)
    ax.annotate(plain(label), xy=(x, y), xytext=(6, 6), textcoords="offset points", fontsize=10,
                color="#222")


def _legend(ax, statuses: set[str], *, frontier: bool, champion: bool, intervals: bool) -> None:
    handles = [Line2D([], [], color=colour, marker=marker, ls="none", mec="#222", ms=min(size, 12), label=words)
               for status, (colour, marker, size, words) in STATUS_STYLE.items() if status in statuses]
    if frontier:
        handles.append(Line2D([], [], color=STATUS_STYLE["frontier"][0], ls="--", label="frontier, in x order"))
    if champion:
        handles.append(Line2D([], [], color=CHAMPION, marker="D", ls="none", mec="#222", label="champion"))
    if intervals:
        handles.append(Line2D([], [], color="#555", lw=1.5, label="accuracy interval"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _drawable(evidence: CandidateEvidence | None, x_metric: str) -> bool:
    return evidence is not None and None not in (evidence.metrics.get(x_metric), evidence.metrics.get("accuracy"))


def pareto_chart(pick: Pick, candidates: Sequence[CandidateEvidence], champion: CandidateEvidence | None, *,
                 x_metric: str, x_label: str, name: str, title: str) -> str:
    """Accuracy against `x_metric`: every candidate drawn by its verdict (the pick a large star), the rule's
    frontier connected in x order, the champion a diamond, each point named; accuracy intervals as error bars where
    recorded. Candidates (and a champion) without both values are left out and named under the plot. "" when no
    candidate can be drawn."""
    status = {v.name: v.status for v in pick.verdicts}
    drawn = [c for c in candidates if _drawable(c, x_metric)]
    if not drawn:
        return ""
    left_out = sorted({c.name for c in candidates} - {c.name for c in drawn})
    if champion is not None and not _drawable(champion, x_metric):
        left_out.append(f"champion: {champion.name}")
    shown = drawn + ([champion] if _drawable(champion, x_metric) else [])
    xs = [c.metrics[x_metric] for c in shown]
    log_x = min(xs) > 0 and max(xs) / min(xs) >= LOG_SPREAD
    frontier = sorted((c for c in drawn if c.name in pick.frontier), key=lambda c: c.metrics[x_metric])

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        if len(frontier) > 1:
            ax.plot([c.metrics[x_metric] for c in frontier], [c.metrics["accuracy"] for c in frontier],
                    color=STATUS_STYLE["frontier"][0], lw=1.5, ls="--", zorder=2)
        for evidence in drawn:
            _point(ax, evidence, x_metric, STATUS_STYLE[status[evidence.name]][:3], evidence.name)
        if len(shown) > len(drawn):
            _point(ax, champion, x_metric, (CHAMPION, "D", 10), f"champion: {champion.name}")
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(x_label + (" (log scale)" if log_x else ""))
        ax.set_ylabel(ACCURACY_LABEL)
        ax.set_title(title)
        _legend(ax, {status[c.name] for c in drawn}, frontier=len(frontier) > 1, champion=len(shown) > len(drawn),
                intervals=any("accuracy" in c.intervals for c in shown))
        if left_out:
            ax.text(0.0, -0.2, plain(f"not drawn (a value not measured): {', '.join(left_out)}"),
                    transform=ax.transAxes, fontsize=10, color="#555")

    return render(name, f"Pareto frontier: accuracy against {x_label}, champion marked, pick highlighted",
                   8.0, 5.0, draw, key=pick.rule_sha256)


def speed_section(scale: SpeedScale, measured: Sequence[CandidateEvidence],
                  judged: Sequence[CandidateEvidence]) -> str:
    """How the speeds were put on one scale (or why not), and each candidate's time-dependent metrics as measured
    beside the values the rule judged, with its gate's load factor."""
    note = f'<p class="note" id="speed">{esc(scale.note)}.</p>'
    if scale.basis != SIDE_BY_SIDE:
        return note
    by_name = {e.name: e for e in judged}
    shown = [m for m in SCALED if any(e.metrics.get(m) is not None for e in measured)]
    rows = [[esc(e.name), num(scale.champion_p50_ms.get(e.name)), num(scale.loads.get(e.name)),
             *(f"{num(e.metrics.get(m))} → {num(by_name[e.name].metrics.get(m))}" for m in shown)]
            for e in measured]
    headers = ["candidate", "champion median in its gate (ms)", "load factor",
               *(f"{m} ({METRICS[m].unit}): measured → judged" for m in shown)]
    return note + table_html(headers, rows, css_class="speed")


def _held_out_text(held_out_split: str | None) -> str:
    if held_out_split:
        return (f"The pick's gate against the champion runs on tasks held out from this sweep "
                f"(<code>{esc(held_out_split)}</code>), which no candidate was measured on: the numbers below are from "
                "the tasks the pick was chosen on, and the best of several on the same tasks looks better there than "
                "it is.")
    return ("No held-out split was named: the numbers below are from the tasks the pick was chosen on, and the best "
            "of several on the same tasks looks better there than it is.")


def render_html(title: str, rule: SelectionRule, pick: Pick, candidates: Sequence[CandidateEvidence],
                champion: CandidateEvidence | None, held_out_split: str | None, speed: SpeedScale | None = None,
                measured: Sequence[CandidateEvidence] = ()) -> str:
    """The self-contained HTML sweep report (the module doc lists its sections); `speed` and `measured` as
    `write_sweep_report` takes them."""
    common = speed is not None and speed.basis == SIDE_BY_SIDE
    speed_html = speed_section(speed, measured, candidates) if speed is not None else ""
    head = (f'Picked: <span class="decision picked" id="pick">{esc(pick.picked)}</span>' if pick.picked else
            '<span class="decision violates" id="pick">no candidate meets the rule: nothing picked</span>')
    charts_html = "".join(pareto_chart(pick, candidates, champion, x_metric=m, name=name, title=t,
                                       x_label=label + (", side by side" if common else ""))
                          for m, label, name, t in CHART_AXES)
    axes = ", ".join(f"{m} ({d})" for m, d in rule.axes())
    rule_yaml = yaml.safe_dump(rule.canonical(), sort_keys=False, allow_unicode=True)
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        f"<title>{esc(title)}</title><style>{CSS}{EXTRA_CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p>{head} of {len(candidates)} candidates; frontier: {esc(', '.join(pick.frontier) or 'empty')}.</p>",
        f'<p class="note" id="held-out">{_held_out_text(held_out_split)}</p>',
        f'<p>Files: <a href="{SWEEP_REPORT_NAME}">{SWEEP_REPORT_NAME}</a></p>',
        "<h2>Pareto frontier</h2>",
        f'<p class="note">Dominance is judged on {esc(axes)}; the frontier is the candidates that meet every '
        "constraint and that no other such candidate dominates, so a frontier line need not be the upper edge of "
        "one chart's two axes.</p>",
        f'<div class="charts">{charts_html}</div>' if charts_html else
        '<p class="note">No candidate has accuracy with cost or p95 latency measured: nothing to draw.</p>',
        "<h2>Candidates</h2>",
        candidates_table(pick, candidates, champion),
        *(["<h2>Speeds side by side</h2>", speed_html] if speed_html else []),
        "<h2>The rule, as written before the results</h2>",
        f'<p>sha256 <code id="rule-sha256">{esc(rule.sha256())}</code></p>',
        f"<pre>{esc(rule_yaml)}</pre>",
        "</body></html>\n",
    ])


def _check_pick(rule: SelectionRule, pick: Pick, candidates: Sequence[CandidateEvidence]) -> None:
    """Refuse a pick that is not what the rule gives on this evidence (another rule, other candidates, edited)."""
    derived = choose(rule, candidates)
    if pick.rule_sha256 != derived.rule_sha256:
        raise BadInput(f"the pick was made under rule {pick.rule_sha256[:12]}, not this rule "
                       f"({derived.rule_sha256[:12]})", fix="report a sweep with the rule it opened with")
    if pick != derived:
        raise BadInput("the pick differs from what the rule gives on these candidates "
                       f"(recorded {pick.picked!r}, re-derived {derived.picked!r})",
                       fix="pass choose(rule, candidates) and the same candidates it was given")


def write_sweep_report(out_dir: str | Path, rule: SelectionRule, pick: Pick, candidates: Sequence[CandidateEvidence],
                       champion: CandidateEvidence | None, *, title: str = "Sweep report",
                       held_out_split: str | None = None, speed: SpeedScale | None = None,
                       measured: Sequence[CandidateEvidence] | None = None) -> dict[str, str]:
    """Write sweep-report.json and report.html into `out_dir` (atomically) and return their paths and sha256s.
    `candidates`: the evidence the rule judged; `measured` and `speed`: the same as the gates measured it and how
    its speeds were put on one scale (`validation.sweep_speed`), shown beside it. `held_out_split`: the tasks the
    pick's gate runs on, which the sweep did not measure (the report says so)."""
    _check_pick(rule, pick, candidates)
    report: dict[str, Any] = {
        "rule": rule.canonical(), "rule_sha256": rule.sha256(),
        "dominance_axes": [{"metric": m, "better": d} for m, d in rule.axes()],
        "pick": pick.to_json(), "held_out_split": held_out_split,
        "candidates": [c.to_json() for c in sorted(candidates, key=lambda c: c.name)],
        "champion": champion.to_json() if champion else None,
        "speed": speed.to_json() if speed else None,
        "measured": [c.to_json() for c in sorted(measured, key=lambda c: c.name)] if measured is not None else None,
    }
    json_bytes = (json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n").encode()
    html_bytes = render_html(title, rule, pick, candidates, champion, held_out_split, speed,
                             measured or ()).encode("utf-8")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / SWEEP_REPORT_NAME, out / HTML_REPORT_NAME
    write_bytes_atomic(json_path, json_bytes)
    write_bytes_atomic(html_path, html_bytes)
    return {"sweep_report_json": str(json_path), "report_html": str(html_path),
            "sweep_report_sha256": sha256_bytes(json_bytes), "report_html_sha256": sha256_bytes(html_bytes)}
