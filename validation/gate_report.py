"""Gate reports (DESIGN §8.3): gate-report.json for machines, a self-contained report.html for people.

The HTML has no scripts and no external resources: tables, inline CSS and inline SVG charts (`validation.charts`,
matplotlib's SVG backend, deterministic bytes). Every string that comes from data (task ids, labels, errors, titles,
config values) is HTML-escaped. Both files are written atomically (temporary file in the same folder, fsync, rename).
The report knows no model family: what one scored row is called, the family's headline metrics, rows and sections,
and how its requests carry its rows come from the `ReportParts` its evaluation passes (`validation.report_parts`).

What a reviewer reads, top to bottom (docs/reports.md): the decision and its one-line summary (naming every check that
did not pass, or `no thresholds: not a gate`); the candidate beside the champion on every gated metric, with the paired
interval and the rule of each check that judged it; every check with its rule; the release (fitted temperature, the
config fields that changed against the champion's release, cost); the reliability diagram with the champion's curve
over the candidate's; latency per request; the family's confusion matrices, if it has any; then every scored item.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from shiplift.tasks.atomic import write_bytes_atomic
from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import sha256_bytes
from shiplift.validation import charts
from shiplift.validation.cold_start import COPY_RESTART, FROM_ZERO_INSTANCES
from shiplift.validation.gates import CHAMPION_CHECKS, NOT_GATED, RATIO, summary_line
from shiplift.validation.metrics import score_predictions
from shiplift.validation.report_parts import ReportParts
from shiplift.validation.thresholds import RULE_TEXT

GATE_REPORT_NAME = "gate-report.json"
HTML_REPORT_NAME = "report.html"
PREDICTIONS_NAME = "predictions.jsonl"
PERCENTILES = ("p50", "p95", "p99")
PRICE_KEYS = ("usd_per_hour", "usd", "usd_per_copy_hour")  # the figure of each pricing result (None: no price)
# what the gate's cold starts measured (validation.cold_start.cold_start_kind), as the report names it
COLD_START_LABELS = {FROM_ZERO_INSTANCES: "cold starts, from zero instances (an instance, then a copy) to the first "
                                          "answer",
                     COPY_RESTART: "cold starts, copy restart (a copy started again on a running instance, not from "
                                   "zero instances) to the first answer"}
STATUS_ORDER = ("fail", "inconclusive", "pass")  # a comparison row takes the worst status of the checks that judged it

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1300px;font-size:15px}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:0.25em 0.6em;text-align:left;font-variant-numeric:tabular-nums;vertical-align:top}
th{background:#f3f3f3}
.pass{background:#d8f5d8}.fail{background:#f8d3d3}.inconclusive{background:#fbefc7}.skipped,.shown{background:#f4f4f4}
.decision{font-size:1.4em;padding:0.3em 0.8em;display:inline-block;border-radius:4px}
.decision.not_gated{background:#e4e4f7}
.banner{font-size:1.2em;padding:0.6em 1em;border-radius:6px;margin:0.6em 0;border:2px solid}
.banner.not-gated{background:#eef0ff;border-color:#5a5fc8}.banner.fail{background:#fde8e8;border-color:#d62728}
.banner.inconclusive{background:#fdf5dc;border-color:#d4a000}.banner.pass{background:#e6f4e6;border-color:#2ca02c}
.no-price{color:#8a4b00;font-style:italic}
svg.chart{display:block;max-width:100%;height:auto;background:#fff;border:1px solid #ddd;margin:0.5em 0 1.5em}
.charts{display:flex;flex-wrap:wrap;gap:1em}
.note{color:#555}
"""

FRIENDLY = {  # metric key of validation.metrics -> what a reviewer reads (a family adds its own: ReportParts.labels)
    "accuracy": "accuracy", "validity": "validity", "ece": "ECE (10 bins)", "brier": "Brier", "nll": "NLL",
    "allowed_token_mass": "allowed-token mass", "p95_latency_ms": "p95 latency (ms, per request)",
}


# HTML from f-strings, not Jinja2 templates (installed with llama-cpp-python): a family hands its own parts in as
# functions of its evidence (validation.report_parts), which compose as calls do; every value passes through esc, and
# the browser test renders the result. Templates would split each part's markup from the code that picks its data.
def esc(value: Any) -> str:
    """HTML-escape any value's text (quotes too, so it is safe inside attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return esc(value)
    if isinstance(value, float) and abs(value) >= 10 ** digits:
        return f"{value:,.0f}"  # 10,000 rather than 1e+04
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _ci(ci: Sequence[float] | None) -> str:
    return f"[{num(ci[0])}, {num(ci[1])}]" if ci else "–"


def table_html(headers: Sequence[str], rows: Sequence[Sequence[str]], row_classes: Sequence[str] | None = None, *,
           css_class: str = "") -> str:
    """An HTML table from already-escaped cell strings."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{esc(row_classes[i])}"' if row_classes else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    table_class = f' class="{esc(css_class)}"' if css_class else ""
    return f"<table{table_class}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _friendly(metric: str, parts: ReportParts) -> str:
    return parts.labels.get(metric) or FRIENDLY.get(metric, metric)


# ------------------------------------------------------------------------------------------------------------------
# Checks and their rules


def judged_value(check: Mapping[str, Any]) -> float | None:
    """The number a check compared with its threshold: the point estimate (`point`), the interval's conservative end
    (`bound`: low end of a floor, high end of a ceiling), or the paired interval's end the champion rule reads."""
    ci, rule, comparator = check.get("ci"), check.get("rule"), check.get("comparator") or ""
    if rule == "point" or not ci:
        return check.get("observed")
    if rule == "paired":
        return ci[0] if "ci_low" in comparator else ci[1]
    return ci[0] if comparator.endswith(">=") else ci[1]


def rule_text(check: Mapping[str, Any]) -> str:
    """The rule a check used, in words: `interval bound: CI low end >= 0.3`, `point estimate <= 5000`, `paired
    interval: CI low end of candidate − champion >= -0.02`; `not stated` for a record written before rules were."""
    rule, comparator, threshold = check.get("rule"), check.get("comparator") or "", check.get("threshold")
    if check.get("status") == "skipped":
        return "–"
    if rule is None:
        return "not stated (a report written before rules were recorded)"
    words = RULE_TEXT.get(rule, rule)
    if threshold is None:
        return words
    if rule == "paired":
        end = "low" if "ci_low" in comparator else "high"
        op = ">=" if end == "low" else "<="
        what = "candidate p95 / champion p95" if comparator == RATIO else "candidate − champion"
        return f"{words}: {end} end of {what} {op} {num(threshold)}"
    op = comparator.split()[-1] if comparator else ""
    if rule == "bound":
        return f"{words}: {'low' if op == '>=' else 'high'} end of the interval {op} {num(threshold)}"
    return f"{words} {op} {num(threshold)}"


def _checks_table(checks: Sequence[Mapping[str, Any]]) -> str:
    rows = [[esc(c.get("name")), esc(c.get("status")), esc(rule_text(c)), num(c.get("observed")), _ci(c.get("ci")),
             num(judged_value(c)) if c.get("status") != "skipped" else "–", num(c.get("n")), esc(c.get("reason"))]
            for c in checks]
    return table_html(["check", "status", "rule", "observed", "95% CI", "value judged", "n", "reason"], rows,
                  [str(c.get("status")) for c in checks], css_class="checks")


# ------------------------------------------------------------------------------------------------------------------
# Summary


def _estimate_cell(est: Mapping[str, Any] | None) -> str:
    est = est or {}
    return f"{num(est.get('value'))} &nbsp; 95% CI {_ci(est.get('ci'))} &nbsp; n={num(est.get('n'))}"


def _summary_rows(report: Mapping[str, Any], parts: ReportParts) -> list[list[str]]:
    """The family's metrics (a metric the family does not measure, or did not measure here, is left out)."""
    metrics = report.get("metrics") or {}
    rows = [["decision", esc(report.get("decision"))], [esc(parts.items), num(metrics.get("n"))],
            ["valid answers", num(metrics.get("n_valid"))]]
    for name in parts.estimates:
        est = metrics.get(name) or {}
        if est.get("value") is not None:
            rows.append([esc(_friendly(name, parts)), _estimate_cell(est)])
    for name, est in parts.family_rows(metrics):
        rows.append([esc(_friendly(name, parts)), _estimate_cell(est)])
    latency = metrics.get("latency_ms") or {}
    for q in ("p50", "p90", "p95", "p99", "mean"):
        est = latency.get(q) or {}
        rows.append([f"latency {q} (ms, per request ({esc(parts.request)}))",
                     f"{num(est.get('value'))} &nbsp; 95% CI {_ci(est.get('ci'))}"])
    rows.append(["first request (ms, reported apart)", num(latency.get("first_ms"))])
    rows.append(["warm-up requests excluded", num(latency.get("warmup"))])
    per_item = metrics.get("latency_per_item_ms")
    if per_item:
        for q in ("p50", "p95"):
            rows.append([f"per-{esc(parts.item)} share of a request's latency, {q} "
                         "(ms; a cost per item, not a latency)", num((per_item.get(q) or {}).get("value"))])
    throughput = metrics.get("throughput") or {}
    if throughput.get("answers_per_second") is not None:
        text = f"{num(throughput['answers_per_second'])} answers/s over {num(throughput.get('seconds'))} s"
        if throughput.get("requests_per_second") is not None:
            text += f" ({num(throughput['requests_per_second'])} requests/s)"
        rows.append(["throughput at the gate's concurrency", text])
    rows.append(["503 retries (not scored)", num(metrics.get("retries_503"))])
    rows.append(["errors", num(metrics.get("errors"))])
    return rows


def _banner(report: Mapping[str, Any]) -> str:
    decision = str(report.get("decision"))
    if decision == "not_gated":
        return (f'<div class="banner not-gated" id="summary">{esc(NOT_GATED)}: this run measured the model against no '
                "threshold and no champion; nothing was judged and nothing promotes on it.</div>")
    summary = summary_line(decision, report.get("checks") or [])
    return f'<div class="banner {esc(decision)}" id="summary">{esc(summary)}</div>'


# ------------------------------------------------------------------------------------------------------------------
# Candidate against champion


def _judges(row: Mapping[str, Any], checks: Mapping[str, Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [checks[name] for name in row.get("gated_by") or [] if name in checks]


def _row_status(judges: Sequence[Mapping[str, Any]]) -> str:
    statuses = {c.get("status") for c in judges}
    return next((s for s in STATUS_ORDER if s in statuses), "shown")


def _value_cell(side: Mapping[str, Any] | None) -> str:
    side = side or {}
    return f"{num(side.get('value'))}<br><small>{_ci(side.get('ci'))}</small>"


def _champion_section(report: Mapping[str, Any], parts: ReportParts) -> str:
    champion = report.get("champion") or {}
    if not champion.get("present"):
        return "<p>skipped: no champion serves, so there is nothing to compare with.</p>"
    checks = {c["name"]: c for c in report.get("checks") or []}
    rows, classes, chart_rows = [], [], []
    for row in champion.get("comparison") or []:
        judges = _judges(row, checks)
        status = _row_status(judges)
        if row.get("ratio") is not None:
            difference = (f"{num(row.get('difference'))} ms<br><small>paired {_ci(row.get('difference_ci'))}</small>"
                          f"<br>ratio {num(row['ratio'])}<br><small>paired {_ci(row.get('ratio_ci'))}</small>")
        elif row.get("paired"):
            difference = f"{num(row.get('difference'))}<br><small>paired {_ci(row.get('difference_ci'))}</small>"
        else:
            difference = f"{num(row.get('difference'))}<br><small>separate runs, not paired</small>"
        judged = "<br>".join(f"{esc(c['name'])}: {esc(rule_text(c))} → <b>{esc(c.get('status'))}</b>" for c in judges)
        rows.append([esc(_friendly(row["metric"], parts)), _value_cell(row.get("candidate")),
                     _value_cell(row.get("champion")), difference, num(row.get("n_shared")), esc(row.get("better")),
                     judged or "shown, not gated"])
        classes.append(status)
        gate = checks.get(CHAMPION_CHECKS.get(row["metric"], f"champion_{row['metric']}"))
        if row.get("paired") and row.get("ratio") is None:  # latency is drawn apart, as a ratio beside the SLO
            chart_rows.append({"name": _friendly(row["metric"], parts), "difference": row.get("difference"),
                               "ci": row.get("difference_ci"), "threshold": gate.get("threshold") if gate else None,
                               "status": gate.get("status") if gate else None})
    facts = (
        f"<p>champion: {num(champion.get('n'))} tasks, {num(champion.get('n_valid'))} valid, "
        f"{num(champion.get('errors'))} errors, {num(champion.get('retries_503'))} 503 retries. Each cell: the "
        "value and its 95% interval; candidate − champion is paired on the shared tasks where the metric is per "
        "task.</p>"
    ) + _champion_evidence(champion.get("evidence"))
    confidence = (report.get("bootstrap") or {}).get("confidence") or 0.95
    return facts + table_html(
        ["metric", "candidate", "champion", "candidate − champion", "shared tasks", "better",
         "judged by (rule → status)"],
        rows, classes, css_class="champion",
    ) + charts.champion_check(chart_rows, confidence=confidence) + _latency_judgements(report, checks, confidence) \
        + _power_section(champion.get("power") or [])


def _champion_evidence(evidence: Mapping[str, Any] | None) -> str:
    """Where the champion's per-task evidence came from (`validation.champion_reuse`): reused from an earlier gate's
    file, or scored on every task and why; nothing for a gate that offered no reuse."""
    if not evidence:
        return ""
    if evidence.get("reused"):
        return (f"<p class=\"note\">Champion accuracy and calibration: {num(evidence.get('n'))} per-task results "
                f"reused from release {esc(evidence.get('from_release'))} ({esc(evidence.get('file'))}), measured "
                "there on the same datasets, serving identity and determinism profile; the champion answered "
                f"{num(evidence.get('latency_sample'))} of the tasks live, alternated with the candidate, for the "
                "latency ratio (the p95 cells and the ratio are those requests').</p>")
    return f"<p class=\"note\">Champion scored on every task: {esc(evidence.get('why'))}.</p>"


def _power_section(plans: Sequence[Mapping[str, Any]]) -> str:
    """What the champion checks could resolve at this size (`validation.gate_power`, with the disagreement these two
    models showed on the shared tasks): the chance an equally good candidate passes, and the narrowest margin it passes
    at 80 %; the same numbers as `shiplift gate plan`."""
    if not plans:
        return ""
    rows = []
    for plan in plans:
        spread = plan["spread"]
        what = (f"{spread['disagreement']:.1%} of tasks answered differently" if spread.get("disagreement") is not None
                else f"per-task SD {spread['sd']:.3f} ({spread['source']})")
        rows.append([esc(plan["check"]), num(plan["margin"]), num(plan["n"]), esc(what), num(plan["equal_passes"], 2),
                     num(plan["narrowest_margin"], 3),
                     esc(plan["tasks_needed"] if plan["tasks_needed"] is not None else "none")])
    return ("<h3>The gate's power at this size</h3><p class=\"note\">How likely an equally good candidate was to pass "
            "these champion checks on this many shared tasks, with the spread these two models showed; below 0.80 "
            "an inconclusive decision says more about the gate's size than about the candidate (docs/reports.md, "
            "“Before the run: the gate's power”).</p>"
            + table_html(["check", "margin", "shared tasks", "spread", "P(pass) if equal", "narrowest margin at 80 %",
                      "tasks for this margin"], rows, css_class="power"))


def _extension_section(report: Mapping[str, Any]) -> str:
    """An inconclusive gate decided by extension (`validation.extension`): the first look's decision, then every look
    of each check it judged again; the decision and checks above are the final ones."""
    extension = report.get("extension")
    if not extension:
        return ""
    first = report.get("first_look") or {}
    rows = [[num(look["look"]), esc(look.get("check", "champion_accuracy")), num(look["n"]),
             _ci(look.get("interval")), esc(look["method"]), esc(look["status"])]
            for look in extension.get("looks") or []]
    return (f"<h2>Extension</h2><p class=\"note\">The first look was {esc(first.get('decision'))}; the release "
            "chose to extend (<code>validation.inconclusive.choice: extend</code>), so "
            f"{num(extension.get('reserve_tasks_scored'))} reserve tasks were scored on both models and each "
            "inconclusive champion check judged again on all paired tasks so far, in a way valid at every look "
            "(accuracy: a confidence sequence; the p95 ratio: Bonferroni over the planned looks). Stopped: "
            f"{esc(extension.get('stopped'))}. The decision above is the extension's; the candidate-against-champion "
            "table is the first look's.</p>"
            + table_html(["look", "check", "paired tasks (accuracy) or requests (ratio)",
                          "interval (accuracy: candidate − champion; ratio: candidate / champion)", "method", "status"],
                         rows, [str(r[-1]) for r in rows], css_class="extension"))


def _latency_judgements(report: Mapping[str, Any], checks: Mapping[str, Mapping[str, Any]], confidence: float) -> str:
    """The latency ratio against the champion (the comparison) beside each side's p95 against the SLO ceiling."""
    champion = report.get("champion") or {}
    row = next((r for r in champion.get("comparison") or [] if r.get("ratio") is not None), None)
    if row is None:
        return ""
    ratio_check, slo_check = checks.get("champion_p95_ratio") or {}, checks.get("p95_latency_ms") or {}
    note = ("<p class=\"note\">Latency is judged twice, apart: against the champion as the ratio of the two p95s, both "
            "measured alternately in one window on this machine (what loads the machine loads both), and against the "
            "SLO, an absolute ceiling that a busy machine can fail whatever the model.</p>")
    return note + charts.latency_ratio(
        {"ratio": row["ratio"], "ci": row.get("ratio_ci"), "n": row.get("n_shared")},
        max_ratio=ratio_check.get("threshold"), ratio_status=ratio_check.get("status"),
        p95={"candidate": row.get("candidate"), "champion": row.get("champion")},
        slo_ms=slo_check.get("threshold"), slo_status=slo_check.get("status"), confidence=confidence)


# ------------------------------------------------------------------------------------------------------------------
# Release: temperature, config changes, cost


def _cost_line(item: Mapping[str, Any] | None, absent: str) -> str:
    if not item:
        return f'<span class="note">{esc(absent)}</span>'
    text = str(item.get("text") or "")
    missing = item.get("missing")
    priced = next((item[key] for key in PRICE_KEYS if key in item), None)
    if missing or priced is None:
        shown = text if "no price" in text else f"no price: {text or missing}"
        return f'<span class="no-price">{esc(shown)}</span>'
    return esc(text)


def cost_rows(cost: Mapping[str, Any] | None) -> list[list[str]]:
    """The cost lines of `tasks.backends.pricing.release_cost` as table rows (each says `no price` where the table
    had none)."""
    if not cost:
        return [["cost", '<span class="no-price">not recorded: no price computed for this run</span>']]
    rows = [
        ["production per hour", _cost_line(cost.get("production"), "no production placement priced")],
        ["candidate (deploy to now)", _cost_line(cost.get("candidate"), "not priced: no candidate start recorded")],
        ["per million requests and decisions",
         _cost_line(cost.get("per_million"), "not priced: no throughput measured")],
    ]
    if cost.get("mig_copy"):
        rows.append(["a MIG copy's share of its instance", _cost_line(cost.get("mig_copy"), "")])
    if cost.get("share"):
        rows.append(["this model's share of its shared endpoint", _cost_line(cost.get("share"), "")])
    if cost.get("nominal"):
        rows.append(["priced as", esc(f"on SageMaker AI in {cost.get('region')}: this release runs on this machine "
                                     "and costs nothing here")])
    rows.append(["price table", esc(cost.get("table"))])
    return rows


def _release_section(report: Mapping[str, Any]) -> str:
    release = (report.get("extra") or {}).get("release")
    if not release:
        return "<h2>Release</h2><p>ad-hoc evaluation: no release, no champion's config to compare, no cost.</p>"
    temperature = release.get("temperature") or {}
    if temperature.get("value") is None:
        temp = "none (the model's own probabilities)"
    else:
        how = ("fitted by NLL on the calibration split" if temperature.get("fitted")
               else "set in the config, not fitted")
        temp = f"{num(temperature['value'])} ({how})"
    facts = [["release", esc(release.get("release_id"))],
             ["champion release", esc(release.get("champion_release") or "none")],
             ["temperature served", esc(temp)]]
    cold = release.get("cold_start")
    if cold:  # a release that scales to zero: each start of the candidate from no copy to its first answer
        starts = ", ".join("no answer" if s.get("error") else f"{s['seconds']:.2f} s" for s in cold["starts"])
        facts.append([COLD_START_LABELS[cold.get("kind", COPY_RESTART)],  # a record from before the kind: copy restarts
                      esc(f"{starts}; p95 {cold['p95_s']:.2f} s, bound {cold['max_p95_s']:g} s")])
    cached = release.get("cache_check")
    if cached:  # the candidate's answers cold and warm from its prefix cache (validation.cache_check)
        worst = ("not measured" if cached["max_abs_difference"] is None else
                 f"max |warm − cold| option probability {num(cached['max_abs_difference'], 3)}"
                 + (f" (task {cached['worst_task']})" if cached["worst_task"] else ""))
        facts.append(["prefix cache, cold vs warm",
                      esc(f"cache {cached['cache']}; {cached['compared']} of {cached['sample']} tasks answered warm "
                          f"from a cached prefix; {worst}; tolerance {cached['tolerance']:g}")])
    changes = release.get("config_changes") or []
    if release.get("champion_release") is None:
        changed = "<p>no champion release: nothing to compare the config with.</p>"
    elif not changes:
        changed = "<p>no config field differs from the champion's release.</p>"
    else:
        changed = table_html(["config field", "champion", "candidate"],
                         [[esc(c.get("field")), esc(json.dumps(c.get("champion"), ensure_ascii=False)),
                           esc(json.dumps(c.get("candidate"), ensure_ascii=False))] for c in changes],
                           css_class="changes")
    return ("<h2>Release</h2>" + table_html(["field", "value"], facts, css_class="release")
            + f"<h3>Config fields changed against the champion's release ({len(changes)})</h3>" + changed
            + "<h3>Cost</h3>" + table_html(["what", "cost"], cost_rows(release.get("cost")), css_class="cost"))


# ------------------------------------------------------------------------------------------------------------------
# Charts


def _start(value: Any) -> float:
    if isinstance(value, str):
        return datetime.fromisoformat(value).timestamp()
    return float(value)


def steady_latencies(rows: Sequence[Mapping[str, Any]], latency: Mapping[str, Any]) -> list[float]:
    """The latencies the percentiles were computed on: successful requests by start, less the first (reported
    apart) and the warm-up ones."""
    ok = sorted(((_start(r["started_at"]), i, float(r["latency_ms"])) for i, r in enumerate(rows)
                 if r.get("error") is None and isinstance(r.get("latency_ms"), int | float)))
    skip = (1 if ok else 0) + int(latency.get("warmup") or 0)
    return [value for _, _, value in ok[skip:]]


def _latency_chart(report: Mapping[str, Any], predictions: Sequence[Mapping[str, Any]], parts: ReportParts) -> str:
    latency = (report.get("metrics") or {}).get("latency_ms") or {}
    markers = {q: (latency.get(q) or {}).get("value") for q in PERCENTILES}
    requests = (report.get("extra") or {}).get("requests")
    if parts.batched and requests is not None:  # one request is one batch: count the requests, not the items
        sizes = sorted({r.get(parts.request_items) for r in requests})
        unit = f"requests (batches of {'/'.join(str(s) for s in sizes)} {parts.items})" if sizes else "requests"
        chart = charts.latency_histogram(steady_latencies(requests, latency), markers, unit="requests",
                                         what="client latency per request")
        note = (f"<p class=\"note\">Counted per request: {esc(unit)}; one batch is one request. The "
                f"per-{esc(parts.item)} share (a request's latency over its {esc(parts.items)}) is a cost per item, "
                "listed in the summary, not a latency.</p>")
        return note + chart
    chart = charts.latency_histogram(steady_latencies(predictions, latency), markers, unit="requests")
    return (f"<p class=\"note\">Counted per request (one {esc(parts.item)} a request), the first request reported "
            f"apart ({num(latency.get('first_ms'))} ms).</p>" + chart)


def _confusion_charts(report: Mapping[str, Any], parts: ReportParts) -> str:
    drawn = [charts.confusion_matrix(confusion["true"], confusion["predicted"], confusion["counts"], who=who)
             for who, confusion in parts.confusions(report)]
    return "<h2>Confusion matrix</h2><div class=\"charts\">" + "".join(drawn) + "</div>" if drawn else ""


# ------------------------------------------------------------------------------------------------------------------
# The page


def render_html(title: str, report: Mapping[str, Any], predictions: Sequence[Mapping[str, Any]],
                parts: ReportParts) -> str:
    """The self-contained HTML report (the module doc lists its sections); `parts`: the family's."""
    scored = score_predictions(predictions)
    decision = str(report.get("decision"))
    checks = report.get("checks") or []
    metrics = report.get("metrics") or {}
    champion = report.get("champion") or {}
    task_rows, task_classes = [], []
    for i, row in enumerate(predictions):
        valid = bool(scored.valid[i])
        conf = float(scored.confidence[i])
        task_rows.append(
            [esc(row["id"]), esc(row.get("dataset")), esc(row["expected"]), esc(scored.predicted[i]),
             num(conf if math.isfinite(conf) else None), "yes" if scored.correct[i] else "no",
             num(row.get("latency_ms")), num(row.get("retries_503")), esc(row.get("error"))]
        )
        task_classes.append("pass" if scored.correct[i] else "fail" if valid else "inconclusive")
    extra = {k: v for k, v in (report.get("extra") or {}).items() if k not in ("release", "requests")}
    extra_html = (
        f"<h2>Dataset and run</h2><pre>{esc(json.dumps(extra, indent=2, sort_keys=True, ensure_ascii=False))}</pre>"
        if extra else ""
    )
    reliability = charts.reliability(metrics.get("reliability") or [],
                                     (champion.get("metrics") or {}).get("reliability")
                                     if champion.get("present") else None)
    rule = report.get("decision_rule")
    return "".join(
        [
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{esc(title)}</h1>",
            f'<p>Decision: <span class="decision {esc(decision)}" id="decision">{esc(decision)}</span></p>',
            _banner(report),
            f'<p>Files: <a href="{PREDICTIONS_NAME}">{PREDICTIONS_NAME}</a> · '
            f'<a href="{GATE_REPORT_NAME}">{GATE_REPORT_NAME}</a></p>',
            "<h2>Candidate against champion</h2>",
            _champion_section(report, parts),
            _extension_section(report),
            "<h2>Checks</h2>",
            (f"<p class=\"note\">Absolute checks read {esc(RULE_TEXT.get(rule, rule))} (config "
             "<code>validation.decision_rule</code>); champion checks read the paired interval.</p>" if rule else ""),
            _checks_table(checks),
            _release_section(report),
            "<h2>Summary</h2>",
            table_html(["metric", "value"], _summary_rows(report, parts), css_class="summary"),
            "<h2>Reliability diagram</h2>",
            reliability,
            "<h2>Latency histogram</h2>",
            _latency_chart(report, predictions, parts),
            _confusion_charts(report, parts),
            "<h2>Thresholds used</h2>",
            f"<pre>{esc(json.dumps(report.get('thresholds'), indent=2, sort_keys=True))}</pre>",
            extra_html,
            f"<h2>Per {esc(parts.item)} ({len(task_rows)})</h2>",
            table_html(
                ["id", "dataset", "expected", "predicted", "confidence", "correct",
                 f"latency ms (per-{parts.item} share)" if parts.batched else "latency ms", "503 retries", "error"],
                task_rows,
                task_classes,
            ),
            "</body></html>\n",
        ]
    )


def rewrite_reports(out_dir: str | Path, *, changes: Mapping[str, Any], predictions: list[dict], title: str,
                    parts: ReportParts) -> dict:
    """Write gate-report.json and report.html again with `changes` over the report already there (an extension's
    final decision and checks beside the first look), from the gate's own `predictions`; return what write_reports
    returns."""
    out = Path(out_dir)
    report = json.loads((out / GATE_REPORT_NAME).read_text(encoding="utf-8"))
    extra = report.pop("extra", None)
    return write_reports(out, gate_report={**report, **changes}, predictions=predictions, title=title, parts=parts,
                         extra=extra)


def write_reports(
    out_dir: str | Path,
    *,
    gate_report: dict,
    predictions: list[dict],
    title: str,
    parts: ReportParts,
    extra: dict | None = None,
) -> dict:
    """Write gate-report.json (gate report + `extra` dataset info) and report.html (its family's `parts`); return
    paths and sha256s."""
    if "extra" in gate_report:
        raise BadInput("gate_report already has an 'extra' key", fix="pass dataset info only through extra=")
    report = {**gate_report, "extra": extra or {}}
    try:
        json_bytes = (
            json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"
        ).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise BadInput(
            f"gate report is not JSON-able: {exc}", fix="pass GateReport.to_dict() and plain JSON values in extra"
        ) from exc
    html_bytes = render_html(title, report, predictions, parts).encode("utf-8")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, html_path = out / GATE_REPORT_NAME, out / HTML_REPORT_NAME
    write_bytes_atomic(json_path, json_bytes)
    write_bytes_atomic(html_path, html_bytes)
    return {
        "gate_report_json": str(json_path),
        "report_html": str(html_path),
        "gate_report_sha256": sha256_bytes(json_bytes),
        "report_html_sha256": sha256_bytes(html_bytes),
    }
