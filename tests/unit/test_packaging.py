"""Deterministic model.tar.gz packaging and safe extraction (with crafted malicious archives)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pytest

import tasks.packaging as packaging
from tasks.errors import BadInput, Conflict, IntegrityError, NotFound
from tasks.hashing import sha256_file
from tasks.packaging import MANIFEST_NAME, package_gguf, safe_extract
from tasks.store import LocalArtifactStore

MANIFEST = {"source": {"kind": "local", "sha256": "a" * 64}, "quantization": "Q4_K_M", "tools": {"gguf": "0.19.0"}}


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "tiny-q4.gguf"
    path.parent.mkdir()
    path.write_bytes(b"GGUF" + os.urandom(64 * 1024))
    return path


@pytest.fixture
def calibration(tmp_path: Path) -> Path:
    path = tmp_path / "src" / "calibration.json"
    path.write_text(json.dumps({"temperature": 1.7}))
    return path


def _members(archive: Path) -> list[tarfile.TarInfo]:
    with tarfile.open(archive, "r:gz") as tar:
        return tar.getmembers()


def test_archive_layout_and_manifest(gguf: Path, calibration: Path, tmp_path: Path) -> None:
    packaged = package_gguf(gguf, tmp_path / "out", manifest=MANIFEST, extra_files={"calibration.json": calibration})
    assert packaged.path == (tmp_path / "out" / "model.tar.gz").resolve()
    assert packaged.sha256 == sha256_file(packaged.path)
    members = _members(packaged.path)
    assert [m.name for m in members] == ["calibration.json", MANIFEST_NAME, "tiny-q4.gguf"]
    for member in members:
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", "")
        assert member.mode == 0o644 and member.isreg()
    header = packaged.path.read_bytes()[:10]
    assert header[4:8] == b"\0\0\0\0" and not header[3] & 0x08  # gzip mtime 0, no file name
    with tarfile.open(packaged.path, "r:gz") as tar:
        manifest = json.load(tar.extractfile(MANIFEST_NAME))
    assert manifest == packaged.manifest
    assert manifest["quantization"] == "Q4_K_M" and manifest["source"] == MANIFEST["source"]
    assert manifest["model_file"] == "tiny-q4.gguf"
    assert manifest["files"] == {
        "calibration.json": {"sha256": sha256_file(calibration), "size": calibration.stat().st_size},
        "tiny-q4.gguf": {"sha256": sha256_file(gguf), "size": gguf.stat().st_size},
    }
    assert [p.name for p in packaged.path.parent.iterdir()] == ["model.tar.gz"]


def test_same_inputs_give_byte_identical_archives(gguf: Path, calibration: Path, tmp_path: Path) -> None:
    first = package_gguf(gguf, tmp_path / "a", manifest=MANIFEST, extra_files={"calibration.json": calibration})
    os.utime(gguf, (1_000_000, 1_000_000))  # source mtimes must not leak into the archive
    os.utime(calibration, (2_000_000, 2_000_000))
    second = package_gguf(gguf, tmp_path / "b", manifest=dict(reversed(MANIFEST.items())), extra_files={"calibration.json": calibration})
    assert first.path.read_bytes() == second.path.read_bytes()
    assert first.sha256 == second.sha256
    third = package_gguf(gguf, tmp_path / "c", manifest={**MANIFEST, "quantization": "Q8_0"})
    assert third.sha256 != first.sha256


def test_real_tiny_gguf_round_trips_through_store(tiny_gguf: Path, tmp_path: Path) -> None:
    packaged = package_gguf(tiny_gguf, tmp_path / "out", manifest=MANIFEST)
    store = LocalArtifactStore(tmp_path / "store")
    stored = store.put_file(packaged.path, name="model.tar.gz")
    assert stored.sha256 == packaged.sha256
    files = safe_extract(store.get(stored.uri), tmp_path / "model")
    assert [p.name for p in files] == [MANIFEST_NAME, tiny_gguf.name]
    assert sha256_file(tmp_path / "model" / tiny_gguf.name) == sha256_file(tiny_gguf)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"manifest": {"files": []}}, BadInput, "reserved"),
        ({"manifest": {"x": {1, 2}}}, BadInput, "JSON"),
        ({"manifest": {}, "extra_files": {MANIFEST_NAME: Path(__file__)}}, BadInput, "clashes"),
        ({"manifest": {}, "extra_files": {"other.gguf": Path(__file__)}}, BadInput, "clashes"),
        ({"manifest": {}, "extra_files": {"tokenizer/vocab.json": Path(__file__)}}, BadInput, "artifact name"),
        ({"manifest": {}, "extra_files": {"calibration.json": Path("/nonexistent")}}, NotFound, "calibration.json"),
    ],
)
def test_bad_package_inputs(gguf: Path, tmp_path: Path, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        package_gguf(gguf, tmp_path / "out", **kwargs)
    assert not (tmp_path / "out" / "model.tar.gz").exists()


def test_non_gguf_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(BadInput, match="not a GGUF"):
        package_gguf(fake, tmp_path / "out", manifest={})
    with pytest.raises(NotFound, match="GGUF model"):
        package_gguf(tmp_path / "missing.gguf", tmp_path / "out", manifest={})


def test_failed_packaging_leaves_previous_archive_and_no_temp(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    before = package_gguf(gguf, out, manifest=MANIFEST).path.read_bytes()
    calls = []

    def failing_add(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_add(*args, **kwargs)

    real_add = packaging._add_member
    monkeypatch.setattr(packaging, "_add_member", failing_add)
    with pytest.raises(OSError, match="disk full"):
        package_gguf(gguf, out, manifest={**MANIFEST, "quantization": "Q8_0"})
    assert (out / "model.tar.gz").read_bytes() == before
    assert [p.name for p in out.iterdir()] == ["model.tar.gz"]


# -- malicious archives --------------------------------------------------------------------


def _craft(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"ok") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info, None


MALICIOUS = {
    "absolute": ([_file("/tmp/shiplift-evil-abs")], "/tmp/shiplift-evil-abs", "absolute"),
    "dotdot": ([_file("../evil")], "../evil", "'..'"),
    "nested-dotdot": ([_file("a/../../evil")], "a/../../evil", "'..'"),
    "symlink": ([_special("link", tarfile.SYMTYPE, "/etc/passwd")], "link", "link"),
    "hardlink": ([_special("hard", tarfile.LNKTYPE, "good.txt")], "hard", "link"),
    "char-device": ([_special("null", tarfile.CHRTYPE)], "null", "device"),
    "block-device": ([_special("sda", tarfile.BLKTYPE)], "sda", "device"),
    "fifo": ([_special("pipe", tarfile.FIFOTYPE)], "pipe", "fifo"),
    "duplicate": ([_file("good.txt", b"second")], "good.txt", "twice"),
    "file-under-file": ([_file("good.txt/inner")], "good.txt/inner", "clashes"),
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archive_is_refused_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    extra, member, why = MALICIOUS[case]
    archive = _craft(tmp_path / "evil.tar.gz", [_file("good.txt"), *extra])
    work = tmp_path / "work"
    work.mkdir()
    dest = work / "model"
    with pytest.raises(IntegrityError) as caught:
        safe_extract(archive, dest)
    assert repr(member) in str(caught.value) and why in str(caught.value)
    assert list(work.iterdir()) == []  # neither dest nor a half-extracted temp folder
    assert not (tmp_path / "evil").exists()
    assert not Path("/tmp/shiplift-evil-abs").exists()


def _tampered(tmp_path: Path, gguf: Path, mutate) -> Path:
    packaged = package_gguf(gguf, tmp_path / "good", manifest=MANIFEST)
    with tarfile.open(packaged.path, "r:gz") as tar:
        contents = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    mutate(contents)
    return _craft(tmp_path / "tampered.tar.gz", [_file(name, data) for name, data in sorted(contents.items())])


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda c: c.update({"tiny-q4.gguf": b"GGUF" + b"\0" * 10}), "does not match the sha256"),
        (lambda c: c.update({"extra.bin": b"smuggled"}), "unlisted \\['extra.bin'\\]"),
        (lambda c: c.pop("tiny-q4.gguf"), "missing \\['tiny-q4.gguf'\\]"),
        (lambda c: c.update({MANIFEST_NAME: b"{not json"}), "malformed"),
    ],
)
def test_archive_not_matching_manifest_is_refused(gguf: Path, tmp_path: Path, mutate, match: str) -> None:
    archive = _tampered(tmp_path, gguf, mutate)
    with pytest.raises(IntegrityError, match=match):
        safe_extract(archive, tmp_path / "x" / "model")
    assert list((tmp_path / "x").iterdir()) == []


def test_truncated_archive_is_refused(gguf: Path, tmp_path: Path) -> None:
    packaged = package_gguf(gguf, tmp_path / "good", manifest=MANIFEST)
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(packaged.path.read_bytes()[: packaged.path.stat().st_size // 2])
    with pytest.raises(IntegrityError, match="truncated or corrupt"):
        safe_extract(broken, tmp_path / "x" / "model")
    assert list((tmp_path / "x").iterdir()) == []
    garbage = tmp_path / "garbage.tar.gz"
    garbage.write_bytes(b"this is not an archive at all" * 20)
    with pytest.raises(IntegrityError, match="not a readable tar"):
        safe_extract(garbage, tmp_path / "x" / "model")


def test_extract_into_existing_destination(gguf: Path, tmp_path: Path) -> None:
    packaged = package_gguf(gguf, tmp_path / "good", manifest=MANIFEST)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert len(safe_extract(packaged.path, empty)) == 2
    with pytest.raises(Conflict, match="not an empty folder"):
        safe_extract(packaged.path, empty)


def test_archive_without_manifest_extracts_with_subfolders(tmp_path: Path) -> None:
    folder = tarfile.TarInfo("tokenizer")
    folder.type = tarfile.DIRTYPE
    archive = _craft(tmp_path / "plain.tar", [(folder, None), _file("tokenizer/vocab.json", b"{}"), _file("./model.onnx", b"x")])
    files = safe_extract(archive, tmp_path / "out")
    assert files == [tmp_path / "out" / "model.onnx", tmp_path / "out" / "tokenizer" / "vocab.json"]
    assert (tmp_path / "out" / "tokenizer" / "vocab.json").read_bytes() == b"{}"


def test_model_folder_packages_deterministically_and_round_trips(tmp_path: Path) -> None:
    from tasks.packaging import package_model_dir

    folder = tmp_path / "encoder"
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"onnx-bytes")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "config.json").write_text('{"id2label": {}}')
    first = package_model_dir(folder, tmp_path / "a", manifest={"kind": "onnx"}, model_file="model.onnx")
    second = package_model_dir(folder, tmp_path / "b", manifest={"kind": "onnx"}, model_file="model.onnx")
    assert first.sha256 == second.sha256
    assert sorted(first.manifest["files"]) == ["config.json", "model.onnx", "tokenizer.json"]
    extracted = safe_extract(first.path, tmp_path / "out")
    assert sorted(p.name for p in extracted) == ["config.json", "model-manifest.json", "model.onnx", "tokenizer.json"]


def test_model_folder_must_be_flat_and_hold_the_model(tmp_path: Path) -> None:
    from tasks.packaging import package_model_dir

    folder = tmp_path / "encoder"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"x")
    with pytest.raises(BadInput, match="not plain files"):
        package_model_dir(folder, tmp_path / "o", manifest={}, model_file="model.onnx")
    (folder / "sub").rmdir()
    with pytest.raises(BadInput, match="no model.int8.onnx"):
        package_model_dir(folder, tmp_path / "o", manifest={}, model_file="model.int8.onnx")
    assert not (tmp_path / "o" / "model.tar.gz").exists()
