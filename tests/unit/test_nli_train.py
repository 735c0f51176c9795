"""Training the demo NLI head: on the tiny checkpoint (seconds), reproducible, exportable, refusing bad data."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from shiplift.tasks.artifacts.nli_train import TRAINING_RECORD, main, train_nli
from shiplift.tasks.artifacts.onnx_export import check_checkpoint, export_onnx, parity_check, require_parity
from shiplift.tasks.artifacts.tiny_encoder import write_tiny_checkpoint
from shiplift.tasks.errors import BadInput, Conflict
from shiplift.tasks.hashing import sha256_file

# A learnable toy task: the hypothesis ends with "yes" (entailment), "some" (neutral) or "no" (contradiction).
CUE = {"entailment": "yes", "neutral": "some", "contradiction": "no"}
PREMISES = ("the cat sat on the mat", "a man plays music in the park", "it rains in the city", "two dogs run")


@dataclass(frozen=True)
class Pair:
    id: str
    premise: str
    hypothesis: str
    label: str
    split: str


def _pairs() -> list[Pair]:
    pairs = []
    for index, premise in enumerate(PREMISES * 3):
        for label, cue in CUE.items():
            split = ("train", "train", "calibration", "test")[index % 4]
            pairs.append(Pair(f"p{index}-{label}", premise, f"the answer is {cue}", label, split))
    return pairs


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("base") / "tiny", seed=0)


@pytest.fixture(scope="module")
def trained(base: Path, tmp_path_factory: pytest.TempPathFactory):
    lines: list[str] = []
    out = tmp_path_factory.mktemp("trained") / "nli"
    result = train_nli(base, _pairs(), out, epochs=5, seed=7, learning_rate=1e-2, batch_size=4, say=lines.append)
    return out, result, lines


def test_training_learns_reports_progress_and_keeps_the_best_calibration_epoch(trained) -> None:
    out, result, lines = trained
    assert [stats.epoch for stats in result.epochs] == [1, 2, 3, 4, 5]
    assert result.epochs[-1].loss < result.epochs[0].loss
    assert result.calibration_accuracy == max(stats.calibration_accuracy for stats in result.epochs)
    assert result.epochs[result.best_epoch - 1].calibration_accuracy == result.calibration_accuracy
    assert result.calibration_accuracy > 0.5  # chance is 1/3 on this cue-driven toy task
    assert result.test_accuracy is not None and 0 <= result.test_accuracy <= 1
    assert result.counts == {"train": 18, "calibration": 9, "test": 9}
    epoch_lines = [line for line in lines if "epoch" in line and "loss" in line]
    assert len(epoch_lines) == 5 and all("train accuracy" in line for line in epoch_lines)
    assert "test accuracy" in lines[-1]


def test_saved_checkpoint_is_a_normal_hf_classifier_that_exports_with_parity(trained, tmp_path: Path) -> None:
    out, result, _ = trained
    info = check_checkpoint(out)
    assert info.architecture == "BertForSequenceClassification"
    assert {"tokenizer.json", "vocab.txt"} <= set(info.tokenizer_files)
    record = json.loads((out / TRAINING_RECORD).read_text())
    assert record["best_epoch"] == result.best_epoch and record["seed"] == 7
    exported = export_onnx(out, tmp_path / "onnx", int8=False)  # int8 of a 32-wide toy model means little
    probes = [pair for pair in _pairs() if pair.split == "test"]
    report = require_parity(parity_check(out, exported.model_dir, probes))
    assert report.variants["fp32"].label_agreement == 1.0


def test_same_seed_gives_identical_weights(base: Path, trained, tmp_path: Path) -> None:
    out, _, _ = trained
    again = train_nli(
        base, _pairs(), tmp_path / "again", epochs=5, seed=7, learning_rate=1e-2, batch_size=4, say=lambda _: None
    )
    assert sha256_file(Path(again.out_dir) / "model.safetensors") == sha256_file(out / "model.safetensors")


def test_partial_fine_tuning_leaves_lower_layers_untouched(base: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    result = train_nli(
        base, _pairs(), tmp_path / "top1", epochs=1, learning_rate=3e-3, batch_size=4, trainable_layers=1,
        say=lambda _: None,
    )
    before, after = load_file(base / "model.safetensors"), load_file(Path(result.out_dir) / "model.safetensors")
    frozen = "bert.encoder.layer.0.attention.self.query.weight"
    trained_key = "bert.encoder.layer.1.attention.self.query.weight"
    assert (before[frozen] == after[frozen]).all()
    assert (before["bert.embeddings.word_embeddings.weight"] == after["bert.embeddings.word_embeddings.weight"]).all()
    assert not (before[trained_key] == after[trained_key]).all()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda ps: ps + [Pair("x", "a", "b", "maybe", "train")], "label 'maybe'"),
        (lambda ps: [p for p in ps if p.split != "calibration"], "no 'calibration' pairs"),
        (lambda ps: ps + [Pair("x", "a", "b", "neutral", "dev")], "split 'dev'"),
        (lambda ps: ps + [Pair("x", " ", "b", "neutral", "train")], "empty premise"),
        (lambda ps: ps + [Pair("long", "word " * 600, "b", "neutral", "train")], "train pair long is .* over max_len"),
    ],
)
def test_bad_data_is_refused_and_nothing_is_written(base: Path, tmp_path: Path, mutate, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        train_nli(base, mutate(_pairs()), tmp_path / "out", epochs=1, say=lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_an_existing_output_is_never_overwritten(base: Path, trained) -> None:
    out, _, _ = trained
    with pytest.raises(Conflict, match="never overwritten"):
        train_nli(base, _pairs(), out, epochs=1, say=lambda _: None)


def test_cli_trains_from_an_nli_jsonl(base: Path, tmp_path: Path, capsys) -> None:
    data = tmp_path / "nli.jsonl"
    data.write_text("".join(json.dumps(pair.__dict__) + "\n" for pair in _pairs()))
    code = main([
        "--data", str(data), "--out", str(tmp_path / "cli"), "--base-model", str(base), "--epochs", "1",
        "--seed", "3", "--batch-size", "6",
    ])
    assert code == 0
    printed = capsys.readouterr().out
    assert "nli_train: epoch 1/1" in printed
    summary = json.loads(printed[printed.index("{"):])
    assert summary["data_sha256"] == sha256_file(data) and summary["seed"] == 3
    check_checkpoint(tmp_path / "cli")
