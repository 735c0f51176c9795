"""Atomic file writes: a fsynced temporary file in the same folder, then a rename.

Readers see the old file or the new one, never half of one; a failure leaves nothing behind.
Standard library only, so the router process can use it too.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_bytes_atomic(path: str | Path, data: bytes, *, mode: int = 0o644) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str, *, mode: int = 0o644) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_json_atomic(path: str | Path, value: Any, *, mode: int = 0o644) -> Path:
    """Pretty, key-sorted JSON (NaN refused) written atomically; `mode` 0o600 for a file holding a secret."""
    return write_text_atomic(path, json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n", mode=mode)
