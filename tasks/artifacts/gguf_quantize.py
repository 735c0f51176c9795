"""GGUF quantization with llama.cpp's quantizer (`llama_cpp.llama_model_quantize`), written atomically."""

from __future__ import annotations

import ctypes
from pathlib import Path

from shiplift.tasks.artifacts.gguf_header import FILE_TYPES, inspect_gguf
from shiplift.tasks.artifacts.gguf_publish import publish, temp_path
from shiplift.tasks.artifacts.llama_log import captured_llama_log
from shiplift.tasks.errors import BadInput, ConfigError

# Targets llama_model_quantize can produce without an importance matrix.
QUANT_TYPES: dict[str, int] = {
    name: ftype
    for ftype, name in FILE_TYPES.items()
    if name in {
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K_S", "Q3_K_M",
        "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
    }
}


def quant_type(qtype: str) -> int:
    """llama_ftype id of a quantization name, or ConfigError listing the valid names."""
    if qtype not in QUANT_TYPES:
        raise ConfigError(
            f"unknown GGUF quantization type {qtype!r}",
            fix=f"use one of {', '.join(sorted(QUANT_TYPES))}",
        )
    return QUANT_TYPES[qtype]


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

    ftype = quant_type(qtype)
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
    tmp = temp_path(target)
    try:
        with captured_llama_log() as log:
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
        return publish(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
