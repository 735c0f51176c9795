"""Reports: gate-report.json round-trips, report.html is self-contained, well formed and escaped."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from tasks.errors import BadInput
from tasks.hashing import sha256_file
from validation.gates import ChampionRule, DecisionThresholds, evaluate_gates
from validation.report import write_reports

OPTIONS = ["a", "b", "c"]
HOSTILE = '<script>alert("x")</script>&"\'<img src=x onerror=alert(1)>'
VOID = {"meta", "br", "img", "hr", "input", "link"}  # HTML void elements; SVG shapes must self-close


class StrictParser(HTMLParser):
    """Tracks open tags and fails on any mismatch; collects tags, attributes and text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def row(ident, probs, expected="a", *, error=None, latency=100.0, started=0.0, retries=0):
    return {
        "id": ident, "dataset": "unit", "expected": expected, "option_ids": OPTIONS, "probabilities": probs,
        "option_logits": None, "allowed_token_mass": 0.9, "temperature": 1.0, "latency_ms": latency,
        "server_forward_ms": None, "server_total_ms": None, "attempts": 1 + retries, "retries_503": retries,
        "error": error, "started_at": started,
    }


def predictions(n=40, seed=0):
    rng = np.random.default_rng(seed)
    rows = [
        row(f"t{i:03d}", rng.dirichlet([2, 1, 1]).tolist(), "a", latency=float(rng.gamma(4, 30)), started=float(i))
        for i in range(n)
    ]
    rows.append(row(HOSTILE, [0.2, 0.7, 0.1], "a", started=float(n), retries=2))
    rows.append(row("broken", None, "b", error="HTTP 500: <b>oops</b>", started=float(n + 1)))
    return rows


def build(tmp_path: Path, *, champion=True, extra=None):
    preds = predictions()
    report = evaluate_gates(
        preds,
        thresholds=DecisionThresholds(min_accuracy=0.3, max_ece=0.5, max_p95_latency_ms=1e4),
        champion_preds=preds if champion else None,
        champion_rule=ChampionRule(n_bootstrap=200) if champion else None,
    ).to_dict()
    out = write_reports(
        tmp_path / "run", gate_report=report, predictions=preds, title=f"Release {HOSTILE}", extra=extra
    )
    return report, out


def parse(path: str) -> tuple[StrictParser, str]:
    text = Path(path).read_text(encoding="utf-8")
    parser = StrictParser()
    parser.feed(text)
    parser.close()
    assert parser.stack == [], f"unclosed tags {parser.stack}"
    return parser, text


def test_writes_json_and_html_with_hashes(tmp_path):
    dataset = {"dataset": {"path": "data/easy.jsonl", "sha256": "ab" * 32, "n": 42}}
    report, out = build(tmp_path, extra=dataset)
    saved = json.loads(Path(out["gate_report_json"]).read_text())
    assert saved["decision"] == report["decision"] and saved["checks"] == report["checks"]
    assert saved["thresholds"]["max_ece"] == 0.5 and saved["extra"] == dataset
    assert out["gate_report_sha256"] == sha256_file(out["gate_report_json"])
    assert out["report_html_sha256"] == sha256_file(out["report_html"])
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gate-report.json", "report.html"]


def test_html_is_well_formed_self_contained_and_complete(tmp_path):
    report, out = build(tmp_path)
    parser, text = parse(out["report_html"])
    assert parser.tags.count("svg") == 2
    assert "script" not in parser.tags and "iframe" not in parser.tags
    assert not any(name.startswith("on") for name, _ in parser.attrs)  # no event handlers
    srcs = [value for name, value in parser.attrs if name in ("src", "href")]
    assert srcs == ["predictions.jsonl", "gate-report.json"]
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text
    joined = " ".join(parser.text)
    assert f"Decision: {report['decision']}" in " ".join(joined.split())
    for name in ("accuracy", "ece", "validity", "p95_latency_ms", "champion_accuracy"):
        assert name in joined
    assert "reliability diagram" in text and "latency histogram" in text
    # every check row is coloured by its status
    assert text.count('<tr class="pass">') >= sum(c["status"] == "pass" for c in report["checks"])
    assert "candidate − champion" in joined and "paired 95% CI" in joined


def test_hostile_strings_are_escaped(tmp_path):
    _, out = build(tmp_path)
    parser, text = parse(out["report_html"])
    assert "<script" not in text and "<img" not in text and "<b>oops" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&quot;&#x27;&lt;img" in text
    assert HOSTILE in parser.text  # the id survives as text, intact
    assert "HTTP 500: <b>oops</b>" in parser.text
    assert parser.text.count(f"Release {HOSTILE}") == 2  # <title> and <h1>


def test_reliability_bars_match_counts_and_no_champion_section(tmp_path):
    report, out = build(tmp_path, champion=False)
    parser, text = parse(out["report_html"])
    non_empty = sum(1 for b in report["metrics"]["reliability"] if b["count"])
    assert text.count('class="acc"') == non_empty and text.count('class="count"') == 10
    assert text.count('class="bar"') == 20
    assert "skipped: no champion" in " ".join(parser.text)


def test_rewrite_replaces_atomically_and_bad_reports_write_nothing(tmp_path):
    _, first = build(tmp_path)
    _, second = build(tmp_path, extra={"run": 2})
    assert json.loads(Path(second["gate_report_json"]).read_text())["extra"] == {"run": 2}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gate-report.json", "report.html"]
    with pytest.raises(BadInput, match="JSON"):
        write_reports(tmp_path / "bad", gate_report={"decision": "pass"}, predictions=predictions(),
                      title="t", extra={"x": float("nan")})
    assert not (tmp_path / "bad").exists()
    with pytest.raises(BadInput, match="extra"):
        write_reports(tmp_path / "bad", gate_report={"decision": "pass", "extra": 1}, predictions=predictions(),
                      title="t")
