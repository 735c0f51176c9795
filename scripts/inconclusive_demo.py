"""A release that ends inconclusive and is decided by extension (issue 45 item 2), on the local backend in minutes.

Two releases of the tiny generated model (tests/tiny_release.py): the first has no champion and is promoted; the second
serves the same GGUF, so its answers are the champion's, task for task. Its gate reads 32 tasks but the champion rule
asks for 40 paired tasks before it decides (`min_samples`), so the first look is inconclusive: a gate whose dataset is
smaller than its rule needs. With `validation.inconclusive.choice: extend` the validate stage scores reserve tasks (the
decision set's other 79 test rows, which the gate never reads) on both, 16 per look, and judges every paired task so far
with the confidence sequence (validation.sequential): identical answers make every difference 0, which at margin 0.07
clears the sequence's bar after 73 paired tasks, so it passes at the third look (80 tasks) and the release is promoted.

Usage: .venv/bin/python scripts/inconclusive_demo.py [--root DIR]   (prints the looks; stops its endpoints at the end)
tests/e2e/test_inconclusive_release.py runs the same pair (`write_pair`, `choice_overrides`) and asserts on it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a file: the repository's packages and tests/ importable
    sys.path.insert(0, str(ROOT))

from shiplift.tasks.backends.registry import open_ledger  # noqa: E402 — needs sys.path above
from shiplift.tasks.ledger.release_state import ReleaseState  # noqa: E402 — needs sys.path above
from shiplift.tasks.pipeline.release import run_release  # noqa: E402 — needs sys.path above
from tests.tiny_release import DECISIONS, N_TASKS, stop_endpoints, write_tiny_config  # noqa: E402 — needs sys.path above

MIN_SAMPLES = 40  # above the gate's 32 tasks: the first look refuses to decide
MARGIN = 0.07  # at which 73 identical paired answers clear the sequence (validation.sequential, all differences 0)
BATCH = 16  # paired tasks per look: looks at 48, 64, 80, ... paired tasks
CHAMPION_RULE = {"metric": "accuracy", "margin": MARGIN, "min_samples": MIN_SAMPLES, "n_bootstrap": 200}


def write_pair(folder: Path, state_dir: Path, *, name: str = "tiny-decision") -> tuple[Path, Path]:
    """The tiny release config with the rule above (its first release is promoted, no champion to compare) and the
    reserve file: the decision set's test rows the gate does not read. Returns (config, reserve)."""
    config = write_tiny_config(folder, state_dir, name=name, validation__champion=CHAMPION_RULE)
    reserve = folder / "decisions-reserve.jsonl"
    rows = [line for line in DECISIONS.read_text().splitlines() if json.loads(line)["split"] == "test"]
    reserve.write_text("\n".join(rows[N_TASKS:]) + "\n")
    return config, reserve


def choice_overrides(choice: str, reserve: Path | None = None, *, approvers: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`--set` overrides of a release that follows `choice` when its gate is inconclusive: extend on `reserve` (16 per
    look, all of it at most, 10 minutes), or ask `approvers` (four eyes) through promotion.approval."""
    overrides = [f"validation.inconclusive.choice={choice}"]
    if choice == "extend":
        extend = {"datasets": [{"path": str(reserve), "splits": ["test"]}], "batch": BATCH, "max_tasks": 1000,
                  "deadline_s": 600}
        overrides.append(f"validation.inconclusive.extend={json.dumps(extend)}")
    if approvers:
        approval = {"required": True, "approvers": list(approvers), "four_eyes": True, "timeout_s": 3600}
        overrides.append(f"promotion.approval={json.dumps(approval)}")
    return tuple(overrides)


def validate_result(state_dir: Path, release_id: str) -> dict:
    """The validate stage's result as the release's ledger records it."""
    ledger = open_ledger(state_dir=state_dir, read_only=True)
    try:
        return ReleaseState.load(ledger, release_id).stage("validate")["result"]
    finally:
        ledger.close()


def look_lines(result: dict) -> list[str]:
    """The record of an inconclusive gate's choice, one line per look."""
    record = result["inconclusive"]
    lines = [f"first look: {record['first_look']['decision']}; choice {record['choice']}: {record['outcome']}"]
    for look in (record.get("extension") or {}).get("looks", []):
        low, high = look["interval"]
        lines.append(f"  look {look['look']}: {look['n']:4d} paired tasks  [{low:+.4f}, {high:+.4f}] against "
                     f"-{MARGIN:g}  {look['status']:12s} ({look['method']})")
    return lines


def quiet(message: str) -> None:
    """Progress that is not shown: the demo prints its own lines."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, help="where the configs and the local state go (default: a new temp dir)")
    root = parser.parse_args(argv).root or Path(tempfile.mkdtemp(prefix="inconclusive-demo-"))
    state = root / "state"
    config, reserve = write_pair(root / "configs", state)
    try:
        began = time.monotonic()
        first = run_release(config, progress=quiet)
        print(f"release 1 {first['release_id']}: {first['status']} (no champion) in {time.monotonic() - began:.0f} s")
        began = time.monotonic()
        second = run_release(config, overrides=choice_overrides("extend", reserve),
                             progress=lambda m: print("   ", m) if "extend:" in m else None)
        print(f"release 2 {second['release_id']}: {second['status']} in {time.monotonic() - began:.0f} s")
        result = validate_result(state, second["release_id"])
        print("\n".join(look_lines(result)))
        print(f"gate decision: {result['decision']}; evidence kept: "
              f"{', '.join(name for name in result['evidence'] if 'extension' in name)}")
        return 0 if (first["status"], second["status"], result["decision"]) == ("promoted", "promoted", "pass") else 1
    finally:
        stop_endpoints(state)


if __name__ == "__main__":
    raise SystemExit(main())
