"""The local backend's config: where its state lives on this machine, and the ledger it writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from shiplift.tasks.config_types import LedgerUrl, Strict


class LocalBackend(Strict):
    kind: Literal["local"]
    state_dir: str = Field(default_factory=lambda: os.environ.get("SHIPLIFT_HOME", ".shiplift"))
    ledger_url: LedgerUrl | None = Field(None, description="SQLAlchemy URL; default sqlite under state_dir")
    checkpoint_witness: str | None = Field(
        None, min_length=1, description="a folder on another disk or host that keeps a second copy of every signed "
        "checkpoint (an RFC 9162-style witness); default $SHIPLIFT_CHECKPOINT_WITNESS, else none")

    @model_validator(mode="after")
    def _witness_is_held_apart(self) -> LocalBackend:
        if self.checkpoint_witness is not None:
            witness, state = (Path(p).expanduser().resolve() for p in (self.checkpoint_witness, self.state_dir))
            if witness == state or state in witness.parents:
                raise ValueError(f"backend.checkpoint_witness {witness} is inside backend.state_dir {state}: a "
                                 "witness there is cut back with the log it should catch; name a folder on another "
                                 "disk or host")
        return self
