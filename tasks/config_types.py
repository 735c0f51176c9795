"""The building blocks every config class shares: the strict base model, a pinned sha256, a dataset reference, and a
ledger URL that carries no password (the release config, the backends' and the model families' configs use them)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from shiplift.tasks.errors import ConfigError
from shiplift.tasks.project import BUILTIN_DATA_DIR

NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"  # a model's, a prefix's and a shared endpoint's name
URL_PASSWORD = re.compile(r"(://[^/@:\s']*:)[^/@\s']*@")
SHA256_PATTERN = r"^[0-9a-f]{64}$"


class Strict(BaseModel):
    """Base for every config model: frozen, unknown keys refused, no coercion (`true` is not 1, "4" is not 4),
    no infinities or NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN, description="lower-case hex sha256")]


def local_path(text: str, config_dir: Path) -> Path:
    """A path a config names: `builtin:NAME` a shipped dataset, a relative path read from the config's folder."""
    if text.startswith("builtin:"):
        return BUILTIN_DATA_DIR / f"{text.removeprefix('builtin:')}.jsonl"
    path = Path(text).expanduser()
    return path if path.is_absolute() else config_dir / path


class DatasetRef(Strict):
    """A dataset file (`builtin:NAME` is one of the project's own sets under validation/data) and the splits to use."""

    path: str
    splits: list[str] | None = None

    def resolve(self, base_dir: Path) -> Path:
        """The dataset's file: `builtin:NAME` is the project's shipped set, a relative path is relative to `base_dir`
        (the config file's folder); ConfigError when it is not there."""
        path = local_path(self.path, base_dir)
        if not path.is_file():
            raise ConfigError(f"dataset {self.path!r} not found at {path}",
                              fix="point validation.datasets[].path at a JSONL file")
        return path


def _ledger_url_without_password(url: str) -> str:
    """A ledger URL travels in configs, XCom and the ledger itself: it must not carry a password."""
    if url and URL_PASSWORD.search(url):
        raise ValueError("ledger_url carries a password; put it in PGPASSWORD or ~/.pgpass (or use IAM auth), "
                         "never in a config")
    return url


LedgerUrl = Annotated[str, AfterValidator(_ledger_url_without_password)]
