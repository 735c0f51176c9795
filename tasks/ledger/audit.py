"""Audit (DESIGN §10, §11): verify the ledger chain against its signed checkpoints, then compare what each
endpoint serves with the ledger.

For every model with a succeeded promotion, the newest one (what `Ledger.served_at` reports now)
names the endpoint, the component and the model_ref (release id, artifact sha256, image digest)
that must be live. The release's own hosting backend (local processes or SageMaker) is asked what
serves through the typed `describe`; any difference is drift and raises Conflict naming each field.
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tasks.ledger.events import OPENED, PROMOTE, RELEASE, SUCCEEDED
from tasks.errors import BadInput, Conflict, IntegrityError, NotFound

REF_FIELDS = ("release_id", "artifact_sha256", "image_digest")


def verdict_lines(verification: dict) -> list[str]:
    """A verification for people: a headline naming the checkpoint it was checked against, then each problem."""
    checked = verification.get("checked_against")
    against = (f"; extends the checkpoint of seq {checked['seq']} signed {checked['signed_at']} by key {checked['key_id']} "
               f"(Merkle root {checked['merkle_root']})" if checked else "; no signed checkpoint to check it against")
    if verification["ok"]:
        return [f"Ledger verified: {verification['n_records']} records, head {verification['head_hash']}{against}."]
    return [f"Ledger verification FAILED ({verification['n_records']} records{against}):", *verification["problems"]]


def _checkpoints_config(path: str | Path | None):
    """The release config naming where an aws ledger's checkpoints are (None: the state dir's)."""
    if path is None:
        return None
    from tasks.config import load_release_config

    return load_release_config(path)


def _hosting_of(ledger, model: str, session: Any):
    """The hosting backend a model's releases run on: from the newest release of it opened in the ledger."""
    from tasks.backends.registry import make_backends
    from tasks.config import ReleaseConfig

    opened = [r for r in ledger.history(model) if (r.stage, r.event) == (RELEASE, OPENED)]
    if not opened:
        return None
    return make_backends(ReleaseConfig.model_validate(opened[-1].payload["config"]), ledger=ledger, session=session).hosting


def _live(hosting, endpoint: str, component: str):
    """(what serves, None) or (None, why nothing can be said to serve), from the typed describe."""
    if hosting is None:
        return None, "the ledger holds no opened release of this model, so it does not say which backend serves it"
    live = hosting.describe(endpoint, component)
    if live is None:
        return None, f"endpoint {endpoint} has no component {component} (or does not exist)"
    if live.status != "InService":
        return None, f"{endpoint}/{component} is {live.status}"
    if live.model_ref is None:
        return None, f"{endpoint}/{component} does not report which release it serves"
    return live, None


def _compare(model: str, record, hosting) -> tuple[dict, list[str]]:
    """One model's row of the audit and the drift found (empty when the endpoint matches the ledger)."""
    payload = record.payload
    endpoint, component, expected = payload.get("endpoint"), payload.get("component"), payload.get("served")
    row = {"release_id": record.release_id, "recorded_at": record.recorded_at, "seq": record.seq,
           "endpoint": endpoint, "component": component, "expected": expected, "live": None}
    if not (endpoint and component and isinstance(expected, dict)):
        return row, [f"{model}: ledger record seq {record.seq} does not name the endpoint, component and model it served"]
    live, why_not = _live(hosting, endpoint, component)
    if why_not:
        return row, [f"{model}: the ledger says {record.release_id} serves on {endpoint}/{component}, but {why_not}"]
    reported = live.model_ref.model_dump()
    row["live"] = reported
    problems = [
        f"{model}: {endpoint}/{component} serves {name} {reported.get(name)!r}, the ledger (seq {record.seq}) says {expected.get(name)!r}"
        for name in REF_FIELDS
        if reported.get(name) != expected.get(name)
    ]
    problems += [
        f"{model}: {endpoint}/{component} runs {name} {getattr(live, name)!r} although it reports {reported[name]!r}"
        for name in ("image_digest", "artifact_sha256") if getattr(live, name) != reported[name]
    ]
    return row, problems


def verify_ledger(ledger, state_dir: str | Path | None, *, config: Any = None, key_path: str | Path | None = None,
                  expect_head: str | None = None, session: Any = None) -> dict:
    """The chain, an anchored head if given, and every signed checkpoint (what `ledger verify` reports;
    `checked_against` names the latest checkpoint the ledger extends). The checkpoints are those of `config`'s
    backend (aws: its configured public key, else its Secrets Manager key, and Object Lock bucket), else the state
    dir's file and the local key: never ones the ledger itself names, which whoever rewrote it could have chosen."""
    from tasks.backends.registry import checkpoint_parts, default_state_dir
    from tasks.ledger.checkpoints import CheckpointLog, log_path, verify_with_checkpoints

    local = config is None or config.backend.kind == "local"
    folder = Path(state_dir or (config.backend.state_dir if config is not None else default_state_dir()))
    if expect_head or (local and not CheckpointLog(log_path(folder.expanduser().resolve())).path.exists()):
        result = ledger.verify(expected_head=expect_head).to_dict()
        result["checkpoints"] = "not checked (--expect-head given)" if expect_head else 0
        result["checked_against"] = None
        return result
    signer, store = checkpoint_parts(config, state_dir=folder, key_path=key_path, session=session, verify_only=True)
    return verify_with_checkpoints(ledger, store, signer.public)


def audit(state_dir: str | Path | None, *, ledger_url: str | None = None, config: str | Path | None = None,
          session: Any = None) -> dict:
    """Verify the ledger against its checkpoints and that every endpoint serves what the ledger last promoted on it
    (`config`: a release config whose backend names the checkpoints, for aws; `session`: the boto3 session of aws
    releases, e.g. an Airflow connection's)."""
    from tasks.backends.registry import open_ledger

    if state_dir is not None and (not isinstance(state_dir, (str, Path)) or not str(state_dir).strip()):
        raise BadInput(f"state_dir must be a folder path, got {state_dir!r}", fix="pass the local backend's state dir")
    try:
        ledger = open_ledger(ledger_url=ledger_url, state_dir=state_dir, read_only=True)
    except BadInput as exc:
        raise NotFound(exc.problem, fix=exc.fix) from exc
    try:
        verified = verify_ledger(ledger, state_dir, config=_checkpoints_config(config), session=session)
        if not verified["ok"]:
            raise IntegrityError(
                f"ledger chain is broken ({verified['n_records']} records): " + "; ".join(verified["problems"]),
                fix="restore the ledger from a backup and investigate who changed it",
            )
        now = datetime.now(timezone.utc)
        models = sorted({r.model for r in ledger.history() if r.stage == PROMOTE and r.event == SUCCEEDED})
        rows, drift = {}, []
        for model in models:
            rows[model], problems = _compare(model, ledger.served_at(model, now), _hosting_of(ledger, model, session))
            drift.extend(problems)
    finally:
        ledger.close()
    if drift:
        raise Conflict("drift between the ledger and the live endpoints: " + "; ".join(drift),
                       fix="roll back or promote so that production matches the ledger, or find who changed the endpoint")
    return {"ok": True, "checked_at": now.isoformat(), "n_records": verified["n_records"],
            "head_hash": verified["head_hash"], "checked_against": verified["checked_against"], "models": rows}
