"""What a release config means, read without running it: `policy` (each step's retries and timeouts) and
`config validate`."""

from __future__ import annotations

from shiplift.tasks.cli.arguments import with_config, with_json, with_set
from shiplift.tasks.cli.gate_commands import warn_if_underpowered
from shiplift.tasks.console import print_fields, print_json, print_table


def cmd_policy(args) -> int:
    """The policy table for this config: for every step, where it runs, its retries and backoff, its per-attempt
    timeout and what it does with the model's lease, as the CLI, Airflow and Step Functions apply them."""
    from shiplift.tasks.config import load_release_config
    from shiplift.tasks.pipeline.table import LEASE, MAX_STEP_TIMEOUT_S, policy_rows

    rows = policy_rows(load_release_config(args.config, overrides=tuple(args.set)))
    if args.json:
        print_json({"steps": rows, "max_step_timeout_s": MAX_STEP_TIMEOUT_S,
                    "lease": {"ttl_s": LEASE.ttl_s, "renew_every_s": LEASE.renew_every_s}})
        return 0
    print_table(rows, ["step", "runs in", "retries", "backoff", "table_timeout_s", "timeout_s", "lease", "defers"])
    retried = next((row["retried"] for row in rows if row["retried"]), "none")
    print(f"\nRetried: {retried}; every other error, and an attempt past its timeout, fails the step at once. A step "
          f"that holds a worker may take at most {MAX_STEP_TIMEOUT_S} s (a person's approval: its own timeout). The "
          f"model's lease lasts {LEASE.ttl_s:.0f} s unless renewed, and a running step renews it every "
          f"{LEASE.renew_every_s:.0f} s.")
    return 0


def cmd_config_validate(args) -> int:
    """The effective config, once every file and package it names is found readable (`require_named_files`)."""
    from shiplift.tasks.config import load_release_config, require_named_files
    from shiplift.tasks.pipeline.release import release_id_for

    config = load_release_config(args.config, overrides=tuple(args.set))
    require_named_files(config, args.config)
    warn_if_underpowered(config, args.config)
    if args.json:
        print_json({"ok": True, "release_id": release_id_for(config), "config_hash": config.config_hash(),
                    "config": config.model_dump(mode="json")})
        return 0
    print(f"{args.config} is valid: release {release_id_for(config)}, config hash {config.config_hash()}")
    print_fields(config.model_dump(mode="json"))
    return 0


def add_config_commands(sub) -> None:
    """Add `policy` and the `config` group."""
    p = with_json(with_set(with_config(sub.add_parser(
        "policy", help="the retries and timeouts every orchestrator applies to each step of a config"))), "the policy")
    p.set_defaults(func=cmd_policy)

    config = sub.add_parser("config", help="configuration tools").add_subparsers(dest="config_command", required=True,
                                                                                 metavar="ACTION")
    p = with_json(with_set(with_config(config.add_parser(
        "validate", help="validate a release config and print the effective values"))),
        "ok, the release id, the config hash and the effective config")
    p.set_defaults(func=cmd_config_validate)
