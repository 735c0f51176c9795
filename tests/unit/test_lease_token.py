"""A crashed run's lease is judged by what the lease records of its holder's process (random token, real host, pid,
last renewal), never by the actor's text (issue 44): a run with SHIPLIFT_ACTOR=bob@ops-host killed mid-stage is taken
over by the next run at once, and an actor naming this host cannot take the lease of a holder that runs elsewhere. Each
runs a real run in a subprocess, killed with SIGKILL while its stage runs, on SQLite and on PostgreSQL (the `backend`
fixture of tests/unit/conftest.py). A run refused for the lease appends nothing to the ledger."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shiplift.tasks.config import load_release_config
from shiplift.tasks.errors import LeaseHeld, LeaseLost
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline import release
from shiplift.tasks.pipeline.release import StageContext, holding_lease, run_holder

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = REPO_ROOT / "configs" / "releases" / "gemma-decision.yaml"
HOST = socket.gethostname()
TAKEOVER_BOUND_S = 10.0  # the rerun proceeds within this of the kill; before the fix it was refused for 15 min

# A run in its own process: its lease taken as `shiplift release` takes it (holding_lease, named by run_holder of the
# actor, SHIPLIFT_ACTOR when set), then a stage that says "mid-stage" and blocks until the process is killed.
# PRETEND_HOST makes the process report another host name, as a run on another machine would.
RUN = """
import os, socket, sys
from pathlib import Path
if os.environ.get("PRETEND_HOST"):
    socket.gethostname = lambda: os.environ["PRETEND_HOST"]
from shiplift.tasks.config import load_release_config
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.pipeline import release

class Backends:
    def __init__(self, ledger, state_dir):
        self.ledger, self.registry, self.state_dir = ledger, None, state_dir

def mid_stage(context):
    print("mid-stage", flush=True)
    sys.stdin.read()  # blocks: the test kills this process here
    return {}

url, schema, state_dir = sys.argv[1], sys.argv[2] or None, Path(sys.argv[3])
config = load_release_config(sys.argv[4])
ledger = Ledger(url, schema=schema)
rid = release.release_id_for(config)
ctx = release.StageContext(config=config, config_dir=state_dir, release_id=rid, state=ReleaseState(ledger, rid),
                           backends=Backends(ledger, state_dir), actor=release.default_actor(), progress=print)
with release.holding_lease(ctx, release.run_holder(ctx.actor)):
    release.run_stage(ctx, "build", function=mid_stage)
"""


class Backends:
    """What holding_lease and run_stage need of the backends: a ledger, no registry, a state dir."""

    def __init__(self, ledger: Ledger, state_dir: Path):
        self.ledger, self.registry, self.state_dir = ledger, None, state_dir


def _killed_mid_stage(backend, tmp_path: Path, *, actor: str, pretend_host: str | None = None) -> tuple[int, float]:
    """Start a run holding the lease, wait until its stage runs (it says so), SIGKILL it; its pid and the kill's
    time."""
    env = {**os.environ, "SHIPLIFT_ACTOR": actor, "PRETEND_HOST": pretend_host or ""}
    victim = subprocess.Popen([sys.executable, "-c", RUN, backend.url, backend.schema or "", str(tmp_path),
                               str(CONFIG)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, cwd=REPO_ROOT)
    try:
        said = ""
        while "mid-stage" not in said:  # each line blocks until the run says more, or it ends (then stdout closes)
            said = victim.stdout.readline()
            if not said:
                victim.wait(timeout=30)
                pytest.fail(f"the run ended before its stage: {victim.stderr.read()[-3000:]}")
        victim.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        victim.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL
    return victim.pid, killed_at


@pytest.fixture
def rerun(backend, tmp_path):
    """The next run of the same release, in this process (the test's own pid is alive)."""
    ledger = backend.open()
    config = load_release_config(CONFIG)
    rid = release.release_id_for(config)
    messages: list[str] = []
    ctx = StageContext(config=config, config_dir=tmp_path, release_id=rid, state=ReleaseState(ledger, rid),
                       backends=Backends(ledger, tmp_path), actor="bob@ops-host", progress=messages.append)
    yield ctx
    ledger.close()


def test_lease_token_a_run_with_a_custom_actor_killed_mid_stage_is_taken_over_at_once(backend, tmp_path, rerun):
    pid, killed_at = _killed_mid_stage(backend, tmp_path, actor="bob@ops-host")
    with holding_lease(rerun, run_holder(rerun.actor)):
        waited_s = time.monotonic() - killed_at
        [takeover] = [r for r in rerun.state.records if r.event == events.LEASE_TAKEN_OVER]
    assert waited_s < TAKEOVER_BOUND_S, f"the rerun waited {waited_s:.1f}s after the kill"
    assert takeover.payload["from_holder"] == f"bob@ops-host/pid-{pid}"
    assert takeover.payload["reason"] == f"its process {pid} on {HOST} is gone"
    assert takeover.actor == "bob@ops-host"


def test_lease_token_an_actor_naming_this_host_cannot_take_a_live_holders_lease(backend, tmp_path, rerun):
    """The holder runs on another machine (its process reports build-host-2; its pid means nothing here, and has no
    process here) with SHIPLIFT_ACTOR naming this host; it renewed the lease just now, so it is alive as far as this
    host can tell, and a rerun here is refused, naming it."""
    pid, _ = _killed_mid_stage(backend, tmp_path, actor=f"alice@{HOST}", pretend_host="build-host-2")
    with pytest.raises(LeaseHeld, match="still alive") as refused:
        with holding_lease(rerun, run_holder(rerun.actor)):
            pytest.fail("the lease of a live holder on another host was taken")
    assert f"'alice@{HOST}/pid-{pid}'" in refused.value.problem
    assert f"process {pid} on build-host-2" in refused.value.problem
    assert not [r for r in rerun.state.records if r.event == events.LEASE_TAKEN_OVER]


def test_lease_token_the_lease_records_token_host_and_pid_and_renews_by_token(backend):
    """A run's lease records its process apart from its name; renewing or giving it back takes its token, so another
    run recorded under the same name (the same actor on another host) cannot renew or give it back by name."""
    with backend.open() as ledger:
        lease = ledger.acquire_lease("gemma", "ops", "rel-1", 60, by_this_process=True)
        assert (lease.host, lease.pid, len(lease.token)) == (HOST, os.getpid(), 32)
        assert lease.renewed_at == lease.acquired_at
        with pytest.raises(LeaseLost):
            ledger.renew_lease("gemma", "ops", "rel-1", 60)  # by name: not this run's lease
        with pytest.raises(LeaseLost):
            ledger.renew_lease("gemma", "ops", "rel-1", 60, token="0" * 32)
        renewed = ledger.renew_lease("gemma", "ops", "rel-1", 120, token=lease.token)
        assert renewed.renewed_at >= lease.renewed_at and renewed.expires_at > lease.expires_at
        assert ledger.release_lease("gemma", "ops") is False and ledger.release_lease("gemma", "ops", token=lease.token)


def test_lease_token_a_run_refused_for_the_lease_appends_nothing(tiny_release, tmp_path):
    """`shiplift release` and an orchestrator's `begin` refused for the lease leave the ledger as it was: the lease is
    taken before `release/opened` is appended."""
    config = tiny_release.write_tiny_config(tmp_path / "configs", tmp_path / "state")
    (tmp_path / "state").mkdir()
    with Ledger.for_sqlite(tmp_path / "state" / "ledger.db") as ledger:
        with ledger.acquire_lease("tiny-decision", "someone-else@ci", "tiny-decision-other", 600):
            with pytest.raises(LeaseHeld, match="someone-else@ci"):
                release.run_release(config, progress=lambda message: None)
            with pytest.raises(LeaseHeld, match="someone-else@ci"):
                release.begin_orchestrated(config, holder="airflow:refresh/run-1", progress=lambda message: None)
            assert ledger.history() == []
        assert ledger.verify(allow_empty=True).n_records == 0
