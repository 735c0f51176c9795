"""The `shiplift` command line: releases, stages, serving, endpoints, evaluation and the ledger.

Exit codes: 0 success, 1 unexpected error, 2 bad config or input, 3 gate rejected the release
(or `ledger verify` found tampering), 4 another run holds the promotion lease.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tasks.errors import BadInput, ConfigError, GateFailed, IntegrityError, LeaseHeld, NotFound, ShipliftError
from tasks.ledger.events import PROMOTED
from tasks.backends.registry import default_state_dir
from tasks.pipeline.table import STAGE_NAMES

EXIT_ERROR, EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_LEASE = 1, 2, 3, 4
EXIT_BROKEN_PIPE = 141  # as a shell reports a writer ended by SIGPIPE


def print_json(value) -> None:
    print(json.dumps(value, indent=2, sort_keys=True, default=str))


def with_ledger(p):
    """The ledger a step reads its release from: --ledger-url, $SHIPLIFT_LEDGER_URL, or SQLite under --state-dir."""
    p.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger (default: $SHIPLIFT_LEDGER_URL, else sqlite under --state-dir)")
    return p


def format_table(rows: list[dict], columns: list[str]) -> str:
    """A plain text table for people: a header, a rule, a line a row, columns padded to their widest cell; a value
    that is not there (None) shows as '-'."""
    cells = [["-" if row.get(column) is None else str(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(column), *(len(line[i]) for line in cells)]) for i, column in enumerate(columns)]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(line, widths)).rstrip()
                     for line in [columns, ["-" * w for w in widths], *cells])


def print_table(rows: list[dict], columns: list[str]) -> None:
    """A table for people on stdout (`--json` prints the rows for machines instead)."""
    print(format_table(rows, columns))


def aws_config(args, what: str):
    """The aws release config a command needs; BadInput naming the backend otherwise."""
    from tasks.config import load_release_config

    config = load_release_config(args.config, overrides=tuple(args.set))
    if config.backend.kind != "aws":
        raise BadInput(f"{args.config} uses the {config.backend.kind} backend; {what} is about AWS, which that backend never calls",
                       fix="pass an aws release config (backend.kind: aws), e.g. configs/releases/qwen35-4b-semif.yaml")
    return config


def cmd_release(args) -> int:
    if args.dry_run:
        return release_dry_run(args)
    if args.with_champion:
        raise ConfigError("--with-champion plans a later release and only goes with --dry-run",
                          fix=f"run `shiplift release {args.config} --dry-run --with-champion`, or leave --with-champion out")
    from tasks.pipeline.release import run_release

    summary = run_release(args.config, overrides=tuple(args.set), keep_candidate=args.keep_candidate or None)
    print_json(summary)
    return 0 if summary["status"] == PROMOTED else EXIT_REJECTED


def release_dry_run(args) -> int:
    """Every request an aws release would send, one JSON object a line; nothing is sent, no credentials needed."""
    from collections import Counter

    from tasks.backends.aws.dryrun import plan_release, update_fit

    config = aws_config(args, "--dry-run")
    requests = plan_release(config, config_dir=Path(args.config).resolve().parent, with_champion=args.with_champion)
    for request in requests:
        print(json.dumps(request.to_json(), ensure_ascii=False))
    services = Counter(r.service for r in requests)
    with_placeholders = sum(1 for r in requests if r.placeholders)
    print(f"dry run: {len(requests)} requests ({', '.join(f'{n} {s}' for s, n in sorted(services.items()))}), each valid for "
          f"the installed botocore service model; {with_placeholders} carry placeholders (listed per request); nothing was sent",
          file=sys.stderr)
    print(f"{'this' if args.with_champion else 'the next'} release's update of production: {update_fit(config)}", file=sys.stderr)
    return 0


def cmd_rollback(args) -> int:
    """Put an earlier promoted release back on production with its own rollout strategy, then show what serves."""
    from tasks.pipeline.promotion import rollback
    from tasks.pipeline.release import default_actor

    result = rollback(args.state_dir, args.model, args.to, reason=args.reason, actor=args.actor or default_actor(),
                      expect_current=args.expect_current, ledger_url=args.ledger_url)
    if args.json:
        print_json(result)
        return 0
    served = result["served"] or {}
    print_table([{"model": result["model"], "from": result["rollback_from"] or "(none)", "to": result["rollback_to"],
                  "strategy": result["strategy"], "traffic steps": result["steps"],
                  "serving now": served.get("release_id", "?"), "image": (served.get("image_digest") or "?")[:19]}],
                ["model", "from", "to", "strategy", "traffic steps", "serving now", "image"])
    return 0


def cmd_iam(args) -> int:
    from tasks.backends.aws.iam import policies

    documents = policies(aws_config(args, "`shiplift iam`"))
    if args.out:
        from tasks.atomic import write_text_atomic

        for name, document in documents.items():
            write_text_atomic(Path(args.out) / name, json.dumps(document, indent=2) + "\n")
            print(f"wrote {Path(args.out) / name}")
    elif args.json:
        print_json(documents)
    else:
        rows = [{"document": name, "sid": s.get("Sid", ""), "actions": len(s["Action"]) if isinstance(s["Action"], list) else 1,
                 "resources": ", ".join(s.get("Resource", [])) if isinstance(s.get("Resource"), list) else s.get("Resource", "")}
                for name, document in documents.items() for s in document["Statement"] if "Resource" in s]
        print_table(rows, ["document", "sid", "actions", "resources"])
    return 0


def cmd_cleanup(args) -> int:
    """List, or delete, what shiplift created under a prefix (named with it and carrying shiplift's tag)."""
    from tasks.backends.registry import make_backends

    config = aws_config(args, "`shiplift cleanup`")
    prefix = args.prefix or config.resource_prefix
    if not prefix.strip():
        raise BadInput("--prefix is empty", fix="pass the resource prefix to clean up, e.g. --prefix shiplift")
    hosting = make_backends(config).hosting
    found = hosting.managed_resources(prefix)
    if args.list:
        if args.json:
            print_json([r.model_dump() for r in found])
        else:
            print_table([{"kind": r.kind, "name": r.name, "release": r.tags.get("shiplift:release", "")} for r in found],
                        ["kind", "name", "release"])
            print(f"{len(found)} resources named {prefix}* and tagged shiplift:managed=true", file=sys.stderr)
        return 0
    for resource in found:
        hosting.delete_resource(resource, progress=lambda message: print(message, file=sys.stderr, flush=True))
    print(f"deleted {len(found)} resources named {prefix}* and tagged shiplift:managed=true", file=sys.stderr)
    return 0


def cmd_stage(args) -> int:
    """One stage (inside a Step Functions task, its outcome is also reported with the task token)."""
    from tasks.orchestrators.task_token import reporting_to_step_functions
    from tasks.pipeline.release import run_orchestrated_stage

    def run() -> dict:
        result = run_orchestrated_stage(args.release, args.name, holder=args.holder, ledger_url=args.ledger_url,
                                        state_dir=args.state_dir)
        if args.result_uri:
            from tasks.orchestrators.step_functions import publish_stage_result

            publish_stage_result(args.result_uri, release_id=args.release, stage=args.name, result=result)
        return result

    print_json(reporting_to_step_functions(run))
    return 0


def parse_allowed_timeouts(text: str | None) -> dict[str, int] | None:
    """`begin=300,resolve=1800,…` as {step: seconds}; BadInput names a malformed entry or an unknown step."""
    from tasks.pipeline.table import STEPS

    if text is None:
        return None
    allowed: dict[str, int] = {}
    for entry in text.split(","):
        name, _, seconds = entry.partition("=")
        if name not in STEPS or not seconds.isdigit():
            raise BadInput(f"--allowed-timeouts entry {entry!r} is not STEP=SECONDS with a step of {', '.join(STEPS)}",
                           fix="pass what `shiplift sfn render` writes into the Begin state")
        allowed[name] = int(seconds)
    return allowed


def cmd_orchestrate_begin(args) -> int:
    from tasks.orchestrators.task_token import reporting_to_step_functions
    from tasks.pipeline.release import begin_orchestrated

    allowed = parse_allowed_timeouts(args.allowed_timeouts)
    print_json(reporting_to_step_functions(
        lambda: begin_orchestrated(args.config, holder=args.holder, allowed_timeouts=allowed, overrides=tuple(args.set))))
    return 0


def cmd_orchestrate_end(args) -> int:
    """Exit 0 whenever the final status was recorded, including rejected and --failed runs."""
    from tasks.orchestrators.task_token import reporting_to_step_functions
    from tasks.pipeline.release import end_orchestrated

    print_json(reporting_to_step_functions(
        lambda: end_orchestrated(args.release, holder=args.holder, failed=args.failed, ledger_url=args.ledger_url,
                                 state_dir=args.state_dir)))
    return 0


def sfn_inputs(args):
    """The config as the pipeline image sees it (path relative to the repository root) and the runner settings."""
    from tasks.config import load_release_config
    from tasks.orchestrators.step_functions import load_runner_settings

    config_file = Path(args.config).resolve()
    from tasks.project import PROJECT_ROOT as root

    if not config_file.is_relative_to(root):
        raise BadInput(f"{args.config} is outside the repository {root}", fix="Step Functions tasks read configs from the pipeline image: keep it under configs/")
    config = load_release_config(config_file, overrides=tuple(args.set))
    return config, str(config_file.relative_to(root)), load_runner_settings(args.runner)


def cmd_sfn_render(args) -> int:
    from tasks.orchestrators.step_functions import definition_json, render_state_machine

    config, config_path, runner = sfn_inputs(args)
    text = definition_json(render_state_machine(config, runner=runner, config_path=config_path))
    if args.out:
        from tasks.atomic import write_text_atomic

        write_text_atomic(args.out, text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_sfn_deploy(args) -> int:
    from tasks.orchestrators.step_functions import deploy_state_machine, render_state_machine

    config, config_path, runner = sfn_inputs(args)
    definition = render_state_machine(config, runner=runner, config_path=config_path)
    print_json(deploy_state_machine(config, definition, role_arn=args.role_arn))
    return 0


def cmd_policy(args) -> int:
    """The retries and timeouts the CLI, Airflow and Step Functions apply to each step of this config."""
    from tasks.config import load_release_config
    from tasks.pipeline.table import LEASE, MAX_STEP_TIMEOUT_S, policy_rows

    rows = policy_rows(load_release_config(args.config, overrides=tuple(args.set)))
    if args.json:
        print_json({"steps": rows, "max_step_timeout_s": MAX_STEP_TIMEOUT_S,
                    "lease": {"ttl_s": LEASE.ttl_s, "renew_every_s": LEASE.renew_every_s}})
        return 0
    print_table(rows, ["step", "retries", "retried", "backoff", "table_timeout_s", "timeout_s"])
    print(f"\nA step may take at most {MAX_STEP_TIMEOUT_S} s; the model's lease lasts {LEASE.ttl_s:.0f} s unless renewed, "
          f"and a running step renews it every {LEASE.renew_every_s:.0f} s. Every other error fails the step at once.")
    return 0


def cmd_config_validate(args) -> int:
    from tasks.config import load_release_config
    from tasks.pipeline.release import release_id_for

    config = load_release_config(args.config, overrides=tuple(args.set))
    print_json({"ok": True, "release_id": release_id_for(config), "config_hash": config.config_hash(), "config": config.model_dump(mode="json")})
    return 0


def exec_server(image: str, env: dict[str, str]) -> int:
    """Replace this process with an image's server (what its container runs), configured by `env`."""
    from tasks.backends.local.process_image import server_command

    command = server_command(image)
    os.execve(command[0], command, {**os.environ, **env})
    return 0  # not reached: execve replaces this process


def optional_env(args, mapping: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return {variable: str(getattr(args, flag)) for flag, variable in mapping if getattr(args, flag) is not None}


def cmd_endpoints_list(args) -> int:
    from tasks.backends.registry import local_endpoints

    endpoints = local_endpoints(args.state_dir).list_endpoints()
    if args.json:
        print_json(endpoints)
        return 0
    rows = [
        {
            "endpoint": e["name"],
            "status": e["status"],
            "components (copies in rotation / spec)": ", ".join(
                f"{name} {c['in_rotation']}/{c['copies']}" for name, c in e["components"].items()
            ) or "-",
            "url": e["url"],
        }
        for e in endpoints
    ]
    print_table(rows, ["endpoint", "status", "components (copies in rotation / spec)", "url"])
    return 0


def named_endpoints(hosting, args, verb: str) -> list[str]:
    """The endpoints a command names, or every one with --all; BadInput for an unknown name."""
    if args.all == bool(args.names):
        raise BadInput("give endpoint names or --all, not both and not neither", fix=f"shiplift endpoints {verb} NAME... | --all")
    known = [e["name"] for e in hosting.list_endpoints()]
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        raise BadInput(f"no local endpoint named {', '.join(unknown)} under {hosting.state_dir}", fix="see `shiplift endpoints list`")
    return known if args.all else args.names


def cmd_endpoints_stop(args) -> int:
    from tasks.backends.registry import local_endpoints

    hosting = local_endpoints(args.state_dir)
    for name in named_endpoints(hosting, args, "stop"):
        hosting.delete_endpoint(name)
        print(f"stopped {name}")
    return 0


def cmd_endpoints_heal(args) -> int:
    from tasks.backends.registry import local_endpoints

    hosting = local_endpoints(args.state_dir)
    for name in named_endpoints(hosting, args, "heal"):
        info = hosting.ensure_endpoint(name)
        print(f"{name}: router {info.status}, every component back at its copy count")
    return 0


def ledger_for(args, *, read_only: bool = True):
    """The ledger a `ledger` command reads (or, not `read_only`, writes): --url, else the --config's ledger_url, else
    SQLite under --state-dir."""
    from tasks.backends.registry import open_ledger

    return open_ledger(ledger_url=ledger_url_of(args), state_dir=args.state_dir, read_only=read_only)


def ledger_url_of(args) -> str | None:
    """The ledger URL a `ledger` command names: --url, else the --config's ledger_url (None: the default)."""
    config = checkpoints_config(args)
    return args.url or (config.backend.ledger_url if config is not None else None)


def checkpoints_config(args):
    """The release config of --config (whose backend names the checkpoints: aws), or None for the state dir's; loaded
    once per command (the ledger commands ask for it from several helpers)."""
    from tasks.config import load_release_config

    if not getattr(args, "config", None):
        return None
    if getattr(args, "loaded_config", None) is None:
        args.loaded_config = load_release_config(args.config)
    return args.loaded_config


def checkpoint_dir(args) -> Path | None:
    """The folder of a local ledger's checkpoint log: --state-dir, else the one `checkpoint_folder` finds (beside a
    SQLite --url); None for an aws --config, whose backend names its store."""
    from tasks.ledger.audit import checkpoint_folder

    config = checkpoints_config(args)
    if config is not None and config.backend.kind != "local":
        return None
    return checkpoint_folder(args.state_dir, ledger_url=ledger_url_of(args), config=config)[0]


def verifying_key(args):
    """The public key a command checks with: --public-key's PEM file (no private key is read), else None (the
    --config's or --key's)."""
    from tasks.ledger.audit import public_key_refused_for_aws
    from tasks.ledger.checkpoints import read_public_key

    if not getattr(args, "public_key", None):
        return None
    if checkpoint_dir(args) is None:
        raise public_key_refused_for_aws()
    return read_public_key(args.public_key)


def verifying_parts(args):
    """The (public key, store) of a command's checkpoints: --public-key's, else --config's backend (its public key
    where it names one: the secret is never read), else --key's public half; the --config's store, else the log of
    `checkpoint_dir`."""
    from tasks.backends.registry import checkpoint_parts
    from tasks.ledger.checkpoints import CheckpointLog, log_path

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
        raise BadInput(f"cannot write --out {path}: {error.strerror}", fix="pass a file path in a folder you can write") from error


def cmd_ledger_history(args) -> int:
    """One row per release of a model (or of every model), or with --records every record."""
    ledger = ledger_for(args)
    if args.records:
        rows = [r.to_dict() for r in ledger.history(args.model)]
        columns = ["seq", "recorded_at", "release_id", "stage", "event", "actor", "record_hash"]
    else:
        from tasks.ledger.views import releases

        rows = releases(ledger, args.model)
        columns = ["release_id", "opened_at", "opened_by", "status", "decision", "promoted_at", "strategy", "records"]
    if args.model and not rows:
        raise NotFound(f"the ledger has no records of model {args.model!r}", fix="run `shiplift ledger history` for every model")
    print_json(rows) if args.json else print_table(rows, columns)
    return 0


def print_gate(gate: dict) -> None:
    """A gate's decision, its champion and every check with its interval and rule."""
    from tasks.ledger.views import CHECK_COLUMNS, check_cells

    datasets = ", ".join(f"{d['name']} (n {d['n']}, sha256 {d['sha256']})" for d in gate.get("datasets") or [])
    print(f"\ngate {gate['decision']} (champion: {gate.get('champion_release') or 'none'}); datasets: {datasets}")
    print_table([check_cells(c) for c in gate.get("checks") or []], CHECK_COLUMNS)


def print_release(detail: dict) -> None:
    from tasks.ledger.views import field_rows

    fields = ["release_id", "model", "status", "opened_at", "opened_by", "config_hash", "source_sha256", "model_sha256",
              "artifact_sha256", "artifact_uri", "image_uri", "image_digest", "decision", "records", "placement"]
    print_table(field_rows({name: detail[name] for name in fields}, "field"), ["field", "value"])
    print()
    print_table([{"stage": name, "status": status} for name, status in detail["stages"].items()], ["stage", "status"])
    if detail["gate"]:
        print_gate(detail["gate"])
    if detail["promotions"]:
        print()
        print_table(detail["promotions"], ["at", "event", "trigger", "strategy", "endpoint", "component", "steps", "reason", "actor"])


def cmd_ledger_show(args) -> int:
    """One release: what it was built from, its gate evidence, its stages and its promotions."""
    from tasks.ledger.views import show

    detail = show(ledger_for(args), args.release)
    print_json(detail) if args.json else print_release(detail)
    return 0


def cmd_ledger_verify(args) -> int:
    """The chain, an anchored head if given, every signed checkpoint, and every checkpoint the chain records."""
    from tasks.ledger.audit import verdict_lines

    result = verification_for(args, ledger_for(args))
    if args.json:
        print_json(result)
    else:
        headline, *problems = verdict_lines(result)
        print("\n".join([headline, *(f"  - {problem}" for problem in problems)]))
    return 0 if result["ok"] else EXIT_REJECTED


def cmd_ledger_prove(args) -> int:
    """An inclusion proof of one release's records in the latest signed checkpoint (O(log n) hashes a record)."""
    from tasks.ledger.checkpoints import prove

    public, store = verifying_parts(args)
    proof = prove(ledger_for(args), store, args.release, public)
    if args.out:
        write_out(args.out, json.dumps(proof, indent=2, sort_keys=True) + "\n")
        print(f"wrote {args.out}: {len(proof['records'])} records proven in checkpoint seq {proof['checkpoint']['seq']}",
              file=sys.stderr)
    else:
        print_json(proof)
    return 0


def cmd_ledger_check_proof(args) -> int:
    """Check an inclusion proof with the public key alone (--public-key's, --key's, or an aws --config's): no ledger
    needed."""
    from tasks.ledger.checkpoints import PROOF_FIX, check_proof, load_json

    try:
        text = Path(args.proof).read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise NotFound(f"no proof file {args.proof}", fix="write one with `shiplift ledger prove RELEASE --out FILE`") from error
    except IsADirectoryError as error:
        raise BadInput(f"the proof {args.proof} is a directory", fix=PROOF_FIX) from error
    except (OSError, UnicodeDecodeError) as error:
        raise BadInput(f"the proof {args.proof} cannot be read as text: {error}", fix=PROOF_FIX) from error
    proof = load_json(text, f"the proof {args.proof}", PROOF_FIX)
    problems = check_proof(proof, verifying_parts(args)[0])
    print_json({"ok": not problems, "release_id": proof["release_id"], "records": len(proof["records"]),
                "problems": problems})
    return 0 if not problems else EXIT_REJECTED


def cmd_ledger_checkpoint(args) -> int:
    """Sign the ledger's head (after verifying it) into the checkpoint store (local file, or S3 for an aws --config)."""
    from tasks.backends.registry import sign_checkpoint

    signed = sign_checkpoint(ledger_for(args, read_only=False), checkpoints_config(args), state_dir=checkpoint_dir(args),
                             key_path=args.key)
    print_json(signed.to_dict())
    return 0


def cmd_ledger_public_key(args) -> int:
    """Export the key that verifies the checkpoints (PEM), for whoever checks proofs or verifies without the secret."""
    from tasks.ledger.checkpoints import public_pem

    pem = public_pem(verifying_parts(args)[0])
    if args.out:
        write_out(args.out, pem)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(pem, end="")
    return 0


def print_diff(result: dict, *, changed_only: bool) -> None:
    rows = [{"field": row["field"], "A": row["a"], "B": row["b"], "": "" if row["same"] else "differs"}
            for row in result["rows"] if not (changed_only and row["same"])]
    print(f"A = {result['release_a']}\nB = {result['release_b']}")
    print_table(rows, ["field", "A", "B", ""])
    print(f"{len(result['changed'])} fields differ; {result['config_fields_same']} config fields are the same (not shown)")


def cmd_ledger_diff(args) -> int:
    """Two releases side by side: config, artifact, image digest, placement, gate metrics and thresholds."""
    from tasks.ledger.views import diff

    result = diff(ledger_for(args), args.release_a, args.release_b)
    print_json(result) if args.json else print_diff(result, changed_only=args.changed)
    return 0


def print_as_of(served: dict) -> None:
    from tasks.ledger.views import field_rows

    promotion = served["promotion"]
    how = {"rollback": f"a rollback from {promotion['rollback_from']}: {promotion['reason']}",
           "promote": f"a promotion ({promotion['strategy']}): {promotion['reason']}"}.get(
        promotion["trigger"], f"its own release ({promotion['strategy']})")
    print(f"{served['model']} at {served['as_of']}: {served['release_id']}, serving since {served['since']}, put there by "
          f"{how}; actor {promotion['actor']} (ledger seq {served['record']['seq']})")
    print_table(field_rows(served["built_from"], "built from"), ["built from", "value"])
    if served["evidence"]:
        print_gate(served["evidence"])


def cmd_ledger_as_of(args) -> int:
    """What served a model at a moment, since when, built from what and on which gate evidence."""
    from tasks.ledger.views import as_of

    served = as_of(ledger_for(args), args.model, args.when)
    print_json(served) if args.json else print_as_of(served)
    return 0


def cmd_ledger_timeline(args) -> int:
    """A model's releases, gate decisions, traffic steps, promotions and rollbacks with their reasons, in order."""
    from tasks.ledger.views import timeline

    rows = timeline(ledger_for(args), args.model)
    print_json(rows) if args.json else print_table(rows, ["seq", "at", "release_id", "event", "detail", "actor"])
    return 0


def verification_for(args, ledger) -> dict:
    """`ledger verify`'s result for the command's state dir, key and anchored head."""
    from tasks.ledger.audit import verify_ledger

    return verify_ledger(ledger, args.state_dir, ledger_url=ledger_url_of(args), config=checkpoints_config(args),
                         key_path=args.key, public_key=verifying_key(args), expect_head=getattr(args, "expect_head", None),
                         witness_dir=args.witness)


def cmd_ledger_report(args) -> int:
    """The audit report: one self-contained HTML page, verified against the signed checkpoints."""
    from tasks.ledger.report import write_report

    ledger = ledger_for(args)
    verification = verification_for(args, ledger)
    path = write_report(ledger, args.out, verification, model=args.model)
    print(f"wrote {path}: ledger {'verified' if verification['ok'] else 'VERIFICATION FAILED'}, "
          f"{verification['n_records']} records")
    return 0 if verification["ok"] else EXIT_REJECTED


def cmd_ledger_upgrade(args) -> int:
    """Migrate an existing ledger's schema to this shiplift's revision (what opening it for writing does)."""
    from tasks.backends.registry import ledger_url_for, open_ledger
    from tasks.ledger.store import upgrade

    open_ledger(ledger_url=args.url, state_dir=args.state_dir, read_only=True).close()  # refuses a ledger that is not there
    print_json(upgrade(ledger_url_for(Path(args.state_dir or default_state_dir()), args.url)))
    return 0


def cmd_ledger_export(args) -> int:
    ledger_for(args).export(args.format, Path(args.out))
    print(f"wrote {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from tasks.families.registry import families

    parser = argparse.ArgumentParser(prog="shiplift", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_state_dir(p):
        p.add_argument("--state-dir", default=str(default_state_dir()), help="local backend state (default: $SHIPLIFT_HOME or .shiplift)")
        return p

    p = sub.add_parser("release", help="run or resume a release from a config")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value", help="override a config field (repeatable)")
    p.add_argument("--keep-candidate", action="store_true", help="do not tear the candidate endpoint down")
    p.add_argument("--dry-run", action="store_true",
                   help="aws configs: print every request the release would send (JSON lines), validated, and send nothing")
    p.add_argument("--with-champion", action="store_true",
                   help="with --dry-run: plan a later release, whose gate scores the serving champion and whose promote "
                        "updates production (showing how the update fits the endpoint)")
    p.set_defaults(func=cmd_release)

    p = with_ledger(with_state_dir(sub.add_parser(
        "rollback", help="put an earlier promoted release of a model back on production (its own rollout strategy), "
                         "verify what serves and record why")))
    p.add_argument("model")
    p.add_argument("--to", required=True, metavar="RELEASE", help="the release to serve again (a promoted one)")
    p.add_argument("--reason", required=True, help="why, for the ledger")
    p.add_argument("--expect-current", metavar="RELEASE", help="refuse unless the ledger says this release serves now")
    p.add_argument("--actor", help="who rolls back (default: $SHIPLIFT_ACTOR, else user@host)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("iam", help="least-privilege IAM policies for an aws config (pipeline, SageMaker execution, CodeBuild roles)")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value")
    p.add_argument("--out", help="write the policy documents into this folder")
    p.add_argument("--json", action="store_true", help="print the documents as one JSON object")
    p.set_defaults(func=cmd_iam)

    p = sub.add_parser("cleanup", help="list or delete the AWS resources shiplift created under a prefix (and only those)")
    p.add_argument("config", help="an aws release config (region, account, credentials chain)")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value")
    p.add_argument("--prefix", help="resource name prefix (default: the config's resource_prefix)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--list", action="store_true", help="list what would be deleted")
    which.add_argument("--delete-all", action="store_true", help="delete it all, in dependency order, waiting for each")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_cleanup)

    p = with_ledger(with_state_dir(sub.add_parser(
        "stage", help="run one stage of an existing release from the ledger (a stage that already succeeded returns its result)")))
    p.add_argument("name", choices=STAGE_NAMES)
    p.add_argument("--release", required=True)
    p.add_argument("--result-uri", help="also write the result to s3://BUCKET/KEY (how Step Functions reads the gate decision)")
    p.add_argument("--holder", help="the orchestrated run holding the model's lease: renewed while the stage runs, "
                                    "required by promote")
    p.set_defaults(func=cmd_stage)

    orchestrate = sub.add_parser("orchestrate", help="first and last step of an orchestrated (Airflow / Step Functions) run"
                                 ).add_subparsers(dest="orchestrate_command", required=True)
    p = orchestrate.add_parser("begin", help="open the release and take the model's promotion lease")
    p.add_argument("config")
    p.add_argument("--holder", required=True, help="who holds the lease, e.g. the execution ARN")
    p.add_argument("--allowed-timeouts", metavar="STEP=SECONDS,...",
                   help="the orchestrator's timeout per step: a config whose deadlines need longer is refused")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value")
    p.set_defaults(func=cmd_orchestrate_begin)
    p = with_ledger(with_state_dir(orchestrate.add_parser("end", help="record the final status and give the lease back")))
    p.add_argument("--release", required=True)
    p.add_argument("--holder", required=True)
    p.add_argument("--failed", action="store_true", help="an earlier step failed")
    p.set_defaults(func=cmd_orchestrate_end)

    sfn = sub.add_parser("sfn", help="the release as an AWS Step Functions state machine").add_subparsers(dest="sfn_command", required=True)
    for name, func, help_text in (("render", cmd_sfn_render, "write the state machine definition (ASL JSON)"),
                                  ("deploy", cmd_sfn_deploy, "create or update the state machine (idempotent)")):
        p = sfn.add_parser(name, help=help_text)
        p.add_argument("config")
        p.add_argument("--runner", required=True, help="runner settings YAML (see configs/stepfunctions/runner-example.yaml)")
        p.add_argument("--set", action="append", default=[], metavar="a.b=value")
        if name == "render":
            p.add_argument("--out", help="write to this file instead of stdout")
        else:
            p.add_argument("--role-arn", required=True, help="the IAM role the state machine runs as")
        p.set_defaults(func=func)

    p = sub.add_parser("policy", help="the retries and timeouts every orchestrator applies to each step of a config")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_policy)

    config = sub.add_parser("config", help="configuration tools").add_subparsers(dest="config_command", required=True)
    p = config.add_parser("validate", help="validate a release config and print the effective values")
    p.add_argument("config")
    p.add_argument("--set", action="append", default=[], metavar="a.b=value")
    p.set_defaults(func=cmd_config_validate)

    serve = sub.add_parser("serve", help="run a serving image's server locally").add_subparsers(dest="serve_command", required=True)
    evaluate = sub.add_parser("eval", help="evaluate an endpoint").add_subparsers(dest="eval_command", required=True)
    for family in families():  # each model family adds its server and its evaluation
        family.add_commands(serve, evaluate)

    endpoints = sub.add_parser("endpoints", help="local endpoints").add_subparsers(dest="endpoints_command", required=True)
    p = with_state_dir(endpoints.add_parser("list", help="list local endpoints, their health and components"))
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_endpoints_list)
    p = with_state_dir(endpoints.add_parser("stop", help="stop local endpoints"))
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=cmd_endpoints_stop)
    p = with_state_dir(endpoints.add_parser("heal", help="restart local endpoints' dead routers and copies"))
    p.add_argument("names", nargs="*")
    p.add_argument("--all", action="store_true")
    p.set_defaults(func=cmd_endpoints_heal)

    ledger = sub.add_parser("ledger", help="the release ledger").add_subparsers(dest="ledger_command", required=True)

    def ledger_parser(name: str, help_text: str, aliases: tuple[str, ...] = ()):
        p = with_state_dir(ledger.add_parser(name, help=help_text, aliases=list(aliases)))
        p.set_defaults(state_dir=None)  # not given: the checkpoint log is looked for (beside a SQLite --url) and not presumed
        p.add_argument("--url", help="SQLAlchemy URL of the ledger (default: sqlite under --state-dir)")
        return p

    def with_checkpoints(p, created: bool = False):
        p.add_argument("--key", help="the local checkpoint key (default: $SHIPLIFT_CHECKPOINT_KEY, else "
                                     "~/.config/shiplift/ledger-ed25519.pem" + ("; created 0600 on first use)" if created else ")"))
        p.add_argument("--config", help="an aws release config: its ledger_url, and the Secrets Manager key and Object Lock "
                                        "bucket its backend.checkpoints names")
        if not created:
            p.add_argument("--public-key", help="verify with this PEM public key alone (`shiplift ledger public-key` "
                                                "exports it); no private key is read")
        return p

    def with_witness(p):
        p.add_argument("--witness", help="a folder holding a second copy of the signed heads, cross-checked against the "
                                         "checkpoints and the chain (default: $SHIPLIFT_CHECKPOINT_WITNESS, which "
                                         "signing also writes)")
        return p

    p = ledger_parser("history", "one row per release (of MODEL, or of every model); --records for every record")
    p.add_argument("model", nargs="?")
    p.add_argument("--records", action="store_true", help="every ledger record instead of one row per release")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger_history)
    p = ledger_parser("show", "one release: built from what, gate evidence, stages, promotions")
    p.add_argument("release")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger_show)
    p = ledger_parser("timeline", "a model's releases, gate decisions, traffic steps, promotions and rollbacks in order")
    p.add_argument("model")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger_timeline)
    p = ledger_parser("verify", "check the hash chain and that it extends every signed checkpoint")
    p.add_argument("--expect-head", help="a head hash recorded earlier (detects deleted newest records)")
    p.add_argument("--json", action="store_true")
    with_witness(with_checkpoints(p))
    p.set_defaults(func=cmd_ledger_verify)
    p = ledger_parser("checkpoint", "verify the ledger, then sign its head with the checkpoint key (kept outside the state dir)")
    with_checkpoints(p, created=True)
    p.set_defaults(func=cmd_ledger_checkpoint)
    p = ledger_parser("prove", "an inclusion proof of one release's records in the latest signed checkpoint")
    p.add_argument("release")
    with_checkpoints(p)
    p.add_argument("--out", help="write the proof to this file (default: print it)")
    p.set_defaults(func=cmd_ledger_prove)
    p = ledger_parser("check-proof", "check an inclusion proof with the key alone (no ledger)")
    p.add_argument("proof")
    with_checkpoints(p)
    p.set_defaults(func=cmd_ledger_check_proof)
    p = ledger_parser("public-key", "export the public key that verifies the checkpoints (PEM), for verify and check-proof")
    with_checkpoints(p)
    p.add_argument("--out", help="write the PEM to this file (default: print it)")
    p.set_defaults(func=cmd_ledger_public_key)
    p = ledger_parser("diff", "two releases side by side: config, artifact, image digest, placement, gate metrics, thresholds")
    p.add_argument("release_a")
    p.add_argument("release_b")
    p.add_argument("--changed", action="store_true", help="only the fields that differ")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger_diff)
    p = ledger_parser("as-of", "what served a model at a time (ISO 8601 with timezone), since when, on what evidence",
                      aliases=("served-at",))
    p.add_argument("model")
    p.add_argument("when")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ledger_as_of)
    p = ledger_parser("report", "write the audit report (self-contained HTML) after verifying against the checkpoints")
    p.add_argument("model", nargs="?")
    p.add_argument("--out", required=True, help="folder to write index.html into")
    with_witness(with_checkpoints(p))
    p.set_defaults(func=cmd_ledger_report)
    p = ledger_parser("upgrade", "migrate the ledger's schema to this shiplift's revision (Alembic; refuses a newer one)")
    p.set_defaults(func=cmd_ledger_upgrade)
    p = ledger_parser("export", "export the ledger")
    p.add_argument("--format", choices=["json", "csv"], default="json", help="for people: `ledger report` (HTML)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_ledger_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LeaseHeld as exc:
        print(f"shiplift: {exc}", file=sys.stderr)
        return EXIT_LEASE
    except (ConfigError, BadInput) as exc:
        print(f"shiplift: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (GateFailed, IntegrityError) as exc:
        print(f"shiplift: {exc}", file=sys.stderr)
        return EXIT_REJECTED
    except ShipliftError as exc:
        print(f"shiplift: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("shiplift: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing left to tell it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
