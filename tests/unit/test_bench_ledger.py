"""The ledger bench (bench/ledger.py) at tiny sizes on SQLite: every measurement is there and sane, proofs hold
ceil(log2 n) hashes a record, and the command prints its table and a JSON line."""

from __future__ import annotations

import json
import math

import pytest

from bench import ledger as bench_ledger
from shiplift.tasks.hashing import canonical_json


@pytest.fixture(scope="module")
def measured() -> dict:
    return bench_ledger.measure_all((200, 50), ("sqlite",))


def test_stage_records_look_like_real_ones() -> None:
    records = [bench_ledger.stage_record(i) for i in range(45)]
    assert {r["release_id"] for r in records[:20]} == {"r000000"}
    assert records[20]["release_id"] == records[39]["release_id"] == "r000001" != records[40]["release_id"]
    assert all(200 <= len(canonical_json(r["payload"])) <= 600 for r in records)


def test_every_size_is_measured_and_verifies(measured: dict) -> None:
    assert measured["skipped"] == {}
    assert [(r["backend"], r["n"]) for r in measured["results"]] == [("sqlite", 50), ("sqlite", 200)]
    for r in measured["results"]:
        assert r["verify_ok"] and r["verify_with_checkpoints_ok"] and r["proof_ok"]
        assert r["append_per_s"] == pytest.approx(r["n"] / r["append_s"]) and r["append_per_s"] > 0
        assert all(r[k] > 0
                   for k in ("verify_s", "checkpoint_s", "verify_with_checkpoints_s", "prove_s", "check_proof_s"))
        assert r["proof_records"] == bench_ledger.RECORDS_PER_RELEASE
        assert r["proof_hashes_min"] == r["proof_hashes_max"] == math.ceil(math.log2(r["n"]))
        assert r["proof_bytes"] > r["proof_records"] * r["proof_hashes_max"] * 64


def test_growth_and_summary(measured: dict) -> None:
    (g,) = measured["growth"]
    assert (g["backend"], g["from"], g["to"], g["size_ratio"]) == ("sqlite", 50, 200, 4)
    assert g["proof_hashes_added"] == 2 and g["log2_added"] == pytest.approx(2)
    assert g["append_ratio"] > 0 and g["verify_ratio"] > 0
    rows = bench_ledger.summary(measured)
    assert [r["name"] for r in rows][-2:] == ["ledger append time, 200 vs 50 records (sqlite)",
                                              "ledger verify time, 200 vs 50 records (sqlite)"]
    assert all(rows[i]["ok"] for i in range(2))
    assert set(rows[0]) == {"name", "value", "unit", "target", "ok", "detail"}
    text = bench_ledger.table(measured)
    assert "append rec/s" in text and "sqlite 200 vs 50" in text


def test_main_prints_the_table_and_a_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = bench_ledger.main(["--sizes", "21,42", "--backends", "sqlite"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert code in (0, 1)  # growth at 42 records is noise; only the shape is checked here
    assert lines[0].split()[:3] == ["backend", "records", "append"]
    document = json.loads(lines[-1])
    assert document["bench"] == "ledger" and [r["n"] for r in document["results"]] == [21, 42]


def test_main_refuses_an_unknown_backend() -> None:
    with pytest.raises(SystemExit):
        bench_ledger.main(["--backends", "mysql"])
