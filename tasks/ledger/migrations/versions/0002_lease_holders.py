"""Leases record their holder's random token, its process's host and pid, and when it last renewed (issue 44): a
crashed run's lease is judged by those, never by parsing the holder's name."""

import sqlalchemy as sa
from alembic import context, op

from shiplift.tasks.ledger.migrations import BASELINE_REVISION, LEASE_HOLDER_REVISION, lease_holder_columns

revision = LEASE_HOLDER_REVISION
down_revision = BASELINE_REVISION
branch_labels = None
depends_on = None


def upgrade() -> None:
    schema = context.config.attributes["schema"]
    for column in lease_holder_columns():
        op.add_column("leases", column, schema=schema)
    leases = sa.table("leases", sa.column("acquired_at"), sa.column("renewed_at"), schema=schema)
    op.execute(leases.update().values(renewed_at=leases.c.acquired_at))
