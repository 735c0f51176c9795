"""The local backend's config: where its state lives on this machine, and the ledger it writes."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field

from tasks.config_types import LedgerUrl, Strict


class LocalBackend(Strict):
    kind: Literal["local"]
    state_dir: str = Field(default_factory=lambda: os.environ.get("SHIPLIFT_HOME", ".shiplift"))
    ledger_url: LedgerUrl | None = Field(None, description="SQLAlchemy URL; default sqlite under state_dir")
