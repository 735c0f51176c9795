"""`model.tar.gz` (DESIGN §5.3): deterministic packaging and safe extraction.

The archive is byte-for-byte reproducible: `model-manifest.json` first, then the files sorted
by name, mtime 0, uid/gid 0, no user or group names, mode 0644, gzip header mtime 0 and no file
name in it. The GGUF sits at the archive root (the llama.cpp container takes the first `*.gguf`
under /opt/ml/model). The manifest lists the sha256 and size of every other file plus the
caller's manifest (source pin, quantization, tool versions).

Extraction trusts nothing in the archive. The manifest must come first, and it bounds
everything after it (ExtractLimits): member count, total size (also against free disk), each
member's size before and its sha256 while it is written, and the compression ratio. Absolute
names, `..`, links, devices, fifos, unlisted or duplicate names and anything resolving outside
the destination are refused; setuid/setgid/sticky bits are dropped with a warning. Files go into
a temp folder that is renamed into place only once every listed file arrived, so a failure
leaves nothing half-extracted.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import os
import shutil
import stat
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from shiplift.tasks.errors import BadInput, CapacityError, Conflict, IntegrityError, NotFound
from shiplift.tasks.hashing import CHUNK_BYTES, canonical_json, check_name, sha256_file

ARCHIVE_NAME = "model.tar.gz"
FOLDER_ARCHIVE = "folder.tar.gz"  # a flat folder a later stage needs, kept as one archive (`package_model_dir`)
MANIFEST_NAME = "model-manifest.json"
RESERVED_MANIFEST_KEYS = ("files", "model_file")
GZIP_LEVEL = 1  # quantized weights barely compress; a higher level only costs CPU time
GGUF_MAGIC = b"GGUF"
LOG = logging.getLogger("shiplift.packaging")


@dataclass(frozen=True)
class PackagedModel:
    """A built model.tar.gz, its sha256, and the model-manifest.json it contains."""

    path: Path
    sha256: str
    manifest: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The package as a JSON-able dict."""
        return {"path": str(self.path), "sha256": self.sha256, "manifest": self.manifest}


class _HashingReader:
    """Reads a file for tarfile while hashing exactly the bytes that went into the archive."""

    def __init__(self, handle: IO[bytes]):
        self._handle = handle
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.digest.update(data)
        return data


def _check_regular_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise NotFound(f"{what} {path} is not a file", fix=f"pass the path of an existing {what}")


def _build_manifest(files: dict[str, Path], model_file: str, manifest: dict[str, Any]) -> dict[str, Any]:
    if not isinstance(manifest, dict):
        raise BadInput(f"manifest must be a dict, got {type(manifest).__name__}")
    clashes = [key for key in RESERVED_MANIFEST_KEYS if key in manifest]
    if clashes:
        raise BadInput(
            f"manifest keys {clashes} are reserved: packaging writes them",
            fix="rename those keys in the manifest you pass",
        )
    try:
        canonical_json(manifest)
    except (TypeError, ValueError) as error:
        raise BadInput(
            f"manifest is not JSON-serialisable: {error}",
            fix="pass strings, numbers, booleans, None, lists and dicts only",
        ) from error
    listed = {
        name: {"sha256": sha256_file(path), "size": path.stat().st_size}
        for name, path in sorted(files.items())
    }
    return {**manifest, "model_file": model_file, "files": listed}


def package_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    manifest: dict[str, Any],
    extra_files: dict[str, Path] | None = None,
    member_name: str | None = None,
) -> PackagedModel:
    """Build a reproducible `out_dir/model.tar.gz` holding the GGUF (as `member_name`, else its own name), extra files
    and model-manifest.json."""
    gguf = Path(gguf_path)
    _check_regular_file(gguf, "GGUF model")
    check_name(gguf.name)
    with open(gguf, "rb") as handle:
        if not gguf.name.endswith(".gguf") or handle.read(4) != GGUF_MAGIC:
            raise BadInput(
                f"{gguf} is not a GGUF file (needs a .gguf name and the GGUF magic bytes)",
                fix="pass the built .gguf model",
            )
    model_name = check_name(member_name or gguf.name)
    if not model_name.endswith(".gguf"):
        raise BadInput(f"archive name {model_name!r} of the GGUF does not end in .gguf",
                       fix="name the member NAME.gguf")
    files: dict[str, Path] = {model_name: gguf}
    for name, path in (extra_files or {}).items():
        check_name(name)
        if name == MANIFEST_NAME or name in files or name.endswith(".gguf"):
            raise BadInput(
                f"extra file name {name!r} clashes with the model or its manifest",
                fix=f"extra files must not be named {MANIFEST_NAME}, the model's name, or *.gguf",
            )
        _check_regular_file(Path(path), f"extra file {name!r}")
        files[name] = Path(path)
    return _write_archive(files, _build_manifest(files, model_name, manifest), out_dir)


def package_model_dir(
    model_dir: str | Path, out_dir: str | Path, *, manifest: dict[str, Any], model_file: str,
    archive_name: str = ARCHIVE_NAME
) -> PackagedModel:
    """Build `out_dir/<archive_name>` from every file at the top of a flat model folder (ONNX encoders, checkpoints)."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise NotFound(f"model folder {folder} does not exist", fix="export the model first")
    entries = sorted(folder.iterdir())
    nested = [p.name for p in entries if not p.is_file() or p.is_symlink()]
    if nested:
        raise BadInput(
            f"model folder {folder} holds {nested}, which are not plain files",
            fix="an exported model folder is flat: model.onnx, tokenizer files, config.json",
        )
    files = {check_name(p.name): p for p in entries if p.name != MANIFEST_NAME}
    if model_file not in files:
        raise BadInput(f"model folder {folder} has no {model_file}", fix="export the model into it first")
    return _write_archive(files, _build_manifest(files, model_file, manifest), out_dir, archive_name)


def _write_archive(files: dict[str, Path], full_manifest: dict[str, Any], out_dir: str | Path,
                   archive_name: str = ARCHIVE_NAME) -> PackagedModel:
    """The deterministic tar.gz (sorted members, mtime 0, root-owned, 0644) written atomically."""
    manifest_bytes = json.dumps(full_manifest, indent=2, sort_keys=True, ensure_ascii=False).encode()

    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out, prefix=f".{archive_name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as gz:
                with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
                    _add_member(tar, MANIFEST_NAME, len(manifest_bytes), io.BytesIO(manifest_bytes))
                    for name in sorted(files):
                        expected = full_manifest["files"][name]
                        with open(files[name], "rb") as handle:
                            reader = _HashingReader(handle)
                            _add_member(tar, name, expected["size"], reader)
                        if reader.digest.hexdigest() != expected["sha256"]:
                            raise IntegrityError(
                                f"{files[name]} changed while it was packaged",
                                fix="do not modify model files during packaging; retry",
                            )
            raw.flush()
            os.fsync(raw.fileno())
        os.chmod(tmp, 0o644)
        final = out / archive_name
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return PackagedModel(path=final, sha256=sha256_file(final), manifest=full_manifest)


def _add_member(tar: tarfile.TarFile, name: str, size: int, reader: Any) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    tar.addfile(info, reader)


def _refuse(archive: Path, member: str, why: str) -> IntegrityError:
    return IntegrityError(
        f"unsafe archive {archive}: member {member!r} {why}",
        fix="rebuild the archive with shiplift's packager; never extract archives from untrusted sources",
    )


def _check_member(archive: Path, member: tarfile.TarInfo, root: Path) -> tuple[Path, str]:
    """Refuse anything but plain files and folders named inside `root`; the target path and its relative name."""
    name = member.name
    if not name or name.startswith("/") or PurePosixPath(name).is_absolute():
        raise _refuse(archive, name, "has an absolute path")
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise _refuse(archive, name, "contains a '..' component")
    if member.issym() or member.islnk():
        raise _refuse(archive, name, f"is a link (to {member.linkname!r})")
    if member.ischr() or member.isblk():
        raise _refuse(archive, name, "is a device file")
    if member.isfifo():
        raise _refuse(archive, name, "is a fifo")
    if not (member.isreg() or member.isdir()):
        raise _refuse(archive, name, f"has unsupported type {member.type!r}")
    target = root.joinpath(*[p for p in parts if p != "."])
    resolved = Path(os.path.realpath(target))
    if resolved != root and root not in resolved.parents:
        raise _refuse(archive, name, "resolves outside the destination")
    return resolved, resolved.relative_to(root).as_posix() if resolved != root else "."


@dataclass(frozen=True)
class ExtractLimits:
    """What one extraction may write; the manifest's sizes are checked against these before a byte is written."""

    max_total_bytes: int = 64 << 30
    max_members: int = 10_000
    max_manifest_bytes: int = 4 << 20
    max_compression_ratio: float = 200.0  # uncompressed : compressed; models barely compress, bombs do
    ratio_grace_bytes: int = 16 << 20  # small, highly compressible files (tokenizers, configs) are fine


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate keys {sorted({k for k in keys if keys.count(k) > 1})}")
    return dict(pairs)


def _read_manifest(archive: Path, data: bytes, limits: ExtractLimits) -> dict[str, tuple[str, int]]:
    """The manifest's file table {relative name: (sha256, size)}, every entry checked; IntegrityError otherwise."""

    def malformed(why: str) -> IntegrityError:
        return IntegrityError(f"{MANIFEST_NAME} in {archive} is malformed: {why}",
                              fix="rebuild the archive with shiplift's packager")

    try:
        listed = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_pairs)["files"]
    except RecursionError:
        raise malformed("nested too deeply to read") from None
    except (ValueError, KeyError, TypeError) as error:
        raise malformed(repr(error)) from None
    if not isinstance(listed, dict):
        raise malformed(f"'files' is a {type(listed).__name__}, not a mapping")
    entries: dict[str, tuple[str, int]] = {}
    for name, entry in listed.items():
        parts = PurePosixPath(name).parts
        if not name or PurePosixPath(name).is_absolute() or ".." in parts or "." in parts or name == MANIFEST_NAME:
            raise malformed(f"file name {name!r} is not a plain relative name")
        sha256, size = (entry.get("sha256"), entry.get("size")) if isinstance(entry, dict) else (None, None)
        if not (isinstance(sha256, str) and len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256)):
            raise malformed(f"{name!r} has no lower-case hex sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise malformed(f"{name!r} has no non-negative integer size")
        entries[name] = (sha256, size)
    _check_manifest_limits(archive, entries, limits)
    return entries


def _check_manifest_limits(archive: Path, entries: dict[str, tuple[str, int]], limits: ExtractLimits) -> None:
    """Refuse a file table over the member count or total size `limits` allow, before anything is extracted."""
    if len(entries) + 1 > limits.max_members:
        raise IntegrityError(
            f"{archive} lists {len(entries)} files, over the limit of {limits.max_members} members",
            fix="a model archive holds a handful of files; rebuild it",
        )
    total = sum(size for _, size in entries.values())
    if total > limits.max_total_bytes:
        raise IntegrityError(
            f"{archive} would extract to {total} bytes, over the limit of {limits.max_total_bytes}",
            fix="raise ExtractLimits.max_total_bytes if the model really is that large",
        )


def safe_extract(archive: str | Path, dest: str | Path, limits: ExtractLimits = ExtractLimits()) -> list[Path]:
    """Extract a model archive into `dest` (absent or empty), refusing unsafe members; returns the files."""
    source = Path(archive)
    _check_regular_file(source, "archive")
    target = Path(dest).expanduser().resolve()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise Conflict(
            f"extraction destination {target} already exists and is not an empty folder",
            fix="extract into a new folder, or remove the old one first",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.partial-")).resolve()
    try:
        extracted = _Extraction(source, staging, limits).run()
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(target / p.relative_to(staging) for p in extracted)


class _Extraction:
    """One pass over the archive: the manifest first, then each member checked against it before and while
    it is written."""

    def __init__(self, archive: Path, root: Path, limits: ExtractLimits):
        self.archive, self.root, self.limits = archive, root, limits
        self.entries: dict[str, tuple[str, int]] | None = None
        self.written: dict[str, Path] = {}
        self.members = 0
        self.uncompressed = 0

    def run(self) -> list[Path]:
        with open(self.archive, "rb") as raw:
            try:
                tar = tarfile.open(fileobj=raw, mode="r:*")
            except (tarfile.TarError, OSError) as error:
                raise IntegrityError(f"{self.archive} is not a readable tar archive: {error}",
                                     fix="rebuild the archive") from None
            with tar:
                try:
                    for member in tar:
                        self._take(tar, member, raw)
                except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
                    raise IntegrityError(f"{self.archive} is truncated or corrupt: {error}",
                                         fix="fetch or rebuild the archive") from None
        if self.entries is None:
            raise IntegrityError(f"{self.archive} is empty: it has no {MANIFEST_NAME}",
                                 fix="rebuild the archive with shiplift's packager")
        missing = sorted(set(self.entries) - set(self.written))
        if missing:
            raise IntegrityError(
                f"{self.archive} does not match its {MANIFEST_NAME}: missing {missing}",
                fix="rebuild the archive; it was altered after packaging",
            )
        return [self.root / MANIFEST_NAME, *self.written.values()]

    def _take(self, tar: tarfile.TarFile, member: tarfile.TarInfo, raw: IO[bytes]) -> None:
        self.members += 1
        if self.members > self.limits.max_members:
            raise _refuse(self.archive, member.name, f"is past the limit of {self.limits.max_members} members")
        path, name = _check_member(self.archive, member, self.root)
        self._drop_special_bits(member)
        if member.isdir() and name == ".":
            return
        if self.entries is None:
            self._take_manifest(tar, member, path, name)
            return
        if member.isdir():
            try:
                path.mkdir(mode=0o755, parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise _refuse(self.archive, member.name, "clashes with another member") from None
            return
        if name == MANIFEST_NAME or name in self.written:
            raise _refuse(self.archive, member.name, "appears twice (a later copy would replace the first)")
        if name not in self.entries:
            raise IntegrityError(
                f"{self.archive} does not match its {MANIFEST_NAME}: unlisted {[name]}",
                fix="rebuild the archive; it was altered after packaging",
            )
        sha256, size = self.entries[name]
        if member.size != size:
            raise _refuse(self.archive, member.name, f"is {member.size} bytes, but {MANIFEST_NAME} says {size}")
        self._write(tar, member, path, raw, sha256)
        self.written[name] = path

    def _take_manifest(self, tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path, name: str) -> None:
        if name != MANIFEST_NAME or not member.isreg():
            raise IntegrityError(
                f"{self.archive} does not start with {MANIFEST_NAME} (first member: {member.name!r}); "
                "every member is checked against the manifest before it is written",
                fix="rebuild the archive with shiplift's packager",
            )
        if member.size > self.limits.max_manifest_bytes:
            raise _refuse(self.archive, member.name,
                          f"is {member.size} bytes, over the limit of {self.limits.max_manifest_bytes}")
        data = tar.extractfile(member).read()
        self.entries = _read_manifest(self.archive, data, self.limits)
        needed = sum(size for _, size in self.entries.values())
        free = shutil.disk_usage(self.root).free
        if needed > free:
            raise CapacityError(
                f"{self.archive} extracts to {needed} bytes; {self.root.parent} has {free} free",
                fix="free disk space or extract elsewhere",
            )
        path.write_bytes(data)
        os.chmod(path, 0o644)

    def _write(self, tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path, raw: IO[bytes], sha256: str) -> None:
        digest = hashlib.sha256()
        try:
            path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            with tar.extractfile(member) as source, open(path, "xb") as out:
                while chunk := source.read(CHUNK_BYTES):
                    digest.update(chunk)
                    out.write(chunk)
                    self.uncompressed += len(chunk)
                    self._check_ratio(member, raw)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            raise _refuse(self.archive, member.name, "clashes with another member") from None
        os.chmod(path, 0o644)
        if digest.hexdigest() != sha256:
            raise IntegrityError(
                f"member {member.name!r} of {self.archive} does not match the sha256/size in {MANIFEST_NAME}",
                fix="rebuild the archive; it was altered or corrupted after packaging",
            )

    def _check_ratio(self, member: tarfile.TarInfo, raw: IO[bytes]) -> None:
        if self.uncompressed <= self.limits.ratio_grace_bytes:
            return
        ratio = self.uncompressed / max(raw.tell(), 1)
        if ratio > self.limits.max_compression_ratio:
            raise _refuse(
                self.archive, member.name,
                f"decompresses {ratio:.0f}:1, over the limit of {self.limits.max_compression_ratio:.0f}:1 "
                "(a compression bomb?)",
            )

    def _drop_special_bits(self, member: tarfile.TarInfo) -> None:
        special = member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)
        if special:
            flags = ((stat.S_ISUID, "setuid"), (stat.S_ISGID, "setgid"), (stat.S_ISVTX, "sticky"))
            names = [label for bit, label in flags if special & bit]
            LOG.warning("%s: member %r asked for %s; extracted without (files 0644, folders 0755)",
                        self.archive, member.name, "+".join(names))
