"""What serves and where: `serve` and `eval` (added by the model families), `status` (what serves per model, from
the ledger) and the local `endpoints` (list, stop, heal)."""

from __future__ import annotations

from pathlib import Path

from shiplift.tasks.cli.arguments import with_json, with_ledger, with_state_dir
from shiplift.tasks.cli.ledger_commands import ledger_for
from shiplift.tasks.console import cell, print_json, print_table
from shiplift.tasks.errors import BadInput, NotFound

ENDPOINT_COLUMNS = ["endpoint", "status", "components (copies in rotation / spec)", "url"]


def cmd_endpoints_list(args) -> int:
    """Every local endpoint under the state dir. No state there is BadInput naming where it looked (exit 2); a state
    dir whose endpoints are all gone is an empty table. Listing creates nothing."""
    from shiplift.tasks.backends.registry import local_endpoints

    state_dir = Path(args.state_dir).expanduser().resolve()
    if not (state_dir / "endpoints").is_dir():
        why = "does not exist" if not state_dir.exists() else "holds no endpoints folder"
        raise BadInput(f"no local endpoints: the state dir {state_dir} {why}",
                       fix="pass --state-dir naming the state dir a release used (the demo's: .shiplift/demo)")
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
        raise BadInput("give endpoint names or --all, not both and not neither",
                       fix=f"shiplift endpoints {verb} NAME... | --all")
    known = [e["name"] for e in hosting.list_endpoints()]
    unknown = sorted(set(args.names) - set(known))
    if unknown:
        raise BadInput(f"no local endpoint named {', '.join(unknown)} under {hosting.state_dir}",
                       fix="see `shiplift endpoints list`")
    return known if args.all else args.names


def cmd_endpoints_stop(args) -> int:
    from shiplift.tasks.backends.registry import local_endpoints

    hosting = local_endpoints(args.state_dir)
    for name in named_endpoints(hosting, args, "stop"):
        hosting.delete_endpoint(name)
        print(f"stopped {name}")
    return 0


def cmd_endpoints_heal(args) -> int:
    from shiplift.tasks.backends.registry import local_endpoints

    hosting = local_endpoints(args.state_dir)
    for name in named_endpoints(hosting, args, "heal"):
        info = hosting.ensure_endpoint(name)
        print(f"{name}: router {info.status}, every component back at its copy count")
    return 0


STATUS_COLUMNS = ["model", "serving", "since", "gate", "accuracy", "macro-F1", "ECE", "p95 ms", "cost/h",
                  "last release", "outcome", "in progress"]


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
    read from the ledger, changing nothing. No ledger where it looked is BadInput naming the place and the flags."""
    from shiplift.tasks.ledger.views import serving_status

    rows = serving_status(ledger_for(args), args.model)
    if args.model and not rows:
        raise NotFound(f"the ledger has no releases of model {args.model!r}",
                       fix="run `shiplift status` for every model")
    if args.json:
        print_json(rows)
        return 0
    print_table([status_cells(row) for row in rows], STATUS_COLUMNS, shrink=("serving", "last release", "in progress"))
    for request in (request for row in rows for request in row["awaiting_approval"]):
        print(f"\n{request['release_id']} awaits approval by one of {', '.join(request['approvers'])} until "
              f"{request['deadline'][:19]}Z (gate {request['gate']['decision']}, report "
              f"{request['gate']['report_html']}): `shiplift approve {request['release_id']} --reason TEXT` or "
              "`shiplift reject …`")
    return 0


def add_serving_commands(sub) -> None:
    """Add `serve`, `eval`, `status` and the `endpoints` group."""
    from shiplift.tasks.families.registry import families

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

    group = sub.add_parser("endpoints", help="local endpoints")
    endpoints = group.add_subparsers(dest="endpoints_command", required=True, metavar="ACTION")
    p = with_json(with_state_dir(endpoints.add_parser(
        "list", help="list local endpoints, their health and components")), "the endpoints")
    p.set_defaults(func=cmd_endpoints_list)
    for verb, func, help_text in (("stop", cmd_endpoints_stop, "stop local endpoints"),
                                  ("heal", cmd_endpoints_heal, "restart local endpoints' dead routers and copies")):
        p = with_state_dir(endpoints.add_parser(verb, help=help_text))
        p.add_argument("names", nargs="*", help="the endpoints to " + verb)
        p.add_argument("--all", action="store_true", help=f"{verb} every local endpoint under --state-dir")
        p.set_defaults(func=func)
