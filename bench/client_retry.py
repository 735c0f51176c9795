"""Issue 44's figure: how many tasks `shiplift eval jevbench` loses against a component at zero copies.

    .venv/bin/python -m bench.client_retry [--tasks 32] [--retry-deadline SECONDS]

A local endpoint serves a tiny SemIf model (a generated GGUF, no download) as a component that scales to zero, scaled
in to zero copies; the eval command, run as a separate process exactly as a person runs it, then scores the first
`--tasks` test tasks of the project's decision set through the endpoint's runtime URL (`…/endpoints/NAME`) and
through the router's root (the container route). Prints one JSON line per URL: the command's exit code, the tasks
scored, failed and lost, the first error, and the command's last line on stderr.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.backends.interfaces import ScaleToZeroPlan
from shiplift.tasks.backends.local.hosting import process_spec
from shiplift.tasks.backends.local.supervisor import ProcessSupervisor

ROOT = Path(__file__).resolve().parent.parent
DECISIONS = ROOT / "validation" / "data" / "decisions.jsonl"


def measure(tasks: int, retry_deadline_s: float | None) -> list[dict]:
    """Both URLs of one endpoint whose component is at zero copies when each eval starts."""
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-client-retry-") as tmp_dir:
        tmp = Path(tmp_dir)
        write_tiny_gguf(tmp / "model" / "model.gguf", seed=0)
        test = [line for line in DECISIONS.read_text(encoding="utf-8").splitlines()
                if json.loads(line)["split"] == "test"]
        (tmp / "tasks.jsonl").write_text("\n".join(test[:tasks]) + "\n", encoding="utf-8")
        hosting = ProcessSupervisor(tmp / "state", stop_grace_s=3)
        spec = process_spec("semif", tmp / "model", {"SEMIF_THREADS": "1", "SEMIF_MAX_TOKENS": "2048"}, copies=1,
                            model_ref={"bench": "client retry"})
        try:
            info = hosting.ensure_endpoint("bench-zero")
            hosting.put_component("bench-zero", "semif", spec, ready_timeout_s=120)
            hosting.set_scaling("bench-zero", "semif",
                                ScaleToZeroPlan(max_copies=1, idle_s=3600, invocations_per_copy=1))
            for route, url in (("runtime", info.url), ("router root", info.url.rsplit("/endpoints/", 1)[0])):
                hosting.scale("bench-zero", "semif", 0)
                out = tmp / route.replace(" ", "-")
                command = [sys.executable, "-m", "shiplift.tasks.cli.main", "eval", "jevbench", "--endpoint", url,
                           "--component",
                           "semif", "--data", str(tmp / "tasks.jsonl"), "--out", str(out), "--json"]
                if retry_deadline_s is not None:
                    command += ["--retry-deadline", str(retry_deadline_s)]
                done = subprocess.run(command, capture_output=True, text=True, timeout=3600, cwd=ROOT)
                rows = [json.loads(line)
                        for line in (out / "predictions.jsonl").read_text(encoding="utf-8").splitlines()]
                errors = [row["error"] for row in rows if row["error"]]
                results.append({"url": route, "exit": done.returncode, "tasks": len(rows), "failed": len(errors),
                                "lost": sum(bool(row.get("lost")) for row in rows),
                                "first_error": errors[0][:200] if errors else None,
                                "last_line": (done.stderr.strip().splitlines() or [""])[-1][:400]})
        finally:
            hosting.delete_endpoint("bench-zero")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.client_retry", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=32, help="test tasks of the decision set to score (default 32)")
    parser.add_argument("--retry-deadline", type=float, help="passed to the eval command (default: the command's)")
    args = parser.parse_args(argv)
    for result in measure(args.tasks, args.retry_deadline):
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
