"""The checks of a body the router's control port is sent to register a component (`PUT /_shiplift/components/NAME`):
its copies, and its scale-to-zero or serverless settings."""

from __future__ import annotations

import re
from typing import Any

SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def component_payload_problem(payload: dict[str, Any]) -> str | None:
    """Why an admin PUT body is not `{"copies": [{"url": URL, "spec_sha256": HEX}, ...]}` (plus `"scale_to_zero":
    {"idle_s": N}`, with which copies may be empty; a serverless component's also names `hold_s`, `max_concurrency`
    and `warm`), or None."""
    if "copies" not in payload or set(payload) - {"copies", "scale_to_zero"}:
        return f"body keys must be exactly copies, and scale_to_zero if it scales (got {sorted(payload)})"
    scaling = payload.get("scale_to_zero")
    problem = None if scaling is None else scaling_problem(scaling)
    if problem:
        return problem
    copies = payload["copies"]
    if not isinstance(copies, list) or not (copies or scaling is not None):
        return ('copies must be a list of {"url": "http://127.0.0.1:PORT", "spec_sha256": HEX}, non-empty unless the '
                "component scales to zero")
    for index, entry in enumerate(copies):
        if not isinstance(entry, dict) or set(entry) != {"url", "spec_sha256"}:
            return f'copies[{index}] must be exactly {{"url": ..., "spec_sha256": ...}}'
        if not isinstance(entry["url"], str):
            return f"copies[{index}].url must be a string"
        if not isinstance(entry["spec_sha256"], str) or not SHA256_HEX.fullmatch(entry["spec_sha256"]):
            return f"copies[{index}].spec_sha256 must be 64 lowercase hex characters"
    if len({entry["url"].rstrip("/") for entry in copies}) != len(copies):
        return "copies must not repeat a URL"
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def scaling_problem(scaling: Any) -> str | None:
    """Why a scale_to_zero registration is not `{"idle_s": s}` or, serverless, `{"idle_s": s, "hold_s": s,
    "max_concurrency": n, "warm": bool}`, or None."""
    serverless = {"idle_s", "hold_s", "max_concurrency", "warm"}
    if not isinstance(scaling, dict) or set(scaling) not in ({"idle_s"},
                                                             serverless) or not _positive(scaling["idle_s"]):
        return ('scale_to_zero must be {"idle_s": seconds > 0}, or for a serverless component also "hold_s" (seconds '
                '> 0), "max_concurrency" (an integer > 0) and "warm" (true or false)')
    if set(scaling) == serverless and not (_positive(scaling["hold_s"]) and isinstance(scaling["max_concurrency"], int)
                                           and _positive(scaling["max_concurrency"])
                                           and isinstance(scaling["warm"], bool)):
        return 'a serverless scale_to_zero needs "hold_s" > 0, an integer "max_concurrency" > 0 and a boolean "warm"'
    return None
