"""The ledger's records as a hash chain: the record and its hash, the checks on what may be appended, the walk that
`Ledger.verify` runs over the stored rows, and the formats `Ledger.export` writes (DESIGN §10).

Each record carries the sha256 of the previous record (`prev_hash`) and its own `record_hash` =
sha256(canonical JSON of every other field, `seq` and `prev_hash` included), so an edited,
deleted, inserted or reordered record breaks the chain and `walk_chain` names it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from shiplift.tasks.errors import BadInput
from shiplift.tasks.hashing import canonical_json, sha256_json
from shiplift.tasks.secret_keys import looks_secret

GENESIS_HASH = "0" * 64
RECORD_FIELDS = (
    "seq",
    "record_hash",
    "prev_hash",
    "release_id",
    "model",
    "stage",
    "event",
    "actor",
    "recorded_at",
    "payload",
)


def check_json(value: Any, path: str) -> None:
    """BadInput naming where `value` (a payload, at `path`) holds what JSON cannot, or a key that looks secret."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadInput(
                f"payload{path} is {value}, which JSON cannot represent",
                fix="record non-finite numbers as null or a string",
            )
        return
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json(item, f"{path}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadInput(
                    f"payload{path} has a non-string key {key!r}",
                    fix="use string keys only",
                )
            if looks_secret(key):
                raise BadInput(
                    f"payload key {path}.{key} looks like a secret; secrets never go into the ledger",
                    fix="drop it, or record a non-secret reference under a neutral key name",
                )
            check_json(item, f"{path}.{key}")
        return
    raise BadInput(
        f"payload{path} is a {type(value).__name__}, which is not JSON",
        fix="convert it first (str(path), dt.isoformat(), float(x), list(array))",
    )


def require_text(name: str, value: Any) -> None:
    """BadInput unless `value` is a non-empty string without surrounding whitespace."""
    if not isinstance(value, str) or not value or value != value.strip():
        raise BadInput(
            f"{name} must be a non-empty string without surrounding whitespace, got {value!r}",
            fix=f"pass a {name} such as 'gemma3-270m'",
        )


@dataclass(frozen=True)
class Record:
    """One ledger record, as stored."""

    seq: int
    record_hash: str
    prev_hash: str
    release_id: str
    model: str
    stage: str
    event: str
    actor: str
    recorded_at: str
    payload: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-able dict (payload as a nested dict)."""
        return {name: getattr(self, name) for name in RECORD_FIELDS}


def content_hash(fields: dict[str, Any]) -> str:
    """A record's hash: of its canonical fields, all but record_hash itself (the chain and proofs recompute it)."""
    return sha256_json({k: v for k, v in fields.items() if k != "record_hash"})


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of a chain verification; `problems` name the seq and what is wrong. `chain` is the (seq,
    record_hash) of every record it checked, in seq order: what checkpoints sign and prove, from the same read."""

    ok: bool
    n_records: int
    head_hash: str | None
    problems: list[str]
    chain: list[tuple[int, str]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The result as a JSON-able dict."""
        return {
            "ok": self.ok,
            "n_records": self.n_records,
            "head_hash": self.head_hash,
            "problems": list(self.problems),
        }


def walk_chain(rows: Iterable[sa.Row], expected_head: str | None, allow_empty: bool) -> VerifyResult:
    """Recompute every hash and link of the stored `rows` (seq order), naming each seq that is wrong; with
    `expected_head`, also require that anchor in the chain. No rows fails unless `allow_empty`."""
    problems: list[str] = []
    chain: list[tuple[int, str]] = []
    last_seq, last_hash = 0, GENESIS_HASH
    anchor_seen = expected_head is None
    for row in rows:
        chain.append((row.seq, row.record_hash))
        if row.seq != last_seq + 1:
            problems.append(
                f"seq {row.seq}: follows seq {last_seq}; records "
                f"{last_seq + 1}..{row.seq - 1} are missing (deleted or renumbered)"
            )
        if row.prev_hash != last_hash:
            problems.append(
                f"seq {row.seq}: prev_hash {row.prev_hash[:16]}... does not link to the "
                f"record before it ({last_hash[:16]}...): a record was deleted, inserted "
                "or reordered"
            )
        fields = row._asdict()
        try:
            fields["payload"] = json.loads(fields["payload"])
        except ValueError:
            problems.append(f"seq {row.seq}: payload is not valid JSON (edited)")
        if content_hash(fields) != row.record_hash:
            problems.append(
                f"seq {row.seq}: record_hash does not match the record's content: "
                "the record was edited"
            )
        anchor_seen = anchor_seen or row.record_hash == expected_head
        last_seq, last_hash = row.seq, row.record_hash
    if not chain and not allow_empty:
        problems.append("the ledger holds no records: every record was deleted, or this is not the ledger expected")
    if not anchor_seen:
        problems.append(
            f"anchored head {expected_head} is not in the ledger: the newest records were "
            "deleted or the chain was rewritten"
        )
    return VerifyResult(
        ok=not problems,
        n_records=len(chain),
        head_hash=last_hash if chain else None,
        problems=problems,
        chain=chain,
    )


def render_json(records: list[Record], verified: VerifyResult) -> str:
    """The records and the verify result as `Ledger.export` writes JSON."""
    document = {"verify": verified.to_dict(), "records": [r.to_dict() for r in records]}
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _row_cells(record: Record) -> list[str]:
    """One record as CSV cells, its payload as canonical JSON."""
    cells = record.to_dict()
    cells["payload"] = canonical_json(record.payload).decode("utf-8")
    return [str(cells[name]) for name in RECORD_FIELDS]


def render_csv(records: list[Record], _verified: VerifyResult) -> str:
    """The records as `Ledger.export` writes CSV (one row a record; the verify result is not in it)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RECORD_FIELDS)
    writer.writerows(_row_cells(record) for record in records)
    return buffer.getvalue()
