"""The `gate` group: `gate plan`, the champion checks' power before a run (`validation.gate_power`): from the config's
test split and the spread its ledger recorded between the champion and earlier challengers (else a stated prior), the
narrowest margin an equally good candidate passes at 80 % power and each outcome's chance for an equal and a worse
candidate. It opens the ledger, where there is one, read-only, to read earlier gates' paired intervals, and reads
their kept predictions from the artifact store to count the disagreement."""

from __future__ import annotations

import sys
from pathlib import Path

from shiplift.tasks.cli.arguments import (
    overrides_of,
    with_config,
    with_config_state_dir,
    with_json,
    with_ledger,
    with_set,
)
from shiplift.tasks.console import print_json, print_table

PREDICTIONS_MAX_BYTES = 64 << 20  # a kept predictions file read for the plan (a gate's rows are ~1 KB each)
INCONCLUSIVE_TEXT = {"block": "block (validation.inconclusive.choice block)",
                     "extend": "extend onto validation.inconclusive.extend's reserve tasks",
                     "ask": "ask promotion.approval's approvers"}
OUTCOME_COLUMNS = ["check", "candidate", "worse by", "pass", "inconclusive", "fail"]
CHECK_COLUMNS = ["check", "margin", "tasks", "spread", "from", "narrowest margin", "tasks for margin"]


def gate_tasks(config, config_dir: Path) -> int:
    """The number of paired tasks the gate scores: every dataset's kept splits, as the validate stage sends them."""
    validation = config.validation
    bodies = config.family.invocation_bodies(validation, validation.dataset_paths(config_dir))
    return len(bodies) * config.family.items_per_request(validation)


def datasets_text(config) -> str:
    """The gate's datasets as the config names them."""
    return ", ".join(str(ref.path) for ref in config.validation.datasets)


def recorded_comparisons(config, ledger_url: str | None) -> tuple[list[dict], list[tuple[int, int]], str | None]:
    """What the model's earlier gates recorded in the ledger: every check, and for each comparison with a champion
    whose prediction files were kept, its (shared, disagreeing) task counts; and why nothing was read, or None."""
    from shiplift.tasks.backends.registry import open_ledger
    from shiplift.tasks.errors import ShipliftError
    from shiplift.tasks.ledger.events import SUCCEEDED, VALIDATE

    backend = config.backend
    try:
        ledger = open_ledger(ledger_url=ledger_url or backend.ledger_url, state_dir=backend.state_dir, read_only=True)
        try:
            gates = list({r.release_id: r.payload for r in ledger.history(config.name)
                          if (r.stage, r.event) == (VALIDATE, SUCCEEDED)}.values())  # each release's latest
            disagreements = kept_disagreements(config, ledger, gates)
        finally:
            ledger.close()
    except ShipliftError as exc:  # no ledger yet, or one this machine cannot reach: plan on the prior, and say so
        return [], [], f"no ledger read ({exc})"
    return [check for gate in gates for check in gate.get("checks") or []], disagreements, None


def kept_disagreements(config, ledger, gates: list[dict]) -> list[tuple[int, int]]:
    """(shared, disagreeing) tasks of each recorded gate that kept both the candidate's and the champion's
    predictions (`validation.gate_power.paired_disagreement`), read from the artifact store."""
    from shiplift.tasks.backends.registry import artifact_reader
    from shiplift.validation.gate_power import paired_disagreement
    from shiplift.validation.jsonl import parsed_lines

    kept = [gate["evidence"] for gate in gates
            if {"predictions.jsonl", "champion-predictions.jsonl"} <= set(gate.get("evidence") or {})]
    if not kept:
        return []
    store = artifact_reader(config)

    def rows(ref: dict) -> list:
        text = store.read_verified(ref["uri"], max_bytes=PREDICTIONS_MAX_BYTES).decode()
        return [row for _, row in parsed_lines(text.splitlines(), ref["uri"])]

    return [paired_disagreement(rows(files["predictions.jsonl"]), rows(files["champion-predictions.jsonl"]))
            for files in kept]


def prior_plans(config, config_dir: Path) -> tuple[list, str | None]:
    """The champion checks' plans on the stated prior (no ledger read: offline and read-only), or why none was made."""
    from shiplift.tasks.errors import BadInput, ConfigError
    from shiplift.validation.gate_power import plan_champion_checks

    try:
        n = gate_tasks(config, config_dir)
    except (BadInput, ConfigError) as exc:
        return [], f"the gate's power was not planned: {exc}"
    return plan_champion_checks(config.validation.champion, n), None


def power_warnings(config, config_dir: Path) -> list[str]:
    """A warning per champion check an equally good candidate cannot pass at 80 % power (stated prior, no ledger
    read), or why the plan could not be made; for `config validate` and a release's start."""
    plans, unplanned = prior_plans(config, config_dir)
    if unplanned:
        return [unplanned]
    return [f"warning: {plan.warning(datasets_text(config))} (`shiplift gate plan` shows the table)"
            for plan in plans if plan.underpowered]


def power_lines(config, config_dir: Path) -> list[str]:
    """One line per champion check for `release --dry-run`: its power on the stated prior and what an inconclusive
    gate does (`validation.inconclusive.choice`)."""
    plans, unplanned = prior_plans(config, config_dir)
    if unplanned:
        return [unplanned]
    choice = config.validation.inconclusive.choice
    return [f"gate power: {plan.check} at margin {plan.margin:g} on {plan.n} tasks ({_spread_text(plan)}, "
            f"{plan.spread.source}): an equal candidate passes {plan.equal_passes:.2f}, one worse by the margin "
            f"{plan.outcomes[1]['pass']:.2f}; 80 % needs a margin of {plan.narrowest_margin:.3f} or "
            f"{plan.tasks_needed} tasks; an inconclusive gate will {INCONCLUSIVE_TEXT[choice]}" for plan in plans]


def warn_if_underpowered(config, config_path: str) -> None:
    """Print `power_warnings` on stderr (a warning, never a refusal)."""
    for line in power_warnings(config, Path(config_path).parent):
        print(f"shiplift: {line}", file=sys.stderr)


def _spread_text(plan) -> str:
    spread = plan.spread
    return f"{spread.disagreement:.1%} disagree" if spread.disagreement is not None else f"SD {spread.sd:.3f}/task"


def cmd_gate_plan(args) -> int:
    """Print each champion check's power for this config; warn about any an equal candidate cannot pass."""
    from shiplift.tasks.config import load_release_config
    from shiplift.validation.gate_power import POWER, plan_champion_checks

    config = load_release_config(args.config, overrides=overrides_of(args))
    n = gate_tasks(config, Path(args.config).parent)
    recorded, disagreements, unread = recorded_comparisons(config, args.ledger_url)
    plans = plan_champion_checks(config.validation.champion, n, recorded, disagreements)
    if args.json:
        print_json({"config": args.config, "model": config.name, "tasks": n, "power": POWER, "ledger": unread or "read",
                    "inconclusive": config.validation.inconclusive.choice,
                    "checks": [plan.as_dict() for plan in plans]})
        return 0
    print(f"{config.name}: {n} paired tasks; pass when the paired {plans[0].confidence:.0%} interval's low end clears "
          f"−margin, fail when its high end is below it, else inconclusive")
    if unread:
        print(f"{unread}: the spread is the stated prior")
    print_table([{"check": p.check, "margin": f"{p.margin:g}", "tasks": p.n, "spread": _spread_text(p),
                  "from": p.spread.source, "narrowest margin": f"{p.narrowest_margin:.3f}",
                  "tasks for margin": p.tasks_needed if p.tasks_needed is not None else "none"} for p in plans],
                CHECK_COLUMNS)
    print(f"\n(narrowest margin: the smallest an equally good candidate passes with probability {POWER:.0%}; tasks for "
          f"margin: the paired tasks that margin needs for it)\n")
    print_table([{"check": p.check, "candidate": o["candidate"], "worse by": f"{o['shortfall']:g}",
                  **{k: f"{o[k]:.2f}" for k in ("pass", "inconclusive", "fail")}} for p in plans for o in p.outcomes],
                OUTCOME_COLUMNS)
    print(f"\nan inconclusive gate will {INCONCLUSIVE_TEXT[config.validation.inconclusive.choice]}")
    for plan in plans:
        if plan.underpowered:
            print(f"\nwarning: {plan.warning(datasets_text(config))}")
    return 0


def add_gate_commands(sub) -> None:
    """Add the `gate` group."""
    gate = sub.add_parser("gate", help="the validation gate before a run").add_subparsers(
        dest="gate_command", required=True, metavar="ACTION")
    p = with_json(with_ledger(with_set(with_config_state_dir(with_config(gate.add_parser(
        "plan", help="each champion check's power: the narrowest margin an equal candidate passes at 80 % and the "
        "chance of pass, inconclusive and fail for an equal and a worse candidate"))))), "the plan")
    p.set_defaults(func=cmd_gate_plan)
