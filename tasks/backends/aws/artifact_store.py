"""The S3 artifact store (DESIGN §3): content-addressed keys, SHA-256 checksums, never an overwrite.

An artifact lives at `s3://<bucket>/<prefix>/artifacts/sha256/<digest>/<name>` with its hex
sha256 in the object's metadata. Small files go up in one `PutObject`, large ones as a multipart
upload with a SHA-256 checksum per part; both are conditional (`If-None-Match: *`), so a
concurrent writer can never replace an object, and an existing key is compared (size and
sha256), never rewritten: other content under the key is a Conflict. A conditional write that
races another one on the key (S3's 409 ConditionalRequestConflict, unlike 412 PreconditionFailed:
the key exists) is retried a bounded number of times, then NotReady (retryable). After an upload
the object is read back (HEAD) and its size and sha256 checked. Downloads land in a local cache, verified.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from shiplift.tasks.backends.aws.session import write_raced
from shiplift.tasks.backends.interfaces import Progress, StoredArtifact
from shiplift.tasks.errors import BadInput, Conflict, IntegrityError, NotFound, NotReady
from shiplift.tasks.hashing import CHUNK_BYTES, check_name, check_sha256, sha256_file, verified_bytes

SINGLE_PUT_MAX_BYTES = 64 * 1024 * 1024
PART_BYTES = 64 * 1024 * 1024
S3_URI = re.compile(r"^s3://([^/]+)/(.+)$")
KEY_SHA = re.compile(r"/sha256/([0-9a-f]{64})/[^/]+$")
# A conditional write answered 409 ConditionalRequestConflict is sent again (a multipart upload from
# CreateMultipartUpload on, as https://docs.aws.amazon.com/AmazonS3/latest/API/API_CompleteMultipartUpload.html says)
# this often in all, WRITE_RACE_BACKOFF_S, then twice that, … apart
WRITE_RACE_ATTEMPTS = 4
WRITE_RACE_BACKOFF_S = 0.5
Written = TypeVar("Written")


def b64_sha256(data: bytes) -> str:
    """The base64 SHA-256 S3 expects in ChecksumSHA256."""
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, key) of an s3:// URI; BadInput otherwise."""
    match = S3_URI.match(uri or "")
    if not match:
        raise BadInput(f"{uri!r} is not an s3://bucket/key URI", fix="pass a StoredArtifact.uri of the S3 store")
    return match[1], match[2]


def artifact_sha256(uri: str) -> str | None:
    """The sha256 a content-addressed artifact URI names (`…/sha256/<hex>/<name>`), or None."""
    match = KEY_SHA.search(uri or "")
    return match[1] if match else None


class S3ArtifactStore:
    """Artifacts in one bucket under one key prefix, optionally encrypted with a KMS key."""

    def __init__(self, aws, *, bucket: str, prefix: str, kms_key_id: str | None, cache_dir: Path,
                 part_bytes: int = PART_BYTES, single_put_max_bytes: int = SINGLE_PUT_MAX_BYTES):
        self.aws, self.bucket, self.prefix, self.kms_key_id = aws, bucket, prefix.strip("/"), kms_key_id
        self.cache_dir = Path(cache_dir)
        self.part_bytes, self.single_put_max_bytes = part_bytes, single_put_max_bytes

    def key(self, sha256: str, name: str) -> str:
        """`<prefix>/artifacts/sha256/<digest>/<name>`: the content-addressed key of an artifact."""
        return f"{self.prefix}/artifacts/sha256/{check_sha256(sha256)}/{check_name(name)}"

    def encryption_params(self) -> dict:
        """SSE-KMS parameters when the config names a key (else the bucket's default encryption)."""
        return {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.kms_key_id} if self.kms_key_id else {}

    def _head(self, key: str) -> dict | None:
        try:
            return self.aws.call("s3", "HeadObject", Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except NotFound:
            return None

    def _same(self, head: dict, key: str, sha256: str, size: int) -> bool:
        """Whether the object at `key` is this content; Conflict when it is something else."""
        stored_sha = (head.get("Metadata") or {}).get("sha256")
        if head.get("ContentLength") == size and stored_sha == sha256:
            return True
        raise Conflict(
            f"s3://{self.bucket}/{key} exists with other content ({head.get('ContentLength')} bytes, sha256 "
            f"{stored_sha}; this file is {size} bytes, {sha256}); a content-addressed key is never overwritten",
            fix="find out who wrote that object; delete it only if it is known to be corrupt",
        )

    def put_file(self, path: str | Path, *, name: str, progress: Progress | None = None) -> StoredArtifact:
        """Upload a file under its sha256 (idempotent); verify size and checksum after the upload."""
        source = Path(path)
        if not source.is_file():
            raise NotFound(f"{source} is not a file", fix="pass the path of the file to store")
        sha256, size = sha256_file(source), source.stat().st_size
        key = self.key(sha256, name)
        say = progress or (lambda message: None)
        head = self._head(key)
        if head is not None:
            self._same(head, key, sha256, size)
        else:
            say(f"upload {name} ({size / 1e6:.1f} MB) to s3://{self.bucket}/{key}")
            if size <= self.single_put_max_bytes:
                checksum = self._conditional_write(key, lambda: self._put(source, key, sha256), say)
            else:
                checksum = self._conditional_write(key, lambda: self._multipart(source, key, sha256, size, say), say)
            if checksum is None:  # If-None-Match lost a race: someone stored the key meanwhile
                self._same(self._head(key) or {}, key, sha256, size)
            else:
                self._verify_upload(key, sha256, size, checksum, source)
        self._keep_cached(source, sha256, key)
        return StoredArtifact(uri=f"s3://{self.bucket}/{key}", sha256=sha256, size=size)

    def _keep_cached(self, source: Path, sha256: str, key: str) -> None:
        """Keep a file just stored in this worker's download cache as a hard link, so a later stage on this worker
        (package reading the built model) does not download it again; `get` still verifies it. Where the cache is on
        another file system, nothing: the first `get` downloads it."""
        target = self.cache_dir / sha256 / key.rsplit("/", 1)[1]
        if target.exists():
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except FileExistsError:
            pass
        except OSError:
            return

    def _conditional_write(self, key: str, write: Callable[[], Written], say: Progress) -> Written | None:
        """Run a conditional write (`If-None-Match: *`) of `key`: what it returns, or None when the key exists (412
        PreconditionFailed, or the racing writer finished first). A 409 ConditionalRequestConflict (another conditional
        write of the key in flight) is retried with backoff, WRITE_RACE_ATTEMPTS in all, then NotReady (retryable)."""
        for attempt in range(1, WRITE_RACE_ATTEMPTS + 1):
            try:
                return write()
            except Conflict:
                return None
            except NotReady as exc:
                if not write_raced(exc):
                    raise
                if attempt == WRITE_RACE_ATTEMPTS:
                    raise NotReady(f"s3://{self.bucket}/{key}: {attempt} conditional writes each raced another write "
                                   f"of the key (409 ConditionalRequestConflict): {exc.problem}",
                                   fix="another run is writing the same key: rerun the stage once it is done") from exc
                delay = WRITE_RACE_BACKOFF_S * 2 ** (attempt - 1)
                say(f"s3://{self.bucket}/{key}: another write of the key was in progress (409 "
                    f"ConditionalRequestConflict); writing again in {delay:g}s")
                time.sleep(delay)
                if self._head(key) is not None:
                    return None
        return None  # not reached: the last attempt returns or raises

    def _verify_upload(self, key: str, sha256: str, size: int, checksum: str, source: Path) -> None:
        """Read the object back: its size, its sha256 metadata and S3's own SHA-256 (of the object, or for a multipart
        upload of its parts' checksums, `<b64>-<parts>`) must be what was sent."""
        head = self._head(key) or {}
        stored_sha = (head.get("Metadata") or {}).get("sha256")
        problems = []
        if head.get("ContentLength") != size:
            problems.append(f"size {head.get('ContentLength')} (uploaded {size})")
        if stored_sha != sha256:
            problems.append(f"sha256 metadata {stored_sha} (uploaded {sha256})")
        if (head.get("ChecksumSHA256") or "").split("-")[0] != checksum:
            problems.append(f"S3 checksum {head.get('ChecksumSHA256')} (uploaded {checksum})")
        if problems:
            raise IntegrityError(f"s3://{self.bucket}/{key} does not match {source} after the upload: "
                                 f"{', '.join(problems)}",
                                 fix="the object was changed or truncated in transit; delete it and rerun the stage")

    def put_params(self, key: str, data: bytes, sha256: str) -> dict:
        """A conditional PutObject with S3's SHA-256 checksum and the sha256 metadata (also what the dry run prints)."""
        return {"Bucket": self.bucket, "Key": key, "Body": data, "IfNoneMatch": "*", "ChecksumAlgorithm": "SHA256",
                "ChecksumSHA256": b64_sha256(data), "Metadata": {"sha256": sha256}, **self.encryption_params()}

    def _put(self, source: Path, key: str, sha256: str) -> str:
        """One conditional PutObject; returns the checksum S3 must report."""
        data = source.read_bytes()
        self.aws.call("s3", "PutObject", **self.put_params(key, data, sha256))
        return b64_sha256(data)

    def _multipart(self, source: Path, key: str, sha256: str, size: int, say: Progress) -> str:
        """A multipart upload with a SHA-256 per part, completed conditionally; returns the composite checksum."""
        upload = self.aws.call("s3", "CreateMultipartUpload", Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256",
                               Metadata={"sha256": sha256}, **self.encryption_params())["UploadId"]
        total = -(-size // self.part_bytes)
        parts, digests = [], []
        try:
            with open(source, "rb") as handle:
                for number in range(1, total + 1):
                    data = handle.read(self.part_bytes)
                    digests.append(hashlib.sha256(data).digest())
                    checksum = base64.b64encode(digests[-1]).decode()
                    answer = self.aws.call("s3", "UploadPart", Bucket=self.bucket, Key=key, UploadId=upload,
                                           PartNumber=number, Body=data, ChecksumAlgorithm="SHA256",
                                           ChecksumSHA256=checksum)
                    parts.append({"PartNumber": number, "ETag": answer["ETag"], "ChecksumSHA256": checksum})
                    say(f"upload {source.name}: part {number}/{total} ({100 * number // total}%)")
            self.aws.call("s3", "CompleteMultipartUpload", Bucket=self.bucket, Key=key, UploadId=upload,
                          MultipartUpload={"Parts": parts}, IfNoneMatch="*")
        except BaseException:
            try:
                self.aws.call("s3", "AbortMultipartUpload", Bucket=self.bucket, Key=key, UploadId=upload)
            except Exception as abort:  # noqa: BLE001 - the upload's own error is the one to raise
                say(f"upload {source.name}: could not abort upload {upload} ({abort}); a lifecycle rule removes it")
            raise
        return base64.b64encode(hashlib.sha256(b"".join(digests)).digest()).decode()

    def put_bytes(self, data: bytes, key: str) -> str:
        """Write a small object at an exact key (image sources, stage results) unless it exists with this content."""
        sha256 = hashlib.sha256(data).hexdigest()
        head = self._head(key)
        if head is None:
            self._conditional_write(key, lambda: self.aws.call("s3", "PutObject", **self.put_params(key, data, sha256)),
                                    lambda message: None)
            head = self._head(key)
        self._same(head or {}, key, sha256, len(data))
        return f"s3://{self.bucket}/{key}"

    def read_bytes(self, key: str, *, max_bytes: int = 1 << 20) -> bytes:
        """A small object's body (image-detail.json); refuses anything larger than `max_bytes`."""
        answer = self.aws.call("s3", "GetObject", Bucket=self.bucket, Key=key)
        with answer["Body"] as body:
            if answer.get("ContentLength", 0) > max_bytes:
                raise BadInput(f"s3://{self.bucket}/{key} is {answer['ContentLength']} bytes, more than {max_bytes}",
                               fix="it is not the small JSON document expected there")
            return body.read(max_bytes + 1)

    def _artifact_key(self, uri: str) -> tuple[str, str]:
        """(key, sha256) of an artifact URI of this store; BadInput for any other URI."""
        bucket, key = parse_s3_uri(uri)
        sha256 = artifact_sha256(key)
        if bucket != self.bucket or sha256 is None:
            raise BadInput(f"{uri} is not an artifact of this store (s3://{self.bucket}/{self.prefix}/artifacts/…)",
                           fix="open the store that produced the URI")
        return key, sha256

    def read_verified(self, uri: str, *, max_bytes: int) -> bytes:
        """An artifact's bytes, sha256-verified, writing nothing (no cache: a read-only command's); BadInput above
        `max_bytes`."""
        key, sha256 = self._artifact_key(uri)
        answer = self.aws.call("s3", "GetObject", Bucket=self.bucket, Key=key)
        with answer["Body"] as body:
            data = None if answer.get("ContentLength", 0) > max_bytes else body.read(max_bytes + 1)
        return verified_bytes(data if data is None or len(data) <= max_bytes else None, sha256, uri, max_bytes)

    def get(self, uri: str) -> Path:
        """A local copy of an artifact, downloaded once into the cache and sha256-verified."""
        key, sha256 = self._artifact_key(uri)
        bucket = self.bucket
        target = self.cache_dir / sha256 / key.rsplit("/", 1)[1]
        if target.is_file() and sha256_file(target) == sha256:
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        answer = self.aws.call("s3", "GetObject", Bucket=bucket, Key=key)
        fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=".download-")
        digest = hashlib.sha256()
        try:
            with os.fdopen(fd, "wb") as out, answer["Body"] as body:
                for chunk in iter(lambda: body.read(CHUNK_BYTES), b""):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != sha256:
                raise IntegrityError(f"{uri} downloaded with sha256 {digest.hexdigest()}, its key names {sha256}",
                                     fix="the object is corrupt: restore it from its source and rerun the stage "
                                         "that wrote it")
            os.replace(tmp_name, target)
        finally:
            Path(tmp_name).unlink(missing_ok=True)
        return target

    def exists(self, sha256: str) -> bool:
        """Whether any artifact with this sha256 is stored (under any name)."""
        answer = self.aws.call("s3", "ListObjectsV2", Bucket=self.bucket,
                               Prefix=f"{self.prefix}/artifacts/sha256/{check_sha256(sha256)}/",
                               MaxKeys=1)
        return answer.get("KeyCount", 0) > 0
