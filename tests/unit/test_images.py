"""Image source trees (tasks/backends/image_source.py): the digest covers the image folder and the shared
images/common."""

from __future__ import annotations

from pathlib import Path

import pytest

from shiplift.tasks.backends import image_source as images
from shiplift.tasks.errors import ConfigError

BASE = "python@sha256:" + "ab" * 32


def _image(root: Path, name: str) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "Dockerfile").write_text(f"ARG BASE_IMAGE={BASE}\nFROM ${{BASE_IMAGE}}\nCOPY {name}/server.py /app/\n")
    (folder / "server.py").write_text(f"# {name} server\n")


@pytest.fixture
def images_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An images/ tree with two images, `one` and `two`, and the shared common/ folder."""
    _image(tmp_path, "one")
    _image(tmp_path, "two")
    (tmp_path / "common").mkdir()
    (tmp_path / "common" / "sagemaker_http.py").write_text("# shared\n")
    monkeypatch.setattr(images, "IMAGES_DIR", tmp_path)
    return tmp_path


def _digests() -> dict[str, str]:
    return {name: images.pin_image_source(name, BASE).digest for name in ("one", "two")}


@pytest.mark.parametrize("name, other", [("semif", "encoder"), ("encoder", "semif")])
def test_each_project_image_lists_its_own_folder_and_the_shared_module(name, other):
    paths = [path for path, _ in images.image_listing(name)]
    assert {f"{name}/server.py", f"{name}/Dockerfile", "common/sagemaker_http.py"} <= set(paths)
    assert not any(path.startswith(f"{other}/") for path in paths)


def test_a_change_to_the_shared_module_changes_every_image_digest(images_dir):
    before = _digests()
    assert before["one"] != before["two"]
    ref = images.pin_image_source("one", BASE)
    assert ref.files == 3 and ref.uri == f"local/one@{ref.digest}"
    (images_dir / "common" / "sagemaker_http.py").write_text("# shared, changed\n")
    after = _digests()
    assert after["one"] != before["one"] and after["two"] != before["two"]


def test_a_change_to_one_image_changes_only_its_digest(images_dir):
    before = _digests()
    (images_dir / "one" / "server.py").write_text("# one server, changed\n")
    after = _digests()
    assert after["one"] != before["one"] and after["two"] == before["two"]


def test_bytecode_caches_do_not_change_the_digest(images_dir):
    before = _digests()
    for folder in ("one", "common"):
        (images_dir / folder / "__pycache__").mkdir()
        (images_dir / folder / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    assert _digests() == before


def test_a_missing_shared_folder_is_a_config_error(images_dir):
    (images_dir / "common" / "sagemaker_http.py").unlink()
    (images_dir / "common").rmdir()
    with pytest.raises(ConfigError, match="images/common"):
        images.pin_image_source("one", BASE)
