"""The `prices` group: `prices refresh` fills the price table from the AWS Price List API
(`tasks.backends.aws.price_list`) and prints what changed; --dry-run prints the same and writes nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shiplift.tasks.cli.arguments import with_json
from shiplift.tasks.console import print_json, print_table

COLUMNS = ["region", "instance type", "before $/h", "after $/h", "change", "as of"]


def cmd_prices_refresh(args) -> int:
    """Read each region's and type's figure, write the changed table (unless --dry-run), print the changes."""
    from shiplift.tasks.backends.aws import price_list
    from shiplift.tasks.backends.pricing_table import load_price_table, prices_path
    from shiplift.tasks.errors import BadInput

    path = Path(args.prices) if args.prices else prices_path()
    table = load_price_table(path)
    regions = args.region or sorted(table.prices) or [price_list.PRICE_LIST_REGION]
    types = args.types or sorted({name for listed in table.prices.values() for name in listed})
    if not types:
        raise BadInput(f"{path} lists no instance type to refresh", fix="name the types with --types")
    changes = price_list.refresh_prices(price_list.price_list_session(), table, regions, types)
    moved = [change for change in changes if change.change != "unchanged"]
    if moved and not args.dry_run:
        price_list.write_price_table(path, price_list.updated_table(table, moved))
    written = bool(moved) and not args.dry_run
    if args.json:
        print_json({"prices": str(path), "dry_run": args.dry_run, "written": written,
                    "changes": [change.as_dict() for change in changes]})
        return 0
    print_table([_row(change) for change in changes], COLUMNS)
    print(f"\n{len(moved)} of {len(changes)} figures new or changed; "
          + (f"{path} written" if written else "nothing written" + (" (--dry-run)" if args.dry_run and moved else "")))
    return 0


def _row(change) -> dict[str, Any]:
    before = change.before
    return {"region": change.region, "instance type": change.instance_type,
            "before $/h": None if before is None else f"{before.usd_per_hour:g} ({before.provenance})",
            "after $/h": f"{change.after.usd_per_hour:g}", "change": change.change,
            "as of": change.after.as_of.isoformat()}


def add_prices_commands(sub) -> None:
    """Add the `prices` group."""
    prices = sub.add_parser("prices", help="the price table the cost lines read (docs/cost.md)").add_subparsers(
        dest="prices_command", required=True, metavar="ACTION")
    p = with_json(prices.add_parser(
        "refresh", help="read SageMaker AI real-time inference On-Demand prices from the AWS Price List API into the "
        "price table (needs pricing:GetProducts)"), "what changed")
    p.add_argument("--region", nargs="+", metavar="R",
                   help="the regions to price (default: every region the table lists)")
    p.add_argument("--types", nargs="+", metavar="T",
                   help="the ml. instance types to price (default: every type the table lists)")
    p.add_argument("--prices", metavar="FILE",
                   help="the price table to refresh (default: $SHIPLIFT_PRICES, else the checkout's configs/prices "
                        "file)")
    p.add_argument("--dry-run", action="store_true", help="print what would change and write nothing")
    p.set_defaults(func=cmd_prices_refresh)
