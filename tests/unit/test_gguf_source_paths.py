"""A GGUF source given by a relative path is read from the config file's folder, as datasets are, whatever the working
directory: the family's resolve step finds it there, `config validate`'s named-file check (`require_named_files`)
agrees, and a missing file is refused by both with the path as written and the path it was looked for at."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from shiplift.tasks.config import load_release_config, require_named_files
from shiplift.tasks.errors import ConfigError, NotFound


def relative_config(tiny_release, tmp_path: Path, written: str) -> Path:
    """The tiny chat release in tmp_path/configs, its GGUF moved to configs/models/chat.gguf and named `written`."""
    path = tiny_release.write_tiny_chat_config(tmp_path / "configs", tmp_path / "state")
    tree = yaml.safe_load(path.read_text())
    source = Path(tree["artifact"]["source"]["path"])
    (path.parent / "models").mkdir()
    shutil.move(source, path.parent / "models" / "chat.gguf")
    tree["artifact"]["source"]["path"] = written
    path.write_text(yaml.safe_dump(tree))
    return path


@pytest.fixture()
def elsewhere(tmp_path, monkeypatch) -> Path:
    """A working directory that is not the config's folder (nor holds a models/ folder of its own)."""
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.chdir(folder)
    return folder


def resolved(config, config_path: Path, cache: Path) -> Path:
    """The family's resolve step, as the release's resolve stage runs it."""
    ctx = SimpleNamespace(config=config, config_dir=config_path.resolve().parent)
    path, _, description = config.family.resolve(ctx, cache)
    assert description["path"] == str(path)
    return path


def test_a_relative_gguf_path_is_read_from_the_configs_folder_from_any_working_directory(tiny_release, tmp_path,
                                                                                         elsewhere):
    path = relative_config(tiny_release, tmp_path, "models/chat.gguf")
    config = load_release_config(path)
    require_named_files(config, path)  # config validate's check: there, and readable
    assert resolved(config, path, tmp_path / "cache") == tmp_path / "configs" / "models" / "chat.gguf"
    relative = Path("..") / "configs" / path.name  # the config named relative to the working directory
    assert resolved(load_release_config(relative), relative, tmp_path / "cache") == path.parent / "models" / "chat.gguf"


def test_a_missing_gguf_is_named_as_written_and_where_it_was_looked_for(tiny_release, tmp_path, elsewhere):
    path = relative_config(tiny_release, tmp_path, "models/gone.gguf")
    config = load_release_config(path)
    looked = tmp_path / "configs" / "models" / "gone.gguf"
    with pytest.raises(ConfigError) as refused:
        require_named_files(config, path)
    assert "artifact.source.path 'models/gone.gguf'" in str(refused.value) and str(looked) in str(refused.value)
    with pytest.raises(NotFound) as missing:
        resolved(config, path, tmp_path / "cache")
    assert "'models/gone.gguf'" in str(missing.value) and str(looked) in str(missing.value)
    assert str(tmp_path / "configs") in missing.value.fix
