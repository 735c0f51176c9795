"""A deferred stage's two short Task commands in the state machine (the table's `defers`, docs/step-functions.md): the
start, and one poll that publishes `{done, status, left_s}` to S3 for the Choice after it. They run in the pipeline
image as `python -m shiplift.tasks.orchestrators.step_functions_defer start|poll STAGE --release … --ledger-url …
--holder …` and report their outcome with the task token, as `shiplift stage` does; the stage itself, once a poll said
done, is an ordinary `shiplift stage` task that finds the work done and records its result."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from shiplift.tasks.orchestrators.step_functions_tasks import publish_stage_result
from shiplift.tasks.orchestrators.task_token import reporting_to_step_functions
from shiplift.tasks.pipeline.deferred import poll_orchestrated, start_orchestrated
from shiplift.tasks.pipeline.table import STAGES

MODULE = "shiplift.tasks.orchestrators.step_functions_defer"
ACTIONS = ("start", "poll")


def deferred_command(action: str, stage: str, release_id: str, ledger_url: str, holder: str,
                     publish_uri: str | None = None) -> list[str]:
    """argv of a deferred stage's start or poll task (`publish_uri`: where the poll writes its answer)."""
    argv = ["python", "-m", MODULE, action, stage, "--release", release_id, "--ledger-url", ledger_url,
            "--holder", holder]
    return argv + ["--result-uri", publish_uri] if publish_uri else argv


def parser() -> argparse.ArgumentParser:
    """The command line `deferred_command` writes."""
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=ACTIONS, help="start the stage's work, or poll it once")
    p.add_argument("stage", choices=[step.name for step in STAGES if step.defers], help="a stage the table defers")
    p.add_argument("--release", required=True, help="the release id")
    p.add_argument("--ledger-url", required=True, help="the ledger every task shares")
    p.add_argument("--holder", required=True, help="the execution holding the model's lease")
    p.add_argument("--result-uri", help="poll: write the answer to s3://BUCKET/KEY for the state machine's Choice")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run one start or poll, reporting to Step Functions when its task token is set."""
    args = parser().parse_args(argv)

    def run() -> dict:
        step = start_orchestrated if args.action == "start" else poll_orchestrated
        result = step(args.release, args.stage, holder=args.holder, ledger_url=args.ledger_url)
        if args.result_uri:
            publish_stage_result(args.result_uri, release_id=args.release, stage=args.stage, result=result)
        return result

    result = reporting_to_step_functions(run)
    print(f"{args.release} {args.stage} {args.action}: {result}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
