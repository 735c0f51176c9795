"""Layout naming: a shared endpoint's instances and MIG layout cannot change while it runs, so another layout is
another endpoint, and both it and its components carry the layout's id (docs/fleet.md, *A layout change*)."""

from __future__ import annotations

from shiplift.tasks.backends.placement import endpoint_placement
from shiplift.tasks.hashing import sha256_json


def layout_id(placement) -> str:
    """Eight hex digits of a placement's content (its shared endpoint's name apart): a shared endpoint's instances and
    layout cannot change while it runs, so another layout is another endpoint, named by it (docs/fleet.md). Unset
    (null) fields are left out, so a placement field added later with no default value leaves the names of running
    endpoints as they are (one added with another default renames them)."""
    return sha256_json(endpoint_placement(placement))[:8]  # a mixed MIG layout: one id for all its tenants
