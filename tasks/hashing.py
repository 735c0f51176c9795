"""Content hashing shared by artifacts, configs, images and the ledger, and the names content-addressed files are kept
under (`sha256/<digest>/<name>` in both artifact stores and in model.tar.gz)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from shiplift.tasks.errors import BadInput, IntegrityError

CHUNK_BYTES = 1 << 20
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,199}$")


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


def tree_listing(root: str | Path, *,
                 ignore: frozenset[str] = frozenset({"__pycache__", ".pytest_cache"})) -> list[list[str]]:
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


def check_name(name: str) -> str:
    """Validate an artifact file name: one path component of safe characters."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise BadInput(
            f"artifact name {name!r} is not allowed",
            fix="use 1-200 characters of A-Z a-z 0-9 . _ + -, starting with a letter or digit "
            "(e.g. model.tar.gz)",
        )
    return name


def is_sha256(text: object) -> bool:
    """Whether `text` is a lowercase hex sha256 digest."""
    return isinstance(text, str) and _HEX64.match(text) is not None


def check_sha256(sha256: str) -> str:
    """Validate a lowercase hex sha256 digest."""
    if not is_sha256(sha256):
        raise BadInput(
            f"{sha256!r} is not a sha256 digest",
            fix="pass 64 lowercase hex characters",
        )
    return sha256


def verified_bytes(data: bytes | None, sha256: str, where: str, max_bytes: int) -> bytes:
    """`data` read from `where` if it hashes to `sha256`: BadInput when it was too large to read (None),
    IntegrityError when it does not match."""
    if data is None:
        raise BadInput(f"{where} is more than {max_bytes} bytes, more than this reader takes",
                       fix="read it with a command that downloads artifacts (it is not the small file expected)")
    if sha256_bytes(data) != sha256:
        raise IntegrityError(f"{where} hashes to {sha256_bytes(data)}, its name says {sha256}",
                             fix="the stored object is corrupt: restore it from its source and rerun the stage that "
                                 "wrote it")
    return data
