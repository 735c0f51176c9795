"""Reports: gate-report.json round-trips; report.html is self-contained, well formed and escaped, sets the candidate
beside the champion on every gated metric of its family with the rule each check used, names the failing checks,
says when a run is not a gate, shows the release (temperature, config changes, cost); charts are deterministic SVG.
The audit report's copies-serving series are checked against hand-written ledger records."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from shiplift.tasks.backends.pricing import PriceTable, candidate_cost, hourly_cost, mig_copy_share, throughput_cost
from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import sha256_file
from shiplift.validation import charts
from shiplift.validation.decisions.evaluate import DECISION_REPORT
from shiplift.validation.gate_report import write_reports
from shiplift.validation.gates import NOT_GATED, ChampionRule, DecisionThresholds, evaluate_gates
from shiplift.validation.report_parts import ReportParts

OPTIONS = ["a", "b", "c"]
HOSTILE = '<script>alert("x")</script>&"\'<img src=x onerror=alert(1)>'
VOID = {"meta", "br", "img", "hr", "input", "link"}  # HTML void elements; SVG shapes must self-close
THRESHOLDS = DecisionThresholds(min_accuracy=0.3, max_ece=0.5, max_p95_latency_ms=1e4)


class StrictParser(HTMLParser):
    """Tracks open tags and fails on any mismatch; collects tags, attributes, text, and every table's rows by class."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self.row_classes: dict[str, list[str | None]] = {}
        self.svg_classes: list[str] = []
        self.by_id: dict[str, str] = {}  # id -> text of the element (for the banner)
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._id_stack: list[tuple[str, str, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)
        values = dict(attrs)
        if tag == "table":
            self._table = values.get("class") or ""
            self.tables.setdefault(self._table, [])
            self.row_classes.setdefault(self._table, [])
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
            self.row_classes[self._table].append(values.get("class"))
        elif tag in ("td", "th") and self._table is not None:
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")
        if tag == "svg":
            self.svg_classes.append(values.get("class") or "")
        if values.get("id") in ("summary", "decision"):
            self._id_stack.append((tag, values["id"], []))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.extend(attrs)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes {self.stack[-1:]}"
        self.stack.pop()
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            rows = self.tables[self._table]
            if tag == "td":
                rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._table = None
        if self._id_stack and self._id_stack[-1][0] == tag and tag not in ("b", "small"):
            _, ident, parts = self._id_stack.pop()
            self.by_id[ident] = " ".join("".join(parts).split())

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)
        for _, _, parts in self._id_stack:
            parts.append(data)


def row(ident, probs, expected="a", *, error=None, latency=100.0, started=0.0, retries=0, mass=0.9):
    return {
        "id": ident, "dataset": "unit", "expected": expected, "option_ids": OPTIONS, "probabilities": probs,
        "option_logits": None, "allowed_token_mass": mass, "temperature": 1.0, "latency_ms": latency,
        "server_forward_ms": None, "server_total_ms": None, "attempts": 1 + retries, "retries_503": retries,
        "error": error, "started_at": started,
    }


def predictions(n=40, seed=0, *, concentration=(2, 1, 1), hostile=True):
    rng = np.random.default_rng(seed)
    rows = [
        row(f"t{i:03d}", rng.dirichlet(concentration).tolist(), "a", latency=float(rng.gamma(4, 30)), started=float(i))
        for i in range(n)
    ]
    if hostile:
        rows.append(row(HOSTILE, [0.2, 0.7, 0.1], "a", started=float(n), retries=2))
        rows.append(row("broken", None, "b", error="HTTP 500: <b>oops</b>", started=float(n + 1)))
    return rows


def build(tmp_path: Path, *, champion=True, extra=None, thresholds=THRESHOLDS, decision_rule="bound",
          champion_preds=None, rule=None, name="run"):
    preds = predictions()
    report = evaluate_gates(
        preds,
        thresholds=thresholds,
        champion_preds=(champion_preds or preds) if champion else None,
        champion_rule=(rule or ChampionRule(n_bootstrap=200)) if champion else None,
        decision_rule=decision_rule,
    ).to_dict()
    out = write_reports(
        tmp_path / name, gate_report=report, predictions=preds, title=f"Release {HOSTILE}", parts=DECISION_REPORT,
        extra=extra,
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
    assert parser.svg_classes == ["chart champion", "chart latency-ratio", "chart reliability", "chart latency"]
    assert "script" not in parser.tags and "iframe" not in parser.tags
    assert not any(name.startswith("on") for name, _ in parser.attrs)  # no event handlers
    srcs = [value for name, value in parser.attrs if name in ("src", "href")]
    assert [s for s in srcs if not s.startswith("#")] == ["predictions.jsonl", "gate-report.json"]
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text
    ids = [value for name, value in parser.attrs if name == "id"]
    assert len(ids) == len(set(ids)), "the charts' ids are scoped: none is repeated on the page"
    referenced = set(re.findall(r'href="#([^"]+)"', text)) | set(re.findall(r"url\(#([^)]+)\)", text))
    assert referenced and referenced <= set(ids), "every reference inside a chart points at an element of the page"
    joined = " ".join(parser.text)
    assert f"Decision: {report['decision']}" in " ".join(joined.split())
    for name in ("accuracy", "ece", "validity", "p95_latency_ms", "champion_accuracy"):
        assert name in joined
    # every check row is coloured by its status
    assert parser.row_classes["checks"][1:] == [c["status"] for c in report["checks"]]
    assert "candidate − champion" in joined and "judged by (rule → status)" in joined


def test_hostile_strings_are_escaped(tmp_path):
    _, out = build(tmp_path)
    parser, text = parse(out["report_html"])
    assert "<script" not in text and "<img" not in text and "<b>oops" not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&quot;&#x27;&lt;img" in text
    assert HOSTILE in parser.text  # the id survives as text, intact
    assert "HTTP 500: <b>oops</b>" in parser.text
    assert parser.text.count(f"Release {HOSTILE}") == 2  # <title> and <h1>


def table(parser: StrictParser, name: str) -> dict[str, list[str]]:
    """A table's body rows keyed by their first cell."""
    return {cells[0]: cells for cells in parser.tables[name] if cells}


def test_decision_champion_rows_side_by_side_with_paired_intervals_and_rules(tmp_path):
    champion = predictions(seed=1, concentration=(1, 1, 1))
    rule = ChampionRule(n_bootstrap=200, margin=0.05, also_ece_margin=0.1, min_samples=10)
    report, out = build(tmp_path, champion_preds=champion, rule=rule)
    parser, _ = parse(out["report_html"])
    rows = table(parser, "champion")
    comparison = {r["metric"]: r for r in report["champion"]["comparison"]}
    assert list(rows) == ["accuracy", "ECE (10 bins)", "validity", "allowed-token mass",
                          "p95 latency (ms, per request)"], "the decision family's metrics, in the gate's order"
    assert not any(name.startswith(("macro-F1", "recall")) for name in rows), "NLI rows do not apply to decisions"
    accuracy = comparison["accuracy"]
    cells = rows["accuracy"]
    assert cells[1] == f"{accuracy['candidate']['value']:.4g} [{accuracy['candidate']['ci'][0]:.4g}, " \
                       f"{accuracy['candidate']['ci'][1]:.4g}]"
    assert cells[2].startswith(f"{accuracy['champion']['value']:.4g} [")
    low, high = accuracy["difference_ci"]
    assert cells[3] == f"{accuracy['difference']:.4g} paired [{low:.4g}, {high:.4g}]"
    assert cells[4] == str(accuracy["n_shared"])
    checks = {c["name"]: c for c in report["checks"]}
    assert cells[6] == (f"accuracy: interval bound: low end of the interval >= 0.3 → {checks['accuracy']['status']} "
                        f"champion_accuracy: paired interval: low end of candidate − champion >= -0.05 → "
                        f"{checks['champion_accuracy']['status']}")
    assert "champion_ece: paired interval: high end of candidate − champion <= 0.1" in rows["ECE (10 bins)"][6]
    assert rows["allowed-token mass"][6] == "shown, not gated", "no check reads it: shown, not judged"
    p95 = next(r for r in report["champion"]["comparison"] if r["metric"] == "p95_latency_ms")
    (low, high), (ratio_low, ratio_high) = p95["difference_ci"], p95["ratio_ci"]
    assert rows["p95 latency (ms, per request)"][3] == (f"{p95['difference']:.4g} ms paired [{low:.4g}, {high:.4g}] "
                                                        f"ratio {p95['ratio']:.4g} paired [{ratio_low:.4g}, "
                                                        f"{ratio_high:.4g}]")
    worst = {"fail": 0, "inconclusive": 1, "pass": 2}
    expected_class = min((checks[n]["status"] for n in accuracy["gated_by"]), key=worst.get)
    assert parser.row_classes["champion"][1] == expected_class
    assert "chart champion" in parser.svg_classes


def test_rule_per_check_point_or_bound_and_the_failing_summary_names_the_check(tmp_path):
    preds = predictions()
    latency = evaluate_gates(preds, thresholds=THRESHOLDS, n_bootstrap=200)
    p95 = latency.metrics["latency_ms"]["p95"]
    between = (p95["value"] + p95["ci"][1]) / 2  # the point estimate clears it, the interval's high end does not
    strict = DecisionThresholds(min_accuracy=0.3, max_ece=0.5, min_validity=None, max_p95_latency_ms=between)
    bound, out_bound = build(tmp_path, champion=False, thresholds=strict, decision_rule="bound", name="bound")
    point, out_point = build(tmp_path, champion=False, thresholds=strict, decision_rule="point", name="point")
    parser_b, _ = parse(out_bound["report_html"])
    parser_p, _ = parse(out_point["report_html"])
    rows_b, rows_p = table(parser_b, "checks"), table(parser_p, "checks")
    check_b = next(c for c in bound["checks"] if c["name"] == "p95_latency_ms")
    assert rows_b["p95_latency_ms"][1:3] == ["fail", f"interval bound: high end of the interval <= {between:.4g}"]
    assert rows_b["p95_latency_ms"][5] == f"{check_b['ci'][1]:.4g}", "the value judged is the interval's high end"
    assert rows_p["p95_latency_ms"][1:3] == ["pass", f"point estimate <= {between:.4g}"]
    assert rows_p["p95_latency_ms"][5] == f"{check_b['observed']:.4g}", "the value judged is the point estimate"
    assert rows_b["accuracy"][2] == "interval bound: low end of the interval >= 0.3"
    assert rows_b["champion_accuracy"][1:3] == ["skipped", "–"]
    assert bound["decision"] == "fail" and point["decision"] == "pass"
    summary = parser_b.by_id["summary"]
    assert summary.startswith("fail: p95_latency_ms") and "needs <=" in summary and "bound" in summary
    assert "accuracy" not in summary and "ece" not in summary, "only the checks that did not pass are named"
    assert parser_p.by_id["summary"] == "pass"
    assert "interval bound" in " ".join(parser_b.text) and "validation.decision_rule" in " ".join(parser_b.text)


def test_failing_allowed_token_mass_is_named_and_a_run_without_thresholds_is_not_a_gate(tmp_path):
    mass = DecisionThresholds(min_accuracy=0.3, max_ece=0.5, min_validity=None, min_allowed_token_mass=0.95)
    failed, out = build(tmp_path, champion=False, thresholds=mass, name="mass")
    parser, text = parse(out["report_html"])
    assert failed["decision"] == "fail"
    summary = parser.by_id["summary"]
    assert summary.startswith("fail: allowed_token_mass 0.9 (needs >= 0.95") and 'class="banner fail"' in text
    assert NOT_GATED not in text
    adhoc, out = build(tmp_path, champion=False, thresholds=None, name="adhoc")
    parser, text = parse(out["report_html"])
    assert adhoc["decision"] == "not_gated" and parser.by_id["decision"] == "not_gated"
    assert parser.by_id["summary"].startswith(f"{NOT_GATED}: this run measured the model")
    assert 'class="banner not-gated"' in text
    assert "skipped: no champion" in " ".join(parser.text)
    assert "ad-hoc evaluation" in " ".join(parser.text), "no release context: said so"


PRICES = PriceTable.model_validate({
    "version": 1, "offer": "sagemaker-real-time-on-demand", "currency": "USD", "unit": "instance-hour",
    "prices": {"us-east-1": {"ml.g6e.xlarge": {"usd_per_hour": 2.33, "source": "https://example.invalid/price",
                                               "as_of": "2026-12-01", "provenance": "pricing-page"}}},
})


def release_extra() -> dict:
    """What a pipeline hands the report (validation.evaluate.RELEASE_CONTEXT), cost from the pricing functions."""
    production = hourly_cost(PRICES, "us-east-1", "ml.g6e.xlarge", 2)
    return {"release": {
        "release_id": "gemma-20261203T100000Z", "champion_release": "gemma-20261202T090000Z",
        "config_changes": [{"field": "calibration.fit_temperature", "champion": False, "candidate": True},
                           {"field": "artifact.quantization", "champion": "Q8_0", "candidate": "Q4_K_M"}],
        "temperature": {"value": 1.7312, "fitted": True},
        "cost": {"region": "us-east-1", "nominal": True, "table": "configs/prices/test.yaml",
                 "production": production.as_dict(),
                 "candidate": candidate_cost(PRICES, "us-east-1", "ml.g6e.xlarge", "2026-12-03T10:00:00+00:00",
                                             "2026-12-03T10:30:00+00:00").as_dict(),
                 "per_million": throughput_cost(production, 12.5, 1).as_dict(),
                 "mig_copy": mig_copy_share(PRICES, "us-east-1", "ml.p5.48xlarge", "mig-1g.10gb", 7).as_dict()},
    }}


def test_release_section_shows_temperature_every_changed_field_and_cost(tmp_path):
    _, out = build(tmp_path, extra=release_extra())
    parser, text = parse(out["report_html"])
    facts = table(parser, "release")
    assert facts["temperature served"][1] == "1.731 (fitted by NLL on the calibration split)"
    assert facts["champion release"][1] == "gemma-20261202T090000Z"
    changes = table(parser, "changes")
    assert changes == {"calibration.fit_temperature": ["calibration.fit_temperature", "false", "true"],
                       "artifact.quantization": ["artifact.quantization", '"Q8_0"', '"Q4_K_M"']}
    cost = table(parser, "cost")
    assert cost["production per hour"][1].startswith("production ≈ 4.66 $/h (2 × ml.g6e.xlarge at 2.33 $/h")
    assert cost["candidate (deploy to now)"][1].startswith("candidate ≈ 1.17 $ (1 × ml.g6e.xlarge at 2.33 $/h for "
                                                           "30.0 min")
    per_million = 4.66 / (3600 * 12.5) * 1e6  # 103.56 $ by hand
    assert cost["per million requests and decisions"][1].startswith(f"≈ {per_million:.2f} $ per million requests and "
                                                                    "decisions")
    assert "no price for ml.p5.48xlarge in us-east-1" in cost["a MIG copy's share of its instance"][1]
    assert text.count('class="no-price"') == 1, "only the missing price is set apart"
    assert "costs nothing here" in cost["priced as"][1]
    assert json.loads(Path(out["gate_report_json"]).read_text())["extra"]["release"]["temperature"]["value"] == 1.7312


def test_reliability_overlays_the_champion_and_latency_uses_the_percentiles_population(tmp_path):
    report, out = build(tmp_path, champion_preds=predictions(seed=2, concentration=(3, 1, 1)))
    _, text = parse(out["report_html"])
    reliability = re.search(r'<svg class="chart reliability".*?</svg>', text, re.S).group(0)
    valid = report["metrics"]["n_valid"]
    for label in (f"candidate ({valid} valid rows)", f"champion ({report['champion']['n_valid']} valid rows)",
                  "perfectly calibrated", ">accuracy<", "confidence (mean of the bin"):
        assert label in reliability
    latency = re.search(r'<svg class="chart latency".*?</svg>', text, re.S).group(0)
    summary = report["metrics"]["latency_ms"]
    assert f">{summary['n']} requests<" in latency, "the histogram counts the requests the percentiles were read on"
    for q in ("p50", "p95", "p99"):
        assert f">{q} = {summary[q]['value']:,.1f} ms<" in latency and f">{q}<" in latency
    assert ">client latency per request (ms)<" in latency and ">requests<" in latency
    _, alone = build(tmp_path, champion=False, name="alone")
    alone_text = Path(alone["report_html"]).read_text()
    assert "champion (" not in re.search(r'<svg class="chart reliability".*?</svg>', alone_text, re.S).group(0)


def test_reports_and_charts_are_deterministic(tmp_path):
    _, first = build(tmp_path, extra=release_extra(), name="one")
    _, second = build(tmp_path, extra=release_extra(), name="two")
    assert first["report_html_sha256"] == second["report_html_sha256"]
    bins = [{"lower": b / 10, "upper": (b + 1) / 10, "count": b, "mean_confidence": b / 10 + 0.05,
             "accuracy": min(1.0, b / 9)} for b in range(10)]
    renders = [charts.reliability(bins, bins[::-1]), charts.latency_histogram([5.0, 7.5, 9.0], {"p50": 7.5}),
               charts.confusion_matrix(["x", "y"], ["x", "y"], [[3, 1], [0, 4]]),
               charts.champion_check([{"name": "accuracy", "difference": 0.01, "ci": [-0.02, 0.04], "threshold": -0.02,
                                       "status": "pass"}], key="r")]
    again = [charts.reliability(bins, bins[::-1]), charts.latency_histogram([5.0, 7.5, 9.0], {"p50": 7.5}),
             charts.confusion_matrix(["x", "y"], ["x", "y"], [[3, 1], [0, 4]]),
             charts.champion_check([{"name": "accuracy", "difference": 0.01, "ci": [-0.02, 0.04], "threshold": -0.02,
                                     "status": "pass"}], key="r")]
    assert [hashlib.sha256(s.encode()).hexdigest() for s in renders] == \
           [hashlib.sha256(s.encode()).hexdigest() for s in again]
    for svg in renders:
        assert svg.startswith('<svg class="chart ') and "<metadata" not in svg and "<?xml" not in svg
        assert "xlink" not in svg and "Date" not in svg
    other = charts.champion_check([{"name": "accuracy", "difference": 0.01, "ci": [-0.02, 0.04], "threshold": -0.02,
                                    "status": "pass"}], key="another release")
    assert set(re.findall(r'id="([^"]+)"', other)).isdisjoint(re.findall(r'id="([^"]+)"', renders[3])), \
        "two charts of one kind on a page get different ids"
    assert charts.champion_check([{"name": "accuracy", "difference": None, "ci": None}]) == ""


def test_rewrite_replaces_atomically_and_bad_reports_write_nothing(tmp_path):
    _, first = build(tmp_path)
    _, second = build(tmp_path, extra={"run": 2})
    assert json.loads(Path(second["gate_report_json"]).read_text())["extra"] == {"run": 2}
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["gate-report.json", "report.html"]
    with pytest.raises(BadInput, match="JSON"):
        write_reports(tmp_path / "bad", gate_report={"decision": "pass"}, predictions=predictions(),
                      title="t", parts=DECISION_REPORT, extra={"x": float("nan")})
    assert not (tmp_path / "bad").exists()
    with pytest.raises(BadInput, match="extra"):
        write_reports(tmp_path / "bad", gate_report={"decision": "pass", "extra": 1}, predictions=predictions(),
                      title="t", parts=DECISION_REPORT)


def test_the_report_takes_a_familys_words_rows_and_sections_from_its_parts(tmp_path):
    """The report knows no family: a family it has never seen names its items, headline metrics, own rows and
    confusion matrices through ReportParts."""
    preds = predictions(hostile=False)
    report = evaluate_gates(preds, thresholds=None, champion_preds=None, champion_rule=None).to_dict()
    report["metrics"]["toy"] = {"agreement": {"value": 0.5, "ci": [0.4, 0.6], "n": 40}}
    confusion = {"true": ["a", "b"], "predicted": ["a", "b"], "counts": [[3, 1], [0, 4]]}
    parts = ReportParts(
        item="sample", items="samples", estimates=("accuracy",), labels={"toy_agreement": "toy agreement"},
        family_rows=lambda metrics: [("toy_agreement", metrics["toy"]["agreement"])],
        confusions=lambda report: [("candidate", confusion)],
    )
    out = write_reports(tmp_path / "toy", gate_report=report, predictions=preds, title="toy", parts=parts)
    parser, text = parse(out["report_html"])
    summary = table(parser, "summary")
    assert summary["samples"][1] == "40" and "accuracy" in summary and "ECE (10 bins)" not in summary
    assert summary["toy agreement"][1].startswith("0.5")
    assert "latency p95 (ms, per request (one sample))" in summary
    assert "<h2>Per sample (40)</h2>" in text and "<h2>Confusion matrix</h2>" in text
    assert "one sample a request" in text and "per-sample share" not in text


# ----------------------------------------------------------------------------------------------------------------------
# NLI: the family's own rows, per-request latency, the confusion matrix


@pytest.fixture
def nli_report(tmp_path):
    from shiplift.validation.evaluate import RunSettings, Target
    from shiplift.validation.nli.builtin_set import DEFAULT_OUT
    from shiplift.validation.nli.evaluate import NliThresholds, evaluate_nli, load_nli_dataset
    from shiplift.validation.nli.pairs import LABELS
    from tests.unit.test_nli_runner import FakeEncoder, key

    split = load_nli_dataset(DEFAULT_OUT, name="nli-test", splits=["test"])
    candidate, champion = FakeEncoder(), FakeEncoder()
    try:
        for fake, every in ((candidate, 5), (champion, 3)):
            for i, pair in enumerate(split.pairs):
                fake.answers[key(pair)] = pair.label if i % every else LABELS[(LABELS.index(pair.label) + 1) % 3]
        thresholds = NliThresholds(min_accuracy=0.5, min_macro_f1=0.5, min_class_recall=0.4, max_ece=0.5,
                                   max_p95_latency_ms=60_000)
        result = evaluate_nli(Target.http(candidate.url, label="new"), [split], tmp_path / "nli", thresholds=thresholds,
                              champion_rule=ChampionRule(margin=0.05, min_samples=30, n_bootstrap=200),
                              champion=Target.http(champion.url, label="old"),
                              settings=RunSettings(concurrency=2, timeout_s=10, deadline_s=60, n_bootstrap=200, seed=3))
    finally:
        candidate.close()
        champion.close()
    return result, split, tmp_path / "nli"


def test_nli_report_has_its_family_rows_per_request_latency_and_the_confusion_matrix(nli_report):
    from sklearn.metrics import confusion_matrix

    from shiplift.validation.nli.pairs import LABELS
    from shiplift.validation.runner import read_predictions

    result, split, folder = nli_report
    parser, text = parse(str(folder / "report.html"))
    rows = table(parser, "champion")
    assert {"macro-F1", "recall: entailment", "recall: neutral", "recall: contradiction", "accuracy", "ECE (10 bins)",
            "validity", "p95 latency (ms, per request)"} == set(rows)
    assert "allowed-token mass" not in rows and "allowed-token mass" not in table(parser, "summary"), \
        "an encoder has no allowed-token mass: the row is left out"
    checks = {c["name"]: c for c in result["checks"]}
    assert rows["recall: neutral"][6] == f"recall_neutral: interval bound: low end of the interval >= 0.4 → " \
                                         f"{checks['recall_neutral']['status']}"
    # latency per request: 90 pairs in batches of 8 are 12 requests, the first reported apart
    latency = result["metrics"]["latency_ms"]
    requests = json.loads((folder / "gate-report.json").read_text())["extra"]["requests"]
    assert [r["pairs"] for r in requests] == [8] * 11 + [2]
    assert latency["counted_per"] == "request" and latency["n_successful"] == 12 and latency["n"] == 11
    steady = sorted(r["latency_ms"] for r in sorted(requests, key=lambda r: r["started_at"])[1:])
    assert latency["p95"]["value"] == pytest.approx(float(np.percentile(steady, 95)))
    assert checks["p95_latency_ms"]["observed"] == latency["p95"]["value"], "the p95 check reads per-request latency"
    per_item = result["metrics"]["latency_per_item_ms"]
    assert per_item["n"] == 89 and per_item["p50"]["value"] < latency["p50"]["value"], "the per-pair share, apart"
    throughput = result["metrics"]["throughput"]
    assert (throughput["answers"], throughput["requests"]) == (90, 12)
    p95_row = next(r for r in result["champion"]["comparison"] if r["metric"] == "p95_latency_ms")
    assert p95_row["champion"]["value"] == result["champion"]["metrics"]["latency_ms"]["p95"]["value"]
    assert result["champion"]["metrics"]["latency_ms"]["n"] == 11, "the champion's latency is per request too"
    latency_svg = re.search(r'<svg class="chart latency".*?</svg>', text, re.S).group(0)
    assert ">11 requests<" in latency_svg
    # the confusion matrix: the report's counts are sklearn's, and both are drawn
    rows_ = [p.to_dict() for p in read_predictions(folder / "predictions.jsonl")]
    guess = [r["option_ids"][int(np.argmax(r["probabilities"]))] for r in rows_]
    expected = confusion_matrix([r["expected"] for r in rows_], guess, labels=list(LABELS)).tolist()
    confusion = result["metrics"]["nli"]["confusion"]
    assert confusion["true"] == list(LABELS) and confusion["predicted"] == list(LABELS)
    assert confusion["counts"] == expected and sum(map(sum, expected)) == 90
    assert parser.svg_classes.count("chart confusion") == 2
    matrix = re.search(r'<svg class="chart confusion".*?</svg>', text, re.S).group(0)
    assert ">true label<" in matrix and ">predicted label<" in matrix
    cells = Counter(re.findall(r">(\d+)</text>", matrix))
    for value, times in Counter(str(v) for line in expected for v in line).items():
        assert cells[value] >= times, f"the count {value} is annotated in its cells"


# ----------------------------------------------------------------------------------------------------------------------
# The audit report's copies-serving series


def record(seq, at, release, stage, event, payload):
    return SimpleNamespace(seq=seq, recorded_at=at, release_id=release, model="m", stage=stage, event=event,
                           payload=payload)


def test_copies_series_follow_the_traffic_records_so_a_canary_overlap_shows():
    from shiplift.tasks.ledger.audit_report import copies_series, rollout_window

    records = [
        record(1, "2026-12-03T10:00:00.000000Z", "a", "promote", "succeeded", {"copies": 2}),
        record(2, "2026-12-03T11:00:00.000000Z", "b", "traffic", "step",
               {"phase": "rollout", "batch": 1, "batches": 2, "old_copies": 1, "new_copies": 1}),
        record(3, "2026-12-03T11:05:00.000000Z", "b", "traffic", "step",
               {"phase": "rollout", "batch": 2, "batches": 2, "old_copies": 0, "new_copies": 2}),
        record(4, "2026-12-03T11:06:00.000000Z", "b", "promote", "succeeded", {"copies": 2}),
        record(5, "2026-12-03T12:00:00.000000Z", "c", "traffic", "step",
               {"phase": "rollout", "check": 1, "batches": 2, "copies": 3}),
        record(6, "2026-12-03T12:10:00.000000Z", "c", "promote", "rolled_back", {"reason": "alarm"}),
    ]
    series, until = copies_series(records)
    by = {s["label"]: s for s in series}
    at = lambda text: datetime.fromisoformat(text).replace(tzinfo=UTC)  # noqa: E731
    assert by["a"]["points"] == [(at("2026-12-03T10:00:00"), 2), (at("2026-12-03T11:00:00"), 1),
                                 (at("2026-12-03T11:05:00"), 0)]
    assert by["b"]["points"][:2] == [(at("2026-12-03T11:00:00"), 1), (at("2026-12-03T11:05:00"), 2)], \
        "at 11:00 one copy of each release serves: the canary's overlap"
    assert by["b"]["points"][-2:] == [(at("2026-12-03T12:00:00"), 0), (at("2026-12-03T12:10:00"), 2)], \
        "copies the backend cannot tell apart go to the rolling release's mixed series; the rollback restores b"
    assert not by["b"]["mixed"]
    mixed = by["c: old and new copies (not told apart)"]
    assert mixed["mixed"] and mixed["points"] == [(at("2026-12-03T12:00:00"), 3), (at("2026-12-03T12:10:00"), 0)]
    assert until == at("2026-12-03T12:10:00")
    svg = charts.copies_serving("m", series, until)
    for label in ("copies serving", "a", "b", "c: old and new copies (not told apart)", "time (UTC, 2026-12-03)"):
        assert f">{label}<" in svg
    assert copies_series([]) == ([], None) and charts.copies_serving("m", [], until) == ""
    since, end = rollout_window(records, "b")
    assert since < at("2026-12-03T11:00:00") and at("2026-12-03T11:06:00") < end < at("2026-12-03T11:10:00"), \
        "B's rollout: from its first step to its promotion"
    zoomed = charts.copies_serving("m", series, end, since=since, key="b", title="rollout of b")
    assert ">a<" in zoomed and ">b<" in zoomed and ">c: old" not in zoomed, "only the releases serving in the window"
    assert rollout_window(records, "a") is None, "A was promoted at once: no traffic step, no rollout chart"
