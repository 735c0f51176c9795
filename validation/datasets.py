"""Load a decision dataset: read the file, filter splits, run its expectations.

`CheckedDataset` and `keep_splits` are shared with the NLI datasets (`validation.nli.evaluate.NliDataset`): every
family's dataset is a file read, filtered to its splits, checked, and recorded by the gate with the same evidence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from shiplift.tasks.errors import BadInput
from shiplift.validation.decisions.jevbench import dataset_sha256, load_jevbench
from shiplift.validation.expectations import check_decision_dataset

Item = TypeVar("Item")  # a row with a `split`: a JevTask, an NliPair


def keep_splits(items: Sequence[Item], splits: Sequence[str] | None, *, where: str, unit: str, fix: str) -> list[Item]:
    """The items in the given splits (all when None or empty); BadInput when a split has none: `{where} has no {unit}
    in split(s) [...]; it has [...]`."""
    if not splits:
        return list(items)
    present = {item.split for item in items}
    missing = set(splits) - present
    if missing:
        raise BadInput(f"{where} has no {unit} in split(s) {sorted(missing)}; it has {sorted(map(str, present))}",
                       fix=fix)
    return [item for item in items if item.split in splits]


@dataclass(frozen=True, kw_only=True)
class CheckedDataset:
    """A dataset file read, kept to its splits and checked: the evidence the gate records about it (`evidence()`).
    A family's dataset adds its items (`items`) and any count of its own (`counts()`)."""

    name: str
    path: Path
    sha256: str
    splits: tuple[str, ...] | None
    check: dict

    @property
    def items(self) -> Sequence[Any]:
        raise NotImplementedError

    def counts(self) -> dict[str, int]:
        """Counts the gate records beside the size `n` (none here)."""
        return {}

    def evidence(self) -> dict:
        """Name, path, pin, splits, size, the family's own counts and the expectation results."""
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256, "splits": self.splits,
                "n": len(self.items), **self.counts(), "check": self.check}


@dataclass(frozen=True, kw_only=True)
class DecisionDataset(CheckedDataset):
    """Tasks ready for the runner plus the evidence the gate records about them."""

    tasks: list

    @property
    def items(self) -> list:
        return self.tasks


def load_decision_dataset(path: Path, *, name: str, splits: Sequence[str] | None = None) -> DecisionDataset:
    """Read a JevBench-format file, keep the given splits (None: all), and check it before use."""
    tasks = keep_splits(load_jevbench(path), splits, where=f"dataset {path}", unit="tasks",
                        fix="fix the splits list in the config")
    check = check_decision_dataset(tasks, name=name)
    return DecisionDataset(
        name=name, path=path, sha256=dataset_sha256(path), splits=tuple(splits) if splits else None,
        tasks=tasks, check=check.to_dict(),
    )
