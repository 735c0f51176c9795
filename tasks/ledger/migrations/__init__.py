"""Alembic migrations of the ledger's tables, run by tasks/ledger/schema.py (no alembic.ini).

Forward only: the ledger is append-only and a downgrade would drop what newer code recorded.
`baseline_tables` is revision 0001's schema, frozen: exactly what `create_all` made in every
shiplift before migrations, so such a ledger is recognised as 0001 by comparing against it.
`lease_holder_columns` are what revision 0002 adds to the leases, and `head_tables` the schema this code reads.
"""

from __future__ import annotations

import sqlalchemy as sa

BASELINE_REVISION = "0001"
LEASE_HOLDER_REVISION = "0002"


def baseline_tables(schema: str | None) -> tuple[sa.Table, sa.Table]:
    """The records and leases tables of revision 0001, in `schema` (PostgreSQL) or the default one."""
    metadata = sa.MetaData(schema=schema)
    records = sa.Table(
        "ledger_records",
        metadata,
        sa.Column("seq", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("record_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("prev_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("release_id", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("stage", sa.Text, nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Index("ix_ledger_records_release", "release_id"),
        sa.Index("ix_ledger_records_model", "model", "stage", "event", "recorded_at"),
    )
    leases = sa.Table(
        "leases",
        metadata,
        sa.Column("model", sa.Text, primary_key=True),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("release_id", sa.Text, nullable=False),
        sa.Column("acquired_at", sa.String(32), nullable=False),
        sa.Column("expires_at", sa.String(32), nullable=False),
    )
    return records, leases


def lease_holder_columns() -> list[sa.Column]:
    """Revision 0002's lease columns: who holds a lease is its random token and, for a run's lease, the host and pid of
    its process, with the time the holder last renewed it (liveness never reads the holder's name)."""
    return [
        sa.Column("token", sa.String(32), nullable=True),  # NULL only on a lease taken before revision 0002
        sa.Column("host", sa.Text, nullable=True),  # NULL: an orchestrator's lease, held by name across processes
        sa.Column("pid", sa.BigInteger, nullable=True),
        sa.Column("renewed_at", sa.String(32), nullable=True),  # revision 0002 fills it in with acquired_at
    ]


def head_tables(schema: str | None) -> tuple[sa.Table, sa.Table]:
    """The records and leases tables at this code's newest revision (0002)."""
    records, leases = baseline_tables(schema)
    for column in lease_holder_columns():
        leases.append_column(column)
    return records, leases
