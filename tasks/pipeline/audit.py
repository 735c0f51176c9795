"""Audit (DESIGN §10, §11): verify the ledger chain against its signed checkpoints, re-derive every sweep's pick from
its records, then compare what each endpoint serves with the ledger.

For every model with a succeeded promotion, the newest one (what `Ledger.served_at` reports now)
names the endpoint, the component and the model_ref (release id, artifact sha256, image digest)
that must be live. The release's own hosting backend (local processes or SageMaker) is asked what
serves through the typed `describe`; any difference is drift and raises Conflict naming each field.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from shiplift.tasks.backends.registry import (
    checkpoint_parts,
    checkpoint_witness,
    default_state_dir,
    ledger_url_for,
    make_backends,
    open_ledger,
)
from shiplift.tasks.config import ReleaseConfig, load_release_config
from shiplift.tasks.errors import BadInput, ConfigError, Conflict, IntegrityError, NotFound
from shiplift.tasks.ledger.checkpoints import CheckpointLog, log_path, verify_with_checkpoints
from shiplift.tasks.ledger.events import OPENED, RELEASE, SWEEP
from shiplift.tasks.ledger.records import Opened, is_promotion, promotion
from shiplift.tasks.ledger.sweep_records import SweepRecords, explanation

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

REF_FIELDS = ("release_id", "artifact_sha256", "image_digest")


def public_key_refused_for_aws() -> ConfigError:
    """Why `--public-key` does not go with an aws config: its backend names the key its checkpoints verify with."""
    return ConfigError("an aws config's checkpoints are verified with the public key its backend.checkpoints names",
                       fix="set backend.checkpoints.public_key (openssl pkey -pubout), and drop --public-key")


def _checkpoints_config(path: str | Path | None):
    """The release config naming where an aws ledger's checkpoints are (None: the state dir's)."""
    if path is None:
        return None

    return load_release_config(path)


def _hosting_of(ledger, model: str, session: Any):
    """The hosting backend a model's releases run on: from the newest release of it opened in the ledger."""
    opened = [r for r in ledger.history(model) if (r.stage, r.event) == (RELEASE, OPENED)]
    if not opened:
        return None
    return make_backends(ReleaseConfig.model_validate(Opened.of(opened[-1]).config), ledger=ledger,
                         session=session).hosting


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
    promoted = promotion(record)
    endpoint, component, expected = promoted.endpoint, promoted.component, promoted.served
    row = {"release_id": record.release_id, "recorded_at": record.recorded_at, "seq": record.seq,
           "endpoint": endpoint, "component": component, "expected": expected, "live": None}
    if not (endpoint and component and isinstance(expected, dict)):
        return row, [f"{model}: ledger record seq {record.seq} does not name the endpoint, component and model it "
                     "served"]
    live, why_not = _live(hosting, endpoint, component)
    if why_not:
        return row, [f"{model}: the ledger says {record.release_id} serves on {endpoint}/{component}, but {why_not}"]
    reported = live.model_ref.model_dump()
    row["live"] = reported
    problems = [
        f"{model}: {endpoint}/{component} serves {name} {reported.get(name)!r}, the ledger (seq {record.seq}) says "
        f"{expected.get(name)!r}"
        for name in REF_FIELDS
        if reported.get(name) != expected.get(name)
    ]
    problems += [
        f"{model}: {endpoint}/{component} runs {name} {getattr(live, name)!r} although it reports {reported[name]!r}"
        for name in ("image_digest", "artifact_sha256") if getattr(live, name) != reported[name]
    ]
    return row, problems


def checkpoint_folder(state_dir: str | Path | None, *, ledger_url: str | None = None,
                      config: Any = None) -> tuple[Path, bool]:
    """The folder of a local ledger's checkpoint log and whether it was named (a state dir, a config) rather than
    looked for: else the folder of a SQLite ledger, else the default state dir, the first that holds a log."""
    if state_dir or config is not None:
        return Path(state_dir or config.backend.state_dir).expanduser().resolve(), True
    url = ledger_url_for(default_state_dir(), ledger_url)
    beside = ([Path(url.removeprefix("sqlite:///")).expanduser().resolve().parent] if url.startswith("sqlite:///")
              else [])
    candidates = [*beside, default_state_dir()]
    return next((folder for folder in candidates if log_path(folder).exists()), candidates[0]), False


def verify_ledger(ledger, state_dir: str | Path | None, *, ledger_url: str | None = None, config: Any = None,
                  key_path: str | Path | None = None, public_key: Ed25519PublicKey | None = None,
                  expect_head: str | None = None, witness_dir: str | Path | None = None, session: Any = None) -> dict:
    """The chain, an anchored head if given, every signed checkpoint and every checkpoint the chain records (what
    `ledger verify` reports; `checked_against` names the latest checkpoint the ledger extends). The checkpoints are
    those of `config`'s backend (aws: its configured public key, else its Secrets Manager key, and Object Lock
    bucket), else the log `checkpoint_folder` names or finds, checked with `public_key` (else the local key's public
    half): never ones the ledger itself names, which whoever rewrote it could have chosen. A log looked for and not
    found, while the chain records checkpoints, is refused (BadInput) with the fix. The witness of `witness_dir`
    (else the config's `backend.checkpoint_witness`, else $SHIPLIFT_CHECKPOINT_WITNESS) is cross-checked against the
    log and the chain."""
    witness = CheckpointLog(log_path(witness_dir)) if witness_dir else checkpoint_witness(config)
    if witness_dir and not witness.path.exists():
        raise BadInput(f"no witness log at {witness.path}",
                       fix="pass the folder $SHIPLIFT_CHECKPOINT_WITNESS named when the checkpoints were signed")

    if config is not None and config.backend.kind != "local":
        if public_key is not None:
            raise public_key_refused_for_aws()
        signer, store = checkpoint_parts(config, key_path=key_path, session=session, verify_only=True)
        return verify_with_checkpoints(ledger, store, signer.public, expected_head=expect_head, witness=witness)
    folder, named = checkpoint_folder(state_dir, ledger_url=ledger_url, config=config)
    log = CheckpointLog(log_path(folder))
    if not log.path.exists():  # nothing to check a key against: only what the chain records can be missing
        verdict = verify_with_checkpoints(ledger, log, None, expected_head=expect_head, witness=witness)
        if verdict["recorded_checkpoints"] and not named:
            raise BadInput(f"the ledger records {verdict['recorded_checkpoints']} checkpoint(s), but there is no "
                           f"checkpoint log at {log.path} (looked for beside the ledger and in the default state dir)",
                           fix="pass --state-dir naming the folder that holds ledger-checkpoints.jsonl (or the aws "
                               "--config); if the log was deleted, restore it from a backup")
        return verdict
    if public_key is None:
        public_key = checkpoint_parts(config, state_dir=folder, key_path=key_path, verify_only=True)[0].public
    return verify_with_checkpoints(ledger, log, public_key, expected_head=expect_head, witness=witness)


def audit(state_dir: str | Path | None, *, ledger_url: str | None = None, config: str | Path | None = None,
          session: Any = None) -> dict:
    """Verify the ledger against its checkpoints and that every endpoint serves what the ledger last promoted on it
    (`config`: a release config whose backend names the checkpoints, for aws; `session`: the boto3 session of aws
    releases, e.g. an Airflow connection's)."""
    if state_dir is not None and (not isinstance(state_dir, (str, Path)) or not str(state_dir).strip()):
        raise BadInput(f"state_dir must be a folder path, got {state_dir!r}", fix="pass the local backend's state dir")
    try:
        ledger = open_ledger(ledger_url=ledger_url, state_dir=state_dir, read_only=True)
    except BadInput as exc:
        raise NotFound(exc.problem, fix=exc.fix) from exc
    try:
        verified = verify_ledger(ledger, state_dir, ledger_url=ledger_url, config=_checkpoints_config(config),
                                 session=session)
        if not verified["ok"]:
            raise IntegrityError(
                f"ledger chain is broken ({verified['n_records']} records): " + "; ".join(verified["problems"]),
                fix="restore the ledger from a backup and investigate who changed it",
            )
        sweeps = _sweeps(ledger)
        now = datetime.now(UTC)
        models = sorted({r.model for r in ledger.history() if is_promotion(r)})
        rows, drift = {}, []
        for model in models:
            rows[model], problems = _compare(model, ledger.served_at(model, now), _hosting_of(ledger, model, session))
            drift.extend(problems)
    finally:
        ledger.close()
    if drift:
        raise Conflict("drift between the ledger and the live endpoints: " + "; ".join(drift),
                       fix="roll back or promote so that production matches the ledger, or find who changed the "
                           "endpoint")
    return {"ok": True, "checked_at": now.isoformat(), "n_records": verified["n_records"],
            "head_hash": verified["head_hash"], "checked_against": verified["checked_against"], "models": rows,
            "sweeps": sweeps}


def _sweeps(ledger) -> dict[str, dict]:
    """Every sweep re-derived from its records (`shiplift sweep explain`): its rule's sha256, how many candidates have
    evidence, the recorded pick. IntegrityError when a rule no longer hashes to the sha256 recorded at opening, or a
    recorded pick is not the one its rule gives on its recorded evidence."""
    found, wrong = {}, []
    for sweep_id in dict.fromkeys(r.release_id for r in ledger.events(SWEEP, OPENED)):
        explained = explanation(SweepRecords.load(ledger, sweep_id))
        recorded, derived = explained["recorded_pick"], explained["derived_pick"]
        found[sweep_id] = {"rule_sha256": explained["rule_sha256"], "evaluated": explained["evaluated"],
                           "candidates": explained["candidates"], "picked": recorded["picked"] if recorded else None}
        if recorded is not None and not explained["agrees"]:
            wrong.append(f"sweep {sweep_id} recorded the pick {recorded['picked']!r}, but its rule gives "
                         f"{derived['picked'] if derived else None!r} on its recorded evidence")
    if wrong:
        raise IntegrityError("; ".join(wrong), fix="run `shiplift sweep explain SWEEP` and `shiplift ledger verify`: "
                                                    "a sweep's records were changed")
    return found
