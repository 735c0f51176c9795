"""Runs the ledger's migrations on the connection tasks/ledger/schema.py hands over, inside its
write transaction (so a failed migration leaves the database as it was)."""

from alembic import context

from shiplift.tasks.ledger.schema import VERSION_TABLE

context.configure(
    connection=context.config.attributes["connection"],
    version_table=VERSION_TABLE,
    version_table_schema=context.config.attributes["schema"],
)
with context.begin_transaction():
    context.run_migrations()
