"""Inclusion proofs of one release's records, checked with the public key alone (no ledger): the checkpoint's
signature, that the proof holds exactly the records it states it covers, that each record hashes to its record_hash
from its full content, and each audit path (RFC 6962) leads to the signed Merkle root. `prove` in
`tasks.ledger.checkpoints` writes them.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from shiplift.tasks.errors import BadInput
from shiplift.tasks.ledger import merkle
from shiplift.tasks.ledger.chain_records import RECORD_FIELDS, content_hash
from shiplift.tasks.ledger.checkpoint_keys import key_id_of
from shiplift.tasks.ledger.checkpoint_log import Checkpoint, parse_checkpoint

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
    seen = set()
    for number, entry in enumerate(records, 1):
        seq = _record_seq(number, entry)
        if seq in seen:
            raise BadInput(f"record {seq} appears more than once in the proof", fix=PROOF_FIX)
        seen.add(seq)
    _require_covers(proof.get("covers"))
    return records


def _record_seq(number: int, entry: Any) -> int:
    """The seq of the proof's record `number` (from 1); BadInput unless it is an object holding exactly a record's
    fields and its path, each of the right type."""
    if not isinstance(entry, dict):
        raise BadInput(f"record {number} of the proof is not an object", fix=PROOF_FIX)
    fields = {*RECORD_FIELDS, "path"}
    if set(entry) != fields:
        raise BadInput(f"record {number} of the proof does not hold exactly {', '.join(sorted(fields))}",
                       fix=PROOF_FIX)
    seq = entry["seq"]
    if type(seq) is not int or seq < 1:
        raise BadInput(f"record {number} of the proof: seq must be a whole number from 1, not {seq!r}",
                       fix=PROOF_FIX)
    texts = [name for name in RECORD_FIELDS if name not in ("seq", "payload")]
    if not (all(isinstance(entry[name], str) for name in texts) and isinstance(entry["payload"], dict)
            and isinstance(entry["path"], list) and all(isinstance(h, str) for h in entry["path"])):
        raise BadInput(f"record {seq} of the proof: {', '.join(texts)} must be strings, payload an object and path "
                       "a list of hex strings", fix=PROOF_FIX)
    return seq


COVERS = {"release_id": str, "records": int, "seqs": list, "checkpoint_seq": int, "head_hash": str}


def _require_covers(covers: Any) -> None:
    """BadInput unless the proof states what it covers (`prove`'s `covers`), with the right types."""
    if not isinstance(covers, dict) or set(covers) != set(COVERS):
        raise BadInput(f"the proof does not state what it covers (an object `covers` holding exactly "
                       f"{', '.join(sorted(COVERS))}): a proof from before it did, or an edited one",
                       fix="prove the release again with `shiplift ledger prove RELEASE --out FILE`")
    if not (all(type(covers[name]) is kind for name, kind in COVERS.items())
            and all(type(seq) is int for seq in covers["seqs"])):
        raise BadInput("the proof's `covers`: release_id and head_hash must be strings, records and checkpoint_seq "
                       "whole numbers, seqs a list of whole numbers", fix=PROOF_FIX)


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
        signed = parse_checkpoint(proof.get("checkpoint"))
    except (TypeError, ValueError) as error:
        return [f"the proof's checkpoint is not one ({error})"]
    if signed.key_id != key_id_of(public):
        return [f"the proof's checkpoint names key {signed.key_id}, not {key_id_of(public)}: signed by another key"]
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
        return merkle.included(merkle.leaf(bytes.fromhex(entry["record_hash"])), entry["seq"] - 1, signed.seq, path,
                               root)
    except ValueError:
        return False

