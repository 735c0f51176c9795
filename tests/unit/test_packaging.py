"""Deterministic model.tar.gz packaging and safe extraction (with crafted malicious archives)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections import namedtuple
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shiplift.tasks.artifacts.packaging as packaging
from shiplift.tasks.artifacts.packaging import MANIFEST_NAME, ExtractLimits, package_gguf, safe_extract
from shiplift.tasks.backends.local.artifact_store import LocalArtifactStore
from shiplift.tasks.errors import BadInput, Conflict, IntegrityError, NotFound
from shiplift.tasks.hashing import sha256_file

shutil_usage = namedtuple("usage", "total used free")
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
    assert [m.name for m in members] == [MANIFEST_NAME, "calibration.json", "tiny-q4.gguf"], "the manifest first"
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
    second = package_gguf(gguf, tmp_path / "b", manifest=dict(reversed(MANIFEST.items())),
                          extra_files={"calibration.json": calibration})
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
    """A tar.gz of exactly these members, in this order."""
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes = b"ok") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _manifest(files: dict[str, bytes], **extra) -> tuple[tarfile.TarInfo, bytes]:
    """A model-manifest.json member listing `files` by sha256 and size."""
    listed = {name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)} for name, data in files.items()}
    return _file(MANIFEST_NAME, json.dumps({"files": listed, **extra}).encode())


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
    "duplicate": ([_file("good.txt", b"ok")], "good.txt", "twice"),
    "second-manifest": ([_manifest({"good.txt": b"ok"})], MANIFEST_NAME, "twice"),
    "file-under-file": ([_file("good.txt/inner")], "good.txt/inner", "clashes"),
    "folder-over-file": ([_special("good.txt", tarfile.DIRTYPE)], "good.txt", "clashes"),
}


@pytest.mark.parametrize("case", sorted(MALICIOUS))
def test_malicious_archive_is_refused_and_leaves_nothing(case: str, tmp_path: Path) -> None:
    extra, member, why = MALICIOUS[case]
    listed = {"good.txt": b"ok", "good.txt/inner": b"ok"} if case == "file-under-file" else {"good.txt": b"ok"}
    archive = _craft(tmp_path / "evil.tar.gz", [_manifest(listed), _file("good.txt"), *extra])
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
    members = [_file(name, data) for name, data in contents.items()]
    return _craft(tmp_path / "tampered.tar.gz", sorted(members, key=lambda m: m[0].name != MANIFEST_NAME))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda c: c.update({"tiny-q4.gguf": b"GGUF" + b"\0" * 10}), "is 14 bytes, but model-manifest.json says"),
        (lambda c: c.update({"tiny-q4.gguf": b"GGUF" + b"\0" * (len(c["tiny-q4.gguf"]) - 4)}),
         "does not match the sha256"),
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


def test_listed_files_in_subfolders_extract(tmp_path: Path) -> None:
    folder = tarfile.TarInfo("tokenizer")
    folder.type = tarfile.DIRTYPE
    listed = {"tokenizer/vocab.json": b"{}", "model.onnx": b"x"}
    root = tarfile.TarInfo(".")
    root.type = tarfile.DIRTYPE
    archive = _craft(tmp_path / "plain.tar", [(root, None), _manifest(listed), (folder, None),
                                             _file("tokenizer/vocab.json", b"{}"), _file("./model.onnx", b"x")])
    files = safe_extract(archive, tmp_path / "out")
    assert files == [tmp_path / "out" / name for name in (MANIFEST_NAME, "model.onnx", "tokenizer/vocab.json")]
    assert (tmp_path / "out" / "tokenizer" / "vocab.json").read_bytes() == b"{}"


def test_model_folder_packages_deterministically_and_round_trips(tmp_path: Path) -> None:
    from shiplift.tasks.artifacts.packaging import package_model_dir

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
    from shiplift.tasks.artifacts.packaging import package_model_dir

    folder = tmp_path / "encoder"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"x")
    with pytest.raises(BadInput, match="not plain files"):
        package_model_dir(folder, tmp_path / "o", manifest={}, model_file="model.onnx")
    (folder / "sub").rmdir()
    with pytest.raises(BadInput, match="no model.int8.onnx"):
        package_model_dir(folder, tmp_path / "o", manifest={}, model_file="model.int8.onnx")
    assert not (tmp_path / "o" / "model.tar.gz").exists()
# -- hostile archives: structure, bounds, modes -------------------------------------------------


def _refused(archive: Path, tmp_path: Path, match: str, **limits) -> None:
    """safe_extract refuses `archive` with `match` in the message and leaves nothing behind."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    with pytest.raises(IntegrityError, match=match):
        safe_extract(archive, work / "model", ExtractLimits(**limits))
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("members, match", [
    ([], "has no model-manifest.json"),
    ([_file("model.onnx", b"x")], "does not start with model-manifest.json \\(first member: 'model.onnx'\\)"),
    ([_file("model.onnx", b"x"), _manifest({"model.onnx": b"x"})], "does not start with model-manifest.json"),
    ([_special("sub", tarfile.DIRTYPE), _manifest({})],
     "does not start with model-manifest.json \\(first member: 'sub'\\)"),
], ids=["empty", "no-manifest", "manifest-later", "folder-first"])
def test_an_archive_must_open_with_its_manifest(tmp_path: Path, members, match: str) -> None:
    _refused(_craft(tmp_path / "a.tar.gz", members), tmp_path, match)


def test_sizes_and_counts_are_checked_against_the_limits_before_writing(tmp_path: Path) -> None:
    files = {f"shard-{i}.bin": bytes([i]) * 100 for i in range(5)}
    archive = _craft(tmp_path / "a.tar.gz", [_manifest(files), *(_file(n, d) for n, d in files.items())])
    _refused(archive, tmp_path, "would extract to 500 bytes, over the limit of 499", max_total_bytes=499)
    _refused(archive, tmp_path, "lists 5 files, over the limit of 5 members", max_members=5)
    _refused(archive, tmp_path, "'model-manifest.json' is .* bytes, over the limit of 100", max_manifest_bytes=100)
    assert len(safe_extract(archive, tmp_path / "ok", ExtractLimits(max_total_bytes=500, max_members=6))) == 6


def test_unlisted_folders_count_against_the_member_limit(tmp_path: Path) -> None:
    folders = [_special(f"d{i}", tarfile.DIRTYPE) for i in range(50)]
    archive = _craft(tmp_path / "a.tar.gz", [_manifest({}), *folders])
    _refused(archive, tmp_path, "'d9' is past the limit of 10 members", max_members=10)


def test_a_compression_bomb_is_stopped_by_the_ratio_limit(tmp_path: Path) -> None:
    zeros = b"\0" * (48 << 20)
    archive = _craft(tmp_path / "bomb.tar.gz", [_manifest({"weights.bin": zeros}), _file("weights.bin", zeros)])
    assert archive.stat().st_size < len(zeros) / 200
    _refused(archive, tmp_path, r"'weights.bin' decompresses \d+:1, over the limit of 200:1")


def test_incompressible_weights_pass_the_ratio_limit(tmp_path: Path) -> None:
    weights = os.urandom(20 << 20)
    archive = _craft(tmp_path / "ok.tar.gz", [_manifest({"weights.bin": weights}), _file("weights.bin", weights)])
    assert (safe_extract(archive, tmp_path / "out")[1]).stat().st_size == len(weights)


def test_setuid_setgid_and_sticky_bits_are_dropped_and_said(tmp_path: Path, caplog) -> None:
    listed = {"run.sh": b"#!/bin/sh\n", "tool": b"x"}
    run, tool = _file("run.sh", listed["run.sh"]), _file("tool", listed["tool"])
    run[0].mode, tool[0].mode = 0o4755, 0o3775
    archive = _craft(tmp_path / "a.tar.gz", [_manifest(listed), run, tool])
    with caplog.at_level("WARNING", logger="shiplift.packaging"):
        files = safe_extract(archive, tmp_path / "out")
    assert {p.name: p.stat().st_mode & 0o7777 for p in files} == {MANIFEST_NAME: 0o644, "run.sh": 0o644, "tool": 0o644}
    said = [r.getMessage() for r in caplog.records]
    assert any("'run.sh' asked for setuid" in m for m in said) and any("'tool' asked for setgid+sticky" in m
                                                                       for m in said)


def _raw_manifest(text: str) -> tuple[tarfile.TarInfo, bytes]:
    return _file(MANIFEST_NAME, text.encode())


@pytest.mark.parametrize("manifest, match", [
    ('{"files": {}, "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"files": {}, "files": {}}', "duplicate keys \\['files'\\]"),
    ('{"files": []}', "'files' is a list"),
    ('{"files": {"a": {"sha256": "' + "a" * 64 + '", "size": true}}}', "'a' has no non-negative integer size"),
    ('{"files": {"a": {"sha256": "' + "a" * 64 + '", "size": -1}}}', "'a' has no non-negative integer size"),
    ('{"files": {"a": {"sha256": "' + "A" * 64 + '", "size": 1}}}', "'a' has no lower-case hex sha256"),
    ('{"files": {"../a": {"sha256": "' + "a" * 64 + '", "size": 1}}}', "'../a' is not a plain relative name"),
    ('{"files": {"/etc/a": {"sha256": "' + "a" * 64 + '", "size": 1}}}', "'/etc/a' is not a plain relative name"),
    ('{"files": {"model-manifest.json": {"sha256": "' + "a" * 64 + '", "size": 1}}}', "is not a plain relative name"),
    ('{"files": {"a": 1}}', "'a' has no lower-case hex sha256"),
    ('\xff', "malformed"),
], ids=["deep", "duplicate-keys", "files-list", "bool-size", "negative-size", "upper-sha", "dotdot", "absolute",
        "lists-itself", "entry-not-mapping", "not-utf8"])
def test_a_malformed_manifest_is_an_integrity_error(tmp_path: Path, manifest: str, match: str) -> None:
    member = _file(MANIFEST_NAME, manifest.encode("utf-8", "surrogateescape") if manifest != "\xff" else b"\xff")
    _refused(_craft(tmp_path / "a.tar.gz", [member]), tmp_path, match)


def test_an_archive_larger_than_the_free_disk_is_refused(tmp_path: Path, monkeypatch) -> None:
    from shiplift.tasks.errors import CapacityError

    data = b"x" * 1000
    archive = _craft(tmp_path / "a.tar.gz", [_manifest({"w.bin": data}), _file("w.bin", data)])
    monkeypatch.setattr(packaging.shutil, "disk_usage", lambda path: shutil_usage(total=10_000, used=9_500, free=500))
    with pytest.raises(CapacityError, match="extracts to 1000 bytes; .* has 500 free"):
        safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damage_to_an_archive_is_an_integrity_error_or_the_exact_files(tmp_path: Path, data) -> None:
    """Flip, drop or insert bytes of the uncompressed tar stream: extraction yields the listed files exactly, or
    refuses."""
    listed = {"model.gguf": b"GGUF" + bytes(range(256)) * 8, "calibration.json": b'{"temperature": 1.5}'}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, payload in [_manifest(listed), *(_file(n, d) for n, d in listed.items())]:
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    stream = bytearray(buffer.getvalue())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(stream) - 1))
        action = data.draw(st.sampled_from(["flip", "drop", "insert"]))
        if action == "flip":
            stream[at] = data.draw(st.integers(0, 255))
        elif action == "drop":
            del stream[at:at + data.draw(st.integers(1, 600))]
        else:
            stream[at:at] = data.draw(st.binary(min_size=1, max_size=600))
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    archive = folder / "damaged.tar.gz"
    archive.write_bytes(gzip.compress(bytes(stream), mtime=0))
    try:
        files = safe_extract(archive, folder / "model")
    except IntegrityError:
        assert sorted(p.name for p in folder.iterdir()) == ["damaged.tar.gz"]
        return
    assert {p.relative_to(folder / "model").as_posix(): p.read_bytes() for p in files
            if p.name != MANIFEST_NAME} == listed
