"""One run of a sweep's candidate at a time (issue 48): each candidate's evaluation holds the candidate's lease (the
promotion lease's table and rules, keyed by the candidate's release), so two runs of one sweep (two `sweep run`s, or
one beside an Airflow or Step Functions run) never evaluate the same candidate at once, while different candidates go
on in parallel. The candidate's release is a fake here (it records who ran it and can be held mid-evaluation); the
sweep, its ledger and the leases are real."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from shiplift.tasks.backends.pricing import load_price_table
from shiplift.tasks.backends.registry import make_backends, open_ledger
from shiplift.tasks.errors import LeaseHeld
from shiplift.tasks.ledger import events
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.pipeline.release import prepare_release
from shiplift.tasks.sweeps import records as sweep_records
from shiplift.tasks.sweeps import run as sweep_run
from shiplift.tasks.sweeps.orchestrated import evaluate_orchestrated, teardown_orchestrated
from shiplift.tasks.sweeps.records import CANDIDATE_LEASE_TTL_S, candidate_lease_key, open_sweep
from shiplift.tasks.sweeps.run import evaluate_and_record
from tests.unit.test_sfn_sweep import tiny_sweep

WAIT_S = 30.0  # the most a test waits for a thread it started to reach a point (never reached: the test fails)


def quiet(message: str) -> None:
    """Progress lines are not what these tests read."""


class FakeEvaluation:
    """Stands in for `evaluate_candidate`: notes each candidate it runs and by whom; one named in `held` signals
    `started[name]`, then waits for `go` before it returns its payload."""

    def __init__(self, held: tuple[str, ...] = ()):
        self.ran: list[tuple[str, str]] = []
        self.started = {name: threading.Event() for name in held}
        self.go = threading.Event()

    def __call__(self, sweep, candidate, ledger, table, *, actor: str, progress) -> dict:
        self.ran.append((candidate.name, actor))
        if candidate.name in self.started:
            self.started[candidate.name].set()
            assert self.go.wait(WAIT_S), "the test never let the held evaluation finish"
        return {"candidate": candidate.name, "release_id": candidate.release_id,
                "config_sha256": candidate.config_sha256, "evaluated_by": actor,
                "evidence": {"metrics": {"accuracy": 0.5, "valid_rate": 1.0, "p95_ms": 10.0}}}


@pytest.fixture
def sweep(tmp_path, tiny_release, monkeypatch):
    """The tiny sweep (candidates Q8_0 and F16), opened in its local ledger, each candidate's release faked."""
    found = tiny_sweep(tmp_path, tiny_release, ledger_url=None)
    ledger = make_backends(found.base).ledger  # creates the ledger, as a run's first step does
    open_sweep(ledger, found, actor="opener")
    ledger.close()
    monkeypatch.setattr(sweep_records, "CANDIDATE_POLL_S", 0.05)  # a waiting run looks again at once
    return found


class Run(threading.Thread):
    """One run's `evaluate_and_record` of a candidate in a thread of its own, with its own ledger connection (as a
    second `sweep run` process has); `result` or `error` once it ends. `waiting` is set when it says it waits."""

    def __init__(self, sweep, name: str, actor: str, **options):
        super().__init__(name=f"run-{actor}", daemon=True)
        self.sweep, self.candidate, self.actor, self.options = sweep, sweep.candidate(name), actor, options
        self.waiting = threading.Event()
        self.result: dict | None = None
        self.error: BaseException | None = None

    def say(self, message: str) -> None:
        if "waiting up to" in message:
            self.waiting.set()

    def run(self) -> None:
        ledger = open_ledger(state_dir=self.sweep.base.backend.state_dir)
        try:
            self.result = evaluate_and_record(self.sweep, self.candidate, ledger, load_price_table().once(),
                                              actor=self.actor, progress=self.say, **self.options)
        except BaseException as exc:
            self.error = exc
        finally:
            ledger.close()

    def finished(self) -> BaseException | dict | None:
        self.join(WAIT_S)
        assert not self.is_alive(), f"{self.name} did not finish"
        return self.error or self.result


def sweep_events(sweep) -> list[tuple[str, str]]:
    """(event, candidate) of the sweep's own records after its opening."""
    ledger = open_ledger(state_dir=sweep.base.backend.state_dir)
    try:
        return [(r.event, r.payload["candidate"]) for r in ledger.release(sweep.sweep_id)[1:]]
    finally:
        ledger.close()


def test_a_second_run_of_the_same_candidate_is_refused_or_waits_and_reads_the_evidence(sweep, monkeypatch):
    fake = FakeEvaluation(held=("Q8_0",))
    monkeypatch.setattr(sweep_run, "evaluate_candidate", fake)
    first = Run(sweep, "Q8_0", "alice")
    first.start()
    assert fake.started["Q8_0"].wait(WAIT_S)

    # an orchestrated run does not hold a worker to wait: refused at once, naming the holder, and nothing recorded
    with pytest.raises(LeaseHeld, match=r"candidate Q8_0 is being evaluated by another run.*alice/pid-") as refused:
        evaluate_orchestrated(sweep.path, "Q8_0", actor="airflow:sweep_tiny-sweep/run-2", progress=quiet)
    assert "run this step or `shiplift sweep run` again" in str(refused.value)
    # nor does its teardown (its Catch path on Step Functions) remove the endpoint of the run evaluating the candidate
    candidate = sweep.candidate("Q8_0")
    ledger = open_ledger(state_dir=sweep.base.backend.state_dir)
    prepare_release(candidate.config, sweep.base_path, make_backends(candidate.config, ledger=ledger), actor="alice",
                    progress=quiet).record_opened()  # as the held evaluation's own release opens
    with pytest.raises(LeaseHeld, match="alice/pid-"):
        teardown_orchestrated(sweep.path, "Q8_0", actor="stepfunctions:exec-2", progress=quiet)
    assert ReleaseState.load(ledger, candidate.release_id).stage(events.TEARDOWN)["status"] == "pending"
    ledger.close()
    # a second CLI run waits for the holder, then reads the evidence it recorded instead of evaluating again
    second = Run(sweep, "Q8_0", "bob")
    second.start()
    assert second.waiting.wait(WAIT_S)
    assert fake.ran == [("Q8_0", "alice")]
    fake.go.set()
    recorded = first.finished()
    assert isinstance(recorded, dict) and second.finished() == recorded
    assert fake.ran == [("Q8_0", "alice")], "the candidate was evaluated once"
    assert sweep_events(sweep) == [(events.EVALUATED, "Q8_0")]  # no failure recorded for the refused or the waiter
    ledger = open_ledger(state_dir=sweep.base.backend.state_dir)
    with ledger.acquire_lease(candidate_lease_key(candidate), "anyone", candidate.release_id, 60):
        pass  # both runs gave the candidate's lease back
    ledger.close()


def test_a_run_that_waits_past_its_deadline_is_refused_with_the_holder_named(sweep, monkeypatch):
    fake = FakeEvaluation(held=("Q8_0",))
    monkeypatch.setattr(sweep_run, "evaluate_candidate", fake)
    first = Run(sweep, "Q8_0", "alice")
    first.start()
    assert fake.started["Q8_0"].wait(WAIT_S)
    late = Run(sweep, "Q8_0", "bob", wait_s=0.2)
    late.start()
    error = late.finished()
    assert late.waiting.is_set() and isinstance(error, LeaseHeld) and "alice/pid-" in str(error)
    fake.go.set()
    assert isinstance(first.finished(), dict)
    assert fake.ran == [("Q8_0", "alice")] and sweep_events(sweep) == [(events.EVALUATED, "Q8_0")]


def test_different_candidates_are_evaluated_in_parallel(sweep, monkeypatch):
    fake = FakeEvaluation(held=("Q8_0",))
    monkeypatch.setattr(sweep_run, "evaluate_candidate", fake)
    first = Run(sweep, "Q8_0", "alice")
    first.start()
    assert fake.started["Q8_0"].wait(WAIT_S)
    # while Q8_0 is held mid-evaluation, another run (a Step Functions execution) evaluates F16 to the end
    other = evaluate_orchestrated(sweep.path, "F16", actor="stepfunctions:exec-2", progress=quiet)
    assert other["candidate"] == "F16" and first.is_alive()
    fake.go.set()
    assert isinstance(first.finished(), dict)
    assert sorted(fake.ran) == [("F16", "stepfunctions:exec-2"), ("Q8_0", "alice")]
    assert sorted(sweep_events(sweep)) == [(events.EVALUATED, "F16"), (events.EVALUATED, "Q8_0")]


def test_a_crashed_run_s_candidate_is_taken_over(sweep, monkeypatch):
    """A run that died holding a candidate (its process gone) does not block it: the next run takes it over at once
    and evaluates it."""
    fake = FakeEvaluation()
    monkeypatch.setattr(sweep_run, "evaluate_candidate", fake)
    candidate = sweep.candidate("F16")
    crash = ("import sys\nfrom shiplift.tasks.backends.registry import make_backends, open_ledger\n"
             "open_ledger(state_dir=sys.argv[1]).acquire_lease(sys.argv[2], 'carol/pid-1', sys.argv[3], "
             "float(sys.argv[4]), by_this_process=True)\n")  # exits holding it, as a killed run does
    subprocess.run([sys.executable, "-c", crash, str(sweep.base.backend.state_dir), candidate_lease_key(candidate),
                    candidate.release_id, str(CANDIDATE_LEASE_TTL_S)], check=True, timeout=120)
    said: list[str] = []
    ledger = open_ledger(state_dir=sweep.base.backend.state_dir)
    evaluate_and_record(sweep, candidate, ledger, load_price_table().once(), actor="dave", progress=said.append,
                        wait_s=0.0)
    ledger.close()
    assert fake.ran == [("F16", "dave")]
    assert any("took F16 over from 'carol/pid-1'" in line and "is gone" in line for line in said), said
