"""The ledger dates canary traffic as it happens (issue 21, part 1): a real local canary of tiny releases records each
traffic step and each bake verdict the moment it happens, so `ledger as-of` at a moment between two batches names both
releases with their copies; a promote killed between two steps resumes without duplicating or losing a step record."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from shiplift.tasks.backends.interfaces import RolloutStep
from shiplift.tasks.ledger.release_state import ReleaseState
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.ledger.views import as_of, rollout_steps, serving_changes, timeline
from shiplift.tasks.pipeline.release import run_release

MODEL = "tiny-decision"
QUIET = lambda message: None  # noqa: E731
BAKE_S = 2
CANARY = {"strategy": "canary", "copies": 2, "wait_interval_s": BAKE_S, "maximum_execution_timeout_s": 600,
          "alarms": {"max_error_rate": 0.05, "min_invocations": 3, "check_interval_s": 0.25}}
TS = "%Y-%m-%dT%H:%M:%S.%fZ"


def _at(text: str) -> datetime:
    return datetime.strptime(text, TS).replace(tzinfo=UTC)


def _between(earlier: str, later: str) -> str:
    """The moment halfway between two recorded times, as the ledger writes times."""
    a, b = _at(earlier), _at(later)
    return (a + (b - a) / 2).strftime(TS)


def _records(ledger: Ledger, release_id: str, stage: str, event: str) -> list:
    return [r for r in ledger.release(release_id) if (r.stage, r.event) == (stage, event)]


@pytest.fixture(scope="module")
def canaries(tmp_path_factory, tiny_release):
    """A deployed whole; B rolled onto production by a canary; C's canary killed during its first bake, then resumed."""
    from shiplift.tasks.pipeline.bake import BakeWatch

    root = tmp_path_factory.mktemp("as-of-rollout")
    state_dir = root / "state"
    config = tiny_release.write_tiny_config(root / "configs", state_dir, rollout=CANARY)
    try:
        a = run_release(config, progress=QUIET)
        b = run_release(config, overrides=("validation.seed=1",), progress=QUIET)
        assert (a["status"], b["status"]) == ("promoted", "promoted"), (a, b)

        def killed(self, step):
            raise KeyboardInterrupt("the pipeline was killed during the first bake")

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(BakeWatch, "__call__", killed)
            with pytest.raises(KeyboardInterrupt):
                run_release(config, overrides=("validation.seed=2",), progress=QUIET)
        c = run_release(config, overrides=("validation.seed=2",), progress=QUIET)
        assert c["status"] == "promoted", c
        ledger = Ledger.for_sqlite(state_dir / "ledger.db")
        yield {"state_dir": state_dir, "ledger": ledger, "a": a["release_id"], "b": b["release_id"],
               "c": c["release_id"]}
        ledger.close()
    finally:
        tiny_release.stop_endpoints(state_dir)


# the canaries fixture: ~40 s, make test-slow; make test keeps
# test_a_rerun_appends_no_step_twice_and_numbers_sagemakers_checks_on below
@pytest.mark.slow
def test_each_traffic_step_is_recorded_when_it_happens(canaries):
    ledger, a, b = canaries["ledger"], canaries["a"], canaries["b"]
    steps = _records(ledger, b, "traffic", "step")
    verdicts = _records(ledger, b, "bake", "verdict")
    promoted = _records(ledger, b, "promote", "succeeded")[0]
    assert [(s.payload["batch"], s.payload["old_copies"], s.payload["new_copies"], s.payload["from_release"])
            for s in steps] == [(1, 1, 1, a), (2, 0, 2, a)]
    assert [(v.payload["batch"], v.payload["alarm"]) for v in verdicts] == [(1, None), (2, None)]
    order = [steps[0], verdicts[0], steps[1], verdicts[1], promoted]
    assert [r.seq for r in order] == sorted(r.seq for r in order), "step, its verdict, the next step, …, then promote"
    baked = (_at(steps[1].recorded_at) - _at(steps[0].recorded_at)).total_seconds()
    assert baked >= BAKE_S, f"batch 2 was recorded {baked:.3f}s after batch 1: not when it shifted, after the bake"
    assert (_at(verdicts[0].recorded_at) - _at(steps[0].recorded_at)).total_seconds() >= BAKE_S
    assert steps[0].payload["live"]["release_id"] == b and steps[0].payload["live"]["copies"] == 2
    assert all(set(v.payload["alarm_states"].values()) <= {"OK"} for v in verdicts), "no traffic, no alarm"
    merged = promoted.payload["steps"]  # the stage's record lists every step with its verdict and their times
    assert [(s["batch"], s["at"], s["baked_at"]) for s in merged] == [
        (1, steps[0].recorded_at, verdicts[0].recorded_at), (2, steps[1].recorded_at, verdicts[1].recorded_at)]
    assert merged == rollout_steps(ledger.release(b))


# the canaries fixture: ~40 s, make test-slow; make test keeps
# test_a_rerun_appends_no_step_twice_and_numbers_sagemakers_checks_on below
@pytest.mark.slow
def test_as_of_between_two_batches_names_both_releases_with_their_copies(canaries, capsys):
    from shiplift.tasks.cli.main import main

    ledger, a, b = canaries["ledger"], canaries["a"], canaries["b"]
    steps = _records(ledger, b, "traffic", "step")
    promoted = _records(ledger, b, "promote", "succeeded")[0]
    before = _records(ledger, a, "promote", "succeeded")[0]

    assert as_of(ledger, MODEL, _between(before.recorded_at, steps[0].recorded_at))["serving"] == [
        {"release_id": a, "copies": 2, "share": 1.0, "since": before.recorded_at}]
    mid = as_of(ledger, MODEL, _between(steps[0].recorded_at, steps[1].recorded_at))
    assert mid["release_id"] == a, "the last completed promotion is still A's"
    assert mid["serving"] == [{"release_id": a, "copies": 1, "share": 0.5, "since": before.recorded_at},
                              {"release_id": b, "copies": 1, "share": 0.5, "since": steps[0].recorded_at}]
    assert (mid["rollout"]["release_id"], mid["rollout"]["from_release"], mid["rollout"]["step"]["batch"]) == (b, a, 1)
    last = as_of(ledger, MODEL, _between(steps[1].recorded_at, promoted.recorded_at))
    assert [(s["release_id"], s["copies"])
            for s in last["serving"]] == [(b, 2)], "every copy is B's before promote ends"
    done = as_of(ledger, MODEL, promoted.recorded_at)
    assert done["release_id"] == b and done["rollout"] is None
    assert done["serving"] == [{"release_id": b, "copies": 2, "share": 1.0, "since": promoted.recorded_at}]

    moment = _between(steps[0].recorded_at, steps[1].recorded_at)
    code = main(["ledger", "as-of", MODEL, moment, "--state-dir", str(canaries["state_dir"])])
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.startswith((a, b))]
    assert code == 0 and [row[:3] for row in rows] == [[a, "1", "0.5"], [b, "1", "0.5"]], out


# the canaries fixture: ~40 s, make test-slow; make test keeps
# test_a_rerun_appends_no_step_twice_and_numbers_sagemakers_checks_on below
@pytest.mark.slow
def test_the_timeline_shows_the_steps_at_their_real_times(canaries):
    ledger, b = canaries["ledger"], canaries["b"]
    events = [e for e in timeline(ledger, MODEL) if e["release_id"] == b
              and e["event"] in ("traffic", "bake", "promoted")]
    steps = _records(ledger, b, "traffic", "step")
    assert [e["event"] for e in events] == ["traffic", "bake", "traffic", "bake", "promoted"]
    assert [e["at"] for e in events if e["event"] == "traffic"] == [s.recorded_at for s in steps]
    assert events[0]["detail"] == f"rollout batch 1/2: 1 old ({canaries['a']}), 1 new"
    assert events[1]["detail"] == "rollout batch 1/2 baked: the new copies had no answers to judge", \
        "no traffic, no alarm"
    changes = [c for c in serving_changes(ledger.history(MODEL)) if c["rollout"] and c["rollout"]["release_id"] == b]
    assert [[s["copies"] for s in c["serving"]] for c in changes] == [[1, 1], [2]]


# the canaries fixture: ~40 s, make test-slow; make test keeps
# test_a_rerun_appends_no_step_twice_and_numbers_sagemakers_checks_on below
@pytest.mark.slow
def test_a_promote_killed_between_two_steps_resumes_without_duplicating_or_losing_one(canaries):
    ledger, b, c = canaries["ledger"], canaries["b"], canaries["c"]
    steps = _records(ledger, c, "traffic", "step")
    assert [(s.payload["phase"], s.payload["batch"], s.payload["old_copies"], s.payload["new_copies"])
            for s in steps] == [
        ("rollout", 1, 1, 1), ("rollout", 2, 0, 2)], "batch 1 once (before the kill), batch 2 once (the rerun)"
    assert [v.payload["batch"] for v in _records(ledger, c, "bake", "verdict")] == [2], "batch 1's bake never ended"
    starts = _records(ledger, c, "promote", "started")
    assert len(starts) == 2 and starts[0].seq < steps[0].seq < starts[1].seq < steps[1].seq
    merged = _records(ledger, c, "promote", "succeeded")[0].payload["steps"]
    assert [(s["batch"], s["at"]) for s in merged] == [(1, steps[0].recorded_at), (2, steps[1].recorded_at)]
    assert "baked_at" not in merged[0] and merged[1]["baked_at"]
    # half-rolled while it was down
    crashed = as_of(ledger, MODEL, _between(steps[0].recorded_at, steps[1].recorded_at))
    assert [(s["release_id"], s["copies"]) for s in crashed["serving"]] == [(b, 1), (c, 1)]
    assert ledger.verify().ok


class _Context:
    """The little of a stage context a TrafficLog uses, over a real ledger."""

    def __init__(self, ledger: Ledger, release_id: str = "m-000000000001"):
        self.release_id, self.config = release_id, SimpleNamespace(name="m")
        self.backends, self.state, self.said = SimpleNamespace(ledger=ledger), ReleaseState(ledger, release_id), []

    def record(self, stage: str, event: str, payload: dict) -> None:
        self.backends.ledger.append(release_id=self.release_id, model="m", stage=stage, event=event, payload=payload,
                                    actor="pytest")
        self.state.refresh()

    def say(self, message: str) -> None:
        self.said.append(message)


def _log(ctx: _Context):
    from shiplift.tasks.pipeline.stages.promote import TrafficLog

    return TrafficLog(ctx, endpoint="ep", component="c", strategy="canary", bake=SimpleNamespace(evidence={}),
                      describe=lambda: None)


def test_a_rerun_appends_no_step_twice_and_numbers_sagemakers_checks_on(tmp_path):
    ledger = Ledger.for_sqlite(tmp_path / "ledger.db")
    ctx = _Context(ledger)
    ctx.record("promote", "started", {})
    batch = RolloutStep(phase="rollout", batch=1, batches=2, old_copies=1, new_copies=1, new_spec_sha256="a" * 64)
    log = _log(ctx)
    log("shifted", batch)
    log("baked", batch)
    rerun = _log(ctx)  # the promote stage run again after a crash: the same attempt
    rerun("shifted", batch)
    rerun("baked", batch)
    assert [(r.stage, r.event) for r in ledger.release(ctx.release_id)][1:] == [("traffic", "step"),
                                                                                ("bake", "verdict")]
    assert len(ctx.said) == 2 and "not appended again" in ctx.said[0]

    check = RolloutStep(phase="rollout", check=1, batches=2, copies=2, new_spec_sha256="a" * 64)
    rerun("shifted", check)
    again = _log(ctx)  # SageMaker's update followed again: its checks count from 1 once more
    again("shifted", check)
    again("baked", check)
    checks = [(r.stage, r.payload["check"]) for r in ledger.release(ctx.release_id) if r.payload.get("check")]
    assert checks == [("traffic", 1), ("traffic", 2), ("bake", 2)]

    ctx.record("promote", "succeeded", {})
    later = _log(ctx)  # a later promotion of the release (a rollback to it) is a new attempt with its own steps
    later("shifted", batch)
    assert [r.stage for r in ledger.release(ctx.release_id)][-1] == "traffic" and len(later.steps()) == 1
    ledger.close()
