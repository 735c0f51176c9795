"""The build's OpenVINO work (IR conversion, NNCF int8 and parity against PyTorch) in a process of its own.

OpenVINO's CPU plugin turns on flush-to-zero and denormals-are-zero on the thread that runs a model compiled with
``CPU_DENORMALS_OPTIMIZATION`` (as the served model is, to match the server) and starts a thread pool beside torch's.
A CLI or Airflow process that goes on to gate, time and serve must keep IEEE-754 floats and its cores, so the build
runs this module as a child and reads back the record and the parity report it wrote:

    python -m shiplift.tasks.artifacts.openvino_build SPEC.json RESULT.json     # what the build runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from shiplift.tasks.artifacts.onnx_contract import LABELS
from shiplift.tasks.artifacts.onnx_int8 import CalibrationSet
from shiplift.tasks.artifacts.onnx_parity import ParityReport, normalized_pairs, parity_check, probe_labels
from shiplift.tasks.artifacts.openvino_ir import OV_FP32_FILE, OV_INT8_FILE, OpenVinoSession, convert_openvino
from shiplift.tasks.errors import IntegrityError, ShipliftError, StepTimedOut, error_classes

CHILD_TIMEOUT_S = 1800  # NNCF calibration of a base-size encoder on 2 cores takes minutes, not half an hour
CHILD_FAILED = 3  # the child's exit status when it wrote a domain error to RESULT.json


def convert_and_check(model_dir: str | Path, *, int8: bool, calibration: CalibrationSet | None,
                      keep_fp32: Sequence[str] = (), max_len: int = 512, threads: int = 2,
                      checkpoint: str | Path | None = None, probes: Iterable[Any] = (),
                      limits: dict[str, Any] | None = None,
                      timeout_s: float = CHILD_TIMEOUT_S) -> tuple[dict[str, Any], ParityReport | None]:
    """`openvino_ir.convert_openvino` on `model_dir` and, with a `checkpoint`, `parity_check` of the IR against it
    on `probes` with `limits`, both in a child process; returns (openvino.json's record, the parity report or None).
    A domain error in the child is raised here as the same class, message and fix."""
    probes = list(probes)
    spec = {"model_dir": str(model_dir), "int8": int8, "keep_fp32": list(keep_fp32), "max_len": max_len,
            "threads": threads, "checkpoint": None if checkpoint is None else str(checkpoint),
            "calibration": None if calibration is None else {"pairs": [list(pair) for pair in calibration.pairs],
                                                              "source": calibration.source,
                                                              "sha256": calibration.sha256},
            "probes": _probe_dicts(probes) if checkpoint is not None else [], "limits": limits or {}}
    with tempfile.TemporaryDirectory(prefix="openvino-build-") as folder:
        spec_path, result_path = Path(folder) / "spec.json", Path(folder) / "result.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        env = {**os.environ, **{name: str(threads) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}}
        command = [sys.executable, "-m", "shiplift.tasks.artifacts.openvino_build", str(spec_path), str(result_path)]
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise StepTimedOut(f"the OpenVINO conversion of {model_dir} ran past {timeout_s:g} s",
                               fix="check the machine's load, or build with image.engine: onnxruntime") from None
        result = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else None
    if done.returncode == CHILD_FAILED and result and "error" in result:
        raise _domain_error(result["error"])
    if done.returncode != 0 or not result:
        raise IntegrityError(f"the OpenVINO build process exited {done.returncode}: "
                             f"{(done.stdout + done.stderr)[-1500:]}",
                             fix="check the openvino / nncf install (make setup) and the exported model.onnx")
    parity = result["parity"]
    return result["record"], None if parity is None else ParityReport.from_dict(parity)


def _probe_dicts(probes: list[Any]) -> list[dict[str, Any]]:
    """Probes as the child reads them: premise, hypothesis and, when every probe has a contract label, the label."""
    labels = probe_labels(probes)
    return [{"premise": premise, "hypothesis": hypothesis, **({} if labels is None else {"label": LABELS[labels[i]]})}
            for i, (premise, hypothesis) in enumerate(normalized_pairs(probes))]


def _domain_error(error: dict[str, str]) -> ShipliftError:
    """The child's domain error as the parent raises it: the same class, problem and fix."""
    classes = {cls.__name__: cls for cls in error_classes()}
    return classes.get(error["class"], ShipliftError)(error["problem"], fix=error["fix"])


def _run(spec: dict[str, Any]) -> dict[str, Any]:
    """The child's work: convert, then (with a checkpoint) parity-check the IR with OpenVINO's CPU plugin."""
    calibration = spec["calibration"] and CalibrationSet(
        pairs=tuple(tuple(pair) for pair in spec["calibration"]["pairs"]), source=spec["calibration"]["source"],
        sha256=spec["calibration"]["sha256"])
    record = convert_openvino(spec["model_dir"], int8=spec["int8"], calibration=calibration,
                              keep_fp32=spec["keep_fp32"], max_len=spec["max_len"], threads=spec["threads"])
    parity = None
    if spec["checkpoint"] is not None:
        parity = parity_check(spec["checkpoint"], spec["model_dir"], spec["probes"], **spec["limits"],
                              files=(OV_FP32_FILE, OV_INT8_FILE), open_session=OpenVinoSession).to_dict()
    return {"record": record, "parity": parity}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shiplift.tasks.artifacts.openvino_build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="the spec convert_and_check wrote")
    parser.add_argument("result", type=Path, help="where to write the record and parity report (or the error)")
    args = parser.parse_args(argv)
    try:
        result = _run(json.loads(args.spec.read_text(encoding="utf-8")))
    except ShipliftError as exc:
        args.result.write_text(json.dumps({"error": {"class": type(exc).__name__, "problem": exc.problem,
                                                     "fix": exc.fix}}), encoding="utf-8")
        return CHILD_FAILED
    args.result.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
