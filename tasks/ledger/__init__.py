"""The release ledger: the append-only store, its schema and migrations, event names, checkpoints, views and audit."""
