"""Signed checkpoints of the ledger's head: what makes a rewritten chain detectable (DESIGN §10).

The hash chain alone detects a naive edit, but whoever can write the database can edit a record and
recompute every later hash, or delete the newest records. A checkpoint signs the head (sequence
number, head hash, time) with an Ed25519 key the database does not hold (a key file outside the
state dir, created 0600 on first use) and is appended to a file outside the database. `verify`
then checks the chain *and* that it extends every valid checkpoint: a rewritten chain (the record at
a checkpoint's seq has another hash), a truncated tail (fewer records than a checkpoint covers), a
replaced database (both), a forged checkpoint (its signature fails) and one signed by another key
are each named. The checkpoint also signs the Merkle root (RFC 6962) over the record hashes up to
its seq, so one release's records can be proven included with O(log n) hashes and the signed
checkpoint alone (`prove` / `check_proof`), without the rest of the ledger.

The key and the store are protocols (`Signer`, `CheckpointStore`): the local ones live here, the aws
ones (a key in Secrets Manager, an S3 bucket with Object Lock) in `tasks.backends.aws.checkpoints`; signing,
serialising and verifying are the same code for both.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import stat
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator, Protocol

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tasks.ledger import merkle
from tasks.errors import BadInput, ConfigError, Conflict, IntegrityError, NotFound
from tasks.hashing import canonical_json

KEY_ENV = "SHIPLIFT_CHECKPOINT_KEY"
DEFAULT_KEY = Path("~/.config/shiplift/ledger-ed25519.pem")
LOG_NAME = "ledger-checkpoints.jsonl"
VERSION = 1
APPEND_ATTEMPTS = 5  # a store without a lock (S3) refuses an append another writer got in before: read, verify, sign again


def default_key_path() -> Path:
    """$SHIPLIFT_CHECKPOINT_KEY, else ~/.config/shiplift/ledger-ed25519.pem."""
    return Path(os.environ.get(KEY_ENV) or DEFAULT_KEY).expanduser().resolve()


def log_path(state_dir: str | Path) -> Path:
    """Where a state dir keeps its checkpoints (outside the database, beside it)."""
    return Path(state_dir).expanduser().resolve() / LOG_NAME


def _key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_private_key(pem: bytes, source: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM (PKCS#8) text read from `source`; IntegrityError naming what else it is."""
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except ValueError as error:
        raise IntegrityError(f"{source} is not a PEM private key: {error}", fix=f"restore {source}") from error
    if not isinstance(private, Ed25519PrivateKey):
        raise IntegrityError(f"{source} holds a {type(private).__name__}, not an Ed25519 key",
                             fix="restore the key that signed this ledger's checkpoints")
    return private


def load_public_key(pem: str) -> Ed25519PublicKey:
    """The Ed25519 public key in PEM (SubjectPublicKeyInfo) text; ValueError saying what else it is (never echoing it)."""
    if "PRIVATE KEY" in pem:
        raise ValueError("this is a private key: the config holds only the public half (openssl pkey -pubout)")
    try:
        public = serialization.load_pem_public_key(pem.encode())
    except (ValueError, UnsupportedAlgorithm) as error:
        raise ValueError(f"not a PEM public key ({error})") from error
    if not isinstance(public, Ed25519PublicKey):
        raise ValueError(f"a {type(public).__name__}, not an Ed25519 public key")
    return public


class Signer(Protocol):
    """What signs checkpoints: an Ed25519 key, its public half and the id checkpoints name it by."""

    key_id: str
    public: Ed25519PublicKey

    def sign(self, body: dict[str, Any]) -> str: ...


class PrivateKeySigner:
    """A `Signer` over an Ed25519 private key held in memory (the local key file's, or one fetched from AWS)."""

    def __init__(self, private: Ed25519PrivateKey):
        self.private = private
        self.public = private.public_key()
        self.key_id = _key_id(self.public)

    def sign(self, body: dict[str, Any]) -> str:
        """The base64 Ed25519 signature of a checkpoint body's canonical JSON."""
        return base64.b64encode(self.private.sign(canonical_json(body))).decode()


class PublicKeyOnly:
    """A verify-only `Signer`: a public key and its id, for whoever verifies but must never hold the private key."""

    def __init__(self, public: Ed25519PublicKey):
        self.public = public
        self.key_id = _key_id(public)

    def sign(self, body: dict[str, Any]) -> str:
        raise ConfigError(f"key {self.key_id} is a public key only: it verifies checkpoints but cannot sign them",
                          fix="sign where the private key is (`shiplift ledger checkpoint`, a release's end)")


class SigningKey(PrivateKeySigner):
    """The Ed25519 key that signs checkpoints: read from a 0600 file, or created there on first use."""

    def __init__(self, path: str | Path, *, state_dir: str | Path | None = None, create: bool = True):
        self.path = Path(path).expanduser().resolve()
        if state_dir is not None and self.path.is_relative_to(Path(state_dir).expanduser().resolve()):
            raise ConfigError(f"the checkpoint key {self.path} is inside the state dir {state_dir}: whoever can rewrite "
                              "the ledger there could re-sign it too",
                              fix=f"keep the key elsewhere (${KEY_ENV}, default {DEFAULT_KEY})")
        if not self.path.exists():
            if not create:
                raise NotFound(f"no checkpoint key at {self.path}",
                               fix=f"point ${KEY_ENV} at the key that signed this ledger's checkpoints")
            self._create()
        mode = stat.S_IMODE(self.path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(f"the checkpoint key {self.path} is readable by others (mode {mode:o})",
                              fix=f"chmod 600 {self.path}")
        super().__init__(load_private_key(self.path.read_bytes(), str(self.path)))

    def _create(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption())
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrites a key
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
            handle.flush()
            os.fsync(handle.fileno())


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


def _parse(value: Any) -> Checkpoint:
    """A checkpoint from its JSON object; TypeError or ValueError naming what is not one."""
    fields = {"version", "seq", "head_hash", "merkle_root", "signed_at", "key_id", "signature"}
    if not isinstance(value, dict) or set(value) != fields:
        raise ValueError(f"it does not hold exactly {', '.join(sorted(fields))}")
    if value["version"] != VERSION or not isinstance(value["seq"], int) or isinstance(value["seq"], bool) or value["seq"] < 1:
        raise ValueError(f"version {value['version']!r} or seq {value['seq']!r} is not one this version writes")
    if not all(isinstance(value[k], str) for k in fields - {"version", "seq"}):
        raise TypeError("head_hash, merkle_root, signed_at, key_id and signature must be strings")
    return Checkpoint(**value)


def _stamp(moment: datetime) -> str:
    """A UTC time with microseconds, always the same width, so stamps compare as text."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Entry = tuple[str, Checkpoint | None, str]  # where it is stored, the checkpoint (None: it is not one), what is wrong


def serialise(checkpoint: Checkpoint) -> str:
    """A checkpoint as stored: its JSON object, keys sorted."""
    return json.dumps(checkpoint.to_dict(), sort_keys=True)


def read_entry(where: str, text: str) -> Entry:
    """A store's entry from the stored text at `where`: the checkpoint, or None and what is wrong with it."""
    try:
        return where, _parse(json.loads(text)), ""
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
        """("line N", checkpoint or None when the line is not one, the line's problem) for every line."""
        if not self.path.exists():
            return []
        return [read_entry(f"line {number}", line)
                for number, line in enumerate(self.path.read_text(encoding="utf-8").splitlines(), 1)]

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


def checkpoint(ledger, log: CheckpointStore, key: Signer, *, now: datetime | None = None) -> Checkpoint:
    """Verify the chain and that it extends every checkpoint, then sign its head and append that, under the log's
    lock; a store without one (S3) refuses an append another writer got in before, and then this reads, verifies
    and signs again. Refuses a broken chain (it would be re-signed) and a clock behind the latest checkpoint."""
    with log.locked():
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            try:
                return _sign_head(ledger, log, key, now)
            except Conflict:
                if attempt == APPEND_ATTEMPTS:
                    raise


def _sign_head(ledger, log: CheckpointStore, key: Signer, now: datetime | None) -> Checkpoint:
    verdict, chain, latest = _verified(ledger, log, key.public)
    if not chain:
        raise BadInput("the ledger holds no records to checkpoint", fix="run a release first")
    head_seq, head_hash = chain[-1]
    if not verdict["ok"]:
        raise IntegrityError("the ledger does not verify, so its head is not signed: " + "; ".join(verdict["problems"]),
                             fix="investigate the tampering; a checkpoint never re-signs a broken chain")
    stamp = _stamp(now or datetime.now(timezone.utc))
    if latest is not None and stamp < latest.signed_at:
        raise IntegrityError(f"the clock reads {stamp}, before the latest checkpoint ({latest.signed_at})",
                             fix="fix the system clock; checkpoints must not go back in time")
    if latest is not None and (latest.seq, latest.head_hash) == (head_seq, head_hash):
        return latest  # nothing new since
    body = {"version": VERSION, "seq": head_seq, "head_hash": head_hash,
            "merkle_root": merkle.root(_leaves(chain)).hex(), "signed_at": stamp, "key_id": key.key_id}
    signed = Checkpoint(signature=key.sign(body), **body)
    log.append(signed)
    return signed


def verify_with_checkpoints(ledger, log: CheckpointStore, public: Ed25519PublicKey | None) -> dict[str, Any]:
    """The chain's verification plus: every checkpoint is signed by `public` and the chain extends it. The result
    names each problem and the latest checkpoint the ledger was checked against."""
    return _verified(ledger, log, public)[0]


def _verified(ledger, log: CheckpointStore, public: Ed25519PublicKey | None
              ) -> tuple[dict[str, Any], list[tuple[int, str]], Checkpoint | None]:
    """`verify_with_checkpoints`'s result, the (seq, record_hash) chain the verification read and the latest valid
    checkpoint: signing and proving use exactly the records verified, from one read of the ledger."""
    chain = ledger.verify()
    problems = list(chain.problems)
    entries = log.entries()
    valid: list[Checkpoint] = []
    key_id = _key_id(public) if public is not None else None
    for where, found, problem in entries:
        if found is None:
            problems.append(problem)
        elif public is None:
            problems.append(f"checkpoint {where} cannot be checked: no public key")
        elif found.key_id != key_id:
            problems.append(f"checkpoint {where} (seq {found.seq}) names key {found.key_id}, not this ledger's "
                            f"key {key_id}: signed by another key")
        elif not found.signed_by(public):
            problems.append(f"checkpoint {where} (seq {found.seq}) has a signature that does not verify with key "
                            f"{key_id}: it was forged or edited")
        else:
            if valid and (found.seq < valid[-1].seq or found.signed_at < valid[-1].signed_at):
                problems.append(f"checkpoint {where} (seq {found.seq}, {found.signed_at}) goes back from the one "
                                f"before it (seq {valid[-1].seq}, {valid[-1].signed_at})")
            valid.append(found)
    hashes = dict(chain.chain)
    for found in valid:
        at = hashes.get(found.seq)
        if at is None:
            problems.append(f"the checkpoint of {found.signed_at} covers seq {found.seq}, but the ledger ends at seq "
                            f"{chain.n_records}: its newest records were deleted (or the database was replaced)")
        elif at != found.head_hash:
            problems.append(f"record {found.seq} hashes to {at[:16]}…, but the checkpoint of {found.signed_at} signed "
                            f"{found.head_hash[:16]}…: the chain was rewritten (or the database was replaced)")
    latest = valid[-1] if valid else None
    if latest is not None and latest.seq in hashes:
        computed = merkle.root(_leaves(chain.chain[: latest.seq])).hex()
        if computed != latest.merkle_root:
            problems.append(f"the Merkle root of records 1..{latest.seq} is {computed[:16]}…, but the checkpoint of "
                            f"{latest.signed_at} signed {latest.merkle_root[:16]}…: the records were rewritten")
    verdict = {"ok": not problems, "n_records": chain.n_records, "head_hash": chain.head_hash, "problems": problems,
               "checkpoints": len(entries), "checked_against": latest.to_dict() if latest else None, "key_id": key_id}
    return verdict, chain.chain, latest


def _leaves(chain: list[tuple[int, str]]) -> list[bytes]:
    """The Merkle leaves of (seq, record_hash) pairs, in the order given (seq order)."""
    return [merkle.leaf(bytes.fromhex(record_hash)) for _, record_hash in chain]


def prove(ledger, log: CheckpointStore, release_id: str, public: Ed25519PublicKey) -> dict[str, Any]:
    """An inclusion proof of one release's records in the latest checkpoint that verifies: each record with its
    index and audit path (O(log n) hashes). Records after that checkpoint are listed as not yet covered."""
    verdict, chain, latest = _verified(ledger, log, public)
    if not verdict["ok"]:
        raise IntegrityError("the ledger does not verify against its checkpoints, so nothing is proven from it: "
                             + "; ".join(verdict["problems"]), fix="run `shiplift ledger verify` and investigate")
    if latest is None:
        raise NotFound("the ledger has no checkpoint to prove against", fix="run `shiplift ledger checkpoint` first")
    mine = ledger.release(release_id)  # NotFound for an unknown release
    tree = merkle.Tree(_leaves(chain[: latest.seq]))
    covered = [r for r in mine if r.seq <= latest.seq]
    return {"release_id": release_id, "checkpoint": latest.to_dict(),
            "records": [{"seq": r.seq, "record_hash": r.record_hash, "stage": r.stage, "event": r.event,
                         "path": [h.hex() for h in tree.audit_path(r.seq - 1)]} for r in covered],
            "not_yet_checkpointed": [r.seq for r in mine if r.seq > latest.seq]}


def check_proof(proof: dict[str, Any], public: Ed25519PublicKey) -> list[str]:
    """What is wrong with an inclusion proof, checked with the public key alone (no ledger): the checkpoint's
    signature and key, then each record's path to the signed Merkle root. Empty when it proves every record."""
    try:
        signed = _parse(proof["checkpoint"])
    except (KeyError, TypeError, ValueError) as error:
        return [f"the proof's checkpoint is not one ({error})"]
    if signed.key_id != _key_id(public):
        return [f"the proof's checkpoint names key {signed.key_id}, not {_key_id(public)}: signed by another key"]
    if not signed.signed_by(public):
        return ["the proof's checkpoint signature does not verify: it was forged or edited"]
    problems = []
    root = bytes.fromhex(signed.merkle_root)
    for entry in proof.get("records", []):
        try:
            path = [bytes.fromhex(h) for h in entry["path"]]
            ok = merkle.included(merkle.leaf(bytes.fromhex(entry["record_hash"])), entry["seq"] - 1, signed.seq, path, root)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            problems.append(f"record {entry.get('seq')} is not proven included in the checkpoint of {signed.signed_at}")
    return problems
