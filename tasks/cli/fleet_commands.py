"""The `fleet` group: `fleet plan`, the layout, room and cost share of the models on one shared endpoint
(`tasks.pipeline.fleet`; read-only: it opens the configs' ledger, where there is one, only to read each model's last
build and what serves it, and asks the backend for the copies each serving component has now), and `fleet move`,
which moves every model onto a new layout's endpoint (`tasks.pipeline.fleet_move`). Both read the configs with the
same --set and --state-dir, so both see one ledger."""

from __future__ import annotations

import sys

from tasks.cli.arguments import overrides_of, with_config_state_dir, with_json, with_set
from tasks.console import EXIT_BAD_INPUT, print_json, print_table

PLAN_COLUMNS = ["model", "copies", "peak while it updates", "threads", "memory/copy MB", "share", "$/h", "serves on now"]
MOVE_COLUMNS = ["model", "outcome", "release", "from", "first answer s"]


def cmd_fleet_plan(args) -> int:
    """Print the fleet's plan; exit 2, with the arithmetic of each problem, when it does not fit."""
    from tasks.backends.registry import make_backends, open_ledger
    from tasks.config import load_release_config
    from tasks.errors import BadInput, NotReady
    from tasks.pipeline.fleet import plan_fleet

    overrides = overrides_of(args)
    config = load_release_config(args.configs[0], overrides=overrides)
    backend = config.backend  # the ledger a release of it writes, and the backend its endpoints are on
    try:
        ledger = open_ledger(ledger_url=backend.ledger_url, state_dir=backend.state_dir, read_only=True)
    except BadInput:
        ledger = None  # no ledger yet: no model built or serving, memory per copy unknown
    try:
        plan = plan_fleet(args.configs, ledger=ledger, open_hosting=lambda: make_backends(config, ledger=ledger).hosting,
                          overrides=overrides)  # the backend is asked only for the copies of a model serving now
    except NotReady as exc:  # the layout's arithmetic needs no ledger: plan without it, and say what is missing
        print(f"shiplift: planned without the ledger ({exc}): memory per copy and what serves each model are unknown",
              file=sys.stderr)
        plan = plan_fleet(args.configs, overrides=overrides)
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
        for tenant in plan.tenants:
            for difference in tenant.differs:
                print(f"{tenant.model}: {difference}")
        if not plan.idles_free:
            for tenant in plan.tenants:
                if tenant.share.scales_to_zero:
                    print(f"{tenant.model} scales to zero, but {', '.join(tenant.share.kept_on_by)} never do(es): "
                          "SageMaker stops the instances only when every model is at 0 copies, so its share is paid "
                          "while it idles too")
        if plan.moving:
            print(f"layout change: {', '.join(t.model for t in plan.moving)} serve(s) on another layout's endpoint; "
                  f"`shiplift fleet move` with these configs moves every model to {plan.endpoint}")
        if plan.kept:
            print(f"kept: {', '.join(plan.kept)} still serve(s) for callers of the old name (and cost(s) its bill); once "
                  "they have switched, `shiplift fleet move` with these configs and --retire-old deletes it")
    for problem in plan.problems:
        print(f"shiplift: the fleet does not fit: {problem}", file=sys.stderr)
    return EXIT_BAD_INPUT if plan.problems else 0


def cmd_fleet_move(args) -> int:
    """Move every model of the shared endpoint onto its new layout's endpoint, then show where each one went."""
    from tasks.pipeline import table
    from tasks.pipeline.fleet_move import move_fleet
    from tasks.pipeline.release import default_actor, print_progress

    result = table.attempts(table.FLEET_MOVE.name, lambda: move_fleet(
        args.configs, reason=args.reason, actor=args.actor or default_actor(), overrides=overrides_of(args),
        retire_old=args.retire_old, progress=print_progress), timeout_s=table.FLEET_MOVE.timeout_s, say=print_progress)
    if args.json:
        print_json(result)
        return 0
    print_table([{"model": m["model"], "outcome": m["outcome"], "release": m["release_id"], "from": m["from"],
                  "first answer s": m["first_answer_s"]} for m in result["models"]], MOVE_COLUMNS)
    print(f"\nevery model serves on {result['endpoint']}"
          + (f"; retired {', '.join(result['retired'])}" if result["retired"] else "")
          + (f"; kept {', '.join(result['kept'])} for callers that have not switched (once they have, the same "
             "command with --retire-old deletes it)" if result["kept"] else ""))
    return 0


def add_fleet_commands(sub) -> None:
    """Add the `fleet` group."""
    fleet = sub.add_parser("fleet", help="models that share one production endpoint").add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION")
    p = with_json(with_set(with_config_state_dir(fleet.add_parser(
        "plan", help="the layout, the room every model's copies and updates take, and each model's share of the bill"))),
        "the plan")
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="the release config of every model on the shared endpoint")
    p.set_defaults(func=cmd_fleet_plan)
    p = with_json(with_set(with_config_state_dir(fleet.add_parser(
        "move", help="a layout change: start every model's serving release on the new layout's endpoint, record each "
        "move; --retire-old then deletes the old endpoint"))), "where each model went")
    p.add_argument("configs", nargs="+", metavar="CONFIG",
                   help="the release config of every model on the shared endpoint, each with the new placement")
    p.add_argument("--reason", required=True, help="why the layout changes (recorded with each move)")
    p.add_argument("--actor", help="who moves the fleet (default: $USER@host)")
    p.add_argument("--retire-old", action="store_true",
                   help="delete the old endpoint once no model serves on it (callers must have switched to the new "
                   "name); without it the old endpoint keeps serving")
    p.set_defaults(func=cmd_fleet_move)
