"""One module per release stage; each exposes `run(ctx) -> dict` (small, JSON-able)."""
