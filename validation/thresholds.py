"""The gate thresholds a release config names: absolute limits per model kind and the champion rule.

Pydantic only (no numpy), so a config loads without the metrics code that applies them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class DecisionThresholds(BaseModel):
    """Absolute thresholds for a decision model; None switches a check off (and says so)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min_accuracy: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    max_ece: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_validity: float = Field(default=1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    max_p95_latency_ms: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    min_allowed_token_mass: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)


class ChampionRule(BaseModel):
    """Candidate must not be worse than the champion by more than `margin`, on paired intervals."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    metric: Literal["accuracy"] = "accuracy"
    margin: float = Field(default=0.02, ge=0.0, le=1.0, allow_inf_nan=False)
    min_samples: int = Field(default=30, ge=1)
    n_bootstrap: int = Field(default=1000, ge=100, le=100_000, description="resamples of the paired comparison")
    seed: int = Field(default=0, ge=0, description="seed of the paired comparison's resampling")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, allow_inf_nan=False)
    also_ece_margin: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)


class NliThresholds(BaseModel):
    """Absolute thresholds for an NLI encoder; max_p95_latency_ms None switches that check off."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min_accuracy: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_macro_f1: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_class_recall: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    max_ece: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_validity: float = Field(default=1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    max_p95_latency_ms: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
