"""A sweep as an AWS Step Functions state machine (docs/sweeps.md): OpenSweep, then a Map state over the candidates
(`MaxConcurrency`: the sweep's `parallel`, the number the cost bound was checked at), then PickCandidate, and, when
the execution's input says `{"release_pick": true}`, ReleasePick: the pick's own release in one task, as
`shiplift sweep run --release-pick` and the Airflow sweep DAG's `release_pick` task run it. Each iteration's wait for
its candidate's endpoint holds no container, as the release machine's deferred stages (`deferred_states`): a start
task (the stages before the one the policy table defers, and that stage's start), a Wait/Choice loop around a short
poll task that publishes its answer to S3, then the evaluate task (the rest, the teardown, the evidence); when a task
fails or dies, one that tears the candidate down.

The tasks are the release machine's (`step_functions._Renderer.ecs_task`: the pipeline image on ECS, its token reported
with `reporting_to_step_functions`, Retry from the errors' `retryable` and the table's backoff, Catch, heartbeats), and
they run `python -m shiplift.tasks.orchestrators.step_functions_map open|start|poll|evaluate|teardown|pick|release-pick
SWEEP …`,
the calls of `shiplift.tasks.sweeps.orchestrated`, which are idempotent. The candidates are rendered into the
definition (the Map reads them from the Prepare state's output) and OpenSweep refuses a sweep file whose candidates have
changed since.
A candidate that fails is recorded in the ledger and its iteration ends; the others go on, and PickCandidate then
fails (SweepIncomplete) until a rerun has evidence for every candidate, as `shiplift sweep run` does. `render SWEEP
--runner FILE` prints the machine's ASL.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from shiplift.tasks.errors import ConfigError
from shiplift.tasks.orchestrators.step_functions import (
    POLL_TASK_S,
    READ_GATE,
    S3_GET_OBJECT,
    _catch,
    _fail,
    _Renderer,
    _retry,
    _retry_rule,
    _table_retry,
    check_image_path,
    definition_json,
    load_runner_settings,
    require_shared_ledger,
)
from shiplift.tasks.orchestrators.step_functions_runner import RunnerSettings
from shiplift.tasks.orchestrators.step_functions_tasks import (
    MAX_STATE_MACHINE_NAME,
    publish_stage_result,
    results_bucket,
)
from shiplift.tasks.orchestrators.task_token import HEARTBEAT_TIMEOUT, reporting_to_step_functions
from shiplift.tasks.pipeline.table import BEGIN, MAX_STEP_TIMEOUT_S, STEPS, TEARDOWN
from shiplift.tasks.sweeps import orchestrated
from shiplift.tasks.sweeps.config import Sweep, load_sweep
from shiplift.tasks.sweeps.policy import EVALUATE_RETRIES

MODULE = "shiplift.tasks.orchestrators.step_functions_map"
ACTIONS = ("open", "start", "poll", "evaluate", "teardown", "pick", "release-pick", "render")
MAP_STATE, EVALUATE_STATE, TEARDOWN_STATE = "EvaluateCandidates", "EvaluateCandidate", "TeardownCandidate"
START_STATE, POLL_STATE, READ_POLL_STATE = "StartCandidate", "PollCandidate", "ReadCandidatePoll"
DEPLOYED_STATE, WAIT_STATE = "CandidateDeployed", "WaitForCandidate"
NOT_EVALUATED_STATE, EVALUATED_STATE = "CandidateNotEvaluated", "CandidateEvaluated"
FAILED_STATE, INCOMPLETE_STATE = "SweepFailed", "SweepIncomplete"
CHECK_INPUT_STATE, INPUT_INVALID_STATE = "CheckInput", "InputInvalid"
RELEASE_ASKED_STATE, RELEASE_STATE = "ReleasePickAsked", "ReleasePick"
RELEASED_STATE, RELEASE_FAILED_STATE = "PickReleased", "PickReleaseFailed"
RELEASE_PICK = "$.input.release_pick"  # the execution's input, as Prepare keeps it: {"release_pick": true} releases


def sweep_machine_name(sweep: Sweep) -> str:
    """`<resource_prefix>-<sweep name>-sweep`: one state machine per sweep, at most 80 characters."""
    name = f"{sweep.base.resource_prefix}-{sweep.config.name}-sweep"
    if len(name) > MAX_STATE_MACHINE_NAME:
        raise ConfigError(f"state machine name {name!r} is {len(name)} characters, Step Functions allows "
                          f"{MAX_STATE_MACHINE_NAME}", fix="shorten the sweep's name or the base's resource_prefix")
    return name


def sweep_command(action: str, sweep_path: str, holder: str, *extra: str) -> list[str]:
    """argv of one of the sweep machine's tasks."""
    return ["python", "-m", MODULE, action, sweep_path, "--holder", holder, *extra]


def poll_prefix(sweep: Sweep, runner: RunnerSettings) -> tuple[str, str]:
    """(bucket, key prefix) under which a candidate's poll task publishes its answer, `PREFIX/<candidate>-<stage>.json`:
    the results bucket, under the base model's name as the machine's role may read it."""
    return results_bucket(sweep.base, runner), f"{runner.result_prefix}/{sweep.base.name}-{sweep.sweep_id}"


def poll_key(prefix: str, candidate: str, stage: str) -> str:
    """The key of one candidate's poll answer under `poll_prefix`."""
    return f"{prefix}/{candidate}-{stage}.json"


def render_sweep_machine(sweep: Sweep, *, runner: RunnerSettings, sweep_path: str) -> dict:
    """The sweep as ASL (a dict). `sweep_path` is the sweep file inside the pipeline image, relative to its working
    directory (e.g. `configs/sweeps/gemma-decision-quant.yaml`); the base config's ledger must be one every task
    reaches."""
    check_image_path(sweep_path, "configs/sweeps/NAME.yaml")
    require_shared_ledger(sweep.base)
    sweep_machine_name(sweep)
    render = _Renderer(sweep.base, runner, sweep.sweep_id, sweep_path)
    holder, candidate = render.HOLDER, render.CANDIDATE
    evaluate_s = orchestrated.evaluation_timeout_s(sweep)

    opened = render.ecs_task(BEGIN.name, sweep_command("open", sweep_path, holder, "--sweep-id", sweep.sweep_id,
                                                       "--allowed-timeout-s", str(evaluate_s)),
                             timeout_s=render.stage_timeout(BEGIN.name), next_state=MAP_STATE,
                             catch=_catch(FAILED_STATE))
    evaluate = render.ecs_task(BEGIN.name, sweep_command("evaluate", sweep_path, holder, "--candidate", candidate),
                               timeout_s=evaluate_s + runner.startup_allowance_s, next_state=EVALUATED_STATE,
                               catch=_catch(TEARDOWN_STATE))
    evaluate["Retry"] = _retry(BEGIN.name, retries=EVALUATE_RETRIES)
    waiting = candidate_wait_states(render, sweep, sweep_path, evaluate_s)
    teardown = render.ecs_task(TEARDOWN, sweep_command("teardown", sweep_path, holder, "--candidate", candidate),
                               timeout_s=render.stage_timeout(TEARDOWN), next_state=NOT_EVALUATED_STATE,
                               catch=_catch(NOT_EVALUATED_STATE, "$.teardown_error"))
    pick = render.ecs_task(BEGIN.name, sweep_command("pick", sweep_path, holder),
                           timeout_s=render.stage_timeout(BEGIN.name), next_state=RELEASE_ASKED_STATE,
                           catch=_catch(INCOMPLETE_STATE))
    # a container that never ran or died is tried again; NotReady (a candidate without evidence) is the answer
    pick["Retry"] = [*_retry(BEGIN.name, retries=0), *_retry_rule(BEGIN.retries, [HEARTBEAT_TIMEOUT])]
    iteration = {
        "ProcessorConfig": {"Mode": "INLINE"},
        "StartAt": START_STATE,
        "States": {
            **waiting,
            EVALUATE_STATE: evaluate,
            EVALUATED_STATE: {"Type": "Succeed", "Comment": "evidence recorded, candidate torn down"},
            TEARDOWN_STATE: teardown,
            NOT_EVALUATED_STATE: {"Type": "Pass", "End": True,
                                  "Comment": "the failure is in the ledger (sweep/failed) and the candidate torn down; "
                                             "the other candidates go on, and PickCandidate waits for a rerun"},
        },
    }
    states = {
        "Prepare": {"Type": "Pass", "Comment": "the execution is the actor; the candidates as rendered; its input kept",
                    "Parameters": {"run": {"holder.$": "States.Format('stepfunctions:{}', $$.Execution.Id)",
                                           "sweep_id": sweep.sweep_id},
                                   "candidates": [c.name for c in sweep.candidates], "input.$": "$"},
                    "Next": CHECK_INPUT_STATE},
        CHECK_INPUT_STATE: {"Type": "Choice", "Comment": "release_pick, where the input sets it, is true or false",
                            "Choices": [{"And": [{"Variable": RELEASE_PICK, "IsPresent": True},
                                                 {"Not": {"Variable": RELEASE_PICK, "IsBoolean": True}}],
                                         "Next": INPUT_INVALID_STATE}],
                            "Default": "OpenSweep"},
        INPUT_INVALID_STATE: {"Type": "Fail", "Error": "Shiplift.InputInvalid",
                              "Cause": 'the execution input\'s release_pick must be true or false (e.g. '
                                       '{"release_pick": true}); nothing was run'},
        "OpenSweep": opened,
        MAP_STATE: {"Type": "Map", "Comment": f"every candidate, at most {sweep.config.parallel} at once",
                    "ItemsPath": "$.candidates",
                    "ItemSelector": {"candidate.$": "$$.Map.Item.Value", "run.$": "$.run"},
                    "MaxConcurrency": sweep.config.parallel, "ItemProcessor": iteration, "ResultPath": None,
                    "Catch": _catch(FAILED_STATE), "Next": "PickCandidate"},
        "PickCandidate": pick,
        **release_pick_states(render, sweep_path),
        "Swept": {"Type": "Succeed"},
        FAILED_STATE: _fail("Shiplift.SweepFailed", "the sweep could not open or run its candidates"),
        INCOMPLETE_STATE: _fail("Shiplift.SweepIncomplete", "nothing picked: a candidate has no evidence (its failure "
                                "is in the ledger); run the sweep again: candidates with evidence are not evaluated "
                                "again"),
    }
    return {"Comment": f"shiplift sweep {sweep.sweep_id}: {len(sweep.candidates)} candidates of "
                       f"{sweep.base.name}, {sweep.config.parallel} at once, then the pick and, with input "
                       f"{{\"release_pick\": true}}, its release (runner ECS "
                       f"{runner.launch_type}, image {runner.pipeline_image})",
            "StartAt": "Prepare", "States": states}


def candidate_wait_states(render: _Renderer, sweep: Sweep, sweep_path: str, evaluate_s: int) -> dict[str, dict]:
    """A candidate's wait for its endpoint as a loop around a short poll, not a container that waits.
    StartCandidate (`start_candidate_orchestrated`: the stages before the one the table defers, and its start, under
    the candidate's lease, kept for the loop) exits; PollCandidate (`poll_candidate_orchestrated`, renewing that lease)
    publishes `{done, status, left_s, candidate}` to S3, which ReadCandidatePoll reads for the CandidateDeployed Choice:
    done goes to EvaluateCandidate (the rest, as `evaluate_orchestrated` runs it), else Wait the table's `every_s` and
    poll again. A candidate with evidence, or whose deploy is done, is done at the first poll. A failed poll tears the
    candidate down and records the failure in its own task, then fails to TeardownCandidate; the poll is retried only
    when its container never ran or stopped heartbeating."""
    holder, candidate = render.HOLDER, render.CANDIDATE
    stage = orchestrated.deferred_stage()
    bucket, prefix = poll_prefix(sweep, render.runner)
    fail = _catch(TEARDOWN_STATE)
    start = render.ecs_task(BEGIN.name, sweep_command("start", sweep_path, holder, "--candidate", candidate),
                            timeout_s=evaluate_s + render.runner.startup_allowance_s, next_state=POLL_STATE,
                            catch=fail)
    start["Retry"] = _retry(BEGIN.name, retries=EVALUATE_RETRIES)
    polled = render.ecs_task(stage, sweep_command("poll", sweep_path, holder, "--candidate", candidate,
                                                  "--result-prefix", f"s3://{bucket}/{prefix}"),
                             timeout_s=POLL_TASK_S + render.runner.startup_allowance_s, next_state=READ_POLL_STATE,
                             catch=fail)
    polled["Retry"] = [*_retry(stage)[:1], *_table_retry(stage, [HEARTBEAT_TIMEOUT])]
    answer, every_s = f"$.polls.{stage}.envelope.result", STEPS[stage].defers.every_s
    return {
        START_STATE: start,
        POLL_STATE: polled,
        READ_POLL_STATE: {"Type": "Task", "Comment": f"the poll task published its answer under s3://{bucket}/{prefix}",
                          "Resource": S3_GET_OBJECT,
                          "Parameters": {"Bucket": bucket,
                                         "Key.$": f"States.Format('{poll_key(prefix, '{}', stage)}', $.candidate)"},
                          "ResultSelector": {"envelope.$": "States.StringToJson($.Body)"},
                          "ResultPath": f"$.polls.{stage}", "TimeoutSeconds": READ_GATE.timeout_s,
                          "Retry": _table_retry(READ_GATE.name, ["States.TaskFailed"]), "Catch": fail,
                          "Next": DEPLOYED_STATE},
        DEPLOYED_STATE: {"Type": "Choice", "Comment": f"{stage} in service: evaluate; else wait and poll again",
                         "Choices": [{"And": [{"Variable": f"{answer}.candidate", "IsPresent": True},
                                              {"Variable": f"{answer}.candidate", "StringEqualsPath": "$.candidate"},
                                              {"Variable": f"{answer}.done", "IsPresent": True},
                                              {"Variable": f"{answer}.done", "BooleanEquals": True}],
                                      "Next": EVALUATE_STATE}],
                         "Default": WAIT_STATE},
        WAIT_STATE: {"Type": "Wait", "Comment": f"no container waits: the next poll in {every_s} s",
                     "Seconds": every_s, "Next": POLL_STATE},
    }


def poll_and_publish(sweep_path: str, candidate: str, *, holder: str, result_prefix: str) -> dict:
    """The poll task: one `poll_candidate_orchestrated`, its answer published for ReadCandidatePoll; a failed poll
    ends the candidate (`finish_candidate_orchestrated` with the failure: torn down, recorded, its lease given back,
    the failure raised; LeaseHeld, nothing touched, when another run took the candidate over)."""
    stage = orchestrated.deferred_stage()
    try:
        polled = orchestrated.poll_candidate_orchestrated(sweep_path, candidate, stage, actor=holder,
                                                          ledger_url=None, state_dir=None)
    except Exception as exc:
        return orchestrated.finish_candidate_orchestrated(sweep_path, candidate, actor=holder, failure=exc)
    release_id = load_sweep(sweep_path).candidate(candidate).release_id
    publish_stage_result(poll_key(result_prefix, candidate, stage), release_id=release_id, stage=stage,
                         result={**polled, "candidate": candidate})
    return polled


def release_pick_states(render: _Renderer, sweep_path: str) -> dict[str, dict]:
    """After the pick: the Choice on the execution's `release_pick` (absent: false), and ReleasePick, the pick's own
    release in one ECS task as the Airflow sweep DAG's `release_pick` task runs it (`release_pick_orchestrated`: its
    gate on the held-out tasks, an approval where the base requires one, which ends the task while a person decides,
    its rollout). Which candidate is picked is known only then, so its release machine cannot be rendered now; the
    task is bounded as Airflow's: MAX_STEP_TIMEOUT_S (plus the ECS start-up), beating its heartbeat while it runs.
    Its stages retry inside it; the task itself is retried only when its container never ran."""
    released = render.ecs_task(BEGIN.name, sweep_command("release-pick", sweep_path, render.HOLDER),
                               timeout_s=MAX_STEP_TIMEOUT_S + render.runner.startup_allowance_s,
                               next_state=RELEASED_STATE, catch=_catch(RELEASE_FAILED_STATE))
    released["Retry"] = _retry(BEGIN.name, retries=0)
    return {
        RELEASE_ASKED_STATE: {"Type": "Choice", "Comment": "release the pick only when the input says release_pick: "
                                                           "true",
                              "Choices": [{"And": [{"Variable": RELEASE_PICK, "IsPresent": True},
                                                   {"Variable": RELEASE_PICK, "BooleanEquals": True}],
                                           "Next": RELEASE_STATE}],
                              "Default": "Swept"},
        RELEASE_STATE: released,
        RELEASED_STATE: {"Type": "Succeed", "Comment": "the pick's release ran: promoted, rejected or waiting for an "
                                                       "approval, as the ledger says (`shiplift ledger show`); nothing "
                                                       "to release when no candidate met the rule"},
        RELEASE_FAILED_STATE: _fail("Shiplift.PickReleaseFailed", "the pick's release failed; its candidate was torn "
                                    "down and the failure recorded in its own release's records"),
    }


def parser() -> argparse.ArgumentParser:
    """The command line `sweep_command` writes."""
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=ACTIONS, help="open the sweep, evaluate or tear down one candidate, pick, "
                                                   "release the pick; or render the state machine's ASL (JSON, on "
                                                   "stdout)")
    p.add_argument("sweep", help="the sweep file, relative to the image's working directory (render: to this one)")
    p.add_argument("--holder", help="the execution (the ledger's actor); every action but render")
    p.add_argument("--runner", help="render: the runner settings file (docs/step-functions.md)")
    p.add_argument("--candidate", help="start, poll, evaluate, teardown: the candidate's name")
    p.add_argument("--result-prefix", help="poll: s3://BUCKET/PREFIX its answer is published under")
    p.add_argument("--sweep-id", help="open: the sweep the state machine was rendered for")
    p.add_argument("--allowed-timeout-s", type=int, help="open: the evaluate task's TimeoutSeconds")
    return p


def run_step(args: argparse.Namespace) -> dict:
    """One sweep step of the command line, as the calls of `shiplift.tasks.sweeps.orchestrated` run it."""
    if args.action == "open":
        return orchestrated.open_orchestrated(args.sweep, actor=args.holder, sweep_id=args.sweep_id,
                                              allowed_timeout_s=args.allowed_timeout_s)
    if args.action == "start":
        return orchestrated.start_candidate_orchestrated(args.sweep, args.candidate, actor=args.holder)
    if args.action == "poll":
        return poll_and_publish(args.sweep, args.candidate, holder=args.holder, result_prefix=args.result_prefix)
    if args.action == "evaluate":
        return orchestrated.evaluate_orchestrated(args.sweep, args.candidate, actor=args.holder)
    if args.action == "teardown":
        return orchestrated.teardown_orchestrated(args.sweep, args.candidate, actor=args.holder)
    if args.action == "release-pick":
        return orchestrated.release_pick_orchestrated(args.sweep, actor=args.holder)
    return orchestrated.pick_orchestrated(args.sweep, actor=args.holder)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one step of the sweep, reporting to Step Functions when its task token is set."""
    args = parser().parse_args(argv)
    if args.action == "render":
        if not args.runner:
            parser().error("render needs --runner")
        sweep = load_sweep(args.sweep)
        print(definition_json(render_sweep_machine(sweep, runner=load_runner_settings(args.runner),
                                                   sweep_path=args.sweep)))
        return 0
    if not args.holder:
        parser().error(f"{args.action} needs --holder")
    if args.action in ("start", "poll", "evaluate", "teardown") and not args.candidate:
        parser().error(f"{args.action} needs --candidate")
    if args.action == "poll" and not args.result_prefix:
        parser().error("poll needs --result-prefix")

    result = reporting_to_step_functions(lambda: run_step(args))
    print(f"{args.sweep} {args.action}: {json.dumps(result, default=str)[:2000]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
