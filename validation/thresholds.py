"""The gate thresholds a release config names: absolute limits per model kind and the champion rule.

Pydantic only (no numpy), so a config loads without the metrics code that applies them. `DefaultsUnwritten` lives
here, not with the config base (`tasks.config_types`), because validation imports no config code of tasks: the config
models of tasks import it from here.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

# How an absolute check reads its evidence: `bound` (the default, conservative) passes only when the whole bootstrap
# interval clears the threshold (its lower end for a floor, its upper end for a ceiling); `point` compares the point
# estimate alone. The champion comparison always uses the paired interval (`ChampionRule`).
DecisionRule = Literal["bound", "point"]
RULE_TEXT = {"bound": "interval bound", "point": "point estimate", "paired": "paired interval"}


class DefaultsUnwritten(BaseModel):
    """A config model whose fields named in `unwritten_defaults` (fields added after configs were released) are left
    out of its dump while at their default, so a config that leaves them so dumps, and hashes into a release id, as
    before they existed."""

    unwritten_defaults: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _defaults_unwritten(self, handler):
        data = handler(self)
        for name in self.unwritten_defaults:
            if getattr(self, name) == type(self).model_fields[name].default:
                data.pop(name, None)
        return data


class _SomeThreshold(BaseModel):
    """Refuses thresholds that are all off: such a gate judges nothing (a first release would go to production
    unchecked); an ad-hoc `shiplift eval` without threshold flags measures without any thresholds instead."""

    @model_validator(mode="after")
    def _one_is_on(self):
        if all(value is None for value in self.model_dump().values()):
            raise ValueError("every threshold is null, so the gate would judge nothing; set at least one (e.g. "
                             "min_accuracy), or leave thresholds out of an ad-hoc `shiplift eval` instead")
        return self


class DecisionThresholds(_SomeThreshold):
    """Absolute thresholds for a decision model; None switches a check off (accuracy and ECE must be written out,
    null included, so switching them off is a choice the config shows)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min_accuracy: float | None = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    max_ece: float | None = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_validity: float | None = Field(default=1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    max_p95_latency_ms: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)  # an SLO on this machine, ms
    min_allowed_token_mass: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)


class ChampionRule(DefaultsUnwritten):
    """Candidate must not be worse than the champion by more than `margin` (and, when set, slower at p95 by more than
    `max_p95_ratio` times), on paired intervals."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    unwritten_defaults: ClassVar[tuple[str, ...]] = ("reuse", "latency_sample")  # added with champion reuse

    metric: Literal["accuracy"] = "accuracy"
    margin: float = Field(default=0.02, ge=0.0, le=1.0, allow_inf_nan=False)
    min_samples: int = Field(default=30, ge=1)
    n_bootstrap: int = Field(default=1000, ge=100, le=100_000, description="resamples of the paired comparison")
    seed: int = Field(default=0, ge=0, description="seed of the paired comparison's resampling")
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0, allow_inf_nan=False)
    also_ece_margin: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)
    # candidate p95 latency / champion p95 latency, both measured alternately in one window on one machine, over the
    # requests both answered (a dimensionless ratio: 1.5 lets the candidate be 50 % slower at p95); None: not judged
    max_p95_ratio: float | None = Field(default=None, gt=1.0, le=100.0, allow_inf_nan=False)
    # one evaluation per gate (`validation.champion_reuse`): `recorded` reuses the champion's per-task results an
    # earlier gate measured on the same datasets, serving identity and determinism profile; `fresh` scores it again
    reuse: Literal["recorded", "fresh"] = "recorded"
    # how many of the gate's tasks a reused champion still answers live, alternated with the candidate: the latency
    # ratio's requests (at least min_samples when max_p95_ratio is judged)
    latency_sample: int = Field(default=30, ge=1)

    @model_validator(mode="after")
    def _sample_can_judge_the_ratio(self) -> ChampionRule:
        if self.max_p95_ratio is not None and self.latency_sample < self.min_samples:
            raise ValueError(f"validation.champion.latency_sample {self.latency_sample} is below min_samples "
                             f"{self.min_samples}, so a gate that reuses the champion's results could never judge "
                             f"max_p95_ratio; set latency_sample to at least {self.min_samples}")
        return self


class CacheCheckRule(BaseModel):
    """`validation.cache_check`: reuse must not change answers. A GGUF decision gate scores `sample` of its tasks cold
    and then warm on the candidate's prefix cache and fails when an option probability moves by more than `tolerance`
    (absolute; the check is validation/cache_check.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sample: int = Field(default=20, ge=1, le=10_000, description="gate tasks scored cold and warm")
    tolerance: float = Field(default=1e-4, ge=0.0, le=1.0, allow_inf_nan=False,
                             description="largest |warm - cold| option probability allowed")


class NliThresholds(_SomeThreshold):
    """Absolute thresholds for an NLI encoder; None switches a check off (the floors and ECE must be written out)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min_accuracy: float | None = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_macro_f1: float | None = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_class_recall: float | None = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    max_ece: float | None = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    min_validity: float | None = Field(default=1.0, ge=0.0, le=1.0, allow_inf_nan=False)
    max_p95_latency_ms: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
