"""The demo says where it departed from its design, step by step, instead of only exiting 1."""

from __future__ import annotations

from shiplift.tasks.cli.demo import EXPECTED, STEPS, departures


def rows_ending(statuses: list[str]) -> list[tuple[str, dict]]:
    return [(label, {"status": status}) for (label, *_), status in zip(STEPS, statuses, strict=True)]


def test_a_demo_that_went_as_designed_has_nothing_to_say():
    assert departures(rows_ending(EXPECTED), {"ok": True, "problems": []}) == []


def test_each_step_that_ended_otherwise_is_named_with_both_outcomes_and_a_bad_ledger_too():
    statuses = list(EXPECTED)
    statuses[4] = "rejected"  # the canary, as a busy machine's p95 latency makes it
    said = departures(rows_ending(statuses), {"ok": False, "problems": ["seq 3: hash mismatch"]})
    assert len(said) == 2
    assert STEPS[4][0] in said[0] and "ended rejected, not promoted" in said[0] and "Demo thresholds" in said[0]
    assert said[1] == "The ledger did not verify: ['seq 3: hash mismatch']"
