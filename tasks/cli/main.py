"""The `shiplift` command line: releases, stages, serving, endpoints, evaluation and the ledger.

Exit codes: 0 success, 1 unexpected error, 2 bad config or input, 3 gate rejected the release
(or `ledger verify` found tampering), 4 another run holds the promotion lease.

Commands print tables for people and, with `--json`, the same data for machines; read-only commands (`status`,
`endpoints list`, the `ledger` reads) never create or change a file. A release id is taken as git takes a hash (the
full id, a unique prefix or suffix, or the shortened id a table prints), resolved once here before the command runs.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as installed

from shiplift.tasks.cli.config_commands import add_config_commands
from shiplift.tasks.cli.fleet_commands import add_fleet_commands
from shiplift.tasks.cli.gate_commands import add_gate_commands
from shiplift.tasks.cli.ledger_commands import add_ledger_commands, close_ledgers, resolve_release_args
from shiplift.tasks.cli.orchestration_commands import add_orchestration_commands
from shiplift.tasks.cli.prices_commands import add_prices_commands
from shiplift.tasks.cli.release_commands import add_release_commands
from shiplift.tasks.cli.serving_commands import add_serving_commands
from shiplift.tasks.cli.sweep_commands import add_sweep_commands
from shiplift.tasks.console import EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_LEASE, EXIT_REJECTED
from shiplift.tasks.errors import BadInput, ConfigError, GateFailed, IntegrityError, LeaseHeld, ShipliftError


def version() -> str:
    """The installed shiplift distribution's version."""
    try:
        return installed("shiplift")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class Parser(argparse.ArgumentParser):
    """argparse with "did you mean" for a mistyped flag, told on the subcommand's own usage. Hand-written because
    Python 3.11's argparse suggests nothing (suggest_on_error came in 3.14) and reports an unknown flag only at the
    top level, with the top-level usage; subcommands' parsers are made of this class too (add_subparsers' default)."""

    given: tuple[str, ...] = ()  # the arguments this parser was handed (a subcommand's: those after its name)

    def parse_known_args(self, args=None, namespace=None):
        self.given = tuple(sys.argv[1:] if args is None else args)
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None:  # a command's own parser: its flags are the ones to suggest
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def suggestions(self) -> str:
        """"; did you mean --state-dir?" for the flags given that this command does not take but one close to them
        (difflib): also when the error is another, such as a required flag missing because it was mistyped."""
        if self._subparsers is not None:  # a group's arguments are its subcommand's, whose own parser suggests
            return ""
        flags = [arg.partition("=")[0] for arg in self.given if arg.startswith("--")]
        hints = {flag: close[0] for flag in flags if flag not in self._option_string_actions
                 and (close := difflib.get_close_matches(flag, self._option_string_actions, n=1))}
        return f"; did you mean {', '.join(f'{close} (for {flag})' for flag, close in hints.items())}?" if hints else ""

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}{self.suggestions()}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="shiplift", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}",
                        help="print shiplift's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_release_commands(sub)
    add_orchestration_commands(sub)
    add_config_commands(sub)
    add_fleet_commands(sub)
    add_prices_commands(sub)
    add_gate_commands(sub)
    add_serving_commands(sub)
    add_ledger_commands(sub)
    add_sweep_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        resolve_release_args(args)
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
