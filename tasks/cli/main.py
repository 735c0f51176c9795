"""The `shiplift` command line: releases, stages, serving, endpoints, evaluation and the ledger.

Exit codes: 0 success, 1 unexpected error, 2 bad config or input, 3 gate rejected the release
(or `ledger verify` found tampering), 4 another run holds the promotion lease.

Commands print tables for people and, with `--json`, the same data for machines; read-only commands (`status`,
`endpoints list`, the `ledger` reads) never create or change a file.
"""

from __future__ import annotations

import argparse
import os
import sys

from tasks.cli.config_commands import add_config_commands
from tasks.cli.fleet_commands import add_fleet_commands
from tasks.cli.gate_commands import add_gate_commands
from tasks.cli.ledger_commands import add_ledger_commands, close_ledgers
from tasks.cli.orchestration_commands import add_orchestration_commands
from tasks.cli.release_commands import add_release_commands
from tasks.cli.serving_commands import add_serving_commands
from tasks.console import EXIT_ERROR, EXIT_BAD_INPUT, EXIT_REJECTED, EXIT_LEASE, EXIT_BROKEN_PIPE
from tasks.errors import BadInput, ConfigError, GateFailed, IntegrityError, LeaseHeld, ShipliftError


def version() -> str:
    """The installed shiplift distribution's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("shiplift")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shiplift", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}", help="print shiplift's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_release_commands(sub)
    add_orchestration_commands(sub)
    add_config_commands(sub)
    add_fleet_commands(sub)
    add_gate_commands(sub)
    add_serving_commands(sub)
    add_ledger_commands(sub)
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
        close_ledgers()


if __name__ == "__main__":
    sys.exit(main())
