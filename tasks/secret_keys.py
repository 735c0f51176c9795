"""Which mapping keys name a secret: configs and ledger payloads refuse them by name, never echoing the value."""

from __future__ import annotations

import re
import unicodedata
from itertools import pairwise

_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "secrets",
        "credential",
        "credentials",
        "apikey",
        "accesskey",
        "secretkey",
        "privatekey",
    }
)
_SECRET_PAIRS = frozenset(
    {
        ("access", "key"),
        ("api", "key"),
        ("private", "key"),
        ("secret", "key"),
        ("session", "key"),
        ("signing", "key"),
    }
)


def looks_secret(key: object) -> bool:
    """True when a mapping key names a secret (password, token, access key...) in any naming style:
    `api_key`, `apiKey`, `API-Key`, `DbPassword`, `x.auth.token`; also when invisible format characters (a zero-width
    space, a soft hyphen) are slipped between its letters or it is spelled in compatibility forms (fullwidth
    letters)."""
    visible = "".join(c for c in unicodedata.normalize("NFKC", str(key)) if unicodedata.category(c) != "Cf")
    spaced = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1 \2", visible)
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", spaced)
    words = [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]
    if not words:
        return False
    if any(w in _SECRET_WORDS for w in words) or words[-1].endswith("token"):
        return True
    return any(pair in _SECRET_PAIRS for pair in pairwise(words))
