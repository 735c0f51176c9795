"""A run of a release that stopped (killed, crashed) no longer blocks its own rerun for the lease's 4 h: the rerun takes
the lease over at once and records why; a different release, or a run of the same release that is alive, still fails
fast naming the holder (issue 18, item 6; the end-to-end kill is tests/e2e/test_release_local.py). Whether it stopped
is read from what the lease records of its process, never from its name (issue 44, tests/unit/test_lease_token.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from shiplift.tasks.errors import LeaseHeld
from shiplift.tasks.ledger.store import Lease, Ledger
from shiplift.tasks.pipeline import table
from shiplift.tasks.pipeline.release import stopped_holder

HOST = socket.gethostname()


def stamp(seconds_from_now: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds_from_now)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_of(*, host: str | None, pid: int | None, renewed_ago_s: float = 0.0) -> Lease:
    """A lease row as the ledger hands it to `stopped_holder`: what it records of the holder's process. Its holder's
    name says another host on purpose: liveness never reads it."""
    renewed = stamp(-renewed_ago_s)
    return Lease(model="gemma", holder="alice@somewhere-else/pid-1", release_id="rel-1", acquired_at=renewed,
                 expires_at=stamp(table.LEASE.ttl_s - renewed_ago_s), renewed_at=renewed, token="0" * 32, host=host,
                 pid=pid)


def dead_pid() -> int:
    """The pid of a process of this host that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          timeout=30)
    return int(done.stdout)


@pytest.fixture
def ledger(tmp_path):
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as opened:
        yield opened


def test_a_holder_whose_process_on_this_host_is_gone_has_stopped():
    pid = dead_pid()
    assert stopped_holder(lease_of(host=HOST, pid=pid)) == f"its process {pid} on {HOST} is gone"
    assert stopped_holder(lease_of(host=HOST, pid=os.getpid())) is None, "this very process is alive"
    assert stopped_holder(lease_of(host=HOST, pid=os.getppid())) is None


def test_a_holder_elsewhere_has_stopped_only_once_it_stops_renewing():
    elsewhere = dict(host="another-host", pid=dead_pid())  # its pid means nothing here
    assert stopped_holder(lease_of(**elsewhere)) is None
    silent = lease_of(**elsewhere, renewed_ago_s=3 * table.LEASE.renew_every_s + 60)  # 3 periods and a minute ago
    assert "last renewed the lease" in stopped_holder(silent)


def test_an_orchestrators_holder_is_never_judged_stopped():
    """Airflow's and Step Functions' holders renew only while a step runs: between steps only the TTL frees the
    lease."""
    assert stopped_holder(lease_of(host=None, pid=None, renewed_ago_s=3600)) is None


def test_the_same_release_takes_over_from_a_stopped_run_and_the_lease_says_so(ledger):
    ledger.acquire_lease("gemma", "dead-run", "rel-1", ttl_s=3600)
    lease = ledger.acquire_lease("gemma", "rerun", "rel-1", ttl_s=3600, stopped=lambda lease: f"{lease.holder} is gone")
    assert (lease.holder, lease.taken_over) == ("rerun", ("dead-run", "dead-run is gone"))
    with pytest.raises(LeaseHeld, match="'rerun'"):
        ledger.acquire_lease("gemma", "third", "rel-1", ttl_s=60, stopped=lambda lease: None)


def test_a_live_run_of_the_same_release_and_any_other_release_still_fail_fast(ledger):
    ledger.acquire_lease("gemma", "alive-run", "rel-1", ttl_s=3600)
    with pytest.raises(LeaseHeld, match="this same release, in another run that is still alive"):
        ledger.acquire_lease("gemma", "rerun", "rel-1", ttl_s=3600, stopped=lambda lease: None)
    with pytest.raises(LeaseHeld, match="'alive-run'"):  # a stopped holder of another release is not taken over
        ledger.acquire_lease("gemma", "other", "rel-2", ttl_s=3600, stopped=lambda lease: "gone")


def test_a_killed_process_not_yet_reaped_is_not_running():
    """A run killed by its parent's shell may linger as a zombie until reaped: it holds nothing, so it has stopped."""
    import signal
    import time

    from shiplift.tasks.processes import pid_running

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert pid_running(child.pid)
    child.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_running(child.pid):  # the kernel makes it a zombie once the signal is delivered
        assert time.monotonic() < deadline, "the killed child still reads as running"
        time.sleep(0.01)
    child.wait(timeout=10)
    assert not pid_running(child.pid) and pid_running(os.getpid())
