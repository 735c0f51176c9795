"""The command line for people (issue 20): --version, one spelling of every flag, `ledger export --out -`, `as-of now`,
read-only commands that create nothing, "did you mean" for config typos, a readable `ledger diff`, tables by default
with `--json` for the same data, `shiplift status`, help on every argument, and progress with the time left.

The ledgers here are written record by record (no model runs): the views read records, whoever wrote them."""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
from pathlib import Path

import pytest

from shiplift.tasks.cli.main import build_parser, main
from shiplift.tasks.config import did_you_mean, load_release_config
from shiplift.tasks.console import format_table
from shiplift.tasks.errors import ConfigError
from shiplift.tasks.ledger.store import Ledger

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "configs" / "releases" / "gemma-decision.yaml"
MODEL, NLI = "tiny-decision", "tiny-nli"
SHA_A, SHA_B = "a1" * 32, "b2" * 32
DIGEST = "sha256:" + "c3" * 32


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check(name: str, observed: float, ci: list[float] | None, comparator: str = ">=", threshold: float | None = 0.2,
          status: str = "pass") -> dict:
    return {"name": name, "status": status, "observed": observed, "ci": ci, "comparator": comparator,
            "threshold": threshold, "n": 111}


def write_release(ledger: Ledger, release_id: str, *, model: str = MODEL, end: str | None = "promoted",
                  metrics: dict | None = None, artifact: str = SHA_A, quantization: str = "Q8_0",
                  checks: list[dict] | None = None) -> None:
    """The records a release leaves: opened (with its config), package, image, the gate, promote and the end.
    `end` None: opened and one stage started (in progress); "rejected": the gate failed and promote was skipped."""
    def add(stage: str, event: str, payload: dict) -> None:
        ledger.append(release_id=release_id, model=model, stage=stage, event=event, actor="tester",
                      payload={"release_id": release_id, **payload})

    config = {"name": model, "artifact": {"kind": "gguf", "quantization": quantization}, "validation": {"seed": 0}}
    add("release", "opened", {"config_hash": hashlib.sha256(release_id.encode()).hexdigest(), "config": config})
    if end is None:
        add("resolve", "started", {})
        return
    add("package", "succeeded", {"artifact_sha256": artifact, "artifact_uri": f"file:///a/{release_id}/model.tar.gz"})
    add("image", "succeeded", {"image_digest": DIGEST, "image_uri": "local/semif"})
    decision = "fail" if end == "rejected" else "pass"
    add("validate", "succeeded",
        {"decision": decision, "metrics": metrics or {"accuracy": 0.3, "ece": 0.1, "p95_ms": 700.0},
                                  "checks": checks or [check("accuracy", 0.3, [0.22, 0.39])],
                                  "thresholds": {"min_accuracy": 0.2}, "not_passed": []
                                  if decision == "pass" else ["accuracy"],
                                  "datasets": [{"name": "decisions", "path": "builtin:decisions", "sha256": "d4" * 32,
                                                "n": 111}],
                                  "champion_release": None})
    if end == "rejected":
        add("promote", "skipped", {"decision": decision})
    else:
        add("promote", "succeeded", {"endpoint": f"shiplift-{model}", "component": model, "strategy": "all_at_once",
                                     "served": {"release_id": release_id}, "steps": []})
    add("release", end, {})


@pytest.fixture
def state(tmp_path) -> Path:
    """A state dir whose ledger holds: model tiny-decision, A promoted, B promoted over it (more accurate), C rejected,
    D in progress; model tiny-nli, N promoted."""
    folder = tmp_path / "state"
    with Ledger.for_sqlite(folder / "ledger.db") as ledger:
        write_release(ledger, "tiny-decision-aaaa",
                      metrics={"accuracy": 0.3063063063063063, "ece": 0.154, "p95_ms": 712.5},
                      checks=[check("accuracy", 0.3063063063063063, [0.22, 0.39])])
        write_release(ledger, "tiny-decision-bbbb", artifact=SHA_B, quantization="F16",
                      metrics={"accuracy": 0.3333333333333333, "ece": 0.05, "p95_ms": 650.0},
                      checks=[check("accuracy", 0.3333333333333333, [0.2432, 0.4234])])
        write_release(ledger, "tiny-decision-cccc", end="rejected")
        write_release(ledger, "tiny-decision-dddd", end=None)
        write_release(ledger, "tiny-nli-nnnn", model=NLI, metrics={"accuracy": 0.711, "macro_f1": 0.71, "ece": 0.092,
                                                                   "p95_ms": 40.0})
    return folder


# 1 --version
# -----------------------------------------------------------------------------------------------------------


def test_version_prints_the_distributions_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"shiplift {importlib.metadata.version('shiplift')}\n"


# 2 one spelling of every flag
# -------------------------------------------------------------------------------------------


LEDGER_READS = {"history": [], "show": ["r"], "timeline": ["m"], "verify": [], "checkpoint": [], "prove": ["r"],
                "check-proof": ["p.json"], "public-key": [], "diff": ["a", "b"], "as-of": ["m", "now"],
                "report": ["--out", "o"], "upgrade": [], "export": ["--out", "o"]}


@pytest.mark.parametrize("command", sorted(LEDGER_READS))
def test_every_ledger_command_takes_ledger_url_and_state_dir_and_refuses_url(command, capsys):
    parser = build_parser()
    args = parser.parse_args(["ledger", command, *LEDGER_READS[command], "--ledger-url", "sqlite:////x.db",
                              "--state-dir", "/s"])
    assert (args.ledger_url, args.state_dir) == ("sqlite:////x.db", "/s")
    with pytest.raises(SystemExit) as refused:
        parser.parse_args(["ledger", command, *LEDGER_READS[command], "--" + "url", "sqlite:////x.db"])
    assert refused.value.code == 2 and "unrecognized arguments: --" + "url" in capsys.readouterr().err


def test_ledger_commands_read_ledger_url_and_shiplift_ledger_url(state, tmp_path, capsys, monkeypatch):
    url = f"sqlite:///{state / 'ledger.db'}"
    code, out, _ = cli(capsys, "ledger", "history", MODEL, "--ledger-url", url, "--state-dir",
                       str(tmp_path / "nothing"))
    assert code == 0 and "tiny-decision-aaaa" in out
    monkeypatch.setenv("SHIPLIFT_LEDGER_URL", url)
    code, out, _ = cli(capsys, "ledger", "history", MODEL, "--json", "--state-dir", str(tmp_path / "nothing"))
    assert code == 0 and [row["release_id"] for row in json.loads(out)][:2] == ["tiny-decision-aaaa",
                                                                                "tiny-decision-bbbb"]
    code, out, _ = cli(capsys, "status", "--json", "--state-dir", str(tmp_path / "nothing"))
    assert code == 0 and {row["model"] for row in json.loads(out)} == {MODEL, NLI}


REPO_TEXT = ["README.md", "Makefile", "docs", "scripts", "dags", "tasks", "tests", "bench", "configs"]


def test_no_file_names_the_old_url_flag_or_the_changed_flag():
    old = re.compile(r"--(url|changed)(?![\w-])")
    hits = []
    for name in REPO_TEXT:
        base = ROOT / name
        for path in [base] if base.is_file() else sorted(base.rglob("*")):
            if path.is_file() and path.suffix in ("", ".md", ".py", ".sh", ".yaml", ".yml", ".txt", ".toml"):
                text = path.read_text(encoding="utf-8", errors="replace")
                hits += [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}" for m in old.finditer(text)]
    assert hits == [], \
        "one spelling: --ledger-url, and ledger diff shows what changed by default (--all for every field)"


def test_the_missing_ledger_error_names_the_demos_state_dir(tmp_path, capsys, monkeypatch):
    import shiplift.tasks.project

    demo = tmp_path / "checkout" / ".shiplift" / "demo"
    Ledger.for_sqlite(demo / "ledger.db").close()
    monkeypatch.setattr(shiplift.tasks.project, "DEMO_STATE_DIR", demo)
    monkeypatch.setenv("SHIPLIFT_HOME", str(tmp_path / "home"))
    code, _, err = cli(capsys, "ledger", "history")
    assert code == 2 and f"no ledger at sqlite:///{tmp_path / 'home' / 'ledger.db'}" in err
    assert f"--state-dir {demo} (make demo's)" in err
    assert cli(capsys, "ledger", "history", "--state-dir", str(demo))[0] == 0, "the named --state-dir finds it"


def test_release_takes_state_dir_and_ledger_history_finds_the_release_there(tmp_path, capsys, monkeypatch):
    """`shiplift release CONFIG --state-dir X` is `--set backend.state_dir=X`: the release's state and its ledger
    are under X, where `ledger history --state-dir X` and `status --state-dir X` look (the stages are not run here:
    opening the release is what writes the ledger)."""
    import shiplift.tasks.pipeline.release as release

    seen = {}

    def opened_only(config_path, *, overrides=(), keep_candidate=None, **_):
        seen["overrides"] = overrides
        ctx = release.open_release(config_path, overrides=overrides, progress=lambda m: None)
        ctx.record_opened()  # a run appends `release/opened` once it holds the lease; this stand-in takes none
        return release.release_summary(ctx.state)

    monkeypatch.setattr(release, "run_release", opened_only)
    monkeypatch.setenv("SHIPLIFT_HOME", str(tmp_path / "home"))
    there = tmp_path / "x y"  # a path YAML would not read as a plain string is quoted
    code, out, _ = cli(capsys, "release", str(GEMMA), "--state-dir", str(there), "--json")
    summary = json.loads(out)
    assert code == 3 and summary["status"] == "created", "opened, not promoted"
    assert (there / "ledger.db").is_file() and not (tmp_path / "home").exists()
    assert load_release_config(GEMMA, overrides=seen["overrides"]).backend.state_dir == str(there)
    code, out, _ = cli(capsys, "ledger", "history", "--json", "--state-dir", str(there))
    assert code == 0 and [row["release_id"] for row in json.loads(out)] == [summary["release_id"]]
    code, out, _ = cli(capsys, "status", "--json", "--state-dir", str(there))
    assert code == 0 and json.loads(out)[0]["in_progress"] == [summary["release_id"]]


def test_orchestrate_begin_takes_state_dir_as_the_configs_state_dir():
    args = build_parser().parse_args(["orchestrate", "begin", str(GEMMA), "--holder", "h", "--state-dir", "/srv/s"])
    from shiplift.tasks.cli.arguments import overrides_of

    assert load_release_config(GEMMA, overrides=overrides_of(args)).backend.state_dir == "/srv/s"


# 3 export --out - -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_export_to_dash_writes_stdout_and_no_file(state, tmp_path, capsys, monkeypatch, fmt):
    monkeypatch.chdir(tmp_path)
    code, out, _ = cli(capsys, "ledger", "export", "--format", fmt, "--out", "-", "--state-dir", str(state))
    assert code == 0 and not (tmp_path / "-").exists()
    code, _, _ = cli(capsys, "ledger", "export", "--format", fmt, "--out", str(tmp_path / f"ledger.{fmt}"),
                     "--state-dir", str(state))
    assert code == 0 and out == (tmp_path / f"ledger.{fmt}").read_text(encoding="utf-8")
    if fmt == "json":
        assert json.loads(out)["verify"]["ok"] and len(json.loads(out)["records"]) > 10


# 4 as-of now ----------------------------------------------------------------------------------------------------------


def test_as_of_now_says_what_serves_and_a_time_without_timezone_is_refused_with_the_fix(state, capsys):
    code, out, _ = cli(capsys, "ledger", "as-of", MODEL, "now", "--json", "--state-dir", str(state))
    assert code == 0 and json.loads(out)["release_id"] == "tiny-decision-bbbb"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", json.loads(out)["as_of"])
    code, out, _ = cli(capsys, "ledger", "as-of", MODEL, "NOW", "--state-dir", str(state))
    assert code == 0 and out.startswith(f"{MODEL} at ") and "tiny-decision-bbbb, serving since" in out
    code, _, err = cli(capsys, "ledger", "as-of", MODEL, "2026-11-29T12:00:00", "--state-dir", str(state))
    assert code == 2 and "has no timezone" in err and "2026-11-29T12:00:00Z" in err and "or now" in err
    code, _, err = cli(capsys, "ledger", "as-of", MODEL, "yesterday", "--state-dir", str(state))
    assert code == 2 and "'yesterday' is not ISO 8601" in err and "or now" in err


# 5 read-only commands create and change nothing
# -------------------------------------------------------------------------


def tree(root: Path) -> dict[str, tuple]:
    """Every folder and file under `root` (and `root` itself): a file's mtime and the sha256 of its bytes. (A
    folder's own mtime is left out: SQLite makes and removes its `-shm`/`-wal` files beside a WAL database it reads.)"""
    found = {}
    if not root.exists():
        return found
    for path in sorted(root.rglob("*")):
        if path.is_file():
            found[str(path.relative_to(root))] = ("file", path.stat().st_mtime_ns,
                                                  hashlib.sha256(path.read_bytes()).hexdigest())
        else:
            found[str(path.relative_to(root))] = ("dir",)
    return found | {".": ("dir",)}


READ_ONLY = {
    "status": ["status"], "status MODEL": ["status", MODEL], "endpoints list": ["endpoints", "list"],
    "endpoints list --json": ["endpoints", "list", "--json"], "ledger history": ["ledger", "history"],
    "ledger history --records": ["ledger", "history", "--records"],
    "ledger show": ["ledger", "show", "tiny-decision-aaaa"],
    "ledger timeline": ["ledger", "timeline", MODEL], "ledger verify": ["ledger", "verify"],
    "ledger diff": ["ledger", "diff", "tiny-decision-aaaa", "tiny-decision-bbbb"],
    "ledger as-of": ["ledger", "as-of", MODEL, "now"], "ledger report": ["ledger", "report", "--out", "{out}"],
    "ledger export -": ["ledger", "export", "--out", "-"], "ledger prove": ["ledger", "prove", "tiny-decision-aaaa"],
    "ledger public-key": ["ledger", "public-key"],
}
LEDGER_ONLY = {"ledger prove", "ledger public-key"}  # need a signed checkpoint or a key: refused before, never writing


@pytest.mark.parametrize("variant", ["missing", "empty", "ledger", "signed"])
@pytest.mark.parametrize("name", sorted(READ_ONLY))
def test_read_only_commands_leave_the_state_dir_byte_identical(name, variant, tmp_path, capsys, monkeypatch):
    root = tmp_path / "root"
    state = root / "state"
    key = tmp_path / "keys" / "ledger.pem"  # outside the watched tree, as the key must be
    monkeypatch.setenv("SHIPLIFT_CHECKPOINT_KEY", str(key))
    monkeypatch.delenv("SHIPLIFT_CHECKPOINT_WITNESS", raising=False)
    monkeypatch.delenv("SHIPLIFT_LEDGER_URL", raising=False)
    monkeypatch.setenv("SHIPLIFT_HOME", str(root / "home"))
    if variant != "missing":
        state.mkdir(parents=True)
    if variant in ("ledger", "signed"):
        with Ledger.for_sqlite(state / "ledger.db") as ledger:
            write_release(ledger, "tiny-decision-aaaa")
            write_release(ledger, "tiny-decision-bbbb", artifact=SHA_B)
    if variant == "signed":
        assert cli(capsys, "ledger", "checkpoint", "--state-dir", str(state))[0] == 0
    before = tree(root)
    argv = [part.replace("{out}", str(tmp_path / "out" / "report")) for part in READ_ONLY[name]]
    code, _, err = cli(capsys, *argv, "--state-dir", str(state))
    assert tree(root) == before, f"`shiplift {name}` changed the state dir"
    if name.startswith("status") and variant in ("missing", "empty"):
        assert code == 2 and "no ledger at" in err, "where it looked, and exit 2"
    elif name.startswith("endpoints"):
        assert code == 2 and "no local endpoints: the state dir" in err, "where it looked, and exit 2"
    elif name.startswith("status"):
        assert code == 0, err
    elif name in LEDGER_ONLY:
        assert code == 0 or variant != "signed", err
    elif variant in ("missing", "empty"):
        assert code == 2 and "no ledger at" in err
    else:
        assert code == 0, err


def test_endpoints_list_without_a_state_dir_says_where_it_looked_and_exits_2(tmp_path, capsys):
    code, out, err = cli(capsys, "endpoints", "list", "--state-dir", str(tmp_path / "absent"))
    assert code == 2 and out == "" and "--state-dir" in err
    assert f"the state dir {tmp_path / 'absent'} does not exist" in err and not (tmp_path / "absent").exists()
    (tmp_path / "absent" / "endpoints").mkdir(parents=True)
    code, out, _ = cli(capsys, "endpoints", "list", "--json", "--state-dir", str(tmp_path / "absent"))
    assert code == 0 and json.loads(out) == []


def test_a_read_only_ledger_open_leaves_no_wal_files_and_a_writer_keeps_its_own(tmp_path):
    path = tmp_path / "ledger.db"
    with Ledger.for_sqlite(path) as ledger:
        write_release(ledger, "tiny-decision-aaaa")
    before = tree(tmp_path)
    with Ledger(f"sqlite:///{path}", read_only=True) as reader:
        assert len(reader.history()) > 3 and (tmp_path / "ledger.db-shm").exists(), "SQLite made its index to read"
    assert tree(tmp_path) == before
    with Ledger(f"sqlite:///{path}") as writer:
        writer.history()
        with Ledger(f"sqlite:///{path}", read_only=True) as reader:
            reader.history()
        assert (tmp_path / "ledger.db-wal").exists(), "the writer's WAL is its own, not the reader's to remove"


# 6 did you mean
# ---------------------------------------------------------------------------------------------------------


def config_error(*overrides: str, text: str | None = None, tmp_path: Path | None = None) -> ConfigError:
    path = GEMMA
    if text is not None:
        path = tmp_path / "typo.yaml"
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_release_config(path, overrides=overrides, environ={})
    return caught.value


def test_a_misspelled_top_level_key_in_yaml_names_the_key_the_closest_and_the_fix(tmp_path):
    error = config_error(text=GEMMA.read_text().replace("\nvalidation:", "\nvaldation:"), tmp_path=tmp_path)
    assert "valdation: unknown key" in error.problem and "did you mean validation" in error.problem
    assert error.fix.startswith("rename valdation to validation")


@pytest.mark.parametrize(("override", "written", "suggested"), [
    ("validation.thresholds.min_acuracy=0.3", "validation.thresholds.min_acuracy",
     "validation.thresholds.min_accuracy"),
    ("validation.min_acuracy=0.3", "validation.min_acuracy", "validation.thresholds.min_accuracy"),  # one level down
    # tag = a field's name
    ("placement.instance_typ=ml.c7i.xlarge", "placement.instance_typ", "placement.instance_type"),
    ("rollout.copys=2", "rollout.copys", "rollout.copies"),  # tagged by strategy
    ("backend.stat_dir=x", "backend.stat_dir", "backend.state_dir"),
    ("artifact.source.sha=1", "artifact.source.sha", "artifact.source.sha256"),  # a family part, then a tagged union
    ("image.max_in_fligt=2", "image.max_in_fligt", "image.max_in_flight"),
    ("calibration.dataset.splts=[a]", "calibration.dataset.splts", "calibration.dataset.splits"),
    ("validation.champion.margn=0.1", "validation.champion.margn", "validation.champion.margin"),
])
def test_a_misspelled_set_key_at_any_level_gets_the_closest_valid_key(override, written, suggested):
    error = config_error(override)
    key = override.partition("=")[0]
    assert f"  {written}: unknown key (from --set {key})" in error.problem
    assert f"did you mean {suggested}" in error.problem
    assert error.fix.startswith(f"write --set {suggested}=… instead of --set {key}=…")


def test_a_misspelled_key_in_a_list_item_and_one_without_a_close_match(tmp_path):
    text = GEMMA.read_text().replace("      splits: [test]", "      split: [test]")
    error = config_error(text=text, tmp_path=tmp_path)
    assert "validation.datasets[0].split: unknown key" in error.problem
    assert "did you mean validation.datasets[0].splits" in error.problem
    error = config_error("rollout.zzzz=1")
    assert "rollout.zzzz: unknown key" in error.problem and "the keys there are: strategy, copies" in error.problem
    assert error.fix.startswith("remove rollout.zzzz")


def test_did_you_mean_is_a_courtesy_that_never_raises():
    assert did_you_mean((), {}) is None
    assert did_you_mean((0, "x"), []) is None
    assert did_you_mean(("calibration", 3, "x"), {"calibration": "text"}) is None
    assert did_you_mean(("nosuch", "x"), {}) is None
    assert did_you_mean(("placement", 3, "x"),
                        {"placement": "text"})[0] == "placement.x", "an unknown tag: every variant's keys"


def test_config_validate_prints_the_suggestion(capsys):
    code, _, err = cli(capsys, "config", "validate", str(GEMMA), "--set", "validation.thresholds.max_ec=0.3")
    assert code == 2 and "did you mean validation.thresholds.max_ece?" in err


# 7 ledger diff
# ----------------------------------------------------------------------------------------------------------


def test_diff_shows_what_changed_rounded_with_deltas_and_intervals(state, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = cli(capsys, "ledger", "diff", "tiny-decision-aaaa", "tiny-decision-bbbb", "--state-dir", str(state))
    lines = out.splitlines()
    assert code == 0 and lines[:2] == ["A = tiny-decision-aaaa", "B = tiny-decision-bbbb"]
    assert lines[2].split() == ["field", "A", "B", "B", "−", "A"]
    rows = {line.split()[1]: line for line in lines[4:-1]}
    assert all(line.startswith("*") for line in lines[4:-1]) and "image_digest" not in rows, "only what changed"
    assert "0.3063" in rows["metric.accuracy"] and "0.3333" in rows["metric.accuracy"]
    assert "+0.02703" in rows["metric.accuracy"]
    assert "0.3063063" not in out, "4 significant digits"
    assert "-0.104" in rows["metric.ece"] and "-62.5" in rows["metric.p95_ms"]
    assert "pass: 0.3063 [0.22, 0.39] >= 0.2" in rows["check.accuracy"] and "[0.2432, 0.4234]" in rows["check.accuracy"]
    assert "Q8_0" in rows["config.artifact.quantization"] and "F16" in rows["config.artifact.quantization"]
    assert lines[-1].startswith(f"{len(rows)} of ") and "--all shows every field" in lines[-1]

    code, out, _ = cli(capsys, "ledger", "diff", "tiny-decision-aaaa", "tiny-decision-bbbb", "--all", "--state-dir",
                       str(state))
    everything = {line.split()[0]: line for line in out.splitlines()[4:-1] if not line.startswith("*")}
    assert code == 0 and DIGEST in everything["image_digest"], "--all: also the fields that are the same, unmarked"


def test_diff_fits_the_terminal_and_drops_no_row(state, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "72")
    code, out, _ = cli(capsys, "ledger", "diff", "tiny-decision-aaaa", "tiny-decision-bbbb", "--state-dir", str(state))
    result = json.loads(cli(capsys, "ledger", "diff", "tiny-decision-aaaa", "tiny-decision-bbbb", "--json",
                            "--state-dir", str(state))[1])
    table = out.splitlines()[2:-1]
    assert code == 0 and max(len(line) for line in table) <= 72
    assert sum(line.startswith("*") for line in table) == len(result["changed"]), "every changed field keeps its row"
    sha_row = next(line for line in table if line.startswith("*") and "artifact_sha256" in line)
    assert f"{SHA_A[:8]}" in sha_row and "…" in sha_row and SHA_A[-8:] in sha_row, "a hash keeps both ends"


def test_diff_json_is_the_same_data_unrounded_and_changed_is_gone(state, capsys):
    code, out, _ = cli(capsys, "ledger", "diff", "tiny-decision-aaaa", "tiny-decision-bbbb", "--json", "--state-dir",
                       str(state))
    rows = {row["field"]: row for row in json.loads(out)["rows"]}
    assert code == 0 and rows["metric.accuracy"]["a"] == 0.3063063063063063
    assert rows["metric.accuracy"]["delta"] == 0.3333333333333333 - 0.3063063063063063
    assert rows["check.accuracy"]["b"]["ci"] == [0.2432,
                                                 0.4234] and rows["check.accuracy"]["delta"] == pytest.approx(0.02703,
                                                                                                              abs=1e-5)
    assert rows["artifact_sha256"]["delta"] is None and rows["image_digest"]["same"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ledger", "diff", "a", "b", "--" + "changed"])


def test_format_table_without_a_width_is_as_before_and_with_one_wraps_and_shortens():
    rows = [{"a": "x", "b": None}, {"a": "longer", "b": 0.5}]
    assert format_table(rows, ["a", "b"]) == "a       b\n------  ---\nx       -\nlonger  0.5"
    fitted = format_table([{"k": "h", "v": "f" * 64}, {"k": "t", "v": "many words " * 6}], ["k", "v"], width=30,
                          shrink=("v",))
    lines = fitted.splitlines()
    assert max(len(line) for line in lines) <= 30 and lines[2] == "h  " + "f" * 13 + "…" + "f" * 13
    assert len(lines) > 4 and all(line.startswith("   ") for line in lines[4:]), "text wrapped under its own column"


# 8 tables by default, --json for the same data
# ---------------------------------------------------------------------------


def test_config_validate_prints_a_table_and_json_is_what_it_always_printed(capsys):
    from shiplift.tasks.pipeline.release import release_id_for

    config = load_release_config(GEMMA)
    code, out, _ = cli(capsys, "config", "validate", str(GEMMA), "--json")
    assert code == 0 and out == json.dumps({"ok": True, "release_id": release_id_for(config),
                                            "config_hash": config.config_hash(),
                                            "config": config.model_dump(mode="json")}, indent=2, sort_keys=True) + "\n"
    code, out, _ = cli(capsys, "config", "validate", str(GEMMA))
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == f"{GEMMA} is valid: release {release_id_for(config)}, config hash {config.config_hash()}"
    assert lines[1].split() == ["field", "value"] and any(line.split()[:2] == ["validation.thresholds.max_ece", "0.3"]
                                                          for line in lines)


SUMMARY = {"release_id": "tiny-decision-aaaa", "model": MODEL, "status": "rejected", "decision": "fail",
           "metrics": {"accuracy": 0.3063063063063063, "ece": 0.154}, "not_passed": ["accuracy: 0.3063 < 0.99"],
           "stages": {"resolve": "succeeded"}, "rollout": {"strategy": None, "steps": 0, "reason": None}}


def test_release_prints_its_summary_as_a_table_and_json(capsys, monkeypatch):
    import shiplift.tasks.pipeline.release as release

    monkeypatch.setattr(release, "run_release", lambda *a, **k: SUMMARY)
    code, out, _ = cli(capsys, "release", str(GEMMA), "--json")
    assert code == 3 and out == json.dumps(SUMMARY, indent=2, sort_keys=True, default=str) + "\n"
    code, out, _ = cli(capsys, "release", str(GEMMA))
    assert code == 3 and out.splitlines()[0] == "tiny-decision-aaaa: rejected (gate fail)"
    assert any(line.split() == ["metrics.accuracy", "0.3063"] for line in out.splitlines())


def test_stage_prints_its_result_as_a_table_and_json(state, capsys, monkeypatch):
    import shiplift.tasks.pipeline.release as release

    result = {"event": "succeeded", "decision": "pass", "metrics": {"accuracy": 0.3063063063063063}}
    monkeypatch.setattr(release, "run_orchestrated_stage", lambda *a, **k: result)
    code, out, _ = cli(capsys, "stage", "validate", "--release", "tiny-decision-aaaa", "--state-dir", str(state),
                       "--json")
    assert code == 0 and out == json.dumps(result, indent=2, sort_keys=True) + "\n"
    code, out, _ = cli(capsys, "stage", "validate", "--release", "tiny-decision-aaaa", "--state-dir", str(state))
    assert code == 0 and out.splitlines()[0] == "tiny-decision-aaaa validate: succeeded"
    assert any(line.split() == ["metrics.accuracy", "0.3063"] for line in out.splitlines())


def test_eval_prints_its_summary_as_a_table_with_intervals_and_json(capsys):
    from shiplift.tasks.families.base import evaluation_exit

    summary = {"decision": "fail", "n": 111, "accuracy": {"value": 0.26126126, "ci": [0.18018, 0.34234], "n": 111},
               "paths": {"report_html": "/o/report.html"}}
    assert evaluation_exit({"decision": "fail"}, summary, as_json=True) == 3
    assert capsys.readouterr().out == json.dumps(summary, indent=2, sort_keys=True) + "\n"
    assert evaluation_exit({"decision": "pass"}, summary) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "decision: pass" and any(line.split() == ["accuracy", "0.2613", "[0.1802,", "0.3423]"]
                                                for line in lines)
    for dataset in ("jevbench", "chat", "nli"):
        assert build_parser().parse_args(["eval", dataset, "--endpoint", "e", "--data", "d", "--out", "o",
                                          "--json"]).json


def test_ledger_checkpoint_prints_a_table_and_json(state, tmp_path, capsys):
    key = str(tmp_path / "keys" / "k.pem")
    code, out, _ = cli(capsys, "ledger", "checkpoint", "--state-dir", str(state), "--key", key)
    assert code == 0 and out.startswith("signed the ledger's head: checkpoint seq ")
    code, out, _ = cli(capsys, "ledger", "checkpoint", "--state-dir", str(state), "--key", key, "--json")
    signed = json.loads(out)
    assert code == 0 and {"seq", "head_hash", "key_id"} <= set(signed)


# 9 status
# ---------------------------------------------------------------------------------------------------------------


def test_status_says_what_serves_its_evidence_the_last_release_and_those_in_progress(state, capsys, monkeypatch):
    code, out, _ = cli(capsys, "status", "--json", "--state-dir", str(state))
    rows = {row["model"]: row for row in json.loads(out)}
    decision, nli = rows[MODEL], rows[NLI]
    assert code == 0 and list(rows) == [MODEL, NLI]
    with Ledger(f"sqlite:///{state / 'ledger.db'}", read_only=True) as ledger:
        promoted_b = [r for r in ledger.release("tiny-decision-bbbb")
                      if (r.stage, r.event) == ("promote", "succeeded")][0]
    assert decision["serving"]["release_id"] == "tiny-decision-bbbb"
    assert decision["serving"]["since"] == promoted_b.recorded_at
    assert decision["serving"]["decision"] == "pass"
    assert decision["serving"]["metrics"] == {"accuracy": 0.3333333333333333, "macro_f1": None, "ece": 0.05,
                                              "p95_ms": 650.0}
    assert decision["serving"]["cost_per_hour"] is None, "the hook for prices, filled in later"
    assert decision["last_release"] == {**decision["last_release"], "release_id": "tiny-decision-dddd",
                                        "status": "running"}
    assert decision["in_progress"] == ["tiny-decision-dddd"]
    assert nli["serving"]["metrics"]["macro_f1"] == 0.71 and nli["last_release"]["status"] == "promoted"
    assert not nli["in_progress"]

    monkeypatch.setenv("COLUMNS", "400")
    code, out, _ = cli(capsys, "status", "--state-dir", str(state))
    header, _, *lines = out.splitlines()
    assert code == 0 and header.split()[:4] == ["model", "serving", "since", "gate"] and len(lines) == 2
    first = lines[0].split()
    assert first[:2] == [MODEL, "tiny-decision-bbbb"] and first[3:9] == ["pass", "0.3333", "-", "0.05", "650", "-"]
    assert first[9:] == ["tiny-decision-dddd", "running", "tiny-decision-dddd"]
    code, out, _ = cli(capsys, "status", NLI, "--json", "--state-dir", str(state))
    assert code == 0 and [row["model"] for row in json.loads(out)] == [NLI]
    code, _, err = cli(capsys, "status", "nope", "--state-dir", str(state))
    assert code == 1 and "no releases of model 'nope'" in err


def test_status_of_a_rejected_last_release_and_of_nothing_serving(tmp_path, capsys):
    state = tmp_path / "state"
    with Ledger.for_sqlite(state / "ledger.db") as ledger:
        write_release(ledger, "tiny-decision-cccc", end="rejected")
    code, out, _ = cli(capsys, "status", "--json", "--state-dir", str(state))
    [row] = json.loads(out)
    assert code == 0 and row["serving"] is None and row["last_release"]["status"] == "rejected"
    assert row["in_progress"] == []
    code, out, _ = cli(capsys, "status", "--state-dir", str(state))
    assert out.splitlines()[2].split()[:2] == [MODEL, "(nothing)"]


# 10 help on every argument
# -----------------------------------------------------------------------------------------------


def parsers(parser: argparse.ArgumentParser, path: str = "shiplift"):
    """Every parser under `parser` with its command path (an alias's parser once); each subcommand has help."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:
                    continue
                seen.add(id(sub))
                assert helps.get(name), f"`{path} {name}` has no help"
                yield from parsers(sub, f"{path} {name}")


def test_every_argument_of_every_command_has_help():
    missing = [f"{path}: {action.option_strings or action.dest}" for path, parser in parsers(build_parser())
               for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and (not action.help or action.help == argparse.SUPPRESS)]
    assert missing == []
    walked = {path for path, _ in parsers(build_parser())}
    assert {"shiplift ledger diff", "shiplift eval nli", "shiplift serve semif", "shiplift status",
            "shiplift orchestrate end"} <= walked and len(walked) > 40, "the walk reaches every subcommand"


# 11 progress with the time left
# -------------------------------------------------------------------------------------------


def test_the_gates_progress_says_the_time_left():
    from shiplift.validation.evaluate import progress_counter, time_left

    said, now = [], [100.0]
    report = progress_counter(said.append, "candidate", clock=lambda: now[0])
    for done in (1, 21, 41, 100):
        now[0] = 100.0 + done * 0.5  # half a second a task
        report(done, 100)
    assert said == ["candidate: 1/100 tasks, ~50s left", "candidate: 21/100 tasks, ~40s left",
                    "candidate: 41/100 tasks, ~30s left", "candidate: 100/100 tasks"]
    assert [time_left(s) for s in (0, 59.6, 185, 4500)] == ["0s", "1m 00s", "3m 05s", "1h 15m"]

