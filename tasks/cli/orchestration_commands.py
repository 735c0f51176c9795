"""The steps an orchestrator runs (`orchestrate begin / await-approval / approval-timed-out / end`) and the Step
Functions state machine (`sfn render / deploy`)."""

from __future__ import annotations

import sys
from pathlib import Path

from shiplift.tasks.cli.arguments import (
    overrides_of,
    with_config,
    with_config_state_dir,
    with_ledger,
    with_release,
    with_set,
    with_state_dir,
)
from shiplift.tasks.console import print_json
from shiplift.tasks.errors import BadInput


def parse_allowed_timeouts(text: str | None) -> dict[str, int] | None:
    """`begin=300,resolve=1800,…` as {step: seconds}; BadInput names a malformed entry or an unknown step."""
    from shiplift.tasks.pipeline.table import STEPS

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
    from shiplift.tasks.orchestrators.task_token import reporting_to_step_functions
    from shiplift.tasks.pipeline.release import begin_orchestrated

    allowed = parse_allowed_timeouts(args.allowed_timeouts)
    print_json(reporting_to_step_functions(
        lambda: begin_orchestrated(args.config, holder=args.holder, allowed_timeouts=allowed,
                                   overrides=overrides_of(args), waits_for_approval=args.waits_for_approval)))
    return 0


def cmd_orchestrate_await_approval(args) -> int:
    """Step Functions' AwaitApproval: record the approval request with the task token's reference and exit; the state
    waits on the token for `shiplift approve` / `reject` (the step reports only a failure, or a decision
    already made)."""
    from shiplift.tasks.orchestrators.task_token import await_approval

    print_json(await_approval(args.release, holder=args.holder, token_prefix=args.token_prefix,
                              ledger_url=args.ledger_url, state_dir=args.state_dir))
    return 0


def cmd_orchestrate_approval_timed_out(args) -> int:
    """Step Functions' ApprovalTimedOut: record the timeout (unless decided) and take the lease back for Promote."""
    from shiplift.tasks.orchestrators.task_token import approval_timed_out, reporting_to_step_functions

    print_json(reporting_to_step_functions(
        lambda: approval_timed_out(args.release, holder=args.holder, ledger_url=args.ledger_url,
                                   state_dir=args.state_dir)))
    return 0


def cmd_orchestrate_end(args) -> int:
    """Exit 0 whenever the final status was recorded, including rejected and --failed runs."""
    from shiplift.tasks.orchestrators.task_token import reporting_to_step_functions
    from shiplift.tasks.pipeline.release import end_orchestrated

    print_json(reporting_to_step_functions(
        lambda: end_orchestrated(args.release, holder=args.holder, failed=args.failed, ledger_url=args.ledger_url,
                                 state_dir=args.state_dir)))
    return 0


def sfn_inputs(args):
    """The config as the pipeline image sees it (path relative to the repository root) and the runner settings."""
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.orchestrators.step_functions import load_runner_settings

    config_file = Path(args.config).resolve()
    from shiplift.tasks.project import PROJECT_ROOT as root

    if not config_file.is_relative_to(root):
        raise BadInput(f"{args.config} is outside the repository {root}",
                       fix="Step Functions tasks read configs from the pipeline image: keep it under configs/")
    config = load_release_config(config_file, overrides=tuple(args.set))
    return config, str(config_file.relative_to(root)), load_runner_settings(args.runner)


def cmd_sfn_render(args) -> int:
    from shiplift.tasks.orchestrators.step_functions import definition_json, render_state_machine

    config, config_path, runner = sfn_inputs(args)
    text = definition_json(render_state_machine(config, runner=runner, config_path=config_path))
    if args.out:
        from shiplift.tasks.atomic import write_text_atomic

        write_text_atomic(args.out, text + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)
    return 0


def cmd_sfn_deploy(args) -> int:
    from shiplift.tasks.orchestrators.step_functions import deploy_state_machine, render_state_machine

    config, config_path, runner = sfn_inputs(args)
    definition = render_state_machine(config, runner=runner, config_path=config_path)
    print_json(deploy_state_machine(config, definition, role_arn=args.role_arn))
    return 0


def add_orchestration_commands(sub) -> None:
    """Add the `orchestrate` and `sfn` groups."""
    group = sub.add_parser("orchestrate", help="first and last step of an orchestrated (Airflow / Step Functions) run")
    orchestrate = group.add_subparsers(dest="orchestrate_command", required=True, metavar="STEP")
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
        "await-approval",
        help="Step Functions AwaitApproval: record the approval request and leave the task token open")))
    with_release(p, "--release", required=True)
    p.add_argument("--holder", required=True, help="the execution holding the model's lease")
    p.add_argument("--token-prefix", required=True,
                   help="s3://BUCKET/PREFIX where the task keeps its token for the approver")
    p.set_defaults(func=cmd_orchestrate_await_approval)
    p = with_ledger(with_state_dir(orchestrate.add_parser(
        "approval-timed-out",
        help="Step Functions ApprovalTimedOut: record the timeout and take the lease back (prints JSON)")))
    with_release(p, "--release", required=True)
    p.add_argument("--holder", required=True, help="the execution holding the model's lease")
    p.set_defaults(func=cmd_orchestrate_approval_timed_out)
    p = with_ledger(with_state_dir(orchestrate.add_parser("end", help="record the final status and give the lease back "
                                                                      "(prints JSON)")))
    with_release(p, "--release", what="the release's id, as `orchestrate begin` printed it", required=True)
    p.add_argument("--holder", required=True, help="the holder `orchestrate begin` took the lease for")
    p.add_argument("--failed", action="store_true", help="an earlier step failed")
    p.set_defaults(func=cmd_orchestrate_end)

    sfn = sub.add_parser("sfn", help="the release as an AWS Step Functions state machine").add_subparsers(
        dest="sfn_command", required=True, metavar="ACTION")
    for name, func, help_text in (("render", cmd_sfn_render, "write the state machine definition (ASL JSON)"),
                                  ("deploy", cmd_sfn_deploy,
                                   "create or update the state machine (idempotent; prints JSON)")):
        p = with_set(with_config(sfn.add_parser(name, help=help_text), "an aws release config"))
        p.add_argument("--runner", required=True,
                       help="runner settings YAML (see configs/stepfunctions/runner-example.yaml)")
        if name == "render":
            p.add_argument("--out", help="write to this file instead of stdout")
        else:
            p.add_argument("--role-arn", required=True, help="the IAM role the state machine runs as")
        p.set_defaults(func=func)
