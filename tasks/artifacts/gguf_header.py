"""The GGUF header reader (`inspect_gguf`): what a GGUF file says about itself (`GgufInfo`), refusing files that are
not GGUF or are truncated, without loading its arrays or tensors."""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from shiplift.tasks.errors import BadInput, NotFound

GGUF_MAGIC = b"GGUF"

# llama.cpp's llama_ftype numbering (llama.h), as written to general.file_type.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS",
    23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

SHAPE_KEYS = {"block_count": "block_count", "head_count": "attention.head_count",
              "head_count_kv": "attention.head_count_kv",
              "embedding_length": "embedding_length", "key_length": "attention.key_length",
              "value_length": "attention.value_length"}


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
    block_count: int | None = None  # the shape fields size the KV cache (tasks.families.gguf_decisions.gguf_memory)
    head_count: int | None = None
    head_count_kv: int | None = None
    embedding_length: int | None = None
    key_length: int | None = None
    value_length: int | None = None
    has_chat_template: bool = False  # tokenizer.chat_template is set (the chat path formats messages with it)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return asdict(self)


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
