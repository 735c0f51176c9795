"""A sweep's speeds on one scale (issue 48): candidates are gated at different times (one after another, or several at
once), so a latency measured on a busy machine would lose to one measured on an idle machine. Each candidate's gate
also timed the champion, alternated with the candidate, in the same window. The champion's median latency there says
how loaded the machine was for that gate. So the candidate's speed is read beside it:

    load_i = champion median in gate i / median over the sweep's gates of the champion median
    side-by-side value = measured value / load_i      (p50, p95, p99 latency and $ per 1M decisions)

Every candidate is thus judged as if it had been measured when the champion ran at its typical speed in this sweep;
the order of two candidates on a speed metric is the order of their measured ratios to the champion. Accuracy, ECE,
validity and $/h do not depend on load and are left as measured. Pure logic on recorded numbers: `shiplift sweep
explain` applies it again to the ledger's evidence. docs/sweeps.md, "Speeds side by side", says it for users.

Where a candidate's gate timed no champion (no champion served), or the champion changed during the sweep, there is
no common yardstick: every speed stays as measured, and the scale's note says why.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from shiplift.tasks.errors import BadInput
from shiplift.validation.sweep_rule import CandidateEvidence, champion_interval_key, fmt

Basis = Literal["side_by_side", "as_measured"]
SIDE_BY_SIDE: Basis = "side_by_side"
AS_MEASURED: Basis = "as_measured"
# metrics that scale with the time a request takes (divided by the load factor), and their intervals
SCALED = ("p50_ms", "p95_ms", "p99_ms", "usd_per_1m_decisions")
SCALED_INTERVALS = frozenset({*SCALED, *(champion_interval_key(m) for m in SCALED)})


@dataclass(frozen=True)
class GateWindow:
    """What one candidate's gate measured of the champion beside it: which release, and its median latency in ms
    (None: the gate timed no champion)."""

    champion_release: str | None
    champion_p50_ms: float | None

    @classmethod
    def of(cls, evaluated: Mapping[str, Any]) -> GateWindow:
        """The window of a `sweep/evaluated` payload (its `champion` evidence as the gate measured it)."""
        champion = evaluated.get("champion") or {}
        return cls(evaluated.get("champion_release"), (champion.get("metrics") or {}).get("p50_ms"))


@dataclass(frozen=True)
class SpeedScale:
    """How a sweep's speeds were put on one scale: the basis, the champion's reference median (ms), each candidate's
    load factor (1.0 where the basis is as measured) and the champion's median in its gate, and a line saying so."""

    basis: Basis
    reference_ms: float | None
    loads: dict[str, float] = field(default_factory=dict)
    champion_p50_ms: dict[str, float | None] = field(default_factory=dict)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (sweep-report.json's `speed`, `sweep explain --json`)."""
        return {"basis": self.basis, "reference_ms": self.reference_ms, "loads": dict(sorted(self.loads.items())),
                "champion_p50_ms": dict(sorted(self.champion_p50_ms.items())), "note": self.note}


def _scaled(evidence: CandidateEvidence, load: float) -> CandidateEvidence:
    """`evidence` with every time-dependent metric and interval divided by `load`."""
    metrics = {k: (v / load if k in SCALED and v is not None else v) for k, v in evidence.metrics.items()}
    intervals = {k: ((low / load, high / load) if k in SCALED_INTERVALS else (low, high))
                 for k, (low, high) in evidence.intervals.items()}
    return CandidateEvidence(name=evidence.name, config_sha256=evidence.config_sha256, metrics=metrics,
                             intervals=intervals)


def _no_common_yardstick(evidence: Sequence[CandidateEvidence], windows: Mapping[str, GateWindow]) -> str | None:
    """Why the candidates' speeds cannot be put on the champion's scale, or None when they can."""
    alone = [e.name for e in evidence if windows[e.name].champion_p50_ms is None]
    if alone:
        return f"no champion was timed beside {', '.join(alone)}"
    releases = sorted({windows[e.name].champion_release or "unnamed" for e in evidence})
    if len(releases) > 1:
        return f"the champion changed during the sweep ({', '.join(releases)})"
    return None


def on_one_scale(evidence: Sequence[CandidateEvidence],
                 windows: Mapping[str, GateWindow]) -> tuple[list[CandidateEvidence], SpeedScale]:
    """Every candidate's evidence with its speeds divided by its gate's load factor (module doc), and the scale; as
    measured, with the reason, where the gates share no champion to read the load from. `windows`: candidate name →
    its gate's window (BadInput when one is missing or a median is not positive)."""
    missing = sorted({e.name for e in evidence} - set(windows))
    if missing:
        raise BadInput(f"no gate window for {', '.join(missing)}", fix="pass the window of every candidate's gate")
    medians = {e.name: windows[e.name].champion_p50_ms for e in evidence}
    bad = sorted(name for name, ms in medians.items() if ms is not None and not ms > 0)
    if bad:
        raise BadInput(f"the champion's median latency in the gate of {', '.join(bad)} is not positive",
                       fix="record the champion's latency as the gate measured it (ms > 0)")
    why_not = _no_common_yardstick(evidence, windows) if evidence else "no candidate was evaluated"
    if why_not:
        return list(evidence), SpeedScale(AS_MEASURED, None, {e.name: 1.0 for e in evidence}, medians,
                                          f"speeds as measured, not side by side: {why_not}")
    reference = statistics.median(medians.values())
    loads = {name: ms / reference for name, ms in medians.items()}
    spread = f"{fmt(min(loads.values()))}–{fmt(max(loads.values()))}"
    return [_scaled(e, loads[e.name]) for e in evidence], SpeedScale(
        SIDE_BY_SIDE, reference, loads, medians,
        f"speeds side by side: each candidate's latencies and $ per 1M decisions divided by its gate's load factor "
        f"(the champion's median latency in that gate over its median across the sweep's gates, {fmt(reference)} "
        f"ms); load factors {spread}")


def scaled_champion(champion: CandidateEvidence | None, window: GateWindow | None,
                    scale: SpeedScale) -> CandidateEvidence | None:
    """The champion as a report draws it beside the candidates: on the same scale as they are (its median becomes the
    reference), or as measured where they are."""
    if champion is None or window is None or scale.basis == AS_MEASURED:
        return champion
    return _scaled(champion, window.champion_p50_ms / scale.reference_ms)
