"""The gate-wall bench's summary row, against hand-computed values (nothing here releases or times anything)."""

from __future__ import annotations

import pytest

from bench.gate_wall import Gate, summary


def gates(reuse: list[float], fresh: list[float], *, tasks: int = 111, reuse_requests: int = 32) -> dict:
    return {"reuse": [Gate(s, reuse_requests, tasks) for s in reuse], "fresh": [Gate(s, tasks, tasks) for s in fresh]}


def test_the_ratio_is_of_the_medians_and_the_bound_counts_candidate_and_champion_requests():
    row = summary(gates([300.0, 280.0, 290.0], [500.0, 450.0, 520.0]))
    assert row["value"] == pytest.approx(290.0 / 500.0)
    assert not row["ok"], "0.58x misses the 0.55x target"
    # reuse: 111 candidate + 32 champion requests; fresh: 111 + 111
    assert "request bound 0.64x" in row["detail"]
    assert "reuse min 280.0s median 290.0s, 32 champion requests" in row["detail"]
    assert "fresh min 450.0s median 500.0s, 111 champion requests" in row["detail"]
    assert "per round 0.60, 0.62, 0.56" in row["detail"] and "(111 tasks)" in row["name"]


def test_a_ratio_at_the_target_meets_it():
    row = summary(gates([55.0], [100.0], tasks=60, reuse_requests=8))
    assert row["ok"] and row["value"] == pytest.approx(0.55)
    assert "request bound 0.57x" in row["detail"]  # (60 + 8) / (60 + 60)
