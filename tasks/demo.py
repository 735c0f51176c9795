"""The local release story behind `make demo`.

1. Release Gemma-3-270M Q4_K_M: nothing serves yet, so after its gates it becomes champion.
2. Release it again with a temperature fitted on the calibration split: gated against the
   champion on the same tasks, then promoted if it is not worse.
3. Release a broken model (a tiny random GGUF): the gate rejects it and the champion keeps serving.
4. Release the encoder: a MiniLM-L6 NLI head trained here, exported to ONNX (+ int8), parity-checked
   against PyTorch, served by ONNX Runtime and gated on the project's NLI test split.
Then verify the ledger, ask the production endpoint one real question, and print a summary.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "releases" / "gemma-decision.yaml"
BROKEN = ROOT / "configs" / "releases" / "demo-broken-model.yaml"
ENCODER = ROOT / "configs" / "releases" / "minilm-nli.yaml"
STEPS = (
    ("1. first release", CONFIG, ()),
    ("2. fitted temperature", CONFIG, ("calibration.fit_temperature=true",)),
    ("3. broken model", BROKEN, ()),
    ("4. NLI encoder", ENCODER, ()),
)


def banner(text: str) -> None:
    print(f"\n=== {text} ===", file=sys.stderr, flush=True)


def fresh_state_dir() -> Path:
    """The demo always starts from nothing: stop what an earlier demo left running and wipe its state."""
    from tasks.hosting.local import LocalHosting

    state_dir = Path(os.environ.get("SHIPLIFT_HOME", ROOT / ".shiplift" / "demo")).resolve()
    if state_dir.exists():
        hosting = LocalHosting(state_dir)
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

    from tasks.hosting.local import LocalHosting

    url = LocalHosting(state_dir).endpoint_url(summary["served_by"])
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


def fmt(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def summary_table(rows: list[tuple[str, dict]], serving_after: list[str]) -> str:
    header = ("step", "release", "quant", "T", "accuracy", "ECE", "p95 ms", "gate", "status", "serving after", "checks not passed")
    lines = [header]
    for (label, s), serving in zip(rows, serving_after):
        m = s.get("metrics") or {}
        lines.append((
            label, s["release_id"], s.get("gguf_file_type") or "-", fmt(s.get("temperature"), ".2f"),
            fmt(m.get("accuracy")), fmt(m.get("ece")), fmt(m.get("p95_ms"), ".0f"),
            s.get("decision") or "-", s["status"], serving, "; ".join(s.get("not_passed") or []) or "-",
        ))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
    out = ["  ".join(str(v).ljust(w) for v, w in zip(row, widths)) for row in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def serving_release(state_dir: Path, production: tuple[str, str] | None) -> str:
    """The release the production component reports right now (read live through the typed describe, not the ledger)."""
    from tasks.hosting.loopback import LoopbackHosting
    from tasks.store import LocalArtifactStore

    live = LoopbackHosting(state_dir, LocalArtifactStore(state_dir / "artifacts")).describe(*production) if production else None
    return live.model_ref.release_id if live and live.model_ref else "(nothing)"


def main() -> int:
    from tasks.backends import ledger_url_for
    from tasks.ledger import Ledger
    from tasks.release import run_release

    state_dir = fresh_state_dir()
    banner(f"shiplift local release demo (state in {state_dir})")
    rows, serving_after, production = [], [], {}
    for label, config, overrides in STEPS:
        banner(f"{label}: shiplift release {config.relative_to(ROOT)}" + "".join(f" --set {o}" for o in overrides))
        summary = run_release(config, overrides=overrides)
        rows.append((label, summary))
        if summary["served_by"] and summary["model"] not in production:
            production[summary["model"]] = (summary["served_by"], summary["component"])
        serving_after.append(serving_release(state_dir, production.get(summary["model"])))
        print(f"{label}: {summary['status']} ({summary['decision']}); report {summary['report']}", file=sys.stderr, flush=True)

    banner("ledger verify")
    verdict = Ledger(ledger_url_for(state_dir, None)).verify().to_dict()
    print(json.dumps({k: verdict[k] for k in ("ok", "n_records", "head_hash")}), flush=True)

    banner("summary")
    print(summary_table(rows, serving_after), flush=True)
    champion = next((s for _, s in reversed(rows) if s["status"] == "promoted" and s["model"] == "gemma-decision"), None)
    if champion is None:
        print("\nNo Gemma release was promoted, so there is no champion to ask; the table says which checks failed.", flush=True)
        return 1
    banner(f"asking the production endpoint {champion['served_by']} one question (boto3 sagemaker-runtime)")
    print(json.dumps(ask_production(state_dir, champion)), flush=True)
    print(
        f"\nThe champion keeps serving at {champion['served_by']}. Inspect: .venv/bin/shiplift ledger history "
        f"--state-dir {state_dir} · stop: make stop SHIPLIFT_HOME={state_dir}",
        flush=True,
    )
    expected = ["promoted", "promoted", "rejected", "promoted"]
    return 0 if [s["status"] for _, s in rows] == expected and verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
