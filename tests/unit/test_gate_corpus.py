"""The gate-error corpus (bench/gate_corpus.py) holds the truth it claims, and `make bench-gate` measures the gate.

The truth is checked on large draws with the project's own metrics (`validation.metrics`), not the corpus's formulas;
the bench's fixed-size rates against `validation.gate_power`'s closed form (itself checked against a seeded
simulation of the real rule in test_gate_power.py), and its fast path against the real `evaluate_gates`.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.gate_corpus import Spec, draw, load_base, temperature_for, truth
from bench.gate_error_rates import CONFIGS, Setting, main, measure_cell
from shiplift.validation.gate_power import score_outcomes
from shiplift.validation.metrics import expected_calibration_error, score_predictions
from shiplift.validation.thresholds import ChampionRule


@pytest.fixture(scope="module")
def base():
    return load_base("gemma")


def test_recorded_base_is_real_and_complete(base):
    assert base.provenance["model"]["sha256"] == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert base.main.size == 182 and base.reserve.size == 120  # decision set test + calibration; JevBench
    assert 0.15 < base.main.accuracy < 0.6
    # the two passes are the same model, so the same answers (llama.cpp is deterministic at one request at a time)
    assert np.array_equal(score_predictions(base.main.rows_b).correct, base.main.correct)


@pytest.mark.parametrize("disagreement, shortfall", [(0.03, 0.0), (0.08, 0.0), (0.15, 0.0), (0.08, 0.05), (0.10, 0.10)])
def test_flipped_candidates_differ_as_stated(base, disagreement, shortfall):
    spec = Spec("x", disagreement=disagreement, shortfall=shortfall)
    draws = draw(base.main, spec, candidates=400, n=111, rng=np.random.default_rng(1))
    cand, champ = draws.candidate_correct, draws.champion_correct
    tasks = cand.size
    difference, disagree = float((cand.astype(float) - champ).mean()), float((cand != champ).mean())
    assert abs(difference + shortfall) < 4 * math.sqrt(disagreement / tasks)
    assert abs(disagree - disagreement) < 4 * math.sqrt(disagreement / tasks)
    assert truth(base.main, spec).shortfall == pytest.approx(shortfall)


def test_candidate_rows_score_as_the_arrays_say(base):
    """The rows the real gate reads are the candidate the fast path judges: flips, temperature and latency."""
    spec = Spec("x", disagreement=0.15, shortfall=0.05, temperature=0.6, latency_ratio=1.7)
    draws = draw(base.main, spec, candidates=3, n=111, rng=np.random.default_rng(2))
    for k in range(3):
        candidate, champion = draws.rows(k)
        scored = score_predictions(candidate)
        assert np.array_equal(scored.correct, draws.candidate_correct[k])
        assert np.allclose(scored.confidence, draws.candidate_confidence[k], rtol=0, atol=1e-12)
        assert np.array_equal(score_predictions(champion).correct, draws.champion_correct[k])
        assert [r["latency_ms"] for r in candidate] == pytest.approx(
            [base.main.rows_b[t]["latency_ms"] * 1.7 * base.main.latency_scale for t in draws.tasks[k]])


@pytest.mark.parametrize("increase", [0.05, 0.10])
def test_temperature_skew_raises_ece_as_stated(base, increase):
    """On a large resample the metric's own ECE difference is the stated one (the small-sample bias fades)."""
    temperature = temperature_for(base.main, increase)
    assert temperature != pytest.approx(1.0)
    spec = Spec("t", temperature=temperature)
    draws = draw(base.main, spec, candidates=1, n=200_000, rng=np.random.default_rng(3))
    skewed = expected_calibration_error(draws.candidate_confidence[0], draws.candidate_correct[0])
    plain = expected_calibration_error(draws.champion_confidence[0], draws.champion_correct[0])
    assert skewed - plain == pytest.approx(increase, abs=0.005)
    assert np.array_equal(draws.candidate_correct, draws.champion_correct)  # accuracy untouched


def _rule(**kw):
    return ChampionRule(margin=0.05, min_samples=30, **kw)


@pytest.mark.parametrize("spec", [Spec("equal 3%", disagreement=0.03), Spec("equal 8%", disagreement=0.08),
                                  Spec("equal 15%", disagreement=0.15),
                                  Spec("worse by the margin", disagreement=0.08, shortfall=0.05)])
def test_fixed_size_rates_match_the_plan(base, spec):
    """The bench's fixed-size accuracy check agrees with gate_power's exact P(pass) within sampling error (+ slack:
    the corpus flips tasks of a finite recorded pool, the plan draws each task's outcome independently)."""
    candidates = 600
    setting = Setting(("t.yaml",), 111, _rule(), False, False)
    rows, _, _ = measure_cell(setting, base, spec, [0, 0, 0], candidates=candidates, extension=False, batch=20,
                              reserve=120, cross_check=0)
    measured = next(r for r in rows if r["check"] == "champion_accuracy")["fixed"]["pass"]
    closed = score_outcomes(n=111, margin=0.05, disagreement=spec.disagreement, shortfall=spec.shortfall,
                            confidence=0.95)["pass"]
    assert abs(measured - closed) <= 3 * math.sqrt(closed * (1 - closed) / candidates) + 0.05


def test_fast_path_judges_as_evaluate_gates(base):
    """Every check's status from the bench's fast path (score intervals per table, vectorized bootstraps) equals the
    real gate's on the same rows."""
    setting = Setting(("t.yaml",), 111, _rule(also_ece_margin=0.05, max_p95_ratio=1.5), False, False)
    spec = Spec("flipped, skewed, slower", disagreement=0.08, temperature=0.7, latency_ratio=1.4)
    _, checked, mismatches = measure_cell(setting, base, spec, [1, 2, 3], candidates=2, extension=False, batch=20,
                                          reserve=120, cross_check=2)
    assert (checked, mismatches) == (2, 0)


def test_bench_runs_end_to_end(capsys):
    assert main(["--configs", str(CONFIGS / "gemma-decision.yaml"), "--candidates", "10", "--jobs", "1",
                 "--cross-check", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    (gate,) = result["gates"]
    assert gate["n"] == 111 and gate["margin"] == 0.12 and gate["cross_check_mismatches"] == 0
    checks = {row["check"] for row in gate["rows"]}
    assert {"champion_accuracy", "champion_ece", "champion_p95_ratio", "decision"} <= checks
    equal = next(r for r in gate["rows"] if r["candidate"].startswith("equal, 3%") and r["check"] == "decision")
    assert equal["verdict"] == "not worse" and equal["mean_tasks"] >= 111
    assert set(gate["worst"]) == {"fixed", "extended"}


def test_the_tiny_base_is_the_tests_model_recorded_and_the_bench_runs_on_it(tmp_path, tiny_release, capsys):
    """The corpus's tiny rows (issue 45 item 3, "tiny models the tests make") come from the model the tests' releases
    serve: the recorded file's sha256 is the generator's, and its weights are those of tests/tiny_release.py's GGUF
    (the context length, which differs, is metadata)."""
    import gguf

    from bench.record_gate_outcomes import TINY_CONTEXT, TINY_SEED
    from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
    from shiplift.tasks.hashing import sha256_file

    tiny = load_base("tiny")
    recorded = write_tiny_gguf(tmp_path / "recorded.gguf", seed=TINY_SEED, n_ctx=TINY_CONTEXT)
    assert tiny.provenance["model"]["sha256"] == sha256_file(recorded)
    tests_model = write_tiny_gguf(tmp_path / "tests.gguf", seed=tiny_release.SEED)

    def tensors(path):
        return {t.name: bytes(t.data) for t in gguf.GGUFReader(path).tensors}

    assert tensors(recorded) == tensors(tests_model)
    assert tiny.main.size == 182 and tiny.reserve.size == 120, "every task answered validly, on both passes"
    assert np.array_equal(score_predictions(tiny.main.rows_b).correct, tiny.main.correct)
    assert main(["--base", "tiny", "--configs", str(CONFIGS / "gemma-decision.yaml"), "--candidates", "10",
                 "--jobs", "1", "--cross-check", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["base"] == "tiny" and result["provenance"] == tiny.provenance
