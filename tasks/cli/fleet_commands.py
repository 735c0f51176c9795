"""The `fleet` group: `fleet plan`, the layout, room and cost share of the models on one shared endpoint
(`tasks.pipeline.fleet.plan`; read-only: it opens the configs' ledger, where there is one, only to read each model's
history once, and asks the backend for the copies each serving component has now), `fleet pack`, the cheapest MIG
layout for the models (`tasks.pipeline.fleet.pack`; read-only unless --write), and `fleet move`, which moves every
model onto a new layout's endpoint (`tasks.pipeline.fleet.move`). Both read the configs once, with the same --set and
--state-dir, so both see one ledger; this module only renders what they return (a table, or --json the same data)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shiplift.tasks.cli.arguments import overrides_of, with_config_state_dir, with_json, with_set
from shiplift.tasks.console import EXIT_BAD_INPUT, print_json, print_table

if TYPE_CHECKING:
    from shiplift.tasks.pipeline.fleet.plan import FleetPlan

PLAN_COLUMNS = ["model", "copies", "peak while it updates", "threads", "memory/copy MB", "share", "$/h",
                "serves on now"]
MOVE_COLUMNS = ["model", "outcome", "release", "from", "first answer s"]
PACK_COLUMNS = ["model", "profile", "memory/copy MB", "memory from", "copies", "peak while it updates", "share", "$/h"]


def cmd_fleet_plan(args) -> int:
    """Print the fleet's plan; exit 2, with the arithmetic of each problem, when it does not fit."""
    plan = _read_plan(args)
    if args.json:
        print_json(plan.as_dict())
    else:
        layout = plan.placement.get("layout")
        print(f"{plan.endpoint}: "
              + (f"{plan.instances} x {plan.slots.instance_type}, each GPU carved {' + '.join(layout)}" if layout
                 else plan.slots.describe(plan.instances))
              + (f", up to {plan.slots.describe(plan.most)} with managed scaling" if plan.most > plan.instances else "")
              + f"; {plan.bill.describe()}")
        print_table(plan_rows(plan), PLAN_COLUMNS)
        idle = plan.idle_usd_per_hour
        unit = "partition" if plan.placement.get("layout") else plan.slots.unit
        print(f"\n{plan.steady} copies serve; room left while the largest update runs: {plan.headroom} "
              f"{unit}(s)" + (f"; idle room costs ≈ {idle:.2f} $/h" if idle is not None else ""))
        for note in plan_notes(plan):
            print(note)
    for problem in plan.problems:
        print(f"shiplift: the fleet does not fit: {problem}", file=sys.stderr)
    return EXIT_BAD_INPUT if plan.problems else 0


def _read_plan(args) -> FleetPlan:
    """The plan of the configs (each parsed once) and of their ledger, where there is one, each model's history read
    once (read-only); the configs' alone, saying so, where the ledger cannot be read."""
    from shiplift.tasks.backends.registry import make_backends
    from shiplift.tasks.pipeline.fleet.plan import plan_snapshot
    from shiplift.tasks.pipeline.fleet.snapshot import load_fleet_configs, read_snapshot

    configs = load_fleet_configs(args.configs, overrides_of(args))
    config = configs[0].config  # the ledger a release of it writes, and the backend its endpoints are on
    unread = read_snapshot(configs)  # the configs alone: what is planned where the ledger cannot be read

    def read(ledger):
        if ledger is None:
            return plan_snapshot(unread)

        def hosting():  # asked only where a model serves
            return make_backends(config, ledger=ledger).hosting

        return plan_snapshot(read_snapshot(configs, ledger=ledger, open_hosting=hosting, prices=unread.prices))

    return _with_ledger(config, read, "memory per copy and what serves each model are unknown")


def _with_ledger(config, read: Callable[[Any], Any], without: str) -> Any:
    """`read(ledger)` with the ledger `config`'s releases write, opened read-only (None: there is none yet); where it
    cannot be read, `read(None)`, saying so and what that leaves `without`."""
    from shiplift.tasks.backends.registry import open_ledger
    from shiplift.tasks.errors import BadInput, NotReady

    try:
        ledger = open_ledger(ledger_url=config.backend.ledger_url, state_dir=config.backend.state_dir, read_only=True)
    except BadInput:
        ledger = None  # no ledger yet: no model built or serving
    try:
        return read(ledger)
    except NotReady as exc:  # the layout's arithmetic needs no ledger: read without it, and say what is missing
        print(f"shiplift: planned without the ledger ({exc}): {without}", file=sys.stderr)
        return read(None)
    finally:
        if ledger is not None:
            ledger.close()


def plan_notes(plan: FleetPlan) -> list[str]:
    """The lines under the plan's table: where a config and what serves differ, who pays while idle, who moves, and
    which old endpoints still serve."""
    notes = [f"{tenant.model}: {difference}" for tenant in plan.tenants for difference in tenant.differs]
    if not plan.idles_free:
        notes += [f"{tenant.model} scales to zero, but {', '.join(tenant.share.kept_on_by)} never do(es): SageMaker "
                  "stops the instances only when every model is at 0 copies, so its share is paid while it idles too"
                  for tenant in plan.tenants if tenant.share.scales_to_zero]
    if plan.moving:
        notes.append(f"layout change: {', '.join(t.model for t in plan.moving)} serve(s) on another layout's endpoint; "
                     f"`shiplift fleet move` with these configs moves every model to {plan.endpoint}")
    if plan.kept:
        notes.append(f"kept: {', '.join(plan.kept)} still serve(s) for callers of the old name (and cost(s) its bill); "
                     "once they have switched, `shiplift fleet move` with these configs and --retire-old deletes it")
    return notes


def plan_rows(plan: FleetPlan) -> list[dict[str, Any]]:
    """A row per model for people: copies, its update's peak with everyone else serving, memory, share and cost."""
    return [{"model": t.model, "copies": t.copies if t.most == t.copies else f"{t.copies} (up to {t.most})",
             "peak while it updates": f"{plan.peak(t)} of {plan.slots_of(t).total(plan.most)}"
                                      + (f" {t.partition_type}" if plan.placement.get("layout") else ""),
             "threads": t.threads,
             "memory/copy MB": t.memory_mb,
             "share": f"{t.share.fraction:.1%}" if t.share.fraction is not None else None,
             "$/h": round(t.share.usd_per_hour, 2) if t.share.usd_per_hour is not None else None,
             "serves on now": "this endpoint" if t.serves_on == plan.endpoint else t.serves_on} for t in plan.tenants]


def cmd_fleet_move(args) -> int:
    """Move every model of the shared endpoint onto its new layout's endpoint, then show where each one went."""
    from shiplift.tasks.pipeline import table
    from shiplift.tasks.pipeline.fleet.move import move_fleet
    from shiplift.tasks.pipeline.release import default_actor, print_progress

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


def cmd_fleet_pack(args) -> int:
    """Print the cheapest MIG layout for the models, why each got its profile, what is left and each one's $/h; with
    --write, write each model's packed config; exit 2 where `fleet plan` of the packed configs finds a problem."""
    from shiplift.tasks.pipeline.fleet.pack import layout_text, load_sizes, pack_fleet, write_placements
    from shiplift.tasks.pipeline.fleet.snapshot import load_fleet_configs

    configs = load_fleet_configs(args.configs, overrides_of(args), placed=False)
    sizes = load_sizes(args.sizes) if args.sizes else None
    result = _with_ledger(configs[0].config, lambda ledger: pack_fleet(configs, ledger=ledger, sizes=sizes),
                          "each copy's memory is estimated")
    report = result.as_dict()
    if args.json:
        print_json(report)
    else:
        print(f"{report['endpoint']}: 1 x {report['instance_type']} ({report['gpus']} x {report['gpu']}), each GPU "
              f"carved {layout_text(result.packing.layout)}; {result.plan.bill.describe()}")
        print_table(pack_rows(report), PACK_COLUMNS)
        print()
        for model in report["models"]:
            print(f"{model['model']}: {model['profile']}: {model['why']}")
        print(f"left: {pack_left(report['left'])}"
              + (f"; idle room costs ≈ {report['idle_usd_per_hour']:.2f} $/h"
                 if report["idle_usd_per_hour"] is not None else ""))
    if args.write:
        for path in write_placements(result, args.write):
            print(f"wrote {path}", file=sys.stderr if args.json else sys.stdout)
    for problem in result.plan.problems:
        print(f"shiplift: fleet plan of the packed configs finds a problem: {problem}", file=sys.stderr)
    return EXIT_BAD_INPUT if result.plan.problems else 0


def pack_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A row per model for people: its profile, a copy's memory and where it comes from, its room, share and cost."""
    return [{"model": m["model"], "profile": m["profile"], "memory/copy MB": m["memory_mb_per_copy"],
             "memory from": m["memory_from"],
             "copies": m["copies"] if m["max_copies"] == m["copies"] else f"{m['copies']} (up to {m['max_copies']})",
             "peak while it updates": m["update_peak"],
             "share": f"{m['share']['fraction']:.1%}" if m["share"]["fraction"] is not None else None,
             "$/h": round(m["share"]["usd_per_hour"], 2) if m["share"]["usd_per_hour"] is not None else None}
            for m in report["models"]]


def pack_left(left: dict[str, Any]) -> str:
    """What the layout leaves, in words: each GPU's uncarved slices and memory, and each profile's spare partitions."""
    profiles = "; ".join(f"{name}: {p['partitions']} partition(s), {p['copies']} copy(ies) serve, "
                         f"{p['spare_at_peak']} spare while the largest update on it runs"
                         for name, p in left["profiles"].items())
    return (f"{left['slices_per_gpu']} compute slice(s) and {left['memory_gb_per_gpu']} GB uncarved per GPU; "
            f"{profiles}")


def add_fleet_commands(sub) -> None:
    """Add the `fleet` group."""
    fleet = sub.add_parser("fleet", help="models that share one production endpoint").add_subparsers(
        dest="fleet_command", required=True, metavar="ACTION")
    p = with_json(with_set(with_config_state_dir(fleet.add_parser(
        "plan",
        help="the layout, the room every model's copies and updates take, and each model's share of the bill"))),
        "the plan")
    p.add_argument("configs", nargs="+", metavar="CONFIG",
                   help="the release config of every model on the shared endpoint")
    p.set_defaults(func=cmd_fleet_plan)
    p = with_json(with_set(with_config_state_dir(fleet.add_parser(
        "pack", help="the cheapest MIG layout for the models (instance type, profiles per GPU), why each model got its "
        "profile, what is left and each model's $/h; read-only unless --write"))), "the packing")
    p.add_argument("configs", nargs="+", metavar="CONFIG",
                   help="the release config of every model to pack onto one shared MIG endpoint")
    p.add_argument("--sizes", metavar="FILE",
                   help="stated artifact sizes for models with no build in the ledger and no artifact here "
                   "(docs/fleet.md)")
    p.add_argument("--write", metavar="DIR",
                   help="write each model's packed config (extends its config, sets the placement) into DIR; never "
                   "over an existing file")
    p.set_defaults(func=cmd_fleet_pack)
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
