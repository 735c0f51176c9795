"""Ledger speed (DESIGN §10): append throughput, `verify`, checkpoints and inclusion proofs at two sizes.

For each backend (a SQLite file in a temporary folder; PostgreSQL in a fresh schema it drops afterwards) the
ledgers of every size are built side by side, appends interleaved, one record per public `Ledger.append` call
(~400-byte stage payloads, 20 records a release), so load on a shared machine drifts equally on every size;
then the reads (`verify`, `verify_with_checkpoints`, `prove`, `check_proof`) alternate between the sizes,
ROUNDS each, and the medians are compared. Targets: append and verify time grow linearly (100k/10k ≈ 10×),
an inclusion proof holds at most ceil(log2 n) hashes a record (+3.3 from 10k to 100k).

    make bench-ledger        # or: python -m bench.ledger [--sizes 10000,100000] [--backends sqlite,postgresql]

Results are in bench/README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.harness import ROUNDS, log
from shiplift.tasks.ledger.checkpoints import (
    LOG_NAME,
    CheckpointLog,
    SigningKey,
    check_proof,
    checkpoint,
    prove,
    verify_with_checkpoints,
)
from shiplift.tasks.ledger.store import Ledger

SIZES = (10_000, 100_000)
BACKENDS = ("sqlite", "postgresql")
PG_URL = os.environ.get("SHIPLIFT_TEST_DATABASE_URL") or "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
PROGRESS_EVERY = 10_000
LINEAR_SLACK = 1.3  # a growth ratio up to 1.3× the size ratio counts as linear
STEPS = [(stage, event) for stage in ("build", "package", "image", "shadow", "eval", "gate", "canary", "promote",
                                      "rollout", "finalize") for event in ("started", "succeeded")]
RECORDS_PER_RELEASE = len(STEPS)


def _hex(i: int, salt: str) -> str:
    return hashlib.sha256(f"{salt}:{i}".encode()).hexdigest()


def stage_record(i: int) -> dict[str, Any]:
    """`Ledger.append`'s arguments for record i: a stage record of release i // 20, about 400 bytes of JSON."""
    release = i // RECORDS_PER_RELEASE
    stage, event = STEPS[i % RECORDS_PER_RELEASE]
    payload = {
        "config_hash": _hex(release, "config"),
        "artifact_sha256": _hex(release, "artifact"),
        "artifact_uri": f"s3://shiplift-artifacts/gemma3-270m/r{release:06d}/model.gguf",
        "image_digest": "sha256:" + _hex(release, "image"),
        "endpoint": "gemma-decision",
        "placement": {"instance_type": "ml.g5.xlarge", "copies": 2},
        "metrics": {"accuracy": round(0.8 + i % 97 / 1000, 3), "p50_ms": 40 + i % 13},
        "decision": "promote" if event == "succeeded" else None,
    }
    return {"release_id": f"r{release:06d}", "model": "gemma3-270m", "stage": stage, "event": event,
            "payload": payload, "actor": "bench"}


@contextmanager
def opened(backend: str, folder: Path, n: int) -> Iterator[Any]:
    """A new, empty ledger for size n: a SQLite file in `folder`, or a PostgreSQL schema dropped afterwards."""
    if backend == "sqlite":
        with Ledger.for_sqlite(folder / f"ledger-{n}.db") as ledger:
            yield ledger
        return

    schema = f"shiplift_bench_{n}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_URL, connect_args={"connect_timeout": 5})
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        try:
            with Ledger(PG_URL, schema=schema) as ledger:
                yield ledger
        finally:
            with admin.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        admin.dispose()


def postgres_unreachable() -> str | None:
    """Why PostgreSQL at PG_URL cannot be used, or None when it can."""
    engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as error:
        return " ".join(str(error.orig).split())
    finally:
        engine.dispose()
    return None


def build(ledgers: dict[int, Any], label: str) -> dict[int, float]:
    """Fill every ledger to its size, interleaving the appends: seconds spent in `append`, by size."""
    biggest = max(ledgers)
    done = dict.fromkeys(ledgers, 0)
    spent = dict.fromkeys(ledgers, 0.0)
    started = time.perf_counter()
    for i in range(1, biggest + 1):
        for n, ledger in ledgers.items():
            while done[n] * biggest < i * n:
                arguments = stage_record(done[n])
                start = time.perf_counter()
                ledger.append(**arguments)
                spent[n] += time.perf_counter() - start
                done[n] += 1
        if i % PROGRESS_EVERY == 0:
            log(f"  {label}: {i:,}/{biggest:,} appended ({i / (time.perf_counter() - started):,.0f} records/s)")
    return spent


def timed(call, *args) -> tuple[float, Any]:
    """(seconds, value) of one `call(*args)`."""
    start = time.perf_counter()
    value = call(*args)
    return time.perf_counter() - start, value


def alternated(ledgers: dict[int, Any], call) -> tuple[dict[int, float], dict[int, Any]]:
    """ROUNDS of `call(n, ledger)` alternating between the sizes: the median seconds and the last value, by size."""
    seconds: dict[int, list[float]] = {n: [] for n in ledgers}
    values: dict[int, Any] = {}
    for _ in range(ROUNDS):
        for n, ledger in ledgers.items():
            elapsed, values[n] = timed(call, n, ledger)
            seconds[n].append(elapsed)
    return {n: statistics.median(s) for n, s in seconds.items()}, values


def measure_backend(backend: str, sizes: tuple[int, ...], folder: Path) -> list[dict[str, Any]]:
    """Every measurement of one backend at every size, one dict a size."""
    key = SigningKey(folder / "keys" / "bench-ed25519.pem", state_dir=folder / "state")
    logs = {n: CheckpointLog(folder / "state" / str(n) / LOG_NAME) for n in sizes}
    with ExitStack() as stack:
        ledgers = {n: stack.enter_context(opened(backend, folder, n)) for n in sizes}
        append_s = build(ledgers, backend)
        log(f"  {backend}: verify, checkpoint, prove")
        verify_s, verified = alternated(ledgers, lambda n, ledger: ledger.verify())
        sign_s = {n: timed(checkpoint, ledger, logs[n], key)[0] for n, ledger in ledgers.items()}
        full_s, full = alternated(ledgers, lambda n, ledger: verify_with_checkpoints(ledger, logs[n], key.public))
        releases = {n: stage_record(n // 2)["release_id"] for n in sizes}
        prove_s, proofs = alternated(ledgers, lambda n, ledger: prove(ledger, logs[n], releases[n], key.public))
        check_s, problems = alternated(ledgers, lambda n, _: check_proof(proofs[n], key.public))
    results = []
    for n in sizes:
        paths = [len(record["path"]) for record in proofs[n]["records"]]
        results.append({
            "backend": backend, "n": n,
            "append_s": append_s[n], "append_per_s": n / append_s[n],
            "verify_s": verify_s[n], "verify_ok": verified[n].ok and verified[n].n_records == n,
            "checkpoint_s": sign_s[n],
            "verify_with_checkpoints_s": full_s[n], "verify_with_checkpoints_ok": full[n]["ok"],
            "prove_s": prove_s[n], "check_proof_s": check_s[n], "proof_ok": not problems[n] and len(paths) > 0,
            "proof_records": len(paths), "proof_hashes_max": max(paths, default=0),
            "proof_hashes_min": min(paths, default=0),
            "proof_bytes": len(json.dumps(proofs[n])), "log2_n": math.log2(n),
        })
    return results


def measure_all(sizes: tuple[int, ...] = SIZES, backends: tuple[str, ...] = BACKENDS) -> dict[str, Any]:
    """Every backend at every size, each in its own temporary folder; PostgreSQL skipped (and said) if unreachable."""
    results, skipped = [], {}
    for backend in backends:
        if backend == "postgresql" and (why := postgres_unreachable()):
            log(f"  PostgreSQL at {PG_URL} is unreachable ({why}): skipping the postgresql backend")
            skipped[backend] = why
            continue
        log(f"ledger on {backend}: {', '.join(f'{n:,}' for n in sizes)} records")
        with tempfile.TemporaryDirectory(prefix="shiplift-bench-ledger-") as folder:
            results.extend(measure_backend(backend, tuple(sorted(sizes)), Path(folder)))
    return {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "machine": machine(), "rounds": ROUNDS,
            "results": results, "skipped": skipped, "growth": growth(results)}


def machine() -> str:
    """The machine in a few words, for the table and the JSON line."""
    return f"{platform.machine()}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}"


def growth(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per backend, the largest size against the smallest: time ratios (linear = the size ratio), proof hash growth."""
    found = []
    for backend in dict.fromkeys(r["backend"] for r in results):
        mine = sorted((r for r in results if r["backend"] == backend), key=lambda r: r["n"])
        small, big = mine[0], mine[-1]
        if small is big:
            continue
        found.append({
            "backend": backend, "from": small["n"], "to": big["n"], "size_ratio": big["n"] / small["n"],
            **{f"{name}_ratio": big[f"{name}_s"] / small[f"{name}_s"]
               for name in ("append", "verify", "checkpoint", "verify_with_checkpoints", "prove", "check_proof")},
            "proof_hashes_added": big["proof_hashes_max"] - small["proof_hashes_max"],
            "log2_added": big["log2_n"] - small["log2_n"],
        })
    return found


COLUMNS = (("backend", "backend", "{}"), ("n", "records", "{:,}"), ("append_per_s", "append rec/s", "{:,.0f}"),
           ("append_s", "append s", "{:.1f}"), ("verify_s", "verify s", "{:.2f}"), ("checkpoint_s", "sign s", "{:.2f}"),
           ("verify_with_checkpoints_s", "verify+ckpt s", "{:.2f}"), ("prove_s", "prove s", "{:.2f}"),
           ("check_proof_s", "check ms", "{:.1f}"), ("proof_hashes_max", "hashes/rec", "{}"),
           ("log2_n", "log2 n", "{:.1f}"), ("proof_bytes", "proof B", "{:,}"))
GROWTH = (("append_ratio", "append"), ("verify_ratio", "verify"), ("checkpoint_ratio", "sign"),
          ("verify_with_checkpoints_ratio", "verify+ckpt"), ("prove_ratio", "prove"), ("check_proof_ratio", "check"))


def table(measured: dict[str, Any]) -> str:
    """The measurements and growth ratios as aligned text."""
    rows = [[label for _, label, _ in COLUMNS]]
    for r in measured["results"]:
        values = {**r, "check_proof_s": r["check_proof_s"] * 1000}
        rows.append([fmt.format(values[key]) for key, _, fmt in COLUMNS])
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.append(f"(medians of {measured['rounds']} alternated rounds except append and sign; proof of one "
                 f"{RECORDS_PER_RELEASE}-record release; {measured['machine']}, {measured['date']})")
    for g in measured["growth"]:
        ratios = ", ".join(f"{label} {g[key]:.1f}×" for key, label in GROWTH)
        lines.append(f"{g['backend']} {g['to']:,} vs {g['from']:,} (size {g['size_ratio']:.0f}×, linear = "
                     f"{g['size_ratio']:.0f}×): {ratios}; proof +{g['proof_hashes_added']} hashes a record "
                     f"(log2 +{g['log2_added']:.1f})")
    for backend, why in measured["skipped"].items():
        lines.append(f"{backend} skipped: {why}")
    return "\n".join(lines)


def summary(measured: dict[str, Any]) -> list[dict[str, Any]]:
    """`make bench`'s result rows: correctness at every size, then the growth of append and verify time."""
    rows = []
    for r in measured["results"]:
        bound = math.ceil(r["log2_n"])
        ok = r["verify_ok"] and r["verify_with_checkpoints_ok"] and r["proof_ok"] and r["proof_hashes_max"] <= bound
        rows.append({"name": f"ledger inclusion proof, {r['n']:,} records ({r['backend']})",
                     "value": r["proof_hashes_max"], "unit": "hashes", "target": f"<= {bound}", "ok": ok,
                     "detail": f"{r['append_per_s']:,.0f} appends/s, verify {r['verify_s']:.2f}s, "
                               f"prove {r['prove_s']:.2f}s, check {r['check_proof_s'] * 1000:.1f} ms; "
                               f"verify and proof {'ok' if ok else 'FAILED'}"})
    for g in measured["growth"]:
        linear = g["size_ratio"] * LINEAR_SLACK
        for key, label in (("append_ratio", "append"), ("verify_ratio", "verify")):
            rows.append({"name": f"ledger {label} time, {g['to']:,} vs {g['from']:,} records ({g['backend']})",
                         "value": g[key], "unit": "x longer", "target": f"<= {linear:.0f}", "ok": g[key] <= linear,
                         "detail": f"linear is {g['size_ratio']:.0f}×"})
    return rows


def run(sizes: tuple[int, ...] = SIZES, backends: tuple[str, ...] = BACKENDS) -> list[dict[str, Any]]:
    """`make bench`'s ledger section: measure, log the full table, return the summary rows."""
    measured = measure_all(sizes, backends)
    log(table(measured))
    return summary(measured)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="record counts, comma-separated")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="sqlite and/or postgresql, comma-separated")
    args = parser.parse_args(argv)
    sizes = tuple(int(n.replace("_", "")) for n in args.sizes.split(","))
    backends = tuple(b.strip() for b in args.backends.split(","))
    if min(sizes) < 1 or not set(backends) <= set(BACKENDS):
        parser.error(f"sizes must be positive and backends among {', '.join(BACKENDS)}")
    measured = measure_all(sizes, backends)
    print(table(measured))
    rows = summary(measured)
    print("\n".join(f"{'ok ' if r['ok'] else 'NO '} {r['name']}: {r['value']:.2f} {r['unit']} (target {r['target']}; "
                    f"{r['detail']})" for r in rows))
    print(json.dumps({"bench": "ledger", **measured}, sort_keys=True))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
