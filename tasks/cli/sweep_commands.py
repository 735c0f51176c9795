"""The `sweep` group (docs/sweeps.md): `plan` (read-only), `run` (the candidates, the pick, and with --release-pick the
pick's own release), `explain` (the pick re-derived from the ledger alone) and `report` (the sweep report)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from shiplift.tasks.cli.arguments import with_json, with_ledger, with_state_dir
from shiplift.tasks.cli.ledger_commands import ledger_for
from shiplift.tasks.cli.release_commands import FRESH_CHAMPION, print_summary, release_exit
from shiplift.tasks.console import EXIT_REJECTED, cell, print_fields, print_json, print_table
from shiplift.tasks.errors import ConfigError

COLUMNS = ["name", "status", "accuracy", "ece", "p95_ms", "usd_per_hour", "usd_per_1m_decisions", "reason"]


def cmd_plan(args) -> int:
    """The candidates, their $/h, the cost bound and the rule with its sha256; writes nothing."""
    from shiplift.tasks.sweeps.config import load_sweep
    from shiplift.tasks.sweeps.run import plan

    planned = plan(load_sweep(args.config), parallel=args.parallel)
    if args.json:
        print_json(planned)
        return 0
    print_fields({key: planned[key] for key in ("sweep_id", "base", "parallel", "usd_per_hour_at_once",
                                                "usd_per_hour_all", "max_usd_per_hour", "rule_sha256")})
    print_table([{**row, "values": ", ".join(f"{k}={json.dumps(v)}" for k, v in row["values"].items())}
                 for row in planned["candidates"]], ["name", "release_id", "usd_per_hour", "values"])
    print("rule (as hashed):")
    print_fields(planned["rule"])
    over = planned["usd_per_hour_at_once"] > planned["max_usd_per_hour"]
    if over:
        print(f"{planned['parallel']} at once exceed max_usd_per_hour: `sweep run` would refuse", file=sys.stderr)
    return 0


def cmd_run(args) -> int:
    """Evaluate the candidates (a rerun continues), pick, and with --release-pick release the pick."""
    from shiplift.tasks.backends.registry import make_backends
    from shiplift.tasks.sweeps.config import load_sweep
    from shiplift.tasks.sweeps.run import release_pick, run_sweep

    if args.fresh_champion and not args.ship_pick:
        raise ConfigError("--fresh-champion is about the pick's release and only goes with --release-pick",
                          fix=f"run `shiplift sweep run {args.config} --release-pick --fresh-champion`; the "
                              "candidates' own gates follow the base config's validation.champion.reuse")
    sweep = load_sweep(args.config)
    result = run_sweep(sweep, parallel=args.parallel)
    released = None
    if args.ship_pick and result["picked"] is not None:
        released = release_pick(make_backends(sweep.base).ledger, sweep.sweep_id,
                                keep_candidate=args.keep_candidate or None, fresh_champion=args.fresh_champion)
    if args.json:
        print_json({**result, "release": released})
    else:
        print_sweep(result)
        if released is not None:
            print_summary(released)
    if result["picked"] is None:
        return EXIT_REJECTED
    return release_exit(released) if released is not None else 0


def print_sweep(result: dict) -> None:
    print_fields({"sweep_id": result["sweep_id"], "rule_sha256": result["rule_sha256"],
                  "picked": result["picked"] or "nothing: no candidate meets the rule",
                  "frontier": ", ".join(result["frontier"] or []), "speeds": result["speed"]["note"]})
    print_table([{key: cell(value) for key, value in row.items()} for row in result["candidates"]], COLUMNS,
                shrink=("reason",))


def cmd_explain(args) -> int:
    """The pick re-derived from the ledger alone, whether it agrees with the recorded one, and every verdict."""
    from shiplift.tasks.ledger.sweep_records import SweepRecords, explanation, resolve_sweep

    ledger = ledger_for(args)
    found = explanation(SweepRecords.load(ledger, resolve_sweep(ledger, args.sweep)))
    if args.json:
        print_json(found)
    else:
        derived, recorded = found["derived_pick"], found["recorded_pick"]
        print_fields({"sweep_id": found["sweep_id"], "rule_sha256": found["rule_sha256"],
                      "opened": f"{found['opened_at']} by {found['opened_by']}",
                      "evaluated": f"{found['evaluated']} of {found['candidates']}",
                      "recorded pick": _picked(recorded, "none recorded yet"),
                      "re-derived pick": _picked(derived, "no evidence yet"),
                      "agrees": "yes" if found["agrees"] else "NO", "speeds": found["speed"]["note"]})
        print_table(found["verdicts"], ["name", "status", "reason"], shrink=("reason",))
        print("rule (as recorded when the sweep opened):")
        print_fields(found["rule"])
    return 0 if found["agrees"] else EXIT_REJECTED


def _picked(pick: dict | None, absent: str) -> str:
    if pick is None:
        return absent
    return pick["picked"] or "nothing: no candidate meets the rule"


def cmd_report(args) -> int:
    """Write the sweep report (sweep-report.json, report.html) from the ledger's records."""
    from shiplift.tasks.ledger.sweep_records import SweepRecords, resolve_sweep
    from shiplift.tasks.sweeps.report import write_report

    ledger = ledger_for(args)
    records = SweepRecords.load(ledger, resolve_sweep(ledger, args.sweep))
    out = Path(args.out) if args.out else Path(args.state_dir) / "sweeps" / records.sweep_id
    written = write_report(records, out)
    print_json(written) if args.json else print_fields(written)
    return 0


def add_sweep_commands(sub) -> None:
    """Add `sweep plan`, `sweep run`, `sweep explain` and `sweep report`."""
    group = sub.add_parser("sweep", help="compare candidate configs of one model and pick one by a rule written "
                                         "before the results (docs/sweeps.md)")
    commands = group.add_subparsers(dest="sweep_command", required=True, metavar="SWEEP_COMMAND")

    p = commands.add_parser("plan", help="list the candidates, their $/h and the rule's sha256; writes nothing")
    p.add_argument("config", help="a sweep config (configs/sweeps/*.yaml)")
    p.add_argument("--parallel", type=int, help="candidates run at once, for the cost bound (default: the sweep's "
                                                "`parallel`, 1 unless it sets one)")
    with_json(p)
    p.set_defaults(func=cmd_plan)

    p = commands.add_parser("run", help="evaluate every candidate on the sweep's tasks and pick by the rule "
                                        "(a rerun continues)")
    p.add_argument("config", help="a sweep config (configs/sweeps/*.yaml)")
    p.add_argument("--parallel", type=int, help="candidates evaluated at once (default: the sweep's `parallel`, 1 "
                                                "unless it sets one)")
    p.add_argument("--release-pick", action="store_true", dest="ship_pick",
                   help="then release the pick: the base config with the pick's values, gated on the base's own "
                        "datasets against the champion, approval and rollout as the base says")
    p.add_argument("--keep-candidate", action="store_true", help="keep the pick's release candidate endpoint")
    p.add_argument("--fresh-champion", action="store_true",
                   help=f"with --release-pick: the pick's gate {FRESH_CHAMPION}")
    with_json(p)
    p.set_defaults(func=cmd_run)

    for name, doc, func in (("explain", "re-derive the pick from the ledger alone and say why each candidate lost",
                             cmd_explain),
                            ("report", "write the sweep report (Pareto charts, every candidate, the rule)",
                             cmd_report)):
        p = commands.add_parser(name, help=doc)
        p.add_argument("sweep", help="the sweep's id, or a unique prefix or suffix of it")
        with_state_dir(with_ledger(p))
        with_json(p)
        if name == "report":
            p.add_argument("--out", help="folder to write into (default: STATE_DIR/sweeps/SWEEP_ID)")
        p.set_defaults(func=func)
