"""One evaluation per gate: the champion's per-task results an earlier gate measured, reused instead of scored again.

A model's answers to a dataset's tasks are fixed by what serves it (`Identity.serving_id`: the image digest, the
artifact and the container environment, as `tasks.backends.interfaces.ComponentSpec.serving_id` hashes them), the
determinism profile its build recorded (llama.cpp's build, threads, batch sizes, cache), how a task is asked (the
readout) and the dataset file (its sha256). `Identity.key(dataset_sha256)` hashes them into the reuse key under which
a gate records every per-task file it measured live (its candidate's `predictions.jsonl`, its champion's when it
scored it). A later gate whose champion has the same identity reads the newest recorded file that holds every task
it needs (`reused_rows`), judges accuracy and ECE on those rows, and still measures latency live on a sample of
tasks, alternated with the candidate (`ChampionOffer.latency_sample`): latency depends on the machine's load now.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shiplift.tasks.hashing import sha256_json

CHAMPION_LATENCY = "champion-latency-predictions.jsonl"  # beside the gate's files: a reused champion's live sample


@dataclass(frozen=True)
class Identity:
    """What fixes a served model's answers to a dataset besides the dataset (the module's docstring)."""

    serving_id: str
    determinism: dict[str, Any] | None
    readout: str

    def sha256(self) -> str:
        """The identity as one hash (what a record names, so a later gate can find it before reading datasets)."""
        return sha256_json({"serving_id": self.serving_id, "determinism": self.determinism, "readout": self.readout})

    def key(self, dataset_sha256: str) -> str:
        """The reuse key of this model's results on the dataset file `dataset_sha256`."""
        return sha256_json({"identity": self.sha256(), "dataset_sha256": dataset_sha256})

    def measured(self, datasets: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What a validate record keeps of a per-task file measured live on `datasets` (the gate's evidence of each:
        `name`, `sha256`): the identity's hash and each dataset's reuse key by the name its rows carry."""
        return {"identity": self.sha256(), "keys": {d["name"]: self.key(d["sha256"]) for d in datasets}}


@dataclass(frozen=True)
class Recorded:
    """A per-task file an earlier gate measured live: the release whose gate it was, the evidence file's name, each
    dataset's reuse key by the name its rows carry, and how to read its rows (read only when the gate uses it)."""

    release_id: str
    file: str
    keys: dict[str, str]
    rows: Callable[[], list[dict[str, Any]]]


@dataclass(frozen=True)
class ChampionOffer:
    """What the validate stage hands the gate about its champion: the champion's identity, the recorded files of that
    identity (newest first), and how many of the gate's tasks the champion still answers live, alternated with the
    candidate, for the latency ratio (`validation.champion.latency_sample`); `fresh` says why it is scored afresh."""

    identity: Identity
    recorded: list[Recorded]
    latency_sample: int
    fresh: str | None = None  # why the champion is scored on every task whatever was recorded (--fresh-champion)


def reused_rows(offer: ChampionOffer, datasets: Sequence[Any]) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
    """The champion's rows for every task of `datasets` (each with `name`, `sha256` and `items`, whose `id`s), in task
    order and named by this gate's datasets, from the newest recorded file that holds them all; and what the report
    says of it: `{"reused": true, "from_release", "file", "n"}`, or `{"reused": false, "why"}` with rows None."""
    if offer.fresh:
        return None, {"reused": False, "why": offer.fresh}
    wanted = {d.name: offer.identity.key(d.sha256) for d in datasets}
    why = (f"no earlier gate recorded this champion's per-task results (serving id {offer.identity.serving_id[:12]}…, "
           "its determinism profile and readout) on these datasets")
    for recorded in offer.recorded:
        if not set(wanted.values()) <= set(recorded.keys.values()):
            continue
        rows = _rows_by_task(recorded, offer.identity.serving_id)
        missing = [(d.name, str(item.id)) for d in datasets for item in d.items
                   if (wanted[d.name], str(item.id)) not in rows]
        if missing:
            why = (f"{len(missing)} tasks (e.g. {missing[0][1]} of {missing[0][0]}) have no answered row of this "
                   f"champion in release {recorded.release_id}'s {recorded.file}")
            continue
        chosen = [{**rows[wanted[d.name], str(item.id)], "dataset": d.name} for d in datasets for item in d.items]
        return chosen, {"reused": True, "from_release": recorded.release_id, "file": recorded.file, "n": len(chosen)}
    return None, {"reused": False, "why": why}


def _rows_by_task(recorded: Recorded, serving_id: str) -> dict[tuple[str, str], dict]:
    """The recorded file's answered rows by (their dataset's reuse key, task id): rows that got no answer (lost) or an
    error (which a retry might not get) are missing, as are rows an echoed serving id says another model answered."""
    return {(recorded.keys[row["dataset"]], str(row["id"])): row for row in recorded.rows()
            if row["dataset"] in recorded.keys and not row.get("lost") and row.get("error") is None
            and row.get("serving_id") in (None, serving_id)}


def latency_turns(sizes: Sequence[int], sample: int) -> frozenset[int]:
    """The turns (indices into turns of `sizes` tasks each) the champion still answers live: evenly spread over the
    gate, the fewest that hold at least `sample` tasks (all of them when the gate is no larger)."""
    for count in range(1, len(sizes) + 1):
        chosen = frozenset(i * len(sizes) // count for i in range(count))
        if sum(sizes[i] for i in chosen) >= sample:
            return chosen
    return frozenset(range(len(sizes)))
