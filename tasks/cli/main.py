"""The `shiplift` command line: releases, stages, serving, endpoints, evaluation and the ledger.

Exit codes: 0 success, 1 unexpected error, 2 bad config or input, 3 gate rejected the release
(or `ledger verify` found tampering), 4 another run holds the promotion lease.

Commands print tables for people and, with `--json`, the same data for machines; read-only commands (`status`,
`endpoints list`, the `ledger` reads) never create or change a file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from tasks.console import (EXIT_ERROR, EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_LEASE, EXIT_AWAITING, EXIT_BROKEN_PIPE, print_json, number, cell, print_table, print_fields)
from tasks.errors import BadInput, ConfigError, GateFailed, IntegrityError, LeaseHeld, NotFound, ShipliftError
from tasks.ledger.events import AWAITING_APPROVAL, PROMOTED
from tasks.backends.registry import default_state_dir
from tasks.pipeline.table import STAGE_NAMES

_OPEN_LEDGERS: list = []  # ledgers a command opened, closed when it ends (a read-only SQLite open leaves nothing)


def version() -> str:
    """The installed shiplift distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("shiplift")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def with_ledger(p):
    """The ledger a step reads its release from: --ledger-url, $SHIPLIFT_LEDGER_URL, or SQLite under --state-dir."""
    p.add_argument("--ledger-url", help="SQLAlchemy URL of the ledger (default: $SHIPLIFT_LEDGER_URL, else sqlite under --state-dir)")
    return p


def with_set(p):
    p.add_argument("--set", action="append", default=[], metavar="a.b=value",
                   help="override a config field, the value read as YAML (repeatable)")
    return p


def with_json(p, what: str = "the same data"):
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON for machines instead of a table")
    return p


def overrides_of(args) -> tuple[str, ...]:
    """A command's config overrides: its --set flags, then --state-dir as `backend.state_dir` (where given)."""
    state_dir = getattr(args, "state_dir", None)
    return (*args.set, *((f"backend.state_dir={json.dumps(str(state_dir))}",) if state_dir else ()))


def aws_config(args, what: str):
    """The aws release config a command needs; BadInput naming the backend otherwise."""
    from tasks.config import load_release_config

    config = load_release_config(args.config, overrides=overrides_of(args))
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

    summary = run_release(args.config, overrides=overrides_of(args), keep_candidate=args.keep_candidate or None)
    print_json(summary) if args.json else print_summary(summary)
    return release_exit(summary)


def release_exit(summary: dict) -> int:
    """0 promoted, EXIT_AWAITING while it waits for an approver, else EXIT_REJECTED."""
    return 0 if summary["status"] == PROMOTED else EXIT_AWAITING if summary["status"] == AWAITING_APPROVAL else EXIT_REJECTED


def cmd_decide(args) -> int:
    """An approver's decision on a release awaiting approval, recorded with the reason; the release then continues
    (promote after an approval, ends rejected after a rejection)."""
    from tasks.orchestrators.approvals import answer_approval

    result = answer_approval(args.release, approve=args.command == "approve", reason=args.reason,
                             ledger_url=args.ledger_url, state_dir=args.state_dir)
    if args.json:
        print_json(result)
    else:
        print(f"{result['release_id']}: {result['decision']} by {result['by']}: {result['reason']}")
        print_summary(result["summary"])
    if args.command == "reject" or result.get("step_functions"):  # the execution continues the release on its own
        return 0
    return release_exit(result["summary"])


def print_summary(summary: dict) -> None:
    """A release's summary for people: a headline, then every field (gate metrics rounded)."""
    print(f"{summary['release_id']}: {summary['status']} (gate {summary.get('decision') or 'not reached'})")
    print_fields(summary)


def release_dry_run(args) -> int:
    """Every request an aws release would send, one JSON object a line; nothing is sent, no credentials needed."""
    from collections import Counter

    from tasks.orchestrators.dry_run import plan_release, update_fit
    from tasks.backends.pricing import dry_run_cost_lines

    config = aws_config(args, "--dry-run")
    requests = plan_release(config, config_path=Path(args.config), with_champion=args.with_champion)
    for request in requests:
        print(json.dumps(request.to_json(), ensure_ascii=False))
    services = Counter(r.service for r in requests)
    with_placeholders = sum(1 for r in requests if r.placeholders)
    print(f"dry run: {len(requests)} requests ({', '.join(f'{n} {s}' for s, n in sorted(services.items()))}), each valid for "
          f"the installed botocore service model; {with_placeholders} carry placeholders (listed per request); nothing was sent",
          file=sys.stderr)
    for line in dry_run_cost_lines(config):
        print(line, file=sys.stderr)
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

    result = reporting_to_step_functions(run)
    if args.json:
        print_json(result)
    else:
        print(f"{args.release} {args.name}: {result.get('event', 'succeeded')}")
        print_fields(result)
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
        lambda: begin_orchestrated(args.config, holder=args.holder, allowed_timeouts=allowed, overrides=overrides_of(args),
                                   waits_for_approval=args.waits_for_approval)))
    return 0


def cmd_orchestrate_await_approval(args) -> int:
    """Step Functions' AwaitApproval: record the approval request with the task token's reference and exit; the state
    waits on the token for `shiplift approve` / `reject` (the step reports only a failure, or a decision already made)."""
    from tasks.orchestrators.task_token import await_approval

    print_json(await_approval(args.release, holder=args.holder, token_prefix=args.token_prefix, ledger_url=args.ledger_url,
                              state_dir=args.state_dir))
    return 0


def cmd_orchestrate_approval_timed_out(args) -> int:
    """Step Functions' ApprovalTimedOut: record the timeout (unless decided) and take the lease back for Promote."""
    from tasks.orchestrators.task_token import approval_timed_out, reporting_to_step_functions

    print_json(reporting_to_step_functions(
        lambda: approval_timed_out(args.release, holder=args.holder, ledger_url=args.ledger_url, state_dir=args.state_dir)))
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
    if args.json:
        print_json({"ok": True, "release_id": release_id_for(config), "config_hash": config.config_hash(),
                    "config": config.model_dump(mode="json")})
        return 0
    print(f"{args.config} is valid: release {release_id_for(config)}, config hash {config.config_hash()}")
    print_fields(config.model_dump(mode="json"))
    return 0


ENDPOINT_COLUMNS = ["endpoint", "status", "components (copies in rotation / spec)", "url"]


def cmd_endpoints_list(args) -> int:
    """Every local endpoint under the state dir; a state dir without endpoints is an empty table (and a note on
    stderr), and is left as it is: listing creates nothing."""
    from tasks.backends.registry import local_endpoints

    state_dir = Path(args.state_dir).expanduser().resolve()
    if not (state_dir / "endpoints").is_dir():
        print_json([]) if args.json else print_table([], ENDPOINT_COLUMNS)
        why = "does not exist" if not state_dir.exists() else "holds no endpoints folder"
        print(f"shiplift: no local endpoints: the state dir {state_dir} {why} (pass --state-dir naming another)",
              file=sys.stderr)
        return 0
    endpoints = local_endpoints(state_dir).list_endpoints()
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
    print_table(rows, ENDPOINT_COLUMNS)
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
    """The ledger a `ledger` command reads (or, not `read_only`, writes): --ledger-url, else the --config's
    ledger_url, else $SHIPLIFT_LEDGER_URL, else SQLite under --state-dir. Closed when the command ends."""
    from tasks.backends.registry import open_ledger

    ledger = open_ledger(ledger_url=ledger_url_of(args), state_dir=args.state_dir, read_only=read_only)
    _OPEN_LEDGERS.append(ledger)
    return ledger


def ledger_url_of(args) -> str | None:
    """The ledger URL a `ledger` command names: --ledger-url, else the --config's ledger_url (None: the default)."""
    config = checkpoints_config(args)
    return args.ledger_url or (config.backend.ledger_url if config is not None else None)


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
    SQLite --ledger-url); None for an aws --config, whose backend names its store."""
    from tasks.pipeline.audit import checkpoint_folder

    config = checkpoints_config(args)
    if config is not None and config.backend.kind != "local":
        return None
    return checkpoint_folder(args.state_dir, ledger_url=ledger_url_of(args), config=config)[0]


def verifying_key(args):
    """The public key a command checks with: --public-key's PEM file (no private key is read), else None (the
    --config's or --key's)."""
    from tasks.pipeline.audit import public_key_refused_for_aws
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
    if detail["approval"]:
        print()
        print_table(detail["approval"], ["at", "event", "by", "reason", "deadline", "report_sha256"], shrink=("reason",))
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
    from tasks.ledger.checkpoints import verdict_lines

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
    if args.json:
        print_json(signed.to_dict())
    else:
        print(f"signed the ledger's head: checkpoint seq {signed.seq} by key {signed.key_id}")
        print_fields(signed.to_dict())
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


DIFF_COLUMNS = ["", "field", "A", "B", "B − A"]


def diff_cell(value) -> str | None:
    """One side of a diff row: a gate check as `status: observed [lo, hi] rule`, numbers rounded (`cell`)."""
    if isinstance(value, dict) and "status" in value and "observed" in value:
        ci = value.get("ci")
        interval = f" [{number(ci[0])}, {number(ci[1])}]" if ci else ""
        rule = f" {value.get('comparator') or ''} {number(value['threshold'])}" if value.get("threshold") is not None else ""
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
    from tasks.ledger.views import diff

    result = diff(ledger_for(args), args.release_a, args.release_b)
    print_json(result) if args.json else print_diff(result, every_field=args.all)
    return 0


def print_as_of(served: dict) -> None:
    from tasks.ledger.views import field_rows

    promotion = served["promotion"]
    how = {"rollback": f"a rollback from {promotion['rollback_from']}: {promotion['reason']}",
           "promote": f"a promotion ({promotion['strategy']}): {promotion['reason']}"}.get(
        promotion["trigger"], f"its own release ({promotion['strategy']})")
    print(f"{served['model']} at {served['as_of']}: {served['release_id']}, serving since {served['since']}, put there by "
          f"{how}; actor {promotion['actor']} (ledger seq {served['record']['seq']})")
    print_table(served["serving"], ["release_id", "copies", "share", "since"])  # every release serving then: two mid-rollout
    print_table(field_rows(served["built_from"], "built from"), ["built from", "value"])
    if served["evidence"]:
        print_gate(served["evidence"])


def moment(text: str) -> datetime:
    """A command's TIME: `now` (this moment, UTC) or ISO 8601 with a timezone; BadInput naming the fix otherwise."""
    fix = "pass ISO 8601 with a timezone, e.g. 2026-11-29T12:00:00Z or 2026-11-29T13:00:00+01:00, or now"
    if text.strip().lower() == "now":
        return datetime.now(timezone.utc)
    try:
        when = datetime.fromisoformat(text)
    except ValueError as error:
        raise BadInput(f"time {text!r} is not ISO 8601: {error}", fix=fix) from error
    if when.tzinfo is None:
        raise BadInput(f"time {text} has no timezone, so the moment is ambiguous", fix=fix)
    return when


def cmd_ledger_as_of(args) -> int:
    """What served a model at a moment, since when, built from what and on which gate evidence."""
    from tasks.ledger.views import as_of

    when = moment(args.when)  # refuses a time without a timezone, naming the fix, before the ledger is opened
    shown = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if args.when.strip().lower() == "now" else args.when
    served = as_of(ledger_for(args), args.model, shown)
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
    from tasks.pipeline.audit import verify_ledger

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

    open_ledger(ledger_url=args.ledger_url, state_dir=args.state_dir, read_only=True).close()  # refuses a ledger that is not there
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


STATUS_COLUMNS = ["model", "serving", "since", "gate", "accuracy", "macro-F1", "ECE", "p95 ms", "cost/h", "last release",
                  "outcome", "in progress"]


def status_cells(row: dict) -> dict:
    """One model's `status` row as table cells (numbers rounded; what is not there, '-')."""
    serving = row["serving"] or {}
    metrics = serving.get("metrics") or {}
    last = row["last_release"]
    since = serving.get("since")
    waiting = {request["release_id"] for request in row["awaiting_approval"]}
    return {"model": row["model"], "serving": serving.get("release_id") or "(nothing)",
            "since": f"{since[:19]}Z" if since else None, "gate": serving.get("decision"),
            "accuracy": cell(metrics.get("accuracy")), "macro-F1": cell(metrics.get("macro_f1")),
            "ECE": cell(metrics.get("ece")), "p95 ms": cell(metrics.get("p95_ms")),
            "cost/h": cell(serving.get("cost_per_hour")),
            "last release": last["release_id"], "outcome": last["status"],
            "in progress": ", ".join(f"{release} (awaiting approval)" if release in waiting else release
                                     for release in row["in_progress"]) or None}


def cmd_status(args) -> int:
    """What serves now per model, its gate evidence, the last release and its outcome, and the releases in progress:
    read from the ledger, changing nothing. No ledger yet is an empty table and a note on stderr."""
    from tasks.ledger.views import serving_status

    try:
        ledger = ledger_for(args)
    except BadInput as exc:  # no ledger file: nothing was released with this state dir
        print_json([]) if args.json else print_table([], STATUS_COLUMNS)
        print(f"shiplift: nothing released yet: {exc}", file=sys.stderr)
        return 0
    rows = serving_status(ledger, args.model)
    if args.model and not rows:
        raise NotFound(f"the ledger has no releases of model {args.model!r}", fix="run `shiplift status` for every model")
    if args.json:
        print_json(rows)
        return 0
    print_table([status_cells(row) for row in rows], STATUS_COLUMNS, shrink=("serving", "last release", "in progress"))
    for request in (request for row in rows for request in row["awaiting_approval"]):
        print(f"\n{request['release_id']} awaits approval by one of {', '.join(request['approvers'])} until "
              f"{request['deadline'][:19]}Z (gate {request['gate']['decision']}, report {request['gate']['report_html']}): "
              f"`shiplift approve {request['release_id']} --reason TEXT` or `shiplift reject …`")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from tasks.families.registry import families

    parser = argparse.ArgumentParser(prog="shiplift", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}", help="print shiplift's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def with_state_dir(p):
        p.add_argument("--state-dir", default=str(default_state_dir()), help="local backend state (default: $SHIPLIFT_HOME or .shiplift)")
        return p

    def with_config(p, what: str = "a release config (YAML)"):
        p.add_argument("config", help=what)
        return p

    def with_config_state_dir(p):
        p.add_argument("--state-dir", help="the local backend's state dir (and the SQLite ledger's folder): overrides the "
                                           "config's backend.state_dir, as --set backend.state_dir=DIR does")
        return p

    p = with_config_state_dir(with_set(with_config(sub.add_parser("release", help="run or resume a release from a config"))))
    p.add_argument("--keep-candidate", action="store_true", help="do not tear the candidate endpoint down")
    p.add_argument("--dry-run", action="store_true",
                   help="aws configs: print every request the release would send (JSON lines), validated, and send nothing")
    p.add_argument("--with-champion", action="store_true",
                   help="with --dry-run: plan a later release, whose gate scores the serving champion and whose promote "
                        "updates production (showing how the update fits the endpoint)")
    with_json(p, "the release's summary")
    p.set_defaults(func=cmd_release)

    for verb, what in (("approve", "approve a release awaiting approval, then let it promote"),
                       ("reject", "reject a release awaiting approval; it ends rejected and the champion keeps serving")):
        p = with_ledger(with_state_dir(sub.add_parser(verb, help=f"{what} (as $SHIPLIFT_ACTOR, else user@host)")))
        p.add_argument("release", help="the release's id (`shiplift status` lists those awaiting approval)")
        p.add_argument("--reason", required=True, help="what you checked and why you decided so, for the ledger")
        with_json(p, "the decision and the release's summary")
        p.set_defaults(func=cmd_decide)

    p = with_ledger(with_state_dir(sub.add_parser(
        "rollback", help="put an earlier promoted release of a model back on production (its own rollout strategy), "
                         "verify what serves and record why")))
    p.add_argument("model", help="the model's name (the config's `name`)")
    p.add_argument("--to", required=True, metavar="RELEASE", help="the release to serve again (a promoted one)")
    p.add_argument("--reason", required=True, help="why, for the ledger")
    p.add_argument("--expect-current", metavar="RELEASE", help="refuse unless the ledger says this release serves now")
    p.add_argument("--actor", help="who rolls back (default: $SHIPLIFT_ACTOR, else user@host)")
    with_json(p, "the rollback's result")
    p.set_defaults(func=cmd_rollback)

    p = with_set(with_config(sub.add_parser(
        "iam", help="least-privilege IAM policies for an aws config (pipeline, SageMaker execution, CodeBuild roles)"),
        "an aws release config"))
    p.add_argument("--out", help="write the policy documents into this folder")
    p.add_argument("--json", action="store_true", help="print the documents as one JSON object")
    p.set_defaults(func=cmd_iam)

    p = with_set(with_config(sub.add_parser(
        "cleanup", help="list or delete the AWS resources shiplift created under a prefix (and only those)"),
        "an aws release config (region, account, credentials chain)"))
    p.add_argument("--prefix", help="resource name prefix (default: the config's resource_prefix)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--list", action="store_true", help="list what would be deleted")
    which.add_argument("--delete-all", action="store_true", help="delete it all, in dependency order, waiting for each")
    with_json(p, "the resources --list finds")
    p.set_defaults(func=cmd_cleanup)

    p = with_ledger(with_state_dir(sub.add_parser(
        "stage", help="run one stage of an existing release from the ledger (a stage that already succeeded returns its result)")))
    p.add_argument("name", choices=STAGE_NAMES, help="the stage to run")
    p.add_argument("--release", required=True, help="the release's id (as `shiplift ledger history` lists it)")
    p.add_argument("--result-uri", help="also write the result to s3://BUCKET/KEY (how Step Functions reads the gate decision)")
    p.add_argument("--holder", help="the orchestrated run holding the model's lease: renewed while the stage runs, "
                                    "required by promote")
    with_json(p, "the stage's result")
    p.set_defaults(func=cmd_stage)

    orchestrate = sub.add_parser("orchestrate", help="first and last step of an orchestrated (Airflow / Step Functions) run"
                                 ).add_subparsers(dest="orchestrate_command", required=True, metavar="STEP")
    p = with_config_state_dir(with_set(with_config(orchestrate.add_parser(
        "begin", help="open the release and take the model's promotion lease (prints JSON)"))))
    p.add_argument("--holder", required=True, help="who holds the lease, e.g. the execution ARN")
    p.add_argument("--allowed-timeouts", metavar="STEP=SECONDS,...",
                   help="the orchestrator's timeout per step: a config whose deadlines need longer is refused")
    p.add_argument("--waits-for-approval", action="store_true",
                   help="this orchestrator waits for a person (the state machine has AwaitApproval): accept a config "
                        "that requires an approval")
    p.set_defaults(func=cmd_orchestrate_begin)
    p = with_ledger(with_state_dir(orchestrate.add_parser(
        "await-approval", help="Step Functions AwaitApproval: record the approval request and leave the task token open")))
    p.add_argument("--release", required=True, help="the release's id")
    p.add_argument("--holder", required=True, help="the execution holding the model's lease")
    p.add_argument("--token-prefix", required=True, help="s3://BUCKET/PREFIX where the task keeps its token for the approver")
    p.set_defaults(func=cmd_orchestrate_await_approval)
    p = with_ledger(with_state_dir(orchestrate.add_parser(
        "approval-timed-out", help="Step Functions ApprovalTimedOut: record the timeout and take the lease back (prints JSON)")))
    p.add_argument("--release", required=True, help="the release's id")
    p.add_argument("--holder", required=True, help="the execution holding the model's lease")
    p.set_defaults(func=cmd_orchestrate_approval_timed_out)
    p = with_ledger(with_state_dir(orchestrate.add_parser("end", help="record the final status and give the lease back "
                                                                      "(prints JSON)")))
    p.add_argument("--release", required=True, help="the release's id, as `orchestrate begin` printed it")
    p.add_argument("--holder", required=True, help="the holder `orchestrate begin` took the lease for")
    p.add_argument("--failed", action="store_true", help="an earlier step failed")
    p.set_defaults(func=cmd_orchestrate_end)

    sfn = sub.add_parser("sfn", help="the release as an AWS Step Functions state machine").add_subparsers(
        dest="sfn_command", required=True, metavar="ACTION")
    for name, func, help_text in (("render", cmd_sfn_render, "write the state machine definition (ASL JSON)"),
                                  ("deploy", cmd_sfn_deploy, "create or update the state machine (idempotent; prints JSON)")):
        p = with_set(with_config(sfn.add_parser(name, help=help_text), "an aws release config"))
        p.add_argument("--runner", required=True, help="runner settings YAML (see configs/stepfunctions/runner-example.yaml)")
        if name == "render":
            p.add_argument("--out", help="write to this file instead of stdout")
        else:
            p.add_argument("--role-arn", required=True, help="the IAM role the state machine runs as")
        p.set_defaults(func=func)

    p = with_json(with_set(with_config(sub.add_parser(
        "policy", help="the retries and timeouts every orchestrator applies to each step of a config"))), "the policy")
    p.set_defaults(func=cmd_policy)

    config = sub.add_parser("config", help="configuration tools").add_subparsers(dest="config_command", required=True,
                                                                                 metavar="ACTION")
    p = with_json(with_set(with_config(config.add_parser(
        "validate", help="validate a release config and print the effective values"))),
        "ok, the release id, the config hash and the effective config")
    p.set_defaults(func=cmd_config_validate)

    serve = sub.add_parser("serve", help="run a serving image's server locally").add_subparsers(
        dest="serve_command", required=True, metavar="SERVER")
    evaluate = sub.add_parser("eval", help="evaluate an endpoint").add_subparsers(dest="eval_command", required=True,
                                                                                  metavar="DATASET")
    for family in families():  # each model family adds its server and its evaluation
        family.add_commands(serve, evaluate)

    p = with_ledger(sub.add_parser("status", help="what serves now per model (release, since when, gate decision and "
                                                  "metrics), the last release and its outcome, releases in progress"))
    p.add_argument("model", nargs="?", help="one model (default: every model in the ledger)")
    p.add_argument("--state-dir", help="local backend state holding the ledger (default: $SHIPLIFT_HOME or .shiplift)")
    with_json(p, "every model's status")
    p.set_defaults(func=cmd_status)

    endpoints = sub.add_parser("endpoints", help="local endpoints").add_subparsers(dest="endpoints_command", required=True,
                                                                                   metavar="ACTION")
    p = with_json(with_state_dir(endpoints.add_parser("list", help="list local endpoints, their health and components")),
                  "the endpoints")
    p.set_defaults(func=cmd_endpoints_list)
    for verb, func, help_text in (("stop", cmd_endpoints_stop, "stop local endpoints"),
                                  ("heal", cmd_endpoints_heal, "restart local endpoints' dead routers and copies")):
        p = with_state_dir(endpoints.add_parser(verb, help=help_text))
        p.add_argument("names", nargs="*", help="the endpoints to " + verb)
        p.add_argument("--all", action="store_true", help=f"{verb} every local endpoint under --state-dir")
        p.set_defaults(func=func)

    ledger = sub.add_parser("ledger", help="the release ledger").add_subparsers(dest="ledger_command", required=True,
                                                                                metavar="ACTION")

    def ledger_parser(name: str, help_text: str, aliases: tuple[str, ...] = ()):
        p = with_ledger(with_state_dir(ledger.add_parser(name, help=help_text, aliases=list(aliases))))
        p.set_defaults(state_dir=None)  # not given: the checkpoint log is looked for (beside a SQLite --ledger-url) and not presumed
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

    def with_release(p, name: str = "release", what: str = "a release id (as `shiplift ledger history` lists it)"):
        p.add_argument(name, help=what)
        return p

    p = ledger_parser("history", "one row per release (of MODEL, or of every model); --records for every record")
    p.add_argument("model", nargs="?", help="one model (default: every model)")
    p.add_argument("--records", action="store_true", help="every ledger record instead of one row per release")
    with_json(p, "the rows")
    p.set_defaults(func=cmd_ledger_history)
    p = with_json(with_release(ledger_parser("show", "one release: built from what, gate evidence, stages, promotions")),
                  "the release in full")
    p.set_defaults(func=cmd_ledger_show)
    p = ledger_parser("timeline", "a model's releases, gate decisions, traffic steps, promotions and rollbacks in order")
    p.add_argument("model", help="the model's name")
    with_json(p, "the events")
    p.set_defaults(func=cmd_ledger_timeline)
    p = ledger_parser("verify", "check the hash chain and that it extends every signed checkpoint")
    p.add_argument("--expect-head", help="a head hash recorded earlier (detects deleted newest records)")
    with_json(p, "the verification")
    with_witness(with_checkpoints(p))
    p.set_defaults(func=cmd_ledger_verify)
    p = ledger_parser("checkpoint", "verify the ledger, then sign its head with the checkpoint key (kept outside the state dir)")
    with_checkpoints(p, created=True)
    with_json(p, "the signed checkpoint")
    p.set_defaults(func=cmd_ledger_checkpoint)
    p = with_release(ledger_parser("prove", "an inclusion proof of one release's records in the latest signed checkpoint"))
    with_checkpoints(p)
    p.add_argument("--out", help="write the proof to this file (default: print it)")
    p.set_defaults(func=cmd_ledger_prove)
    p = ledger_parser("check-proof", "check an inclusion proof with the key alone (no ledger)")
    p.add_argument("proof", help="the proof file `shiplift ledger prove --out` wrote")
    with_checkpoints(p)
    p.set_defaults(func=cmd_ledger_check_proof)
    p = ledger_parser("public-key", "export the public key that verifies the checkpoints (PEM), for verify and check-proof")
    with_checkpoints(p)
    p.add_argument("--out", help="write the PEM to this file (default: print it)")
    p.set_defaults(func=cmd_ledger_public_key)
    p = ledger_parser("diff", "two releases side by side: the fields that differ (config, artifact, image digest, "
                              "placement, gate metrics and checks, thresholds), with B − A for numbers")
    with_release(p, "release_a", "release A (the left column)")
    with_release(p, "release_b", "release B (the right column; deltas are B − A)")
    p.add_argument("--all", action="store_true", help="every field, also those that are the same")
    with_json(p, "every field, unrounded, with its delta")
    p.set_defaults(func=cmd_ledger_diff)
    p = ledger_parser("as-of", "what served a model at a time (ISO 8601 with timezone, or now), since when, on what evidence",
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
    p = ledger_parser("upgrade", "migrate the ledger's schema to this shiplift's revision (Alembic; refuses a newer one)")
    p.set_defaults(func=cmd_ledger_upgrade)
    p = ledger_parser("export", "export the ledger's records and its verification (JSON or CSV)")
    p.add_argument("--format", choices=["json", "csv"], default="json", help="json or csv (for people: `ledger report`, HTML)")
    p.add_argument("--out", required=True, help="the file to write, or - for stdout")
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
    finally:
        while _OPEN_LEDGERS:
            _OPEN_LEDGERS.pop().close()


if __name__ == "__main__":
    sys.exit(main())
