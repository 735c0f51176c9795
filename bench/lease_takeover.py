"""Issue 44's figure: how long after a crashed `shiplift release` (killed with SIGKILL while validate runs, under a
custom `SHIPLIFT_ACTOR`) its rerun takes the promotion lease over and goes on.

`python -m bench.lease_takeover [--actor bob@ops-host]`: the tiny local release of tests/tiny_release.py, run as the
real CLI in a separate process. Before the lease recorded its holder's host and pid, the host was read from the actor
text, so an actor naming another machine kept the rerun out for three renewal periods (15 min). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shiplift.tasks.ledger.store import Ledger
from tests.tiny_release import write_tiny_config

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 600


def _validate_started(ledger_path: Path) -> bool:
    if not ledger_path.exists():
        return False
    with Ledger(f"sqlite:///{ledger_path}", read_only=True) as reader:
        return any(r.stage == "validate" and r.event == "started" for r in reader.history())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actor", default="bob@ops-host", help="SHIPLIFT_ACTOR of both runs")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="lease-takeover-"))
    config = write_tiny_config(work / "configs", work / "state")
    env = {**os.environ, "SHIPLIFT_ACTOR": args.actor}
    command = [sys.executable, "-m", "shiplift.tasks.cli.main", "release", str(config)]
    try:
        took, code = _kill_and_rerun(command, env, work)
    finally:  # the rerun promoted the release: stop the endpoints it left serving
        subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.main", "endpoints", "stop", "--all", "--state-dir",
                        str(work / "state")], cwd=ROOT, capture_output=True, timeout=120)
    print(json.dumps({"actor": args.actor, "rerun_exit": code,
                      "takeover_after_kill_s": None if took is None else round(took, 2)}))
    return 0 if took is not None and code == 0 else 1


def _kill_and_rerun(command: list[str], env: dict, work: Path) -> tuple[float | None, int]:
    """SIGKILL the first run once validate has started; (seconds from the kill to the rerun's takeover, its exit)."""
    victim = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    deadline = time.monotonic() + DEADLINE_S
    while not _validate_started(work / "state" / "ledger.db"):  # poll the ledger: the run says nothing else
        if victim.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the first run did not reach validate (exit {victim.poll()})")
        time.sleep(0.1)
    victim.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    victim.wait(timeout=30)
    rerun = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    took = None
    for line in rerun.stderr:
        if took is None and "took the promotion lease over" in line:
            took = time.monotonic() - killed
    return took, rerun.wait(timeout=DEADLINE_S)


if __name__ == "__main__":
    sys.exit(main())
