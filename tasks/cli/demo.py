"""The local release story behind `make demo`.

1. Release Gemma-3-270M Q4_K_M: nothing serves yet, so after its gates it becomes champion.
2. Release it again with a temperature fitted on the calibration split: gated against the
   champion on the same tasks, scored alternately with it (latency judged as the ratio of their
   p95s, so what else runs on the machine slows both), then promoted if it is not worse.
3. Release a broken model (a tiny random GGUF): the gate rejects it and the champion keeps serving.
4. Release the encoder: a MiniLM-L6 NLI head trained here, exported to ONNX (+ int8), parity-checked
   against PyTorch, served by ONNX Runtime and gated on the project's NLI test split.
5. Canary Gemma onto two copies: one new copy beside the champion's, a bake with the online gate (the
   canary set replayed through production) and the bake alarms, then the rest.
6. Canary a Gemma build that refuses the multi-decision requests production clients send (the offline
   gate sends single decisions, so it passes): with production traffic while it rolls out, its
   error-rate alarm fires during the first bake and the rollout is rolled back, the champion still
   serving.
7. Roll Gemma out linearly onto three copies, under change control: the passed candidate waits for a person, the
   demo approves it from the CLI as `demo-approver` (`shiplift approve`), then one copy at a time, a bake after each.
8. Release Gemma through the DLC's OpenAI-compatible chat path (a second model slot).
9-10. Release Gemma and the NLI encoder onto one shared CPU endpoint (`placement.endpoint: demo-cpu`): each is its own
   inference component with its own gate; `shiplift fleet plan` shows the layout and each one's share of the bill.
   The encoder scales to zero (`scale_to_zero`): its gate times three starts from no copy to the first answer, and
   at the end of the story its idle production copy is gone and the first request brings one back, answered.
Each release ends with a signed checkpoint of the ledger's head (an Ed25519 key outside the state dir).
Then verify the ledger against its checkpoints, write the audit report, show each canary's traffic steps
from the ledger, ask the production endpoint one real question, print a summary, and end with `shiplift status`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

from shiplift.tasks.backends.local.artifact_store import LocalArtifactStore
from shiplift.tasks.backends.local.hosting import LoopbackHosting
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor
from shiplift.tasks.backends.registry import ledger_url_for, open_ledger
from shiplift.tasks.cli.main import main as shiplift
from shiplift.tasks.config import load_release_config
from shiplift.tasks.console import format_table
from shiplift.tasks.ledger.audit_report import write_report
from shiplift.tasks.ledger.events import AWAITING_APPROVAL, STAGES
from shiplift.tasks.ledger.release_state import ReleaseState, release_summary
from shiplift.tasks.ledger.store import Ledger
from shiplift.tasks.ledger.views import rollout_steps
from shiplift.tasks.pipeline.audit import verify_ledger
from shiplift.tasks.pipeline.release import begin_orchestrated, end_orchestrated, run_orchestrated_stage, run_release
from shiplift.tasks.pipeline.table import TEARDOWN
from shiplift.tasks.project import DEMO_STATE_DIR
from shiplift.tasks.project import PROJECT_ROOT as ROOT
from shiplift.validation.cold_start import first_answer
from shiplift.validation.transport import HttpInvoker, post_alone

CONFIG = ROOT / "configs" / "releases" / "gemma-decision.yaml"
BROKEN = ROOT / "configs" / "releases" / "demo-broken-model.yaml"
ENCODER = ROOT / "configs" / "releases" / "minilm-nli.yaml"
CHAT = ROOT / "configs" / "releases" / "gemma-chat.yaml"
CANARY = ROOT / "configs" / "releases" / "gemma-decision-canary.yaml"
LINEAR = ROOT / "configs" / "releases" / "gemma-decision-linear.yaml"
SHARED = (ROOT / "configs" / "releases" / "gemma-decision-shared.yaml",
          ROOT / "configs" / "releases" / "minilm-nli-shared.yaml")
DEMO_APPROVER = "demo-approver"
# change control (promotion.approval): a person the config names approves the passed candidate before production; four
# eyes (the default) refuse an approval by whoever opened the release, here the demo's own user
APPROVAL = ("promotion.approval.required=true", f"promotion.approval.approvers=[{DEMO_APPROVER}]")
FITTED = ("calibration.fit_temperature=true",)
ONLINE_GATE = ("rollout.online_gate.split=test", "rollout.online_gate.max_tasks=32", "rollout.online_gate.rounds=8")
STEPS = (  # label, config, overrides, live traffic of multi-decision requests during the release
    ("1. first release", CONFIG, (), False),
    ("2. fitted temperature", CONFIG, FITTED, False),
    ("3. broken model", BROKEN, (), False),
    ("4. NLI encoder", ENCODER, (), False),
    ("5. canary", CANARY, ONLINE_GATE, False),
    ("6. canary, fails live", CANARY, ("image.max_shared_decisions=1",), True),
    ("7. approved, linear", LINEAR, APPROVAL, False),
    ("8. the DLC's chat path", CHAT, (), False),
    ("9. shared endpoint: Gemma", SHARED[0], (), False),
    ("10. shared endpoint: encoder", SHARED[1], (), False),
)
EXPECTED = ["promoted", "promoted", "rejected", "promoted", "promoted", "rolled_back", "promoted", "promoted",
            "promoted", "promoted"]


def shared_decisions(count: int = 2) -> bytes:
    """`count` decisions on one state in one `decisions` request, as a production client batches them."""
    options = [{"id": "no", "description": "no"}, {"id": "yes", "description": "yes"}]
    return json.dumps({"decisions": [{"id": f"q{i}", "state": "The sky is blue.", "question": "Is the sky blue?",
                                      "options": options} for i in range(count)]}).encode()


class BackgroundTraffic:
    """Requests from a background thread, one after another, counting the outcome `send` names for each (a status,
    an error code), until the block ends."""

    def __init__(self, send: Callable[[], object], join_timeout_s: float = 60):
        self.send, self.join_timeout_s = send, join_timeout_s
        self.stop, self.statuses = threading.Event(), Counter()
        self.thread = threading.Thread(target=self._run, name="live-traffic", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.statuses[self.send()] += 1

    def __enter__(self) -> BackgroundTraffic:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.stop.set()
        self.thread.join(timeout=self.join_timeout_s)


class LiveTraffic(BackgroundTraffic):
    """Production traffic over HTTP: multi-decision requests (or `body`) to one component of a local endpoint (its
    `…/endpoints/NAME` URL), each retried as every shiplift client retries (no capacity, throttling) for up to
    `timeout_s`."""

    def __init__(self, url: str, component: str, body: bytes | None = None, timeout_s: float = 30):
        invoker = HttpInvoker(url, component, runtime=True)
        super().__init__(partial(_invoke_component, invoker, body or shared_decisions(), timeout_s),
                         join_timeout_s=timeout_s * 2)


def _invoke_component(invoker, body: bytes, timeout_s: float) -> int | str:
    """POST one invocation under the clients' retry policy (no capacity, throttling and busy answers retried; a
    model's own error is its answer, not tried again), within `timeout_s` in all; the status the endpoint sent last,
    or "transport" when no answer came."""
    _, status = post_alone(invoker, body, timeout_s=timeout_s, deadline_s=timeout_s, error_retries=0)
    return "transport" if status is None else status


def banner(text: str) -> None:
    print(f"\n=== {text} ===", file=sys.stderr, flush=True)


def fresh_state_dir() -> Path:
    """The demo always starts from nothing: stop what an earlier demo left running and wipe its state."""
    state_dir = Path(os.environ.get("SHIPLIFT_HOME", DEMO_STATE_DIR)).resolve()
    if state_dir.exists():
        hosting = ProcessSupervisor(state_dir)
        for endpoint in hosting.list_endpoints():
            hosting.delete_endpoint(endpoint["name"])
        shutil.rmtree(state_dir)
    state_dir.mkdir(parents=True)
    os.environ["SHIPLIFT_HOME"] = str(state_dir)
    return state_dir


def ask_production(state_dir: Path, summary: dict) -> dict:
    """One real decision through the production endpoint with an unmodified boto3 runtime client."""
    import boto3
    from botocore.config import Config

    url = ProcessSupervisor(state_dir).endpoint_url(summary["served_by"])
    base, _, name = url.rpartition("/endpoints/")
    client = boto3.client(
        "sagemaker-runtime", endpoint_url=base, region_name="us-east-1", aws_access_key_id="local",
        aws_secret_access_key="local", config=Config(read_timeout=60, connect_timeout=5, retries={"max_attempts": 1}),
    )
    decision = {
        "id": "demo-question",
        "state": "Customer: my parcel arrived with the screen cracked.",
        "question": "What does the customer report?",
        "options": [
            {"id": "damage", "description": "a damaged item"},
            {"id": "late", "description": "a late delivery"},
            {"id": "billing", "description": "a billing problem"},
        ],
    }
    response = client.invoke_endpoint(
        EndpointName=name, InferenceComponentName=summary["component"], ContentType="application/json",
        Body=json.dumps({"decision": decision}),
    )
    result = json.loads(response["Body"].read())["result"]
    return {k: result[k] for k in ("option_ids", "probabilities", "temperature")} | {"model": result["model"]["file"]}


def approve_as_demo_approver(state_dir: Path, summary: dict) -> dict:
    """Show the release waiting in `shiplift status`, then approve it from the CLI as the config's approver; the
    release continues to production. Returns its summary after promote."""
    release = summary["release_id"]
    banner(f"{release} awaits approval: shiplift status --state-dir {state_dir}")
    shiplift(["status", "--state-dir", str(state_dir)])
    banner("shiplift fleet plan: the two models on the shared endpoint demo-cpu, and each one's share of its bill")
    shiplift(["fleet", "plan", *map(str, SHARED), "--state-dir", str(state_dir)])
    banner(f"SHIPLIFT_ACTOR={DEMO_APPROVER} shiplift approve {release} --reason ...")
    opener = os.environ.get("SHIPLIFT_ACTOR")
    os.environ["SHIPLIFT_ACTOR"] = DEMO_APPROVER
    try:
        shiplift(["approve", release, "--reason", "demo: gate report read, rollout onto three copies approved",
                  "--state-dir", str(state_dir)])
    finally:
        os.environ.pop("SHIPLIFT_ACTOR") if opener is None else os.environ.update(SHIPLIFT_ACTOR=opener)
    ledger = open_ledger(state_dir=state_dir, read_only=True)
    try:
        return release_summary(ReleaseState.load(ledger, release))
    finally:
        ledger.close()


def wake_after_idle(state_dir: Path, endpoint: str, component: str) -> None:
    """Scale to zero seen from a client: wait until the idle component has no copy, then time one request from its
    first no-capacity answer to its answer (retried as the gate retries; nothing is lost)."""
    config = load_release_config(SHARED[1])
    banner(f"scale to zero: {component} idles for {config.scale_to_zero.idle_s}s, then one request wakes it")
    supervisor = ProcessSupervisor(state_dir)

    def copies() -> list:
        return supervisor.describe_endpoint(endpoint)["components"][component]["copies"]

    deadline = time.monotonic() + config.scale_to_zero.idle_s + 60
    while copies():
        if time.monotonic() > deadline:
            print(f"{component} still has copies {config.scale_to_zero.idle_s + 60}s after it was last asked; see "
                  f"{supervisor.describe_endpoint(endpoint)['router']['log']}", file=sys.stderr, flush=True)
            return
        time.sleep(1)
    request = config.family.invocation_bodies(config.validation, config.validation.dataset_paths(SHARED[1].parent))[0]
    start = first_answer(HttpInvoker(supervisor.endpoint_url(endpoint), component, runtime=True), request,
                         timeout_s=30, deadline_s=2 * config.scale_to_zero.max_cold_start_p95_s)
    print(json.dumps({"component": component, "copies_before": 0, "answered": start.error is None,
                      "seconds_to_answer": round(start.seconds, 2), "attempts": start.attempts,
                      "copies_after": len(copies())}),
          flush=True)


def fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def release_under_traffic(config: Path, overrides: tuple[str, ...], state_dir: Path, production: tuple[str, str],
                          label: str) -> dict:
    """A release stage by stage, as the refresh DAG runs it, with production traffic while promote rolls out (only
    then: on two cores, traffic during calibration and the gate would be measured as the candidate's latency)."""
    begun = begin_orchestrated(config, holder="demo", overrides=overrides)

    def run(name: str) -> dict:
        return run_orchestrated_stage(begun["release_id"], name, ledger_url=begun["ledger_url"])

    failed = True
    try:
        for name in STAGES[:-1]:
            if name != "promote":
                run(name)
                continue
            with LiveTraffic(ProcessSupervisor(state_dir).endpoint_url(production[0]), production[1]) as live:
                run(name)
            print(f"{label}: production traffic during promote got {dict(live.statuses)} (200: answered; "
                  "424: the model refused; 503: still busy after each request's retries)", file=sys.stderr, flush=True)
        failed = False
    finally:
        run(TEARDOWN)
        summary = end_orchestrated(begun["release_id"], holder="demo", failed=failed, ledger_url=begun["ledger_url"])
    return summary


def rollout_cell(summary: dict) -> str:
    """How the release reached production: its strategy and traffic steps, or why it was rolled back."""
    rollout = summary.get("rollout") or {}
    if not rollout.get("strategy"):
        return "-"
    steps = f", {rollout['steps']} steps" if rollout["steps"] else ""
    return f"{rollout['strategy']}{steps}" + (" (rolled back)" if summary["status"] == "rolled_back" else "")


def summary_table(rows: list[tuple[str, dict]], serving_after: list[str]) -> str:
    columns = ["step", "release", "quant", "T", "accuracy", "ECE", "p95 ms", "gate", "rollout", "status",
               "serving after", "checks not passed"]
    lines = []
    for (label, s), serving in zip(rows, serving_after, strict=True):
        m = s.get("metrics") or {}
        lines.append(dict(zip(columns, (
            label, s["release_id"], s.get("file_type") or "-", fmt(s.get("temperature"), ".2f"),
            fmt(m.get("accuracy")), fmt(m.get("ece")), fmt(m.get("p95_ms"), ".0f"),
            s.get("decision") or "-", rollout_cell(s), s["status"], serving,
            "; ".join(s.get("not_passed") or []) or "-",
        ), strict=True)))
    return format_table(lines, columns)


def serving_release(state_dir: Path, production: tuple[str, str] | None) -> str:
    """The release the production component reports right now (read live through the typed describe, not the ledger)."""
    if not production:
        return "(nothing)"
    live = LoopbackHosting(state_dir, LocalArtifactStore(state_dir / "artifacts")).describe(*production)
    return live.model_ref.release_id if live and live.model_ref else "(nothing)"


def traffic_steps_table(ledger, release_id: str) -> str:
    """A release's traffic steps as the ledger recorded them, each with its bake's verdict: batch, copies of each spec,
    alarm states, gate."""
    columns = ["phase", "batch", "old copies", "new copies", "alarms", "online gate", "alarm"]
    rows = []
    for step in rollout_steps(ledger.release(release_id)):
        gate = step.get("online_gate") or {}
        states = ", ".join(f"{name} {state}" for name, state in sorted((step.get("alarm_states") or {}).items())) or "-"
        rows.append(dict(zip(columns, (
            step["phase"], f"{step['batch']}/{step['batches']}", step["old_copies"], step["new_copies"], states,
            f"{gate['decision']} on {gate['candidate_answers']} answers" if gate else "-",
            (step.get("alarm") or "-")[:90]), strict=True)))
    return format_table(rows, columns)


def release_step(label: str, config: Path, overrides: tuple[str, ...], traffic: bool, state_dir: Path,
                 production: dict[str, tuple[str, str]]) -> dict:
    """One step's release, under production traffic when the step asks for it and a Gemma champion serves, approved
    as the demo's approver when its config waits for one; its summary."""
    banner(f"{label}: shiplift release {config.relative_to(ROOT)}" + "".join(f" --set {o}" for o in overrides))
    if traffic and "gemma-decision" in production:
        summary = release_under_traffic(config, overrides, state_dir, production["gemma-decision"], label)
    else:
        if traffic:  # the story needs a champion to canary against; the summary says which gate checks failed
            print(f"{label}: no Gemma release serves yet (none above was promoted), so this one runs without "
                  "production traffic and is no canary", file=sys.stderr, flush=True)
        summary = run_release(config, overrides=overrides)
    if summary["status"] == AWAITING_APPROVAL:
        summary = approve_as_demo_approver(state_dir, summary)
    return summary


def main() -> int:
    state_dir = fresh_state_dir()
    banner(f"shiplift local release demo (state in {state_dir})")
    rows, serving_after, production = [], [], {}
    for label, config, overrides, traffic in STEPS:
        summary = release_step(label, config, overrides, traffic, state_dir, production)
        rows.append((label, summary))
        if summary["served_by"] and summary["model"] not in production:
            production[summary["model"]] = (summary["served_by"], summary["component"])
        serving_after.append(serving_release(state_dir, production.get(summary["model"])))
        print(f"{label}: {summary['status']} ({summary['decision']}); report {summary['report']}",
              file=sys.stderr, flush=True)

    banner("ledger verify: the hash chain, and that it extends every signed checkpoint")
    ledger = Ledger(ledger_url_for(state_dir, None))
    verdict = verify_ledger(ledger, state_dir)
    latest = verdict["checked_against"] or {}
    print(json.dumps({"ok": verdict["ok"], "n_records": verdict["n_records"], "head_hash": verdict["head_hash"],
                      "checkpoints": verdict["checkpoints"], "latest_checkpoint_seq": latest.get("seq"),
                      "key_id": verdict.get("key_id"), "problems": verdict["problems"]}), flush=True)
    report = write_report(ledger, state_dir / "audit-report", verdict)
    print(f"audit report: {report}", flush=True)
    for label, summary in rows:
        if (summary.get("rollout") or {}).get("steps"):
            banner(f"{label}: traffic steps in the ledger ({summary['release_id']}, {summary['status']})")
            print(traffic_steps_table(ledger, summary["release_id"]), flush=True)

    banner("summary")
    print(summary_table(rows, serving_after), flush=True)
    promoted = [s for _, s in rows if s["status"] == "promoted" and s["model"] == "gemma-decision"]
    champion = promoted[-1] if promoted else None
    if champion is None:
        print("\nNo Gemma release was promoted, so there is no champion to ask; the table says which checks failed "
              "(README, \"Demo thresholds\").", flush=True)
        return 1
    banner(f"asking the production endpoint {champion['served_by']} one question (boto3 sagemaker-runtime)")
    print(json.dumps(ask_production(state_dir, champion)), flush=True)
    banner(f"shiplift status --state-dir {state_dir}: what serves now")
    shiplift(["status", "--state-dir", str(state_dir)])
    banner("shiplift fleet plan: the two models on the shared endpoint demo-cpu, and each one's share of its bill")
    shiplift(["fleet", "plan", *map(str, SHARED), "--state-dir", str(state_dir)])
    if "minilm-nli-shared" in production:
        wake_after_idle(state_dir, *production["minilm-nli-shared"])
    print(
        f"\nThe champion keeps serving at {champion['served_by']}. Inspect: .venv/bin/shiplift status --state-dir "
        f"{state_dir} · .venv/bin/shiplift ledger history --state-dir {state_dir} (or timeline gemma-decision, "
        f"as-of gemma-decision now, diff A B) · audit report: "
        f"{report} · stop: make stop SHIPLIFT_HOME={state_dir}",
        flush=True,
    )
    problems = departures(rows, verdict)
    for problem in problems:
        print(f"\n{problem}", file=sys.stderr, flush=True)
    return 1 if problems else 0


def departures(rows: list[tuple[str, dict]], verdict: dict) -> list[str]:
    """Where the demo did not go as designed (a step's outcome other than EXPECTED, a ledger that did not verify), each
    said with where to look; empty when it went as designed."""
    said = [f"The demo did not go as designed: {label} ended {summary['status']}, not {expected} (its \"checks not "
            "passed\" column says why; latency is judged against the champion measured beside it and against an SLO "
            "set for a busy 2-core machine: README, \"Demo thresholds\")." for (label, summary), expected
            in zip(rows, EXPECTED, strict=True) if summary["status"] != expected]
    return said + ([] if verdict["ok"] else [f"The ledger did not verify: {verdict['problems']}"])


if __name__ == "__main__":
    sys.exit(main())
