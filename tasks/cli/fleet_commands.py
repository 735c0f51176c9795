"""The `fleet` group: `fleet plan`, the layout, room and cost share of the models on one shared endpoint
(`tasks.pipeline.fleet`). Read-only: it opens the ledger, where there is one, only to read each model's last build."""

from __future__ import annotations

import sys

from tasks.cli.arguments import with_json, with_ledger, with_state_dir
from tasks.console import EXIT_BAD_INPUT, print_json, print_table

PLAN_COLUMNS = ["model", "copies", "peak while it updates", "memory/copy MB", "share", "$/h"]


def cmd_fleet_plan(args) -> int:
    """Print the fleet's plan; exit 2, with the arithmetic of each problem, when it does not fit."""
    from tasks.backends.registry import open_ledger
    from tasks.errors import BadInput
    from tasks.pipeline.fleet import plan_fleet

    try:
        ledger = open_ledger(ledger_url=args.ledger_url, state_dir=args.state_dir, read_only=True)
    except BadInput:
        ledger = None  # no ledger yet: no model built, memory per copy unknown
    try:
        plan = plan_fleet(args.configs, ledger=ledger)
    finally:
        if ledger is not None:
            ledger.close()
    if args.json:
        print_json(plan.as_dict())
    else:
        described = plan.as_dict()
        print(f"{plan.endpoint}: {plan.slots.describe(plan.instances)}"
              + (f", up to {plan.slots.describe(plan.most)} with managed scaling" if plan.most > plan.instances else "")
              + f"; {plan.bill.describe()}")
        print_table(plan.rows(), PLAN_COLUMNS)
        idle = described["idle_usd_per_hour"]
        print(f"\n{plan.steady} copies serve; room left while the largest update runs: {plan.headroom} "
              f"{plan.slots.unit}(s)" + (f"; idle room costs ≈ {idle:.2f} $/h" if idle is not None else ""))
    for problem in plan.problems:
        print(f"shiplift: the fleet does not fit: {problem}", file=sys.stderr)
    return EXIT_BAD_INPUT if plan.problems else 0


def add_fleet_commands(sub) -> None:
    """Add the `fleet` group."""
    fleet = sub.add_parser("fleet", help="models that share one production endpoint").add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION")
    p = with_json(with_ledger(with_state_dir(fleet.add_parser(
        "plan", help="the layout, the room every model's copies and updates take, and each model's share of the bill"))),
        "the plan")
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="the release config of every model on the shared endpoint")
    p.set_defaults(func=cmd_fleet_plan)
