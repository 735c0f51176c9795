"""What a sweep knows of each candidate: its hourly price while it runs, and its gate report read as the evidence the
selection rule judges (`validation.sweep_rule.CandidateEvidence`)."""

from __future__ import annotations

from typing import Any

from shiplift.tasks.backends.pricing import (
    NOMINAL_REGION,
    HourlyCost,
    PriceTable,
    hourly_cost,
    serverless_cost,
    throughput_cost,
)
from shiplift.tasks.config_release import ReleaseConfig
from shiplift.validation.sweep_rule import CandidateEvidence, champion_interval_key

# the gate report's comparison rows (validation.gates.comparison_row) → the rule's metric names
COMPARED = {"accuracy": "accuracy", "ece": "ece", "validity": "valid_rate", "p95_latency_ms": "p95_ms"}
PERCENTILES = ("p50", "p95", "p99")


def candidate_hourly(config: ReleaseConfig, table: PriceTable) -> HourlyCost:
    """What one candidate costs per hour while it runs: one instance of its placement's priced type (a pool's first,
    a MIG layout's whole instance) in its region (a local release: NOMINAL_REGION, as the gate prices it); serverless
    bills per request and has no hourly figure (`usd_per_hour` None, `missing` says why)."""
    placement = config.placement
    region = config.backend.region if config.backend.kind == "aws" else NOMINAL_REGION
    if placement.kind == "serverless":
        return serverless_cost(region, placement, what="a candidate")
    if placement.kind == "instance_pool":
        instance_type = min(placement.pools, key=lambda p: p.priority).instance_type
    else:
        instance_type = placement.instance_type
    whole = (f"a MIG layout bills its whole {instance_type}, idle partitions included"
             if placement.kind == "mig_partition" else "")
    return hourly_cost(table, region, instance_type, 1, what="a candidate", whole_instance=whole)


def _value(part: Any) -> float | None:
    return part.get("value") if isinstance(part, dict) else None


def _measured(metrics: dict) -> tuple[dict[str, float | None], dict[str, tuple[float, float]]]:
    """The rule's metrics a gate's metrics block holds, and the intervals it gives them."""
    latency = metrics.get("latency_ms") or {}
    parts = {"accuracy": metrics.get("accuracy"), "ece": metrics.get("ece"), "valid_rate": metrics.get("validity"),
             **{f"{p}_ms": latency.get(p) for p in PERCENTILES}}
    values = {name: _value(part) for name, part in parts.items()}
    intervals = {name: tuple(part["ci"]) for name, part in parts.items()
                 if isinstance(part, dict) and part.get("ci") is not None and None not in part["ci"]}
    return values, intervals


def evidence_of(name: str, config_sha256: str, report: dict, hourly: HourlyCost,
                items_per_request: int) -> CandidateEvidence:
    """A candidate's evidence from its gate report: accuracy, ECE, valid answers, latency percentiles (each with its
    bootstrap interval), the paired (candidate - champion) interval of every metric the gate compared with the champion
    (`<metric>_vs_champion`), $/h while it runs, and $ per 1M decisions at the throughput the gate measured
    (usd_per_hour / decisions per hour x 1e6)."""
    metrics = report.get("metrics") or {}
    values, intervals = _measured(metrics)
    for row in (report.get("champion") or {}).get("comparison") or []:
        metric = COMPARED.get(row.get("metric"))
        ci = row.get("difference_ci")
        if metric and row.get("paired") and ci is not None and None not in ci:
            intervals[champion_interval_key(metric)] = tuple(ci)
    per_second = (metrics.get("throughput") or {}).get("answers_per_second")
    values["usd_per_hour"] = hourly.usd_per_hour
    values["usd_per_1m_decisions"] = (
        throughput_cost(hourly, per_second / items_per_request, items_per_request).per_million_decisions
        if per_second and hourly.usd_per_hour is not None else None)
    return CandidateEvidence(name=name, config_sha256=config_sha256, metrics=values, intervals=intervals)


def champion_evidence(report: dict, champion_config: dict | None, config_hash: str,
                      table: PriceTable) -> CandidateEvidence | None:
    """The champion as the gate measured it beside the candidate (None when none served): its metrics from the gate
    report, its hourly price from its own release config."""
    champion = report.get("champion") or {}
    if not champion.get("present"):
        return None
    values, intervals = _measured(champion.get("metrics") or {})
    release = ((report.get("extra") or {}).get("release") or {}).get("champion_release") or "champion"
    hourly = candidate_hourly(ReleaseConfig.model_validate(champion_config), table) if champion_config else None
    values["usd_per_hour"] = hourly.usd_per_hour if hourly else None
    return CandidateEvidence(name=f"champion {release}", config_sha256=config_hash, metrics=values,
                             intervals=intervals)
