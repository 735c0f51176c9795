"""Gate reports (DESIGN §8.3): gate-report.json for machines, a self-contained report.html for people.

The HTML has no scripts and no external resources: tables, inline CSS and inline SVG only.
Every string that comes from data (task ids, labels, errors, titles) is HTML-escaped.
Both files are written atomically (temporary file in the same folder, fsync, rename).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tasks.atomic import write_bytes_atomic
from tasks.errors import BadInput
from tasks.hashing import sha256_bytes
from validation.metrics import score_predictions

GATE_REPORT_NAME = "gate-report.json"
HTML_REPORT_NAME = "report.html"
PREDICTIONS_NAME = "predictions.jsonl"
LATENCY_BINS = 20

CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:0.25em 0.6em;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f3f3f3}
.pass{background:#d8f5d8}.fail{background:#f8d3d3}.inconclusive{background:#fbefc7}.skipped{background:#eee}
.decision{font-size:1.4em;padding:0.3em 0.8em;display:inline-block;border-radius:4px}
svg{background:#fff;border:1px solid #ddd;margin-right:1em}
"""


def _e(value: Any) -> str:
    """HTML-escape any value's text (quotes too, so it is safe inside attributes)."""
    return html.escape("" if value is None else str(value), quote=True)


def _num(value: Any, digits: int = 4) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _e(value)
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _ci(ci: Sequence[float] | None) -> str:
    return f"[{_num(ci[0])}, {_num(ci[1])}]" if ci else "–"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], row_classes: Sequence[str] | None = None) -> str:
    """An HTML table from already-escaped cell strings."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{_e(row_classes[i])}"' if row_classes else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def reliability_svg(reliability: Sequence[Mapping[str, Any]]) -> str:
    """Reliability diagram: accuracy per confidence bin as bars, the diagonal, and bin counts below."""
    left, top, size, count_h = 45, 15, 300, 70
    width, height = left + size + 15, top + size + 40 + count_h + 25
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="reliability diagram">',
        f'<rect x="{left}" y="{top}" width="{size}" height="{size}" fill="none" stroke="#999"/>',
        f'<line x1="{left}" y1="{top + size}" x2="{left + size}" y2="{top}" stroke="#888" stroke-dasharray="4 3"/>',
    ]
    for tick in (0.0, 0.5, 1.0):
        x, y = left + tick * size, top + (1 - tick) * size
        parts.append(f'<text x="{x:.1f}" y="{top + size + 14}" font-size="10" text-anchor="middle">{tick:g}</text>')
        parts.append(f'<text x="{left - 5}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{tick:g}</text>')
    parts.append(
        f'<text x="{left + size / 2}" y="{top + size + 28}" font-size="11" text-anchor="middle">confidence</text>'
    )
    parts.append(
        f'<text x="12" y="{top + size / 2}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 12 {top + size / 2})">accuracy</text>'
    )
    max_count = max((int(row["count"]) for row in reliability), default=0) or 1
    base = top + size + 40 + count_h
    for row in reliability:
        x0 = left + float(row["lower"]) * size
        w = (float(row["upper"]) - float(row["lower"])) * size
        count = int(row["count"])
        if count and row["accuracy"] is not None:
            bar = float(row["accuracy"]) * size
            parts.append(
                f'<rect class="acc" x="{x0 + 1:.1f}" y="{top + size - bar:.1f}" width="{w - 2:.1f}" '
                f'height="{bar:.1f}" fill="#4a78c2" fill-opacity="0.6"/>'
            )
            cx = left + float(row["mean_confidence"]) * size
            cy = top + (1 - float(row["accuracy"])) * size
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="#c23b3b"/>')
        h = count / max_count * count_h
        parts.append(
            f'<rect class="count" x="{x0 + 1:.1f}" y="{base - h:.1f}" width="{w - 2:.1f}" '
            f'height="{h:.1f}" fill="#999"/>'
        )
        parts.append(
            f'<text x="{x0 + w / 2:.1f}" y="{base + 12}" font-size="9" text-anchor="middle">{count}</text>'
        )
    parts.append(f'<text x="{left}" y="{base + 24}" font-size="10">rows per bin (red dot: mean confidence)</text>')
    parts.append("</svg>")
    return "".join(parts)


def latency_svg(latencies_ms: Sequence[float], markers: Mapping[str, float | None]) -> str:
    """Histogram of client latencies in equal-width bins, with vertical lines at the given markers."""
    left, top, plot_w, plot_h = 45, 15, 400, 200
    width, height = left + plot_w + 15, top + plot_h + 45
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="latency histogram">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>',
    ]
    values = np.asarray(latencies_ms, dtype=float)
    if values.size == 0:
        parts.append(f'<text x="{left + 10}" y="{top + 20}" font-size="12">no successful requests</text></svg>')
        return "".join(parts)
    low, high = float(values.min()), float(values.max())
    if high <= low:
        high = low + 1.0
    counts, edges = np.histogram(values, bins=LATENCY_BINS, range=(low, high))
    peak = int(counts.max()) or 1
    bar_w = plot_w / LATENCY_BINS
    for i, count in enumerate(counts):
        h = count / peak * plot_h
        parts.append(
            f'<rect class="bar" x="{left + i * bar_w + 1:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 2:.1f}" '
            f'height="{h:.1f}" fill="#4a78c2"><title>{edges[i]:.1f}–{edges[i + 1]:.1f} ms: {int(count)}</title></rect>'
        )
    for name, value in markers.items():
        if value is None:
            continue
        x = left + (float(value) - low) / (high - low) * plot_w
        parts.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#c23b3b"/>')
        parts.append(f'<text x="{x + 2:.1f}" y="{top + 10}" font-size="10" fill="#c23b3b">{_e(name)}</text>')
    parts.append(f'<text x="{left}" y="{top + plot_h + 14}" font-size="10">{low:.1f} ms</text>')
    parts.append(
        f'<text x="{left + plot_w}" y="{top + plot_h + 14}" font-size="10" text-anchor="end">{high:.1f} ms</text>'
    )
    parts.append(
        f'<text x="{left + plot_w / 2}" y="{top + plot_h + 30}" font-size="11" text-anchor="middle">'
        f"client latency, {values.size} successful requests (peak bin {peak})</text></svg>"
    )
    return "".join(parts)


def _summary_rows(report: Mapping[str, Any]) -> list[list[str]]:
    metrics = report.get("metrics", {})
    rows = [["decision", _e(report.get("decision"))], ["tasks", _num(metrics.get("n"))]]
    rows.append(["valid", _num(metrics.get("n_valid"))])
    for name in ("accuracy", "validity", "ece", "brier", "nll", "allowed_token_mass"):
        est = metrics.get(name) or {}
        cell = f"{_num(est.get('value'))} &nbsp; 95% CI {_ci(est.get('ci'))} &nbsp; n={_num(est.get('n'))}"
        rows.append([_e(name), cell])
    latency = metrics.get("latency_ms") or {}
    for q in ("p50", "p90", "p95", "p99", "mean"):
        est = latency.get(q) or {}
        rows.append([f"latency {q} (ms)", f"{_num(est.get('value'))} &nbsp; 95% CI {_ci(est.get('ci'))}"])
    rows.append(["first request (ms, reported apart)", _num(latency.get("first_ms"))])
    rows.append(["warm-up requests excluded", _num(latency.get("warmup"))])
    rows.append(["503 retries (not scored)", _num(metrics.get("retries_503"))])
    rows.append(["errors", _num(metrics.get("errors"))])
    return rows


def _champion_section(report: Mapping[str, Any]) -> str:
    champion = report.get("champion") or {}
    if not champion.get("present"):
        return "<p>skipped: no champion</p>"
    rows = []
    for name in ("accuracy", "ece"):
        diff = champion.get(name)
        if diff:
            rows.append(
                [_e(name), _num(diff.get("n")), _num(diff.get("candidate")), _num(diff.get("champion")),
                 _num(diff.get("difference")), _ci(diff.get("ci"))]
            )
    facts = (
        f"<p>champion: {_num(champion.get('n'))} tasks, {_num(champion.get('n_valid'))} valid, "
        f"{_num(champion.get('errors'))} errors, {_num(champion.get('retries_503'))} 503 retries</p>"
    )
    return facts + _table(
        ["metric", "shared tasks", "candidate", "champion", "candidate − champion", "paired 95% CI"], rows
    )


def render_html(title: str, report: Mapping[str, Any], predictions: Sequence[Mapping[str, Any]]) -> str:
    """The self-contained HTML report: summary, checks, reliability, latency, champion, per task."""
    scored = score_predictions(predictions)
    decision = str(report.get("decision"))
    checks = report.get("checks") or []
    check_rows = [
        [_e(c.get("name")), _e(c.get("status")), _num(c.get("observed")), _e(c.get("comparator")),
         _num(c.get("threshold")), _ci(c.get("ci")), _num(c.get("n")), _e(c.get("reason"))]
        for c in checks
    ]
    metrics = report.get("metrics") or {}
    latency = metrics.get("latency_ms") or {}
    latencies = [
        float(row["latency_ms"]) for row in predictions
        if row.get("error") is None and isinstance(row.get("latency_ms"), int | float)
    ]
    markers = {q: (latency.get(q) or {}).get("value") for q in ("p50", "p95")}
    task_rows, task_classes = [], []
    for i, row in enumerate(predictions):
        valid = bool(scored.valid[i])
        conf = float(scored.confidence[i])
        task_rows.append(
            [_e(row["id"]), _e(row.get("dataset")), _e(row["expected"]), _e(scored.predicted[i]),
             _num(conf if math.isfinite(conf) else None), "yes" if scored.correct[i] else "no",
             _num(row.get("latency_ms")), _num(row.get("retries_503")), _e(row.get("error"))]
        )
        task_classes.append("pass" if scored.correct[i] else "fail" if valid else "inconclusive")
    extra = report.get("extra")
    extra_html = (
        f"<h2>Dataset and run</h2><pre>{_e(json.dumps(extra, indent=2, sort_keys=True, ensure_ascii=False))}</pre>"
        if extra else ""
    )
    return "".join(
        [
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
            f"<h1>{_e(title)}</h1>",
            f'<p>Decision: <span class="decision {_e(decision)}" id="decision">{_e(decision)}</span></p>',
            f'<p>Files: <a href="{PREDICTIONS_NAME}">{PREDICTIONS_NAME}</a> · '
            f'<a href="{GATE_REPORT_NAME}">{GATE_REPORT_NAME}</a></p>',
            "<h2>Summary</h2>",
            _table(["metric", "value"], _summary_rows(report)),
            "<h2>Checks</h2>",
            _table(
                ["check", "status", "observed", "comparator", "threshold", "95% CI", "n", "reason"],
                check_rows,
                [str(c.get("status")) for c in checks],
            ),
            "<h2>Thresholds used</h2>",
            f"<pre>{_e(json.dumps(report.get('thresholds'), indent=2, sort_keys=True))}</pre>",
            "<h2>Reliability diagram</h2>",
            reliability_svg(metrics.get("reliability") or []),
            "<h2>Latency histogram</h2>",
            latency_svg(latencies, markers),
            "<h2>Champion comparison</h2>",
            _champion_section(report),
            extra_html,
            f"<h2>Per task ({len(task_rows)})</h2>",
            _table(
                ["id", "dataset", "expected", "predicted", "confidence", "correct", "latency ms", "503 retries",
                 "error"],
                task_rows,
                task_classes,
            ),
            "</body></html>\n",
        ]
    )


def write_reports(
    out_dir: str | Path,
    *,
    gate_report: dict,
    predictions: list[dict],
    title: str,
    extra: dict | None = None,
) -> dict:
    """Write gate-report.json (gate report + `extra` dataset info) and report.html; return paths and sha256s."""
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
    html_bytes = render_html(title, report, predictions).encode("utf-8")
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
