"""What a model family's evaluation tells the gate report about its own parts (DESIGN §1, §8.3).

The gate report (`validation.gate_report`) knows no family: the words for what one scored row is, the headline
metrics, the family's own rows and sections, and how its requests carry its rows come from a `ReportParts` that the
family's evaluation hands `write_reports` (`validation.decisions.evaluate.DECISION_REPORT`,
`validation.nli.evaluate.NLI_REPORT`).
Kept apart from the report itself so that a family's module can name its parts without importing numpy or matplotlib.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Estimate = Mapping[str, Any]  # {"value", "ci", "n"}, as validation.metrics writes one


def no_rows(metrics: Mapping[str, Any]) -> Sequence[tuple[str, Estimate | None]]:
    """A family without rows of its own."""
    return ()


def no_confusions(report: Mapping[str, Any]) -> Sequence[tuple[str, Mapping[str, Any]]]:
    """A family without confusion matrices."""
    return ()


@dataclass(frozen=True, kw_only=True)
class ReportParts:
    """A family's parts of its gate report.

    `item` / `items`: what one scored row is (`task`, `pair`), in the summary's count row and the per-item table.
    `estimates`: the headline metrics (keys of the report's `metrics`) the family reads, each listed when measured.
    `labels`: what a reviewer reads for the family's own metric keys (summary and candidate-against-champion rows).
    `request_items`: where one request carries a batch of items, the key of an `extra.requests` row (each request's
    timing) that counts its items; latency is then counted over those requests, and each item's `latency_ms` is its
    share of its request's. None: one item a request, latency counted over the items.
    `family_rows`: the family's own headline rows after the estimates, as (metric key, estimate), from the metrics.
    `confusions`: the confusion matrices to draw, as (whose: candidate or champion, {true, predicted, counts}), from the
    report; none: no confusion-matrix section.
    """

    item: str
    items: str
    estimates: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    request_items: str | None = None
    family_rows: Callable[[Mapping[str, Any]], Sequence[tuple[str, Estimate | None]]] = no_rows
    confusions: Callable[[Mapping[str, Any]], Sequence[tuple[str, Mapping[str, Any]]]] = no_confusions

    @property
    def batched(self) -> bool:
        """One request carries a batch of items."""
        return self.request_items is not None

    @property
    def request(self) -> str:
        """What one request carries: `one task`, `one batch of pairs`."""
        return f"one batch of {self.items}" if self.batched else f"one {self.item}"
