"""The build's OpenVINO work runs in a child process (tasks.artifacts.openvino_build): the build's own process keeps
IEEE-754 subnormals (OpenVINO's CPU plugin, compiled with CPU_DENORMALS_OPTIMIZATION as the server runs it, sets
flush-to-zero on the thread that infers; the CI run of a89e02d failed hypothesis's float strategy that way), and a
domain error in the child reaches the caller as the same class with its fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shiplift.tasks.artifacts.onnx_export import builtin_calibration, export_onnx, parity_check
from shiplift.tasks.artifacts.onnx_parity import ParityReport
from shiplift.tasks.artifacts.openvino_build import convert_and_check
from shiplift.tasks.artifacts.openvino_ir import OV_FP32_FILE, OV_INT8_FILE, OV_RECORD
from shiplift.tasks.errors import IntegrityError

PROBES = [{"premise": "A man is playing a guitar on the stage.", "hypothesis": "A person plays music.",
           "label": "entailment"},
          {"premise": "The cat sleeps on the red sofa.", "hypothesis": "A dog is barking.", "label": "neutral"},
          {"premise": "Two children run in the park.", "hypothesis": "Nobody is outside.", "label": "contradiction"}]
LIMITS = {"max_abs_logit_delta": 1e-3, "min_label_agreement": 1.0, "int8_max_abs_logit_delta": 0.5,
          "int8_min_label_agreement": 0.0, "int8_max_accuracy_drop": 1.0, "max_len": 64, "threads": 1}


def subnormals_survive() -> bool:
    """Whether this thread still computes subnormal doubles (False under flush-to-zero)."""
    return sys.float_info.min / 2 > 0.0


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from shiplift.tasks.artifacts.tiny_encoder import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("ovb-checkpoint") / "checkpoint", seed=0)
    out = tmp_path_factory.mktemp("ovb-model") / "model"
    export_onnx(checkpoint, out, int8=True, threads=1)
    return checkpoint, out


def test_conversion_and_parity_run_in_a_child_and_this_process_keeps_subnormals(exported) -> None:
    checkpoint, out = exported
    assert subnormals_survive()
    record, report = convert_and_check(out, int8=True, calibration=builtin_calibration(),
                                       keep_fp32=("pooler", "classifier"), max_len=64, threads=1,
                                       checkpoint=checkpoint, probes=PROBES, limits=LIMITS)
    assert subnormals_survive(), "OpenVINO ran in the build's own process: it flushed this thread's denormals"
    assert record == json.loads((out / OV_RECORD).read_text()) and record["int8"]["int8_layers"]
    assert {OV_FP32_FILE, OV_INT8_FILE} <= set(record["files"])
    assert isinstance(report, ParityReport) and report.passed, report.failures
    assert report.n == len(PROBES) and report.variants["int8"].file == OV_INT8_FILE
    assert report.int8_budget is not None and report.int8_budget["n"] == len(PROBES)  # the labels crossed over


def test_a_domain_error_in_the_child_is_raised_here_as_the_same_class_with_its_fix(exported, tmp_path) -> None:
    import shutil

    _, out = exported
    copy = tmp_path / "model"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("model.ov*", OV_RECORD))
    with pytest.raises(IntegrityError, match="runs no layer in int8") as caught:  # every node kept fp32
        convert_and_check(copy, int8=True, calibration=builtin_calibration(), keep_fp32=("",), threads=1)
    assert "keep_fp32" in caught.value.fix
    assert not list(copy.glob("model.ov*")) and not (copy / OV_RECORD).exists()


def test_a_parity_report_survives_its_dict(exported) -> None:
    checkpoint, out = exported
    report = parity_check(checkpoint, out, PROBES, **LIMITS)  # ONNX Runtime's graphs: no OpenVINO here
    assert ParityReport.from_dict(report.to_dict()) == report
