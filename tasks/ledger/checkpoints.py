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

The key and the store are protocols (`Signer`, `CheckpointStore`): the local ones live in `tasks.ledger.checkpoint_keys`
and `tasks.ledger.checkpoint_log`, the aws ones (a key in Secrets Manager, an S3 bucket with Object Lock) in
`tasks.backends.aws.checkpoint_store`; signing, serialising and verifying are the same code for both. Checking a proof
needs no ledger: `tasks.ledger.inclusion_proofs`. Importers name all of these from here.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shiplift.tasks.errors import BadInput, Conflict, IntegrityError, NotFound
from shiplift.tasks.ledger import merkle
from shiplift.tasks.ledger.chain_records import content_hash
from shiplift.tasks.ledger.checkpoint_keys import (
    DEFAULT_KEY,
    KEY_ENV,
    PrivateKeySigner,
    PublicKeyOnly,
    Signer,
    SigningKey,
    default_key_path,
    key_id_of,
    load_private_key,
    load_public_key,
    public_pem,
    read_public_key,
)
from shiplift.tasks.ledger.checkpoint_log import (
    LOG_NAME,
    VERSION,
    WITNESS_ENV,
    Checkpoint,
    CheckpointLog,
    CheckpointStore,
    Entry,
    default_witness,
    load_json,
    log_path,
    read_entry,
    serialise,
)
from shiplift.tasks.ledger.events import CHECKPOINTED, LEDGER
from shiplift.tasks.ledger.inclusion_proofs import COVERS, PROOF_FIX, check_proof, proof_records

__all__ = [  # the public face: importers name these from tasks.ledger.checkpoints
    "COVERS", "DEFAULT_KEY", "KEY_ENV", "LOG_NAME", "PROOF_FIX", "VERSION", "WITNESS_ENV", "Checkpoint",
    "CheckpointLog", "CheckpointStore", "Entry", "PrivateKeySigner", "PublicKeyOnly", "Signer", "SigningKey",
    "check_proof", "checkpoint", "default_key_path", "default_witness", "load_json", "load_private_key",
    "load_public_key", "log_path", "proof_records", "prove", "public_pem", "read_entry", "read_public_key",
    "serialise", "verdict_lines", "verify_with_checkpoints",
]

# a store without a lock (S3) refuses an append another writer got in before: read, verify, sign again
APPEND_ATTEMPTS = 5
RECORDED = ("seq", "key_id", "head_hash", "signed_at")  # what the chain's record of a checkpoint names


def _stamp(moment: datetime) -> str:
    """A UTC time with microseconds, always the same width, so stamps compare as text."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
    stamp = _stamp(now or datetime.now(UTC))
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
    if found.key_id != key_id_of(public):
        return (f"checkpoint {where} (seq {found.seq}) names key {found.key_id}, not this ledger's key "
                f"{key_id_of(public)}: signed by another key")
    if not found.signed_by(public):
        return (f"checkpoint {where} (seq {found.seq}) has a signature that does not verify with key "
                f"{key_id_of(public)}: it was forged or edited")
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
    valid = _valid_entries(entries, public, problems)
    key_id = key_id_of(public) if public is not None else None
    witnessed = _witnessed_only(witness, valid, public, problems)
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
                 for found in valid if hashes.get(found.seq) == found.head_hash
                 and _named(_recorded_body(found)) not in in_chain]
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


def _valid_entries(entries: list[Entry], public: Ed25519PublicKey | None, problems: list[str]) -> list[Checkpoint]:
    """The log's checkpoints that verify, in log order; each entry's problem, and each that goes back from the one
    before it, is appended to `problems`."""
    valid: list[Checkpoint] = []
    for where, found, problem in entries:
        wrong = _entry_problem(where, found, problem, public)
        if wrong:
            problems.append(wrong)
            continue
        if valid and (found.seq < valid[-1].seq or found.signed_at < valid[-1].signed_at):
            problems.append(f"checkpoint {where} (seq {found.seq}, {found.signed_at}) goes back from the one "
                            f"before it (seq {valid[-1].seq}, {valid[-1].signed_at})")
        valid.append(found)
    return valid


def _witnessed_only(witness: CheckpointStore | None, valid: list[Checkpoint], public: Ed25519PublicKey | None,
                    problems: list[str]) -> list[Checkpoint]:
    """The witness's valid checkpoints the log lacks (a log cut back or replaced), each also a problem appended to
    `problems`, as is each witness entry's own problem."""
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
    return witnessed


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


def verdict_lines(verification: dict) -> list[str]:
    """A verification for people: a headline naming the checkpoint it was checked against, then each problem."""
    checked = verification.get("checked_against")
    against = (f"; extends the checkpoint of seq {checked['seq']} signed {checked['signed_at']} by key "
               f"{checked['key_id']} (Merkle root {checked['merkle_root']})"
               if checked else "; no signed checkpoint to check it against")
    if verification["ok"]:
        return [f"Ledger verified: {verification['n_records']} records, head {verification['head_hash']}{against}."]
    return [f"Ledger verification FAILED ({verification['n_records']} records{against}):", *verification["problems"]]
