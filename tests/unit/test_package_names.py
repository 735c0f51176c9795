"""`tasks` and `validation` are generic top-level names: make sure ours are the ones imported."""

from importlib import metadata
from pathlib import Path

import tasks
import validation

ROOT = Path(__file__).resolve().parents[2]


def test_tasks_and_validation_come_from_this_checkout():
    assert Path(tasks.__file__).resolve().parent == ROOT / "tasks"
    assert Path(validation.__file__).resolve().parent == ROOT / "validation"


def test_no_other_distribution_ships_these_top_level_names():
    providers = metadata.packages_distributions()
    for name in ("tasks", "validation"):
        others = set(providers.get(name, [])) - {"shiplift"}
        assert not others, \
            f"installed distributions {others} also provide top-level {name!r}; they would shadow shiplift"


def test_tasks_and_validation_never_import_airflow():
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("tasks", "validation", "images")
        for path in (ROOT / folder).rglob("*.py")
        if any(line.strip().startswith(("import airflow", "from airflow")) for line in path.read_text().splitlines())
    ]
    assert offenders == []
