"""The NLI gate's way out of an inconclusive champion check: the built-in set's `reserve` split and
`OnnxNli.reserve`, extended through the validate stage's choice (`validation.extension`).

The reserve is the real split of validation/data/nli.jsonl; the gate's first look is the real `evaluate_nli` and the
reserve is scored by the real family over HTTP, on two fake encoder servers whose answers each test sets pair by pair
(so each knows what the extension must conclude). The configs go through the real config loader, and so does
`make bench-gate`, which judges each gate with its own config's extension.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from bench.gate_error_rates import Extension, config_settings, judged_extension
from shiplift.tasks.artifacts.nli_train import _by_split
from shiplift.tasks.config import load_release_config
from shiplift.tasks.families.onnx_nli import OnnxNli
from shiplift.tasks.pipeline.stages import validate as validate_stage
from shiplift.validation.evaluate import GateOutcome, RunSettings, Target
from shiplift.validation.nli.builtin_set import DEFAULT_OUT
from shiplift.validation.nli.evaluate import NLI_REPORT, evaluate_nli, load_nli_dataset
from shiplift.validation.nli.pairs import LABELS, RESERVE_SPLIT, load_nli
from tests.unit.test_nli_runner import FakeEncoder, key

RELEASES = Path(__file__).resolve().parents[2] / "configs" / "releases"
MINILM = RELEASES / "minilm-nli.yaml"
NLI_CONFIGS = ("minilm-nli.yaml", "minilm-nli-shared.yaml", "mdeberta-nli.yaml")


def wrong(label: str) -> str:
    """Another label than `label` (the next one)."""
    return LABELS[(LABELS.index(label) + 1) % 3]


def test_the_reserve_split_is_held_back_from_every_other_use():
    pairs = load_nli(DEFAULT_OUT).pairs
    reserve = [p for p in pairs if p.split == RESERVE_SPLIT]
    others = [p for p in pairs if p.split != RESERVE_SPLIT]
    assert len(reserve) == 75 and Counter(p.label for p in reserve) == {label: 25 for label in LABELS}
    assert Counter(p.split for p in others) == {"train": 225, "calibration": 60, "test": 90}
    assert not {p.id for p in reserve} & {p.id for p in others}
    assert not {p.premise for p in reserve} & {p.premise for p in others}  # no passage seen elsewhere either
    trained_on = _by_split(pairs)  # what the demo's trainer reads: every split but the reserve
    assert RESERVE_SPLIT not in trained_on and sum(map(len, trained_on.values())) == len(others)


@pytest.mark.parametrize("name", NLI_CONFIGS)
def test_the_nli_configs_extend_onto_the_reserve(name):
    config = load_release_config(RELEASES / name, environ={})
    validation = config.validation
    assert validation.inconclusive.choice == "extend"
    assert [(ref.path, ref.splits) for ref in validation.inconclusive.extend.datasets] == [("builtin:nli",
                                                                                            [RESERVE_SPLIT])]
    reserve = config.family.reserve(validation, RELEASES, validate_stage.run_settings(validation))
    assert len(reserve.tasks) == 75 and reserve.datasets[0]["n"] == 75 and reserve.parts is NLI_REPORT
    gate_ids = {p.id for path, splits in validation.dataset_paths(RELEASES)
                for p in load_nli_dataset(path, name="gate", splits=splits).pairs}
    assert len(gate_ids) == 90 and not gate_ids & {p.id for p in reserve.tasks}


@pytest.fixture
def encoders():
    servers = FakeEncoder(), FakeEncoder()
    yield servers
    for server in servers:
        server.close()


def first_look(encoders, out_dir: Path, config, *, disagree: int) -> GateOutcome:
    """The NLI gate's first look on the test split: both right but on `disagree` pairs each, different ones (an
    equally good candidate, which the 90 pairs cannot tell within the margin)."""
    candidate, champion = encoders
    test = load_nli_dataset(DEFAULT_OUT, name="dataset0", splits=["test"])
    for i, pair in enumerate(test.pairs):
        candidate.answers[key(pair)] = wrong(pair.label) if i < disagree else pair.label
        champion.answers[key(pair)] = wrong(pair.label) if disagree <= i < 2 * disagree else pair.label
    validation = config.validation
    report = evaluate_nli(Target.http(candidate.url, label="candidate"), [test], out_dir,
                          thresholds=validation.thresholds, champion_rule=validation.champion,
                          champion=Target.http(champion.url, label="champion"), batch_size=validation.batch_size,
                          settings=RunSettings(concurrency=1, timeout_s=10, deadline_s=60, n_bootstrap=1000, seed=0))
    return GateOutcome.of(report)


@pytest.mark.parametrize("candidate_wrong, decided", [(0, "pass"), (45, "fail")])
def test_an_inconclusive_nli_gate_is_decided_by_the_extension(encoders, tmp_path, candidate_wrong, decided):
    # margin 0.09: 10 pairs each way on 90 are inconclusive there (the shipped 0.13 passes them at once)
    config = load_release_config(MINILM, overrides=("validation.champion.margin=0.09",), environ={})
    gate = first_look(encoders, tmp_path, config, disagree=10)
    assert gate.decision == "inconclusive"
    assert {c["name"] for c in gate.checks if c["status"] == "inconclusive"} == {"champion_accuracy"}
    candidate, champion = encoders
    reserve = [p for p in load_nli(DEFAULT_OUT).pairs if p.split == RESERVE_SPLIT]
    for i, pair in enumerate(reserve):  # the champion right on every reserve pair, the candidate wrong on the first k
        candidate.answers[key(pair)] = wrong(pair.label) if i < candidate_wrong else pair.label
        champion.answers[key(pair)] = pair.label
    said: list[str] = []
    ctx = SimpleNamespace(config=config, config_dir=MINILM.parent, say=said.append, family=OnnxNli(),
                          release_id="r-nli")
    decision, checks, record = validate_stage.follow_choice(ctx, gate, Target.http(candidate.url, label="candidate"),
                                                            Target.http(champion.url, label="champion"))
    assert (decision, record["outcome"]) == (decided, f"extended: {decided}")
    extension = record["extension"]
    assert extension["looks"][0]["n"] == 90 and extension["looks"][-1]["status"] == decided
    assert extension["n"] == 90 + extension["reserve_tasks_scored"] <= 165
    scored = extension["reserve_tasks_scored"]
    assert next(c for c in checks if c["name"] == "champion_accuracy")["status"] == decided
    # scored as the gate scores its pairs, in requests of validation.batch_size pairs: each look's batch of the
    # extension (25 pairs) as 8 + 8 + 8 + 1, on both sides, after the gate's 12 requests of the 90 test pairs
    looks = len(extension["looks"]) - 1
    assert config.validation.batch_size == 8 and config.validation.inconclusive.extend.batch == 25
    for server in encoders:
        assert server.batch_sizes[12:] == [8, 8, 8, 1] * looks
    added = (tmp_path / "extension-predictions.jsonl").read_text().splitlines()
    assert len(added) == scored and all('"dataset": "reserve"' in line for line in added)
    page = (tmp_path / "report.html").read_text()  # written again: the NLI report's parts, with the extension's looks
    assert f'id="decision">{decided}<' in page and "<h2>Extension</h2>" in page and "<h2>Confusion matrix</h2>" in page


def test_the_bench_judges_each_gate_with_its_own_extension(tmp_path):
    tree = yaml.safe_load(MINILM.read_text())
    tree["validation"].pop("inconclusive")  # the default choice: block
    blocked = tmp_path / "blocked-nli.yaml"
    blocked.write_text(yaml.safe_dump(tree))
    settings = {s.configs[0]: s for s in config_settings([MINILM, RELEASES / "gemma-decision.yaml", blocked],
                                                         ece_margin=None, p95_ratio=None, margins={})}
    assert settings["minilm-nli.yaml"].extension == Extension(batch=25, reserve=75)  # max_tasks 75, the reserve's 75
    assert settings["gemma-decision.yaml"].extension == Extension(batch=20, reserve=120)
    assert settings["blocked-nli.yaml"].extension is None
    assert "extends onto 75 reserve tasks in batches of 25" in settings["minilm-nli.yaml"].describe()
    nli = settings["minilm-nli.yaml"]
    assert judged_extension(nli, on=True, batch=None, reserve=None) == Extension(25, 75)
    assert judged_extension(nli, on=True, batch=10, reserve=None) == Extension(10, 75)
    assert judged_extension(nli, on=False, batch=10, reserve=None) is None
    assert judged_extension(settings["blocked-nli.yaml"], on=True, batch=10, reserve=30) is None
