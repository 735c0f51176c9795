"""The demo's story ends as designed with CPU-bound work beside it (issue 45, item 4).

A fresh `make demo` on a 2-core machine with other processes running at low priority ended rc 1: step 1's p95 was
15.6 s against a 10 s ceiling, nothing served and four of ten steps ended other than designed. Latency is now
compared with the champion as a ratio measured alternately (what loads the machine loads both), and the absolute
ceiling is an SLO set for a busy machine. This runs the whole story, not only the Gemma steps whose latency is
compared, because every step is gated on latency (the encoder and the chat path on their SLO alone) and the canaries
need the earlier steps' champion: `python -m shiplift.tasks.cli.demo` as `make demo` runs it, with one `nice -n 19` busy
loop per core beside it from start to end, and with the one-thread setting docs/local-backend.md gives a
shared machine (`SHIPLIFT_CONFIG__image__threads=1`). About 25-40 minutes on 2 cores: `make test-slow`.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.cli.demo import EXPECTED, STEPS

ROOT = Path(__file__).resolve().parents[2]
# demo.main: "{label}: {status} ({decision}); report …"
ENDED = re.compile(r"^(\d+\. .+): (\w+) \((\w+)\); report ", re.M)
HOG = "while True: pass"

pytestmark = [pytest.mark.slow, pytest.mark.demo]


def cpu_hogs(count: int) -> list[subprocess.Popen]:
    """One CPU-bound busy loop per core, at the lowest priority (as other work on a shared machine runs)."""
    return [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", HOG]) for _ in range(count)]


@pytest.mark.timeout(5400)
def test_the_demo_ends_as_designed_with_a_cpu_hog_on_every_core(tmp_path):
    state_dir = tmp_path / "demo"
    hogs = cpu_hogs(os.cpu_count() or 2)
    try:
        result = subprocess.run([sys.executable, "-m", "shiplift.tasks.cli.demo"], cwd=ROOT, capture_output=True,
                                text=True,
                                env={**os.environ, "SHIPLIFT_HOME": str(state_dir),
                                     # what docs/local-backend.md tells a shared machine to run: one llama.cpp
                                     # thread, so a descheduled second thread cannot stall every token
                                     "SHIPLIFT_CONFIG__image__threads": "1"},
                                timeout=5100)
        running = [hog.poll() is None for hog in hogs]
        busy_s = [sum(psutil.Process(hog.pid).cpu_times()[:2]) for hog in hogs]
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        if (state_dir / "endpoints").is_dir():  # the demo leaves its production endpoints serving
            hosting = ProcessSupervisor(state_dir)
            for endpoint in hosting.list_endpoints():
                hosting.delete_endpoint(endpoint["name"])
    assert all(running) and min(busy_s) > 30, f"the hogs ran beside the whole demo and got CPU: {busy_s} s"
    ended = {label: status for label, status, _ in ENDED.findall(result.stderr)}
    tail = result.stderr[-4000:] + result.stdout[-3000:]
    assert ended == {label: expected for (label, *_), expected in zip(STEPS, EXPECTED, strict=True)}, tail
    assert "did not go as designed" not in result.stderr and result.returncode == 0, tail
