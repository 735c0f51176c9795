"""Backend selection: one small object per interface, chosen by `backend.kind` (DESIGN §3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tasks.config import ReleaseConfig
from tasks.errors import ConfigError


@dataclass(frozen=True)
class Backends:
    """The artifact store, hosting and ledger a release runs against."""

    kind: str
    state_dir: Path
    store: Any
    hosting: Any
    ledger: Any


def ledger_url_for(state_dir: Path, url: str | None) -> str:
    return url or f"sqlite:///{state_dir / 'ledger.db'}"


def make_backends(config: ReleaseConfig) -> Backends:
    """Build the backends for a config; the aws backend is refused until it exists."""
    from tasks.hosting.local import LocalHosting
    from tasks.ledger import Ledger
    from tasks.store import LocalArtifactStore

    backend = config.backend
    if backend.kind != "local":
        raise ConfigError(
            f"backend.kind {backend.kind!r} cannot run releases in this version (only the local backend is built)",
            fix="use backend.kind: local, or run `shiplift config validate` to check an aws config",
        )
    state_dir = Path(backend.state_dir).expanduser().resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    return Backends(
        kind="local",
        state_dir=state_dir,
        store=LocalArtifactStore(state_dir / "artifacts"),
        hosting=LocalHosting(state_dir),
        ledger=Ledger(ledger_url_for(state_dir, backend.ledger_url)),
    )
