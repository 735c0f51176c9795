"""Audit (DESIGN §10, §11): verify the ledger chain, then compare what each endpoint serves with the ledger.

For every model with a succeeded promotion, the newest one (what `Ledger.served_at` reports now)
names the endpoint, the component and the model_ref (release id, artifact sha256, image digest)
that must be live. The local endpoint's persisted spec and its router are read back; any
difference is drift and raises Conflict naming each field that differs.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from tasks.errors import BadInput, Conflict, IntegrityError, NotFound

PROMOTE, SUCCEEDED = "promote", "succeeded"
REF_FIELDS = ("release_id", "artifact_sha256", "image_digest")


def _open_ledger(state_dir: Path, ledger_url: str | None):
    from tasks.backends import ledger_url_for
    from tasks.ledger import Ledger

    if ledger_url is None and not (state_dir / "ledger.db").is_file():
        raise NotFound(f"no ledger at {state_dir / 'ledger.db'}", fix="pass the state dir of a release, or ledger_url")
    return Ledger(ledger_url_for(state_dir, ledger_url))


def _live_ref(hosting, endpoint: str, component: str) -> tuple[dict | None, str | None]:
    """(model_ref the endpoint serves, None) or (None, why it serves nothing)."""
    from tasks.stages.common import describe_if_present

    described = describe_if_present(hosting, endpoint)
    if described is None:
        return None, f"endpoint {endpoint} does not exist"
    live = described["components"].get(component)
    if live is None:
        return None, f"endpoint {endpoint} has no component {component}"
    if not described["router"]["alive"]:
        return None, f"the router of endpoint {endpoint} is not running"
    if not live["registered"] or not all(copy["alive"] for copy in live["copies"]):
        return None, f"{endpoint}/{component} has copies that are not running or not registered with the router"
    return live["spec"]["model_ref"], None


def _compare(model: str, record, hosting) -> tuple[dict, list[str]]:
    """One model's row of the audit and the drift found (empty when the endpoint matches the ledger)."""
    payload = record.payload
    endpoint, component, expected = payload.get("endpoint"), payload.get("component"), payload.get("served")
    row = {"release_id": record.release_id, "recorded_at": record.recorded_at, "seq": record.seq,
           "endpoint": endpoint, "component": component, "expected": expected, "live": None}
    if not (endpoint and component and isinstance(expected, dict)):
        return row, [f"{model}: ledger record seq {record.seq} does not name the endpoint, component and model it served"]
    live, why_not = _live_ref(hosting, endpoint, component)
    row["live"] = live
    if why_not:
        return row, [f"{model}: the ledger says {record.release_id} serves on {endpoint}/{component}, but {why_not}"]
    problems = [
        f"{model}: {endpoint}/{component} serves {name} {live.get(name)!r}, the ledger (seq {record.seq}) says {expected.get(name)!r}"
        for name in REF_FIELDS
        if live.get(name) != expected.get(name)
    ]
    return row, problems


def audit(state_dir: str | Path, *, ledger_url: str | None = None) -> dict:
    """Verify the ledger chain and that every endpoint serves what the ledger last promoted on it."""
    from tasks.hosting.local import LocalHosting

    if not isinstance(state_dir, (str, Path)) or not str(state_dir).strip():
        raise BadInput(f"state_dir must be a folder path, got {state_dir!r}", fix="pass the local backend's state dir")
    state_dir = Path(state_dir).expanduser().resolve()
    ledger = _open_ledger(state_dir, ledger_url)
    try:
        verified = ledger.verify()
        if not verified.ok:
            raise IntegrityError(
                f"ledger chain is broken ({verified.n_records} records): " + "; ".join(verified.problems),
                fix="restore the ledger from a backup and investigate who changed it",
            )
        now = datetime.now(timezone.utc)
        models = sorted({r.model for r in ledger.history() if r.stage == PROMOTE and r.event == SUCCEEDED})
        hosting = LocalHosting(state_dir)
        rows, drift = {}, []
        for model in models:
            rows[model], problems = _compare(model, ledger.served_at(model, now), hosting)
            drift.extend(problems)
    finally:
        ledger.close()
    if drift:
        raise Conflict("drift between the ledger and the live endpoints: " + "; ".join(drift),
                       fix="roll back or promote so that production matches the ledger, or find who changed the endpoint")
    return {"ok": True, "checked_at": now.isoformat(), "n_records": verified.n_records,
            "head_hash": verified.head_hash, "models": rows}
