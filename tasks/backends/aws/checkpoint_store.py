"""The aws backend's ledger checkpoints (DESIGN §10): an Ed25519 key in Secrets Manager, an S3 bucket with Object Lock.

The key is PEM (PKCS#8) text, the same format as the local key file, in a Secrets Manager secret the config
names (never the key itself). KMS would be the better home, since its private key never leaves KMS, and botocore
knows Ed25519 (`ECC_NIST_EDWARDS25519`, `ED25519_SHA_512`), but moto cannot create or sign with such a key, so a
KMS signer could not be tested here: Secrets Manager it is, and the `Signer` protocol leaves room for KMS. A
missing secret is refused with the command that creates it; shiplift never creates it, because the release role
should only read it (its resource policy names the readers) and a mistyped name would silently start a new key
whose checkpoints no longer match the old ones. With the key's public half in the config (`public_key`),
verification (verify, prove, report, audit) uses it and never reads the secret, so an auditor needs no access to
it; signing refuses a secret whose key is not that one.

Each checkpoint is one object, `<prefix>/<position>.json` (position 1, 2, … in append order), written with
`If-None-Match: *` and a COMPLIANCE (or, for a trial account, GOVERNANCE) retention: nobody, the account's root
included, can delete or overwrite a stored version before the retention ends (GOVERNANCE can be bypassed with
`s3:BypassGovernanceRetention`, so it does not hold against an insider). The position, not the head, names the
object, so two writers that read the same entries race for one key and the loser reads, verifies and signs
again: that is what the local file's lock does. Reading lists every *version* (paginated), so a delete marker or
an overwritten key hides nothing; a delete marker is itself reported.
"""

from __future__ import annotations

import re
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from typing import Any

from shiplift.tasks.backends.aws.artifact_store import b64_sha256
from shiplift.tasks.backends.aws.session import Aws, write_raced
from shiplift.tasks.errors import ConfigError, Conflict, IntegrityError, NotFound, NotReady
from shiplift.tasks.ledger.checkpoints import (
    Checkpoint,
    Entry,
    PrivateKeySigner,
    PublicKeyOnly,
    Signer,
    load_private_key,
    load_public_key,
    read_entry,
    serialise,
)

MAX_CHECKPOINT_BYTES = 64 * 1024
POSITION = re.compile(r"^(\d{12})\.json$")
ARN_SUFFIX = re.compile(r"-[A-Za-z0-9]{6}$")  # Secrets Manager appends six random characters to a secret's ARN


def create_secret_command(secret_id: str) -> str:
    """The shell commands that make an Ed25519 key and store it as the secret `secret_id` names."""
    name = ARN_SUFFIX.sub("", secret_id.split(":secret:")[1]) if secret_id.startswith("arn:") else secret_id
    return ("openssl genpkey -algorithm ed25519 -out ledger-key.pem && aws secretsmanager create-secret "
            f"--name {name} --secret-string file://ledger-key.pem --tags Key=shiplift:role,Value=ledger-checkpoint-key "
            "&& rm ledger-key.pem (then allow only the release role to read it)")


class SecretSigner(PrivateKeySigner):
    """The checkpoint key, PEM (PKCS#8) text in a Secrets Manager secret's SecretString, fetched once."""

    def __init__(self, aws: Aws, secret_id: str):
        self.secret_id = secret_id
        try:
            answer = aws.call("secretsmanager", "GetSecretValue", SecretId=secret_id)
        except NotFound as error:
            raise ConfigError(f"the checkpoint signing key secret {secret_id} does not exist in {aws.region}; "
                              "shiplift does not create it",
                              fix=f"create it once: {create_secret_command(secret_id)}") from error
        if "SecretString" not in answer:
            raise IntegrityError(f"secret {secret_id} holds binary data, not the PEM text of an Ed25519 key",
                                 fix=f"store the key as PEM text: {create_secret_command(secret_id)}")
        super().__init__(load_private_key(answer["SecretString"].encode(), f"secret {secret_id}"))


class S3CheckpointStore:
    """Signed checkpoints in a bucket with Object Lock, one retained object per checkpoint, every version read back."""

    def __init__(self, aws: Aws, *, bucket: str, prefix: str, retention_days: int, lock_mode: str = "COMPLIANCE",
                 kms_key_id: str | None = None):
        self.aws, self.bucket, self.prefix = aws, bucket, prefix.strip("/")
        self.retention_days, self.lock_mode, self.kms_key_id = retention_days, lock_mode, kms_key_id
        self._seen: int | None = None  # the highest position the last `entries()` read

    def key(self, position: int) -> str:
        return f"{self.prefix}/{position:012d}.json"

    def check_object_lock(self) -> None:
        """The bucket exists and has Object Lock enabled; ConfigError with the fix otherwise. Writes nothing."""
        try:
            self.aws.call("s3", "HeadBucket", Bucket=self.bucket)
        except NotFound as error:
            raise ConfigError(f"the checkpoint bucket {self.bucket} does not exist (or is not visible)",
                              fix=f"create it with Object Lock: aws s3api create-bucket --bucket {self.bucket} "
                                  "--object-lock-enabled-for-bucket (plus --create-bucket-configuration "
                                  "LocationConstraint=REGION outside us-east-1); nothing was written") from error
        try:
            config = self.aws.call("s3", "GetObjectLockConfiguration", Bucket=self.bucket)["ObjectLockConfiguration"]
        except NotFound:
            config = {}
        if config.get("ObjectLockEnabled") != "Enabled":
            raise ConfigError(f"the checkpoint bucket {self.bucket} does not have Object Lock enabled, so a stored "
                              "checkpoint could be deleted or overwritten",
                              fix="enable it (versioning must be on): aws s3api put-bucket-versioning --bucket "
                                  f"{self.bucket} --versioning-configuration Status=Enabled && aws s3api "
                                  f"put-object-lock-configuration --bucket {self.bucket} --object-lock-configuration "
                                  "ObjectLockEnabled=Enabled; or use a bucket created with "
                                  "--object-lock-enabled-for-bucket; nothing was written")

    def _versions(self) -> tuple[list[dict], list[dict]]:
        """Every version and delete marker under the prefix (ListObjectVersions, all pages)."""
        versions, markers, marker = [], [], {}
        while True:
            page = self.aws.call("s3", "ListObjectVersions", Bucket=self.bucket, Prefix=f"{self.prefix}/", **marker)
            versions += page.get("Versions", [])
            markers += page.get("DeleteMarkers", [])
            if not page.get("IsTruncated"):
                return versions, markers
            marker = {"KeyMarker": page["NextKeyMarker"], "VersionIdMarker": page["NextVersionIdMarker"]}

    def _read(self, version: dict) -> str:
        answer = self.aws.call("s3", "GetObject", Bucket=self.bucket, Key=version["Key"],
                               VersionId=version["VersionId"])
        with answer["Body"] as body:
            return body.read(MAX_CHECKPOINT_BYTES + 1).decode("utf-8", errors="replace")

    def _position(self, key: str) -> int | None:
        """The append position an object key names (`<prefix>/<position>.json`), or None."""
        match = POSITION.match(key.removeprefix(f"{self.prefix}/"))
        return int(match[1]) if match else None

    def entries(self) -> list[Entry]:
        """Every stored version in append order (position, then time), and each delete marker as a problem."""
        versions, markers = self._versions()
        found: list[tuple[tuple, Entry]] = []
        for version in versions:
            where = f"s3://{self.bucket}/{version['Key']}?versionId={version['VersionId']}"
            position = self._position(version["Key"])
            entry = read_entry(where, self._read(version)) if position else (
                where, None, f"checkpoint {where} is not named <position>.json: shiplift did not write it")
            found.append(((position or 0, version["LastModified"]), entry))
        for deleted in markers:
            where = f"s3://{self.bucket}/{deleted['Key']}"
            problem = (f"checkpoint {where} was deleted at {deleted['LastModified']:%Y-%m-%dT%H:%M:%SZ}: a delete "
                       "marker hides it from plain listings (its locked versions are still checked); find out who "
                       "deleted it, then remove the marker")
            found.append(((self._position(deleted["Key"]) or 0, deleted["LastModified"]), (where, None, problem)))
        self._seen = max((order[0] for order, _ in found), default=0)
        return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]

    def locked(self) -> nullcontext:
        """No lock: `append` is conditional on the position, so a writer that lost the race reads again."""
        return nullcontext()

    def put_params(self, position: int, checkpoint: Checkpoint) -> dict[str, Any]:
        """A conditional, checksummed, retained PutObject of one checkpoint (S3 wants a checksum with Object Lock)."""
        data = serialise(checkpoint).encode()
        until = datetime.now(UTC) + timedelta(days=self.retention_days)
        encryption = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": self.kms_key_id} if self.kms_key_id else {}
        return {"Bucket": self.bucket, "Key": self.key(position), "Body": data, "IfNoneMatch": "*",
                "ContentType": "application/json", "ChecksumAlgorithm": "SHA256", "ChecksumSHA256": b64_sha256(data),
                "ObjectLockMode": self.lock_mode, "ObjectLockRetainUntilDate": until,
                "Metadata": {"seq": str(checkpoint.seq), "head-hash": checkpoint.head_hash}, **encryption}

    def append(self, checkpoint: Checkpoint) -> None:
        """Store the checkpoint at the position after the entries last read; Conflict if another writer took it (412)
        or is writing it (409 ConditionalRequestConflict)."""
        if self._seen is None:
            self.entries()
        position = self._seen + 1
        try:
            self.aws.call("s3", "PutObject", **self.put_params(position, checkpoint))
        except (Conflict, NotReady) as error:
            if isinstance(error, NotReady) and not write_raced(error):
                raise
            self._seen = None
            raise Conflict(f"another writer stored checkpoint s3://{self.bucket}/{self.key(position)} first",
                           fix="read the checkpoints again, verify and sign again (`checkpoint` does)") from error
        self._seen = position


def aws_checkpoint_parts(aws: Aws, settings, *, kms_key_id: str | None = None,
                         verify_only: bool = False) -> tuple[Signer, S3CheckpointStore]:
    """The signer and store an `AwsCheckpoints` config names, checked: the bucket has Object Lock, the secret exists
    and holds an Ed25519 key, the configured `public_key`'s. `verify_only` with a `public_key`: that key alone, and
    the secret is never read. Writes nothing."""
    store = S3CheckpointStore(aws, bucket=settings.bucket, prefix=settings.prefix,
                              retention_days=settings.retention_days,
                              lock_mode=settings.lock_mode, kms_key_id=kms_key_id)
    store.check_object_lock()
    configured = PublicKeyOnly(load_public_key(settings.public_key)) if settings.public_key else None
    if verify_only and configured is not None:
        return configured, store
    signer = SecretSigner(aws, settings.key_ref)
    if configured is not None and signer.key_id != configured.key_id:
        raise ConfigError(f"secret {settings.key_ref} holds key {signer.key_id}, but backend.checkpoints.public_key is "
                          f"key {configured.key_id}: its checkpoints would verify for no auditor",
                          fix="restore the secret's key, or (if the key was rotated on purpose) set public_key to its "
                              "public half (openssl pkey -pubout); nothing was written")
    return signer, store
