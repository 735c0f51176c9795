"""A config field added after releases were made is left out of the config's dump while at its default
(`validation.thresholds.DefaultsUnwritten`), so an older config dumps, and hashes into its release id, exactly as before
the field existed; set to anything else, it is written. Each model's dump is compared whole with what it was before."""

from __future__ import annotations

import pytest

from shiplift.tasks.config_rollout import OnlineGate
from shiplift.tasks.families.base import InconclusiveConfig
from shiplift.tasks.families.gguf_decisions import DecisionGateConfig
from shiplift.tasks.families.onnx_nli import EncoderImage, NliGateConfig
from shiplift.validation.thresholds import CacheCheckRule, ChampionRule

BASE_IMAGE = "encoder@sha256:" + "a" * 64
CHAMPION = {"metric": "accuracy", "margin": 0.02, "min_samples": 30, "n_bootstrap": 1000, "seed": 0,
            "confidence": 0.95, "also_ece_margin": None, "max_p95_ratio": None}
DECISION_GATE = {"kind": "decisions", "datasets": [{"path": "builtin:decisions", "splits": None}], "concurrency": 2,
                 "request_timeout_s": 120.0, "deadline_s": 3600.0, "n_bootstrap": 1000, "seed": 0,
                 "thresholds": {"min_accuracy": 0.5, "max_ece": None, "min_validity": 1.0, "max_p95_latency_ms": None,
                                "min_allowed_token_mass": None},
                 "decision_rule": "bound", "champion": CHAMPION}
NLI_GATE = {"kind": "nli", "datasets": [{"path": "builtin:nli", "splits": None}], "concurrency": 1,
            "request_timeout_s": 120.0, "deadline_s": 3600.0, "n_bootstrap": 1000, "seed": 0,
            "thresholds": {"min_accuracy": 0.5, "max_ece": None, "min_macro_f1": None, "min_class_recall": None,
                           "min_validity": 1.0, "max_p95_latency_ms": None},
            "decision_rule": "bound", "champion": CHAMPION, "batch_size": 8}
ENCODER_IMAGE = {"kind": "encoder", "threads": 2, "base_image": BASE_IMAGE, "variant": "fp32", "device": "cpu",
                 "max_len": 512, "max_batch": 32, "truncation": "refuse", "max_in_flight": 4, "max_body_bytes": 1 << 20}
ASKING = {"choice": "ask", "extend": None}


def decision_gate(**fields) -> DecisionGateConfig:
    return DecisionGateConfig(datasets=[{"path": "builtin:decisions"}],
                              thresholds={"min_accuracy": 0.5, "max_ece": None}, **fields)


def nli_gate(**fields) -> NliGateConfig:
    return NliGateConfig(kind="nli", datasets=[{"path": "builtin:nli"}], thresholds={
        "min_accuracy": 0.5, "max_ece": None, "min_macro_f1": None, "min_class_recall": None}, **fields)


CASES = {
    "online gate at defaults": (OnlineGate(), {"split": "test", "max_tasks": 64, "rounds": 4, "concurrency": 1}),
    "online gate's extend_rounds set": (
        OnlineGate(extend_rounds=3), {"split": "test", "max_tasks": 64, "rounds": 4, "concurrency": 1,
                                      "extend_rounds": 3}),
    "champion rule at defaults": (ChampionRule(), CHAMPION),
    "champion rule's reuse set": (ChampionRule(reuse="fresh"), {**CHAMPION, "reuse": "fresh"}),
    "champion rule's latency_sample set": (ChampionRule(latency_sample=40), {**CHAMPION, "latency_sample": 40}),
    "encoder image at defaults": (EncoderImage(kind="encoder", base_image=BASE_IMAGE), ENCODER_IMAGE),
    "encoder image's engine set": (EncoderImage(kind="encoder", base_image=BASE_IMAGE, engine="openvino"),
                                   {**ENCODER_IMAGE, "engine": "openvino"}),
    "nli gate at defaults": (nli_gate(), NLI_GATE),
    "nli gate's inconclusive set": (nli_gate(inconclusive=InconclusiveConfig(choice="ask")),
                                    {**NLI_GATE, "inconclusive": ASKING}),
    "decision gate at defaults": (decision_gate(), DECISION_GATE),
    "decision gate's inconclusive set": (decision_gate(inconclusive=InconclusiveConfig(choice="ask")),
                                         {**DECISION_GATE, "inconclusive": ASKING}),
    "decision gate's cache_check set": (decision_gate(cache_check=CacheCheckRule(sample=5)),
                                        {**DECISION_GATE, "cache_check": {"sample": 5, "tolerance": 1e-4}}),
    "defaults nested in a gate": (decision_gate(champion=ChampionRule(reuse="fresh")),
                                  {**DECISION_GATE, "champion": {**CHAMPION, "reuse": "fresh"}}),
}


@pytest.mark.parametrize("model, expected", CASES.values(), ids=CASES.keys())
def test_a_field_added_later_is_written_only_when_set_off_its_default(model, expected):
    assert model.model_dump(mode="json") == expected
    assert model.model_dump() == expected  # the python dump too (what a nested config's dump is made of)


def test_an_explicit_default_dumps_as_a_field_left_out():
    """Writing a field's default out is the same config as leaving it out: one release id for both."""
    assert OnlineGate(extend_rounds=8).model_dump(mode="json") == OnlineGate().model_dump(mode="json")
    assert (decision_gate(inconclusive=InconclusiveConfig(), cache_check=CacheCheckRule()).model_dump(mode="json")
            == DECISION_GATE)
