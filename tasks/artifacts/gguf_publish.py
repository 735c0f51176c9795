"""Atomic GGUF file writes: a temporary file beside the target, published only where the target is absent or
already holds the same bytes (never overwriting other content)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shiplift.tasks.errors import Conflict
from shiplift.tasks.hashing import sha256_file


def temp_path(dst: Path) -> Path:
    """A fresh, empty temporary file next to dst (same filesystem, so rename is atomic)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    return Path(name)


def publish(tmp: Path, dst: Path) -> Path:
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
