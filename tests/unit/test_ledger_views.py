"""The ledger's audit views and the audit report, over real tiny releases on the local backend: two promoted
releases, a rejected one and a rollback with its reason; the report rendered by headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path

import pytest

from shiplift.tasks.backends.registry import open_ledger
from shiplift.tasks.errors import NotFound
from shiplift.tasks.ledger.audit_report import write_report
from shiplift.tasks.ledger.views import as_of, diff, releases, show, timeline
from shiplift.tasks.pipeline.promotion import rollback

MODEL = "tiny-decision"
REASON = "B answers slower in production (p95 > 2 s) <script>alert(1)</script>"


@pytest.fixture(scope="module")
def history(tmp_path_factory, tiny_release):
    """A promoted, B (an F16 build) promoted over it, D rejected by its gate, then a rollback from B to A."""
    made = tiny_release.three_releases(tmp_path_factory.mktemp("views"))
    rollback(made["state_dir"], MODEL, made["a"], reason=REASON, actor="auditor", expect_current=made["b"])
    ledger = open_ledger(state_dir=made["state_dir"], read_only=True)
    yield made | {"ledger": ledger}
    ledger.close()
    tiny_release.stop_endpoints(made["state_dir"])


def records_of(ledger, release_id: str, stage: str, event: str) -> list:
    return [r for r in ledger.release(release_id) if (r.stage, r.event) == (stage, event)]


def test_history_has_one_row_per_release_with_its_outcome(history):
    ledger, a, b, d = (history[k] for k in ("ledger", "a", "b", "d"))
    rows = releases(ledger, MODEL)
    assert [row["release_id"] for row in rows] == [a, b, d]
    assert [row["status"] for row in rows] == ["promoted", "promoted", "rejected"]
    assert [row["decision"] for row in rows] == ["pass", "pass", "fail"]
    assert sum(row["records"] for row in rows) == len(ledger.history(MODEL))
    assert rows[0]["promoted_at"] == records_of(ledger, a, "promote",
                                                "succeeded")[-1].recorded_at, "the rollback re-promoted A"
    assert rows[2]["promoted_at"] is None
    assert releases(ledger, "no-such-model") == []


def test_show_gathers_what_a_release_was_built_from_and_its_evidence(history):
    ledger, b = history["ledger"], history["b"]
    detail = show(ledger, b)
    package = records_of(ledger, b, "package", "succeeded")[0].payload
    image = records_of(ledger, b, "image", "succeeded")[0].payload
    gate = records_of(ledger, b, "validate", "succeeded")[0].payload
    opened = records_of(ledger, b, "release", "opened")[0]
    assert detail["artifact_sha256"] == package["artifact_sha256"] and detail["image_digest"] == image["image_digest"]
    assert (detail["opened_at"], detail["opened_by"]) == (opened.recorded_at, opened.actor)
    assert detail["config"]["artifact"]["quantization"] == "F16"
    assert detail["gate"]["checks"] == gate["checks"]
    assert detail["gate"]["datasets"][0]["sha256"] == gate["datasets"][0]["sha256"]
    assert detail["gate"]["champion_release"] == history["a"], "B was gated against A serving"
    assert [p["event"] for p in detail["promotions"]] == ["succeeded"]
    with pytest.raises(NotFound, match="no ledger records"):
        show(ledger, "tiny-decision-000000000000")


def test_diff_puts_two_releases_side_by_side(history):
    ledger, a, b = history["ledger"], history["a"], history["b"]
    result = diff(ledger, a, b)
    rows = {row["field"]: row for row in result["rows"]}
    detail_a, detail_b = show(ledger, a), show(ledger, b)
    for field in ("artifact_sha256", "model_sha256", "config_hash", "config.artifact.quantization"):
        assert not rows[field]["same"] and field in result["changed"]
    assert (rows["config.artifact.quantization"]["a"], rows["config.artifact.quantization"]["b"]) == ("Q8_0", "F16")
    assert rows["image_digest"]["same"] and rows["image_digest"]["a"] == detail_a["image_digest"], "same serving image"
    for name, value in detail_b["gate"]["metrics"].items():
        assert rows[f"metric.{name}"]["b"] == value and rows[f"metric.{name}"]["a"] == detail_a["gate"]["metrics"][name]
    for name, value in detail_a["gate"]["thresholds"].items():
        assert rows[f"threshold.{name}"]["a"] == value
    for name, value in detail_a["placement"].items():
        assert rows[f"placement.{name}"]["a"] == value
    assert rows["check.champion_accuracy"]["a"]["status"] == "skipped", "A had no champion"
    accuracy = rows["check.accuracy"]
    check_b = next(c for c in detail_b["gate"]["checks"] if c["name"] == "accuracy")
    assert accuracy["b"]["observed"] == check_b["observed"], "unrounded, with its interval"
    assert accuracy["b"]["ci"] == check_b["ci"], "unrounded, with its interval"
    assert accuracy["delta"] == pytest.approx(accuracy["b"]["observed"] - accuracy["a"]["observed"])
    assert rows["gate.champion_release"]["b"] == a
    profile = detail_a["determinism"]  # what produced the numbers (issue 50): the same llama.cpp and settings
    assert profile["n_batch"] == 512 and profile["system_info"]
    assert rows["determinism.threads"]["a"] == profile["threads"]
    assert all(row["same"] for name, row in rows.items() if name.startswith("determinism."))
    n_config = len([key for key in rows if key.startswith("config.")])
    assert n_config == len([k for k in result["changed"]
                            if k.startswith("config.")]), "only differing config fields are listed"
    assert result["config_fields_same"] > 10


def test_as_of_says_what_served_since_when_and_on_what_evidence(history):
    ledger, a, b = history["ledger"], history["a"], history["b"]
    promoted_b = records_of(ledger, b, "promote", "succeeded")[0]
    rolled_back = records_of(ledger, a, "promote", "succeeded")[-1]
    just_before_b = (datetime.strptime(promoted_b.recorded_at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
                     - timedelta(microseconds=1))
    then = as_of(ledger, MODEL, just_before_b)
    assert then["release_id"] == a and then["promotion"]["trigger"] != "rollback"
    at_b = as_of(ledger, MODEL, promoted_b.recorded_at)
    assert at_b["release_id"] == b and at_b["since"] == promoted_b.recorded_at
    assert at_b["built_from"]["artifact_sha256"] == show(ledger, b)["artifact_sha256"]
    assert at_b["evidence"]["decision"] == "pass" and at_b["evidence"]["checks"]
    now = as_of(ledger, MODEL, "2100-01-01T00:00:00Z")
    assert (now["release_id"], now["since"], now["record"]["seq"]) == (a, rolled_back.recorded_at, rolled_back.seq)
    assert now["promotion"]["trigger"] == "rollback"
    assert (now["promotion"]["reason"], now["promotion"]["rollback_from"], now["promotion"]["actor"]) == (REASON, b,
                                                                                                          "auditor")
    first = records_of(ledger, a, "promote", "succeeded")[0]
    with pytest.raises(NotFound, match="nothing of model 'tiny-decision' was promoted"):
        as_of(ledger, MODEL, (datetime.strptime(first.recorded_at, "%Y-%m-%dT%H:%M:%S.%fZ")
                              .replace(tzinfo=UTC) - timedelta(microseconds=1)))


def test_timeline_lists_gates_promotions_and_the_rollback_with_its_reason(history):
    ledger, a, b, d = (history[k] for k in ("ledger", "a", "b", "d"))
    events = timeline(ledger, MODEL)
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    kinds = [(e["release_id"], e["event"]) for e in events
             if e["event"] in ("gate", "promoted", "rollback", "finished")]
    assert kinds == [(a, "gate"), (a, "promoted"), (a, "finished"), (b, "gate"), (b, "promoted"), (b, "finished"),
                     (d, "gate"), (d, "finished"), (a, "rollback")]
    gate_d = next(e for e in events if (e["release_id"], e["event"]) == (d, "gate"))
    assert gate_d["detail"].startswith("fail: accuracy") and "0.99" in gate_d["detail"]
    assert events[-1]["detail"] == f"from {b} to {a}: {REASON}" and events[-1]["actor"] == "auditor"
    with pytest.raises(NotFound, match="no records of model 'nope'"):
        timeline(ledger, "nope")


class ReportDom(HTMLParser):
    """What the audit report's DOM holds: elements by tag and class, data attributes, external references."""

    def __init__(self):
        super().__init__()
        self.classes: dict[str, int] = {}
        self.data: list[tuple[str, str]] = []
        self.external: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in (attrs.get("class") or "").split():
            self.classes[f"{tag}.{name}"] = self.classes.get(f"{tag}.{name}", 0) + 1
        self.data += [(f"{tag}.{k}", v) for k, v in attrs.items() if k.startswith("data-")]
        self.external += [v for k, v in attrs.items() if k in ("src", "href") and v and not v.startswith("#")]

    def handle_data(self, data):
        self.text.append(data)


def parse(page: str) -> ReportDom:
    dom = ReportDom()
    dom.feed(page)
    return dom


def test_report_holds_every_release_its_evidence_and_the_verification(history, tmp_path):
    ledger, a, b, d = (history[k] for k in ("ledger", "a", "b", "d"))
    verification = {"ok": True, "n_records": len(ledger.history()), "head_hash": ledger.head().record_hash,
                    "problems": [], "checked_against": {"seq": 7, "signed_at": "2026-12-01T00:00:00Z",
                                                        "key_id": "k" * 16, "merkle_root": "m" * 64}}
    page = write_report(ledger, tmp_path / "report", verification).read_text()
    dom = parse(page)
    assert dom.external == [], "the page fetches nothing at view time"
    assert "<script>" not in page and "&lt;script&gt;" in page, "ledger text is escaped"
    assert dom.classes["section.model"] == 1 and ("section.data-model", MODEL) in dom.data
    assert {v for k, v in dom.data if k == "details.data-release"} == {a, b, d}
    assert dom.classes["svg.timeline"] == 1, "B (and D) were compared with a champion"
    assert dom.classes["svg.champion"] >= 1, "B (and D) were compared with a champion"
    assert dom.classes["table.checks"] == 3 and dom.classes["table.datasets"] == 3
    text = " ".join(dom.text)
    assert "time (UTC" in text and "candidate − champion" in text, "both charts label their x axis"
    assert "extends the checkpoint of seq 7" in text and verification["head_hash"] in text
    assert REASON in text and show(ledger, b)["gate"]["datasets"][0]["sha256"] in text
    broken = write_report(ledger, tmp_path / "broken",
                          verification | {"ok": False, "problems": ["record 3 was edited"]})
    assert "verification FAILED" in broken.read_text() and "record 3 was edited" in broken.read_text()
    with pytest.raises(NotFound):
        write_report(ledger, tmp_path / "none", verification, model="nope")
    assert not (tmp_path / "none").exists()


def chromium() -> str:
    found = os.environ.get("SHIPLIFT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "headless Chromium is needed for the report's browser test: `make test` installs Debian's chromium"
    return found


def headless(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """Run Chromium headless with a fresh profile and no background network (the machine has none)."""
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=timeout_s, check=False)


def png_pixels(path: Path) -> tuple[int, int, set[bytes]]:
    """Width, height and the distinct colours of an 8-bit RGB(A) PNG (enough to tell a rendered page from a blank)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    chunks, at = {}, 8
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunks.setdefault(kind, []).append(data[at + 8:at + 8 + length])
        at += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][0][:10])
    assert depth == 8 and colour in (2, 6), f"unexpected PNG format: depth {depth}, colour type {colour}"
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(b"".join(chunks[b"IDAT"]))
    stride = width * channels
    colours, previous = set(), bytearray(stride)
    for row in range(height):
        kind, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                nearest = min((abs(p - left), 0, left), (abs(p - up), 1, up), (abs(p - corner), 2, corner))[2]
                line[i] = (line[i] + nearest) & 0xFF
        colours.update(bytes(line[i:i + 3]) for i in range(0, stride, channels * 7))
        previous = line
    return width, height, colours


def test_report_renders_in_headless_chromium(history, tmp_path):
    ledger = history["ledger"]
    verification = {"ok": True, "n_records": len(ledger.history()), "head_hash": ledger.head().record_hash,
                    "problems": [], "checked_against": None}
    page = write_report(ledger, tmp_path / "report", verification)
    rendered = headless("--dump-dom", page.as_uri())
    assert rendered.returncode == 0, rendered.stderr[-2000:]
    dom = parse(rendered.stdout)
    assert dom.classes.get("svg.timeline") == 1 and dom.classes.get("section.model") == 1
    assert dom.classes.get("g.event-rollback") == 1 and dom.classes.get("g.event-promoted") == 2
    assert "Ledger verified" in " ".join(dom.text)
    shot = tmp_path / "report.png"
    taken = headless(f"--screenshot={shot}", "--window-size=1100,900", "--hide-scrollbars", page.as_uri())
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-2000:]
    width, height, colours = png_pixels(shot)
    assert (width, height) == (1100, 900)
    assert len(colours) > 20, f"the screenshot has {len(colours)} colours: the page did not render"
    assert bytes.fromhex("2ca02c") in colours or bytes.fromhex("e6f4e6") in colours, \
        "the verified box and markers are drawn"


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    from shiplift.tasks.cli.main import main

    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_prints_tables_for_people_and_json_for_machines(history, capsys, tmp_path, monkeypatch):
    ledger, state, a, b, d = history["ledger"], str(history["state_dir"]), history["a"], history["b"], history["d"]
    code, out, _ = run_cli(capsys, "ledger", "history", MODEL, "--state-dir", state)
    lines = out.splitlines()
    assert code == 0 and lines[0].split()[:5] == ["release_id", "opened_at", "opened_by", "status", "decision"]
    assert [line.split()[0] for line in lines[2:]] == [a, b, d]
    code, out, _ = run_cli(capsys, "ledger", "history", MODEL, "--json", "--state-dir", state)
    assert code == 0 and json.loads(out) == releases(ledger, MODEL)
    code, out, _ = run_cli(capsys, "ledger", "history", "--records", "--state-dir", state)
    assert code == 0 and len(out.splitlines()) == 2 + len(ledger.history())

    monkeypatch.setenv("COLUMNS", "1000")  # one line a row, so that the fields can be read off the table
    code, out, _ = run_cli(capsys, "ledger", "diff", a, b, "--state-dir", state)
    shown = {line.split()[1] for line in out.splitlines()[4:-1]}
    assert code == 0 and shown == set(diff(ledger, a, b)["changed"]) and "artifact_sha256" in shown
    assert all(line.startswith("*") for line in out.splitlines()[4:-1]), "by default only the fields that differ"
    assert out.splitlines()[0] == f"A = {a}"

    code, out, _ = run_cli(capsys, "ledger", "as-of", MODEL, "2100-01-01T00:00:00Z", "--state-dir", state)
    assert code == 0 and out.startswith(f"{MODEL} at 2100-01-01T00:00:00Z: {a}")
    assert f"rollback from {b}: {REASON}" in out
    assert "champion_accuracy" in out and show(ledger, a)["gate"]["datasets"][0]["sha256"] in out
    code, out, _ = run_cli(capsys, "ledger", "served-at", MODEL, "2100-01-01T00:00:00Z", "--json", "--state-dir", state)
    assert code == 0 and json.loads(out)["release_id"] == a

    code, out, _ = run_cli(capsys, "ledger", "timeline", MODEL, "--json", "--state-dir", state)
    assert code == 0 and json.loads(out) == timeline(ledger, MODEL)
    code, out, _ = run_cli(capsys, "ledger", "show", b, "--state-dir", state)
    assert code == 0 and "gate pass (champion: " + a + ")" in out and show(ledger, b)["image_digest"] in out

    code, out, _ = run_cli(capsys, "ledger", "report", "--out", str(tmp_path / "r"), "--state-dir", state)
    assert code == 0 and (tmp_path / "r" / "index.html").is_file() and "ledger verified" in out

    code, _, err = run_cli(capsys, "ledger", "show", "tiny-decision-000000000000", "--state-dir", state)
    assert code == 1 and "no release in the ledger matches" in err and "the nearest: " in err
    assert "shiplift ledger history" in err
    code, _, err = run_cli(capsys, "ledger", "as-of", MODEL, "yesterday", "--state-dir", state)
    assert code == 2 and "yesterday" in err
