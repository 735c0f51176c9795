"""Alembic migrations of the ledger's tables, run by tasks/ledger/schema.py (no alembic.ini).

Forward only: the ledger is append-only and a downgrade would drop what newer code recorded.
`baseline_tables` is revision 0001's schema, frozen: exactly what `create_all` made in every
shiplift before migrations, so such a ledger is recognised as 0001 by comparing against it.
"""

from __future__ import annotations

import sqlalchemy as sa

BASELINE_REVISION = "0001"


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
