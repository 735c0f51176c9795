"""Signed checkpoints as stored, outside the database: the `Checkpoint` (a signed head), its JSON form, the
`CheckpointStore` protocol and the local store, an append-only file of one JSON checkpoint a line beside the state
dir (the aws store, an S3 bucket with Object Lock, is `tasks.backends.aws.checkpoint_store`). A witness
($SHIPLIFT_CHECKPOINT_WITNESS) is a second such log, on another disk or host.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import canonical_json

WITNESS_ENV = "SHIPLIFT_CHECKPOINT_WITNESS"
LOG_NAME = "ledger-checkpoints.jsonl"
VERSION = 1


def default_witness() -> CheckpointLog | None:
    """The witness log of $SHIPLIFT_CHECKPOINT_WITNESS (a second, independently held copy of the signed heads), or
    None when no witness is set."""
    folder = os.environ.get(WITNESS_ENV)
    return CheckpointLog(log_path(folder)) if folder else None


def log_path(state_dir: str | Path) -> Path:
    """Where a state dir keeps its checkpoints (outside the database, beside it)."""
    return Path(state_dir).expanduser().resolve() / LOG_NAME


@dataclass(frozen=True)
class Checkpoint:
    """A signed head: the chain up to `seq` ends in `head_hash`, its records' Merkle tree has root `merkle_root`,
    as of `signed_at`, by key `key_id`."""

    seq: int
    head_hash: str
    merkle_root: str
    signed_at: str
    key_id: str
    signature: str
    version: int = VERSION

    def body(self) -> dict[str, Any]:
        """What the signature covers: everything but the signature."""
        return {"version": self.version, "seq": self.seq, "head_hash": self.head_hash, "merkle_root": self.merkle_root,
                "signed_at": self.signed_at, "key_id": self.key_id}

    def to_dict(self) -> dict[str, Any]:
        return {**self.body(), "signature": self.signature}

    def signed_by(self, public: Ed25519PublicKey) -> bool:
        try:
            public.verify(base64.b64decode(self.signature, validate=True), canonical_json(self.body()))
        except (InvalidSignature, ValueError):
            return False
        return True


def parse_checkpoint(value: Any) -> Checkpoint:
    """A checkpoint from its JSON object; TypeError or ValueError naming what is not one."""
    fields = {"version", "seq", "head_hash", "merkle_root", "signed_at", "key_id", "signature"}
    if not isinstance(value, dict) or set(value) != fields:
        raise ValueError(f"it does not hold exactly {', '.join(sorted(fields))}")
    if value["version"] != VERSION or not isinstance(value["seq"], int) or isinstance(value["seq"],
                                                                                      bool) or value["seq"] < 1:
        raise ValueError(f"version {value['version']!r} or seq {value['seq']!r} is not one this version writes")
    if not all(isinstance(value[k], str) for k in fields - {"version", "seq"}):
        raise TypeError("head_hash, merkle_root, signed_at, key_id and signature must be strings")
    return Checkpoint(**value)


Entry = tuple[str, Checkpoint | None, str]  # where it is stored, the checkpoint (None: it is not one), what is wrong


def serialise(checkpoint: Checkpoint) -> str:
    """A checkpoint as stored: its JSON object, keys sorted."""
    return json.dumps(checkpoint.to_dict(), sort_keys=True)


def load_json(text: str, source: str, fix: str) -> Any:
    """JSON text read from `source`; BadInput naming what is wrong (not JSON, nested too deep) and `fix`."""
    try:
        return json.loads(text)
    except RecursionError as error:
        raise BadInput(f"{source} is nested too deep to be read as JSON", fix=fix) from error
    except ValueError as error:
        raise BadInput(f"{source} is not JSON: {error}", fix=fix) from error


def read_entry(where: str, text: str) -> Entry:
    """A store's entry from the stored text at `where`: the checkpoint, or None and what is wrong with it. BadInput
    for text nested too deep for any JSON reader (no checkpoint is)."""
    try:
        value = json.loads(text)
    except RecursionError as error:
        raise BadInput(f"checkpoint {where} is nested too deep to be read as JSON: it is not a checkpoint",
                       fix="restore the checkpoints from a backup and investigate who wrote that entry") from error
    except ValueError as error:
        return where, None, f"checkpoint {where} is not a checkpoint ({error})"
    try:
        return where, parse_checkpoint(value), ""
    except (ValueError, TypeError) as error:
        return where, None, f"checkpoint {where} is not a checkpoint ({error})"


class CheckpointStore(Protocol):
    """Where signed checkpoints are kept, outside the database: its entries in append order, and appends."""

    def entries(self) -> list[Entry]: ...

    def locked(self) -> AbstractContextManager[None]: ...

    def append(self, checkpoint: Checkpoint) -> None:
        """Store one more checkpoint after the entries last read; Conflict if another writer appended meanwhile."""


class CheckpointLog:
    """The append-only file of a ledger's checkpoints, one JSON object a line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def entries(self) -> list[Entry]:
        """("line N", checkpoint or None when the line is not one, the line's problem) for every line; BadInput when
        the log cannot be read as text (a directory, not UTF-8)."""
        fix = (f"restore {self.path} from a backup (it holds one JSON checkpoint a line), "
               "or pass the state dir holding it")
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except IsADirectoryError as error:
            raise BadInput(f"the checkpoint log {self.path} is a directory, not a file", fix=fix) from error
        except UnicodeDecodeError as error:
            line = self.path.read_bytes()[: error.start].count(b"\n") + 1
            raise BadInput(f"the checkpoint log {self.path} is not UTF-8 (line {line}, byte {error.start})",
                           fix=fix) from error
        except OSError as error:
            raise BadInput(f"the checkpoint log {self.path} cannot be read: {error}", fix=fix) from error
        return [read_entry(f"line {number}", line) for number, line in enumerate(text.splitlines(), 1)]

    def latest(self) -> Checkpoint | None:
        return next((c for _, c, _ in reversed(self.entries()) if c is not None), None)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the log's lock: two writers never sign heads out of order."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def append(self, checkpoint: Checkpoint) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        with os.fdopen(fd, "a", encoding="utf-8") as handle:
            handle.write(serialise(checkpoint) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
