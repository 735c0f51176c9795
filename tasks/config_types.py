"""The building blocks every config class shares: the strict base model and a ledger URL that carries no password."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

URL_PASSWORD = re.compile(r"(://[^/@:\s']*:)[^/@\s']*@")


class Strict(BaseModel):
    """Base for every config model: frozen, unknown keys refused, no coercion (`true` is not 1, "4" is not 4),
    no infinities or NaN."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _ledger_url_without_password(url: str) -> str:
    """A ledger URL travels in configs, XCom and the ledger itself: it must not carry a password."""
    if url and URL_PASSWORD.search(url):
        raise ValueError("ledger_url carries a password; put it in PGPASSWORD or ~/.pgpass (or use IAM auth), "
                         "never in a config")
    return url


LedgerUrl = Annotated[str, AfterValidator(_ledger_url_without_password)]
