"""`model.tar.gz` (DESIGN §5.3): deterministic packaging and safe extraction.

The archive is byte-for-byte reproducible: entries sorted by name, mtime 0, uid/gid 0,
no user or group names, mode 0644, gzip header mtime 0 and no file name in it. The GGUF
sits at the archive root (the llama.cpp container takes the first `*.gguf` under
/opt/ml/model) next to `model-manifest.json`, which lists the sha256 and size of every
other file plus the caller's manifest (source pin, quantization, tool versions).

Extraction trusts nothing in the archive: absolute names, `..`, links, devices, fifos,
duplicate names and anything resolving outside the destination are refused, the files
are extracted into a temp folder that is renamed into place only once every file matched
the manifest, so a failure leaves nothing half-extracted.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from tasks.errors import BadInput, Conflict, IntegrityError, NotFound
from tasks.hashing import CHUNK_BYTES, canonical_json, sha256_file
from tasks.store import check_name

ARCHIVE_NAME = "model.tar.gz"
MANIFEST_NAME = "model-manifest.json"
RESERVED_MANIFEST_KEYS = ("files", "model_file")
GZIP_LEVEL = 1  # quantized weights barely compress; a higher level only costs CPU time
GGUF_MAGIC = b"GGUF"


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
) -> PackagedModel:
    """Build a reproducible `out_dir/model.tar.gz` holding the GGUF, extra files and model-manifest.json."""
    gguf = Path(gguf_path)
    _check_regular_file(gguf, "GGUF model")
    check_name(gguf.name)
    with open(gguf, "rb") as handle:
        if not gguf.name.endswith(".gguf") or handle.read(4) != GGUF_MAGIC:
            raise BadInput(
                f"{gguf} is not a GGUF file (needs a .gguf name and the GGUF magic bytes)",
                fix="pass the built .gguf model",
            )
    files: dict[str, Path] = {gguf.name: gguf}
    for name, path in (extra_files or {}).items():
        check_name(name)
        if name == MANIFEST_NAME or name in files or name.endswith(".gguf"):
            raise BadInput(
                f"extra file name {name!r} clashes with the model or its manifest",
                fix=f"extra files must not be named {MANIFEST_NAME}, the model's name, or *.gguf",
            )
        _check_regular_file(Path(path), f"extra file {name!r}")
        files[name] = Path(path)
    return _write_archive(files, _build_manifest(files, gguf.name, manifest), out_dir)


def package_model_dir(
    model_dir: str | Path, out_dir: str | Path, *, manifest: dict[str, Any], model_file: str, archive_name: str = ARCHIVE_NAME
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
                    for name in sorted([*files, MANIFEST_NAME]):
                        if name == MANIFEST_NAME:
                            _add_member(tar, name, len(manifest_bytes), io.BytesIO(manifest_bytes))
                            continue
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


def _check_member(archive: Path, member: tarfile.TarInfo, root: Path, seen: set[str]) -> Path:
    """Refuse anything but plain files and folders named inside `root`; returns the target path."""
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
    key = str(resolved.relative_to(root)) if resolved != root else "."
    if member.isreg():
        if key in seen:
            raise _refuse(archive, name, "appears twice (a later copy would replace the first)")
        seen.add(key)
    return resolved


def _verify_manifest(archive: Path, root: Path, extracted: list[Path]) -> None:
    manifest_path = root / MANIFEST_NAME
    if not manifest_path.is_file():
        return
    try:
        listed = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
        entries = {name: (entry["sha256"], entry["size"]) for name, entry in listed.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise IntegrityError(
            f"{MANIFEST_NAME} in {archive} is malformed: {error!r}",
            fix="rebuild the archive with shiplift's packager",
        ) from error
    present = {str(p.relative_to(root)): p for p in extracted if p != manifest_path}
    missing = sorted(set(entries) - set(present))
    unlisted = sorted(set(present) - set(entries))
    if missing or unlisted:
        raise IntegrityError(
            f"{archive} does not match its {MANIFEST_NAME}: missing {missing}, unlisted {unlisted}",
            fix="rebuild the archive; it was altered after packaging",
        )
    for name, (sha256, size) in sorted(entries.items()):
        path = present[name]
        if path.stat().st_size != size or sha256_file(path) != sha256:
            raise IntegrityError(
                f"member {name!r} of {archive} does not match the sha256/size in {MANIFEST_NAME}",
                fix="rebuild the archive; it was altered or corrupted after packaging",
            )


def safe_extract(archive: str | Path, dest: str | Path) -> list[Path]:
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
        extracted = _extract_into(source, staging)
        _verify_manifest(source, staging, extracted)
        if target.exists():
            target.rmdir()
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(target / p.relative_to(staging) for p in extracted)


def _extract_into(archive: Path, root: Path) -> list[Path]:
    extracted: list[Path] = []
    seen: set[str] = set()
    try:
        tar = tarfile.open(archive, mode="r:*")
    except (tarfile.TarError, OSError) as error:
        raise IntegrityError(
            f"{archive} is not a readable tar archive: {error}", fix="rebuild the archive"
        ) from error
    with tar:
        try:
            for member in tar:
                path = _check_member(archive, member, root, seen)
                try:
                    if member.isdir():
                        path.mkdir(mode=0o755, parents=True, exist_ok=True)
                        continue
                    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                    source = tar.extractfile(member)
                    with source, open(path, "xb") as out:
                        shutil.copyfileobj(source, out, CHUNK_BYTES)
                except (FileExistsError, NotADirectoryError, IsADirectoryError) as error:
                    raise _refuse(archive, member.name, "clashes with another member") from error
                os.chmod(path, 0o644)
                extracted.append(path)
        except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as error:
            raise IntegrityError(
                f"{archive} is truncated or corrupt: {error}", fix="fetch or rebuild the archive"
            ) from error
    return extracted
