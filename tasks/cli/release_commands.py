"""The release commands: `release` (and its --dry-run plan), `approve` / `reject`, `rollback`, `iam`, `cleanup`
and `stage`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shiplift.tasks.cli.arguments import (
    overrides_of,
    with_config,
    with_config_state_dir,
    with_json,
    with_ledger,
    with_release,
    with_set,
    with_state_dir,
)
from shiplift.tasks.console import EXIT_AWAITING, EXIT_REJECTED, print_fields, print_json, print_table
from shiplift.tasks.errors import BadInput, ConfigError
from shiplift.tasks.ledger.events import AWAITING_APPROVAL, PROMOTED
from shiplift.tasks.pipeline.table import STAGE_NAMES

# what --fresh-champion does to a gate, wherever a release is run (`run_release(fresh_champion=True)`)
FRESH_CHAMPION = ("scores the champion on every task, reusing none of the per-task results earlier gates recorded of "
                  "it (docs/reports.md, \"One evaluation per gate\")")


def aws_config(args, what: str):
    """The aws release config a command needs; BadInput naming the backend otherwise."""
    from shiplift.tasks.config import load_release_config

    config = load_release_config(args.config, overrides=overrides_of(args))
    if config.backend.kind != "aws":
        raise BadInput(f"{args.config} uses the {config.backend.kind} backend; {what} is about AWS, which that "
                       "backend never calls",
                       fix="pass an aws release config (backend.kind: aws), e.g. configs/releases/qwen35-4b-semif.yaml")
    return config


def cmd_release(args) -> int:
    if args.dry_run:
        return release_dry_run(args)
    if args.with_champion:
        raise ConfigError("--with-champion plans a later release and only goes with --dry-run",
                          fix=f"run `shiplift release {args.config} --dry-run --with-champion`, or leave "
                              "--with-champion out")
    from shiplift.tasks.cli.gate_commands import warn_if_underpowered
    from shiplift.tasks.config import load_release_config, require_named_files
    from shiplift.tasks.pipeline.release import run_release

    config = load_release_config(args.config, overrides=overrides_of(args))
    require_named_files(config, args.config)  # before the power warning, which a missing dataset would garble
    warn_if_underpowered(config, args.config)
    summary = run_release(args.config, overrides=overrides_of(args), keep_candidate=args.keep_candidate or None,
                          fresh_champion=args.fresh_champion)
    print_json(summary) if args.json else print_summary(summary)
    return release_exit(summary)


def release_exit(summary: dict) -> int:
    """0 promoted, EXIT_AWAITING while it waits for an approver, else EXIT_REJECTED."""
    status = summary["status"]
    return 0 if status == PROMOTED else EXIT_AWAITING if status == AWAITING_APPROVAL else EXIT_REJECTED


def cmd_decide(args) -> int:
    """An approver's decision on a release awaiting approval, recorded with the reason; the release then continues
    (promote after an approval, ends rejected after a rejection)."""
    from shiplift.tasks.orchestrators.approvals import answer_approval

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

    from shiplift.tasks.backends.pricing import dry_run_cost_lines
    from shiplift.tasks.cli.gate_commands import power_lines
    from shiplift.tasks.orchestrators.dry_run import champion_line, plan_release, update_fit

    config = aws_config(args, "--dry-run")
    requests = plan_release(config, config_path=Path(args.config), with_champion=args.with_champion,
                            fresh_champion=args.fresh_champion)
    for request in requests:
        print(json.dumps(request.to_json(), ensure_ascii=False))
    services = Counter(r.service for r in requests)
    with_placeholders = sum(1 for r in requests if r.placeholders)
    print(f"dry run: {len(requests)} requests ({', '.join(f'{n} {s}' for s, n in sorted(services.items()))}), each "
          f"valid for the installed botocore service model; {with_placeholders} carry placeholders (listed per "
          "request); nothing was sent",
          file=sys.stderr)
    champion = champion_line(requests, config)
    for line in [*dry_run_cost_lines(config), *power_lines(config, Path(args.config).parent),
                 *([champion] if champion else [])]:
        print(line, file=sys.stderr)
    print(f"{'this' if args.with_champion else 'the next'} release's update of production: {update_fit(config)}",
          file=sys.stderr)
    return 0


def cmd_rollback(args) -> int:
    """Put an earlier promoted release back on production with its own rollout strategy (under the policy table's
    `rollback` step), then show what serves."""
    from shiplift.tasks.pipeline import table
    from shiplift.tasks.pipeline.promotion import rollback
    from shiplift.tasks.pipeline.release import default_actor, print_progress

    result = table.attempts(table.ROLLBACK.name, lambda: rollback(
        args.state_dir, args.model, args.to, reason=args.reason, actor=args.actor or default_actor(),
        expect_current=args.expect_current, ledger_url=args.ledger_url), timeout_s=table.ROLLBACK.timeout_s,
        say=print_progress)
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
    from shiplift.tasks.backends.aws.iam import policies

    documents = policies(aws_config(args, "`shiplift iam`"))
    if args.out:
        from shiplift.tasks.atomic import write_text_atomic

        for name, document in documents.items():
            write_text_atomic(Path(args.out) / name, json.dumps(document, indent=2) + "\n")
            print(f"wrote {Path(args.out) / name}")
    elif args.json:
        print_json(documents)
    else:
        rows = [{"document": name, "sid": s.get("Sid", ""),
                 "actions": len(s["Action"]) if isinstance(s["Action"], list) else 1,
                 "resources": (", ".join(s.get("Resource", [])) if isinstance(s.get("Resource"), list)
                               else s.get("Resource", ""))}
                for name, document in documents.items() for s in document["Statement"] if "Resource" in s]
        print_table(rows, ["document", "sid", "actions", "resources"])
    return 0


def cmd_cleanup(args) -> int:
    """List, or delete, what shiplift created under a prefix (named with it and carrying shiplift's tag)."""
    from shiplift.tasks.backends.registry import make_backends

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
            print_table([{"kind": r.kind, "name": r.name, "release": r.tags.get("shiplift:release", "")}
                         for r in found],
                        ["kind", "name", "release"])
            print(f"{len(found)} resources named {prefix}* and tagged shiplift:managed=true", file=sys.stderr)
        return 0
    for resource in found:
        hosting.delete_resource(resource, progress=lambda message: print(message, file=sys.stderr, flush=True))
    print(f"deleted {len(found)} resources named {prefix}* and tagged shiplift:managed=true", file=sys.stderr)
    return 0


def cmd_stage(args) -> int:
    """One stage (inside a Step Functions task, its outcome is also reported with the task token)."""
    from shiplift.tasks.orchestrators.task_token import reporting_to_step_functions
    from shiplift.tasks.pipeline.release import run_orchestrated_stage

    def run() -> dict:
        result = run_orchestrated_stage(args.release, args.name, holder=args.holder, ledger_url=args.ledger_url,
                                        state_dir=args.state_dir)
        if args.result_uri:
            from shiplift.tasks.orchestrators.step_functions import publish_stage_result

            publish_stage_result(args.result_uri, release_id=args.release, stage=args.name, result=result)
        return result

    result = reporting_to_step_functions(run)
    if args.json:
        print_json(result)
    else:
        print(f"{args.release} {args.name}: {result.get('event', 'succeeded')}")
        print_fields(result)
    return 0


def add_release_commands(sub) -> None:
    """Add `release`, `approve`, `reject`, `rollback`, `iam`, `cleanup` and `stage`."""
    p = with_config_state_dir(with_set(with_config(sub.add_parser(
        "release", help="run or resume a release from a config"))))
    p.add_argument("--keep-candidate", action="store_true", help="do not tear the candidate endpoint down")
    p.add_argument("--dry-run", action="store_true",
                   help="aws configs: print every request the release would send (JSON lines), validated, "
                        "and send nothing")
    p.add_argument("--with-champion", action="store_true",
                   help="with --dry-run: plan a later release, whose gate scores the serving champion and whose "
                        "promote updates production (showing how the update fits the endpoint)")
    p.add_argument("--fresh-champion", action="store_true",
                   help=f"the gate {FRESH_CHAMPION}; with --dry-run --with-champion, the plan sends the champion one "
                        "request per task")
    with_json(p, "the release's summary")
    p.set_defaults(func=cmd_release)

    for verb, what in (("approve", "approve a release awaiting approval, then let it promote"),
                       ("reject",
                        "reject a release awaiting approval; it ends rejected and the champion keeps serving")):
        p = with_ledger(with_state_dir(sub.add_parser(verb, help=f"{what} (as $SHIPLIFT_ACTOR, else user@host)")))
        with_release(p, what="the release (`shiplift status` lists those awaiting approval)")
        p.add_argument("--reason", required=True, help="what you checked and why you decided so, for the ledger")
        with_json(p, "the decision and the release's summary")
        p.set_defaults(func=cmd_decide)

    p = with_ledger(with_state_dir(sub.add_parser(
        "rollback", help="put an earlier promoted release of a model back on production (its own rollout strategy), "
                         "verify what serves and record why")))
    p.add_argument("model", help="the model's name (the config's `name`)")
    with_release(p, "--to", dest="to", what="the release to serve again (a promoted one)", required=True,
                 metavar="RELEASE")
    p.add_argument("--reason", required=True, help="why, for the ledger")
    with_release(p, "--expect-current", dest="expect_current",
                 what="refuse unless the ledger says this release serves now", metavar="RELEASE")
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
        "stage",
        help="run one stage of an existing release from the ledger "
             "(a stage that already succeeded returns its result)")))
    p.add_argument("name", choices=STAGE_NAMES, help="the stage to run")
    with_release(p, "--release", required=True)
    p.add_argument("--result-uri",
                   help="also write the result to s3://BUCKET/KEY (how Step Functions reads the gate decision)")
    p.add_argument("--holder", help="the orchestrated run holding the model's lease: renewed while the stage runs, "
                                    "required by promote")
    with_json(p, "the stage's result")
    p.set_defaults(func=cmd_stage)
