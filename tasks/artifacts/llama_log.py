"""llama.cpp's log, captured: its warning and error lines are collected for the error a failed call raises instead
of being printed."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LLAMA_LOG_LOCK = threading.Lock()  # llama.cpp's log callback is process-global
_LOG_LINES_KEPT = 40


@contextmanager
def captured_llama_log() -> Iterator[list[str]]:
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
