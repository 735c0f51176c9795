"""The local content-addressed artifact store (DESIGN §3; the interface is `tasks.backends.interfaces.ArtifactStore`).

Artifacts live at `<root>/sha256/<digest>/<name>` and are addressed by
`file:///abs/root/sha256/<digest>/<name>` URIs. Writes go to a temp file in the digest
folder, are fsynced and re-hashed, then linked into place (a hard link, unlike a rename,
never replaces an existing file). Putting the same content again returns the stored
artifact, and every read re-hashes the file so a corrupted copy raises IntegrityError
instead of being served.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from shiplift.tasks.backends.interfaces import Progress, StoredArtifact
from shiplift.tasks.errors import BadInput, Conflict, IntegrityError, NotFound
from shiplift.tasks.hashing import CHUNK_BYTES, check_name, check_sha256, is_sha256, sha256_file, verified_bytes

_TMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_verified(source: Path, folder: Path, sha256: str, mode: int) -> Path:
    """Copy `source` to a temp file in `folder`, fsync it and check its sha256; returns the temp path."""
    fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=_TMP_PREFIX)
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        with open(source, "rb") as src, os.fdopen(fd, "wb") as dst:
            for chunk in iter(lambda: src.read(CHUNK_BYTES), b""):
                digest.update(chunk)
                dst.write(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != sha256:
            raise IntegrityError(
                f"{source} does not match sha256 {sha256} (read {digest.hexdigest()}): it is "
                "corrupted or changed while being copied",
                fix="do not modify files while they are copied; re-create a corrupted artifact",
            )
        os.chmod(tmp, mode)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


class LocalArtifactStore:
    """Content-addressed directory store: `<root>/sha256/<digest>/<name>`."""

    def __init__(self, root: str | Path, *, create: bool = True):
        """Open a store rooted at `root`, creating its folder unless `create` is False (a read-only command's)."""
        self.root = Path(root).expanduser().resolve()
        if create:
            self.root.joinpath("sha256").mkdir(parents=True, exist_ok=True)

    def _folder(self, sha256: str) -> Path:
        return self.root / "sha256" / check_sha256(sha256)

    def _stored_files(self, sha256: str) -> list[Path]:
        folder = self._folder(sha256)
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))

    def _verified(self, path: Path, sha256: str) -> Path:
        actual = sha256_file(path)
        if actual != sha256:
            raise IntegrityError(
                f"stored artifact {path} is corrupted: its sha256 is {actual}, not {sha256}",
                fix="delete the corrupted file and put the artifact again from its source",
            )
        return path

    def put_file(self, path: str | Path, *, name: str, progress: Progress | None = None) -> StoredArtifact:
        """Store a file under its sha256; putting the same content again returns the stored one."""
        check_name(name)
        source = Path(path)
        if not source.is_file():
            raise NotFound(f"{source} is not a file", fix="pass the path of the file to store")
        sha256 = sha256_file(source)
        folder = self._folder(sha256)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / name
        if final.exists():  # stored before: make sure it was not corrupted since
            self._verified(final, sha256)
        else:
            tmp = _copy_verified(source, folder, sha256, 0o444)  # stored files are read-only
            try:
                os.link(tmp, final)  # unlike rename, a link never replaces an existing file
            except FileExistsError:  # a concurrent put of the same content won the race
                self._verified(final, sha256)
            finally:
                tmp.unlink()
            _fsync_dir(folder)
        return StoredArtifact(uri=final.as_uri(), sha256=sha256, size=final.stat().st_size)

    def _resolve(self, uri_or_sha: str) -> tuple[Path, str]:
        if is_sha256(uri_or_sha):
            names = self._stored_files(uri_or_sha)
            if not names:
                raise NotFound(
                    f"no artifact with sha256 {uri_or_sha} in {self.root}",
                    fix="put the artifact first, or check the digest",
                )
            return names[0], uri_or_sha
        parsed = urlparse(uri_or_sha) if isinstance(uri_or_sha, str) else None
        if parsed is None or parsed.scheme != "file" or parsed.netloc not in ("", "localhost"):
            raise BadInput(
                f"{uri_or_sha!r} is neither a sha256 nor a file:// artifact URI",
                fix="pass a StoredArtifact.uri or its sha256",
            )
        path = Path(unquote(parsed.path))
        try:
            relative = path.relative_to(self.root / "sha256")
        except ValueError as error:
            raise BadInput(
                f"{uri_or_sha} is not inside this store ({self.root})",
                fix="open the store that produced the URI",
            ) from error
        parts = relative.parts
        if len(parts) != 2 or not is_sha256(parts[0]):
            raise BadInput(
                f"{uri_or_sha} is not an artifact URI (expected .../sha256/<digest>/<name>)",
                fix="pass a StoredArtifact.uri",
            )
        check_name(parts[1])
        if not path.is_file():
            raise NotFound(f"artifact {uri_or_sha} does not exist", fix="put it first")
        return path, parts[0]

    def get(self, uri_or_sha: str) -> Path:
        """The local path of a stored artifact, after re-hashing it (IntegrityError if corrupted)."""
        path, sha256 = self._resolve(uri_or_sha)
        return self._verified(path, sha256)

    def read_verified(self, uri_or_sha: str, *, max_bytes: int) -> bytes:
        """A stored artifact's bytes, re-hashed (IntegrityError if corrupted), writing nothing; BadInput above
        `max_bytes`."""
        path, sha256 = self._resolve(uri_or_sha)
        return verified_bytes(path.read_bytes() if path.stat().st_size <= max_bytes else None, sha256,
                              uri_or_sha, max_bytes)

    def exists(self, sha256: str) -> bool:
        """Whether content with this sha256 is stored (under any name)."""
        return bool(self._stored_files(sha256))

    def fetch_to(self, uri: str, dest: str | Path) -> Path:
        """Copy an artifact to `dest` atomically and verified; Conflict if `dest` holds other content."""
        source, sha256 = self._resolve(uri)
        target = Path(dest).expanduser().resolve()
        if target.is_dir():
            target = target / source.name
        if target.exists():
            if sha256_file(target) == sha256:
                return target
            raise Conflict(
                f"{target} exists with different content than {uri}",
                fix="choose another destination or remove that file",
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _copy_verified(source, target.parent, sha256, 0o644)  # re-hashes the stored bytes
        try:
            os.link(tmp, target)
        except FileExistsError as error:
            if sha256_file(target) != sha256:
                raise Conflict(
                    f"{target} appeared with different content while {uri} was fetched",
                    fix="do not fetch different artifacts to one destination at once",
                ) from error
        finally:
            tmp.unlink()
        return target
