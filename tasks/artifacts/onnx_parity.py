"""Parity of an exported encoder model directory with its PyTorch checkpoint (`parity_check`): max / mean |Δlogit|
and label agreement per ONNX variant and, when the probes are labelled, each variant's accuracy and the int8 graph's
accuracy loss against the fp32 graph (a budget, like the other limits); `require_parity` stops a release that fails."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shiplift.tasks.artifacts.onnx_checkpoint import check_checkpoint
from shiplift.tasks.artifacts.onnx_contract import FP32_FILE, INPUT_NAMES, INT8_FILE, LABEL2ID, cpu_session
from shiplift.tasks.errors import BadInput, IntegrityError
from shiplift.tasks.extras import needs_extra

# The server flushes denormals to zero (session.set_denormal_as_zero: on padded batches they made ONNX Runtime ~1.5x
# slower on x86). Parity does not: that setting changes the floating-point mode of the whole calling process (the
# release's, which goes on computing metrics), and it moves logits by denormal amounts only (< 1e-37).


@dataclass(frozen=True)
class VariantParity:
    """Parity of one ONNX variant (fp32 or int8) against the PyTorch reference."""

    variant: str
    file: str
    n: int
    max_abs_logit_delta: float
    mean_abs_logit_delta: float
    label_agreement: float
    max_abs_logit_delta_limit: float
    min_label_agreement: float
    failures: list[str]
    accuracy: float | None = None  # on the probes' own labels, when every probe has one

    @property
    def passed(self) -> bool:
        """True when every limit held."""
        return not self.failures


@dataclass(frozen=True)
class ParityReport:
    """Parity of every variant in a model directory, on the same tokenized probe set."""

    n: int
    tokenizer_match: bool
    variants: dict[str, VariantParity]
    failures: list[str]
    reference_accuracy: float | None = None  # PyTorch's, on the probes' labels
    # the int8-vs-fp32 accuracy budget as a gate check (validation.gates.Check)
    int8_budget: dict[str, Any] | None = None

    @property
    def passed(self) -> bool:
        """True when the tokenizers agree and every variant passed."""
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict, with `passed` spelled out for the ledger."""
        return {
            "n": self.n,
            "tokenizer_match": self.tokenizer_match,
            "passed": self.passed,
            "failures": list(self.failures),
            "reference_accuracy": self.reference_accuracy,
            "int8_budget": self.int8_budget,
            "variants": {
                name: {**asdict(variant), "passed": variant.passed} for name, variant in self.variants.items()
            },
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ParityReport:
        """The report `to_dict` wrote (e.g. by the OpenVINO build's child process)."""
        variants = {name: VariantParity(**{k: v for k, v in fields.items() if k != "passed"})
                    for name, fields in data["variants"].items()}
        return cls(n=data["n"], tokenizer_match=data["tokenizer_match"], variants=variants,
                   failures=list(data["failures"]), reference_accuracy=data["reference_accuracy"],
                   int8_budget=data["int8_budget"])


def normalized_pairs(probe_pairs: Iterable[Any]) -> list[tuple[str, str]]:
    """Normalise probes (objects or dicts with premise/hypothesis, or 2-tuples); refuse bad ones."""
    pairs = []
    for index, probe in enumerate(probe_pairs):
        if isinstance(probe, dict):
            premise, hypothesis = probe.get("premise"), probe.get("hypothesis")
        elif isinstance(probe, (tuple, list)) and len(probe) == 2:
            premise, hypothesis = probe
        else:
            premise, hypothesis = getattr(probe, "premise", None), getattr(probe, "hypothesis", None)
        if not (isinstance(premise, str) and premise.strip() and isinstance(hypothesis, str) and hypothesis.strip()):
            raise BadInput(
                f"probe pair {index} needs non-empty premise and hypothesis strings, got {probe!r}",
                fix="pass NliPair objects, {'premise', 'hypothesis'} dicts or (premise, hypothesis) tuples",
            )
        pairs.append((premise, hypothesis))
    if not pairs:
        raise BadInput("parity needs at least one probe pair, got none", fix="pass the calibration or test split")
    return pairs


def probe_labels(probe_pairs: Sequence[Any]) -> list[int] | None:
    """The probes' gold label indices when every probe carries a contract label, else None."""
    labels = []
    for probe in probe_pairs:
        label = probe.get("label") if isinstance(probe, dict) else getattr(probe, "label", None)
        if label not in LABEL2ID:
            return None
        labels.append(LABEL2ID[label])
    return labels


def int8_budget_check(fp32_accuracy: float, int8_accuracy: float, n: int, max_drop: float | None) -> dict[str, Any]:
    """The int8 graph's accuracy loss against the fp32 graph on the same labelled pairs, judged against its budget
    (None: recorded, `skipped`); a dict with `validation.gates.Check`'s fields (point rule: at n of a few dozen an
    interval could never clear a 1-point budget)."""
    drop = fp32_accuracy - int8_accuracy
    change = "no change" if abs(drop) < 1e-12 else f"{abs(drop) * 100:.1f} pt {'lost' if drop > 0 else 'gained'}"
    measured = f"int8 accuracy {int8_accuracy:.4f} vs fp32 {fp32_accuracy:.4f} on {n} labelled pairs: {change}"
    if max_drop is None:
        status, reason = "skipped", f"{measured} (no budget set: not judged)"
    else:
        ok = drop <= max_drop + 1e-12  # accuracies are k/n: keep an exact tie at the budget a pass
        status = "pass" if ok else "fail"
        reason = f"{measured} {'<=' if ok else '>'} the {max_drop * 100:g} pt budget"
    return {"name": "int8_accuracy_drop_vs_fp32", "status": status, "observed": drop, "threshold": max_drop,
            "comparator": "<=", "ci": None, "n": n, "rule": "point", "reason": reason}


def _variant(
    name: str, file: str, reference, logits, limit: float, min_agreement: float, gold=None
) -> VariantParity:
    delta = np.abs(reference - logits)
    worst, mean = float(delta.max()), float(delta.mean())
    agreement = float((reference.argmax(axis=1) == logits.argmax(axis=1)).mean())
    failures = []
    if not np.isfinite(logits).all():
        failures.append(f"{name} logits are not all finite")
    elif worst > limit:
        failures.append(f"{name} max |Δlogit| {worst:.3g} > {limit:g}")
    if agreement < min_agreement:
        failures.append(f"{name} label agreement {agreement:.4f} < {min_agreement:g}")
    return VariantParity(
        variant=name, file=file, n=len(reference), max_abs_logit_delta=worst, mean_abs_logit_delta=mean,
        label_agreement=agreement, max_abs_logit_delta_limit=limit, min_label_agreement=min_agreement,
        failures=failures, accuracy=None if gold is None else float((logits.argmax(axis=1) == gold).mean()),
    )


def parity_check(
    checkpoint_dir: str | Path,
    model_dir: str | Path,
    probe_pairs: Iterable[Any],
    *,
    max_abs_logit_delta: float = 1e-3,
    min_label_agreement: float = 1.0,
    int8_max_abs_logit_delta: float = 0.5,
    int8_min_label_agreement: float = 0.95,
    int8_max_accuracy_drop: float | None = 0.01,
    max_len: int = 512,
    batch_size: int = 8,
    threads: int = 2,
    files: tuple[str, str] = (FP32_FILE, INT8_FILE),
    open_session: Callable[[Path, int], Any] = cpu_session,
) -> ParityReport:
    """Score probe pairs with the PyTorch checkpoint and each ONNX variant; record the differences. When every probe
    is labelled, each variant's accuracy too, and the int8 graph may lose at most `int8_max_accuracy_drop` of
    accuracy against the fp32 graph (None: recorded, not judged). `files` (fp32, int8) and `open_session` check
    another engine's graphs with the same limits (OpenVINO's IR: `openvino_ir.OpenVinoSession`)."""
    with needs_extra("encoders"):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

    probe_pairs = list(probe_pairs)
    pairs = normalized_pairs(probe_pairs)
    labels = probe_labels(probe_pairs)
    gold = None if labels is None else np.array(labels)
    info = check_checkpoint(checkpoint_dir)
    model_dir = Path(model_dir)
    if not (model_dir / files[0]).is_file():
        raise BadInput(f"model directory {model_dir} has no {files[0]}", fix="run export_onnx first")
    shipped = AutoTokenizer.from_pretrained(str(model_dir))
    source = AutoTokenizer.from_pretrained(info.path)
    premises, hypotheses = [p for p, _ in pairs], [h for _, h in pairs]
    shipped_ids = shipped(premises, hypotheses, truncation=False)["input_ids"]
    tokenizer_match = shipped_ids == source(premises, hypotheses, truncation=False)["input_ids"]
    for index, ids in enumerate(shipped_ids):
        if len(ids) > max_len:
            raise BadInput(
                f"probe pair {index} is {len(ids)} tokens, over max_len {max_len}",
                fix="use shorter probe pairs (parity never truncates)",
            )
    variants = [("fp32", files[0], max_abs_logit_delta, min_label_agreement)]
    if (model_dir / files[1]).is_file():
        variants.append(("int8", files[1], int8_max_abs_logit_delta, int8_min_label_agreement))
    sessions = {name: open_session(model_dir / file, threads) for name, file, _, _ in variants}
    model = AutoModelForSequenceClassification.from_pretrained(info.path).eval()
    reference, outputs = [], {name: [] for name in sessions}
    with torch.inference_mode():
        for start in range(0, len(pairs), batch_size):
            batch = shipped(
                premises[start:start + batch_size], hypotheses[start:start + batch_size],
                padding=True, truncation=False, return_tensors="np",
            )
            for name, session in sessions.items():
                feed = {item.name: batch[item.name].astype(np.int64) for item in session.get_inputs()}
                outputs[name].append(session.run(["logits"], feed)[0])
            accepted = {name: torch.from_numpy(batch[name].astype(np.int64)) for name in INPUT_NAMES if name in batch}
            reference.append(model(**accepted).logits.float().numpy())
    ref = np.concatenate(reference)
    report = {
        name: _variant(name, file, ref, np.concatenate(outputs[name]), limit, agreement, gold)
        for name, file, limit, agreement in variants
    }
    failures = [] if tokenizer_match else [
        "the shipped tokenizer tokenizes the probes differently from the checkpoint's"]
    failures += [failure for variant in report.values() for failure in variant.failures]
    budget = None
    if gold is not None and "int8" in report:
        budget = int8_budget_check(report["fp32"].accuracy, report["int8"].accuracy, len(pairs), int8_max_accuracy_drop)
        if budget["status"] == "fail":
            failures.append(f"int8 accuracy budget: {budget['reason']}")
    return ParityReport(n=len(pairs), tokenizer_match=tokenizer_match, variants=report, failures=failures,
                        reference_accuracy=None if gold is None else float((ref.argmax(axis=1) == gold).mean()),
                        int8_budget=budget)


def require_parity(report: ParityReport) -> ParityReport:
    """Raise IntegrityError when parity failed (this stops a release); return the report otherwise."""
    if not report.passed:
        raise IntegrityError(
            f"parity failed: {'; '.join(report.failures)} (n={report.n})",
            fix="re-export from the checkpoint; if it persists, check the exporter/optimizer versions in export.json",
        )
    return report
