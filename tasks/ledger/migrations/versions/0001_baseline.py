"""The first schema: hash-chained records and per-model promotion leases."""

from alembic import context, op

from shiplift.tasks.ledger.migrations import BASELINE_REVISION, baseline_tables

revision = BASELINE_REVISION
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    records, _ = baseline_tables(context.config.attributes["schema"])
    records.metadata.create_all(op.get_bind())
