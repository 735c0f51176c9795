"""Load a decision dataset: read the file, filter splits, run its expectations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.errors import BadInput


@dataclass(frozen=True)
class DecisionDataset:
    """Tasks ready for the runner plus the evidence the gate records about them."""

    name: str
    path: Path
    sha256: str
    splits: tuple[str, ...] | None
    tasks: list
    check: dict

    def evidence(self) -> dict:
        return {"name": self.name, "path": str(self.path), "sha256": self.sha256, "splits": self.splits, "n": len(self.tasks), "check": self.check}


def load_decision_dataset(path: Path, *, name: str, splits: Sequence[str] | None = None) -> DecisionDataset:
    """Read a JevBench-format file, keep the given splits (None: all), and check it before use."""
    from validation.expectations import check_decision_dataset
    from validation.jevbench import dataset_sha256, load_jevbench

    tasks = load_jevbench(path)
    if splits:
        present = {t.split for t in tasks}
        missing = set(splits) - present
        if missing:
            raise BadInput(
                f"dataset {path} has no tasks in split(s) {sorted(missing)}; it has {sorted(present)}",
                fix="fix the splits list in the config",
            )
        tasks = [t for t in tasks if t.split in splits]
    check = check_decision_dataset(tasks, name=name)
    return DecisionDataset(
        name=name, path=path, sha256=dataset_sha256(path), splits=tuple(splits) if splits else None,
        tasks=tasks, check=check.to_dict(),
    )
