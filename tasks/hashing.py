"""Content hashing shared by artifacts, configs, images and the ledger."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

CHUNK_BYTES = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, streamed in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes: sorted keys, no whitespace, UTF-8, NaN refused."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def sha256_json(value: Any) -> str:
    return sha256_bytes(canonical_json(value))


def tree_listing(root: str | Path, *, ignore: frozenset[str] = frozenset({"__pycache__", ".pytest_cache"})) -> list[list[str]]:
    """Sorted [relative path, sha256] of every file under a folder (ignored folder names skipped)."""
    root = Path(root)
    return [
        [path.relative_to(root).as_posix(), sha256_file(path)]
        for path in sorted(root.rglob("*"))
        if path.is_file() and not ignore.intersection(path.relative_to(root).parts)
    ]


def sha256_tree(root: str | Path) -> str:
    """Content digest of a folder: the sha256 of its canonical file listing (names and contents)."""
    return sha256_json(tree_listing(root))
