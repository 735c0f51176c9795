"""The `ledger` group: history, show, timeline, verify, checkpoint, prove, check-proof, public-key, diff, as-of, report,
upgrade and export, and the ledgers they open (closed when the command ends)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from shiplift.tasks.backends.registry import default_state_dir
from shiplift.tasks.cli.arguments import with_json, with_ledger, with_release, with_state_dir
from shiplift.tasks.console import EXIT_REJECTED, cell, number, print_fields, print_json, print_table
from shiplift.tasks.errors import BadInput, NotFound

_OPEN_LEDGERS: list = []  # ledgers a command opened, closed when it ends (a read-only SQLite open leaves nothing)


def ledger_for(args, *, read_only: bool = True):
    """The ledger a `ledger` command reads (or, not `read_only`, writes): --ledger-url, else the --config's
    ledger_url, else $SHIPLIFT_LEDGER_URL, else SQLite under --state-dir. Closed when the command ends."""
    from shiplift.tasks.backends.registry import open_ledger

    ledger = open_ledger(ledger_url=ledger_url_of(args), state_dir=args.state_dir, read_only=read_only)
    _OPEN_LEDGERS.append(ledger)
    return ledger


def close_ledgers() -> None:
    """Close every ledger `ledger_for` opened (`main` calls this when a command ends)."""
    while _OPEN_LEDGERS:
        _OPEN_LEDGERS.pop().close()


def ledger_url_of(args) -> str | None:
    """The ledger URL a `ledger` command names: --ledger-url, else the --config's ledger_url (None: the default)."""
    config = checkpoints_config(args)
    return args.ledger_url or (config.backend.ledger_url if config is not None else None)


def resolve_release_args(args) -> None:
    """Replace each release id a command takes (`with_release`) by the full id it names in the command's ledger, so
    every command accepts a unique prefix or suffix, or the shortened id a table prints (`resolve_release`)."""
    from shiplift.tasks.ledger.views import resolve_release

    named = [name for name in getattr(args, "release_args", ()) if getattr(args, name) is not None]
    if named:
        ledger = ledger_for(args)
        for name in named:
            setattr(args, name, resolve_release(ledger, getattr(args, name)))


def checkpoints_config(args):
    """The release config of --config (whose backend names the checkpoints: aws), or None for the state dir's; loaded
    once per command (the ledger commands ask for it from several helpers)."""
    from shiplift.tasks.config import load_release_config

    if not getattr(args, "config", None):
        return None
    if getattr(args, "loaded_config", None) is None:
        args.loaded_config = load_release_config(args.config)
    return args.loaded_config


def checkpoint_dir(args) -> Path | None:
    """The folder of a local ledger's checkpoint log: --state-dir, else the one `checkpoint_folder` finds (beside a
    SQLite --ledger-url); None for an aws --config, whose backend names its store."""
    from shiplift.tasks.pipeline.audit import checkpoint_folder

    config = checkpoints_config(args)
    if config is not None and config.backend.kind != "local":
        return None
    return checkpoint_folder(args.state_dir, ledger_url=ledger_url_of(args), config=config)[0]


def verifying_key(args):
    """The public key a command checks with: --public-key's PEM file (no private key is read), else None (the
    --config's or --key's)."""
    from shiplift.tasks.ledger.checkpoints import read_public_key
    from shiplift.tasks.pipeline.audit import public_key_refused_for_aws

    if not getattr(args, "public_key", None):
        return None
    if checkpoint_dir(args) is None:
        raise public_key_refused_for_aws()
    return read_public_key(args.public_key)


def verifying_parts(args):
    """The (public key, store) of a command's checkpoints: --public-key's, else --config's backend (its public key
    where it names one: the secret is never read), else --key's public half; the --config's store, else the log of
    `checkpoint_dir`."""
    from shiplift.tasks.backends.registry import checkpoint_parts
    from shiplift.tasks.ledger.checkpoints import CheckpointLog, log_path

    public, folder = verifying_key(args), checkpoint_dir(args)
    if public is not None:
        return public, CheckpointLog(log_path(folder))
    signer, store = checkpoint_parts(checkpoints_config(args), state_dir=folder, key_path=args.key, verify_only=True)
    return signer.public, store


def write_out(path: str, text: str) -> None:
    """Write a command's --out file; BadInput naming the fix when it cannot be (a directory, no such folder)."""
    target = Path(path)
    if target.is_dir():
        raise BadInput(f"--out {path} is a directory", fix="pass a file path, e.g. --out proof.json")
    try:
        target.write_text(text, encoding="utf-8")
    except OSError as error:
        raise BadInput(f"cannot write --out {path}: {error.strerror}",
                       fix="pass a file path in a folder you can write") from error


def cmd_ledger_history(args) -> int:
    """One row per release of a model (or of every model), or with --records every record."""
    ledger = ledger_for(args)
    if args.records:
        rows = [r.to_dict() for r in ledger.history(args.model)]
        columns = ["seq", "recorded_at", "release_id", "stage", "event", "actor", "record_hash"]
    else:
        from shiplift.tasks.ledger.views import releases

        rows = releases(ledger, args.model)
        columns = ["release_id", "opened_at", "opened_by", "status", "decision", "promoted_at", "strategy", "records"]
    if args.model and not rows:
        raise NotFound(f"the ledger has no records of model {args.model!r}",
                       fix="run `shiplift ledger history` for every model")
    print_json(rows) if args.json else print_table(rows, columns)
    return 0


def print_gate(evidence: dict) -> None:
    """A gate's decision, its champion and every check with its interval and rule (`evidence`: a view's `gate`)."""
    from shiplift.tasks.ledger.records import as_result
    from shiplift.tasks.ledger.stage_results import ValidateResult
    from shiplift.tasks.ledger.views import CHECK_COLUMNS, check_cells

    gate = as_result(evidence, ValidateResult)
    datasets = ", ".join(f"{d['name']} (n {d['n']}, sha256 {d['sha256']})" for d in gate.datasets or [])
    print(f"\ngate {gate.decision} (champion: {gate.champion_release or 'none'}); datasets: {datasets}")
    print_table([check_cells(c) for c in gate.checks or []], CHECK_COLUMNS)


def print_release(detail: dict) -> None:
    from shiplift.tasks.ledger.views import field_rows

    fields = ["release_id", "model", "status", "opened_at", "opened_by", "config_hash", "source_sha256", "model_sha256",
              "artifact_sha256", "artifact_uri", "image_uri", "image_digest", "decision", "records", "placement"]
    print_table(field_rows({name: detail[name] for name in fields}, "field"), ["field", "value"])
    print()
    print_table([{"stage": name, "status": status} for name, status in detail["stages"].items()], ["stage", "status"])
    if detail["gate"]:
        print_gate(detail["gate"])
    if detail["approval"]:
        print()
        print_table(detail["approval"], ["at", "event", "by", "reason", "deadline", "report_sha256"],
                    shrink=("reason",))
    if detail["promotions"]:
        print()
        print_table(detail["promotions"],
                    ["at", "event", "trigger", "strategy", "endpoint", "component", "steps", "reason", "actor"])


def cmd_ledger_show(args) -> int:
    """One release: what it was built from, its gate evidence, its stages and its promotions."""
    from shiplift.tasks.ledger.views import show

    detail = show(ledger_for(args), args.release)
    print_json(detail) if args.json else print_release(detail)
    return 0


def cmd_ledger_verify(args) -> int:
    """The chain, an anchored head if given, every signed checkpoint, and every checkpoint the chain records."""
    from shiplift.tasks.ledger.checkpoints import verdict_lines

    result = verification_for(args, ledger_for(args))
    if args.json:
        print_json(result)
    else:
        headline, *problems = verdict_lines(result)
        print("\n".join([headline, *(f"  - {problem}" for problem in problems)]))
    return 0 if result["ok"] else EXIT_REJECTED


def cmd_ledger_prove(args) -> int:
    """An inclusion proof of one release's records in the latest signed checkpoint (O(log n) hashes a record)."""
    from shiplift.tasks.ledger.checkpoints import prove

    public, store = verifying_parts(args)
    proof = prove(ledger_for(args), store, args.release, public)
    if args.out:
        write_out(args.out, json.dumps(proof, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}: {len(proof['records'])} records proven in checkpoint seq "
              f"{proof['checkpoint']['seq']}", file=sys.stderr)
    else:
        print_json(proof)
    return 0


def cmd_ledger_check_proof(args) -> int:
    """Check an inclusion proof with the public key alone (--public-key's, --key's, or an aws --config's): no ledger
    needed."""
    from shiplift.tasks.ledger.checkpoints import PROOF_FIX, check_proof, load_json

    try:
        text = Path(args.proof).read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise NotFound(f"no proof file {args.proof}",
                       fix="write one with `shiplift ledger prove RELEASE --out FILE`") from error
    except IsADirectoryError as error:
        raise BadInput(f"the proof {args.proof} is a directory", fix=PROOF_FIX) from error
    except (OSError, UnicodeDecodeError) as error:
        raise BadInput(f"the proof {args.proof} cannot be read as text: {error}", fix=PROOF_FIX) from error
    proof = load_json(text, f"the proof {args.proof}", PROOF_FIX)
    problems = check_proof(proof, verifying_parts(args)[0])
    print_json({"ok": not problems, "release_id": proof["release_id"], "records": len(proof["records"]),
                "covers": proof["covers"], "problems": problems})
    return 0 if not problems else EXIT_REJECTED


def cmd_ledger_checkpoint(args) -> int:
    """Sign the ledger's head (after verifying it) into the checkpoint store (local file, or S3 for an aws --config)."""
    from shiplift.tasks.backends.registry import sign_checkpoint

    signed = sign_checkpoint(ledger_for(args, read_only=False), checkpoints_config(args),
                             state_dir=checkpoint_dir(args), key_path=args.key)
    if args.json:
        print_json(signed.to_dict())
    else:
        print(f"signed the ledger's head: checkpoint seq {signed.seq} by key {signed.key_id}")
        print_fields(signed.to_dict())
    return 0


def cmd_ledger_public_key(args) -> int:
    """Export the key that verifies the checkpoints (PEM), for whoever checks proofs or verifies without the secret."""
    from shiplift.tasks.ledger.checkpoints import public_pem

    pem = public_pem(verifying_parts(args)[0])
    if args.out:
        write_out(args.out, pem)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(pem, end="")
    return 0


DIFF_COLUMNS = ["", "field", "A", "B", "B − A"]


def diff_cell(value) -> str | None:
    """One side of a diff row: a gate check as `status: observed [lo, hi] rule`, numbers rounded (`cell`)."""
    if isinstance(value, dict) and "status" in value and "observed" in value:
        ci = value.get("ci")
        interval = f" [{number(ci[0])}, {number(ci[1])}]" if ci else ""
        has_rule = value.get("threshold") is not None
        rule = f" {value.get('comparator') or ''} {number(value['threshold'])}" if has_rule else ""
        return f"{value['status']}: {number(value['observed'])}{interval}{rule}"
    return cell(value)


def signed(delta) -> str | None:
    """A difference with its sign, 4 significant digits (`+0.02703`, `-3`)."""
    if delta is None:
        return None
    return f"{delta:+.4g}" if isinstance(delta, float) else f"{delta:+d}"


def print_diff(result: dict, *, every_field: bool) -> None:
    """The fields that differ (every field with `every_field`), marked `*`, each side rounded, with B − A for
    numbers, fitted to the terminal's width."""
    rows = [{"": "" if row["same"] else "*", "field": row["field"], "A": diff_cell(row["a"]), "B": diff_cell(row["b"]),
             "B − A": None if row["same"] else signed(row.get("delta"))}
            for row in result["rows"] if every_field or not row["same"]]
    print(f"A = {result['release_a']}\nB = {result['release_b']}")
    print_table(rows, DIFF_COLUMNS, shrink=("field", "A", "B"))
    shown = "" if every_field else " (shown; --all shows every field)"
    print(f"{len(result['changed'])} of {len(result['rows'])} fields differ{shown}; "
          f"{result['config_fields_same']} config fields are the same (not shown)")


def cmd_ledger_diff(args) -> int:
    """Two releases side by side: config, artifact, image digest, placement, gate metrics and thresholds."""
    from shiplift.tasks.ledger.views import diff

    result = diff(ledger_for(args), args.release_a, args.release_b)
    print_json(result) if args.json else print_diff(result, every_field=args.all)
    return 0


def print_as_of(served: dict) -> None:
    from shiplift.tasks.ledger.views import field_rows

    promotion = served["promotion"]
    how = {"rollback": f"a rollback from {promotion['rollback_from']}: {promotion['reason']}",
           "promote": f"a promotion ({promotion['strategy']}): {promotion['reason']}"}.get(
        promotion["trigger"], f"its own release ({promotion['strategy']})")
    print(f"{served['model']} at {served['as_of']}: {served['release_id']}, serving since {served['since']}, put "
          f"there by {how}; actor {promotion['actor']} (ledger seq {served['record']['seq']})")
    # every release serving then: two mid-rollout
    print_table(served["serving"], ["release_id", "copies", "share", "since"])
    print_table(field_rows(served["built_from"], "built from"), ["built from", "value"])
    if served["evidence"]:
        print_gate(served["evidence"])


def moment(text: str) -> datetime:
    """A command's TIME: `now` (this moment, UTC) or ISO 8601 with a timezone; BadInput naming the fix otherwise."""
    fix = "pass ISO 8601 with a timezone, e.g. 2026-11-29T12:00:00Z or 2026-11-29T13:00:00+01:00, or now"
    if text.strip().lower() == "now":
        return datetime.now(UTC)
    try:
        when = datetime.fromisoformat(text)
    except ValueError as error:
        raise BadInput(f"time {text!r} is not ISO 8601: {error}", fix=fix) from error
    if when.tzinfo is None:
        raise BadInput(f"time {text} has no timezone, so the moment is ambiguous", fix=fix)
    return when


def cmd_ledger_as_of(args) -> int:
    """What served a model at a moment, since when, built from what and on which gate evidence."""
    from shiplift.tasks.ledger.views import as_of

    when = moment(args.when)  # refuses a time without a timezone, naming the fix, before the ledger is opened
    shown = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if args.when.strip().lower() == "now" else args.when
    served = as_of(ledger_for(args), args.model, shown)
    print_json(served) if args.json else print_as_of(served)
    return 0


def cmd_ledger_timeline(args) -> int:
    """A model's releases, gate decisions, traffic steps, promotions and rollbacks with their reasons, in order."""
    from shiplift.tasks.ledger.views import timeline

    rows = timeline(ledger_for(args), args.model)
    print_json(rows) if args.json else print_table(rows, ["seq", "at", "release_id", "event", "detail", "actor"])
    return 0


def verification_for(args, ledger) -> dict:
    """`ledger verify`'s result for the command's state dir, key and anchored head."""
    from shiplift.tasks.pipeline.audit import verify_ledger

    return verify_ledger(ledger, args.state_dir, ledger_url=ledger_url_of(args), config=checkpoints_config(args),
                         key_path=args.key, public_key=verifying_key(args),
                         expect_head=getattr(args, "expect_head", None), witness_dir=args.witness)


def cmd_ledger_report(args) -> int:
    """The audit report: one self-contained HTML page, verified against the signed checkpoints."""
    from shiplift.tasks.ledger.audit_report import write_report

    ledger = ledger_for(args)
    verification = verification_for(args, ledger)
    path = write_report(ledger, args.out, verification, model=args.model)
    print(f"wrote {path}: ledger {'verified' if verification['ok'] else 'VERIFICATION FAILED'}, "
          f"{verification['n_records']} records")
    return 0 if verification["ok"] else EXIT_REJECTED


def cmd_ledger_upgrade(args) -> int:
    """Migrate an existing ledger's schema to this shiplift's revision (what opening it for writing does)."""
    from shiplift.tasks.backends.registry import ledger_url_for, open_ledger
    from shiplift.tasks.ledger.store import upgrade

    # refuses a ledger that is not there
    open_ledger(ledger_url=args.ledger_url, state_dir=args.state_dir, read_only=True).close()
    print_json(upgrade(ledger_url_for(Path(args.state_dir or default_state_dir()), args.ledger_url)))
    return 0


def cmd_ledger_export(args) -> int:
    """The records and the verify result as JSON or CSV: into --out, or on stdout with `--out -`."""
    ledger = ledger_for(args)
    if args.out == "-":
        sys.stdout.write(ledger.export_text(args.format))
        return 0
    ledger.export(args.format, Path(args.out))
    print(f"wrote {args.out}")
    return 0


def add_ledger_commands(sub) -> None:
    """Add the `ledger` group."""
    ledger = sub.add_parser("ledger", help="the release ledger").add_subparsers(dest="ledger_command", required=True,
                                                                                metavar="ACTION")

    def ledger_parser(name: str, help_text: str, aliases: tuple[str, ...] = ()):
        p = with_ledger(with_state_dir(ledger.add_parser(name, help=help_text, aliases=list(aliases))))
        # not given: the checkpoint log is looked for (beside a SQLite --ledger-url) and not presumed
        p.set_defaults(state_dir=None)
        return p

    def with_checkpoints(p, created: bool = False):
        p.add_argument("--key", help="the local checkpoint key (default: $SHIPLIFT_CHECKPOINT_KEY, else "
                                     "~/.config/shiplift/ledger-ed25519.pem"
                                     + ("; created 0600 on first use)" if created else ")"))
        p.add_argument("--config", help="an aws release config: its ledger_url, and the Secrets Manager key and "
                                        "Object Lock bucket its backend.checkpoints names")
        if not created:
            p.add_argument("--public-key", help="verify with this PEM public key alone (`shiplift ledger public-key` "
                                                "exports it); no private key is read")
        return p

    def with_witness(p):
        p.add_argument("--witness", help="a folder holding a second copy of the signed heads, cross-checked against "
                                         "the checkpoints and the chain (default: $SHIPLIFT_CHECKPOINT_WITNESS, "
                                         "which signing also writes)")
        return p

    p = ledger_parser("history", "one row per release (of MODEL, or of every model); --records for every record")
    p.add_argument("model", nargs="?", help="one model (default: every model)")
    p.add_argument("--records", action="store_true", help="every ledger record instead of one row per release")
    with_json(p, "the rows")
    p.set_defaults(func=cmd_ledger_history)
    p = with_json(with_release(ledger_parser(
        "show", "one release: built from what, gate evidence, stages, promotions")), "the release in full")
    p.set_defaults(func=cmd_ledger_show)
    p = ledger_parser("timeline",
                      "a model's releases, gate decisions, traffic steps, promotions and rollbacks in order")
    p.add_argument("model", help="the model's name")
    with_json(p, "the events")
    p.set_defaults(func=cmd_ledger_timeline)
    p = ledger_parser("verify", "check the hash chain and that it extends every signed checkpoint")
    p.add_argument("--expect-head", help="a head hash recorded earlier (detects deleted newest records)")
    with_json(p, "the verification")
    with_witness(with_checkpoints(p))
    p.set_defaults(func=cmd_ledger_verify)
    p = ledger_parser("checkpoint",
                      "verify the ledger, then sign its head with the checkpoint key (kept outside the state dir)")
    with_checkpoints(p, created=True)
    with_json(p, "the signed checkpoint")
    p.set_defaults(func=cmd_ledger_checkpoint)
    p = with_release(ledger_parser(
        "prove", "an inclusion proof of one release's records in the latest signed checkpoint"))
    with_checkpoints(p)
    p.add_argument("--out", help="write the proof to this file (default: print it)")
    p.set_defaults(func=cmd_ledger_prove)
    p = ledger_parser("check-proof", "check an inclusion proof with the key alone (no ledger)")
    p.add_argument("proof", help="the proof file `shiplift ledger prove --out` wrote")
    with_checkpoints(p)
    p.set_defaults(func=cmd_ledger_check_proof)
    p = ledger_parser("public-key",
                      "export the public key that verifies the checkpoints (PEM), for verify and check-proof")
    with_checkpoints(p)
    p.add_argument("--out", help="write the PEM to this file (default: print it)")
    p.set_defaults(func=cmd_ledger_public_key)
    p = ledger_parser("diff", "two releases side by side: the fields that differ (config, artifact, image digest, "
                              "placement, gate metrics and checks, thresholds), with B − A for numbers")
    with_release(p, dest="release_a", what="release A (the left column)")
    with_release(p, dest="release_b", what="release B (the right column; deltas are B − A)")
    p.add_argument("--all", action="store_true", help="every field, also those that are the same")
    with_json(p, "every field, unrounded, with its delta")
    p.set_defaults(func=cmd_ledger_diff)
    p = ledger_parser("as-of",
                      "what served a model at a time (ISO 8601 with timezone, or now), since when, on what evidence",
                      aliases=("served-at",))
    p.add_argument("model", help="the model's name")
    p.add_argument("when", metavar="TIME", help="ISO 8601 with a timezone (2026-11-29T12:00:00Z), or now")
    with_json(p, "what served")
    p.set_defaults(func=cmd_ledger_as_of)
    p = ledger_parser("report", "write the audit report (self-contained HTML) after verifying against the checkpoints")
    p.add_argument("model", nargs="?", help="one model (default: every model)")
    p.add_argument("--out", required=True, help="folder to write index.html into")
    with_witness(with_checkpoints(p))
    p.set_defaults(func=cmd_ledger_report)
    p = ledger_parser("upgrade",
                      "migrate the ledger's schema to this shiplift's revision (Alembic; refuses a newer one)")
    p.set_defaults(func=cmd_ledger_upgrade)
    p = ledger_parser("export", "export the ledger's records and its verification (JSON or CSV)")
    p.add_argument("--format", choices=["json", "csv"], default="json",
                   help="json or csv (for people: `ledger report`, HTML)")
    p.add_argument("--out", required=True, help="the file to write, or - for stdout")
    p.set_defaults(func=cmd_ledger_export)
