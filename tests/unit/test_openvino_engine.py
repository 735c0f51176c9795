"""OpenVINO beside ONNX Runtime (issue 50, item 4): the IR converted from the exported model.onnx and its NNCF int8,
held to the same parity limits and int8 budget as ONNX Runtime's graphs, the timed engine choice, and what the family
records and gives the image."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from shiplift.tasks.artifacts.onnx_export import (
    FP32_FILE,
    builtin_calibration,
    export_onnx,
    parity_check,
    require_parity,
)
from shiplift.tasks.artifacts.openvino_choice import ENGINES, choose_engine, cpu_class, parse_cpu_flags
from shiplift.tasks.artifacts.openvino_ir import (
    OV_FP32_FILE,
    OV_INT8_FILE,
    OV_RECORD,
    OpenVinoSession,
    convert_openvino,
)
from shiplift.tasks.errors import IntegrityError
from shiplift.tasks.hashing import sha256_file

# OpenVINO inferring beside torch here left a process that a later SIGALRM crashed: make test runs this file apart
pytestmark = pytest.mark.own_process

ROOT = Path(__file__).resolve().parents[2]
OV_FILES = (OV_FP32_FILE, OV_INT8_FILE)
PROBES = [("A man is playing a guitar on the stage.", "A person plays music."),
          ("The cat sleeps on the red sofa.", "A dog is barking."),
          ("Two children run in the park.", "Kids are outside.")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("ov-checkpoint") / "checkpoint", seed=0)


@pytest.fixture(scope="module")
def model_dir(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny encoder exported as the build exports it, then converted to OpenVINO IR (fp32 + NNCF int8)."""
    out = tmp_path_factory.mktemp("ov-model") / "model"
    export_onnx(checkpoint, out, int8=True, threads=1)
    convert_openvino(out, int8=True, calibration=builtin_calibration(), keep_fp32=("pooler", "classifier"), threads=1)
    return out


def _labelled(n: int = 16) -> list:
    from shiplift.validation.nli.pairs import load_nli

    return [p for p in load_nli(ROOT / "validation" / "data" / "nli.jsonl").pairs if p.split == "calibration"][:n]


def test_conversion_writes_both_irs_and_records_them(model_dir: Path) -> None:
    record = json.loads((model_dir / OV_RECORD).read_text())
    for name in OV_FILES:
        assert (model_dir / name).is_file() and (model_dir / name).with_suffix(".bin").is_file()
    assert set(record["files"]) == {p for name in OV_FILES for p in (name, name.replace(".xml", ".bin"))}
    assert all(sha256_file(model_dir / name) == digest for name, digest in record["files"].items())
    assert record["spec"]["source_sha256"] == sha256_file(model_dir / FP32_FILE)  # from the same exported graph
    assert record["spec"]["calibration"]["source"] == "builtin:nli[calibration]"
    assert record["int8"]["method"] == "nncf_ptq" and record["int8"]["calibration"] == "builtin:nli[calibration]"
    assert sum(record["int8"]["int8_layers"].values()) > 0  # the CPU plugin really runs int8 layers
    assert "FP32" in record["capabilities"] and "INT8" in record["capabilities"]
    assert not list(model_dir.glob(".openvino-*"))  # the scratch folder is gone


def test_conversion_is_reused_when_it_is_the_same_and_redone_when_not(model_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    stamp = (copy / OV_INT8_FILE).stat().st_mtime_ns
    again = convert_openvino(copy, int8=True, calibration=builtin_calibration(), keep_fp32=("pooler", "classifier"),
                             threads=1)
    assert (copy / OV_INT8_FILE).stat().st_mtime_ns == stamp  # reused, not rewritten
    assert again == json.loads((model_dir / OV_RECORD).read_text())
    fp32_only = convert_openvino(copy, int8=False, calibration=None, threads=1)  # another conversion: redone
    assert "int8" not in fp32_only and set(fp32_only["files"]) == {OV_FP32_FILE, "model.ov.bin"}


def test_openvino_fp32_matches_pytorch_and_onnx_runtime_and_int8_stays_within_its_limit(checkpoint: Path,
                                                                                      model_dir: Path) -> None:
    report = require_parity(parity_check(checkpoint, model_dir, PROBES * 2, batch_size=4, int8_min_label_agreement=0.5,
                                         files=OV_FILES, open_session=OpenVinoSession))
    fp32, int8 = report.variants["fp32"], report.variants["int8"]
    assert fp32.file == OV_FP32_FILE and int8.file == OV_INT8_FILE
    assert fp32.max_abs_logit_delta < 1e-4 and fp32.label_agreement == 1.0
    assert 0 < int8.max_abs_logit_delta < 0.5  # the int8 IR really differs, within the same limit ONNX's int8 has
    # and against the other engine on the same graph, scored independently
    from transformers import AutoTokenizer

    from shiplift.tasks.artifacts.onnx_contract import cpu_session

    batch = AutoTokenizer.from_pretrained(str(model_dir))([p for p, _ in PROBES], [h for _, h in PROBES], padding=True,
                                                          return_tensors="np")
    ort = cpu_session(model_dir / FP32_FILE, 1)
    feed = {i.name: batch[i.name].astype(np.int64) for i in ort.get_inputs()}
    ov_logits = OpenVinoSession(model_dir / OV_FP32_FILE, 1).run(["logits"], feed)[0]
    assert np.abs(ov_logits - ort.run(["logits"], feed)[0]).max() < 1e-4


def test_the_int8_budget_judges_the_openvino_int8_ir_and_stops_a_release_that_breaks_it(checkpoint: Path,
                                                                                       model_dir: Path) -> None:
    labelled = _labelled()
    kept = parity_check(checkpoint, model_dir, labelled, batch_size=8, int8_min_label_agreement=0.5,
                        int8_max_accuracy_drop=1.0, files=OV_FILES, open_session=OpenVinoSession)
    budget = kept.int8_budget
    assert budget["status"] == "pass" and budget["n"] == 16
    assert budget["observed"] == pytest.approx(kept.variants["fp32"].accuracy - kept.variants["int8"].accuracy)
    broken = parity_check(checkpoint, model_dir, labelled, batch_size=8, int8_min_label_agreement=0.5,
                          int8_max_accuracy_drop=-1.0, files=OV_FILES, open_session=OpenVinoSession)
    assert broken.int8_budget["status"] == "fail"  # no int8 IR gains 100 pt: a budget it cannot meet
    with pytest.raises(IntegrityError, match="int8 accuracy budget"):
        require_parity(broken)


def test_an_int8_ir_that_runs_nothing_in_int8_is_refused_and_leaves_the_folder_as_it_was(model_dir: Path,
                                                                                       tmp_path: Path) -> None:
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    for name in [OV_RECORD, *(p.name for p in copy.glob("model.ov*"))]:
        (copy / name).unlink()
    before = sorted(p.name for p in copy.iterdir())
    with pytest.raises(IntegrityError, match="runs no layer in int8"):  # every node kept fp32: nothing quantized
        convert_openvino(copy, int8=True, calibration=builtin_calibration(), keep_fp32=("",), threads=1)
    assert sorted(p.name for p in copy.iterdir()) == before


def test_parse_cpu_flags_by_hand() -> None:
    flags = parse_cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 fma avx512_vnni amx_tile\n"
                            "processor\t: 1\nflags\t\t: fpu\n")
    assert flags["avx2"] and flags["fma"] and flags["avx512_vnni"] and flags["amx_tile"]
    assert not flags["avx512f"] and not flags["amx_int8"] and not flags["avx_vnni"]
    assert not any(parse_cpu_flags("model name: x\n").values())


def test_auto_times_both_engines_in_their_own_processes_and_records_the_winner(model_dir: Path) -> None:
    capabilities = json.loads((model_dir / OV_RECORD).read_text())["capabilities"]
    choice = choose_engine(model_dir, "int8", threads=1, batch=2, seq=16, rounds=2, iterations=2,
                           capabilities=capabilities)
    medians = choice["median_samples_per_s"]
    assert set(choice["samples_per_s"]) == set(ENGINES) and all(len(v) == 2 for v in choice["samples_per_s"].values())
    assert all(rate > 0 for rates in choice["samples_per_s"].values() for rate in rates)
    assert choice["winner"] == max(medians, key=medians.get)
    assert choice["ratio_openvino_to_onnxruntime"] == pytest.approx(medians["openvino"] / medians["onnxruntime"])
    assert choice["cpu"] == cpu_class() and "avx2" in choice["cpu"]["flags"]
    assert (choice["batch"], choice["seq"], choice["variant"]) == (2, 16, "int8")
    assert choice["openvino_capabilities"] == capabilities and "FP32" in capabilities


def test_the_family_config_names_the_engine_and_gives_it_to_the_image() -> None:
    from pydantic import ValidationError

    from shiplift.tasks.families.onnx_nli import EncoderImage

    base = {"kind": "encoder", "base_image": "python@sha256:" + "a" * 64}
    plain = EncoderImage(**base)
    assert plain.engine == "onnxruntime" and "ENCODER_ENGINE" not in plain.container_env()
    assert "engine" not in plain.model_dump()  # a release id of a config that names no engine is unchanged
    openvino = EncoderImage(**base, engine="openvino")
    assert openvino.container_env()["ENCODER_ENGINE"] == "openvino" and openvino.model_dump()["engine"] == "openvino"
    assert "ENCODER_ENGINE" not in EncoderImage(**base, engine="auto").container_env()  # the build's choice sets it
    with pytest.raises(ValidationError, match="runs on the CPU"):
        EncoderImage(**base, engine="openvino", device="cuda")


def test_served_graph_records_the_openvino_ir_that_answers(model_dir: Path) -> None:
    from shiplift.tasks.config_types import DatasetRef
    from shiplift.tasks.families.onnx_nli import EncoderImage, served_graph

    export = json.loads((model_dir / "export.json").read_text())
    record = json.loads((model_dir / OV_RECORD).read_text())
    image = EncoderImage(kind="encoder", base_image="python@sha256:" + "a" * 64, variant="int8", engine="openvino")
    budget = {"name": "int8_accuracy_drop_vs_fp32", "status": "pass", "reason": "r"}
    info = served_graph(image, export, {"int8_budget": budget}, DatasetRef(path="builtin:nli", splits=["calibration"]),
                        engine="openvino", openvino=record)
    assert (info["engine"], info["served_file"]) == ("openvino", OV_INT8_FILE)
    assert info["served_sha256"] == sha256_file(model_dir / OV_INT8_FILE)
    assert info["graph"]["method"] == "nncf_ptq" and info["graph"]["converted_from"] == FP32_FILE
    assert info["int8_budget"]["status"] == "pass" and info["int8_budget"]["dataset"]["path"] == "builtin:nli"


def test_the_build_with_engine_auto_holds_openvino_to_parity_times_both_and_records_the_winner(
        checkpoint: Path, model_dir: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from shiplift.tasks.families.onnx_nli import EncoderImage, Int8Quantization, ParityRule, _openvino_build

    out = tmp_path / "model"
    shutil.copytree(model_dir, out)
    said: list[str] = []
    image = EncoderImage(kind="encoder", base_image="python@sha256:" + "a" * 64, variant="int8", engine="auto",
                         threads=1, max_batch=2)  # small timing batches: batch min(8, max_batch), seq min(max_len, 128)
    artifact = SimpleNamespace(int8=True, quantization=Int8Quantization(), max_len=32,
                               parity=ParityRule(int8_min_label_agreement=0.5))
    ctx = SimpleNamespace(config=SimpleNamespace(artifact=artifact, image=image), config_dir=ROOT, say=said.append,
                          stage_dir=lambda name: tmp_path)
    engine, extra = _openvino_build(ctx, out, checkpoint, PROBES * 2, builtin_calibration())
    choice = extra["engine_choice"]
    assert engine == choice["winner"] in ENGINES and extra["container_env"] == {"ENCODER_ENGINE": engine}
    assert (choice["variant"], choice["batch"], choice["seq"], choice["rounds"]) == ("int8", 2, 32, 3)
    assert extra["parity_openvino"]["passed"] and extra["parity_openvino"]["variants"]["int8"]["file"] == OV_INT8_FILE
    assert json.loads((tmp_path / "parity.openvino.json").read_text()) == extra["parity_openvino"]
    assert extra["openvino"]["spec"]["keep_fp32"] == list(Int8Quantization().keep_fp32)  # the ONNX int8's, for NNCF
    assert any(line.startswith(f"build: engine auto: {engine} serves the int8 graph") for line in said), said
