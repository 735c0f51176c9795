"""The local content-addressed artifact store."""

from __future__ import annotations

import hashlib
import stat
import threading
from pathlib import Path

import pytest

from shiplift.tasks.backends.interfaces import ArtifactStore, StoredArtifact
from shiplift.tasks.backends.local.artifact_store import LocalArtifactStore
from shiplift.tasks.errors import BadInput, Conflict, IntegrityError, NotFound


@pytest.fixture
def store(tmp_path: Path) -> LocalArtifactStore:
    return LocalArtifactStore(tmp_path / "store root")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "src.bin"
    path.write_bytes(b"model bytes " * 1000)
    return path


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".tmp-*")]


def test_put_is_content_addressed(store: LocalArtifactStore, source: Path) -> None:
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    stored = store.put_file(source, name="model.tar.gz")
    expected = store.root / "sha256" / digest / "model.tar.gz"
    assert stored == StoredArtifact(uri=expected.as_uri(), sha256=digest, size=12000)
    assert stored.uri.startswith("file:///") and "store%20root" in stored.uri
    assert expected.read_bytes() == source.read_bytes()
    assert stat.S_IMODE(expected.stat().st_mode) == 0o444
    assert store.exists(digest) and not store.exists("0" * 64)
    assert _leftovers(store.root) == []
    assert isinstance(store, ArtifactStore)  # satisfies the protocol structurally
    assert stored.to_dict() == {"uri": stored.uri, "sha256": digest, "size": 12000}


def test_put_again_is_idempotent_and_never_rewrites(store: LocalArtifactStore, source: Path) -> None:
    first = store.put_file(source, name="model.tar.gz")
    stored_path = store.get(first.uri)
    inode = stored_path.stat().st_ino
    again = store.put_file(source, name="model.tar.gz")
    assert again == first
    assert stored_path.stat().st_ino == inode
    other_name = store.put_file(source, name="copy.bin")
    assert other_name.sha256 == first.sha256 and other_name.uri.endswith("/copy.bin")


def test_get_by_uri_and_sha_verifies(store: LocalArtifactStore, source: Path) -> None:
    stored = store.put_file(source, name="a.gguf")
    assert store.get(stored.uri).read_bytes() == source.read_bytes()
    assert store.get(stored.sha256) == store.get(stored.uri)


def test_corrupted_artifact_raises_integrity_error(store: LocalArtifactStore, source: Path) -> None:
    stored = store.put_file(source, name="a.gguf")
    path = store.get(stored.uri)
    path.chmod(0o644)
    path.write_bytes(b"tampered")
    with pytest.raises(IntegrityError, match="corrupted"):
        store.get(stored.uri)
    with pytest.raises(IntegrityError, match="corrupted"):
        store.get(stored.sha256)
    with pytest.raises(IntegrityError, match="corrupted"):
        store.put_file(source, name="a.gguf")  # refuses to paper over it
    assert path.read_bytes() == b"tampered"  # and did not overwrite it


def test_concurrent_puts_store_one_file(store: LocalArtifactStore, source: Path) -> None:
    results: list[StoredArtifact] = []
    errors: list[BaseException] = []

    def put() -> None:
        try:
            results.append(store.put_file(source, name="model.tar.gz"))
        except BaseException as error:  # noqa: BLE001 - surfaced below
            errors.append(error)

    threads = [threading.Thread(target=put) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors and len(set(results)) == 1 and len(results) == 8
    folder = store.root / "sha256" / results[0].sha256
    assert [p.name for p in folder.iterdir()] == ["model.tar.gz"]


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "-flag", "x" * 201, "sp ace"])
def test_bad_names_are_refused(store: LocalArtifactStore, source: Path, name: str) -> None:
    with pytest.raises(BadInput, match="artifact name"):
        store.put_file(source, name=name)
    assert list((store.root / "sha256").iterdir()) == []


def test_missing_source_is_not_found(store: LocalArtifactStore, tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="not a file"):
        store.put_file(tmp_path / "missing", name="a")
    with pytest.raises(NotFound, match="not a file"):
        store.put_file(tmp_path, name="a")


def test_bad_references(store: LocalArtifactStore, source: Path, tmp_path: Path) -> None:
    stored = store.put_file(source, name="a.gguf")
    with pytest.raises(BadInput, match="sha256"):
        store.exists("ABC")
    with pytest.raises(NotFound, match="no artifact"):
        store.get("f" * 64)
    with pytest.raises(BadInput, match="neither"):
        store.get("s3://bucket/key")
    with pytest.raises(BadInput, match="not inside this store"):
        store.get((tmp_path / "elsewhere" / "a").as_uri())
    with pytest.raises(BadInput, match="not an artifact URI"):
        store.get((store.root / "sha256" / "a.gguf").as_uri())
    with pytest.raises(NotFound, match="does not exist"):
        store.get(stored.uri.replace("a.gguf", "b.gguf"))


def test_fetch_to_file_and_folder(store: LocalArtifactStore, source: Path, tmp_path: Path) -> None:
    stored = store.put_file(source, name="model.tar.gz")
    out = store.fetch_to(stored.uri, tmp_path / "out" / "m.tgz")
    assert out.read_bytes() == source.read_bytes()
    assert store.fetch_to(stored.uri, tmp_path / "out" / "m.tgz") == out  # same content: fine
    folder = tmp_path / "dir"
    folder.mkdir()
    assert store.fetch_to(stored.sha256, folder) == folder / "model.tar.gz"
    other = tmp_path / "other"
    other.write_bytes(b"different")
    with pytest.raises(Conflict, match="different content"):
        store.fetch_to(stored.uri, other)
    assert other.read_bytes() == b"different"
    assert _leftovers(tmp_path) == []


def test_fetch_of_corrupted_artifact_leaves_nothing(
    store: LocalArtifactStore, source: Path, tmp_path: Path
) -> None:
    stored = store.put_file(source, name="model.tar.gz")
    path = store.root / "sha256" / stored.sha256 / "model.tar.gz"
    path.write_bytes(b"x" * 12000)
    dest = tmp_path / "fetched"
    dest.mkdir()
    with pytest.raises(IntegrityError, match="does not match"):
        store.fetch_to(stored.uri, dest / "m.tgz")
    assert list(dest.iterdir()) == []
