"""The flags several `shiplift` commands share (--ledger-url, --set, --json, --state-dir, the config argument, a
release id) and the config overrides those flags make."""

from __future__ import annotations

import json

from shiplift.tasks.backends.registry import default_state_dir


def with_ledger(p):
    """The ledger a step reads its release from: --ledger-url, $SHIPLIFT_LEDGER_URL, or SQLite under --state-dir."""
    p.add_argument("--ledger-url",
                   help="SQLAlchemy URL of the ledger (default: $SHIPLIFT_LEDGER_URL, else sqlite under --state-dir)")
    return p


def with_set(p):
    p.add_argument("--set", action="append", default=[], metavar="a.b=value",
                   help="override a config field, the value read as YAML (repeatable)")
    return p


def with_json(p, what: str = "the same data"):
    p.add_argument("--json", action="store_true", help=f"print {what} as JSON for machines instead of a table")
    return p


def with_state_dir(p):
    p.add_argument("--state-dir", default=str(default_state_dir()),
                   help="local backend state (default: $SHIPLIFT_HOME or .shiplift)")
    return p


def with_config(p, what: str = "a release config (YAML)"):
    p.add_argument("config", help=what)
    return p


def with_config_state_dir(p):
    p.add_argument("--state-dir", help="the local backend's state dir (and the SQLite ledger's folder): overrides the "
                                       "config's backend.state_dir, as --set backend.state_dir=DIR does")
    return p


def with_release(p, *flags: str, dest: str = "release", what: str = "the release's id", **options):
    """A release id argument (positional, or `flags`): the full id, a unique prefix or suffix, or the shortened id a
    table prints; `main` resolves it to the full id (`resolve_release`) before the command runs."""
    p.add_argument(*(flags or (dest,)), **({"dest": dest} if flags else {}), **options,
                   help=f"{what}: the full id, a unique prefix or suffix, or as a table shortens it (gemma-…3d396)")
    p.set_defaults(release_args=(*(p.get_default("release_args") or ()), dest))
    return p


def overrides_of(args) -> tuple[str, ...]:
    """A command's config overrides: its --set flags, then --state-dir as `backend.state_dir` (where given)."""
    state_dir = getattr(args, "state_dir", None)
    return (*args.set, *((f"backend.state_dir={json.dumps(str(state_dir))}",) if state_dir else ()))
