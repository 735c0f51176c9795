"""The gate report (decision and NLI) and the audit report as a reviewer's browser shows them: each page is loaded in
real headless Chromium with a small probe script (added to a copy: the reports themselves carry no script) that writes
what the browser laid out (every chart's box, its texts' boxes, its legend's box, the timeline's markers) into the DOM
before `--dump-dom`. Skips, saying why, where Chromium is absent (`make browser` installs it)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.unit.test_report import build, nli_report, release_extra  # noqa: F401  (nli_report is a fixture)

PROBE = """<script>
(() => {
  document.querySelectorAll('details').forEach((d) => { d.open = true; });  // as a reviewer who opens each release
  const box = (el) => { const b = el.getBoundingClientRect(); return {x: b.left, y: b.top, w: b.width, h: b.height}; };
  const out = [...document.querySelectorAll('svg.chart')].map((svg) => ({
    cls: svg.getAttribute('class'), ...box(svg),
    texts: [...svg.querySelectorAll('text')].map((t) => ({text: t.textContent, ...box(t)})),
    legends: [...svg.querySelectorAll('g[id]')].filter((g) => /-legend_[0-9]+$/.test(g.id))
      .map((g) => ({text: g.textContent, ...box(g)})),
    events: [...svg.querySelectorAll('g.event')].map((g) => ({cls: g.getAttribute('class'), ...box(g)})),
  }));
  const pre = document.createElement('pre');
  pre.id = 'probe';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
})();
</script>"""


def chromium() -> str:
    found = os.environ.get("SHIPLIFT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("headless Chromium not found: install it with `make browser` (Debian's chromium), or set "
                    "SHIPLIFT_CHROMIUM to its path")
    return found


def laid_out(page: Path, tmp_path: Path) -> list[dict]:
    """What Chromium laid out for each chart of `page` (a copy with the probe is what it loads)."""
    probed = tmp_path / f"probed-{page.parent.name}-{page.name}"
    probed.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--window-size=1280,2000", f"--user-data-dir={profile}", "--dump-dom", probed.as_uri()],
            capture_output=True, text=True, timeout=90, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', done.stdout, re.S)
    assert found, "the probe did not run: " + done.stdout[-500:]
    return json.loads(html.unescape(found.group(1)))


def chart(charts: list[dict], name: str) -> dict:
    matching = [c for c in charts if c["cls"].split() == ["chart", name]]
    assert matching, f"no {name} chart rendered; got {[c['cls'] for c in charts]}"
    return matching[0]


def texts(drawn: dict) -> list[str]:
    return [t["text"] for t in drawn["texts"]]


def inside(inner: dict, outer: dict, slack: float = 1.0) -> bool:
    return (inner["x"] >= outer["x"] - slack and inner["y"] >= outer["y"] - slack
            and inner["x"] + inner["w"] <= outer["x"] + outer["w"] + slack
            and inner["y"] + inner["h"] <= outer["y"] + outer["h"] + slack)


def overlap(a: dict, b: dict, slack: float = 0.5) -> bool:
    return (a["x"] + slack < b["x"] + b["w"] and b["x"] + slack < a["x"] + a["w"]
            and a["y"] + slack < b["y"] + b["h"] and b["y"] + slack < a["y"] + a["h"])


def check_readable(drawn: dict, labels: list[str], legend: list[str]) -> None:
    """A chart of a size that reads on a laptop, every text drawn within it (nothing clipped), the axis labels and
    the legend entries present and laid out with a size."""
    assert drawn["w"] >= 500 and drawn["h"] >= 250, f"{drawn['cls']} is {drawn['w']}x{drawn['h']} px"
    for text in drawn["texts"]:
        if text["text"].strip():
            assert text["w"] > 0 and text["h"] >= 11, f"{text['text']!r} is not laid out readably: {text}"
            assert inside(text, drawn), f"{text['text']!r} is clipped by the chart's edge: {text} in {drawn}"
    shown = texts(drawn)
    for label in labels:
        assert any(t.startswith(label) for t in shown), f"{drawn['cls']}: no text {label!r} in {shown}"
    assert drawn["legends"] and all(g["w"] > 0 and g["h"] > 0 for g in drawn["legends"]), f"{drawn['cls']}: no legend"
    legend_text = " ".join(g["text"] for g in drawn["legends"])
    for entry in legend:
        assert entry in legend_text, f"{drawn['cls']}: legend lacks {entry!r}: {legend_text!r}"


def check_percentiles(drawn: dict) -> None:
    marks = [t for t in drawn["texts"] if t["text"] in ("p50", "p95", "p99")]
    assert sorted(t["text"] for t in marks) == ["p50", "p95", "p99"], "each percentile marker is named"
    for i, a in enumerate(marks):
        assert a["w"] > 10, f"{a['text']} is cut: {a}"
        for b in marks[i + 1:]:
            assert not overlap(a, b), f"{a['text']} and {b['text']} overlap: {a} {b}"


def test_decision_gate_report_renders_with_axes_and_legends(tmp_path):
    from tests.unit.test_report import predictions

    chromium()
    report, out = build(tmp_path, champion_preds=predictions(seed=1, concentration=(1, 1, 1)), extra=release_extra())
    drawn = laid_out(Path(out["report_html"]), tmp_path)
    assert sorted(c["cls"] for c in drawn) == ["chart champion", "chart latency", "chart latency-ratio",
                                               "chart reliability"]
    check_readable(chart(drawn, "latency-ratio"), ["candidate p95 ÷ champion p95 (dimensionless)", "p95 latency (ms"],
                   ["1 = as fast as the champion"])
    check_readable(chart(drawn, "reliability"), ["accuracy", "confidence", "rows"],
                   ["perfectly calibrated", "candidate (", "champion ("])
    latency = chart(drawn, "latency")
    check_readable(latency, ["client latency per request (ms)", "requests"],
                   ["p50 = ", "p95 = ", "p99 = ", " requests"])
    check_percentiles(latency)
    check_readable(chart(drawn, "champion"), ["candidate − champion", "accuracy", "ECE"], ["threshold"])


def test_nli_gate_report_renders_the_confusion_matrices_and_per_request_latency(nli_report, tmp_path):  # noqa: F811
    _, _, folder = nli_report
    drawn = laid_out(folder / "report.html", tmp_path)
    confusion = [c for c in drawn if c["cls"] == "chart confusion"]
    assert len(confusion) == 2, "the candidate's and the champion's"
    for matrix in confusion:
        assert matrix["w"] >= 400 and matrix["h"] >= 300
        assert {"true label", "predicted label", "entailment", "neutral", "contradiction"} <= set(texts(matrix))
        assert all(inside(t, matrix) for t in matrix["texts"] if t["text"].strip())
    latency = chart(drawn, "latency")
    check_readable(latency, ["client latency per request (ms)", "requests"], ["11 requests", "p95 = "])
    check_percentiles(latency)
    check_readable(chart(drawn, "reliability"), ["accuracy", "confidence"], ["candidate (", "champion ("])
    check_readable(chart(drawn, "champion"), ["macro-F1", "recall: neutral"], [])


MODEL = "demo-decision"


@pytest.fixture
def audit_page(tmp_path, monkeypatch):
    """A ledger written by hand: A promoted at once, B rolled out as a canary over A (two steps 20 s apart), C
    rejected by its gate against B, then a rollback from B to A; times from a fixed clock over three hours."""
    import shiplift.tasks.ledger.timestamps as timestamps
    from shiplift.tasks.ledger.audit_report import write_report
    from shiplift.tasks.ledger.store import Ledger

    clock = {"now": datetime(2026, 12, 3, 9, 0, tzinfo=UTC)}
    monkeypatch.setattr(timestamps, "utcnow", lambda: clock["now"])
    ledger = Ledger.for_sqlite(tmp_path / "ledger.db")
    cost = release_extra()["release"]["cost"]
    checks_ok = [{"name": "accuracy", "status": "pass", "observed": 0.8, "threshold": 0.3, "comparator": ">=",
                  "ci": [0.72, 0.87], "n": 111, "reason": "ok", "rule": "bound"}]
    champion = lambda status, diff: {"name": "champion_accuracy", "status": status, "observed": diff,  # noqa: E731
                                     "threshold": -0.02, "comparator": "paired ci_low >= threshold",
                                     "ci": [diff - 0.04, diff + 0.04], "n": 111, "reason": "paired", "rule": "paired"}

    def add(minutes: float, release: str, stage: str, event: str, payload: dict) -> None:
        clock["now"] = datetime(2026, 12, 3, 9, 0, tzinfo=UTC) + timedelta(minutes=minutes)
        ledger.append(release_id=release, model=MODEL, stage=stage, event=event, payload=payload, actor="tester")

    def release(start: float, rid: str, gate: dict) -> None:
        add(start, rid, "release", "opened", {"config": {"name": MODEL}, "config_hash": "c" * 64})
        add(start + 15, rid, "validate", "succeeded", {"datasets": [], "thresholds": {"min_accuracy": 0.3},
                                                        "metrics": {"accuracy": 0.8}, "cost": cost, **gate})

    release(0, "demo-a", {"decision": "pass", "checks": checks_ok, "not_passed": []})
    add(20, "demo-a", "promote", "succeeded",
        {"strategy": "all_at_once", "endpoint": "e", "component": "c", "copies": 2})
    add(21, "demo-a", "release", "promoted", {})
    release(60, "demo-b", {"decision": "pass", "checks": [*checks_ok, champion("pass", 0.01)], "not_passed": [],
                           "champion_release": "demo-a"})
    for minutes, old, new in ((80, 1, 1), (80 + 1 / 3, 0, 2)):
        add(minutes, "demo-b", "traffic", "step", {"phase": "rollout", "batch": 2 - old, "batches": 2,
                                                   "old_copies": old, "new_copies": new})
    add(81, "demo-b", "promote", "succeeded", {"strategy": "canary", "endpoint": "e", "component": "c", "copies": 2})
    add(82, "demo-b", "release", "promoted", {})
    release(120, "demo-c", {"decision": "fail", "checks": [*checks_ok, champion("fail", -0.12)],
                            "not_passed": ["champion_accuracy -0.12"], "champion_release": "demo-b"})
    add(140, "demo-c", "release", "rejected", {})
    add(170, "demo-a", "promote", "succeeded", {"trigger": "rollback", "rollback_from": "demo-b", "copies": 2,
                                                "rollback_reason": "slower in production", "endpoint": "e",
                                                "component": "c"})
    verification = {"ok": True, "n_records": len(ledger.history()), "head_hash": ledger.head().record_hash,
                    "problems": [], "checked_against": None}
    page = write_report(ledger, tmp_path / "audit", verification)
    ledger.close()
    return page


def test_audit_report_renders_timeline_copies_and_champion_charts(audit_page, tmp_path):
    chromium()
    drawn = laid_out(audit_page, tmp_path)
    timeline = chart(drawn, "timeline")
    check_readable(timeline,
                   ["time (UTC, 2026-12-03)", "event", "gate", "traffic step", "promoted", "rollback (by hand)"],
                   ["demo-a", "demo-b", "demo-c", "gate that did not pass"])
    markers = timeline["events"]
    kinds = sorted(m["cls"] for m in markers)
    assert kinds == sorted(["event event-gate"] * 3 + ["event event-traffic"] * 2 + ["event event-promoted"] * 2
                           + ["event event-rollback"])
    for i, a in enumerate(markers):
        assert a["w"] > 0 and a["h"] > 0
        for b in markers[i + 1:]:
            assert not overlap(a, b), f"markers overlap: {a} {b}"
    copies = [c for c in drawn if c["cls"] == "chart copies"]
    assert len(copies) == 2, "the model's whole history, and B's rollout zoomed in"
    check_readable(copies[0], ["copies serving", "time (UTC, 2026-12-03)"], ["demo-a", "demo-b", "all copies"])
    check_readable(copies[1], ["copies serving", "rollout of demo-b"], ["demo-a", "demo-b"])
    champions = [c for c in drawn if c["cls"] == "chart champion"]
    assert len(champions) == 2, "B and C were compared with a champion"
    for drawn_champion in champions:
        check_readable(drawn_champion, ["candidate − champion", "champion_accuracy"], ["threshold"])
    page = audit_page.read_text()
    assert "4.66" in page and "no price for ml.p5.48xlarge" in page, "the gate's cost is shown, a missing price says so"
