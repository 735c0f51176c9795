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
checkpoint alone (`prove` / `check_proof`), without the rest of the ledger: a proof carries each record's full
content, so what it proves (release, stage, event, seq, payload) is the content the signed root commits to.

Each checkpoint is also recorded in the chain it signs (a record of seq, key id, head hash and time, appended after
the checkpoint is stored), so a checkpoint log that was deleted, emptied or cut back is named by `verify` for as long
as the records naming its checkpoints are there; and, the other way round, every logged checkpoint must have its
record in the chain, so deleting the newest record (the record of the latest checkpoint) is named too. A witness
(RFC 9162's, locally: a folder on another disk or host, $SHIPLIFT_CHECKPOINT_WITNESS) keeps a second copy of every
signed head, so a ledger and log rewound together are named too: `verify` requires the log to hold every checkpoint
the witness holds, and the chain to extend them.

The key and the store are protocols (`Signer`, `CheckpointStore`): the local ones live here, the aws
ones (a key in Secrets Manager, an S3 bucket with Object Lock) in `tasks.backends.aws.checkpoint_store`; signing,
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
from tasks.ledger.events import CHECKPOINTED, LEDGER
from tasks.ledger.store import RECORD_FIELDS, content_hash
from tasks.errors import BadInput, ConfigError, Conflict, IntegrityError, NotFound
from tasks.hashing import canonical_json

KEY_ENV = "SHIPLIFT_CHECKPOINT_KEY"
WITNESS_ENV = "SHIPLIFT_CHECKPOINT_WITNESS"
DEFAULT_KEY = Path("~/.config/shiplift/ledger-ed25519.pem")
LOG_NAME = "ledger-checkpoints.jsonl"
VERSION = 1
APPEND_ATTEMPTS = 5  # a store without a lock (S3) refuses an append another writer got in before: read, verify, sign again
RECORDED = ("seq", "key_id", "head_hash", "signed_at")  # what the chain's record of a checkpoint names


def default_key_path() -> Path:
    """$SHIPLIFT_CHECKPOINT_KEY, else ~/.config/shiplift/ledger-ed25519.pem."""
    return Path(os.environ.get(KEY_ENV) or DEFAULT_KEY).expanduser().resolve()


def default_witness() -> CheckpointLog | None:
    """The witness log of $SHIPLIFT_CHECKPOINT_WITNESS (a second, independently held copy of the signed heads), or
    None when no witness is set."""
    folder = os.environ.get(WITNESS_ENV)
    return CheckpointLog(log_path(folder)) if folder else None


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


def public_pem(public: Ed25519PublicKey) -> str:
    """A verifying key as PEM (SubjectPublicKeyInfo): what `ledger public-key` exports and `--public-key` reads."""
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def read_public_key(path: str | Path) -> Ed25519PublicKey:
    """The Ed25519 public key in the PEM file at `path` (`--public-key`); ConfigError naming what is wrong and the fix."""
    source = Path(path).expanduser()
    fix = "export it where the private key is: `shiplift ledger public-key --out FILE`"
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise ConfigError(f"no public key file {source}", fix=fix) from error
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"the public key file {source} cannot be read: {error}", fix=fix) from error
    try:
        return load_public_key(text)
    except ValueError as error:
        raise ConfigError(f"{source} is {error}", fix=fix) from error


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
        return where, _parse(value), ""
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
        fix = f"restore {self.path} from a backup (it holds one JSON checkpoint a line), or pass the state dir holding it"
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


def checkpoint(ledger, log: CheckpointStore, key: Signer, *, now: datetime | None = None,
               witness: CheckpointStore | None = None) -> Checkpoint:
    """Verify the chain and that it extends every checkpoint (and the witness's, `default_witness`), then sign its
    head and append that to the log, the witness and the chain, under the log's lock; a store without one (S3)
    refuses an append another writer got in before, and then this reads, verifies and signs again. Refuses a broken
    chain (it would be re-signed) and a clock behind the latest checkpoint. `witness` defaults to `default_witness`."""
    witness = witness if witness is not None else default_witness()
    with log.locked():
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            try:
                return _sign_head(ledger, log, key, now, witness)
            except Conflict:
                if attempt == APPEND_ATTEMPTS:
                    raise


def _sign_head(ledger, log: CheckpointStore, key: Signer, now: datetime | None,
               witness: CheckpointStore | None) -> Checkpoint:
    verdict, chain, latest, recorded = _verified(ledger, log, key.public, witness=witness)
    if not chain:
        raise BadInput("the ledger holds no records to checkpoint", fix="run a release first")
    head_seq, head_hash = chain[-1]
    if latest is not None and recorded and recorded[-1] == (head_seq, _recorded_body(latest)):
        head_seq, head_hash = chain[-2]  # the head is the record of the latest checkpoint: nothing new since
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
    if witness is not None:
        witness.append(signed)
    ledger.append(release_id=LEDGER, model=LEDGER, stage=LEDGER, event=CHECKPOINTED, payload=_recorded_body(signed),
                  actor=f"checkpoint key {key.key_id}")
    return signed


def _recorded_body(signed: Checkpoint) -> dict[str, Any]:
    """What the chain's record of a checkpoint holds: enough to name it, and to find it in the log."""
    return {name: getattr(signed, name) for name in RECORDED}


def _recorded(ledger, chain: list[tuple[int, str]]) -> list[tuple[int, dict[str, Any]]]:
    """(seq, payload) of every checkpoint record among the verified records `chain` (read once more, by hash)."""
    if not chain:
        return []
    hashes = dict(chain)
    try:
        records = ledger.release(LEDGER)
    except NotFound:
        return []
    return [(r.seq, r.payload) for r in records
            if hashes.get(r.seq) == r.record_hash and (r.stage, r.event) == (LEDGER, CHECKPOINTED)]


def verify_with_checkpoints(ledger, log: CheckpointStore, public: Ed25519PublicKey | None, *,
                            expected_head: str | None = None, witness: CheckpointStore | None = None) -> dict[str, Any]:
    """The chain's verification (with `expected_head`, also that anchor) plus: every checkpoint is signed by `public`,
    the chain extends it, every checkpoint the chain records is in the log, and (with a `witness`) every checkpoint
    the witness holds is in the log and extended by the chain. The result names each problem, the latest checkpoint
    the ledger was checked against and `recorded_checkpoints`, how many the chain records."""
    return _verified(ledger, log, public, expected_head, witness)[0]


def _entry_problem(where: str, found: Checkpoint | None, problem: str, public: Ed25519PublicKey | None) -> str:
    """What is wrong with one stored checkpoint (empty: it is one, signed by `public`)."""
    if found is None:
        return problem
    if public is None:
        return f"checkpoint {where} cannot be checked: no public key"
    if found.key_id != _key_id(public):
        return (f"checkpoint {where} (seq {found.seq}) names key {found.key_id}, not this ledger's key "
                f"{_key_id(public)}: signed by another key")
    if not found.signed_by(public):
        return (f"checkpoint {where} (seq {found.seq}) has a signature that does not verify with key {_key_id(public)}: "
                "it was forged or edited")
    return ""


def _verified(ledger, log: CheckpointStore, public: Ed25519PublicKey | None, expected_head: str | None = None,
              witness: CheckpointStore | None = None
              ) -> tuple[dict[str, Any], list[tuple[int, str]], Checkpoint | None, list[tuple[int, dict[str, Any]]]]:
    """`verify_with_checkpoints`'s result, the (seq, record_hash) chain the verification read, the latest valid
    checkpoint and the chain's checkpoint records: signing and proving use exactly the records verified."""
    chain = ledger.verify(expected_head=expected_head)
    problems = list(chain.problems)
    entries = log.entries()
    recorded = _recorded(ledger, chain.chain)
    stored = {_named(_recorded_body(found)) for _, found, _ in entries if found is not None}
    problems += [f"record {seq} records the checkpoint of seq {body.get('seq')} signed {body.get('signed_at')} by key "
                 f"{body.get('key_id')}, but no checkpoint store entry holds it: the checkpoint log was deleted, "
                 "emptied or cut back (or this is not the ledger's state dir)"
                 for seq, body in recorded if _named(body) not in stored]
    valid: list[Checkpoint] = []
    key_id = _key_id(public) if public is not None else None
    for where, found, problem in entries:
        wrong = _entry_problem(where, found, problem, public)
        if wrong:
            problems.append(wrong)
            continue
        if valid and (found.seq < valid[-1].seq or found.signed_at < valid[-1].signed_at):
            problems.append(f"checkpoint {where} (seq {found.seq}, {found.signed_at}) goes back from the one "
                            f"before it (seq {valid[-1].seq}, {valid[-1].signed_at})")
        valid.append(found)
    witnessed: list[Checkpoint] = []
    in_log = {(found.seq, found.signature) for found in valid}
    for where, found, problem in witness.entries() if witness is not None else []:
        wrong = _entry_problem(f"witness {where}", found, problem, public)
        if wrong:
            problems.append(wrong)
        elif (found.seq, found.signature) not in in_log:
            problems.append(f"witness {where} holds the checkpoint of seq {found.seq} signed {found.signed_at}, which "
                            "the checkpoint log lacks: the log was cut back or replaced")
            witnessed.append(found)
    hashes = dict(chain.chain)
    for found in [*valid, *witnessed]:
        at = hashes.get(found.seq)
        if at is None:
            problems.append(f"the checkpoint of {found.signed_at} covers seq {found.seq}, but the ledger ends at seq "
                            f"{chain.n_records}: its newest records were deleted (or the database was replaced)")
        elif at != found.head_hash:
            problems.append(f"record {found.seq} hashes to {at[:16]}…, but the checkpoint of {found.signed_at} signed "
                            f"{found.head_hash[:16]}…: the chain was rewritten (or the database was replaced)")
    in_chain = {_named(body) for _, body in recorded}
    problems += [f"the checkpoint of seq {found.seq} signed {found.signed_at} is in the checkpoint log, but no record "
                 f"of the chain (which ends at seq {chain.n_records}) records it: the record appended after it was "
                 "signed was deleted (the newest records were), or the database was replaced"
                 for found in valid if hashes.get(found.seq) == found.head_hash and _named(_recorded_body(found)) not in in_chain]
    latest = valid[-1] if valid else None
    if latest is not None and latest.seq in hashes:
        computed = merkle.root(_leaves(chain.chain[: latest.seq])).hex()
        if computed != latest.merkle_root:
            problems.append(f"the Merkle root of records 1..{latest.seq} is {computed[:16]}…, but the checkpoint of "
                            f"{latest.signed_at} signed {latest.merkle_root[:16]}…: the records were rewritten")
    verdict = {"ok": not problems, "n_records": chain.n_records, "head_hash": chain.head_hash, "problems": problems,
               "checkpoints": len(entries), "checked_against": latest.to_dict() if latest else None, "key_id": key_id,
               "recorded_checkpoints": len(recorded)}
    return verdict, chain.chain, latest, recorded


def _named(body: dict[str, Any]) -> tuple:
    """A checkpoint record's body as a hashable key (what it names of the checkpoint, in RECORDED order)."""
    return tuple(body.get(name) for name in RECORDED)


def _leaves(chain: list[tuple[int, str]]) -> list[bytes]:
    """The Merkle leaves of (seq, record_hash) pairs, in the order given (seq order)."""
    return [merkle.leaf(bytes.fromhex(record_hash)) for _, record_hash in chain]


def prove(ledger, log: CheckpointStore, release_id: str, public: Ed25519PublicKey) -> dict[str, Any]:
    """An inclusion proof of one release's records in the latest checkpoint that verifies: each record's full content
    (re-checked against the verified chain) with its audit path (O(log n) hashes), and what it covers (`covers`: the
    release, how many records and their seqs, the checkpoint's seq and head hash), so a proof with records cut out is
    refused by `check_proof`. Records after that checkpoint are listed as not yet covered."""
    verdict, chain, latest, _ = _verified(ledger, log, public)
    if not verdict["ok"]:
        raise IntegrityError("the ledger does not verify against its checkpoints, so nothing is proven from it: "
                             + "; ".join(verdict["problems"]), fix="run `shiplift ledger verify` and investigate")
    if latest is None:
        raise NotFound("the ledger has no checkpoint to prove against", fix="run `shiplift ledger checkpoint` first")
    mine = ledger.release(release_id)  # NotFound for an unknown release
    hashes = dict(chain)
    changed = [r.seq for r in mine if hashes.get(r.seq) != r.record_hash or content_hash(r.to_dict()) != r.record_hash]
    if changed:
        raise IntegrityError(f"records {changed} of {release_id} changed after the ledger was verified",
                             fix="run `shiplift ledger verify` and investigate who is writing the database")
    tree = merkle.Tree(_leaves(chain[: latest.seq]))
    covered = [r for r in mine if r.seq <= latest.seq]
    return {"release_id": release_id, "checkpoint": latest.to_dict(),
            "covers": {"release_id": release_id, "records": len(covered), "seqs": [r.seq for r in covered],
                       "checkpoint_seq": latest.seq, "head_hash": latest.head_hash},
            "records": [{**r.to_dict(), "path": [h.hex() for h in tree.audit_path(r.seq - 1)]} for r in covered],
            "not_yet_checkpointed": [r.seq for r in mine if r.seq > latest.seq]}


PROOF_FIX = "pass the file `shiplift ledger prove RELEASE --out FILE` wrote, unedited"


def proof_records(proof: Any) -> list[dict[str, Any]]:
    """The records a proof claims, each a record's full content and its audit path; BadInput for a proof that is not
    an object, proves no record, repeats one, holds a field of the wrong type, or does not state what it covers."""
    if not isinstance(proof, dict):
        raise BadInput(f"the proof is not a JSON object (it is {type(proof).__name__})", fix=PROOF_FIX)
    if not isinstance(proof.get("release_id"), str):
        raise BadInput("the proof names no release_id", fix=PROOF_FIX)
    if "records" not in proof:
        raise BadInput("the proof has no records: it proves nothing", fix=PROOF_FIX)
    records = proof["records"]
    if not isinstance(records, list):
        raise BadInput(f"the proof's records must be a list, not {type(records).__name__}", fix=PROOF_FIX)
    if not records:
        raise BadInput("the proof proves no record: its records are empty", fix=PROOF_FIX)
    fields, seen = {*RECORD_FIELDS, "path"}, set()
    for number, entry in enumerate(records, 1):
        if not isinstance(entry, dict):
            raise BadInput(f"record {number} of the proof is not an object", fix=PROOF_FIX)
        if set(entry) != fields:
            raise BadInput(f"record {number} of the proof does not hold exactly {', '.join(sorted(fields))}", fix=PROOF_FIX)
        seq = entry["seq"]
        if type(seq) is not int or seq < 1:
            raise BadInput(f"record {number} of the proof: seq must be a whole number from 1, not {seq!r}", fix=PROOF_FIX)
        texts = [name for name in RECORD_FIELDS if name not in ("seq", "payload")]
        if not (all(isinstance(entry[name], str) for name in texts) and isinstance(entry["payload"], dict)
                and isinstance(entry["path"], list) and all(isinstance(h, str) for h in entry["path"])):
            raise BadInput(f"record {seq} of the proof: {', '.join(texts)} must be strings, payload an object and path "
                           "a list of hex strings", fix=PROOF_FIX)
        if seq in seen:
            raise BadInput(f"record {seq} appears more than once in the proof", fix=PROOF_FIX)
        seen.add(seq)
    _require_covers(proof.get("covers"))
    return records


COVERS = {"release_id": str, "records": int, "seqs": list, "checkpoint_seq": int, "head_hash": str}


def _require_covers(covers: Any) -> None:
    """BadInput unless the proof states what it covers (`prove`'s `covers`), with the right types."""
    if not isinstance(covers, dict) or set(covers) != set(COVERS):
        raise BadInput(f"the proof does not state what it covers (an object `covers` holding exactly "
                       f"{', '.join(sorted(COVERS))}): a proof from before it did, or an edited one",
                       fix="prove the release again with `shiplift ledger prove RELEASE --out FILE`")
    if not (all(type(covers[name]) is kind for name, kind in COVERS.items())
            and all(type(seq) is int for seq in covers["seqs"])):
        raise BadInput("the proof's `covers`: release_id and head_hash must be strings, records and checkpoint_seq whole "
                       "numbers, seqs a list of whole numbers", fix=PROOF_FIX)


def _coverage_problems(proof: dict[str, Any], signed: Checkpoint) -> list[str]:
    """Where the proof's records or checkpoint differ from what it states it covers (a proof cut down or spliced)."""
    covers, held = proof["covers"], sorted(entry["seq"] for entry in proof["records"])
    problems = []
    if (covers["release_id"], covers["checkpoint_seq"], covers["head_hash"]) != (proof["release_id"], signed.seq,
                                                                                 signed.head_hash):
        problems.append(f"the proof states it covers release {covers['release_id']} in the checkpoint of seq "
                        f"{covers['checkpoint_seq']} (head {covers['head_hash'][:16]}…), but holds release "
                        f"{proof['release_id']} and the checkpoint of seq {signed.seq} (head {signed.head_hash[:16]}…)")
    if covers["records"] != len(covers["seqs"]) or held != sorted(covers["seqs"]):
        missing = sorted(set(covers["seqs"]) - set(held))
        problems.append(f"the proof states it covers {covers['records']} records (seqs {covers['seqs']}) but holds "
                        f"{len(held)} (seqs {held})" + (f": records {missing} were cut out" if missing else ""))
    return problems


def check_proof(proof: Any, public: Ed25519PublicKey) -> list[str]:
    """What is wrong with an inclusion proof, checked with the public key alone (no ledger): the checkpoint's
    signature and key, that it holds exactly the records it states it covers (release, count, seqs, checkpoint), then
    that each record is of the proof's release, hashes to its record_hash from its full content, and has a path to the
    signed Merkle root. Empty when it proves every record; BadInput when the proof is malformed (`proof_records`)."""
    records = proof_records(proof)
    try:
        signed = _parse(proof.get("checkpoint"))
    except (TypeError, ValueError) as error:
        return [f"the proof's checkpoint is not one ({error})"]
    if signed.key_id != _key_id(public):
        return [f"the proof's checkpoint names key {signed.key_id}, not {_key_id(public)}: signed by another key"]
    if not signed.signed_by(public):
        return ["the proof's checkpoint signature does not verify: it was forged or edited"]
    problems = []
    root = bytes.fromhex(signed.merkle_root)
    for entry in records:
        seq = entry["seq"]
        if entry["release_id"] != proof["release_id"]:
            problems.append(f"record {seq} is of release {entry['release_id']}, not of release {proof['release_id']}: "
                            "the proof does not prove what it claims")
        elif content_hash({name: entry[name] for name in RECORD_FIELDS}) != entry["record_hash"]:
            problems.append(f"record {seq}'s content does not hash to its record_hash: the record was edited")
        elif not _included(entry, signed, root):
            problems.append(f"record {seq} is not proven included in the checkpoint of {signed.signed_at}")
    return problems + _coverage_problems(proof, signed)


def _included(entry: dict[str, Any], signed: Checkpoint, root: bytes) -> bool:
    """Whether a proof record's audit path leads from its record_hash to the checkpoint's signed Merkle root."""
    try:
        path = [bytes.fromhex(h) for h in entry["path"]]
        return merkle.included(merkle.leaf(bytes.fromhex(entry["record_hash"])), entry["seq"] - 1, signed.seq, path, root)
    except ValueError:
        return False


def verdict_lines(verification: dict) -> list[str]:
    """A verification for people: a headline naming the checkpoint it was checked against, then each problem."""
    checked = verification.get("checked_against")
    against = (f"; extends the checkpoint of seq {checked['seq']} signed {checked['signed_at']} by key {checked['key_id']} "
               f"(Merkle root {checked['merkle_root']})" if checked else "; no signed checkpoint to check it against")
    if verification["ok"]:
        return [f"Ledger verified: {verification['n_records']} records, head {verification['head_hash']}{against}."]
    return [f"Ledger verification FAILED ({verification['n_records']} records{against}):", *verification["problems"]]
